"""asyncio client: ``mc0.aio.Client`` and its ``Subscription``.

Contract: a thin shell around :class:`mc0.session.ClientSession`.  The
constructor does no I/O; ``connect()`` opens a DEALER socket, sends CONNECT
and waits for the broker's OK (``Timeout`` if none comes, the matching
``RemoteError`` if refused).  A reader task feeds received frames to the
session; a timer task sends heartbeats and heals the connection (CONNECT
again and re-SUB every pattern) when the broker restarts or goes silent.
``close()`` is idempotent.  The sync :class:`mc0.Client` mirrors these names.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Mapping, Sequence
from types import TracebackType

import zmq
import zmq.asyncio

from . import protocol as P
from .config import ClientConfig
from .errors import ClosedError, Timeout
from .message import Message
from .protocol import Command, Limits
from .session import (
    Answer,
    ClientSession,
    Connected,
    ConnectRefused,
    Delivery,
    Event,
    Fault,
    Frames,
    Reconnecting,
    answer_error,
)

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
        return self.patterns[0]

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


class Client:
    """Publish, subscribe and ping over one DEALER connection to the broker."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        liveness: int = 3,
        limits: Limits = P.DEFAULT_LIMITS,
        config: ClientConfig | None = None,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        config = config or ClientConfig()
        self.endpoint = endpoint or config.endpoint
        self.timeout = timeout if timeout is not None else config.timeout_ms / 1000.0
        ttl_ms = round(ttl * 1000) if ttl is not None else config.ttl_ms
        self.session = ClientSession(ttl_ms=ttl_ms, liveness=liveness, limits=limits)
        self.faults: collections.deque[Exception] = collections.deque(maxlen=100)
        self.reconnects = 0
        self._context = context
        self._socket: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: dict[str, asyncio.Future[Command]] = {}
        self._subscriptions: dict[str, list[Subscription]] = {}
        self._connected: asyncio.Future[int] | None = None
        self._closed = False

    # ------------------------------------------------------------ lifecycle
    async def connect(self) -> Client:
        """Open the connection and wait for the broker to accept it."""
        if self._closed:
            raise ClosedError("client is closed")
        if self._socket is not None:
            return self
        context = self._context or zmq.asyncio.Context.instance()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        self._socket = sock
        loop = asyncio.get_running_loop()
        self._connected = loop.create_future()
        self._tasks = [
            loop.create_task(self._read(), name="mc0-reader"),
            loop.create_task(self._beat(), name="mc0-heartbeat"),
        ]
        try:
            await self._send(self.session.connect(time.monotonic()))
            await asyncio.wait_for(asyncio.shield(self._connected), self.timeout)
        except TimeoutError:
            await self.close()
            raise Timeout(f"connect to {self.endpoint}", self.timeout) from None
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        """Say DISCONNECT, stop the tasks, fail what is pending (idempotent)."""
        if self._closed:
            return
        self._closed = True
        sock = self._socket
        if sock is not None and self.session.connected:
            try:
                sock.send_multipart(self.session.disconnect(), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ClosedError("client closed"))
        self._pending.clear()
        for subs in self._subscriptions.values():
            for sub in subs:
                sub._end()
        self._subscriptions.clear()
        if self._connected is not None and not self._connected.done():
            self._connected.set_exception(ClosedError("client closed"))
            self._connected.exception()  # mark retrieved
        if sock is not None:
            sock.close(linger=100)

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # ------------------------------------------------------------ operations
    async def publish(
        self,
        topic: str,
        body: bytes | Sequence[bytes],
        *,
        headers: Mapping[str, str] | None = None,
        confirm: bool = False,
        timeout: float | None = None,
    ) -> None:
        """PUT; with ``confirm`` wait for the broker's OK (raise its ERROR)."""
        if not confirm:
            await self._send(self.session.publish(topic, body, headers))
            return
        request_id = self.session.new_id()
        await self._call(
            request_id, self.session.publish(topic, body, headers, request_id), timeout, f"publish to {topic!r}"
        )

    def publish_nowait(
        self, topic: str, body: bytes | Sequence[bytes], *, headers: Mapping[str, str] | None = None
    ) -> None:
        """Fire-and-forget PUT without awaiting the socket (validated first)."""
        self._send_nowait(self.session.publish(topic, body, headers))

    async def subscribe(
        self, *patterns: str, max_pending: int = DEFAULT_MAX_PENDING, timeout: float | None = None
    ) -> Subscription:
        """Subscribe to one or more patterns; returns once the broker confirmed them.

        A message matching several of the patterns is delivered once.
        """
        self._check_open()
        if not patterns:
            raise ValueError("subscribe needs at least one pattern")
        sub = Subscription(self, tuple(dict.fromkeys(patterns)), max_pending)
        added: list[str] = []
        try:
            for pattern in sub.patterns:
                request_id = self.session.new_id()
                frames = self.session.add_pattern(pattern, request_id)
                added.append(pattern)
                self._subscriptions.setdefault(pattern, []).append(sub)
                if frames is not None:
                    await self._call(request_id, frames, timeout, f"subscribe to {pattern!r}")
        except BaseException:
            await self._release(sub, added)
            raise
        return sub

    async def unsubscribe(self, subscription: Subscription | str) -> None:
        """End a subscription (or every subscription that includes a pattern)."""
        if isinstance(subscription, str):
            for sub in list(self._subscriptions.get(subscription, ())):
                await self.unsubscribe(sub)
            return
        await self._release(subscription, subscription.patterns)

    async def _release(self, sub: Subscription, patterns: Sequence[str]) -> None:
        sub._end()
        for pattern in patterns:
            holders = self._subscriptions.get(pattern, [])
            if sub not in holders:
                continue
            holders.remove(sub)
            if not holders:
                del self._subscriptions[pattern]
            frames = self.session.drop_pattern(pattern)
            if frames is not None and not self._closed:
                await self._send(frames)

    async def ping(self, *, timeout: float | None = None) -> float:
        """Round trip to the broker in seconds."""
        request_id = self.session.new_id()
        started = time.perf_counter()
        await self._call(request_id, self.session.ping(request_id), timeout, "ping")
        return time.perf_counter() - started

    @property
    def connected(self) -> bool:
        return self.session.connected and not self._closed

    # ------------------------------------------------------------ plumbing
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("client is closed")
        if self._socket is None:
            raise ClosedError("client is not connected: call connect() first")

    async def _send(self, frames: Frames) -> None:
        self._check_open()
        assert self._socket is not None
        await self._socket.send_multipart(frames)
        self.session.sent(time.monotonic())

    def _send_nowait(self, frames: Frames) -> None:
        self._check_open()
        assert self._socket is not None
        self._socket.send_multipart(frames)  # returns a done future unless at HWM
        self.session.sent(time.monotonic())

    async def _call(self, request_id: str, frames: Frames, timeout: float | None, what: str) -> Command:
        self._check_open()
        future: asyncio.Future[Command] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        wait = self.timeout if timeout is None else timeout
        try:
            await self._send(frames)
            command = await asyncio.wait_for(future, wait)
        except TimeoutError:
            raise Timeout(what, wait) from None
        finally:
            self._pending.pop(request_id, None)
        if command.verb is P.Verb.ERROR:
            raise answer_error(command)
        return command

    async def _read(self) -> None:
        assert self._socket is not None
        recv = self._socket.recv_multipart
        while True:
            frames = await recv()
            events, replies = self.session.receive(frames, time.monotonic())
            for reply in replies:
                await self._send(reply)
            for event in events:
                self._on_event(event)

    async def _beat(self) -> None:
        while True:
            delay = self.session.next_deadline() - time.monotonic()
            await asyncio.sleep(max(0.005, delay))
            events, frames = self.session.tick(time.monotonic())
            for f in frames:
                await self._send(f)
            for event in events:
                self._on_event(event)

    def _on_event(self, event: Event) -> None:
        if isinstance(event, Delivery):
            if len(event.patterns) == 1:
                for sub in self._subscriptions.get(event.patterns[0], ()):
                    sub._offer(event.message)
            else:
                interested = {id(s): s for p in event.patterns for s in self._subscriptions.get(p, ())}
                for sub in interested.values():
                    sub._offer(event.message)
        elif isinstance(event, Answer):
            future = self._pending.get(event.request_id)
            if future is not None and not future.done():
                future.set_result(event.command)
        elif isinstance(event, Connected):
            if event.healed:
                self.reconnects += 1
                log.info("reconnected to %s; %d patterns restored", self.endpoint, len(self._subscriptions))
            if self._connected is not None and not self._connected.done():
                self._connected.set_result(event.ttl_ms)
        elif isinstance(event, ConnectRefused):
            if self._connected is not None and not self._connected.done():
                self._connected.set_exception(event.error)
            else:
                self.faults.append(event.error)
                log.warning("broker refused reconnect: %s", event.error)
        elif isinstance(event, Fault):
            self.faults.append(event.error)
            log.warning("broker reported: %s", event.error)
        elif isinstance(event, Reconnecting):
            log.info("reconnecting to %s: %s", self.endpoint, event.reason)
