"""asyncio worker: ``mc0.aio.Worker``, a client that also serves requests.

Contract: handlers are registered before ``connect()``; each REQUEST runs
its handler (coroutine, async generator, or a plain function / generator in
a thread pool of ``capacity``) and ends in exactly one FINAL or ERROR; a
CANCEL or the deadline cancels the handler where the runtime allows.  A
batch service's handler (``batch_service``) is called with every request
that waits, up to its ``max``, one call at a time, and its replies leave as
one batch; each request still ends in exactly one FINAL or ERROR (its state:
:mod:`mc0.aio.batchwork`).
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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from ..deadlines import Deadlines
from ..errors import ClosedError, Error, Timeout
from ..message import Reply, Request
from ..protocol import Status, Verb, batch
from ..session import CancelWork, Event, Frames
from .batchwork import RequestBatches
from .client import Client

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("mc0.client")
H = TypeVar("H", bound=Callable[..., Any])
HANDLER_THREAD_PREFIX = "mc0-handler"  # names the threads that run sync handlers


Handler = Callable[[Request], Any]
# A batch service's handler: the requests of one call in, one result per request out, in their order.
BatchHandler = Callable[[list[Request]], Any]
DEFAULT_BATCH_MAX = 100  # requests per call of a batch handler (the broker sends at most ``capacity`` at once)


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

    A batch service (``@worker.batch_service("name", max=100)``) takes its
    requests in batches, as ``Subscription.batches`` hands a subscriber its
    messages: see :meth:`add_batch_service`.
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
        self._batches: dict[str, RequestBatches] = {}  # batch service -> its requests
        self._batched: dict[str, RequestBatches] = {}  # a batch service's request (bid) -> its service's
        self._batch_runs: dict[str, asyncio.Task[None]] = {}  # batch service -> the task taking its calls
        self._batch_calls: dict[str, asyncio.Future[Any]] = {}  # batch service -> its handler's running call

    def service(self, name: str) -> Callable[[H], H]:
        """Decorator: serve ``name`` with the decorated handler (register before ``connect``)."""

        def register(handler: H) -> H:
            self.add_service(name, handler)
            return handler

        return register

    def add_service(self, name: str, handler: Handler) -> None:
        self._register(name, handler, _kind(handler))  # the kind once: inspect is slow, and per request it showed

    def _register(self, name: str, handler: Callable[..., Any], kind: str) -> None:
        if self._out is not None:
            raise RuntimeError("register services before connect()")
        self.session.serve([*self._handlers, name], self.capacity)  # validates the name
        self._handlers[name] = handler
        self._kinds[name] = kind

    def batch_service(self, name: str, *, max: int = DEFAULT_BATCH_MAX) -> Callable[[H], H]:
        """Decorator: serve ``name`` with the decorated batch handler (see :meth:`add_batch_service`)."""

        def register(handler: H) -> H:
            self.add_batch_service(name, handler, max=max)
            return handler

        return register

    def add_batch_service(self, name: str, handler: BatchHandler, *, max: int = DEFAULT_BATCH_MAX) -> None:
        """Serve ``name`` with a handler that takes its requests in batches (register before ``connect``).

        The handler is called with a list of every request that waits, up to ``max`` of them, in
        arrival order (the broker sends a worker at most ``capacity`` requests at once: a batch
        holds at most that many), one call at a time; requests that arrive during a call make the
        next one.  It returns one result per request, in the same order, each what a per-request
        handler returns (bytes, str, a sequence of frames, None, a :class:`mc0.Reply`) or an
        exception, which answers that request alone with ERROR 500; the replies leave in one batch.
        A handler that raises, or returns a wrong count, answers each request of its call ERROR 500.
        A coroutine function runs on the event loop, a plain function in the worker's thread pool;
        generators are refused (a batch's replies are FINALs).  A request CANCELed or past its
        deadline before its call is never handed to the handler; one whose call is running gets no
        reply from here (the broker answered it already), and a call left with no request to answer
        is cancelled (an async handler at its next await; a sync one runs on, its result dropped).
        """
        kind = _kind(handler)
        if kind is ASYNC_GEN or kind is GENERATOR:
            raise ValueError("a batch handler returns one result per request: it cannot be a generator")
        batches = RequestBatches(name, max)  # validates max
        self._register(name, handler, kind)
        self._batches[name] = batches

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
                await self._until_idle(lambda: bool(self._work) or any(b.busy for b in self._batches.values()))
        except TimeoutError:
            left = f"{len(self._work) + len(self._batched)} handlers still running"
            await self.close()
            raise Timeout(f"drain ({left})", wait) from None
        await super().drain(timeout=max(0.0, wait - (time.monotonic() - started)))

    def stop(self) -> None:
        if self._stop is None:
            self._stop = asyncio.Event()
        self._stop.set()

    async def close(self) -> None:
        for task in [*self._work.values(), *self._batch_runs.values()]:
            task.cancel()
        for batches in self._batches.values():
            for bid in batches.clear():
                self._batched.pop(bid, None)
        await super().close()
        if self._stop is not None:
            self._stop.set()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _on_event(self, event: Event) -> None:
        if type(event) is Request:
            batches = self._batches.get(event.service)
            if batches is not None:
                self._queue_batched(batches, event)
                return
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
                self._drop_batched(event.bid)
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
            elif running is None:
                self._drop_batched(bid)

    # ------------------------------------------------------------ batch services
    def _queue_batched(self, batches: RequestBatches, request: Request) -> None:
        """A request for a batch service waits for its handler's next call; the task that makes
        the calls starts on the next loop turn, so every request of this read joins the first call."""
        batches.add(request)
        self._batched[request.id] = batches
        self._work_deadlines.add(request.deadline, request.id)
        self._arm_timer(request.deadline)
        if batches.service not in self._batch_runs:
            runner = asyncio.get_running_loop().create_task(self._serve_batches(batches))
            self._batch_runs[batches.service] = runner

    def _drop_batched(self, bid: str) -> None:
        """The broker answered ``bid`` (CANCEL, deadline): it is not handed on, nor answered here."""
        batches = self._batched.pop(bid, None)
        if batches is not None and batches.drop(bid):
            call = self._batch_calls.get(batches.service)
            if call is not None:
                call.cancel()  # nothing of it is left to answer

    async def _serve_batches(self, batches: RequestBatches) -> None:
        """One call of the handler after another while requests wait (ends when none does)."""
        try:
            while requests := batches.take():
                # Traced: each request's SERVER span, for the call that serves it (none current: one
                # call serves them all); ended with what its request was answered, or "cancelled".
                spans = self.tracing.batch_spans(requests) if self.tracing is not None else None
                answered: dict[str, Request] = {}
                failures: dict[str, BaseException] = {}
                try:
                    results = await self._call_batch(batches.service, requests)
                    owed = batches.finish()
                    for bid in owed:
                        self._batched.pop(bid, None)
                        self._work_deadlines.discard(bid)
                    if results is not None and owed:
                        answered, failures = owed, self._answer_batch(batches.service, requests, results, owed)
                finally:
                    if spans is not None and self.tracing is not None:
                        self.tracing.batch_ended(spans, requests, answered, failures)
        finally:
            self._batch_runs.pop(batches.service, None)

    async def _call_batch(self, service: str, requests: list[Request]) -> object:
        """The handler's result for ``requests`` (an exception it raised, as a value), or None when
        the call was cancelled because none of them was left to answer."""
        handler: BatchHandler = self._handlers[service]  # type: ignore[assignment]
        loop = asyncio.get_running_loop()
        if self._kinds[service] is COROUTINE:
            call: asyncio.Future[Any] = loop.create_task(handler(requests))
        else:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.capacity, thread_name_prefix=HANDLER_THREAD_PREFIX)
            call = asyncio.ensure_future(loop.run_in_executor(self._executor, handler, requests))
        self._batch_calls[service] = call
        try:
            result = await call
            if inspect.isawaitable(result):
                result = await result
            return result
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if call.cancelled() and (current is None or not current.cancelling()):
                return None  # dropped: every request of it was answered by the broker
            raise  # the worker is closing
        except Exception as exc:  # answered below, request by request
            log.debug("batch handler for %s failed", service, exc_info=True)
            return exc
        finally:
            self._batch_calls.pop(service, None)

    def _answer_batch(
        self, service: str, requests: list[Request], results: object, owed: dict[str, Request]
    ) -> dict[str, BaseException]:
        """Each owed request's FINAL or ERROR, all in one batch (one BATCH message on a batched session);
        what each one answered with an ERROR failed with, by request id (what its span says)."""
        failures: dict[str, BaseException] = {}
        if isinstance(results, Exception):
            outcomes: Sequence[object] = [results] * len(requests)
        elif not isinstance(results, Sequence) or isinstance(results, str | bytes) or len(results) != len(requests):
            count = len(results) if isinstance(results, Sequence) else type(results).__name__
            wrong = ValueError(f"the batch handler for {service} returned {count} results for {len(requests)} requests")
            outcomes = [wrong] * len(requests)
        else:
            outcomes = results
        session = self.session
        records: list[bytes] = []  # a batched session's replies, sent as one BATCH
        replies: list[Frames] = []  # else each its own message

        def put(frames: Frames) -> None:
            if session.batched:
                records.append(batch.record_of(frames))
            else:
                replies.append(frames)

        for request, outcome in zip(requests, outcomes, strict=True):
            bid = request.id
            if bid not in owed:
                continue  # the broker answered it (CANCEL, deadline) while the call ran
            if not isinstance(outcome, BaseException):
                try:
                    if type(outcome) is bytes and session.batched:  # the common case, straight to a record
                        records.append(batch.reply_record(True, bid.encode(), outcome))
                    elif isinstance(outcome, Reply):
                        put(session.reply(Verb.FINAL, bid, outcome.parts, outcome.headers or None))
                    else:
                        put(session.reply(Verb.FINAL, bid, outcome))  # type: ignore[arg-type]
                    self.handled += 1
                    continue
                except (Error, TypeError, ValueError) as exc:  # not a reply (a bad header, an int ...)
                    outcome = exc
            self.failed += 1
            failures[bid] = outcome
            put(session.fail(bid, Status.HANDLER_FAILED, f"{type(outcome).__name__}: {outcome}"))
        try:
            link = self._outgoing()
        except ClosedError as closed:  # closed while the call ran: the broker re-dispatches or answers 504
            return {bid: failures.get(bid, closed) for bid in owed}
        if records:
            link.send_record(b"".join(records))
        for reply in replies:
            link.send(reply)
        return failures

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


def _kind(handler: Callable[..., Any]) -> str:
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
