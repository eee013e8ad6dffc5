"""Sender: the sending half of the broker's loop, around :class:`~mc0.broker.outbox.Outbox`.

Contract: ``apply(out, now)`` queues what the core returned (a message over
a peer's budget is reported to the core as a drop, and the core's answer to
that, an eviction, is queued in turn); ``flush(io, now)`` sends each
peer what it accumulated through the loop's :class:`~mc0.broker.routerio.RouterIO`
(every peer's next message in one call), under a per-peer guard (one peer's fault costs
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
from typing import TYPE_CHECKING

import zmq

from .core.dispatch import BrokerCore, Out
from .core.journaling import PageOut
from .outbox import Outbox
from .routerio import RouterIO

if TYPE_CHECKING:
    from .listeners import Listener

MAX_FOLLOW_UP_ROUNDS = 64
MAX_FLUSH_ROUNDS = 1 << 20  # (a bound that is never reached: each round is a message some queue held)
# A replay or fetch queues its next page only while its peer's backlog is below this.
PAGE_WINDOW = 1 << 20


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

    def flush(self, io: RouterIO, now: float) -> None:
        """Send what is queued: per peer, everything it accumulated (batched peers: in as few BATCH
        messages as fit), every peer's next message handed to ``io`` in one call, round after round
        while peers have more; a peer whose pipe is full keeps the rest for a retry, one gone is
        forgotten, and one whose sending fails otherwise costs itself only (the per-peer guard)."""
        outbox = self.outbox
        if not outbox.pending:
            return
        core = self.core
        batch: list[tuple[bytes, list[bytes]]] = []
        for routing_id in outbox.ready(now):
            if core.closing and core.peers.is_closing(routing_id):  # another key may hold the routing id by now
                continue
            try:
                message = self._first(routing_id, now)
            except Exception as exc:  # the per-peer guard: one peer's fault costs that peer only
                self._fault(routing_id, exc, now)
                continue
            if message is not None:
                batch.append((routing_id, message))
        for _ in range(MAX_FLUSH_ROUNDS):  # (each round is a message more for some peer: bounded by its queue)
            if not batch:
                return
            batch = self._send_round(io, batch, now)

    def _first(self, routing_id: bytes, now: float) -> list[bytes] | None:
        """The peer's next message for the ROUTER; a listener's own peer is sent what is queued by it."""
        for listener in self.listeners:
            if listener.owns(routing_id):  # not a ROUTER peer: its listener sends it what is queued
                self.apply(listener.flush(self.core, self.outbox, routing_id, now), now)
                return None
        return self.outbox.next_message(routing_id)

    def _send_round(
        self, io: RouterIO, batch: list[tuple[bytes, list[bytes]]], now: float
    ) -> list[tuple[bytes, list[bytes]]]:
        """One message for each peer of ``batch``, sent in one call (again past each one refused); the
        peers that have another message next, with it."""
        outbox = self.outbox
        following: list[tuple[bytes, list[bytes]]] = []
        start = 0
        while start < len(batch):
            refused, error = io.send(batch, start)
            for index in range(start, refused):
                routing_id = batch[index][0]
                try:
                    outbox.sent(routing_id, now)
                    message = outbox.next_message(routing_id)
                except Exception as exc:
                    self._fault(routing_id, exc, now)
                    continue
                if message is not None:
                    following.append((routing_id, message))
            if refused >= len(batch):
                break
            routing_id = batch[refused][0]
            start = refused + 1
            if error == errno.EAGAIN:  # (its pipe is full: the rest of its queue waits for a retry)
                outbox.blocked(routing_id, now)
                continue
            try:
                if error != errno.EHOSTUNREACH:
                    raise zmq.ZMQError(error)
                outbox.discard(routing_id)
                self.apply(self.core.send_failed(routing_id, now, unreachable=True), now)
            except Exception as exc:
                self._fault(routing_id, exc, now)
            # A peer gone or failed: what the core did about it may have dropped later peers' queues
            # (a peer forgotten), so only a message still at the head of its queue goes.
            batch[start:] = [item for item in batch[start:] if outbox.next_message(item[0]) is item[1]]
        return following

    def _fault(self, routing_id: bytes, exc: Exception, now: float) -> None:
        self.outbox.discard(routing_id)
        self.apply(self.core.peer_fault(routing_id, "sending to", exc, now), now)

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
