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
import functools
import inspect
import json
import logging
import operator
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

import zmq
import zmq.asyncio
import zmq.utils.monitor

from . import keys as keyfiles
from . import protocol as P
from .errors import AuthFailed, ClosedError, ConfigError, Error, NotConnected, Timeout
from .message import Ack, FetchResult, Message, Record, Reply, Request
from .protocol import JOURNAL_SERVICE, Command, Header, Limits, Status, Verb, parse_journal_page
from .security import HANDSHAKE_FAILURES, NO_KEY_FAILURE, configure_client
from .session import (
    Answer,
    CancelWork,
    ClientSession,
    Connected,
    ConnectRefused,
    Delivery,
    Event,
    Fault,
    Frames,
    Reconnecting,
    Work,
    answer_error,
)
from .settings import ENV_BROKER_KEY, ENV_KEY, ClientConfig

log = logging.getLogger("mc0.client")
_HANDSHAKE_EVENTS = functools.reduce(operator.or_, HANDSHAKE_FAILURES)

DEFAULT_MAX_PENDING = 10_000
DEFAULT_REQUEST_TIMEOUT = 30.0
_CLOSED = object()
H = TypeVar("H", bound=Callable[..., Any])


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
        user = {k: v for k, v in headers.items() if k.startswith(P.USER_HEADER_PREFIX)}
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
            self.count = int(headers.get(Header.COUNT, "0"))
            self.missing = int(headers.get(Header.MISSING, "0"))
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


class Client:
    """Publish, subscribe, ping and make requests over one DEALER connection."""

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
        key: str | os.PathLike[str] | keyfiles.KeyPair | None = None,
        broker_key: str | os.PathLike[str] | bytes | keyfiles.KeyPair | None = None,
    ) -> None:
        """``key``: this client's secret key (a NAME.key_secret path or a KeyPair);
        ``broker_key``: the broker's public key (a NAME.key path, Z85 bytes or a KeyPair).
        Each falls back to ``MC0_KEY`` / ``MC0_BROKER_KEY``, then the config; with
        neither the client speaks without CURVE.  Files are read by ``connect()``.
        """
        config = config or ClientConfig()
        self._key_spec = key or os.environ.get(ENV_KEY) or config.key or None
        self._broker_key_spec = broker_key or os.environ.get(ENV_BROKER_KEY) or config.broker_key or None
        self.identity: str | None = None  # our key's name, once connected with CURVE
        self.endpoint = endpoint or config.endpoint
        self.timeout = timeout if timeout is not None else config.timeout_ms / 1000.0
        self.request_timeout = config.request_timeout_ms / 1000.0
        ttl_ms = round(ttl * 1000) if ttl is not None else config.ttl_ms
        self.session = ClientSession(ttl_ms=ttl_ms, liveness=liveness, limits=limits)
        self.faults: collections.deque[Exception] = collections.deque(maxlen=100)
        self.reconnects = 0
        self._context = context
        self._socket: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: dict[str, asyncio.Future[Command]] = {}
        self._streams: dict[str, ReplyStream] = {}
        self._subscriptions: dict[str, list[Subscription]] = {}
        self._connected: asyncio.Future[int] | None = None
        self._closed = False
        self._closing = False

    # ------------------------------------------------------------ lifecycle
    async def connect(self) -> Client:
        """Open the connection and wait for the broker to accept it."""
        if self._closed:
            raise ClosedError("client is closed")
        if self._socket is not None:
            return self
        curve = self._curve_keys()  # KeyFileError names the file: before any socket exists
        context = self._context or zmq.asyncio.Context.instance()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            configure_client(sock, *curve)
        self._monitor = sock.get_monitor_socket(_HANDSHAKE_EVENTS)
        sock.connect(self.endpoint)
        self._socket = sock
        loop = asyncio.get_running_loop()
        self._connected = loop.create_future()
        self._tasks = [
            loop.create_task(self._read(), name="mc0-reader"),
            loop.create_task(self._beat(), name="mc0-heartbeat"),
            loop.create_task(self._watch(), name="mc0-monitor"),
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

    def _curve_keys(self) -> tuple[keyfiles.KeyPair, bytes] | None:
        key, broker = self._key_spec, self._broker_key_spec
        if key is None and broker is None:
            return None
        if key is None or broker is None:
            missing = "key (--key / MC0_KEY)" if key is None else "broker_key (--broker-key / MC0_BROKER_KEY)"
            raise ConfigError(
                "client", f"CURVE needs this client's secret key and the broker's public key; no {missing}"
            )
        own = key if isinstance(key, keyfiles.KeyPair) else keyfiles.load_secret(key)
        if isinstance(broker, keyfiles.KeyPair):
            server = broker.public
        elif isinstance(broker, bytes):
            server = broker
        else:
            server = keyfiles.load_public(broker).public
        self.identity = own.name
        return own, server

    async def _watch(self) -> None:
        """Handshake failures from the socket monitor become AuthFailed (promptly, not a hang)."""
        monitor = self._monitor
        assert monitor is not None
        while True:
            event = zmq.utils.monitor.parse_monitor_message(await monitor.recv_multipart())
            reason = HANDSHAKE_FAILURES.get(int(event["event"]))
            if reason is None:
                continue
            if self.identity is None:
                reason = NO_KEY_FAILURE
            error = AuthFailed(f"{self.endpoint}: {reason}")
            if self._connected is not None and not self._connected.done():
                self._connected.set_exception(error)
            else:
                self.faults.append(error)
                log.warning("%s", error)
                self._fail_pending(error)

    async def close(self) -> None:
        """Say DISCONNECT (confirmed, briefly), stop the tasks, fail what is pending (idempotent).

        Waiting for the broker's OK means that once ``close()`` returns the
        broker has forgotten us: no request is dispatched to a closed worker.
        """
        if self._closed or self._closing:
            return
        self._closing = True
        sock = self._socket
        if sock is not None and self.session.connected:
            request_id = self.session.new_id()
            try:
                await self._call(request_id, self.session.disconnect(request_id), min(1.0, self.timeout), "disconnect")
            except (Error, OSError, zmq.ZMQError):
                pass  # the broker is gone or slow: it will expire us
        self.session.connected = False
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._fail_pending(ClosedError("client closed"))
        for subs in self._subscriptions.values():
            for sub in subs:
                sub._end()
        self._subscriptions.clear()
        if self._connected is not None and not self._connected.done():
            self._connected.set_exception(ClosedError("client closed"))
            self._connected.exception()  # mark retrieved
        if self._monitor is not None:
            if sock is not None:
                sock.disable_monitor()
            self._monitor.close(linger=0)
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
        msgid: str | None = None,
        timeout: float | None = None,
    ) -> Ack | None:
        """PUT; with ``confirm`` wait for the broker's OK (raise its ERROR) and return it.

        On a journaled topic the OK comes once the message is written (per the
        journal's fsync policy) and names its ``seq``; ``msgid`` makes a retry
        safe: a repeat within the journal's dedup window is acknowledged as a
        duplicate and not delivered again.
        """
        if not confirm:
            await self._send(self.session.publish(topic, body, headers, msgid=msgid))
            return None
        request_id = self.session.new_id()
        frames = self.session.publish(topic, body, headers, request_id, msgid)
        answer = await self._call(request_id, frames, timeout, f"publish to {topic!r}")
        return ack_of(answer)

    async def subscribe(
        self,
        *patterns: str,
        max_pending: int = DEFAULT_MAX_PENDING,
        from_seq: int | None = None,
        journal: str | None = None,
        timeout: float | None = None,
    ) -> Subscription:
        """Subscribe to one or more patterns; returns once the broker confirmed them.

        A message matching several of the patterns is delivered once.  With
        ``from_seq`` the broker first replays the journaled history from that
        sequence number (0 = the oldest kept; ``journal`` picks the journal
        when several keep these topics), then continues live, in order and
        without gaps or repeats; ``Gone`` if that history was trimmed.
        """
        self._check_open()
        if not patterns:
            raise ValueError("subscribe needs at least one pattern")
        sub = Subscription(self, tuple(dict.fromkeys(patterns)), max_pending)
        added: list[str] = []
        if from_seq is not None:
            request_id = self.session.new_id()
            replay = self.session.replay_patterns(sub.patterns, from_seq, journal, request_id)
            for pattern in sub.patterns:
                added.append(pattern)
                self._subscriptions.setdefault(pattern, []).append(sub)
            try:
                await self._call(request_id, replay, timeout, f"subscribe from {from_seq} to {sub.pattern!r}")
            except BaseException:
                await self._release(sub, added)
                raise
            return sub
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

    async def journal_info(self, *, timeout: float | None = None) -> dict[str, dict[str, Any]]:
        """Every journal's ``first_seq``, ``next_seq``, size and settings (``mc0.journal info``)."""
        reply = await self.request(JOURNAL_SERVICE, b'{"op":"info"}', timeout=timeout)
        info: dict[str, dict[str, Any]] = json.loads(reply.body)
        return info

    async def fetch(
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
        """Records ``from_seq <= seq < to_seq`` of a journal (0 = the oldest kept).

        One call returns at most the broker's page limits (``max_records`` /
        ``max_bytes`` lower them); continue from ``next_seq``.  Deterministic:
        the same arguments give the same records.  ``Gone`` if ``from_seq`` was
        trimmed by retention; only topics this identity may subscribe to are
        returned.
        """
        query: dict[str, object] = {"op": "fetch", "journal": journal, "from_seq": from_seq, "topics": list(topics)}
        if to_seq is not None:
            query["to_seq"] = to_seq
        if max_records is not None:
            query["max_records"] = max_records
        if max_bytes is not None:
            query["max_bytes"] = max_bytes
        records: list[Record] = []
        stream = await self.stream(JOURNAL_SERVICE, json.dumps(query).encode(), timeout=timeout)
        async with stream:
            async for reply in stream:
                if not reply.final:
                    records += parse_journal_page(reply.parts)
        assert stream.final is not None
        summary = json.loads(stream.final.body)
        return FetchResult(records, int(summary["next_seq"]), int(summary["first_seq"]), int(summary["end_seq"]))

    async def ping(self, *, timeout: float | None = None) -> float:
        """Round trip to the broker in seconds."""
        request_id = self.session.new_id()
        started = time.perf_counter()
        await self._call(request_id, self.session.ping(request_id), timeout, "ping")
        return time.perf_counter() - started

    async def stream(
        self,
        service: str,
        body: bytes | str | Sequence[bytes] = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> ReplyStream:
        """Send a REQUEST; iterate the returned stream for PARTIALs then the FINAL."""
        return await self._start(service, body, timeout, headers, scatter=False)

    async def request(
        self,
        service: str,
        body: bytes | str | Sequence[bytes] = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """Send a REQUEST and return its FINAL (PARTIALs are skipped); ERROR raises."""
        stream = await self._start(service, body, timeout, headers, scatter=False)
        async for _ in stream:
            pass
        assert stream.final is not None
        return stream.final

    async def scatter(
        self,
        service: str,
        body: bytes | str | Sequence[bytes] = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> ReplyStream:
        """Send the request to every worker of the service; iterate per-worker replies."""
        return await self._start(service, body, timeout, headers, scatter=True)

    def submit(
        self,
        service: str,
        body: bytes | str | Sequence[bytes] = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> asyncio.Task[Reply]:
        """``request`` as a task, for many requests at once (``asyncio.gather``)."""
        return asyncio.ensure_future(self.request(service, body, timeout=timeout, headers=headers))

    async def _start(
        self,
        service: str,
        body: bytes | str | Sequence[bytes],
        timeout: float | None,
        headers: Mapping[str, str] | None,
        scatter: bool,
    ) -> ReplyStream:
        self._check_open()
        seconds = self.request_timeout if timeout is None else timeout
        request_id = self.session.new_id()
        frames = self.session.request(service, body, request_id, max(1, round(seconds * 1000)), headers, scatter)  # type: ignore[arg-type]
        # The broker enforces the deadline and always answers; the grace covers its answer's trip.
        stream = ReplyStream(self, request_id, service, scatter, seconds + max(1.0, 2 * self.session.ttl))
        self._streams[request_id] = stream
        try:
            await self._send(frames)
        except BaseException:
            stream._finish()
            raise
        return stream

    @property
    def connected(self) -> bool:
        return self.session.connected and not self._closed

    def _fail_pending(self, error: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        for stream in list(self._streams.values()):
            stream._feed(error)
        self._streams.clear()

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
            stream = self._streams.get(event.request_id)
            if stream is not None:
                stream._feed(event.command)
                return
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
            if event.withdrawn is not None:
                for sub in self._subscriptions.pop(event.withdrawn, []):
                    sub.patterns = tuple(p for p in sub.patterns if p != event.withdrawn)
                    if not sub.patterns:
                        sub._end()
        elif isinstance(event, Reconnecting):
            log.info("reconnecting to %s: %s", self.endpoint, event.reason)
            # The broker forgets a session on reconnect: whatever we were waiting for is lost.
            self._fail_pending(NotConnected(Status.NOT_CONNECTED, f"connection to the broker reset: {event.reason}"))


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
        self._work: dict[str, asyncio.Task[None]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._stop: asyncio.Event | None = None

    def service(self, name: str) -> Callable[[H], H]:
        """Decorator: serve ``name`` with the decorated handler (register before ``connect``)."""

        def register(handler: H) -> H:
            self.add_service(name, handler)
            return handler

        return register

    def add_service(self, name: str, handler: Handler) -> None:
        if self._socket is not None:
            raise RuntimeError("register services before connect()")
        self.session.serve([*self._handlers, name], self.capacity)  # validates the name
        self._handlers[name] = handler

    async def connect(self) -> Worker:
        if not self._handlers:
            raise ValueError("a worker needs at least one service")
        if self._socket is not None:
            return self
        self.session.services = ()  # READY goes out below, confirmed, not with the CONNECT's answer
        await super().connect()
        request_id = self.session.new_id()
        frames = self.session.serve(list(self._handlers), self.capacity, request_id)
        assert frames is not None
        await self._call(request_id, frames, None, "register services")
        return self

    async def run(self) -> None:
        """Serve until ``stop()`` or ``close()``."""
        await self.connect()
        self._stop = self._stop or asyncio.Event()
        await self._stop.wait()

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
        if isinstance(event, Work):
            task = asyncio.get_running_loop().create_task(self._serve(event), name=f"mc0-work-{event.bid}")
            self._work[event.bid] = task
        elif isinstance(event, CancelWork):
            running = self._work.pop(event.bid, None)
            if running is not None:
                running.cancel()
        else:
            super()._on_event(event)

    async def _serve(self, work: Work) -> None:
        handler = self._handlers.get(work.service)
        try:
            if handler is None:
                await self._send(self.session.fail(work.bid, Status.HANDLER_FAILED, f"no handler for {work.service}"))
                return
            request = Request(
                work.bid, work.service, work.parts, work.headers, work.caller, time.monotonic() + work.timeout_ms / 1000
            )
            async with asyncio.timeout(work.timeout_ms / 1000.0):
                await self._run_handler(handler, request)
            self.handled += 1
        except (TimeoutError, asyncio.CancelledError):
            pass  # the broker already answered the client (504 or 499)
        except Exception as exc:  # a handler failure is an answer, not a crash
            self.failed += 1
            log.debug("handler for %s failed", work.service, exc_info=True)
            if self.connected:
                await self._send(self.session.fail(work.bid, Status.HANDLER_FAILED, f"{type(exc).__name__}: {exc}"))
        finally:
            self._work.pop(work.bid, None)

    async def _reply(self, verb: Verb, bid: str, result: object) -> None:
        if isinstance(result, Reply):
            frames = self.session.reply(verb, bid, result.parts, result.headers or None)
        else:
            frames = self.session.reply(verb, bid, result)  # type: ignore[arg-type]
        await self._send(frames)

    async def _run_handler(self, handler: Handler, request: Request) -> None:
        bid = request.id
        if inspect.isasyncgenfunction(handler):
            async for chunk in handler(request):
                await self._reply(Verb.PARTIAL, bid, chunk)
            await self._reply(Verb.FINAL, bid, None)
            return
        if inspect.iscoroutinefunction(handler):
            await self._reply(Verb.FINAL, bid, await handler(request))
            return
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.capacity, thread_name_prefix="mc0-handler")
        if inspect.isgeneratorfunction(handler):
            generator = handler(request)
            while True:
                finished, value = await loop.run_in_executor(self._executor, _step, generator)
                if finished:
                    await self._reply(Verb.FINAL, bid, value)
                    return
                await self._reply(Verb.PARTIAL, bid, value)
        result = await loop.run_in_executor(self._executor, handler, request)
        if inspect.isawaitable(result):
            result = await result
        await self._reply(Verb.FINAL, bid, result)


def ack_of(answer: Command) -> Ack:
    """The OK to a confirmed publish as an Ack."""
    headers = answer.headers
    seq = headers.get(Header.SEQ)
    return Ack(
        headers.get(Header.JOURNAL), int(seq) if seq and seq.isdigit() else None, headers.get(Header.DUPLICATE) == "1"
    )


def _step(generator: Any) -> tuple[bool, object]:
    try:
        return False, next(generator)
    except StopIteration as stop:
        return True, stop.value
