"""Sync client: ``mc0.Client`` and ``Subscription``, mirroring :mod:`mc0.aio`.

Contract: the same names and options as the asyncio API.  Each call runs the
asyncio implementation on one shared background event loop (a daemon thread
started on first use), so heartbeats and healing continue while the caller's
thread is busy or blocked.  Blocking calls are bounded by the client's
``timeout`` (``Timeout``); ``Subscription.next(timeout=None)`` waits until a
message arrives or the subscription is closed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

from . import aio
from .config import ClientConfig
from .errors import ClosedError
from .message import Message
from .protocol import DEFAULT_LIMITS, Limits

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
    def dropped(self) -> int:
        return self._inner.dropped

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def next(self, timeout: float | None = None) -> Message:
        """The next message; ``Timeout`` after ``timeout`` s, ``ClosedError`` once closed."""
        return _run(self._inner.next(timeout))

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


class Client:
    """Blocking client; see :class:`mc0.aio.Client` for the semantics."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        liveness: int = 3,
        limits: Limits = DEFAULT_LIMITS,
        config: ClientConfig | None = None,
    ) -> None:
        self._aio = aio.Client(endpoint, ttl=ttl, timeout=timeout, liveness=liveness, limits=limits, config=config)

    @property
    def endpoint(self) -> str:
        return self._aio.endpoint

    @property
    def connected(self) -> bool:
        return self._aio.connected

    @property
    def reconnects(self) -> int:
        return self._aio.reconnects

    @property
    def faults(self) -> list[Exception]:
        return list(self._aio.faults)

    def connect(self) -> Client:
        _run(self._aio.connect())
        return self

    def close(self) -> None:
        if self._aio._closed:
            return
        _run(self._aio.close())

    def __enter__(self) -> Client:
        return self.connect()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def publish(
        self,
        topic: str,
        body: bytes | Sequence[bytes],
        *,
        headers: Mapping[str, str] | None = None,
        confirm: bool = False,
        timeout: float | None = None,
    ) -> None:
        if confirm:
            _run(self._aio.publish(topic, body, headers=headers, confirm=True, timeout=timeout))
            return
        # Validate here (misuse raises in the caller), send on the loop without waiting for it.
        frames = self._aio.session.publish(topic, body, headers)
        self._aio._check_open()
        _background_loop().call_soon_threadsafe(self._aio._send_nowait, frames)

    def subscribe(
        self, *patterns: str, max_pending: int = aio.DEFAULT_MAX_PENDING, timeout: float | None = None
    ) -> Subscription:
        return Subscription(_run(self._aio.subscribe(*patterns, max_pending=max_pending, timeout=timeout)))

    def unsubscribe(self, subscription: Subscription | str) -> None:
        target = subscription if isinstance(subscription, str) else subscription._inner
        _run(self._aio.unsubscribe(target))

    def ping(self, *, timeout: float | None = None) -> float:
        return _run(self._aio.ping(timeout=timeout))
