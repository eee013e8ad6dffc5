"""Outbox: each peer's outgoing queue, bounded in bytes and messages, coalesced into few sends.

Contract (pure: no sockets, no clock; the shell passes ``now`` and does the
sending): ``put`` queues one message for a peer and refuses it when that
peer's queue would exceed its budget (the shell then reports a drop to the
core, which evicts a peer that stays over budget); ``batched`` peers get
batch records, which ``next_message`` joins into one ``BATCH`` message of up
to ``batch_bytes``, so whatever accumulated for a peer during a loop turn
leaves in one send, while a lone message leaves at once.  ``sent`` /
``blocked`` / ``discard`` are the shell's report of each attempt: a message
the socket would not take (libzmq's small per-peer pipe is full) stays at
the head of the queue and is retried after a short, growing pause.

The broker counts these bytes itself, so it knows a peer is over budget
without asking libzmq; what libzmq holds beyond them is at most its send
high-water mark (a few messages) per peer.  A queue addressed to a routing
id the core no longer knows (a last 429 to an evicted peer) expires after
``orphan_ttl`` seconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from ..protocol import batch

Payload = Sequence[bytes] | bytes  # frames, or a batch record

GROUP_SKIP_BYTES = 1 << 20  # a queue-group member backed up by more than this is passed over (at most)
RETRY_FIRST = 0.001  # seconds before the first retry of a send libzmq refused
RETRY_MAX = 0.05


class PeerQueue:
    __slots__ = ("items", "bytes", "head", "head_bytes", "batched", "retry_at", "backoff", "expires")

    def __init__(self, batched: bool, expires: float | None) -> None:
        self.items: deque[Payload] = deque()
        self.bytes = 0  # queued, including the head
        self.head: list[bytes] | None = None  # a message built from the items, not yet taken by the socket
        self.head_bytes = 0
        self.batched = batched
        self.retry_at = 0.0
        self.backoff = 0.0
        self.expires = expires  # None: a known peer's queue


def size_of(payload: Payload) -> int:
    return len(payload) if isinstance(payload, bytes) else sum(map(len, payload))


class Outbox:
    def __init__(self, *, max_bytes: int, max_messages: int, batch_bytes: int, orphan_ttl: float = 10.0) -> None:
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self.batch_bytes = batch_bytes
        self.orphan_ttl = orphan_ttl
        self.queues: dict[bytes, PeerQueue] = {}
        self._pending: dict[bytes, None] = {}  # queues with something to send, in the order they got it
        self._last_frames: object = None  # fan-out hands the same frames to many batched peers:
        self._last_record = b""  # the record is built once
        self.queued_bytes = 0  # over all queues (for monitoring)
        self.sent_messages = 0  # messages handed to the socket (a BATCH counts once), for monitoring
        self.sent_bytes = 0

    # ------------------------------------------------------------ queueing
    def put(self, routing_id: bytes, payload: Payload, *, batched: bool, known: bool, now: float) -> bool:
        """Queue ``payload``; False (nothing queued) when the peer's budget would be exceeded."""
        queue = self.queues.get(routing_id)
        if queue is None:
            queue = self.queues[routing_id] = PeerQueue(batched, None if known else now + self.orphan_ttl)
        if queue.batched and not isinstance(payload, bytes):
            if payload is not self._last_frames:
                self._last_frames, self._last_record = payload, batch.record_of(payload)
            payload = self._last_record
        size = len(payload) if isinstance(payload, bytes) else sum(map(len, payload))
        if (queue.bytes + size > self.max_bytes or len(queue.items) >= self.max_messages) and queue.bytes:
            return False  # (one message always fits an empty queue, however large)
        queue.items.append(payload)
        queue.bytes += size
        self.queued_bytes += size
        self._pending[routing_id] = None
        return True

    def room(self, routing_id: bytes) -> int:
        """Bytes ``routing_id`` may still be sent before its budget is reached."""
        queue = self.queues.get(routing_id)
        return self.max_bytes - (queue.bytes if queue is not None else 0)

    def backlog(self, routing_id: bytes) -> int:
        queue = self.queues.get(routing_id)
        return queue.bytes if queue is not None else 0

    def discard(self, routing_id: bytes) -> int:
        """Forget everything queued for a peer (it is gone or was evicted); returns the bytes freed."""
        queue = self.queues.pop(routing_id, None)
        self._pending.pop(routing_id, None)
        if queue is None:
            return 0
        self.queued_bytes -= queue.bytes
        return queue.bytes

    # ------------------------------------------------------------ sending
    def ready(self, now: float) -> Iterator[bytes]:
        """Routing ids with something to send now (a snapshot: the shell may change queues meanwhile)."""
        for routing_id in list(self._pending):
            queue = self.queues.get(routing_id)
            if queue is None:
                self._pending.pop(routing_id, None)
            elif queue.expires is not None and now >= queue.expires:
                self.discard(routing_id)
            elif queue.retry_at <= now:
                yield routing_id

    def next_message(self, routing_id: bytes) -> list[bytes] | None:
        """The next message to try for this peer (the same one again until ``sent``), or None."""
        queue = self.queues.get(routing_id)
        if queue is None:
            return None
        if queue.head is not None:
            return queue.head
        items = queue.items
        if not items:
            self._pending.pop(routing_id, None)
            return None
        if not queue.batched:
            frames = items.popleft()
            queue.head = frames if isinstance(frames, list) else list(frames)  # type: ignore[arg-type]
            queue.head_bytes = sum(map(len, queue.head))
            return queue.head
        records = [items.popleft()]
        size = len(records[0])
        limit = self.batch_bytes
        while items and size + len(items[0]) <= limit:
            record = items.popleft()
            records.append(record)
            size += len(record)
        queue.head = batch.batch_frames(b"".join(records))  # type: ignore[arg-type]
        queue.head_bytes = size
        return queue.head

    def sent(self, routing_id: bytes) -> None:
        queue = self.queues.get(routing_id)
        if queue is None or queue.head is None:
            return
        queue.bytes -= queue.head_bytes
        self.queued_bytes -= queue.head_bytes
        self.sent_messages += 1
        self.sent_bytes += queue.head_bytes
        queue.head = None
        queue.backoff = 0.0
        if not queue.items:
            self._pending.pop(routing_id, None)
            if queue.expires is not None:  # an orphan's last words went out
                del self.queues[routing_id]

    def blocked(self, routing_id: bytes, now: float) -> None:
        """The socket would not take the head message: retry later (sooner while it keeps moving)."""
        queue = self.queues.get(routing_id)
        if queue is not None:
            queue.backoff = min(RETRY_MAX, max(RETRY_FIRST, queue.backoff * 2))
            queue.retry_at = now + queue.backoff

    def next_retry(self) -> float | None:
        """When the earliest blocked queue should be tried again (None: nothing waits)."""
        earliest: float | None = None
        for routing_id in self._pending:
            queue = self.queues.get(routing_id)
            if queue is not None and queue.retry_at and (earliest is None or queue.retry_at < earliest):
                earliest = queue.retry_at
        return earliest

    @property
    def pending(self) -> bool:
        return bool(self._pending)
