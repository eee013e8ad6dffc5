"""Link: a client's socket on the event loop, both ways, without a future per message.

Contract: the socket is a plain (blocking-API) pyzmq socket used only with
``NOBLOCK``, driven by ``loop.add_reader`` on its ``ZMQ_FD``: one callback per
readiness reads up to ``READ_PER_TURN`` messages and hands each to
``on_message(frames)`` (a synchronous callback; the next turn reads on, so
the application gets the loop between bursts).  zmq.asyncio would build a
future, a callback and several enum operations per message each way; this
costs one C call per frame.  Frames are sent copied below ``COPY_BYTES``
(pyzmq's zero-copy path builds a ``zmq.Frame`` per frame, which costs more
than the copy for a small one: a three-frame PUT sent and received over
inproc, 4.7 against 4.3 us).

Sending: every command goes through ``send`` (frames) or ``send_record`` (an
already-encoded batch record).  Once the session is connected with batched
framing, commands become records in one buffer, flushed as a single ``BATCH``
message at the end of the event-loop turn (a burst leaves in few messages of
up to ``FLUSH_BYTES``), or earlier when the buffer reaches that size; the
first command of a turn is sent at once, so a lone request pays no wait.
Before the broker has accepted the session (connecting, healing) commands
wait in the buffer and leave, in order, once it has; ``send_now`` is for the
CONNECT itself.  A message libzmq will not take (its small queue is full)
waits, in order, until the socket is writable again.  The buffer plus what
libzmq has not taken is bounded by ``max_bytes``: ``wait_for_room`` is the
back-pressure a producer awaits.  Thread-safe entry for other threads:
``send_record_threadsafe`` and ``wait_for_room_threadsafe``.  A client that
fails over to another broker moves the Link to a new socket
(``replace_socket``): what waits here stays, in order; ``read_left`` reads
what the lost broker's socket still holds (its last answers), ``unsent_ids``
names the commands among it that no broker has seen, and ``send_first`` puts
commands to repeat ahead of it.

ZMQ_FD is edge-triggered: it signals that ``ZMQ_EVENTS`` may have changed,
and any send or receive may consume that signal.  So after every flush and
every read the callback looks at ``ZMQ_EVENTS`` itself and schedules another
round when there is more to read (or room for what waits), as pyzmq's own
asyncio integration does; a slow timer re-checks while sends are blocked.
Pure asyncio + pyzmq; no protocol decisions.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable
from typing import cast

import zmq

from ..errors import ClosedError, ProtocolError, Timeout
from ..protocol import Verb, batch
from ..session import ClientSession, Frames

log = logging.getLogger("mc0.client")

FLUSH_BYTES = 256 * 1024  # one BATCH message holds at most about this much
READ_PER_TURN = 16  # messages (most are batches) read per loop turn before others get the loop
BLOCKED_RECHECK = 0.05  # seconds: a safety re-check of ZMQ_EVENTS while sends wait for room
_CONNECT = Verb.CONNECT.value.encode()
# pyzmq's constants are enum.Flag members; combining them per call costs more than the call.
NOBLOCK = int(zmq.NOBLOCK)
MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
RCVMORE = int(zmq.RCVMORE)
COPY_BYTES = zmq.COPY_THRESHOLD  # frames smaller than this are copied into libzmq, larger ones are lent
EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)
POLLOUT = int(zmq.POLLOUT)


class Link:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        socket: zmq.Socket[bytes],
        session: ClientSession,
        max_bytes: int,
        on_message: Callable[[list[bytes]], None],
    ) -> None:
        self.loop = loop
        self.socket = socket
        self.session = session
        self.max_bytes = max_bytes
        self.on_message = on_message
        self._records: list[bytes] = []
        self._buffered = 0  # bytes in _records
        self._blocked: collections.deque[tuple[Frames, int]] = collections.deque()  # libzmq's queue was full
        self._blocked_bytes = 0
        # Taken from _blocked when the connection was lost: sent once the next CONNECT is accepted.
        self._held: collections.deque[tuple[Frames, int]] = collections.deque()
        self._held_bytes = 0
        self._scheduled = False  # a flush at the end of this loop turn is due
        self._sent_this_turn = False  # something left at once since the last read or end-of-turn flush
        self._events_scheduled = False
        self._recheck: asyncio.TimerHandle | None = None
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        # Records from other threads (the sync client): appended there, moved in on the loop.
        self._foreign: collections.deque[tuple[bytes, Callable[[], None] | None]] = collections.deque()
        self._foreign_bytes = 0
        self._foreign_lock = threading.Lock()
        self._foreign_scheduled = False
        self._room = threading.Condition()  # other threads wait here for room
        self.closed = False
        self._fd: int = socket.FD
        loop.add_reader(self._fd, self._on_events)

    # ------------------------------------------------------------ entry points
    @property
    def pending(self) -> int:
        """Bytes queued and not yet taken by libzmq."""
        return self._buffered + self._blocked_bytes + self._held_bytes + self._foreign_bytes

    def send(self, frames: Frames) -> None:
        """Queue one command (in order with everything else)."""
        session = self.session
        if session.batched and session.connected:
            self.send_record(batch.record_of(frames))
        elif session.connected or frames[0] == _CONNECT:  # (healing: the CONNECT goes ahead of all)
            self._write(frames)
            self._check_events()
        else:
            self.send_record(batch.record_of(frames))  # held until the broker accepts the session

    def send_now(self, frames: Frames) -> None:
        """Send at once, ahead of anything buffered (CONNECT)."""
        self._write(frames)
        self._check_events()

    def send_record(self, record: bytes) -> None:
        self._records.append(record)
        self._buffered += len(record)
        if self._buffered >= FLUSH_BYTES:
            self.flush()
        elif not self._sent_this_turn:
            # The first command of a loop turn leaves at once (no added latency when traffic
            # is light); what follows it in the same turn leaves together when the turn ends.
            # ("This turn" is approximate, and only ever errs toward waiting for the turn's end:
            # the flag is reset by reading and by the end-of-turn flush.)
            self._sent_this_turn = True
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush_soon)

    def send_record_threadsafe(self, record: bytes, before: Callable[[], None] | None = None) -> None:
        """``send_record`` from another thread: one wake-up of the loop per burst, not per record.
        ``before`` runs on the loop just before the record is queued there."""
        with self._foreign_lock:
            self._foreign.append((record, before))
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
        for record, before in records:
            if before is not None:
                before()
            self.send_record(record)

    # ------------------------------------------------------------ flushing
    def _flush_soon(self) -> None:
        self._scheduled = False
        self._sent_this_turn = False
        self.flush()

    def flush(self) -> None:
        """Hand what is buffered to libzmq now (if the broker accepted the session)."""
        session = self.session
        if self.closed or not session.connected:
            return
        while self._held:  # what libzmq had not taken when the connection was lost goes first
            frames, size = self._held.popleft()
            self._held_bytes -= size
            self._write(frames, size)
        if not self._records:
            self._wake_producers()
            return
        records, self._records = self._records, []
        self._buffered = 0
        if not session.batched:  # a broker that did not grant batching: the same commands, one by one
            for record in records:
                for code, start, end in batch.records(record):
                    self._write(batch.frames_of(record, code, start, end))
        elif len(records) == 1:
            self._write(batch.batch_frames(records[0]), len(records[0]))
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
        self._check_events()
        self._wake_producers()

    def _write(self, frames: Frames, size: int = 0) -> None:
        if self.closed:
            return
        if self._blocked:  # keep the order: behind what already waits
            self._block(frames, size)
            return
        try:
            self._send_frames(frames)
        except zmq.Again:
            self._block(frames, size)
            return
        self.session.sent(self.loop.time())

    def hold_blocked(self) -> None:
        """The connection was lost: what libzmq could not take yet would reach the next broker
        session before its CONNECT, so it waits for ``flush`` after the CONNECT is accepted
        (a CONNECT among it is dropped: a new one is sent)."""
        while self._blocked:
            frames, size = self._blocked.popleft()
            self._blocked_bytes -= size
            if frames[0] != _CONNECT:
                self._held.append((frames, size))
                self._held_bytes += size

    # ------------------------------------------------------------ failover
    def replace_socket(self, socket: zmq.Socket[bytes]) -> None:
        """Read and write ``socket`` from now on (the owner closes the old one after): what
        libzmq had not taken waits for the next ``flush``, as after a lost connection."""
        self.hold_blocked()
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        self.loop.remove_reader(self._fd)
        self.socket = socket
        self._fd = socket.FD
        self.loop.add_reader(self._fd, self._on_events)

    def unsent_ids(self) -> set[str]:
        """The IDs of the commands waiting here, never handed to libzmq: no broker has seen them."""
        with self._foreign_lock:
            blobs = [record for record, _ in self._foreign]
        blobs += self._records
        for frames, _ in (*self._blocked, *self._held):
            blobs.append(frames[2] if batch.is_batch(frames) else batch.frames_record(frames))
        ids: set[str] = set()
        for blob in blobs:
            try:
                for code, start, end in batch.records(blob):
                    found = batch.id_of(blob, code, start, end)
                    if found is not None:
                        ids.add(found)
            except ProtocolError:  # our own records: cannot happen, and would only mean fewer ids
                continue
        return ids

    def read_left(self) -> int:
        """Read every message the socket holds now, handing each to ``on_message`` (the lost
        broker's last answers, read before what it left unanswered is sent again); how many."""
        if self.closed:
            return 0
        sock = self.socket
        read = 0
        while not self.closed:
            try:
                frames = [sock.recv(NOBLOCK)]
            except zmq.ZMQError:  # Again: nothing left (or the socket is gone)
                return read
            while sock.getsockopt(RCVMORE):
                frames.append(sock.recv(NOBLOCK))
            read += 1
            try:
                self.on_message(frames)
            except Exception:  # as in _on_events: one message's fault stops nothing
                log.exception("error handling a message from the broker")
        return read

    def send_first(self, commands: list[Frames]) -> None:
        """``commands`` go ahead of everything waiting, once the session is accepted (``flush``)."""
        for frames in reversed(commands):
            size = sum(map(len, frames))
            self._held.appendleft((frames, size))
            self._held_bytes += size

    def _send_frames(self, frames: Frames) -> None:
        send = self.socket.send
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            # A multipart message is taken whole or not at all: only the first part can raise Again.
            send(frame, MORE_NOBLOCK if i < last else NOBLOCK, copy=len(frame) < COPY_BYTES)

    def _block(self, frames: Frames, size: int) -> None:
        size = size or sum(map(len, frames))
        self._blocked.append((frames, size))
        self._blocked_bytes += size
        if self._recheck is None:
            self._recheck = self.loop.call_later(BLOCKED_RECHECK, self._recheck_blocked)

    def _recheck_blocked(self) -> None:
        self._recheck = None
        self._on_events()
        if self._blocked and self._recheck is None and not self.closed:
            self._recheck = self.loop.call_later(BLOCKED_RECHECK, self._recheck_blocked)

    def _send_blocked(self) -> None:
        blocked = self._blocked
        while blocked:
            frames, size = blocked[0]
            try:
                self._send_frames(frames)
            except zmq.Again:
                return
            blocked.popleft()
            self._blocked_bytes -= size
            self.session.sent(self.loop.time())
        self._wake_producers()

    # ------------------------------------------------------------ readiness
    def _check_events(self) -> None:
        """After a send: if libzmq took the FD's signal with it, do the work the signal meant."""
        if not self._events_scheduled and not self.closed:
            events = cast(int, self.socket.getsockopt(EVENTS))
            if events & POLLIN or (events & POLLOUT and self._blocked):
                self._events_scheduled = True
                self.loop.call_soon(self._on_events)

    def _on_events(self) -> None:
        self._events_scheduled = False
        if self.closed:
            return
        sock = self.socket
        try:
            events = cast(int, sock.getsockopt(EVENTS))
        except zmq.ZMQError:
            return  # closed under us
        if events & POLLOUT and self._blocked:
            self._send_blocked()
        if not events & POLLIN:
            return
        self._sent_this_turn = False  # a new turn: the first answer to what we read may leave at once
        recv = sock.recv
        for _ in range(READ_PER_TURN):
            frames = [recv(NOBLOCK)]  # POLLIN: a whole message is there
            while sock.getsockopt(RCVMORE):
                frames.append(recv(NOBLOCK))
            try:
                self.on_message(frames)
            except Exception:  # a bug in handling one message must not stop the reading
                log.exception("error handling a message from the broker")
            if self.closed or not cast(int, sock.getsockopt(EVENTS)) & POLLIN:
                return  # (asking is cheaper than the Again exception a blind recv would raise)
        # More is waiting: read on after the loop has run what was just made ready.
        self._events_scheduled = True
        self.loop.call_soon(self._on_events)

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
        """Stop reading and drop what waits (idempotent; the owner closes the socket after)."""
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self._fd)
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        self._records.clear()
        self._blocked.clear()
        self._blocked_bytes = 0
        self._held.clear()
        self._held_bytes = 0
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
