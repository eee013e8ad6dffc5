"""RouterIO: the broker loop's socket work per turn (wait, receive a batch, send a batch), in pyzmq.

Contract: :class:`RouterIO` is built once over the ROUTER socket and the
other things the loop waits on (zmq sockets, or file descriptors), in the
order given: bit 0 of what :meth:`~RouterIO.poll` returns is the ROUTER,
bit ``i + 1`` the ``i``-th other.  ``poll(timeout_ms, held)`` waits at most
``timeout_ms`` for any of them to be readable (``held``: the input is held,
so not for the ROUTER) and says which are; a signal ends the wait with 0.
``receive(limit, max_bytes, sessions)`` takes the ROUTER's messages, at
most ``limit`` of them, stopping after the one whose last frame brings the
bytes counted past ``max_bytes`` (the broker's read budget per wake-up);
each is ``(routing_id, frames, fd, identity, address)``: its body frames,
the fd of the connection it came on (``ZMQ_SRCFD``), under CURVE the
``User-Id`` the ZAP handler gave it (None without one), and for a routing id
not in ``sessions`` libzmq's ``Peer-Address`` of it ("" when it has none;
None for a known routing id).  ``read_empty`` then says whether the socket
was read empty, ``received_bytes`` what the budget counted.
``send(messages, start)`` sends ``messages[start:]`` (each ``(routing_id,
frames)``) with ``NOBLOCK`` in order until libzmq refuses one (the ROUTER is
``ROUTER_MANDATORY``: ``EAGAIN`` for a full pipe, ``EHOSTUNREACH`` for a
peer gone, raised at the routing id, before any body frame) and returns the
index of that one and its errno, or ``(len(messages), 0)``.

This module is the reference and the fallback (``MC0_PURE_PYTHON=1``, or no
compiled build): ``routerio.pyx`` is the same contract in Cython against
libzmq through pyzmq's Cython API (one C call per turn for each of the
three, no Python object per frame but the bytes themselves), built with the
hot path (mc0/native.py).  Shell code: no protocol decisions.
"""

from __future__ import annotations

import errno
from collections.abc import Container, Sequence
from typing import Any

import zmq

# pyzmq's constants are enum.Flag members: combining them per call builds enum objects. Plain ints.
NOBLOCK = int(zmq.NOBLOCK)
MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
SRCFD = int(zmq.SRCFD)
POLLIN = int(zmq.POLLIN)
EVENTS = int(zmq.EVENTS)
# Sharing zmq.Frames across a fan-out beats copying from a few KiB up (4x at 64 KiB, 10 subscribers)
# and loses below (measured with pyzmq; the native build copies in C, where a copy is cheaper).
SHARE_FRAMES_FROM = 4096

Received = tuple[bytes, list[bytes], int, str | None, str | None]
Outgoing = tuple[bytes, Sequence[Any]]

# pyzmq's own send (its compiled backend's), without the pure-Python wrapper zmq.Socket puts around it
# (routing_id / group arguments this broker never uses): a Python frame less per frame sent.
_send = zmq.backend.Socket.send


def _recv_rest(sock: zmq.Socket[bytes]) -> list[bytes]:
    """The remaining frames of the message being received (the first said ``more``).  Each is
    received as a Frame, whose ``more`` tells whether another follows: asking ``RCVMORE`` costs
    pyzmq an enum lookup per frame (measured: 4.7 -> 3.1 us per 4-frame message, see loop_turn)."""
    rest = []
    recv = sock.recv
    while True:
        frame = recv(NOBLOCK, copy=False)
        rest.append(frame.bytes)
        if not frame.more:
            return rest


class RouterIO:
    def __init__(self, router: zmq.Socket[bytes], others: Sequence[zmq.Socket[bytes] | int], *, curve: bool) -> None:
        self.router = router
        self.curve = curve
        self.read_empty = False
        self.received_bytes = 0
        self._poller = zmq.Poller()
        self._holding = zmq.Poller()  # the same but the ROUTER: while the input is held
        self._bits: dict[Any, int] = {router: 1}
        self._poller.register(router, zmq.POLLIN)
        for index, other in enumerate(others):
            # A plain fd is reported by ``poll`` as the int it was registered as (never an object).
            self._bits[other] = 1 << (index + 1)
            self._poller.register(other, zmq.POLLIN)
            self._holding.register(other, zmq.POLLIN)

    def poll(self, timeout_ms: int, held: bool) -> int:
        bits = self._bits
        ready = 0
        for item, _ in (self._holding if held else self._poller).poll(timeout_ms):
            ready |= bits[item]
        return ready

    def receive(self, limit: int, max_bytes: int, sessions: Container[bytes]) -> list[Received]:
        sock = self.router
        recv = sock.recv
        curve = self.curve
        out: list[Received] = []
        received = 0
        self.read_empty = False
        for i in range(limit):
            # zmq.Again ends the batch: one exception per wake-up is cheaper than asking ZMQ_EVENTS
            # per message, except when a wake-up brings one message (light load): so ask once, at
            # the second (docs/PERFORMANCE.md, Round 5 §2: the fallback's echo turn).
            if i == 1 and not sock.getsockopt(EVENTS) & POLLIN:  # type: ignore[operator]
                self.read_empty = True
                break
            try:
                first = recv(NOBLOCK, copy=False)
            except zmq.Again:
                self.read_empty = True
                break
            rest = _recv_rest(sock) if first.more else []
            identity = None
            if curve:
                try:
                    identity = str(first.get("User-Id")) or None
                except zmq.ZMQError:
                    pass
            routing_id = first.bytes
            address = None
            if routing_id not in sessions:
                try:
                    address = str(first.get("Peer-Address"))
                except zmq.ZMQError:
                    address = ""
            out.append((routing_id, rest, first.get(SRCFD), identity, address))
            if rest:
                received += len(rest[-1])
                if received >= max_bytes:
                    break
        self.received_bytes = received
        return out

    def send(self, messages: Sequence[Outgoing], start: int = 0) -> tuple[int, int]:
        sock = self.router
        send = _send
        shared: dict[int, list[zmq.Frame]] = {}  # a fan-out's large frames as zmq.Frames, once per call
        for index in range(start, len(messages)):
            routing_id, frames = messages[index]
            copy = True
            if len(frames) > 3 and max(map(len, frames)) >= SHARE_FRAMES_FROM:
                lent = shared.get(id(frames))
                if lent is None:
                    lent = shared[id(frames)] = [zmq.Frame(f) for f in frames]
                frames, copy = lent, False
            if not frames:
                raise ValueError("a message has at least one frame")
            try:
                send(sock, routing_id, MORE_NOBLOCK)  # raises here (EAGAIN / EHOSTUNREACH), before any body frame
                for frame in frames[:-1]:
                    send(sock, frame, MORE_NOBLOCK, copy)
                send(sock, frames[-1], NOBLOCK, copy)
            except zmq.ZMQError as exc:
                return index, exc.errno or errno.EIO
        return len(messages), 0


__all__ = ["RouterIO", "Received", "Outgoing"]
