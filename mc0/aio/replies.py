"""asyncio reply streams: the replies to one request, as they arrive.

Contract: a :class:`ReplyStream` is fed by the client's reader (never
blocking it) and iterated by the application: PARTIALs, then the FINAL; it
ends with the FINAL, an ERROR (raised) or a ``Timeout``.  What it needs of
the client that feeds it is :class:`ReplyOwner` and no more: this module
imports nothing of the client (the arrow points one way).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Protocol

from .. import protocol as P
from ..errors import Timeout
from ..message import Reply
from ..protocol import Command, Header, Status, Verb
from ..session import answer_error

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ..tracing import Tracing


class ReplyOwner(Protocol):
    """What a :class:`ReplyStream` asks of the client that feeds it (``mc0.aio.Client``
    implements it), and nothing else."""

    @property
    def connected(self) -> bool: ...

    def stream_ended(self, request_id: str) -> None:
        """The stream of this request stopped listening: feed it no more."""

    def cancel_request(self, request_id: str) -> None:
        """Send CANCEL for this request (``ClosedError`` once the client is closed)."""


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

    def __init__(
        self,
        client: ReplyOwner,
        request_id: str,
        service: str,
        scatter: bool,
        wait: float,
        *,
        traced: tuple[Tracing, Span] | None = None,
    ) -> None:
        """``traced``: the request's CLIENT span (and the tracing that made it), ended with the stream."""
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
        self._traced = traced

    def deliver(self, item: Command | BaseException) -> None:
        """(Called by the client's reader, not by applications.) The next answer to this request (a
        PARTIAL, FINAL or ERROR command) or the error that ends it, read by the next ``__anext__``."""
        self._queue.put_nowait(item)

    @property
    def queued(self) -> int:
        """Replies received and not yet taken (the next ``__anext__`` of each returns at once)."""
        return self._queue.qsize()

    def finish(self, error: BaseException | None = None) -> None:
        """The stream is done (its final answer read, or ended by ``error``): the client forgets it and
        its span is ended.  Called by the stream itself, and by the client when the request could not
        even be sent."""
        self.done = True
        self.client.stream_ended(self.request_id)
        if self._traced is not None:
            tracing, span = self._traced
            self._traced = None
            tracing.answered(span, error)

    def __aiter__(self) -> ReplyStream:
        return self

    async def __anext__(self) -> Reply:
        if self.done:
            raise StopAsyncIteration
        try:
            item = await asyncio.wait_for(self._queue.get(), max(0.0, self._deadline - time.monotonic()))
        except TimeoutError:
            timeout = Timeout(f"request to {self.service!r}", self._wait)
            if not self.done:
                self.finish(timeout)
                if self.client.connected:
                    self.client.cancel_request(self.request_id)
            raise timeout from None
        if isinstance(item, BaseException):
            self.finish(item)
            raise item
        headers = item.headers
        user = item.user_headers()
        parts = tuple(bytes(p) for p in item.payload)
        if item.verb is Verb.PARTIAL:
            error = None
            if Header.CODE in headers:
                error = answer_error(item)
            return Reply(parts, user, final=False, worker=headers.get(Header.WORKER), error=error)
        if item.verb is Verb.ERROR:
            error = answer_error(item)
            self.finish(error)
            raise error
        self.finish()
        self.final = Reply(parts, user, final=True)
        if self.scatter:
            self.count = P.decimal(headers.get(Header.COUNT, "0")) or 0
            self.missing = P.decimal(headers.get(Header.MISSING, "0")) or 0
            raise StopAsyncIteration
        return self.final

    async def cancel(self) -> None:
        """Send CANCEL; the stream then ends with the broker's ``Cancelled`` (499)."""
        if not self.done:
            self.client.cancel_request(self.request_id)

    async def close(self) -> None:
        """CANCEL the request if it has not ended, and stop listening (idempotent)."""
        if self.done:
            return
        self.finish(P.remote_error(Status.CANCELLED, "closed by the caller") if self._traced else None)
        if self.client.connected:
            self.client.cancel_request(self.request_id)

    async def __aenter__(self) -> ReplyStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
