"""The sync API's engine room: the shared background event loop, and the sync views of what arrives.

Contract: ``_run`` runs a coroutine of the asyncio implementation on one
shared event loop in a daemon thread (started on first use) and waits for
it, so heartbeats and healing continue while the caller's thread is busy;
calling it from that loop's own thread is refused.  ``Subscription``,
``ReplyStream`` and ``PageStream`` are the sync views of :mod:`mc0.aio`'s,
name for name; :mod:`mc0.client` re-exports them.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from . import aio
from .errors import ClosedError
from .message import Message, Reply
from .protocol import ColumnsPage

R = TypeVar("R")

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="mc0-io", daemon=True).start()
            _loop = loop
        return _loop


def _run(coro: Coroutine[Any, Any, R]) -> R:
    loop = _background_loop()
    if _in_loop_thread(loop):
        coro.close()
        raise RuntimeError("the sync mc0 API cannot be called from its own event loop; use mc0.aio")
    future: Future[R] = asyncio.run_coroutine_threadsafe(coro, loop)
    return future.result()


def _in_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class Subscription:
    """Sync view of :class:`mc0.aio.Subscription`: an iterator with ``next(timeout)``."""

    def __init__(self, inner: aio.Subscription) -> None:
        self._inner = inner

    @property
    def pattern(self) -> str:
        return self._inner.pattern

    @property
    def patterns(self) -> tuple[str, ...]:
        return self._inner.patterns

    @property
    def group(self) -> str | None:
        return self._inner.group

    @property
    def dropped(self) -> int:
        return self._inner.dropped

    @property
    def closed(self) -> bool:
        return self._inner.closed

    @property
    def pending(self) -> int:
        return self._inner.pending

    def next(self, timeout: float | None = None) -> Message:
        """The next message; ``Timeout`` after ``timeout`` s, ``ClosedError`` once closed.

        Taken straight from the subscription's buffer in this thread (no hop
        into the client's event loop while messages are waiting)."""
        return self._inner.next_threadsafe(timeout)

    def next_batch(self, max_messages: int = 1000, timeout: float | None = None) -> list[Message]:
        """Every message available now, up to ``max_messages`` (at least one: waits like ``next``)."""
        return self._inner.next_batch_threadsafe(max_messages, timeout)

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        try:
            return self.next()
        except ClosedError:
            raise StopIteration from None

    def close(self) -> None:
        _run(self._inner.close())

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReplyStream:
    """Sync view of :class:`mc0.aio.ReplyStream`: iterate PARTIALs then the FINAL."""

    def __init__(self, inner: aio.ReplyStream) -> None:
        self._inner = inner

    @property
    def final(self) -> Reply | None:
        return self._inner.final

    @property
    def count(self) -> int | None:
        return self._inner.count

    @property
    def missing(self) -> int | None:
        return self._inner.missing

    def __iter__(self) -> Iterator[Reply]:
        return self

    def __next__(self) -> Reply:
        try:
            return _run(self._inner.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def cancel(self) -> None:
        _run(self._inner.cancel())

    def close(self) -> None:
        _run(self._inner.close())

    def __enter__(self) -> ReplyStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PageStream:
    """Sync view of :class:`mc0.aio.PageStream`: iterate a fetch's columns pages as they arrive.

    Pages cross from the client's loop thread in bunches (``next_pages``:
    everything that arrived while the caller was busy), not one by one.
    """

    def __init__(self, inner: aio.PageStream) -> None:
        self._inner = inner
        self._ready: collections.deque[ColumnsPage] = collections.deque()

    @property
    def next_seq(self) -> int | None:
        return self._inner.next_seq

    @property
    def first_seq(self) -> int | None:
        return self._inner.first_seq

    @property
    def end_seq(self) -> int | None:
        return self._inner.end_seq

    @property
    def records(self) -> int:
        return self._inner.records

    def __iter__(self) -> Iterator[ColumnsPage]:
        return self

    def __next__(self) -> ColumnsPage:
        if not self._ready:
            self._ready.extend(_run(self._inner.next_pages()))
            if not self._ready:
                raise StopIteration
        return self._ready.popleft()

    def close(self) -> None:
        self._ready.clear()
        _run(self._inner.close())

    def __enter__(self) -> PageStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
