"""Route traffic in: the cluster link thread's side of this broker's inbox subscription (``mc0.cl.to.NAME``).

Contract (runs on the link thread's asyncio loop): :class:`RouteInbound`
takes each message of the subscription in order (nats-py calls one
subscription's callback one message at a time), puts chunked records
together again (:class:`Reassembly`), and posts each route blob to the
broker loop within the :class:`~.credit.Poster`'s credit: while more than
its budget waits for the loop, the callback waits, and what arrives
meanwhile waits in nats-py's subscription (bounded there by the link's
pending limits; past them nats-py drops, and :meth:`RouteInbound.dropped`
counts each).  Drops are reported as one ``RoutesDropped`` (every route
opened afresh) once everything received before them has been posted, at
most once a second, the last never skipped.  A message lost between one
sender and this broker (a chunk missing or malformed, a record put together
past the bounds, one left unfinished) costs that message only: counted
(``route_records_lost``) and that route reopened (``RouteResync``, at most
once a second per broker: :class:`Resyncs`).  What was received before the
link went down is not posted after it (its routes are forgotten at DOWN).

Memory: at most one record under way per sender (one NATS connection keeps
a sender's order, so its chunks come one after another), and only from a
broker this one has a route to (the loop says which: ``ClusterLink.routes``);
each at most ``max_record`` bytes, all together at most ``budget`` bytes,
counted as the bytes arrive (never a record's declared size at its first
chunk); a record that needs room takes it from the oldest under way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...protocol import routes as wire
from . import posts
from .credit import Poster

log = logging.getLogger("mc0.broker")

CREDIT_POLL_S = 0.05  # a route message waiting for credit is woken by the loop, else looks again
DROP_NOTICE_S = 1.0  # at most one RoutesDropped (and one log line) a second, the last one never skipped
RESYNC_NOTICE_S = 1.0  # at most one RouteResync a second per broker
PARTIAL_TTL_S = 10.0  # a record under way that gets no chunk for this long is lost (a NATS failover takes ~2 s)
PARTIAL_OVERHEAD = 256  # what a record under way costs besides its bytes (its entry), against the budget
RESYNC_MEMORY = 4096  # brokers whose last RouteResync time is remembered (older ones are forgotten first)


class _Partial:
    __slots__ = ("epoch", "total", "data", "touched")

    def __init__(self, epoch: int, total: int, now: float) -> None:
        self.epoch = epoch
        self.total = total  # what its first chunk says it will be (at most max_record)
        self.data = bytearray()  # what came so far: it grows as its chunks arrive
        self.touched = now


def _no_routes(name: str) -> int | None:
    return None


class Reassembly:
    """Chunked records put together again, at most one under way per sender, bounded in bytes.

    ``take`` returns the record a chunk completes (None while it is under way) and counts what is
    lost in ``counters``: ``route_records_lost`` (a record under way that was not continued, or
    could not be started or go on within the bounds) and ``route_chunks_stray`` (a chunk of no
    record under way: the rest of one that was lost).  Every loss names its sender in ``losses``
    for the caller to resync.  A record is started only for a broker with a route here under the
    chunk's epoch (``route_epoch(name)``: the epoch of the route to it, None without one; anything
    else is counted ``route_chunks_refused``: nobody to resync), and its bytes are counted as they
    arrive, so a first chunk costs what it carries, not what it announces; when the budget is
    spent, the records under way that went the longest without a chunk are lost to make room.  Pure: ``now`` is
    passed in.
    """

    def __init__(
        self,
        counters: dict[str, int],
        *,
        max_record: int,
        budget: int,
        route_epoch: Callable[[str], int | None] = _no_routes,
    ) -> None:
        self.counters = counters
        self.max_record = max_record
        self.budget = budget
        self.route_epoch = route_epoch
        self.used = 0  # bytes of the records under way (and their entries)
        self._partials: dict[str, _Partial] = {}
        self.losses: list[str] = []  # senders that lost a message since the caller last looked

    def take(self, chunk: wire.Chunk, now: float) -> bytes | None:
        sender = chunk.sender
        partial = self._partials.get(sender)
        if partial is not None and (
            chunk.offset != len(partial.data) or chunk.total != partial.total or chunk.epoch != partial.epoch
        ):
            self._lose(sender)  # not its continuation: it was lost (the chunk may start the next one)
            partial = None
        if partial is None:
            partial = self._start(chunk, now)
            if partial is None:
                return None
        size = len(chunk.data)
        if not self._room(size, sender):  # (only a budget below twice max_record: lost, as it cannot fit)
            self._lose(sender)
            return None
        partial.data += chunk.data
        self.used += size
        partial.touched = now
        if len(partial.data) < partial.total:
            return None
        del self._partials[sender]
        self.used -= partial.total + PARTIAL_OVERHEAD
        return bytes(partial.data)  # (one copy of a record that took several NATS messages to come)

    def _start(self, chunk: wire.Chunk, now: float) -> _Partial | None:
        """A record's first chunk: under way from here (None: refused, or a chunk of none)."""
        if self.route_epoch(chunk.sender) != chunk.epoch:
            self.counters["route_chunks_refused"] += 1  # no route to it: a made-up sender, or one gone
            return None
        if chunk.offset != 0:
            self.counters["route_chunks_stray"] += 1
            self.losses.append(chunk.sender)
            return None
        if chunk.total > self.max_record or not self._room(PARTIAL_OVERHEAD, chunk.sender):
            self.counters["route_records_lost"] += 1  # (its later chunks are stray)
            self.losses.append(chunk.sender)
            return None
        partial = self._partials[chunk.sender] = _Partial(chunk.epoch, chunk.total, now)
        self.used += PARTIAL_OVERHEAD
        return partial

    def _room(self, size: int, sender: str) -> bool:
        """Room for ``size`` more bytes of ``sender``'s record: the records under way that went the
        longest without a chunk (another sender's) are lost until there is; False if there cannot be."""
        while self.used + size > self.budget:
            others = [(p.touched, s) for s, p in self._partials.items() if s != sender]
            if not others:
                return False
            self._lose(min(others)[1])
        return True

    def whole(self, sender: str) -> None:
        """A whole message from ``sender``: a record of its under way was lost."""
        if sender in self._partials:
            self._lose(sender)

    def expire(self, now: float, ttl: float = PARTIAL_TTL_S) -> None:
        """Records under way that got no chunk for ``ttl`` seconds are lost (their sender may be gone)."""
        for sender in [s for s, p in self._partials.items() if now - p.touched >= ttl]:
            self._lose(sender)

    def clear(self) -> None:
        """The link went down: what is under way is gone with its routes (counted, nobody to resync)."""
        for sender in list(self._partials):
            self._lose(sender)
        self.losses.clear()

    def _lose(self, sender: str) -> None:
        partial = self._partials.pop(sender)
        self.used -= len(partial.data) + PARTIAL_OVERHEAD
        self.counters["route_records_lost"] += 1
        self.losses.append(sender)


class Resyncs:
    """``RouteResync`` notices to the loop: at once, or, within a second of the last one for the same
    broker, held back to the end of that second (never skipped); one log line a second at most."""

    def __init__(self, post: Callable[[Sequence[bytes]], None], counters: dict[str, int]) -> None:
        self.post = post
        self.counters = counters
        self._last: dict[str, float] = {}
        self._held: dict[str, asyncio.TimerHandle] = {}
        self._logged_at = -RESYNC_NOTICE_S
        self._unlogged = 0  # notices since the last log line

    def ask(self, name: str) -> None:
        if name in self._held:
            return
        now = time.monotonic()
        last = self._last.get(name)
        if last is not None and now - last < RESYNC_NOTICE_S:
            self._held[name] = asyncio.get_running_loop().call_later(last + RESYNC_NOTICE_S - now, self._due, name)
            return
        self._send(name, now)

    def _due(self, name: str) -> None:
        self._held.pop(name, None)
        self._send(name, time.monotonic())

    def _send(self, name: str, now: float) -> None:
        if len(self._last) >= RESYNC_MEMORY:
            del self._last[next(iter(self._last))]
        self._last.pop(name, None)
        self._last[name] = now  # (the newest last)
        self.counters["route_resyncs"] += 1
        self._unlogged += 1
        if now - self._logged_at >= RESYNC_NOTICE_S:
            more = f" (and {self._unlogged - 1} more since the last line)" if self._unlogged > 1 else ""
            log.warning("cluster: a message between this broker and %s was lost; resyncing that route%s", name, more)
            self._logged_at, self._unlogged = now, 0
        self.post(posts.resync(name))

    def cancel(self) -> None:
        """The link went down: every route is forgotten and opened afresh later; nothing to ask."""
        for handle in self._held.values():
            handle.cancel()
        self._held.clear()


class RouteInbound:
    def __init__(
        self,
        post: Poster,
        counters: dict[str, int],
        resyncs: Resyncs,
        reassembly: Reassembly,
        stopping: asyncio.Event,
    ) -> None:
        self.post = post
        self.counters = counters
        self.resyncs = resyncs
        self.reassembly = reassembly
        self.stopping = stopping
        self.loop = asyncio.get_running_loop()
        self.subscription: Any = None  # nats-py's, once subscribed (its pending: received, not posted yet)
        self.credit = asyncio.Event()
        # Drops are reported only once everything received before them has been posted: the resync
        # then comes after it, in order.
        self.unreported = 0  # route messages dropped since the last notice
        self.reported_at = -DROP_NOTICE_S
        self.notice: asyncio.TimerHandle | None = None
        # A route message in the callback's hands (taken off the subscription, not posted yet) counts as
        # not posted; it is dropped unposted if the link goes down meanwhile (``stale_in_hand``).
        self.in_hand = False
        self.stale_in_hand = False
        self.stale_queued = 0  # route messages still queued when the link went down: dropped unposted

    # ------------------------------------------------------------ the subscription's callback
    async def on_message(self, msg: Any) -> None:
        try:
            await self._take(msg.data)
        finally:
            if self.unreported:  # (whatever became of this message: the report may be due now)
                self.report_drops()

    async def _take(self, data: bytes) -> None:
        if self.stale_queued:  # received before the link went down: its routes are gone, their state resent
            self.stale_queued -= 1
            self.counters["route_stale_dropped"] += 1
            return
        blob: bytes | None
        if wire.is_chunk(data):
            chunk = wire.parse_chunk(data)
            if chunk is None:
                self.counters["malformed"] += 1
                return
            self.counters["route_chunks_in"] += 1
            sender, epoch = chunk.sender, chunk.epoch
            blob = self.reassembly.take(chunk, time.monotonic())
        else:
            parsed = wire.parse_route_message(data)
            if parsed is None:
                self.counters["malformed"] += 1
                return
            sender, epoch, blob = parsed
            self.reassembly.whole(sender)
        self._ask_resyncs()
        if blob is None:
            return
        self.counters["received"] += 1
        if self.post.over and not await self._credit():
            return
        self.post(posts.route(sender, epoch, blob))

    async def _credit(self) -> bool:
        """Wait until the loop took enough of what was posted; False: the link went down meanwhile
        (the message is stale: dropped, counted)."""
        self.counters["route_credit_waits"] += 1
        self.in_hand = True
        try:
            while not self.stopping.is_set():
                self.credit.clear()
                if not self.post.arm(self.wake_credit):
                    break
                try:
                    await asyncio.wait_for(self.credit.wait(), CREDIT_POLL_S)
                except TimeoutError:
                    pass
        finally:
            self.in_hand = False
        if self.stale_in_hand:
            self.stale_in_hand = False
            self.counters["route_stale_dropped"] += 1
            return False
        return True

    def wake_credit(self) -> None:
        """(the broker loop's thread: ``consumed`` freed the budget)"""
        try:
            self.loop.call_soon_threadsafe(self.credit.set)
        except RuntimeError:  # the link's loop has ended (closing): nobody waits any more
            pass

    def _ask_resyncs(self) -> None:
        losses = self.reassembly.losses
        if losses:
            for sender in dict.fromkeys(losses):
                self.resyncs.ask(sender)
            losses.clear()

    def expire(self) -> None:
        """Called now and then (with the beacons): records under way that stopped coming are lost."""
        self.reassembly.expire(time.monotonic())
        self._ask_resyncs()

    # ------------------------------------------------------------ drops
    def dropped(self) -> None:
        """nats-py dropped a message of the subscription (the loop is behind past every bound)."""
        self.counters["route_dropped"] += 1
        self.unreported += 1
        self.report_drops()

    def report_drops(self) -> None:
        """One RoutesDropped for what was dropped since the last, once nothing received before
        waits in the subscription; at most one a second (a later one is scheduled, never skipped)."""
        sub = self.subscription
        if not self.unreported or self.notice is not None or self.in_hand or (sub is not None and sub.pending_msgs):
            return  # (nothing to say, already scheduled, or the callback reports once the rest is posted)
        wait = self.reported_at + DROP_NOTICE_S - time.monotonic()
        if wait > 0:
            self.notice = self.loop.call_later(wait, self._scheduled_report)
            return
        count, self.unreported, self.reported_at = self.unreported, 0, time.monotonic()
        log.warning("cluster: %d route message(s) dropped (this broker fell behind); resyncing routes", count)
        self.post(posts.dropped(count))

    def _scheduled_report(self) -> None:
        self.notice = None
        self.report_drops()

    # ------------------------------------------------------------ the link's state
    def disconnected(self) -> None:
        """The link lost NATS: what was received and not posted yet would reach the loop after DOWN,
        for routes it forgot; drops before DOWN need no resync (DOWN forgets every route, and they open
        afresh after UP)."""
        sub = self.subscription
        self.stale_queued = sub.pending_msgs if sub is not None else 0
        self.stale_in_hand = self.in_hand
        self.unreported = 0
        self.reassembly.clear()
        self.stop()

    def stop(self) -> None:
        """Nothing scheduled is posted any more (the link went down, or it closes)."""
        if self.notice is not None:
            self.notice.cancel()
            self.notice = None
        self.resyncs.cancel()
