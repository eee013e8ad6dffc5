"""Sender: the sending half of the broker's loop, around :class:`~mc0.broker.outbox.Outbox`.

Contract: ``apply(out, now)`` queues what the core returned (a message over
a peer's budget is reported to the core as a drop, and the core's answer to
that, an eviction, is queued in turn); ``flush(sock, now)`` sends each
peer what it accumulated, under a per-peer guard (one peer's fault costs
that peer only: its queue is dropped, its session closed, and everyone else
is served); ``queue_pages`` queues replay and fetch pages only while their
peer's backlog is small.  ``holding_input(now)`` is the back-pressure rule
(``Outbox.holding_input``): the loop reads no input while it says so.
This is shell code (it sends on the ROUTER socket); every decision about
peers is the core's.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import zmq

from .core.dispatch import BrokerCore, Out
from .core.journaling import PageOut
from .outbox import Outbox

if TYPE_CHECKING:
    from .listeners import Listener

MAX_FOLLOW_UP_ROUNDS = 64
# Measured here: sharing zmq.Frames across a fan-out beats copying from a few KiB up
# (4x at 64 KiB, 10 subscribers) and loses below.
SHARE_FRAMES_FROM = 4096
# A replay or fetch queues its next page only while its peer's backlog is below this.
PAGE_WINDOW = 1 << 20
# pyzmq's constants are enum.Flag members: combining them per send builds enum
# objects (about a tenth of the broker's time under RPC load, by py-spy). Plain ints.
NOBLOCK = int(zmq.NOBLOCK)
MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)


# pyzmq's own send (its compiled backend's), without the pure-Python wrapper zmq.Socket puts around it
# (routing_id / group arguments this broker never uses): a Python frame less per frame sent.
_send = zmq.backend.Socket.send


def send_frames(sock: zmq.Socket[bytes], routing_id: bytes, frames: Sequence[Any], copy: bool = True) -> None:
    """Send one routed message. pyzmq's send_multipart computes ``zmq.SNDMORE | flags``
    per frame, on enum.Flag members: measured at 13% of the broker's time."""
    send = _send
    send(sock, routing_id, MORE_NOBLOCK)  # raises here (EAGAIN / EHOSTUNREACH), before any body frame
    for frame in frames[:-1]:
        send(sock, frame, MORE_NOBLOCK, copy)
    send(sock, frames[-1], NOBLOCK, copy)


class Sender:
    def __init__(self, core: BrokerCore, outbox: Outbox, listeners: Sequence[Listener] = ()) -> None:
        """``listeners``: the ways besides the ROUTER socket that peers reach this broker (MemoDB
        over NNG, the other brokers of a cluster): each sends what is queued for its own peers."""
        self.core = core
        self.outbox = outbox
        self.listeners = tuple(listeners)
        self.holding = False  # the input is held (back-pressure) as of the last look
        # Calls of ``apply``: whatever the core did that may move its next deadline went through one
        # (the loop reuses a deadline while this is unchanged).
        self.applied = 0

    def holding_input(self, now: float) -> bool:
        held = bool(self.outbox.over) and self.outbox.holding_input(now)  # (no queue over the mark: no call)
        if held and not self.holding:
            self.core.counters["input_held"] += 1  # episodes, for monitoring
        self.holding = held
        return held

    def evict_stuck(self, now: float, slow_consumer_ms: int) -> None:
        """Evict the peers whose queue refused messages ``slow_consumer_ms`` ago and has not moved
        since (the drop rule alone would miss one while the input is held: nothing is dropped)."""
        if slow_consumer_ms:
            for routing_id in self.outbox.stuck(now, slow_consumer_ms / 1000.0):
                self.outbox.discard(routing_id)
                self.apply(self.core.evict_stalled(routing_id, now), now)

    def apply(self, out: Iterable[Out], now: float) -> None:
        """Queue what the core returned, each message in its peer's outbox.

        First the queues of peers the core just forgot are discarded (their
        backlog is freed at once; what ``out`` still says to them, such as a
        429, gets a short-lived queue of its own).  A message over its
        peer's budget is refused and reported to the core as a drop; the
        core's answer to that (an eviction) is queued in turn, boundedly.
        """
        self.applied += 1
        core = self.core
        outbox = self.outbox
        sessions = core.sessions
        pending: Iterable[Out] = out
        for _ in range(MAX_FOLLOW_UP_ROUNDS):
            for routing_id in core.take_forgotten():
                outbox.discard(routing_id)
                for listener in self.listeners:
                    if listener.owns(routing_id):
                        listener.forgotten(routing_id)
            follow_up: list[Out] = []
            for routing_id, payload in pending:
                peer = sessions.get(routing_id)
                batched = peer is not None and peer.batched
                if peer is not None and peer.enveloped:  # an mc0d-era DEALER's session
                    payload = peer.framed(payload)
                if not outbox.put(routing_id, payload, batched=batched, known=peer is not None, now=now, tally=peer):
                    follow_up += core.send_failed(routing_id, now, unreachable=False)
            if not follow_up and not core.forgotten:
                return
            pending = follow_up

    def flush(self, sock: zmq.Socket[bytes], now: float) -> None:
        """Send what is queued: per peer, everything it accumulated (batched peers: in as few
        BATCH messages as fit); a peer whose pipe is full keeps the rest for a retry."""
        outbox = self.outbox
        if not outbox.pending:
            return
        shared: dict[int, list[zmq.Frame]] = {}  # fan-out's frames as zmq.Frames, once per flush
        core = self.core
        for routing_id in outbox.ready(now):
            if core.closing and core.peers.is_closing(routing_id):  # another key may hold the routing id by now
                continue
            try:
                self._flush_peer(sock, routing_id, shared, now)
            except Exception as exc:  # the per-peer guard: one peer's fault costs that peer only
                outbox.discard(routing_id)
                self.apply(self.core.peer_fault(routing_id, "sending to", exc, now), now)

    def _flush_peer(
        self, sock: zmq.Socket[bytes], routing_id: bytes, shared: dict[int, list[zmq.Frame]], now: float
    ) -> None:
        outbox = self.outbox
        for listener in self.listeners:
            if listener.owns(routing_id):  # not a ROUTER peer: its listener sends it what is queued
                self.apply(listener.flush(self.core, outbox, routing_id, now), now)
                return
        while (message := outbox.next_message(routing_id)) is not None:
            try:
                if len(message) > 3 and max(map(len, message)) >= SHARE_FRAMES_FROM:
                    frames = shared.get(id(message))
                    if frames is None:
                        frames = shared[id(message)] = [zmq.Frame(f) for f in message]
                    send_frames(sock, routing_id, frames, copy=False)
                else:
                    send_frames(sock, routing_id, message)
            except zmq.Again:
                outbox.blocked(routing_id, now)
                return
            except zmq.ZMQError as exc:
                if exc.errno != errno.EHOSTUNREACH:
                    raise
                outbox.discard(routing_id)
                self.apply(self.core.send_failed(routing_id, now, unreachable=True), now)
                return
            outbox.sent(routing_id, now)

    def queue_pages(self, out: list[PageOut], now: float) -> None:
        """Replay and fetch pages: queued while the peer's backlog is small; otherwise the read
        is paused and rewound (``core.page_blocked``), so a replay never overruns a slow reader's
        budget and is never counted as a drop.  Once one page of a peer is held back, every later
        one is too, so each read resumes at its first unsent message, in order."""
        outbox = self.outbox
        sessions = self.core.sessions
        blocked: set[bytes] = set()
        for item in out:
            routing_id = item.routing_id
            peer = sessions.get(routing_id)
            if (
                routing_id in blocked
                or peer is None
                or outbox.backlog(routing_id) > PAGE_WINDOW
                or not outbox.put(
                    routing_id, peer.framed(item.frames), batched=peer.batched, known=True, now=now, tally=peer
                )
            ):
                blocked.add(routing_id)
                self.core.page_blocked(item, now)
