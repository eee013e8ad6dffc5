"""asyncio worker: ``mc0.aio.Worker``, a client that also serves requests.

Contract: handlers are registered before ``connect()``; each REQUEST runs
its handler (coroutine, async generator, or a plain function / generator in
a thread pool of ``capacity``) and ends in exactly one FINAL or ERROR; a
CANCEL or the deadline cancels the handler where the runtime allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from ..deadlines import Deadlines
from ..errors import ClosedError, Timeout
from ..message import Reply, Request
from ..protocol import Status, Verb, batch
from ..session import CancelWork, Event
from .client import Client

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("mc0.client")
H = TypeVar("H", bound=Callable[..., Any])
HANDLER_THREAD_PREFIX = "mc0-handler"  # names the threads that run sync handlers


Handler = Callable[[Request], Any]


class Worker(Client):
    """A client that also serves requests: ``@worker.service("name")`` handlers.

    A handler gets a :class:`mc0.Request` and returns the FINAL body (bytes,
    str, a sequence of frames, None, or a :class:`mc0.Reply` to set headers),
    or yields PARTIAL chunks (a generator; its ``return`` value is the FINAL).
    Coroutine functions and async generators run on the event loop; plain
    functions and generators run in a pool of ``capacity`` threads.  An
    exception becomes ERROR 500 with its message.  A handler still running at
    the deadline, or when the client CANCELs, is cancelled where the runtime
    allows (async handlers at their next await; sync generators between
    chunks; a plain sync function runs on but its result is dropped).
    """

    def __init__(self, endpoint: str | None = None, *, capacity: int = 1, **options: Any) -> None:
        super().__init__(endpoint, **options)
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.handled = 0
        self.failed = 0
        self._handlers: dict[str, Handler] = {}
        self._kinds: dict[str, str] = {}  # service -> ASYNC_GEN / COROUTINE / GENERATOR / FUNCTION
        self._work: dict[str, asyncio.Task[None]] = {}
        self._work_deadlines: Deadlines[str] = Deadlines()  # each running handler's bid, by its deadline
        self._executor: ThreadPoolExecutor | None = None
        self._stop: asyncio.Event | None = None
        self._signals = 0  # SIGINT/SIGTERM seen by run(): the first drains, a second closes
        self._stopping: list[asyncio.Task[None]] = []

    def service(self, name: str) -> Callable[[H], H]:
        """Decorator: serve ``name`` with the decorated handler (register before ``connect``)."""

        def register(handler: H) -> H:
            self.add_service(name, handler)
            return handler

        return register

    def add_service(self, name: str, handler: Handler) -> None:
        if self._out is not None:
            raise RuntimeError("register services before connect()")
        self.session.serve([*self._handlers, name], self.capacity)  # validates the name
        self._handlers[name] = handler
        self._kinds[name] = _kind(handler)  # once: inspect is slow, and per request it showed

    async def connect(self) -> Worker:
        if not self._handlers:
            raise ValueError("a worker needs at least one service")
        if self._out is not None:
            return self
        self.session.services = ()  # READY goes out below, confirmed, not with the CONNECT's answer
        await super().connect()
        request_id = self.session.new_id()
        frames = self.session.serve(list(self._handlers), self.capacity, request_id)
        assert frames is not None
        await self._call(request_id, frames, None, "register services")
        return self

    async def run(self, *, drain_timeout: float | None = None, ready: Callable[[], object] | None = None) -> None:
        """Serve until ``stop()``, ``close()``, ``drain()`` or a signal.

        In the main thread, the first SIGINT or SIGTERM drains (bounded by
        ``drain_timeout``, default the client's ``timeout``) and a second one
        cancels what still runs and closes, as the sync ``run()`` does.  The
        signals are handled before it registers (connects), so none finds it
        serving without them; ``ready`` is then called (e.g. to announce the worker).
        """
        self._stop = self._stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        signals: tuple[signal.Signals, ...] = ()
        if threading.current_thread() is threading.main_thread():
            signals = (signal.SIGINT, signal.SIGTERM)
            for signum in signals:
                loop.add_signal_handler(signum, self._on_stop_signal, drain_timeout)
        try:
            await self.connect()
            if ready is not None:
                ready()
            await self._stop.wait()
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)
            for task in self._stopping:
                with contextlib.suppress(BaseException):
                    await task

    def _on_stop_signal(self, drain_timeout: float | None) -> None:
        self._signals += 1
        first = self._signals == 1 and not self.closed
        self._stopping.append(asyncio.get_running_loop().create_task(self._drain_then_stop(drain_timeout, first)))

    async def _drain_then_stop(self, drain_timeout: float | None, drain: bool) -> None:
        try:
            if drain:
                await self.drain(timeout=drain_timeout)
            else:
                await self.close()
        except ClosedError:
            pass  # a second signal closed it mid-drain: that was asked for
        except Exception as exc:  # a Timeout past the deadline: logged, the worker is closed anyway
            log.warning("worker drain: %s", exc)
        finally:
            self.stop()

    async def drain(self, *, timeout: float | None = None) -> None:
        """Stop taking work, let running handlers finish, then the client's :meth:`drain` and close.

        1. The broker is told to send no more work (READY with no services), and
           that is confirmed; a request already on its way here still runs.
        2. Every running handler finishes and its reply is sent — nothing runs
           twice, as it would if it were cancelled and the broker re-dispatched it.
        3. :meth:`Client.drain` (subscriptions, publishes, calls), then ``close()``.

        Bounded by ``timeout`` (default: the client's ``timeout``): past it the
        handlers still running are cancelled, the worker closes and ``Timeout``
        names how many were left (their callers get the broker's 504 or a
        re-dispatch, as after a crash).
        """
        self.ensure_open()
        wait = self.timeout if timeout is None else timeout
        started = time.monotonic()
        try:
            async with asyncio.timeout(wait):
                request_id = self.session.new_id()
                frames = self.session.withdraw(request_id)  # also: a reconnect re-registers nothing
                if self.session.connected:
                    await self._call(request_id, frames, None, "withdraw services")
                await self._until_idle(lambda: bool(self._work))
        except TimeoutError:
            left = f"{len(self._work)} handlers still running"
            await self.close()
            raise Timeout(f"drain ({left})", wait) from None
        await super().drain(timeout=max(0.0, wait - (time.monotonic() - started)))

    def stop(self) -> None:
        if self._stop is None:
            self._stop = asyncio.Event()
        self._stop.set()

    async def close(self) -> None:
        for task in list(self._work.values()):
            task.cancel()
        await super().close()
        if self._stop is not None:
            self._stop.set()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _on_event(self, event: Event) -> None:
        if type(event) is Request:
            serve = self._serve(event) if self.tracing is None else self._serve_traced(event)
            task = asyncio.get_running_loop().create_task(serve)
            self._work[event.id] = task
            self._work_deadlines.add(event.deadline, event.id)
            self._arm_timer(event.deadline)
        elif isinstance(event, CancelWork):
            running = self._work.pop(event.bid, None)
            self._work_deadlines.discard(event.bid)
            if running is not None:
                running.cancel()
        else:
            super()._on_event(event)

    def _next_local_deadline(self) -> float | None:
        deadlines = [d for d in (self._call_deadlines.next_due(), self._work_deadlines.next_due()) if d is not None]
        return min(deadlines) if deadlines else None

    def _expire_calls(self, now: float) -> None:
        """Requests we called that timed out, and handlers still running at their deadline (the
        broker has already answered their caller 504 and sent CANCEL: this covers a lost CANCEL)."""
        super()._expire_calls(now)
        for bid in self._work_deadlines.pop_due(now):
            running = self._work.pop(bid, None)
            if running is not None and not running.done():
                running.cancel()

    async def _serve_traced(self, request: Request) -> None:
        """``_serve`` inside the request's SERVER span, current around the handler (its spans nest under it)."""
        assert self.tracing is not None
        with self.tracing.serving(request) as span:
            await self._serve(request, span)

    async def _serve(self, request: Request, span: Span | None = None) -> None:
        """Run ``request``'s handler to its one FINAL or ERROR (``span``: its SERVER span, when traced)."""
        service = request.service
        handler = self._handlers.get(service)
        bid = request.id
        try:
            if handler is None:
                self._send(self.session.fail(bid, Status.HANDLER_FAILED, f"no handler for {service}"))
                return
            kind = self._kinds[service]
            if kind is COROUTINE:
                self._reply(Verb.FINAL, bid, await handler(request))
            else:
                await self._run_handler(kind, handler, request)
            self.handled += 1
        except asyncio.CancelledError:  # the broker already answered the client (504 or 499)
            if span is not None:
                span.set_attribute("error.type", "cancelled")
        except Exception as exc:  # a handler failure is an answer, not a crash
            self.failed += 1
            if span is not None and self.tracing is not None:
                self.tracing.failed(span, exc)
            log.debug("handler for %s failed", service, exc_info=True)
            if self.connected:
                self._send(self.session.fail(bid, Status.HANDLER_FAILED, f"{type(exc).__name__}: {exc}"))
        finally:
            self._work.pop(bid, None)
            self._work_deadlines.discard(bid)

    def _reply(self, verb: Verb, bid: str, result: object) -> None:
        if type(result) is bytes and self.session.batched:  # the common case, straight to a record
            self._outgoing().send_record(batch.reply_record(verb is Verb.FINAL, bid.encode(), result))
        elif isinstance(result, Reply):
            self._send(self.session.reply(verb, bid, result.parts, result.headers or None))
        else:
            self._send(self.session.reply(verb, bid, result))  # type: ignore[arg-type]

    async def _run_handler(self, kind: str, handler: Handler, request: Request) -> None:
        bid = request.id
        if kind is ASYNC_GEN:
            async for chunk in handler(request):
                self._reply(Verb.PARTIAL, bid, chunk)
            self._reply(Verb.FINAL, bid, None)
            return
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.capacity, thread_name_prefix=HANDLER_THREAD_PREFIX)
        # A pool thread runs in its own context: traced, it runs in a copy of this task's, where the
        # request's SERVER span is current (a sync handler's own spans nest under it too).
        traced = self.tracing is not None
        if kind is GENERATOR:
            generator = handler(request)
            while True:
                if traced:
                    step = await loop.run_in_executor(self._executor, contextvars.copy_context().run, _step, generator)
                else:
                    step = await loop.run_in_executor(self._executor, _step, generator)
                finished, value = step
                if finished:
                    self._reply(Verb.FINAL, bid, value)
                    return
                self._reply(Verb.PARTIAL, bid, value)
        if traced:
            result = await loop.run_in_executor(self._executor, contextvars.copy_context().run, handler, request)
        else:
            result = await loop.run_in_executor(self._executor, handler, request)
        if inspect.isawaitable(result):
            result = await result
        self._reply(Verb.FINAL, bid, result)


ASYNC_GEN, COROUTINE, GENERATOR, FUNCTION = "async generator", "coroutine", "generator", "function"


def _kind(handler: Handler) -> str:
    if inspect.isasyncgenfunction(handler):
        return ASYNC_GEN
    if inspect.iscoroutinefunction(handler):
        return COROUTINE
    if inspect.isgeneratorfunction(handler):
        return GENERATOR
    return FUNCTION


def _step(generator: Any) -> tuple[bool, object]:
    try:
        return False, next(generator)
    except StopIteration as stop:
        return True, stop.value
