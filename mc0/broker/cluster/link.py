"""The cluster link's shell: a thread running nats-py, bridged to the broker loop by an inproc PAIR socket.

Contract: the constructor does no I/O.  ``start(context, name)`` binds a zmq
PAIR on an inproc address of the broker's context and starts the thread,
which connects to the NATS servers of ``[cluster] nats`` (retrying every
``RETRY_S`` while none answers: a broker cut off from NATS keeps serving its
own peers), subscribes to the beacons and to this broker's inbox, and
publishes a beacon every ``hello_ms``.  The broker loop polls :attr:`socket`
and calls :meth:`receive`, which returns what arrived in order:

- ``Hello(name, epoch)``: another broker's beacon;
- ``RouteBlob(name, epoch, blob)``: route traffic from it (batched-wire records);
- ``LinkChange(up)``: NATS reachable again / lost (``up`` False: forget every route now);
- ``RoutesDropped(count)``: route traffic to this broker was dropped (the loop fell
  behind by more than the bounds below): every route is opened afresh;
- what the JetStream part reports (:mod:`.jetstream`: ``Acks``, ``Failed``,
  ``StreamState``, ``Records``, ``Answer``), when journals are kept by JetStream.

Records and route traffic taken by :meth:`receive` are handed back as credit
(:class:`.feed.Poster`): the caller handles them before it calls again, so
at most one call's worth is in its hands beyond what the budget counts.
While the budget is spent, route messages wait in nats-py's subscription
(``ROUTE_PENDING_BYTES``, ``ROUTE_PENDING_MSGS``); past that nats-py drops
them, counted (``route_dropped``) and reported as ``RoutesDropped``, so the
memory a flood of route traffic can take is bounded whatever the loop does.

:meth:`send` hands one route's blob to the thread (one NATS message each);
:meth:`publish` a JetStream journal's proposals, :meth:`call` a store call.
Nothing of the protocol is decided here: :mod:`mc0.broker.core.routes` does that.
Credentials are never logged (URLs are shown without them).  ``close()`` is
idempotent: it flushes what NATS still buffers (bounded), closes the
connection and joins the thread.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import ssl
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from ...errors import ConfigError
from ...protocol import routes as wire
from ...settings import ClusterConfig
from .feed import Poster
from .jetstream import JetStreamPart
from .streams import (
    OP_CALL,
    OP_PUBLISH,
    RECORDS,
    StoreNews,
    StreamSpec,
    call_frames,
    parse_inbound,
    parse_proposals,
    proposals_frames,
)

log = logging.getLogger("mc0.broker")

RETRY_S = 1.0  # between initial connection attempts while no NATS server answers
CONNECT_TIMEOUT_S = 2.0
CLOSE_FLUSH_S = 1.0
# Route traffic the broker loop has not taken is bounded twice: in the pipe to the loop by the
# Poster's budget (``on_route`` waits for credit), and behind it in nats-py's subscription by these.
# Past them nats-py drops (NATS core is at most once) and the loop resyncs every route (RoutesDropped).
ROUTE_PENDING_MSGS = 64 * 1024  # route messages are batches (up to 256 KiB each)
ROUTE_PENDING_BYTES = 64 * 1024 * 1024
BEACON_PENDING_MSGS = 4096  # beacons repeat every hello_ms: one dropped costs nothing
ROUTE_CREDIT_POLL_S = 0.05  # a route message waiting for credit is woken by the loop, else looks again
DROP_NOTICE_S = 1.0  # at most one RoutesDropped (and one log line) a second, the last one never skipped
_STOP = b"\x00stop"
NOBLOCK = int(zmq.NOBLOCK)  # (an int: pyzmq's flags are enum members, each use builds one)
_HELLO, _ROUTE, _UP, _DOWN, _DROPPED = b"H", b"R", b"U", b"D", b"X"
_inproc_serials = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Hello:
    name: str
    epoch: int


@dataclass(frozen=True, slots=True)
class RouteBlob:
    name: str
    epoch: int
    blob: bytes


@dataclass(frozen=True, slots=True)
class LinkChange:
    up: bool


@dataclass(frozen=True, slots=True)
class RoutesDropped:
    """Route messages to this broker were dropped (``count`` since the last notice): what the other
    brokers announced may be lost, so every route is opened afresh (each sends its whole state again)."""

    count: int


Inbound = Hello | RouteBlob | LinkChange | RoutesDropped | StoreNews


def redacted(url: str) -> str:
    """A NATS URL without its credentials (for logs and /varz)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def tls_context(config: ClusterConfig) -> ssl.SSLContext | None:
    """The TLS context ``[cluster]`` asks for (None: plain TCP, or TLS as the URL scheme says)."""
    if not (config.tls_ca or config.tls_cert):
        return None
    try:
        context = ssl.create_default_context(cafile=config.tls_ca or None)
        if config.tls_cert:
            context.load_cert_chain(config.tls_cert, config.tls_key or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError("cluster.tls_ca" if not config.tls_cert else "cluster.tls_cert", str(exc)) from None
    return context


def nats_options(config: ClusterConfig, client_name: str) -> dict[str, Any]:
    """nats-py's connect options for ``[cluster]``: every server, reconnecting for ever, pings that leave
    a frozen server after about two, the credentials and TLS it names."""
    options: dict[str, Any] = {
        "servers": list(config.nats),
        "name": client_name,
        "no_echo": True,  # its own beacons never come back
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": config.reconnect_ms / 1000.0,
        "connect_timeout": CONNECT_TIMEOUT_S,
        "ping_interval": max(1, config.ping_ms // 1000),  # a frozen server is left after ~2 pings
        "max_outstanding_pings": 2,
        "dont_randomize": False,
        "pending_size": 64 * 1024 * 1024,
    }
    if config.credentials:
        options["user_credentials"] = config.credentials
    if config.nkey_seed:
        options["nkeys_seed"] = config.nkey_seed
    tls = tls_context(config)
    if tls is not None:
        options["tls"] = tls
        if config.tls_hostname:
            options["tls_hostname"] = config.tls_hostname
    return options


class ClusterLink:
    def __init__(
        self, config: ClusterConfig, *, epoch: int | None = None, streams: dict[str, StreamSpec] | None = None
    ) -> None:
        """``streams``: the JetStream journals' streams (none: no JetStream part)."""
        self.config = config
        self.streams = streams or {}
        self.positions: dict[str, tuple[int, str]] = {}  # journal -> (its local copy's next seq, stream made at)
        self.jetstream: JetStreamPart | None = None  # (the link thread's)
        # Milliseconds since the epoch, then 16 random bits: a broker's next start has a larger epoch,
        # so a late message of the run before is told from the new one (ordered as the clocks are).
        self.epoch = epoch if epoch is not None else (time.time_ns() // 1_000_000) << 16 | int.from_bytes(os.urandom(2))
        self.name = ""
        # The broker loop's ends of two PAIRs: ``socket`` (polled) receives what the link thread posts,
        # ``_down`` sends the thread work.  Two, not one: the thread's receiving end is on its asyncio
        # loop (edge-triggered), and a send on that same socket could swallow its wake-up.
        self.socket: zmq.Socket[bytes] | None = None
        self._down: zmq.Socket[bytes] | None = None
        self.connected = False  # written by the link thread, read by the loop (a bool: atomic)
        self.server = ""  # the NATS server in use, without credentials
        self.counters: dict[str, int] = {
            "sent": 0,
            "sent_bytes": 0,
            "received": 0,
            "malformed": 0,
            "reconnects": 0,
            "route_dropped": 0,  # route messages nats-py dropped while the loop was behind (then resynced)
            "beacons_dropped": 0,
            "route_credit_waits": 0,  # route messages that waited for the loop to take what was posted
            "route_stale_dropped": 0,  # received before the link went down, not posted after it
        }
        self._inproc = f"inproc://mc0-cluster-{os.getpid()}-{next(_inproc_serials)}"
        self._thread: threading.Thread | None = None
        # What the thread posts, Records counted until receive() takes them (the feeds' credit:
        # JetStream's flow control is held while more than feed.FEED_BUDGET_BYTES wait).
        self.poster: Poster | None = None
        self._closed = False
        self._started = threading.Event()

    # ------------------------------------------------------------ lifecycle (the broker's thread)
    def start(self, context: zmq.Context[Any], name: str, positions: dict[str, tuple[int, str]] | None = None) -> None:
        """``positions``: where each JetStream journal's local copy stands (its delivery starts there)."""
        self.name = wire.check_name(name)
        self.positions = dict(positions or {})
        tls_context(self.config)  # a bad TLS file fails here, in one line, before anything runs
        for end in ("up", "down"):
            pair = context.socket(zmq.PAIR)
            pair.setsockopt(zmq.LINGER, 0)
            # No HWM: bounded by the outbox budgets of the route peers (down), by NATS's pending limits
            # for route traffic and the feeds' credit for records (up).
            pair.setsockopt(zmq.SNDHWM, 0)
            pair.setsockopt(zmq.RCVHWM, 0)
            pair.bind(f"{self._inproc}-{end}")
            if end == "up":
                self.socket = pair
            else:
                self._down = pair
        self._thread = threading.Thread(target=self._run, args=(context,), name="mc0-cluster", daemon=True)
        self._thread.start()
        self._started.wait(5.0)
        shown = ", ".join(redacted(u) for u in self.config.nats)
        log.info("cluster: broker %s (epoch %016x) joining over NATS %s", self.name, self.epoch, shown)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._down is not None:
            try:
                self._down.send(_STOP, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        if self._thread is not None:
            self._thread.join(CLOSE_FLUSH_S + CONNECT_TIMEOUT_S + 1.0)
        for sock in (self.socket, self._down):
            if sock is not None:
                sock.close(linger=0)
        self.socket = self._down = None

    # ------------------------------------------------------------ the broker loop's side
    def receive(self, limit: int = 256) -> list[Inbound]:
        """What the link thread passed on, oldest first (at most ``limit`` items a call)."""
        sock = self.socket
        out: list[Inbound] = []
        if sock is None:
            return out
        for _ in range(limit):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            kind = frames[0]
            if kind == _ROUTE:
                if self.poster is not None:
                    self.poster.consumed(sum(len(f) for f in frames))  # (handled before the next receive)
                out.append(RouteBlob(frames[1].decode(), int.from_bytes(frames[2], "big"), frames[3]))
            elif kind == _DROPPED:
                out.append(RoutesDropped(int.from_bytes(frames[1], "big")))
            elif kind == _HELLO:
                out.append(Hello(frames[1].decode(), int.from_bytes(frames[2], "big")))
            elif kind in (_UP, _DOWN):
                out.append(LinkChange(kind == _UP))
            else:
                if kind == RECORDS and self.poster is not None:
                    # Taken off the pipe: handled (written to the copy) before the next receive().
                    self.poster.consumed(sum(len(f) for f in frames))
                news = parse_inbound(frames)
                if news is not None:
                    out.append(news)
        return out

    def send(self, name: str, blob: bytes) -> None:
        """One route message to broker ``name`` (published by the link thread, in order)."""
        if self._down is not None:
            self._down.send_multipart((name.encode(), blob), NOBLOCK, copy=len(blob) < 65536)
            self.counters["sent"] += 1
            self.counters["sent_bytes"] += len(blob)

    def publish(self, journal: str, proposals: list[Any]) -> None:
        """A JetStream journal's proposals (``storage.replicated.Proposal``), to be published in order."""
        if self._down is not None:
            self._down.send_multipart(proposals_frames(journal, proposals), NOBLOCK)

    def call(self, token: int, request: dict[str, Any]) -> None:
        """A store call (consumers, mailboxes); its answer comes back as ``Answer``."""
        if self._down is not None:
            self._down.send_multipart(call_frames(token, request), NOBLOCK)

    # ------------------------------------------------------------ the link thread
    def _run(self, context: zmq.Context[Any]) -> None:
        try:
            asyncio.run(self._main(context))
        except Exception:  # pragma: no cover - a bug in the thread: say so, the broker carries on alone
            log.exception("cluster: the link thread failed; this broker now serves its own peers only")
            self.connected = False

    def _options(self) -> dict[str, Any]:
        return nats_options(self.config, f"mc0-broker-{self.name}")

    async def _main(self, context: zmq.Context[Any]) -> None:
        # nats-py, imported here so a standalone broker never loads it.
        from nats.aio.client import Client as Nats
        from nats.errors import SlowConsumerError

        actx = zmq.asyncio.Context.shadow(context)
        pair = actx.socket(zmq.PAIR)  # work from the loop (received on this asyncio loop)
        poster = context.socket(zmq.PAIR)  # what it posts to the loop (plain sends: no future each)
        for sock, end in ((pair, "down"), (poster, "up")):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.connect(f"{self._inproc}-{end}")
        self._started.set()
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()

        def send(frames: Sequence[bytes]) -> None:
            poster.send_multipart(frames, NOBLOCK)  # (no HWM: never waits)

        post = self.poster = Poster(send, counted=frozenset({_ROUTE}))
        inbox = wire.inbox(self.name)
        # Drops of route traffic are reported (RoutesDropped, which resyncs every route) only once
        # everything received before them has been posted: the resync then comes after it, in order.
        unreported, reported_at = 0, -DROP_NOTICE_S  # route messages dropped since the last notice, and when
        subs: dict[str, Any] = {}  # "route", "hello": the subscriptions (the route's pending: not posted yet)
        notice: list[asyncio.TimerHandle] = []
        # A route message in on_route's hands (taken off the subscription, not posted yet): it counts as
        # not posted, and it is dropped unposted if the link goes down meanwhile (``stale_in_hand``).
        in_hand = False
        stale_in_hand = False
        stale_queued = 0  # route messages still queued when the link went down: dropped unposted
        credit = asyncio.Event()
        other_drops = [0, -DROP_NOTICE_S]  # drops on other subscriptions (a JetStream inbox): count, last logged

        def report_drops() -> None:
            """One RoutesDropped for what was dropped since the last, once nothing received before
            waits in the subscription; at most one a second (a later one is scheduled, never skipped)."""
            nonlocal unreported, reported_at
            route = subs.get("route")
            if not unreported or notice or in_hand or (route is not None and route.pending_msgs):
                return  # (nothing to say, already scheduled, or on_route reports once the rest is posted)
            wait = reported_at + DROP_NOTICE_S - time.monotonic()
            if wait > 0:
                notice.append(loop.call_later(wait, scheduled_report))
                return
            count, unreported, reported_at = unreported, 0, time.monotonic()
            log.warning("cluster: %d route message(s) dropped (this broker fell behind); resyncing routes", count)
            post((_DROPPED, count.to_bytes(8, "big")))

        def scheduled_report() -> None:
            notice.clear()
            report_drops()

        def dropped(exc: SlowConsumerError) -> None:
            nonlocal unreported
            sub = exc.sub
            if sub is not None and sub is subs.get("route"):
                self.counters["route_dropped"] += 1
                unreported += 1
                report_drops()
            elif sub is not None and sub is subs.get("hello"):
                self.counters["beacons_dropped"] += 1  # (beacons repeat: nothing to heal)
            else:
                other_drops[0] += 1
                if time.monotonic() - other_drops[1] >= DROP_NOTICE_S:
                    count, other_drops[0], other_drops[1] = other_drops[0], 0, time.monotonic()
                    log.warning("cluster: NATS: %s (%d message(s) dropped)", exc, count)

        def wake_credit() -> None:  # (the broker loop's thread: consumed() freed the budget)
            try:
                loop.call_soon_threadsafe(credit.set)
            except RuntimeError:  # the link's loop has ended (closing): nobody waits any more
                pass

        async def on_hello(msg: Any) -> None:
            parsed = wire.parse_hello(msg.data)
            if parsed is None:
                self.counters["malformed"] += 1
                return
            name, epoch = parsed
            if name != self.name:
                post((_HELLO, name.encode(), epoch.to_bytes(8, "big")))

        async def on_route(msg: Any) -> None:
            try:
                await take_route(msg)
            finally:
                if unreported:  # (whatever became of this message: the report may be due now)
                    report_drops()

        async def take_route(msg: Any) -> None:
            nonlocal in_hand, stale_in_hand, stale_queued
            if stale_queued:  # received before the link went down: its routes are gone, their state resent
                stale_queued -= 1
                self.counters["route_stale_dropped"] += 1
                return
            parsed = wire.parse_route_message(msg.data)
            if parsed is None:
                self.counters["malformed"] += 1
                return
            sender, epoch, blob = parsed
            self.counters["received"] += 1
            if post.over:  # the loop is behind: wait for it (what arrives meanwhile waits in nats-py)
                self.counters["route_credit_waits"] += 1
                in_hand = True
                try:
                    while not stopping.is_set():
                        credit.clear()
                        if not post.arm(wake_credit):
                            break
                        try:
                            await asyncio.wait_for(credit.wait(), ROUTE_CREDIT_POLL_S)
                        except TimeoutError:
                            pass
                finally:
                    in_hand = False
                if stale_in_hand:
                    stale_in_hand = False
                    self.counters["route_stale_dropped"] += 1
                    return
            post((_ROUTE, sender.encode(), epoch.to_bytes(8, "big"), blob))

        async def on_disconnected() -> None:
            nonlocal stale_in_hand, stale_queued, unreported
            if self.connected:
                log.warning("cluster: lost NATS %s; serving local peers only until it is back", self.server)
            self.connected = False
            # What was received and not posted yet would reach the loop after DOWN, for routes it forgot.
            route = subs.get("route")
            stale_queued = route.pending_msgs if route is not None else 0
            stale_in_hand = in_hand
            # Drops before DOWN need no resync: DOWN forgets every route, and they open afresh after UP.
            unreported = 0
            for pending in notice:
                pending.cancel()
            notice.clear()
            post((_DOWN,))

        async def on_reconnected() -> None:
            self.counters["reconnects"] += 1
            if jetstream is not None:
                jetstream.reconnected()
            self.server = redacted(str(nc.connected_url.geturl())) if nc.connected_url else ""
            log.warning("cluster: NATS back at %s", self.server)
            self.connected = True
            post((_UP,))

        async def on_error(exc: Exception) -> None:
            if isinstance(exc, SlowConsumerError):  # one call per dropped message: counted, logged at most 1/s
                dropped(exc)
                return
            log.warning("cluster: NATS: %s", exc)

        nc = Nats()
        jetstream = (
            JetStreamPart(
                nc,
                post,
                self.streams,
                self.positions,
                broker=self.name,
                epoch=self.epoch,
                timeout_s=self.config.jetstream_timeout_ms / 1000.0,
            )
            if self.streams
            else None
        )
        self.jetstream = jetstream
        options = self._options()
        options.update(disconnected_cb=on_disconnected, reconnected_cb=on_reconnected, error_cb=on_error)

        async def connect() -> bool:
            while not stopping.is_set():
                try:
                    await asyncio.wait_for(nc.connect(**options), CONNECT_TIMEOUT_S * len(self.config.nats) + 1)
                    return True
                except Exception as exc:  # no server answers yet: try again (each failure is one line)
                    log.warning("cluster: no NATS server answers (%s); retrying", type(exc).__name__)
                    try:
                        await asyncio.wait_for(stopping.wait(), RETRY_S)
                    except TimeoutError:
                        pass
            return False

        async def beacons() -> None:
            hello = wire.hello(self.name, self.epoch)
            every = self.config.hello_ms / 1000.0
            while not stopping.is_set():
                if nc.is_connected:
                    try:
                        await nc.publish(wire.HELLO_SUBJECT, hello)
                    except Exception as exc:  # reconnecting: the next beacon will go
                        log.debug("cluster: beacon not sent: %s", exc)
                try:
                    await asyncio.wait_for(stopping.wait(), every)
                except TimeoutError:
                    pass

        async def outbound() -> None:
            while True:
                frames = await pair.recv_multipart(copy=True)
                if frames[0] == _STOP:
                    stopping.set()
                    return
                if frames[0] == OP_PUBLISH and jetstream is not None:
                    journal = frames[1].decode()
                    for token, subject, msgid, origin, payload in parse_proposals(frames[2], frames[3]):
                        await jetstream.publish(journal, token, subject, msgid, origin, payload)
                    continue
                if frames[0] == OP_CALL and jetstream is not None:
                    jetstream.call(int.from_bytes(frames[1], "big"), json.loads(frames[2]))
                    continue
                if not nc.is_connected and not nc.is_reconnecting:
                    continue  # never connected yet: routes cannot exist, nothing to deliver
                target, blob = frames[0].decode(), frames[1]
                try:
                    await nc.publish(wire.inbox(target), wire.route_message(self.name, self.epoch, blob))
                except Exception as exc:  # buffer full while reconnecting: the route is lost anyway
                    self.counters["dropped"] = self.counters.get("dropped", 0) + 1
                    log.debug("cluster: route message to %s dropped: %s", target, exc)

        sender = loop.create_task(outbound())
        ticker: asyncio.Task[None] | None = None
        try:
            if await connect():
                self.server = redacted(str(nc.connected_url.geturl())) if nc.connected_url else ""
                subs["hello"] = await nc.subscribe(
                    wire.HELLO_SUBJECT, cb=on_hello, pending_msgs_limit=BEACON_PENDING_MSGS
                )
                subs["route"] = await nc.subscribe(
                    inbox, cb=on_route, pending_msgs_limit=ROUTE_PENDING_MSGS, pending_bytes_limit=ROUTE_PENDING_BYTES
                )
                await nc.flush(int(CONNECT_TIMEOUT_S))
                self.connected = True
                log.info("cluster: connected to NATS %s", self.server)
                post((_UP,))
                ticker = loop.create_task(beacons())
                if jetstream is not None:
                    await jetstream.start()
            await stopping.wait()
        finally:
            self.connected = False
            for pending in notice:
                pending.cancel()
            if ticker is not None:
                ticker.cancel()
            if jetstream is not None:
                jetstream.stop()
            sender.cancel()
            if nc.is_connected:
                try:
                    await asyncio.wait_for(nc.flush(), CLOSE_FLUSH_S)
                except Exception:
                    pass
            try:
                await asyncio.wait_for(nc.close(), CLOSE_FLUSH_S)
            except Exception:
                pass
            pair.close(linger=0)
            poster.close(linger=0)
