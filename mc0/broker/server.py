"""Broker: the ROUTER socket and poller loop around :class:`mc0.broker.core.dispatch.BrokerCore`.

Contract: the constructor does no I/O; ``bind()`` loads (or on first start
creates) the broker's CURVE keypair, loads the allowed-keys folder, starts
the ZAP handler *before* binding, and returns the real endpoints
(``tcp://127.0.0.1:*`` picks a free port); ``run()`` loops until ``stop()``
(thread-safe, also wired to SIGINT/SIGTERM when run in the main thread), then
DISCONNECTs every peer and closes.  SIGHUP, or any change in the allowed
folder (checked every ``reload_ms``), reloads keys and permissions: revoked
identities are cut off at once.  All protocol decisions are the core's; this
file only reads the clock and the authenticated identity of each message,
receives in batches and performs the sends the core returns.

Journals (``[journals.NAME]``) are opened (and recovered) by ``bind()``; after
every receive batch the loop calls ``core.commit()``, which writes the batch's
appends once (group commit) and returns the OKs of what is stored at each
journal's fsync level.  A ``batch`` journal's fsync runs on its own thread
(:mod:`.storage.syncer`), which wakes the loop when done: the loop serves
peers meanwhile, its live deliveries go out once written (never before), and
the OKs the fsync covers go at the next commit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import zmq

from .. import keys as keyfiles
from ..config import Config, check_stores, load
from ..errors import ConfigError
from ..protocol import ANONYMOUS
from ..protocol.peernames import first_serial
from ..security import AllowedKeys, ZapHandler, configure_server
from ..settings import BrokerConfig, HttpConfig
from . import listeners as listening
from .cluster.link import ClusterLink
from .core import admin
from .core.dispatch import BrokerCore, Out
from .dialects import recognise as recognise_dialect
from .dialects.memodb import with_memodb_identity
from .faultlog import FaultLog
from .jetstream.replicated import Proposal, ReplicatedJournal
from .listeners import ClusterListener, NngListener
from .loop import AsyncTurns, SocketLoop, router_io
from .memtrim import Trimmer
from .monitoring.httpd import MonitorServer
from .monitoring.snapshot import capture
from .outbox import GROUP_SKIP_BYTES, HOLD_LIMIT, Outbox
from .sender import Sender
from .storage.filestore import Journal

log = logging.getLogger("mc0.broker")

RECV_HWM = 128  # messages libzmq holds per peer before the broker reads them
# While the input is held (back-pressure), how often the loop looks whether it still is.
HOLD_RECHECK = 0.01
# The loop copies at most one monitoring capture per this many seconds (a scrape storm's cost) ...
SNAPSHOT_INTERVAL = 0.02
# ... and, after one, waits this many times what monitoring cost since (its copy on the loop, and the
# HTTP side's building and rendering, which hold the same interpreter): monitoring takes at most about
# 1 / (1 + SNAPSHOT_COST_RATIO) of the broker's time whatever the number of scrapers or rows ...
SNAPSHOT_COST_RATIO = 19
# ... but never longer than this (a request waits at most SNAPSHOT_WAIT for its capture).  The budget is
# for captures that copy rows (peers, patterns, consumers, mailboxes); one that copies none (/varz,
# /healthz, /servicez, /journalz: counters, services and journals) is taken at SNAPSHOT_INTERVAL.
SNAPSHOT_MAX_INTERVAL = 0.4
LINGER_MS = 500
# A batch sent to a peer holds at most this (more waiting goes in the next one).
BATCH_OUT_BYTES = 256 * 1024


def raise_fd_limit(wanted: int = 65_536) -> int:
    """Raise this process's open-files soft limit toward the hard limit (one fd per peer)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft


def open_journals(
    config: Config, sink: Callable[[str, list[Proposal]], None] | None, wake: Callable[[], None]
) -> list[Journal | ReplicatedJournal]:
    """The configured journals, by name: a JetStream one proposes through ``sink`` (the cluster link);
    a file journal's fsync (fsync = "batch") runs on its sync thread, which calls ``wake`` when done."""
    return [
        ReplicatedJournal(name, settings, sink=sink) if settings.replicated else Journal(name, settings, on_synced=wake)
        for name, settings in sorted(config.journals.items())
    ]


def outbox_for(cfg: BrokerConfig) -> Outbox:
    """The peers' outgoing queues by ``[broker]``'s budgets; a reader may hold the input
    (back-pressure) for at most half the time a slow consumer is given."""
    hold_limit = min(HOLD_LIMIT, max(1.0, cfg.slow_consumer_ms / 2000)) if cfg.slow_consumer_ms else HOLD_LIMIT
    return Outbox(
        max_bytes=cfg.max_queue_bytes,
        max_messages=cfg.max_queue_messages,
        batch_bytes=BATCH_OUT_BYTES,
        hold_limit=hold_limit,
    )


def monitor_server(http: HttpConfig, wake: Callable[[], None]) -> MonitorServer | None:
    """The monitoring listener ``[http]`` asks for (None: not listening); its thread starts in ``run``."""
    if not http.listen:
        return None
    return MonitorServer(
        http.listen,
        wake=wake,
        admin_token_file=http.admin_token_file,
        allowed_hosts=http.allowed_hosts,
        faults=FaultLog("the monitoring listener"),
    )


class Broker:
    def __init__(
        self,
        config: Config | None = None,
        *,
        config_path: str | None = None,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        self.config = check_stores(config or Config())  # (a ConfigError: a JetStream journal needs [cluster] nats)
        self.config_path = config_path  # re-read for permissions on reload
        # MemoDB over NNG, the other brokers of a cluster over NATS: each with its own thread and socket.
        self.listeners = listening.configured(self.config)
        self.nng = next((x.bridge for x in self.listeners if isinstance(x, NngListener)), None)
        self.cluster = next((x for x in self.listeners if isinstance(x, ClusterListener)), None)
        # A JetStream journal: the stream is the truth, this broker keeps a local copy to read from; what
        # the core proposes goes to JetStream through the cluster link at each commit.
        sink = self.cluster.link.publish if self.cluster is not None else None
        self.journals = open_journals(self.config, sink, self._wake)
        cfg = self.config.broker
        self.outbox = outbox_for(cfg)
        self.core = BrokerCore(
            self.config.broker,
            with_memodb_identity(self.config.permissions, self.config.memodb.identity),
            journals=self.journals,
            wall_offset=time.time() - time.monotonic(),
            dialects=recognise_dialect,
            backlog=self.outbox.backlog,
            # A queue-group member whose queue holds more than this is skipped while another can take it.
            group_skip_bytes=min(cfg.max_queue_bytes // 4, GROUP_SKIP_BYTES),
            first_serial=first_serial(time.time()),  # (names of an earlier run never repeat)
        )
        self.sender = Sender(self.core, self.outbox, self.listeners)
        self.trimmer = Trimmer()  # (heap pages freed by evicted queues go back to the OS)
        self._given_context = context
        self._context: zmq.Context[Any] | None = None
        self._socket: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._stopping = False  # (a bool, read once a turn: stop() sets it from any thread, then wakes the loop)
        self._reload_asked = False
        self._reload_errors: dict[str, str] = {}  # keys / config -> why its last reload failed (logged once)
        self._closed = False
        self.allowed: AllowedKeys | None = None
        self.zap: ZapHandler | None = None
        self.public_key: bytes | None = None
        self.endpoints: list[str] = []
        # Monitoring ([http] / --http): served by its own thread from snapshots this loop publishes.
        self.http = monitor_server(self.config.http, self._wake)
        self._loop: SocketLoop | None = None  # the loop's sockets, once run() bound them
        self._next_reload = 0.0  # when the allowed folder is looked at next (run() sets it)
        self._next_snapshot = 0.0  # the loop takes no capture before this (SNAPSHOT_INTERVAL) ...
        self._next_rows = 0.0  # ... and none that copies rows before this (the budget)
        self._http_spent_seen = 0.0  # the HTTP side's running ``spent`` at the last capture that copied rows
        # core.next_deadline() as the last turn's timers read it, with sender.applied then: the next
        # turn reuses it while nothing was applied since (asking costs ~11k instructions, 6% of a turn).
        self._deadline: tuple[float, int] | None = None
        self._timer_faults = FaultLog("the broker's timer work")  # (a step raising every turn: one traceback)
        self._started = time.monotonic()

    # ------------------------------------------------------------ lifecycle
    def _broker_keys(self) -> keyfiles.KeyPair:
        security = self.config.security
        path = keyfiles.resolve(security.broker_key, security.keys_dir, keyfiles.SECRET_SUFFIX)
        if not path.exists() and path.parent == Path(security.keys_dir) and path.name.endswith(keyfiles.SECRET_SUFFIX):
            name = path.name[: -len(keyfiles.SECRET_SUFFIX)]
            keyfiles.create(security.keys_dir, name)
            log.warning("created the broker keypair %s (clients need %s%s)", path, name, keyfiles.PUBLIC_SUFFIX)
        return keyfiles.load_secret(path)

    def bind(self) -> list[str]:
        """Set up security, create the ROUTER socket and bind every configured endpoint."""
        if self._socket is not None:
            return self.endpoints
        raise_fd_limit()  # every peer connection is a file descriptor
        for journal in self.journals:
            journal.open()  # recovers a torn tail; an unreadable folder raises before any bind
            log.info("journal %s: %s, seq %d..%d", journal.name, journal.folder, journal.first_seq, journal.next_seq)
        self.core.restore(time.monotonic())  # kept letters come back from the journal that keeps mailboxes
        cfg = self.config.broker
        security = self.config.security
        if security.curve:
            broker_keys = self._broker_keys()  # KeyFileError names the file
            self.public_key = broker_keys.public
            self.allowed = AllowedKeys(security.allowed_dir, keys_dir=security.keys_dir)  # names refused keys
            self.allowed.load(strict=True)
        # A private context: the ZAP endpoint is per context, so brokers in one process stay apart.
        self._context = self._given_context or zmq.Context()
        if security.curve:
            self.zap = ZapHandler(self._context, self.allowed)  # type: ignore[arg-type]
            self.zap.start()  # before bind: no handshake can happen without it
        else:
            log.warning("CURVE is OFF (--insecure): anyone who reaches the port is admitted as %r", ANONYMOUS)
        sock = self._context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # HWM and gone peers raise instead of dropping silently
        sock.setsockopt(zmq.SNDHWM, cfg.send_hwm)
        # Inbound per peer: a publisher that outpaces the broker waits in its own buffer (back-pressure)
        # instead of parking up to 1,000 batches (256 MB) here.
        sock.setsockopt(zmq.RCVHWM, RECV_HWM)
        sock.setsockopt(zmq.MAXMSGSIZE, cfg.limits.max_frame_bytes)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        if security.curve:
            configure_server(sock, broker_keys)
        try:
            for endpoint in cfg.bind:
                sock.bind(endpoint)
                self.endpoints.append(sock.getsockopt_string(zmq.LAST_ENDPOINT))
        except zmq.ZMQError:
            sock.close(linger=0)
            self.endpoints.clear()
            self._release_context()
            raise
        self._socket = sock
        # Connection closes, so a vanished peer's session goes at once (not after liveness x TTL).
        self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        if self.http is not None:
            self.http.start()  # ConfigError (names http.listen) when the port is taken
        for listener in self.listeners:
            listener.start(self._context, self.endpoints, self.core)  # ConfigError naming its key
        return self.endpoints

    def _wake(self) -> None:
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass

    def stop(self) -> None:
        """Ask ``run`` to finish (any thread, or a signal handler)."""
        self._stopping = True
        self._wake()

    def reload(self) -> None:
        """Ask ``run`` to re-read keys and permissions now (any thread, or SIGHUP)."""
        self._reload_asked = True
        self._wake()

    def _release_context(self) -> None:
        if self.zap is not None:
            self.zap.stop()
        if self._context is not None and self._given_context is None:
            self._context.term()
        self._context = None

    def close(self) -> None:
        """Release sockets and the context (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.http is not None:
            self.http.close()
        for listener in self.listeners:
            listener.close()
        if self._monitor is not None:
            if self._socket is not None:
                self._socket.disable_monitor()
            self._monitor.close(linger=0)
        if self._socket is not None:
            self._socket.close()
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        for journal in self.journals:
            try:
                journal.close()
            except OSError as exc:
                log.error("journal %s: close failed: %s", journal.name, exc)
        self._release_context()

    def __enter__(self) -> Broker:
        self.bind()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.close()

    # ------------------------------------------------------------ loop
    def run(self, *, install_signals: bool = True) -> None:
        """Serve until stopped; then DISCONNECT peers and close.  A broker of a cluster serves on an asyncio
        loop that runs its cluster link too (``AsyncTurns``); any other polls its sockets (``_serve``)."""
        self.bind()
        sock = self._socket
        assert sock is not None and self._wake_r is not None and self._monitor is not None
        previous = self._install_signals() if install_signals else {}
        try:
            io = router_io(sock, self._wake_r, self._monitor, self.listeners, self.zap)
            wake, monitor = self._wake_r, self._monitor
            loop = SocketLoop(
                self.core, self.sender, io, wake=wake, monitor=monitor, listeners=self.listeners, zap=self.zap
            )
            self._loop = loop
            self._next_reload = time.monotonic() + self.config.security.reload_ms / 1000.0
            if self.cluster is not None:
                asyncio.run(self._serve_hosting(loop, self.cluster.link))
            else:
                self._serve(loop)
                self._finish(loop)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.close()
            log.info("broker stopped")

    @property
    def bytes_in(self) -> int:
        """Message body bytes received (for /varz and /metrics)."""
        return self._loop.bytes_in if self._loop is not None else 0

    def _serve(self, loop: SocketLoop) -> None:
        """The loop, one turn at a time until stopped: wait for input or the next deadline, then the turn."""
        holding_input = self.sender.holding_input
        while not self._stopping:
            start = time.monotonic()
            held = holding_input(start)
            self._turn(loop, loop.wait(self._poll_timeout(start, held), held), held)

    async def _serve_hosting(self, loop: SocketLoop, link: ClusterLink) -> None:
        """The turns as callbacks of this thread's asyncio loop, which runs the cluster link's nats-py
        too; once stopped, the last turn's output and the link's flushed (bounded), in that order."""
        turns = AsyncTurns(
            loop,
            lambda ready, held: self._turn(loop, ready, held),
            holding=self.sender.holding_input,
            timeout=self._poll_timeout,
            stopping=lambda: self._stopping,
        )
        link.host(turns.wake)
        try:
            await turns.run()
            self._finish(loop)
        finally:
            await link.stop_hosted()

    def _finish(self, loop: SocketLoop) -> None:
        """Stopped: every peer told (DISCONNECT), the last appends committed, all of it sent."""
        now = time.monotonic()
        self.sender.apply(self.core.shutdown(now), now)
        if self.core.uncommitted:
            self.sender.apply(self.core.commit(), time.monotonic())
        loop.flush(time.monotonic())

    def _turn(self, loop: SocketLoop, ready: int, held: bool) -> None:
        """One turn after the wait: read what is ready, do the timer work, send what is queued."""
        loop.read(ready, held)
        now = time.monotonic()
        if self._reload_asked or (self.allowed is not None and now >= self._next_reload):
            self._guarded(self._reload, now)
            self._next_reload = now + self.config.security.reload_ms / 1000.0
        self._guarded(self._timers, now)
        outbox = self.outbox
        if outbox.refusing:  # (gates read as attributes: the idle turn's fixed cost is its calls)
            self.sender.evict_stuck(now, self.config.broker.slow_consumer_ms)
        loop.flush(now)
        trimmer = self.trimmer
        if outbox.discarded_bytes >= trimmer.worth_from and trimmer.maybe_trim(outbox.discarded_bytes, now):
            self.core.counters["heap_trims"] += 1
        http = self.http
        if http is not None and http.wanted and now >= self._next_capture(http):
            self._deadline = None  # (monitoring asks the core things: its deadline is asked again)
            self._publish_snapshot(http)

    def _poll_timeout(self, start: float, held: bool) -> int:
        """How long this turn may wait for input (ms): until the core's next deadline, a reload, a
        retry of a send, the next look at held input or the next snapshot asked for; no wait at all
        while batches are left to walk on (only a look at the sockets), else at least 1 ms (never a
        busy loop) and at most a second."""
        core = self.core
        # The deadline the last turn's timers read holds while nothing was applied since (no input
        # handled, nothing sent): asking the core again costs ~11k instructions a turn.
        known = self._deadline
        deadline = known[0] if known is not None and known[1] == self.sender.applied else core.next_deadline()
        if self.allowed is not None:
            deadline = min(deadline, self._next_reload)
        retry = self.outbox.next_retry()
        if retry is not None:
            deadline = min(deadline, retry)
        if held:
            deadline = min(deadline, start + HOLD_RECHECK)
        elif core.unfinished:
            return 0
        if any(listener.unfinished for listener in self.listeners):  # (route traffic left for this turn)
            return 0
        if self.http is not None and self.http.wanted:
            deadline = min(deadline, self._next_capture(self.http))
        wait_ms = max(0.0, (deadline - time.monotonic()) * 1000.0)
        return int(min(wait_ms, 1000.0)) + 1

    def _timers(self, now: float) -> None:
        """The timer work of a loop turn, each step under its own guard: a step that raises (a bug)
        is logged and counted and costs itself only (a broken replay never holds back the OKs
        the commit releases)."""
        self._deadline = None
        for step in (self._admin_asked, self._listeners_turn, self._tick, self._pages, self._commit, self._admin_done):
            self._guarded(step, now)

    def _admin_asked(self, now: float) -> None:
        """The admin actions the monitoring listener took (before the listeners' turn: a store call
        they make goes out now)."""
        door = self.http.admin if self.http is not None else None
        if door is not None and door.waiting:
            for ticket, op, args, who in door.take():
                self.sender.apply(admin.http_call(self.core.rooms, ticket, op, args, who, now), now)

    def _listeners_turn(self, now: float) -> None:
        for listener in self.listeners:
            self.sender.apply(listener.turn(self.core, now), now)

    def _tick(self, now: float) -> None:
        core = self.core
        deadline = core.next_deadline()
        if now >= deadline:
            self.sender.apply(core.tick(now), now)
            deadline = core.next_deadline()  # (the tick moved it)
        if not core.paging:  # (a page moves its own deadline)
            self._deadline = (deadline, self.sender.applied)

    def _pages(self, now: float) -> None:
        """A page of every replay and fetch under way."""
        if self.core.paging:
            self._deadline = None
            self.sender.queue_pages(self.core.pages(now), now)

    def _commit(self, now: float) -> None:
        """The turn's appends made durable, and the OKs they held released."""
        if self.core.uncommitted:
            self.sender.apply(self.core.commit(), now)
            if self._deadline is not None:  # (a commit is an apply that changes no deadline)
                self._deadline = (self._deadline[0], self.sender.applied)

    def _admin_done(self, now: float) -> None:
        """The answers owed to the monitoring listener's admin actions."""
        door = self.http.admin if self.http is not None else None
        desk = self.core.builtins.admin
        if door is not None and desk.http_answers:
            for ticket, status, body in desk.take_http_answers():
                door.answer(ticket, status, body)

    def _guarded(self, work: Any, now: float) -> None:
        """Timer work (a tick, a page of each replay and fetch, a commit ...) that raises is logged and
        counted, never fatal; one raising every turn writes its traceback once, then a line a minute
        (:mod:`.faultlog`)."""
        try:
            work(now)
        except Exception as exc:
            self.core.counters["internal_errors"] += 1
            if not self._timer_faults.fault(getattr(work, "__name__", "a step"), exc, now):
                self.core.counters["log_lines_left_out"] += 1

    def _next_capture(self, http: MonitorServer) -> float:
        """When the next capture may be taken: one that copies rows within the budget, at once
        (SNAPSHOT_INTERVAL) for the pages that need none."""
        return max(self._next_snapshot, self._next_rows) if http.wanted_parts else self._next_snapshot

    def _publish_snapshot(self, http: MonitorServer) -> None:
        """Copy what the waiting requests' pages need (a ``Capture``: the HTTP side builds the pages),
        and set when the next may be taken: monitoring's cost since the last, times
        ``SNAPSHOT_COST_RATIO``, within ``SNAPSHOT_INTERVAL`` .. ``SNAPSHOT_MAX_INTERVAL``."""
        started = time.perf_counter()
        now = time.monotonic()
        parts = http.wanted_parts
        self.core.monitoring(now)  # (JetStream's consumer figures, asked now and then, show in a later one)
        try:
            copied = capture(
                self.core,
                self.outbox,
                parts,
                now=now,
                started=self._started,
                wall=time.time(),
                in_bytes=self.bytes_in,
                cluster=self.cluster.status(self.core, now) if self.cluster is not None else None,
            )
        except Exception:
            self.core.counters["internal_errors"] += 1
            log.exception("internal error copying the monitoring capture")
            self._next_snapshot = now + SNAPSHOT_INTERVAL
            return
        http.publish(copied)
        self._next_snapshot = now + SNAPSHOT_INTERVAL
        if parts:  # (what the HTTP side spent building and rendering counts in the budget of the next)
            http_spent = http.spent  # (a running total: what it grew by since the last capture is the HTTP side's)
            spent = time.perf_counter() - started + http_spent - self._http_spent_seen
            self._http_spent_seen = http_spent
            self._next_rows = now + min(SNAPSHOT_MAX_INTERVAL, max(SNAPSHOT_INTERVAL, spent * SNAPSHOT_COST_RATIO))

    def _reload(self, now: float) -> None:
        """Re-read the allowed folder (and the config's permissions); apply the difference.

        A reload never stops the broker: whatever cannot be read (a broken
        config, an unreadable folder) leaves what is in force as it is, and
        one line says why (once per distinct reason)."""
        asked, self._reload_asked = self._reload_asked, False
        if asked:
            self.core.counters["reloads"] += 1
        out: list[Out] = []
        if self.allowed is not None and (asked or self.allowed.changed()):
            try:
                revoked = self.allowed.load(strict=False)
            except Exception as exc:  # (an OSError, or anything a broken folder makes of the loader)
                self._reload_failed("keys", f"keys not reloaded (those in force stay): {self.allowed.folder}: {exc}")
            else:
                self._reload_errors.pop("keys", None)
                self.core.allow(self.allowed.identities)
                if revoked:
                    log.warning("keys revoked: %s", ", ".join(sorted(revoked)))
                    out += self.core.revoke(revoked, now)
            asked = True
        if asked and self.config_path:
            try:
                fresh = load(self.config_path)
                permissions = with_memodb_identity(fresh.permissions, self.config.memodb.identity)
            except Exception as exc:  # ConfigError, or anything else: the configuration in force stays
                reason = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
                self._reload_failed("config", f"configuration not reloaded (the one in force stays): {reason}")
            else:
                self._reload_errors.pop("config", None)
                self.config = dataclasses.replace(self.config, permissions=fresh.permissions)
                out += self.core.set_permissions(permissions, now)
        if out:
            self.sender.apply(out, now)

    def _reload_failed(self, what: str, line: str) -> None:
        self.core.counters["reload_failed"] += 1
        line = " ".join(line.split())[:500]  # one line, bounded
        if self._reload_errors.get(what) != line:  # a folder checked every reload_ms says it once
            self._reload_errors[what] = line
            log.error("%s", line)

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_stop(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: shutting down", signum)
            self.stop()

        def on_hup(signum: int, frame: FrameType | None) -> None:
            log.info("SIGHUP: reloading keys and permissions")
            self.reload()

        previous: dict[int, Any] = {s: signal.signal(s, on_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hup)
        return previous


__all__ = ["Broker"]
