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

A queue follows its peer's framing as of the latest ``put``: a routing id
may be answered before it connects (an unbatched 401) and then connect with
``BATCH 1``, or reconnect without it.  Each item keeps the shape it was
queued in, and ``next_message`` renders it for the peer as it is now: batch
records go out as a ``BATCH`` to a batched peer and as their commands'
frames to an unbatched one; frames go out as they are (a batched peer
takes unbatched messages too).  Frames queued for a batched peer become a
record of its next batch, except ``Unbatched`` frames (the OK to its
``CONNECT ... BATCH 1``), which leave as a message of their own, in order.  No item can be sent in a shape its peer
did not negotiate, whatever order the modes came in.

The broker counts these bytes itself, so it knows a peer is over budget
without asking libzmq; what libzmq holds beyond them is at most its send
high-water mark (a few messages) per peer.

A queue addressed to a routing id the core no longer knows (an orphan: a
401 to a stranger, the last 429 to an evicted peer) holds at most
``ORPHAN_BYTES`` and waits until the socket takes it, the connection is
gone, or ``orphan_ttl`` passes (long: an evicted peer that stalls for
minutes still learns why when it reads again); at most ``MAX_ORPHANS`` of
them, the oldest dropped first.

Back-pressure (``holding_input``): a peer that reads and whose queue is
over the hold mark (a quarter of its budget) asks the shell to stop reading
input until the queue is back under half the mark: publishers then wait
(libzmq's receive queue, TCP and the client library's bounded buffer push
back on them) instead of the reader losing messages.  "Reads" means the
socket took something for it recently: within ``READING_WINDOW``, or three
times the longest stall it recently came back from (libzmq frees a full pipe
in bursts: a steady reader is seen to stall as long as it takes it to read
half its ``send_hwm``).  A
peer that does not read holds nothing for long (its queue fills, it is
dropped for, and evicted as a slow consumer), and one that reads may hold
the input at most ``hold_limit`` seconds in a row.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Protocol

from ..errors import ProtocolError
from ..protocol import Unbatched, batch

Payload = Sequence[bytes] | bytes  # frames, or a batch record

GROUP_SKIP_BYTES = 1 << 20  # a queue-group member backed up by more than this is passed over (at most)
RETRY_FIRST = 0.001  # seconds before the first retry of a send libzmq refused
RETRY_MAX = 0.05
ORPHAN_RETRY_MAX = 0.5  # an orphan's last words wait for a stalled reader: retried less often
ORPHAN_TTL = 600.0  # seconds an orphan's queue waits for the socket to take it
ORPHAN_BYTES = 16 * 1024  # an orphan's queue holds last words, not a backlog
MAX_ORPHANS = 4096
READING_WINDOW = 1.0  # seconds: a peer the socket took something for this recently is reading
STALL_HALF_LIFE = 30.0  # seconds: how fast the longest stall a reader came back from is forgotten
HOLD_LIMIT = 5.0  # seconds a reading peer may hold the input in a row (at most)


class Tally(Protocol):
    """Where ``put`` counts what it queued for a peer (``mc0.broker.core.peers.Peer`` is one)."""

    msgs_out: int
    bytes_out: int


class PeerQueue:
    __slots__ = (
        "items",
        "bytes",
        "head",
        "head_bytes",
        "batched",
        "retry_at",
        "backoff",
        "expires",
        "progress",
        "over_since",
        "blocked_at",
        "stall",
        "stall_at",
        "refused_since",
    )

    def __init__(self, batched: bool, expires: float | None, now: float) -> None:
        self.items: deque[Payload] = deque()
        self.bytes = 0  # queued, including the head
        self.head: list[bytes] | None = None  # a message built from the items, not yet taken by the socket
        self.head_bytes = 0
        self.batched = batched
        self.retry_at = 0.0
        self.backoff = 0.0
        self.expires = expires  # None: a known peer's queue
        self.progress = now  # when the socket last took a message of this queue
        self.over_since: float | None = None  # when it went over the hold mark (None: under it)
        self.blocked_at: float | None = None  # the first refusal since the socket last took one
        self.stall = 0.0  # the longest the socket recently refused it before taking again ...
        self.stall_at = now  # ... as of then (it halves every STALL_HALF_LIFE)
        self.refused_since: float | None = None  # a put was refused and nothing was taken since


def _recent_stall(queue: PeerQueue, now: float) -> float:
    return queue.stall * 0.5 ** ((now - queue.stall_at) / STALL_HALF_LIFE) if queue.stall else 0.0


def size_of(payload: Payload) -> int:
    return len(payload) if isinstance(payload, bytes) else sum(map(len, payload))


class Outbox:
    def __init__(
        self,
        *,
        max_bytes: int,
        max_messages: int,
        batch_bytes: int,
        orphan_ttl: float = ORPHAN_TTL,
        hold_limit: float = HOLD_LIMIT,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self.batch_bytes = batch_bytes
        self.orphan_ttl = orphan_ttl
        self.hold_bytes = max_bytes // 4  # back-pressure: a reading peer's queue over this holds the input
        self.hold_messages = max(1, max_messages // 4)
        self.hold_limit = hold_limit
        self.queues: dict[bytes, PeerQueue] = {}
        self._orphans: dict[bytes, None] = {}  # orphan queues, oldest first
        # Queues over the hold mark, and those that refused a put and have not moved since: the loop
        # reads both as gates (empty: nothing holds the input, nothing to evict) before asking more.
        self.over: dict[bytes, None] = {}
        self.refusing: dict[bytes, None] = {}
        self._pending: dict[bytes, None] = {}  # queues with something to send, in the order they got it
        self._last_frames: object = None  # fan-out hands the same frames to many batched peers:
        self._last_record = b""  # the record is built once
        self.queued_bytes = 0  # over all queues (for monitoring)
        self.discarded_bytes = 0  # freed by dropping whole queues, ever (the shell trims the heap after much)
        self.sent_messages = 0  # messages handed to the socket (a BATCH counts once), for monitoring
        self.sent_bytes = 0

    # ------------------------------------------------------------ queueing
    def put(
        self, routing_id: bytes, payload: Payload, *, batched: bool, known: bool, now: float, tally: Tally | None = None
    ) -> bool:
        """Queue ``payload``; False (nothing queued) when the peer's budget would be exceeded.
        ``tally``: counts the message and its bytes when queued (the peer's traffic, for monitoring)."""
        queue = self.queues.get(routing_id)
        if queue is None:
            queue = self._new_queue(routing_id, batched, known, now)
        elif queue.batched is not batched or (known and queue.expires is not None):
            queue.batched = batched  # the routing id's peer (re)connected in another framing
            if known and queue.expires is not None:  # an orphan's queue now belongs to a peer
                queue.expires = None
                self._orphans.pop(routing_id, None)
        if queue.batched and not isinstance(payload, (bytes, Unbatched)):
            if payload is not self._last_frames:
                self._last_frames, self._last_record = payload, batch.record_of(payload)
            payload = self._last_record
        size = len(payload) if isinstance(payload, bytes) else sum(map(len, payload))
        budget = self.max_bytes if queue.expires is None else ORPHAN_BYTES
        if (queue.bytes + size > budget or len(queue.items) >= self.max_messages) and queue.bytes:
            if queue.refused_since is None:
                queue.refused_since = now
                self.refusing[routing_id] = None
            return False  # (one message always fits an empty queue, however large)
        queue.items.append(payload)
        queue.bytes += size
        if tally is not None:
            tally.msgs_out += 1
            tally.bytes_out += size
        self.queued_bytes += size
        self._pending[routing_id] = None
        if (queue.bytes > self.hold_bytes or len(queue.items) > self.hold_messages) and queue.over_since is None:
            queue.over_since = now
            self.over[routing_id] = None
        return True

    def _new_queue(self, routing_id: bytes, batched: bool, known: bool, now: float) -> PeerQueue:
        if known:
            queue = self.queues[routing_id] = PeerQueue(batched, None, now)
            return queue
        if len(self._orphans) >= MAX_ORPHANS:
            self.discard(next(iter(self._orphans)))
        queue = self.queues[routing_id] = PeerQueue(batched, now + self.orphan_ttl, now)
        self._orphans[routing_id] = None
        return queue

    def room(self, routing_id: bytes) -> int:
        """Bytes ``routing_id`` may still be sent before its budget is reached."""
        queue = self.queues.get(routing_id)
        return self.max_bytes - (queue.bytes if queue is not None else 0)

    def backlogs(self) -> dict[bytes, int]:
        """Bytes queued per peer, for the peers with any (a monitoring capture's)."""
        return {routing_id: queue.bytes for routing_id, queue in self.queues.items() if queue.bytes}

    def backlog(self, routing_id: bytes) -> int:
        queue = self.queues.get(routing_id)
        return queue.bytes if queue is not None else 0

    def discard(self, routing_id: bytes) -> int:
        """Forget everything queued for a peer (it is gone or was evicted); returns the bytes freed."""
        queue = self.queues.pop(routing_id, None)
        self._pending.pop(routing_id, None)
        self.over.pop(routing_id, None)
        self._orphans.pop(routing_id, None)
        self.refusing.pop(routing_id, None)
        if queue is None:
            return 0
        self.queued_bytes -= queue.bytes
        self.discarded_bytes += queue.bytes
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
        first = items[0]
        if not isinstance(first, bytes):  # frames: as they are, to either kind of peer
            items.popleft()
            queue.head = first if isinstance(first, list) else list(first)
            queue.head_bytes = sum(map(len, queue.head))
            return queue.head
        if not queue.batched:  # records for a peer that is no longer batched: their commands' frames
            self._unbatch_head(queue)
            return self.next_message(routing_id)
        records = [items.popleft()]
        size = len(first)
        limit = self.batch_bytes
        while items and isinstance(items[0], bytes) and size + len(items[0]) <= limit:
            record = items.popleft()
            records.append(record)
            size += len(record)
        queue.head = batch.batch_frames(b"".join(records))  # type: ignore[arg-type]
        queue.head_bytes = size
        return queue.head

    def _unbatch_head(self, queue: PeerQueue) -> None:
        """Replace the head item (batch records) with each record's command as frames.

        Rare (a peer reconnected unbatched while records waited for it), so it may cost:
        the queue's byte count follows the new sizes.  A record that does not split is dropped.
        """
        blob = queue.items.popleft()
        assert isinstance(blob, bytes)
        expanded: list[list[bytes]] = []
        try:
            for code, start, end in batch.records(blob):
                expanded.append(batch.frames_of(blob, code, start, end))
        except ProtocolError:
            pass  # (the broker builds these records; a torn one is a bug, not worth a crash)
        grown = sum(sum(map(len, frames)) for frames in expanded) - len(blob)
        queue.bytes += grown
        self.queued_bytes += grown
        queue.items.extendleft(reversed(expanded))

    def sent(self, routing_id: bytes, now: float | None = None) -> None:
        """The socket took the head message (``now``: when, for the back-pressure rule)."""
        queue = self.queues.get(routing_id)
        if queue is None or queue.head is None:
            return
        queue.bytes -= queue.head_bytes
        self.queued_bytes -= queue.head_bytes
        self.sent_messages += 1
        self.sent_bytes += queue.head_bytes
        queue.head = None
        queue.backoff = 0.0
        if queue.refused_since is not None:
            queue.refused_since = None
            self.refusing.pop(routing_id, None)
        if now is not None:
            queue.progress = now
            if queue.blocked_at is not None:  # the longest recent stall, slowly forgotten
                queue.stall = max(_recent_stall(queue, now), now - queue.blocked_at)
                queue.stall_at = now
                queue.blocked_at = None
        if queue.over_since is not None and queue.bytes <= self.hold_bytes // 2:
            if len(queue.items) <= self.hold_messages // 2:
                queue.over_since = None
                self.over.pop(routing_id, None)
        if not queue.items:
            self._pending.pop(routing_id, None)
            if queue.expires is not None:  # an orphan's last words went out
                self.discard(routing_id)

    def blocked(self, routing_id: bytes, now: float) -> None:
        """The socket would not take the head message: retry later (sooner while it keeps moving)."""
        queue = self.queues.get(routing_id)
        if queue is not None:
            if queue.blocked_at is None:
                queue.blocked_at = now
            longest = RETRY_MAX if queue.expires is None else ORPHAN_RETRY_MAX
            queue.backoff = min(longest, max(RETRY_FIRST, queue.backoff * 2))
            queue.retry_at = now + queue.backoff

    def holding_input(self, now: float) -> bool:
        """A reading peer's queue is over the hold mark: the shell should read no input now
        (see the module's contract).  Costs nothing while no queue is over the mark."""
        if not self.over:
            return False
        limit = self.hold_limit
        for routing_id in self.over:
            queue = self.queues[routing_id]
            window = min(limit, max(READING_WINDOW, 3 * _recent_stall(queue, now)))
            since = now if queue.over_since is None else queue.over_since
            if queue.expires is None and now - queue.progress <= window and now - since < limit:
                return True
        return False

    def stuck(self, now: float, seconds: float) -> list[bytes]:
        """Known peers whose queue refused messages ``seconds`` ago and has not moved since."""
        if not self.refusing:
            return []
        stuck = []
        for routing_id in self.refusing:
            queue = self.queues[routing_id]
            if queue.expires is None and queue.refused_since is not None and now - queue.refused_since >= seconds:
                stuck.append(routing_id)
        return stuck

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
