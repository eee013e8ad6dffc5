"""asyncio views of what arrives: a :class:`Subscription`'s messages and a request's :class:`ReplyStream`.

Contract: both are fed by the client's reader (never blocking it) and read
by the application; a subscription holds at most ``max_pending`` messages
(beyond that new ones are dropped, counted and logged, never silently), a
reply stream ends with its FINAL, an ERROR (raised) or a ``Timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from .. import protocol as P
from ..errors import ClosedError, Timeout
from ..message import Message, Reply
from ..protocol import Command, Header, Verb
from ..session import answer_error

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger("mc0.client")

DEFAULT_MAX_PENDING = 10_000
_CLOSED = object()


class Subscription:
    """Messages matching any of its patterns, each once, in arrival order.

    Holds at most ``max_pending`` undelivered messages; beyond that new ones
    are dropped and counted in ``dropped`` (and logged), never silently.
    """

    def __init__(self, client: Client, patterns: tuple[str, ...], max_pending: int) -> None:
        self.client = client
        self.patterns = patterns
        self.max_pending = max_pending
        self.dropped = 0
        self.closed = False
        self._queue: asyncio.Queue[object] = asyncio.Queue()

    @property
    def pattern(self) -> str:
        return self.patterns[0] if self.patterns else ""

    def _offer(self, message: Message) -> None:
        if self._queue.qsize() >= self.max_pending:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "subscription %r: %d messages dropped (max_pending %d)",
                    self.pattern,
                    self.dropped,
                    self.max_pending,
                )
            return
        self._queue.put_nowait(message)

    def _end(self) -> None:
        if not self.closed:
            self.closed = True
            self._queue.put_nowait(_CLOSED)

    async def next(self, timeout: float | None = None) -> Message:
        """The next message; ``Timeout`` after ``timeout`` s, ``ClosedError`` once closed."""
        if self.closed and self._queue.empty():
            raise ClosedError(f"subscription {self.patterns!r} is closed")
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            raise Timeout(f"next message on {self.patterns!r}", timeout or 0.0) from None
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # later callers see the end too
            raise ClosedError(f"subscription {self.patterns!r} is closed")
        assert isinstance(item, Message)
        return item

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.next()
        except ClosedError:
            raise StopAsyncIteration from None

    async def close(self) -> None:
        """Unsubscribe (idempotent)."""
        await self.client.unsubscribe(self)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ReplyStream:
    """The replies to one request: PARTIALs, then the FINAL (async iterator).

    For a plain request the FINAL is the last item (``final`` holds it too).
    For a scatter the items are the per-worker replies (``worker`` set,
    ``error`` set if that worker failed) and the FINAL's ``COUNT`` and
    ``MISSING`` land in ``count`` and ``missing`` when iteration ends.
    An ERROR ends the stream by raising the matching ``RemoteError``; no
    terminal within the timeout (plus a grace) raises ``Timeout`` and CANCELs.
    ``cancel()`` asks the broker to cancel (the stream ends with 499);
    ``close()`` cancels and stops listening at once.
    """

    def __init__(self, client: Client, request_id: str, service: str, scatter: bool, wait: float) -> None:
        self.client = client
        self.request_id = request_id
        self.service = service
        self.scatter = scatter
        self.final: Reply | None = None
        self.count: int | None = None
        self.missing: int | None = None
        self.done = False
        self._queue: asyncio.Queue[Command | BaseException] = asyncio.Queue()
        self._wait = wait
        self._deadline = time.monotonic() + wait

    def _feed(self, item: Command | BaseException) -> None:
        self._queue.put_nowait(item)

    def _finish(self) -> None:
        self.done = True
        self.client._streams.pop(self.request_id, None)

    def __aiter__(self) -> ReplyStream:
        return self

    async def __anext__(self) -> Reply:
        if self.done:
            raise StopAsyncIteration
        try:
            item = await asyncio.wait_for(self._queue.get(), max(0.0, self._deadline - time.monotonic()))
        except TimeoutError:
            await self.close()
            raise Timeout(f"request to {self.service!r}", self._wait) from None
        if isinstance(item, BaseException):
            self._finish()
            raise item
        headers = item.headers
        user = item.user_headers()
        parts = tuple(bytes(p) for p in item.payload)
        if item.verb is Verb.PARTIAL:
            error = None
            if Header.CODE in headers:
                error = answer_error(item)
            return Reply(parts, user, final=False, worker=headers.get(Header.WORKER), error=error)
        self._finish()
        if item.verb is Verb.ERROR:
            raise answer_error(item)
        self.final = Reply(parts, user, final=True)
        if self.scatter:
            self.count = P.decimal(headers.get(Header.COUNT, "0")) or 0
            self.missing = P.decimal(headers.get(Header.MISSING, "0")) or 0
            raise StopAsyncIteration
        return self.final

    async def cancel(self) -> None:
        """Send CANCEL; the stream then ends with the broker's ``Cancelled`` (499)."""
        if not self.done:
            await self.client._send(self.client.session.cancel(self.request_id))

    async def close(self) -> None:
        """CANCEL the request if it has not ended, and stop listening (idempotent)."""
        if self.done:
            return
        self._finish()
        if self.client.connected:
            await self.client._send(self.client.session.cancel(self.request_id))

    async def __aenter__(self) -> ReplyStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
