"""Sync client: ``mc0.Client``, ``Worker`` and the sync views of what they hand out, over :mod:`mc0.aio`.

Contract: each class is a :class:`~mc0.sync_loop.View` of its asyncio twin,
name for name, and runs it on one shared background event loop (a daemon
thread started on first use: :mod:`mc0.sync_loop`), so heartbeats and healing
continue while the caller's thread is busy or blocked.  A method that only
waits for its twin's is made from it (``blocking`` / ``viewed``): the same
signature, written once, in :mod:`mc0.aio`.  The rest are written here for a
reason each: a fast path that skips the loop (``publish``, ``request``,
``submit``, ``Subscription.next``), a sync view in the arguments
(``unsubscribe``, the consumer's acks), or what only a thread has (``run``'s
signals, ``connect`` returning the sync object); tests/test_sync_api.py holds
every sync signature to its twin's.  Blocking calls are bounded by the
client's ``timeout`` (``Timeout``); ``Subscription.next(timeout=None)`` waits
until a message arrives or the subscription is closed.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from . import aio
from .errors import ClosedError
from .keys import KeyPair
from .message import Ack, Message, Reply
from .protocol import DEFAULT_LIMITS, ColumnsPage, Limits
from .settings import ClientConfig
from .sync_loop import View, background_loop, blocking, in_loop_thread, run, viewed

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["Client", "ConsumedMessage", "Consumer", "PageStream", "ReplyStream", "Subscription", "Worker"]

log = logging.getLogger("mc0.client")


# ---------------------------------------------------------------- what arrives
class Subscription(View[aio.Subscription]):
    """Sync view of :class:`mc0.aio.Subscription`: an iterator with ``next(timeout)``."""

    @property
    def asyncio_twin(self) -> aio.Subscription:
        """The :class:`mc0.aio.Subscription` this view reads (what the sync client hands its asyncio
        client, e.g. to unsubscribe it)."""
        return self._inner

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
    def from_seq(self) -> int | None:
        return self._inner.from_seq

    @property
    def journal(self) -> str | None:
        return self._inner.journal

    @property
    def error(self) -> Exception | None:
        """Why the broker ended this subscription (a replay that stopped: its status and reason), if it did."""
        return self._inner.error

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

    def batches(self, *, max: int = 1000) -> Iterator[list[Message]]:
        """``for batch in sub.batches(max=...)``: whatever messages wait, up to ``max`` of them in
        arrival order, as one list each time, read in this thread; ends when the subscription closes."""
        if max < 1:
            raise ValueError("max must be at least 1")
        while True:
            try:
                got = self._inner.next_batch_threadsafe(max)
            except ClosedError:
                return
            yield got

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        try:
            return self.next()
        except ClosedError:
            raise StopIteration from None

    def release_span(self) -> None:
        """See :meth:`mc0.aio.Subscription.release_span` (in this thread, where the message was taken)."""
        self._inner.release_span()

    def close(self) -> None:
        """Unsubscribe (idempotent); the span of the message taken last ends here, in this thread."""
        self._inner.release_span()
        run(self._inner.close())

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReplyStream(View[aio.ReplyStream]):
    """Sync view of :class:`mc0.aio.ReplyStream`: iterate PARTIALs then the FINAL."""

    @property
    def final(self) -> Reply | None:
        return self._inner.final

    @property
    def count(self) -> int | None:
        return self._inner.count

    @property
    def missing(self) -> int | None:
        return self._inner.missing

    @property
    def queued(self) -> int:
        return self._inner.queued

    def __iter__(self) -> Iterator[Reply]:
        return self

    def __next__(self) -> Reply:
        try:
            return run(self._inner.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    cancel = blocking(aio.ReplyStream.cancel)
    close = blocking(aio.ReplyStream.close)

    def __enter__(self) -> ReplyStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PageStream(View[aio.PageStream]):
    """Sync view of :class:`mc0.aio.PageStream`: iterate a fetch's columns pages as they arrive.

    Pages cross from the client's loop thread in bunches (``next_pages``:
    everything that arrived while the caller was busy), not one by one.
    """

    def __init__(self, inner: aio.PageStream) -> None:
        super().__init__(inner)
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

    @property
    def done(self) -> bool:
        return self._inner.done

    next_pages = blocking(aio.PageStream.next_pages)

    def __iter__(self) -> Iterator[ColumnsPage]:
        return self

    def __next__(self) -> ColumnsPage:
        if not self._ready:
            self._ready.extend(self.next_pages())
            if not self._ready:
                raise StopIteration
        return self._ready.popleft()

    def close(self) -> None:
        """Stop the fetch (CANCEL) if it has not ended, and drop the pages not yet taken (idempotent)."""
        self._ready.clear()
        run(self._inner.close())

    def __enter__(self) -> PageStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ConsumedMessage(View[aio.ConsumedMessage]):
    """One message from a durable consumer; see :class:`mc0.aio.ConsumedMessage`."""

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

    ack = blocking(aio.ConsumedMessage.ack)
    nak = blocking(aio.ConsumedMessage.nak)
    term = blocking(aio.ConsumedMessage.term)

    def ack_nowait(self) -> None:
        """Ack without waiting; see :meth:`mc0.aio.Consumer.ack_nowait`."""
        background_loop().call_soon_threadsafe(self._inner.ack_nowait)

    def __repr__(self) -> str:
        return f"<ConsumedMessage seq={self.seq} deliveries={self.deliveries} topic={self.topic!r}>"


def _consumed(messages: list[aio.ConsumedMessage]) -> list[ConsumedMessage]:
    return [ConsumedMessage(m) for m in messages]


class Consumer(View[aio.Consumer]):
    """A durable consumer (blocking); see :class:`mc0.aio.Consumer`."""

    def __init__(self, inner: aio.Consumer) -> None:
        super().__init__(inner)
        self.journal = inner.journal
        self.name = inner.name

    fetch = viewed(aio.Consumer.fetch, _consumed)

    # The settling methods take the sync ConsumedMessage (or a seq): written here for that type.
    def ack(self, *messages: ConsumedMessage | int) -> int:
        return run(self._inner.ack(*_seqs(messages)))

    def nak(self, *messages: ConsumedMessage | int, delay: float = 0.0) -> int:
        return run(self._inner.nak(*_seqs(messages), delay=delay))

    def term(self, *messages: ConsumedMessage | int) -> int:
        return run(self._inner.term(*_seqs(messages)))

    def ack_nowait(self, *messages: ConsumedMessage | int) -> None:
        """Ack without waiting; see :meth:`mc0.aio.Consumer.ack_nowait`."""
        background_loop().call_soon_threadsafe(self._inner.ack_nowait, *_seqs(messages))

    flush_acks = blocking(aio.Consumer.flush_acks)
    info = blocking(aio.Consumer.info)
    delete = blocking(aio.Consumer.delete)

    @property
    def ack_errors(self) -> int:
        return self._inner.ack_errors


def _seqs(messages: Sequence[ConsumedMessage | int]) -> list[int]:
    return [m if isinstance(m, int) else m.seq for m in messages]


# ---------------------------------------------------------------- the client
class Client(View[aio.Client]):
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
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """See :class:`mc0.aio.Client`; ``on_fault`` runs on the client's I/O thread; spans are made
        in the caller's thread where it waits (its current span the parent)."""
        super().__init__(
            self._make(
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
                tracer_provider=tracer_provider,
            )
        )

    def _make(self, endpoint: str | None, **options: Any) -> aio.Client:
        return aio.Client(endpoint, **options)

    @property
    def endpoint(self) -> str:
        return self._inner.endpoint

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._inner.endpoints

    @property
    def closed(self) -> bool:
        """``close()`` (or ``drain()``) ran."""
        return self._inner.closed

    @property
    def connected(self) -> bool:
        return self._inner.connected

    @property
    def identity(self) -> str | None:
        return self._inner.identity

    @property
    def reconnects(self) -> int:
        return self._inner.reconnects

    @property
    def faults(self) -> list[Exception]:
        return list(self._inner.faults)

    def connect(self) -> Client:
        run(self._inner.connect())
        return self

    def close(self) -> None:
        if self._inner.closed:
            return
        run(self._inner.close())

    def __enter__(self) -> Client:
        return self.connect()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------ made from the async methods
    subscribe = viewed(aio.Client.subscribe, Subscription)
    journal_info = blocking(aio.Client.journal_info)
    fetch = blocking(aio.Client.fetch)
    fetch_pages = viewed(aio.Client.fetch_pages, PageStream)
    ping = blocking(aio.Client.ping)
    send_to = blocking(aio.Client.send_to)
    consume = viewed(aio.Client.consume, Consumer)
    drain = blocking(aio.Client.drain)
    flush = blocking(aio.Client.flush)
    stream = viewed(aio.Client.stream, ReplyStream)
    scatter = viewed(aio.Client.scatter, ReplyStream)

    # ------------------------------------------------------------ written here (see the module's contract)
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
            return run(self._inner.publish(topic, body, headers=headers, confirm=True, msgid=msgid, timeout=timeout))
        # Validated here (misuse raises in the caller), handed to the loop without a hop per message;
        # blocks only while the outgoing buffer is full (back-pressure, bounded by ``timeout``).
        self._inner.publish_nowait(topic, body, headers=headers, msgid=msgid, timeout=timeout)
        return None

    def unsubscribe(self, subscription: Subscription | str) -> None:
        target = subscription if isinstance(subscription, str) else subscription.asyncio_twin
        run(self._inner.unsubscribe(target))

    @property
    def mailbox(self) -> Subscription:
        """Direct messages sent to this client's identity; see :attr:`mc0.aio.Client.mailbox`."""
        if self._mailbox is None:
            self._mailbox = Subscription(self._inner.mailbox)
        return self._mailbox

    def request(
        self,
        service: str,
        body: bytes | str | Sequence[bytes] = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        if headers or not isinstance(body, bytes | str) or in_loop_thread(background_loop()):
            return run(self._inner.request(service, body, timeout=timeout, headers=headers))
        return self._inner.request_threadsafe(service, body, timeout=timeout).result()

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
            return self._inner.request_threadsafe(service, body, timeout=timeout)  # no task per call
        self._inner.ensure_open()
        coro = self._inner.request(service, body, timeout=timeout, headers=headers)
        return asyncio.run_coroutine_threadsafe(coro, background_loop())


H = TypeVar("H", bound=Callable[..., Any])


class Worker(Client):
    """Blocking worker; see :class:`mc0.aio.Worker`. Handlers may be sync or async."""

    def __init__(self, endpoint: str | None = None, *, capacity: int = 1, **options: Any) -> None:
        self._capacity = capacity
        self._signal_tasks: list[asyncio.Task[None]] = []  # drain / close started by a signal (kept referenced)
        super().__init__(endpoint, **options)

    def _make(self, endpoint: str | None, **options: Any) -> aio.Worker:
        self._worker = aio.Worker(endpoint, capacity=self._capacity, **options)  # (the same object as _inner)
        return self._worker

    @property
    def handled(self) -> int:
        return self._worker.handled

    def service(self, name: str) -> Callable[[H], H]:
        return self._worker.service(name)

    def add_service(self, name: str, handler: aio.Handler) -> None:
        self._worker.add_service(name, handler)

    def batch_service(self, name: str, *, max: int = aio.DEFAULT_BATCH_MAX) -> Callable[[H], H]:
        return self._worker.batch_service(name, max=max)

    def add_batch_service(self, name: str, handler: aio.BatchHandler, *, max: int = aio.DEFAULT_BATCH_MAX) -> None:
        self._worker.add_batch_service(name, handler, max=max)

    def connect(self) -> Worker:
        run(self._worker.connect())
        return self

    def __enter__(self) -> Worker:
        return self.connect()

    def run(self, *, drain_timeout: float | None = None, ready: Callable[[], object] | None = None) -> None:
        """Serve until ``stop()``, ``drain()`` or a signal (signals only from the main thread).

        The first SIGINT or SIGTERM drains: no new work, running handlers finish
        and reply, then the worker closes (bounded by ``drain_timeout``, default
        the client's ``timeout``).  A second signal cancels what still runs and
        closes at once.  A worker not yet connected registers here, once the
        signals are handled (so a signal can never find it serving without them);
        ``ready`` is then called in this thread (e.g. to announce the worker).
        """
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            signalled = 0

            def on_signal(signum: int, frame: FrameType | None) -> None:
                nonlocal signalled
                signalled += 1
                loop = background_loop()
                if signalled == 1:
                    loop.call_soon_threadsafe(self._start_drain, drain_timeout)
                else:
                    loop.call_soon_threadsafe(self._close_now)

            previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            run(self._worker.connect())
            if ready is not None:
                ready()
            run(self._worker.run())
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def stop(self) -> None:
        """Make ``run()`` return (any thread, or a signal handler)."""
        background_loop().call_soon_threadsafe(self._worker.stop)

    drain = blocking(aio.Worker.drain)

    def _start_drain(self, timeout: float | None) -> None:
        """On the loop thread: drain in the background; ``run()`` returns when it closed."""
        if self._worker.closed:
            return
        self._signal_tasks.append(asyncio.get_running_loop().create_task(self._drain_quietly(timeout)))

    async def _drain_quietly(self, timeout: float | None) -> None:
        try:
            await self._worker.drain(timeout=timeout)
        except ClosedError:
            pass  # a second signal closed it mid-drain: that was asked for
        except Exception as exc:  # a Timeout past the deadline: logged, the worker is closed anyway
            log.warning("worker drain: %s", exc)
        finally:
            self._worker.stop()

    def _close_now(self) -> None:
        """On the loop thread: cancel running handlers and close (a second signal)."""
        self._signal_tasks.append(asyncio.get_running_loop().create_task(self._worker.close()))
        self._worker.stop()
