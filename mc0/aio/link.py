"""Outgoing: a client's way out, coalescing what is queued into few sends and never waiting for more.

Contract: every command the client sends goes through ``send`` (frames) or
``send_record`` (an already-encoded batch record).  Once the session is
connected with batched framing, commands become records in one buffer that
is flushed as a single ``BATCH`` message at the next turn of the event loop
(a lone command leaves at once; a burst leaves in few messages of up to
``FLUSH_BYTES``), or earlier when the buffer reaches that size.  Before the
broker has accepted the session (connecting, healing) commands wait in the
buffer and leave, in order, once it has; ``send_now`` is for the CONNECT
itself.  The first command of an event-loop turn is sent at once, so a lone
request pays no wait.  The buffer plus what libzmq has not yet taken is bounded by
``max_bytes``: ``wait_for_room`` is the back-pressure a producer awaits, and
``RuntimeError`` never replaces it.  Thread-safe entry for other threads:
``send_record_threadsafe``.  Pure asyncio + pyzmq; no protocol decisions.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import threading
from typing import Any, cast

import zmq.asyncio

from ..errors import ClosedError, Timeout
from ..protocol import Verb, batch
from ..session import ClientSession, Frames

FLUSH_BYTES = 256 * 1024  # one BATCH message holds at most about this much
_CONNECT = Verb.CONNECT.value.encode()


class Outgoing:
    def __init__(
        self, loop: asyncio.AbstractEventLoop, socket: zmq.asyncio.Socket, session: ClientSession, max_bytes: int
    ) -> None:
        self.loop = loop
        self.socket = socket
        self.session = session
        self.max_bytes = max_bytes
        self._records: list[bytes] = []
        self._buffered = 0  # bytes in _records
        self._inflight = 0  # bytes handed to pyzmq whose send has not completed (its HWM was reached)
        self._scheduled = False
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        # Records from other threads (the sync client): appended there, moved in on the loop.
        self._foreign: collections.deque[bytes] = collections.deque()
        self._foreign_bytes = 0
        self._foreign_lock = threading.Lock()
        self._foreign_scheduled = False
        self._room = threading.Condition()  # other threads wait here for room
        self.closed = False

    # ------------------------------------------------------------ entry points
    @property
    def pending(self) -> int:
        """Bytes queued and not yet taken by libzmq."""
        return self._buffered + self._inflight + self._foreign_bytes

    def send(self, frames: Frames) -> None:
        """Queue one command (in order with everything else)."""
        session = self.session
        if session.batched and session.connected:
            self.send_record(batch.record_of(frames))
        elif session.connected or frames[0] == _CONNECT:  # (healing: the CONNECT goes ahead of all)
            self._write(frames)
        else:
            self.send_record(batch.record_of(frames))  # held until the broker accepts the session

    def send_now(self, frames: Frames) -> None:
        """Send at once, ahead of anything buffered (CONNECT)."""
        self._write(frames)

    def send_record(self, record: bytes) -> None:
        self._records.append(record)
        self._buffered += len(record)
        if self._buffered >= FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            # The first command of a loop turn leaves at once (no added latency when traffic
            # is light); what follows it in the same turn leaves together when the turn ends.
            self._scheduled = True
            self.flush()
            self.loop.call_soon(self._flush_soon)

    def send_record_threadsafe(self, record: bytes) -> None:
        """``send_record`` from another thread: one wake-up of the loop per burst, not per record."""
        with self._foreign_lock:
            self._foreign.append(record)
            self._foreign_bytes += len(record)
            wake = not self._foreign_scheduled
            self._foreign_scheduled = True
        if wake:
            self.loop.call_soon_threadsafe(self._take_foreign)

    def _take_foreign(self) -> None:
        with self._foreign_lock:
            records = list(self._foreign)
            self._foreign.clear()
            self._foreign_bytes = 0
            self._foreign_scheduled = False  # an append after this wakes the loop again
        for record in records:
            self.send_record(record)

    # ------------------------------------------------------------ flushing
    def _flush_soon(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        """Hand what is buffered to libzmq now (if the broker accepted the session)."""
        session = self.session
        if not self._records or self.closed or not session.connected:
            return
        records, self._records = self._records, []
        self._buffered = 0
        if not session.batched:  # a broker that did not grant batching: the same commands, one by one
            for record in records:
                for code, start, end in batch.records(record):
                    self._write(batch.frames_of(record, code, start, end))
        else:
            first = 0
            while first < len(records):  # batches of at most FLUSH_BYTES (a larger record goes alone)
                last = first
                size = 0
                while last < len(records) and (last == first or size + len(records[last]) <= FLUSH_BYTES):
                    size += len(records[last])
                    last += 1
                self._write(batch.batch_frames(b"".join(records[first:last])), size)
                first = last
        self._wake_producers()

    def _write(self, frames: Frames, size: int = 0) -> None:
        try:
            future = cast("asyncio.Future[Any]", self.socket.send_multipart(frames, copy=False))
        except zmq.ZMQError:
            if self.closed:
                return
            raise
        self.session.sent(self.loop.time())
        if not future.done() and size:  # libzmq's queue is full: count it until it drains
            self._inflight += size
            future.add_done_callback(functools.partial(self._drained, size))

    def _drained(self, size: int, _future: object = None) -> None:
        self._inflight -= size
        self._wake_producers()

    # ------------------------------------------------------------ back-pressure
    def _wake_producers(self) -> None:
        if self.pending >= self.max_bytes:
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        with self._room:
            self._room.notify_all()

    async def wait_for_room(self) -> None:
        """Return once the buffer is below ``max_bytes`` (a producer's back-pressure)."""
        while self.pending >= self.max_bytes:
            if self.closed:
                raise ClosedError("client closed")
            waiter: asyncio.Future[None] = self.loop.create_future()
            self._waiters.append(waiter)
            self.flush()
            await waiter

    def wait_for_room_threadsafe(self, timeout: float | None) -> None:
        """``wait_for_room`` for another thread (the sync client's publisher)."""
        if self.pending < self.max_bytes:
            return
        with self._room:
            if not self._room.wait_for(lambda: self.pending < self.max_bytes or self.closed, timeout):
                raise Timeout("room in the outgoing buffer", timeout or 0.0)
        if self.closed:
            raise ClosedError("client closed")

    def close(self) -> None:
        self.closed = True
        self._records.clear()
        with self._foreign_lock:
            self._foreign.clear()
            self._foreign_bytes = 0
        self._buffered = 0
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(ClosedError("client closed"))
        self._waiters.clear()
        with self._room:
            self._room.notify_all()
