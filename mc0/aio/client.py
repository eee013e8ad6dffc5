"""asyncio client: ``mc0.aio.Client``.

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
import json
import logging
import operator
import os
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import zmq
import zmq.asyncio
import zmq.utils.monitor

from .. import keys as keyfiles
from .. import protocol as P
from ..errors import AuthFailed, ClosedError, ConfigError, Error, NotConnected, Timeout
from ..message import Ack, FetchResult, Record, Reply
from ..protocol import JOURNAL_SERVICE, Command, Header, Limits, Status, parse_journal_page
from ..security import HANDSHAKE_FAILURES, NO_KEY_FAILURE, configure_client
from ..session import (
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
from ..settings import ENV_BROKER_KEY, ENV_KEY, ClientConfig
from .streams import DEFAULT_MAX_PENDING, ReplyStream, Subscription

log = logging.getLogger("mc0.client")
_HANDSHAKE_EVENTS = functools.reduce(operator.or_, HANDSHAKE_FAILURES)

DEFAULT_REQUEST_TIMEOUT = 30.0


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
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop connect() ran on
        self._rearm = asyncio.Event()  # wakes the heartbeat task when a CONNECT is answered
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
        loop = self._loop = asyncio.get_running_loop()
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

    def publish_nowait(
        self,
        topic: str,
        body: bytes | Sequence[bytes],
        *,
        headers: Mapping[str, str] | None = None,
        msgid: str | None = None,
    ) -> None:
        """Fire-and-forget PUT without awaiting; safe to call from any thread.

        Bad input raises here, in the caller; the message is queued for the
        client's event loop to send.
        """
        frames = self.session.publish(topic, body, headers, msgid=msgid)
        self.ensure_open()
        loop = self._loop
        assert loop is not None
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._send_nowait(frames)
        else:
            loop.call_soon_threadsafe(self._send_nowait, frames)

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
        self.ensure_open()
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
        self.ensure_open()
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
    def closed(self) -> bool:
        """``close()`` ran (a closed client cannot be connected again)."""
        return self._closed

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
    def ensure_open(self) -> None:
        """Raise ``ClosedError`` unless ``connect()`` ran and ``close()`` did not."""
        if self._closed:
            raise ClosedError("client is closed")
        if self._socket is None:
            raise ClosedError("client is not connected: call connect() first")

    async def _send(self, frames: Frames) -> None:
        self.ensure_open()
        assert self._socket is not None
        await self._socket.send_multipart(frames)
        self.session.sent(time.monotonic())

    def _send_nowait(self, frames: Frames) -> None:
        self.ensure_open()
        assert self._socket is not None
        self._socket.send_multipart(frames)  # returns a done future unless at HWM
        self.session.sent(time.monotonic())

    async def _call(self, request_id: str, frames: Frames, timeout: float | None, what: str) -> Command:
        self.ensure_open()
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
        """Heartbeats and healing at the session's next deadline; re-armed whenever a CONNECT
        is answered (the deadline then moves from "heal" to "heartbeat in one TTL")."""
        rearm = self._rearm
        while True:
            delay = self.session.next_deadline() - time.monotonic()
            rearm.clear()
            try:
                await asyncio.wait_for(rearm.wait(), max(0.005, delay))
                continue  # the deadline changed: compute it again
            except TimeoutError:
                pass
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
            self._rearm.set()
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


def ack_of(answer: Command) -> Ack:
    """The OK to a confirmed publish as an Ack."""
    headers = answer.headers
    seq = headers.get(Header.SEQ)
    return Ack(headers.get(Header.JOURNAL), P.decimal(seq) if seq else None, headers.get(Header.DUPLICATE) == "1")
