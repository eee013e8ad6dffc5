"""The cluster link's shell: nats-py on the broker's own asyncio loop (or a thread), bridged by two in-memory queues.

Contract: the constructor does no I/O.  ``start(context, name, hosted=True)``
(a broker) prepares it, and ``host(wake)``, on the broker's running asyncio
loop, runs it there as a task: nothing crosses a thread per message, a post
calls ``wake`` (the broker's next turn) and the loop's work sets the link's
``Event``; ``stop_hosted()`` ends it (bounded).  ``start(context, name)``
alone starts a thread of its own instead (as the link's tests drive it), which
connects to the NATS servers of ``[cluster] nats`` (retrying every
``RETRY_S`` while none answers: a broker cut off from NATS keeps serving its
own peers), subscribes to the beacons and to this broker's inbox, and
publishes a beacon every ``hello_ms``.  The broker loop polls :attr:`socket`
(a file descriptor, readable once the thread posted something since the loop
last looked) and calls :meth:`receive`, which returns what arrived in order: what
:mod:`.posts` lists (``Hello``, ``RouteBlob``, ``LinkChange``,
``RoutesDropped``, ``RouteResync``) and what the JetStream part reports
(:mod:`mc0.broker.jetstream.streams`: ``Acks``, ``Failed``, ``StreamState``, ``Records``,
``Answer``), when journals are kept by JetStream.

The thread's work is split by concern, each an object of its own:
:class:`~.beacons.Beacons` (discovery and liveness),
:class:`~.inbound.RouteInbound` (this broker's inbox: chunks put together,
credit, drops), :class:`~.outbound.RouteSender` (what the loop hands over,
published within NATS's ``max_payload`` and a memory bound) and the
JetStream part; :class:`_LinkRun` wires them to one nats-py connection.

The hand-over, both ways, is a deque and at most one wake-up per batch: the
thread appends what it posts and writes one byte to a socket pair only when
the loop has not been told since it last looked; the loop appends its work
(route blobs, proposals, store calls) and wakes the thread's asyncio loop
(``call_soon_threadsafe``) only when it has not since the thread last looked.
A loop turn that hands several routes their blobs wakes the thread once.
(This replaced two inproc PAIR sockets, whose receive on the thread's asyncio
loop cost a zmq.asyncio future and callbacks per message: see
docs/PERFORMANCE.md, round 4.)

Memory, both ways.  In: records and route traffic taken by :meth:`receive`
are handed back as credit (:class:`.credit.Poster`): the caller handles them
before it calls again, so at most one call's worth is in its hands beyond
what the budget counts; while the budget is spent, route messages wait in
nats-py's subscription (``ROUTE_PENDING_BYTES``, ``ROUTE_PENDING_MSGS``);
past that nats-py drops them, counted (``route_dropped``) and reported as
``RoutesDropped``.  Out: :meth:`send` hands one route's blob to the thread;
the loop hands over no more while :attr:`backlog` (handed, not yet
published) is past ``SEND_BUDGET_BYTES`` (the route's queue keeps the rest,
within its own budget), and the thread keeps at most
``outbound.PENDING_BYTES`` in nats-py's buffer.

:meth:`publish` hands over a JetStream journal's proposals, :meth:`call` a
store call.  Nothing of the protocol is decided here:
:mod:`mc0.broker.core.routes` does that.  Credentials are never logged (URLs
are shown without them).  ``close()`` is idempotent: it flushes what NATS
still buffers (bounded), closes the connection and joins the thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
import ssl
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import zmq

from ...errors import ConfigError
from ...protocol import routes as wire
from ...protocol.linkframes import frame_number
from ...settings import ClusterConfig
from ..jetstream.linkpart import JetStreamPart
from ..jetstream.streams import (
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
from . import posts
from .beacons import Beacons
from .credit import Poster
from .inbound import DROP_NOTICE_S, Reassembly, Resyncs, RouteInbound
from .outbound import SEND_BUDGET_BYTES, RouteSender
from .posts import Hello, LinkChange, RouteBlob, RouteResync, RoutesDropped

log = logging.getLogger("mc0.broker")

__all__ = [
    "ClusterLink",
    "Hello",
    "Inbound",
    "LinkChange",
    "RouteBlob",
    "RouteResync",
    "RoutesDropped",
    "nats_options",
    "redacted",
    "tls_context",
]

RETRY_S = 1.0  # between initial connection attempts while no NATS server answers
CONNECT_TIMEOUT_S = 2.0
CLOSE_FLUSH_S = 1.0
# Route traffic the broker loop has not taken is bounded twice: in the pipe to the loop by the
# Poster's budget (the inbound waits for credit), and behind it in nats-py's subscription by these.
# Past them nats-py drops (NATS core is at most once) and the loop resyncs every route (RoutesDropped).
ROUTE_PENDING_MSGS = 64 * 1024  # route messages are batches (each below NATS's max_payload)
ROUTE_PENDING_BYTES = 64 * 1024 * 1024
# What the receiving side puts together from chunks: one record (a client's message, its route headers
# with it), at most one per sending broker, all of them within REASSEMBLY_BUDGET_BYTES (or twice a record).
RECORD_SLACK_BYTES = 64 * 1024
REASSEMBLY_BUDGET_BYTES = 64 * 1024 * 1024
_STOP = b"\x00stop"

Inbound = posts.RouteNews | StoreNews


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


def nats_options(config: ClusterConfig, client_name: str, *, reply_prefix: str = wire.REPLY_PREFIX) -> dict[str, Any]:
    """nats-py's connect options for ``[cluster]``: every server, reconnecting for ever, pings that leave
    a frozen server after about two, the credentials and TLS it names, and every reply subject under
    ``reply_prefix`` (the brokers' own ``mc0.>``, never ``_INBOX.>``: docs/SECURITY.md)."""
    options: dict[str, Any] = {
        "servers": list(config.nats),
        "name": client_name,
        "inbox_prefix": reply_prefix,
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
        self,
        config: ClusterConfig,
        *,
        epoch: int | None = None,
        streams: dict[str, StreamSpec] | None = None,
        max_record_bytes: int = 8 * 1024 * 1024 + RECORD_SLACK_BYTES,
    ) -> None:
        """``streams``: the JetStream journals' streams (none: no JetStream part); ``max_record_bytes``:
        the largest record put together from chunks (this broker's ``max_message_bytes`` and room for a
        route record's headers)."""
        self.config = config
        self.streams = streams or {}
        self.max_record_bytes = max_record_bytes
        self.positions: dict[str, tuple[int, str]] = {}  # journal -> (its local copy's next seq, stream made at)
        self.jetstream: JetStreamPart | None = None  # (the link thread's)
        # Milliseconds since the epoch, then 16 random bits: a broker's next start has a larger epoch,
        # so a late message of the run before is told from the new one (ordered as the clocks are).
        self.epoch = epoch if epoch is not None else (time.time_ns() // 1_000_000) << 16 | secrets.randbits(16)
        self.name = ""
        # Up: what the link thread posts (frames, oldest first), and the socket pair whose read end the
        # loop polls (``socket``); ``_posted``: a wake byte was written since the loop last looked.
        self.socket: int | None = None
        self._inbox: deque[Sequence[bytes]] = deque()
        self._posted = False
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        # Down: the loop's work for the thread, in order; ``_nudged``: its asyncio loop was woken since
        # it last looked; ``_nudge`` (given by the thread: ``attach``) wakes it.
        self._work: deque[tuple[bytes, ...]] = deque()
        self._nudged = False
        self._nudge: Callable[[], None] | None = None
        self.connected = False  # written by the link thread, read by the loop (a bool: atomic)
        # The brokers the loop has a route to (name -> epoch): only they may start a chunked record here.
        # Replaced whole by the loop (``set_routes``), never changed in place: the thread reads it as it is.
        self.routes: Mapping[str, int] = {}
        self.server = ""  # the NATS server in use, without credentials
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "sent",  # route blobs handed to the thread, and their bytes
                "sent_bytes",
                "route_messages_out",  # NATS messages published for them (split below max_payload) ...
                "route_chunks",  # ... of which chunks of a record too big for one
                "route_send_waits",  # times the sender waited for nats-py's buffer to drain (a slow server)
                "route_send_failed",  # blobs not sent whole (then that route resynced)
                "received",  # route blobs posted to the loop (whole, or put together from chunks)
                "route_chunks_in",
                "route_records_lost",  # records lost between chunks (then that route resynced)
                "route_chunks_stray",  # chunks of a record already lost
                "route_chunks_refused",  # chunks from a broker with no route here (a made-up name, one gone)
                "route_resyncs",  # RouteResync notices posted
                "malformed",
                "reconnects",
                "route_dropped",  # route messages nats-py dropped while the loop was behind (then resynced)
                "beacons_dropped",
                "route_credit_waits",  # route messages that waited for the loop to take what was posted
                "route_stale_dropped",  # received before the link went down, not posted after it
            ),
            0,
        )
        self.handed_bytes = 0  # route blobs' bytes handed to the thread (written by the loop) ...
        self.finished_bytes = 0  # ... and those it is done with, sent or not (written by the thread)
        self._thread: threading.Thread | None = None
        # What the thread posts, Records counted until receive() takes them (the feeds' credit:
        # JetStream's flow control is held while more than credit.FEED_BUDGET_BYTES wait).
        self.poster: Poster | None = None
        self._closed = False
        self._started = threading.Event()
        # Hosted (``start(..., hosted=True)``, a broker of a cluster): the link runs on the broker's own
        # asyncio loop, in its thread (``host``), and a post calls ``_on_post`` instead of writing a byte.
        self.hosted = False
        self._on_post: Callable[[], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._open = False  # started (a thread, or hosted): it takes work

    # ------------------------------------------------------------ lifecycle (the broker's thread)
    def start(
        self,
        context: zmq.Context[Any],
        name: str,
        positions: dict[str, tuple[int, str]] | None = None,
        *,
        hosted: bool = False,
    ) -> None:
        """``positions``: where each JetStream journal's local copy stands (its delivery starts there).
        ``hosted``: no thread; the broker runs the link on its own asyncio loop (``host``), which takes
        its posts without a wake-up byte (``waiting``)."""
        self.name = wire.check_name(name)
        self.positions = dict(positions or {})
        tls_context(self.config)  # a bad TLS file fails here, in one line, before anything runs
        shown = ", ".join(redacted(u) for u in self.config.nats)
        if hosted:
            self.hosted = self._open = True
            log.info("cluster: broker %s (epoch %016x) joining over NATS %s", self.name, self.epoch, shown)
            return
        # No bound on either queue here: the loop hands over no more than the send budget (``backlog``),
        # and what the thread posts is bounded by NATS's pending limits (route traffic) and the feeds'
        # credit (records).
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.socket = self._wake_r.fileno()
        self._open = True
        self._thread = threading.Thread(target=self._run, name="mc0-cluster", daemon=True)
        self._thread.start()
        self._started.wait(5.0)
        log.info("cluster: broker %s (epoch %016x) joining over NATS %s", self.name, self.epoch, shown)

    def host(self, wake: Callable[[], None]) -> asyncio.Task[None]:
        """(hosted: on the broker's running asyncio loop) Run the link there from now on; ``wake`` is called
        when it posts something while the loop was not told since it last looked (``receive``).  The
        task ends once ``stop_hosted`` asked it to (what NATS still buffers flushed, bounded)."""
        assert self.hosted and self._task is None
        self._on_post = wake
        self._task = asyncio.get_running_loop().create_task(self._main())
        self._task.add_done_callback(self._ended)
        return self._task

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:  # a bug: said, the broker carries on alone
            log.error("cluster: the link failed; this broker now serves its own peers only", exc_info=task.exception())
            self.connected = False

    async def stop_hosted(self) -> None:
        """(hosted, on the broker's loop) Stop the link: what NATS still buffers is flushed and the
        connection closed, within ``CLOSE_FLUSH_S`` each (bounded)."""
        task = self._task
        if task is None or task.done():
            return
        self._hand((_STOP,))
        try:
            await asyncio.wait_for(asyncio.shield(task), 2 * CLOSE_FLUSH_S + CONNECT_TIMEOUT_S + 1.0)
        except Exception as exc:  # (a link that does not stop in time is left: the broker is closing)
            log.warning("cluster: the link did not stop cleanly: %r", exc)
            task.cancel()

    @property
    def waiting(self) -> bool:
        """(hosted) The link posted something the loop has not taken yet."""
        return bool(self._inbox)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._open = False
        if self._task is not None and not self._task.done():
            try:
                self._task.cancel()  # (stop_hosted was not awaited: the loop is gone or going)
            except RuntimeError:  # (its loop is closed)
                pass
        if self._thread is not None:
            self._hand((_STOP,))
            self._thread.join(CLOSE_FLUSH_S + CONNECT_TIMEOUT_S + 1.0)
        for end in (self._wake_r, self._wake_w):
            if end is not None:
                end.close()
        self._wake_r = self._wake_w = None
        self.socket = None

    # ------------------------------------------------------------ the broker loop's side
    def receive(self, limit: int = 256, *, look: bool = True) -> list[Inbound]:
        """What the link thread passed on, oldest first (at most ``limit`` items a call; with more left,
        :attr:`socket` stays readable).  ``look=False``: a further call in the same loop turn, after one
        that looked: the wake-ups are left alone (that call made the socket readable if more was left),
        so taking items one at a time costs no system call each."""
        out: list[Inbound] = []
        if self.hosted:  # (no wake-up bytes: the loop was called instead)
            self._posted = False
            self._take(limit, out)
            if self._inbox:
                self._post_wake()  # (more than ``limit``: the loop looks again at once)
            return out
        wake = self._wake_r
        if wake is None:
            return out
        if not look:
            return self._take(limit, out)
        try:
            while wake.recv(4096):
                pass
        except OSError:  # (BlockingIOError: read empty)
            pass
        # After reading the wake-ups, before looking: whatever is posted from now on wakes the loop again
        # (cleared before reading, a wake-up written in between would be read, and the post after it lost).
        self._posted = False
        self._take(limit, out)
        if self._inbox:
            self._post_wake()  # (more than ``limit``: the loop looks again at once)
        return out

    def _take(self, limit: int, out: list[Inbound]) -> list[Inbound]:
        inbox = self._inbox
        for _ in range(limit):
            try:
                frames = inbox.popleft()
            except IndexError:
                break
            kind = frames[0]
            if (kind == posts.ROUTE or kind == RECORDS) and self.poster is not None:
                self.poster.consumed(sum(len(f) for f in frames))  # (handled before the next receive)
            item = posts.parse(frames) if kind in posts.KINDS else parse_inbound(frames)
            if item is not None:
                out.append(item)
        return out

    def post(self, frames: Sequence[bytes]) -> None:
        """(the link thread) One post for the loop; the loop is woken if it was not since it last looked."""
        self._inbox.append(frames)
        if not self._posted:
            self._post_wake()

    def _post_wake(self) -> None:
        self._posted = True
        if self.hosted:
            if self._on_post is not None:
                self._on_post()
            return
        end = self._wake_w
        if end is not None:
            try:
                end.send(b"x")
            except OSError:  # (its buffer is full: the loop has wake-ups waiting already)
                pass

    def _hand(self, frames: tuple[bytes, ...]) -> None:
        """(the loop) Work for the link thread, in order; its asyncio loop is woken if it was not since it
        last looked."""
        self._work.append(frames)
        if not self._nudged:
            self._nudged = True
            nudge = self._nudge
            if nudge is not None:  # (None: not running yet; it looks at the work when it starts)
                try:
                    nudge()
                except RuntimeError:  # its event loop has ended (closing)
                    pass

    # ------------------------------------------------------------ the link thread's side of the hand-over
    def attach(self, nudge: Callable[[], None]) -> None:
        """(the link thread) Its run is wired: the loop's work now wakes it with ``nudge``, and ``start``
        stops waiting."""
        self._nudge = nudge
        self._started.set()

    def detach(self) -> None:
        """(the link thread) Its run has ended: work handed from now on waits for the next run."""
        self._nudge = None

    def watch_work(self) -> None:
        """(the link thread) About to look at the work: whatever is handed after this wakes it again."""
        self._nudged = False

    def next_work(self) -> tuple[bytes, ...] | None:
        """(the link thread) The oldest work the loop handed over and the thread has not taken, or None."""
        work = self._work
        return work.popleft() if work else None

    @property
    def backlog(self) -> int:
        """Bytes of route blobs handed to the thread and not yet published (or given up)."""
        return self.handed_bytes - self.finished_bytes

    @property
    def send_budget(self) -> int:
        return SEND_BUDGET_BYTES

    def send(self, name: str, blob: bytes) -> None:
        """One route blob to broker ``name`` (published by the link thread, in order, in as many NATS
        messages as it takes).  The caller hands over no more while ``backlog`` is past ``send_budget``."""
        if self._open:
            self._hand((name.encode(), blob))
            self.handed_bytes += len(blob)
            self.counters["sent"] += 1
            self.counters["sent_bytes"] += len(blob)

    def set_routes(self, routes: Mapping[str, int]) -> None:
        """The brokers the loop now has a route to (name -> epoch), for the thread's reassembly."""
        self.routes = dict(routes)

    def publish(self, journal: str, proposals: list[Any]) -> None:
        """A JetStream journal's proposals (``jetstream.replicated.Proposal``), to be published in order."""
        if self._open:
            self._hand(tuple(proposals_frames(journal, proposals)))

    def call(self, token: int, request: dict[str, Any]) -> None:
        """A store call (consumers, mailboxes); its answer comes back as ``Answer``."""
        if self._open:
            self._hand(tuple(call_frames(token, request)))

    def count_finished(self, size: int) -> None:
        """(the link thread) ``size`` bytes of route blobs it is done with, sent or given up (``backlog``)."""
        self.finished_bytes += size

    # ------------------------------------------------------------ the link thread
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:  # pragma: no cover - a bug in the thread: say so, the broker carries on alone
            log.exception("cluster: the link thread failed; this broker now serves its own peers only")
            self.connected = False

    async def _main(self) -> None:
        await _LinkRun(self).main()  # (made on the thread's running loop: its parts need it)

    def connect_options(self) -> dict[str, Any]:
        """nats-py's ``connect`` options for this broker's link (its name, TLS, credentials, inbox prefix)."""
        return nats_options(self.config, f"mc0-broker-{self.name}", reply_prefix=wire.reply_prefix(self.name))


class _LinkRun:
    """One run of the link thread: its ends of the pipes, one nats-py connection and the parts that use it
    (beacons, the inbox, the sender, JetStream), wired together; ``main()`` runs until ``close()``."""

    def __init__(self, link: ClusterLink) -> None:
        # nats-py, imported here so a standalone broker never loads it.
        from nats.aio.client import Client as Nats
        from nats.errors import SlowConsumerError

        self.slow_consumer = SlowConsumerError
        self.link = link
        self.counters = link.counters
        self.stopping = asyncio.Event()
        self.work_ready = asyncio.Event()  # the loop handed work (set through call_soon_threadsafe)
        loop = asyncio.get_running_loop()
        self.post = link.poster = Poster(link.post, counted=frozenset({posts.ROUTE, RECORDS}))
        self.nc = Nats()
        self.resyncs = Resyncs(self.post, self.counters)
        budget = max(REASSEMBLY_BUDGET_BYTES, 2 * link.max_record_bytes)
        reassembly = Reassembly(
            self.counters, max_record=link.max_record_bytes, budget=budget, route_epoch=lambda n: link.routes.get(n)
        )
        self.inbound = RouteInbound(self.post, self.counters, self.resyncs, reassembly, self.stopping)
        self.sender = RouteSender(
            self.nc,
            link.name,
            link.epoch,
            self.counters,
            resync=self.resyncs.ask,
            finished=link.count_finished,
            stopping=self.stopping,
        )
        every = link.config.hello_ms / 1000.0
        self.beacons = Beacons(
            self.nc,
            link.name,
            link.epoch,
            every,
            self.post,
            self.counters,
            stopping=self.stopping,
            tick=self.inbound.expire,  # (records under way that stopped coming: lost)
        )
        self.jetstream = link.jetstream = (
            JetStreamPart(
                self.nc,
                self.post,
                link.streams,
                link.positions,
                broker=link.name,
                epoch=link.epoch,
                timeout_s=link.config.jetstream_timeout_ms / 1000.0,
            )
            if link.streams
            else None
        )
        self.other_drops = [0, -DROP_NOTICE_S]  # drops on other subscriptions (a JetStream inbox): count, logged
        ready = self.work_ready

        def nudge() -> None:  # (the broker loop's thread)
            loop.call_soon_threadsafe(ready.set)

        link.attach(ready.set if link.hosted else nudge)  # (hosted: the same thread, the same loop)

    async def main(self) -> None:
        loop = asyncio.get_running_loop()
        sender = loop.create_task(self._outbound())
        ticker: asyncio.Task[None] | None = None
        try:
            if await self._connect():
                await self._subscribe()
                self.link.connected = True
                log.info("cluster: connected to NATS %s", self.link.server)
                self.post((posts.UP,))
                ticker = loop.create_task(self.beacons.run())
                if self.jetstream is not None:
                    await self.jetstream.start()
            await self.stopping.wait()
        finally:
            self.link.connected = False
            self.inbound.stop()
            if ticker is not None:
                ticker.cancel()
            if self.jetstream is not None:
                self.jetstream.stop()
            sender.cancel()
            await self._close()

    async def _connect(self) -> bool:
        options = self.link.connect_options()
        options.update(
            disconnected_cb=self._on_disconnected, reconnected_cb=self._on_reconnected, error_cb=self._on_error
        )
        attempt_s = CONNECT_TIMEOUT_S * len(self.link.config.nats) + 1
        while not self.stopping.is_set():
            try:
                await asyncio.wait_for(self.nc.connect(**options), attempt_s)
                self.link.server = self._server()
                return True
            except Exception as exc:  # no server answers yet: try again (each failure is one line)
                log.warning("cluster: no NATS server answers (%s); retrying", type(exc).__name__)
                try:
                    await asyncio.wait_for(self.stopping.wait(), RETRY_S)
                except TimeoutError:
                    pass
        return False

    async def _subscribe(self) -> None:
        await self.beacons.subscribe()
        self.inbound.subscription = await self.nc.subscribe(
            wire.inbox(self.link.name),
            cb=self.inbound.on_message,
            pending_msgs_limit=ROUTE_PENDING_MSGS,
            pending_bytes_limit=ROUTE_PENDING_BYTES,
        )
        await self.nc.flush(int(CONNECT_TIMEOUT_S))

    def _server(self) -> str:
        url = self.nc.connected_url
        return redacted(str(url.geturl())) if url else ""

    async def _outbound(self) -> None:
        """The loop's work, in order: route blobs, JetStream proposals and store calls, until STOP."""
        jetstream = self.jetstream
        link = self.link
        while True:
            link.watch_work()  # (before looking: whatever is handed after this wakes it again)
            while (frames := link.next_work()) is not None:
                op = frames[0]
                if op == _STOP:
                    self.stopping.set()
                    return
                if op == OP_PUBLISH and jetstream is not None:
                    journal = frames[1].decode()
                    for token, subject, msgid, origin, payload in parse_proposals(frames[2], frames[3]):
                        await jetstream.publish(journal, token, subject, msgid, origin, payload)
                elif op == OP_CALL and jetstream is not None:
                    jetstream.call(frame_number(frames[1]), json.loads(frames[2]))
                elif op not in (OP_PUBLISH, OP_CALL):
                    await self.sender.send(op.decode(), frames[1])
            await self.work_ready.wait()
            self.work_ready.clear()

    # ------------------------------------------------------------ nats-py's callbacks
    async def _on_disconnected(self) -> None:
        if self.link.connected:
            log.warning("cluster: lost NATS %s; serving local peers only until it is back", self.link.server)
        self.link.connected = False
        self.inbound.disconnected()
        self.post((posts.DOWN,))

    async def _on_reconnected(self) -> None:
        self.counters["reconnects"] += 1
        if self.jetstream is not None:
            self.jetstream.reconnected()
        self.link.server = self._server()
        log.warning("cluster: NATS back at %s", self.link.server)
        self.link.connected = True
        self.post((posts.UP,))

    async def _on_error(self, exc: Exception) -> None:
        if not isinstance(exc, self.slow_consumer):
            log.warning("cluster: NATS: %s", exc)
            return
        # One call per dropped message: counted, logged at most once a second.
        sub = exc.sub
        if sub is not None and sub is self.inbound.subscription:
            self.inbound.dropped()
        elif sub is not None and sub is self.beacons.subscription:
            self.beacons.dropped()  # (beacons repeat: nothing to heal)
        else:
            self.other_drops[0] += 1
            if time.monotonic() - self.other_drops[1] >= DROP_NOTICE_S:
                count, self.other_drops[0], self.other_drops[1] = self.other_drops[0], 0, time.monotonic()
                log.warning("cluster: NATS: %s (%d message(s) dropped)", exc, count)

    async def _close(self) -> None:
        nc = self.nc
        if nc.is_connected:
            try:
                await asyncio.wait_for(nc.flush(), CLOSE_FLUSH_S)
            except Exception:
                pass
        try:
            await asyncio.wait_for(nc.close(), CLOSE_FLUSH_S)
        except Exception:
            pass
        self.link.detach()
