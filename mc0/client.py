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
import logging
import os
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import Future
from types import FrameType, TracebackType
from typing import Any, TypeVar

from . import aio
from .errors import ClosedError
from .keys import KeyPair
from .message import Ack, FetchResult, Message, Reply
from .protocol import DEFAULT_LIMITS, Limits
from .settings import ClientConfig

log = logging.getLogger("mc0.client")

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


class ConsumedMessage:
    """One message from a durable consumer; see :class:`mc0.aio.ConsumedMessage`."""

    __slots__ = ("_inner",)

    def __init__(self, inner: aio.ConsumedMessage) -> None:
        self._inner = inner

    @property
    def message(self) -> Message:
        return self._inner.message

    @property
    def seq(self) -> int:
        return self._inner.seq

    @property
    def deliveries(self) -> int:
        return self._inner.deliveries

    @property
    def topic(self) -> str:
        return self._inner.topic

    @property
    def body(self) -> bytes:
        return self._inner.body

    def ack(self) -> None:
        _run(self._inner.ack())

    def nak(self, delay: float = 0.0) -> None:
        _run(self._inner.nak(delay))

    def term(self) -> None:
        _run(self._inner.term())

    def ack_nowait(self) -> None:
        """Ack without waiting; see :meth:`mc0.aio.Consumer.ack_nowait`."""
        _background_loop().call_soon_threadsafe(self._inner.ack_nowait)

    def __repr__(self) -> str:
        return f"<ConsumedMessage seq={self.seq} deliveries={self.deliveries} topic={self.topic!r}>"


class Consumer:
    """A durable consumer (blocking); see :class:`mc0.aio.Consumer`."""

    def __init__(self, inner: aio.Consumer) -> None:
        self._inner = inner
        self.journal = inner.journal
        self.name = inner.name

    def fetch(self, max: int = 100, *, wait: float = 1.0) -> list[ConsumedMessage]:
        return [ConsumedMessage(m) for m in _run(self._inner.fetch(max, wait=wait))]

    def _seqs(self, messages: Sequence[ConsumedMessage | int]) -> list[int]:
        return [m if isinstance(m, int) else m.seq for m in messages]

    def ack(self, *messages: ConsumedMessage | int) -> int:
        return _run(self._inner.ack(*self._seqs(messages)))

    def nak(self, *messages: ConsumedMessage | int, delay: float = 0.0) -> int:
        return _run(self._inner.nak(*self._seqs(messages), delay=delay))

    def term(self, *messages: ConsumedMessage | int) -> int:
        return _run(self._inner.term(*self._seqs(messages)))

    def ack_nowait(self, *messages: ConsumedMessage | int) -> None:
        """Ack without waiting; see :meth:`mc0.aio.Consumer.ack_nowait`."""
        _background_loop().call_soon_threadsafe(self._inner.ack_nowait, *self._seqs(messages))

    def flush_acks(self) -> None:
        _run(self._inner.flush_acks())

    @property
    def ack_errors(self) -> int:
        return self._inner.ack_errors

    def info(self) -> dict[str, Any]:
        return _run(self._inner.info())

    def delete(self) -> None:
        _run(self._inner.delete())


class Client:
    """Blocking client; see :class:`mc0.aio.Client` for the semantics."""

    _mailbox: Subscription | None = None

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        liveness: int = 3,
        limits: Limits = DEFAULT_LIMITS,
        config: ClientConfig | None = None,
        key: str | os.PathLike[str] | KeyPair | None = None,
        broker_key: str | os.PathLike[str] | bytes | KeyPair | None = None,
        batch: bool = True,
        max_outgoing: int = aio.DEFAULT_MAX_OUTGOING,
        on_fault: Callable[[Exception], None] | None = None,
        echo: bool = True,
    ) -> None:
        """See :class:`mc0.aio.Client`; ``on_fault`` runs on the client's I/O thread."""
        self._aio = self._make(
            endpoint,
            ttl=ttl,
            timeout=timeout,
            liveness=liveness,
            limits=limits,
            config=config,
            key=key,
            broker_key=broker_key,
            batch=batch,
            max_outgoing=max_outgoing,
            on_fault=on_fault,
            echo=echo,
        )

    def _make(self, endpoint: str | None, **options: Any) -> aio.Client:
        return aio.Client(endpoint, **options)

    @property
    def endpoint(self) -> str:
        return self._aio.endpoint

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._aio.endpoints

    @property
    def closed(self) -> bool:
        """``close()`` (or ``drain()``) ran."""
        return self._aio.closed

    @property
    def connected(self) -> bool:
        return self._aio.connected

    @property
    def identity(self) -> str | None:
        return self._aio.identity

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
        if self._aio.closed:
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
        msgid: str | None = None,
        timeout: float | None = None,
    ) -> Ack | None:
        if confirm:
            return _run(self._aio.publish(topic, body, headers=headers, confirm=True, msgid=msgid, timeout=timeout))
        # Validated here (misuse raises in the caller), handed to the loop without a hop per message;
        # blocks only while the outgoing buffer is full (back-pressure, bounded by ``timeout``).
        self._aio.publish_nowait(topic, body, headers=headers, msgid=msgid, timeout=timeout)
        return None

    def subscribe(
        self,
        *patterns: str,
        max_pending: int = aio.DEFAULT_MAX_PENDING,
        max_pending_bytes: int = aio.DEFAULT_MAX_PENDING_BYTES,
        from_seq: int | None = None,
        journal: str | None = None,
        timeout: float | None = None,
        group: str | None = None,
    ) -> Subscription:
        inner = self._aio.subscribe(
            *patterns,
            max_pending=max_pending,
            max_pending_bytes=max_pending_bytes,
            from_seq=from_seq,
            journal=journal,
            timeout=timeout,
            group=group,
        )
        return Subscription(_run(inner))

    def journal_info(self, *, timeout: float | None = None) -> dict[str, dict[str, Any]]:
        return _run(self._aio.journal_info(timeout=timeout))

    def fetch(
        self,
        journal: str,
        *,
        from_seq: int = 0,
        to_seq: int | None = None,
        topics: Sequence[str] = (),
        max_records: int | None = None,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> FetchResult:
        return _run(
            self._aio.fetch(
                journal,
                from_seq=from_seq,
                to_seq=to_seq,
                topics=topics,
                max_records=max_records,
                max_bytes=max_bytes,
                timeout=timeout,
            )
        )

    def unsubscribe(self, subscription: Subscription | str) -> None:
        target = subscription if isinstance(subscription, str) else subscription._inner
        _run(self._aio.unsubscribe(target))

    def ping(self, *, timeout: float | None = None) -> float:
        return _run(self._aio.ping(timeout=timeout))

    @property
    def mailbox(self) -> Subscription:
        """Direct messages sent to this client's identity; see :attr:`mc0.aio.Client.mailbox`."""
        if self._mailbox is None:
            self._mailbox = Subscription(self._aio.mailbox)
        return self._mailbox

    def send_to(
        self,
        identity: str,
        topic: str,
        body: bytes | Sequence[bytes],
        *,
        headers: Mapping[str, str] | None = None,
        confirm: bool = False,
        timeout: float | None = None,
    ) -> str | None:
        """A direct message to one identity; see :meth:`mc0.aio.Client.send_to`."""
        return _run(self._aio.send_to(identity, topic, body, headers=headers, confirm=confirm, timeout=timeout))

    def consume(
        self,
        journal: str,
        name: str,
        *,
        topics: Sequence[str] = (">",),
        ack_wait: float = 30.0,
        max_deliver: int = 5,
        max_ack_pending: int = 1_000,
        deliver: str = "all",
        timeout: float | None = None,
    ) -> Consumer:
        """A durable consumer; see :meth:`mc0.aio.Client.consume`."""
        inner = self._aio.consume(
            journal,
            name,
            topics=topics,
            ack_wait=ack_wait,
            max_deliver=max_deliver,
            max_ack_pending=max_ack_pending,
            deliver=deliver,
            timeout=timeout,
        )
        return Consumer(_run(inner))

    def drain(self, *, timeout: float | None = None) -> None:
        """Stop receiving, let what is outstanding finish, then close; see :meth:`mc0.aio.Client.drain`."""
        _run(self._aio.drain(timeout=timeout))

    def flush(self, *, timeout: float | None = None) -> None:
        """Return once everything queued so far has reached the broker (a PING round trip)."""
        _run(self._aio.flush(timeout=timeout))

    def request(
        self,
        service: str,
        body: bytes | str | Sequence[bytes] = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        if headers or not isinstance(body, bytes | str) or _in_loop_thread(_background_loop()):
            return _run(self._aio.request(service, body, timeout=timeout, headers=headers))
        return self._aio.request_threadsafe(service, body, timeout=timeout).result()

    def stream(
        self,
        service: str,
        body: bytes | str | Sequence[bytes] = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> ReplyStream:
        return ReplyStream(_run(self._aio.stream(service, body, timeout=timeout, headers=headers)))

    def scatter(
        self,
        service: str,
        body: bytes | str | Sequence[bytes] = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> ReplyStream:
        return ReplyStream(_run(self._aio.scatter(service, body, timeout=timeout, headers=headers)))

    def submit(
        self,
        service: str,
        body: bytes | str | Sequence[bytes] = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Future[Reply]:
        """``request`` without waiting: a ``concurrent.futures.Future`` (many at once)."""
        if not headers and isinstance(body, bytes | str):
            return self._aio.request_threadsafe(service, body, timeout=timeout)  # no task per call
        self._aio.ensure_open()
        coro = self._aio.request(service, body, timeout=timeout, headers=headers)
        return asyncio.run_coroutine_threadsafe(coro, _background_loop())


H = TypeVar("H", bound=Callable[..., Any])


class Worker(Client):
    """Blocking worker; see :class:`mc0.aio.Worker`. Handlers may be sync or async."""

    _aio: aio.Worker

    def __init__(self, endpoint: str | None = None, *, capacity: int = 1, **options: Any) -> None:
        self._capacity = capacity
        self._signal_tasks: list[asyncio.Task[None]] = []  # drain / close started by a signal (kept referenced)
        super().__init__(endpoint, **options)

    def _make(self, endpoint: str | None, **options: Any) -> aio.Client:
        return aio.Worker(endpoint, capacity=self._capacity, **options)

    @property
    def handled(self) -> int:
        return self._aio.handled

    def service(self, name: str) -> Callable[[H], H]:
        return self._aio.service(name)

    def connect(self) -> Worker:
        _run(self._aio.connect())
        return self

    def __enter__(self) -> Worker:
        return self.connect()

    def run(self, *, drain_timeout: float | None = None) -> None:
        """Serve until ``stop()``, ``drain()`` or a signal (signals only from the main thread).

        The first SIGINT or SIGTERM drains: no new work, running handlers finish
        and reply, then the worker closes (bounded by ``drain_timeout``, default
        the client's ``timeout``).  A second signal cancels what still runs and
        closes at once.
        """
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            signalled = 0

            def on_signal(signum: int, frame: FrameType | None) -> None:
                nonlocal signalled
                signalled += 1
                loop = _background_loop()
                if signalled == 1:
                    loop.call_soon_threadsafe(self._start_drain, drain_timeout)
                else:
                    loop.call_soon_threadsafe(self._close_now)

            previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            _run(self._aio.run())
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def stop(self) -> None:
        """Make ``run()`` return (any thread, or a signal handler)."""
        _background_loop().call_soon_threadsafe(self._aio.stop)

    def drain(self, *, timeout: float | None = None) -> None:
        """See :meth:`mc0.aio.Worker.drain`: no new work, running handlers finish, then close."""
        _run(self._aio.drain(timeout=timeout))

    def _start_drain(self, timeout: float | None) -> None:
        """On the loop thread: drain in the background; ``run()`` returns when it closed."""
        if self._aio.closed:
            return
        self._signal_tasks.append(asyncio.get_running_loop().create_task(self._drain_quietly(timeout)))

    async def _drain_quietly(self, timeout: float | None) -> None:
        try:
            await self._aio.drain(timeout=timeout)
        except ClosedError:
            pass  # a second signal closed it mid-drain: that was asked for
        except Exception as exc:  # a Timeout past the deadline: logged, the worker is closed anyway
            log.warning("worker drain: %s", exc)
        finally:
            self._aio.stop()

    def _close_now(self) -> None:
        """On the loop thread: cancel running handlers and close (a second signal)."""
        self._signal_tasks.append(asyncio.get_running_loop().create_task(self._aio.close()))
        self._aio.stop()
