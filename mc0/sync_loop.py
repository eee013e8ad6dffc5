"""The sync API's engine: one shared background event loop, and sync methods made from async ones.

Contract: ``run`` runs a coroutine of the asyncio implementation on one
shared event loop in a daemon thread (started on first use by
``background_loop``) and waits for it, so heartbeats and healing continue
while the caller's thread is busy; calling it from that loop's own thread is
refused.  A sync class of :mod:`mc0.client` is a :class:`View` of its asyncio
twin (``_inner``).  ``blocking(method)`` makes the sync method of an async
one and ``viewed(method, view)`` one whose result is wrapped in its sync view:
the signature is the async method's, the one place it is written (mypy sees
it through ``ParamSpec``, ``inspect`` and ``help`` through ``__wrapped__``),
and the call goes to the twin's method of that name, so a subclass's
override runs.  So an option added to an async method is in the sync one.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

A = TypeVar("A")
P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    """The loop every sync client runs on (one daemon thread, ``mc0-io``, started on first use)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="mc0-io", daemon=True).start()
            _loop = loop
        return _loop


def run(coro: Coroutine[Any, Any, R]) -> R:
    """Run ``coro`` on the background loop and wait for its result (RuntimeError from that loop's thread)."""
    loop = background_loop()
    if in_loop_thread(loop):
        coro.close()
        raise RuntimeError("the sync mc0 API cannot be called from its own event loop; use mc0.aio")
    future: Future[R] = asyncio.run_coroutine_threadsafe(coro, loop)
    return future.result()


def in_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the caller runs on ``loop`` (where waiting for it would deadlock)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class View(Generic[A]):
    """A sync class over its asyncio twin ``_inner`` (which runs on the background loop)."""

    def __init__(self, inner: A) -> None:
        self._inner = inner


def blocking(method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]) -> Callable[Concatenate[View[Any], P], R]:
    """The sync method of the async ``method``: its signature, run on the background loop."""
    name = method.__name__

    @functools.wraps(method, assigned=("__name__", "__qualname__", "__doc__"))
    def call(self: View[Any], /, *args: P.args, **kwargs: P.kwargs) -> R:
        coro: Coroutine[Any, Any, R] = getattr(self._inner, name)(*args, **kwargs)
        return run(coro)

    return call


def viewed(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]], view: Callable[[R], S]
) -> Callable[Concatenate[View[Any], P], S]:
    """``blocking(method)`` whose result is handed out as ``view(result)`` (its sync view)."""
    name = method.__name__

    @functools.wraps(method, assigned=("__name__", "__qualname__", "__doc__"))
    def call(self: View[Any], /, *args: P.args, **kwargs: P.kwargs) -> S:
        coro: Coroutine[Any, Any, R] = getattr(self._inner, name)(*args, **kwargs)
        return view(run(coro))

    returns = getattr(view, "__name__", None)
    if returns is not None:  # what help() and inspect show: the view, not the async result
        call.__signature__ = inspect.signature(method).replace(return_annotation=returns)  # type: ignore[attr-defined]
    return call
