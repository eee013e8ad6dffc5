"""asyncio subscriptions: what the broker routed to a client's patterns, held for the application.

Contract: a :class:`Subscription` is fed by the client's reader (never
blocking it) and read by the application, in arrival order; it holds at most
``max_pending`` messages / ``max_pending_bytes`` of bodies (beyond that new
ones are dropped, counted and reported, never silently).  What it needs of the
client that feeds it is :class:`SubscriptionOwner` and no more: this module
imports nothing of the client (the arrow points one way).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

from ..errors import ClosedError, SlowConsumer, Timeout
from ..message import Message

if TYPE_CHECKING:
    from ..tracing import Held, Tracing

log = logging.getLogger("mc0.client")

DEFAULT_MAX_PENDING = 512 * 1024  # messages a subscription holds for the application (nats-py's default)
DEFAULT_MAX_PENDING_BYTES = 128 * 1024 * 1024  # and their bodies' bytes
SYNC_RECHECK = 0.05  # a thread waiting for a message re-checks at least this often


class SubscriptionOwner(Protocol):
    """What a :class:`Subscription` asks of the client that feeds it (``mc0.aio.Client``
    implements it), and nothing else."""

    def report_fault(self, error: Exception) -> None:
        """Keep and report a fault the application should see (``faults``, ``on_fault``)."""

    async def unsubscribe(self, subscription: Subscription) -> None:
        """End the subscription at the broker and stop feeding it."""


class Subscription:
    """Messages matching any of its patterns, each once, in arrival order.

    The client's reader appends each received batch's messages in one go and
    wakes a waiting reader once (not once per message).  Holds at most
    ``max_pending`` messages / ``max_pending_bytes`` of bodies not yet taken;
    beyond that new ones are dropped, counted in ``dropped``, logged and
    reported once per episode as a :class:`~mc0.errors.SlowConsumer` fault
    (``client.faults`` and the client's ``on_fault``), never silently.
    """

    def __init__(
        self,
        client: SubscriptionOwner,
        patterns: tuple[str, ...],
        max_pending: int,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        *,
        group: str | None = None,
        from_seq: int | None = None,
        journal: str | None = None,
        replay_key: str | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """``tracing``: the client's (None: off), which makes a CONSUMER span of each message taken."""
        if max_pending < 1 or max_pending_bytes < 1:
            raise ValueError("max_pending and max_pending_bytes must be at least 1")
        self.client = client  # the client that feeds it
        self.patterns = patterns
        self.group = group  # the queue group it is a member of (None: a plain subscription)
        self.from_seq = from_seq  # subscribed FROM this seq (a replay, then live), of ``journal`` if named
        self.journal = journal
        self.replay_key = replay_key  # the client's local key for its replay's history (mc0.events.replay_key)
        self.error: Exception | None = None  # why the broker ended it (a replay that stopped), if it did
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.dropped = 0
        self.closed = False
        self._items: collections.deque[Message] = collections.deque()
        self._bytes = 0
        self._dropping = False  # in a drop episode (reported once)
        self._waiters: list[asyncio.Future[None]] = []
        self._sync = threading.Condition()  # for threads reading through the sync API
        self._sync_waiting = False
        self._tracing = tracing
        self._held: Held | None = None  # the span of the message (or batch) the application took last
        # A replay's history (SUB FROM): its journal and where it ends, once the broker's OK said so.
        self.history: tuple[str, int] | None = None

    @property
    def pattern(self) -> str:
        return self.patterns[0] if self.patterns else "(mailbox)"

    @property
    def pending(self) -> int:
        """Messages received and not yet taken."""
        return len(self._items)

    # ------------------------------------------------------------ fed by the client's reader
    def _offer(self, message: Message) -> None:
        items = self._items
        if len(items) >= self.max_pending or self._bytes >= self.max_pending_bytes:
            self._drop()
            return
        items.append(message)
        parts = message.parts
        self._bytes += len(parts[0]) if len(parts) == 1 else sum(map(len, parts))
        if self._waiters:
            self._wake()
        if self._sync_waiting:
            with self._sync:
                self._sync.notify_all()

    def offer_run(self, messages: list[Message]) -> None:
        """(Called by the client's reader, not by applications.) Each of ``messages`` received, in
        order, as one by one: in one step (one append of them all, one wake-up) when every one of
        them fits, else each taken or dropped past ``max_pending`` as it comes."""
        items = self._items
        if len(items) + len(messages) > self.max_pending or self._bytes >= self.max_pending_bytes:
            for message in messages:
                self._offer(message)
            return
        size = 0
        for message in messages:
            parts = message.parts
            size += len(parts[0]) if len(parts) == 1 else sum(map(len, parts))
        if self._bytes + size >= self.max_pending_bytes:
            for message in messages:
                self._offer(message)
            return
        items.extend(messages)
        self._bytes += size
        if self._waiters:
            self._wake()
        if self._sync_waiting:
            with self._sync:
                self._sync.notify_all()

    def _drop(self) -> None:
        self.dropped += 1
        if not self._dropping:
            self._dropping = True
            reason = (
                f"subscription {self.pattern!r} is not keeping up: dropping messages "
                f"(max_pending {self.max_pending} messages / {self.max_pending_bytes} bytes)"
            )
            self.client.report_fault(SlowConsumer(reason, where="client", dropped=self.dropped))
        elif self.dropped % 10_000 == 0:
            log.warning("subscription %r: %d messages dropped so far", self.pattern, self.dropped)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def mark_ended(self, error: Exception | None = None) -> None:
        """(Called by the client, not by applications.) This subscription has ended: closed by the
        client, its replay done, or ended by the broker with ``error``; readers are woken and what
        is buffered can still be read.  Idempotent: the first end's error stays."""
        self._release_held()
        if not self.closed:
            self.closed = True
            self.error = error
            self._wake()
            with self._sync:
                self._sync.notify_all()

    def _closed_error(self) -> ClosedError:
        """What a read of this ended subscription raises: closed, and why when the broker ended it."""
        text = f"subscription {self.patterns!r} is closed"
        if self.error is None:
            return ClosedError(text)
        closed = ClosedError(f"{text}: {self.error}")
        closed.__cause__ = self.error
        return closed

    def _take(self) -> Message:
        message = self._items.popleft()
        parts = message.parts
        self._bytes -= len(parts[0]) if len(parts) == 1 else sum(map(len, parts))
        if self._dropping and not self._items:
            self._dropping = False  # caught up: the next drop starts a new episode
        return message

    # ------------------------------------------------------------ read by the application
    def release_span(self) -> None:
        """Traced (the client has a tracer provider): end the span of the message (or batch) taken last,
        which stays current where it was taken until the next is taken or the subscription closes;
        for a reader that stops early (a ``break``), in the task or thread that took it.  Else nothing."""
        self._release_held()

    def _release_held(self) -> None:
        """The held span ends (and, where it was taken, stops being current: else that reader's next
        read does that)."""
        if self._held is not None:
            assert self._tracing is not None
            if self._tracing.release(self._held):
                self._held = None

    def _traced(self, message: Message) -> Message:
        """``message``, handed to the application: its CONSUMER span (``tracing``) current from now on
        where it was taken, until the next is taken.  A record of the replay's history is linked to
        the context it was published with, not parented on it (it may be read hours later)."""
        assert self._tracing is not None
        history = self.history
        linked = (
            history is not None
            and message.seq is not None
            and message.journal == history[0]
            and message.seq < history[1]
        )
        self._held = self._tracing.consume(
            message, self._held, subscription=self.pattern, group=self.group, linked=linked
        )
        return message

    def _traced_batch(self, messages: list[Message]) -> list[Message]:
        assert self._tracing is not None
        self._held = self._tracing.process_batch(
            messages, self._held, subscription=self.pattern, destination=self.pattern
        )
        return messages

    async def next(self, timeout: float | None = None) -> Message:
        """The next message; ``Timeout`` after ``timeout`` s, ``ClosedError`` once closed."""
        if not self._items:
            await self._wait(timeout)
        if self._tracing is not None:
            return self._traced(self._take())
        return self._take()

    async def next_batch(self, max_messages: int = 1000, timeout: float | None = None) -> list[Message]:
        """Every message available now, up to ``max_messages`` (at least one: waits like ``next``)."""
        if not self._items:
            await self._wait(timeout)
        take = self._take
        taken = [take() for _ in range(min(max(max_messages, 1), len(self._items)))]
        return taken if self._tracing is None else self._traced_batch(taken)

    async def _wait(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._items:
            if self.closed:
                self._release_held()
                raise self._closed_error()
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                if deadline is None:
                    await waiter
                else:
                    await asyncio.wait_for(waiter, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise Timeout(f"next message on {', '.join(self.patterns)}", timeout or 0.0) from None

    async def batches(self, *, max: int = 1000) -> AsyncIterator[list[Message]]:
        """``async for batch in sub.batches(max=...)``: whatever messages wait, up to ``max`` of
        them in arrival order, as one list each time (as aiokafka's ``getmany``): one wake-up and
        one step of the application's loop per list rather than per message.  Ends when the
        subscription closes, after what it still held."""
        if max < 1:
            raise ValueError("max must be at least 1")
        while True:
            try:
                got = await self.next_batch(max)
            except ClosedError:
                return
            yield got

    def next_threadsafe(self, timeout: float | None = None) -> Message:
        """``next`` for another thread (the sync API): no hop into the event loop while
        messages are waiting, a condition wait when none are."""
        if not self._items:
            self._wait_threadsafe(timeout)
        if self._tracing is not None:
            return self._traced(self._take())
        return self._take()

    def _wait_threadsafe(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._sync:
            while not self._items:
                if self.closed:
                    self._release_held()
                    raise self._closed_error()
                left = SYNC_RECHECK if deadline is None else min(SYNC_RECHECK, deadline - time.monotonic())
                if left <= 0:
                    raise Timeout(f"next message on {', '.join(self.patterns)}", timeout or 0.0)
                self._sync_waiting = True
                try:
                    self._sync.wait(left)
                finally:
                    self._sync_waiting = False

    def next_batch_threadsafe(self, max_messages: int = 1000, timeout: float | None = None) -> list[Message]:
        """``next_batch`` for another thread (the sync API), waiting like ``next_threadsafe``."""
        if not self._items:
            self._wait_threadsafe(timeout)
        take = self._take
        taken = [take() for _ in range(min(max(max_messages, 1), len(self._items)))]
        return taken if self._tracing is None else self._traced_batch(taken)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        if not self._items:
            try:
                await self._wait(None)
            except ClosedError:
                raise StopAsyncIteration from None
        if self._tracing is not None:
            return self._traced(self._take())
        return self._take()

    async def close(self) -> None:
        """Unsubscribe (idempotent); the span of the message taken last ends (``release_span``)."""
        self._release_held()
        await self.client.unsubscribe(self)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
