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
every receive batch the loop calls ``core.commit()``, which writes and fsyncs
the batch's appends once (group commit) and only then returns their OKs.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, cast

import zmq
import zmq.utils.monitor

from .. import keys as keyfiles
from ..config import Config, load
from ..errors import ConfigError
from ..protocol import ANONYMOUS
from ..security import AllowedKeys, ZapHandler, configure_server
from .core.dispatch import BrokerCore, Out
from .core.journaling import StreamOut
from .dialects import route as dialect_route
from .dialects.memodb import with_memodb_identity
from .monitoring.httpd import MonitorServer
from .monitoring.snapshot import snapshot
from .nngbridge import NngBridge
from .outbox import GROUP_SKIP_BYTES, Outbox
from .storage.filestore import Journal

log = logging.getLogger("mc0.broker")

# Messages handled per readiness event before timers get a look in: large
# enough to amortise the poll, small enough that heartbeats stay on time.
RECV_BATCH = 512
# ... or this many bytes of batches: a turn then flushes what it produced (a 256 KiB batch is
# ~2,000 commands; reading 512 of them before sending anything would stall every subscriber).
RECV_BYTES = 256 * 1024
RECV_HWM = 128  # messages libzmq holds per peer before the broker reads them
LINGER_MS = 500
# Measured here: sharing zmq.Frames across a fan-out beats copying from a few KiB up
# (4x at 64 KiB, 10 subscribers) and loses below.
SHARE_FRAMES_FROM = 4096
MAX_FOLLOW_UP_ROUNDS = 64
# A batch sent to a peer holds at most this (more waiting goes in the next one).
BATCH_OUT_BYTES = 256 * 1024
# A replay or fetch queues its next page only while its peer's backlog is below this.
STREAM_WINDOW = 1 << 20
# pyzmq's constants are enum.Flag members: combining them per send builds enum
# objects (about a tenth of the broker's time under RPC load, by py-spy). Plain ints.
NOBLOCK = int(zmq.NOBLOCK)
MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
SRCFD = int(zmq.SRCFD)
RCVMORE = int(zmq.RCVMORE)
EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)


def _recv_rest(sock: zmq.Socket[bytes]) -> list[bytes]:
    """The remaining frames of the message being received (pyzmq's recv_multipart, with int flags)."""
    rest = []
    recv = sock.recv
    while sock.getsockopt(RCVMORE):
        rest.append(recv(NOBLOCK))
    return rest


def _send_frames(sock: zmq.Socket[bytes], routing_id: bytes, frames: Sequence[Any], copy: bool = True) -> None:
    """Send one routed message. pyzmq's send_multipart computes ``zmq.SNDMORE | flags``
    per frame, on enum.Flag members: measured at 13% of the broker's time."""
    send = sock.send
    send(routing_id, MORE_NOBLOCK)  # raises here (EAGAIN / EHOSTUNREACH), before any body frame
    for frame in frames[:-1]:
        send(frame, MORE_NOBLOCK, copy=copy)
    send(frames[-1], NOBLOCK, copy=copy)


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


class Broker:
    def __init__(
        self,
        config: Config | None = None,
        *,
        config_path: str | None = None,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        self.config = config or Config()
        self.config_path = config_path  # re-read for permissions on reload
        self.journals = [Journal(name, settings) for name, settings in sorted(self.config.journals.items())]
        self.core = BrokerCore(
            self.config.broker,
            with_memodb_identity(self.config.permissions, self.config.memodb.identity),
            journals=self.journals,
            wall_offset=time.time() - time.monotonic(),
            dialects=dialect_route,
        )
        cfg = self.config.broker
        self.outbox = Outbox(
            max_bytes=cfg.max_queue_bytes, max_messages=cfg.max_queue_messages, batch_bytes=BATCH_OUT_BYTES
        )
        # A queue-group member whose queue holds more than this is skipped while another can take it.
        group_skip = min(cfg.max_queue_bytes // 4, GROUP_SKIP_BYTES)
        self.core.pubsub.can_take = lambda routing_id: self.outbox.backlog(routing_id) < group_skip
        # A journaled letter is recorded delivered only once nothing for its session waits here.
        self.core.mailboxes.sent_all = lambda routing_id: self.outbox.backlog(routing_id) == 0
        self.nng = NngBridge.configured(self.config)  # MemoDB (seed 003): NNG in its own thread, or None
        self._given_context = context
        self._context: zmq.Context[Any] | None = None
        self._socket: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._stopping = threading.Event()
        self._reload_asked = False
        self._closed = False
        self.allowed: AllowedKeys | None = None
        self.zap: ZapHandler | None = None
        self.public_key: bytes | None = None
        self.endpoints: list[str] = []
        # Monitoring ([http] / --http): served by its own thread from snapshots this loop publishes.
        listen = self.config.http.listen
        self.http = MonitorServer(listen, wake=self._wake) if listen else None
        self.bytes_in = 0  # message body bytes received (for /varz and /metrics)
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
            self.allowed = AllowedKeys(security.allowed_dir)
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
        if self.nng is not None:
            self.nng.start(self._context)  # ConfigError (names memodb.listen) when it cannot listen
        return self.endpoints

    def _wake(self) -> None:
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass

    def stop(self) -> None:
        """Ask ``run`` to finish (any thread, or a signal handler)."""
        self._stopping.set()
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
        if self.nng is not None:
            self.nng.close()
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
        """Serve until stopped; then DISCONNECT peers and close."""
        self.bind()
        sock = self._socket
        assert sock is not None and self._wake_r is not None
        previous = self._install_signals() if install_signals else {}
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        if (nng := self.nng.socket if self.nng is not None else None) is not None:
            poller.register(nng, zmq.POLLIN)
        monitor = self._monitor
        assert monitor is not None
        poller.register(monitor, zmq.POLLIN)
        zap = self.zap
        if zap is not None:
            assert zap.zap_socket is not None
            poller.register(zap.zap_socket, zmq.POLLIN)
        core = self.core
        http = self.http
        reload_every = self.config.security.reload_ms / 1000.0
        next_reload = time.monotonic() + reload_every
        try:
            while not self._stopping.is_set():
                deadline = core.next_deadline()
                if self.allowed is not None:
                    deadline = min(deadline, next_reload)
                retry = self.outbox.next_retry()
                if retry is not None:
                    deadline = min(deadline, retry)
                wait_ms = max(0.0, (deadline - time.monotonic()) * 1000.0)
                ready = dict(poller.poll(int(min(wait_ms, 1000.0)) + 1))
                if self._wake_r in ready:
                    self._drain_wake()
                if zap is not None and zap.zap_socket in ready:
                    zap.handle()
                if monitor in ready:  # closes first: see _receive
                    self._connections_closed(monitor, time.monotonic())
                if sock in ready or core.closing:
                    self._receive(sock, time.monotonic())
                if nng in ready and self.nng is not None:  # MemoDB requests
                    self._apply(self.nng.receive(core, time.monotonic()), time.monotonic())
                now = time.monotonic()
                if self._reload_asked or (self.allowed is not None and now >= next_reload):
                    self._reload(now)
                    next_reload = now + reload_every
                self._guarded(self._timers, now)
                self._flush(sock, now)
                if http is not None and http.wanted:  # an HTTP request waits (one attribute read per turn)
                    self._publish_snapshot(http)
            now = time.monotonic()
            self._apply(core.shutdown(now), now)
            if core.uncommitted:
                self._apply(core.commit(), time.monotonic())
            self._flush(sock, time.monotonic())
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.close()
            log.info("broker stopped")

    def _timers(self, now: float) -> None:
        core = self.core
        if now >= core.next_deadline():
            self._apply(core.tick(now), now)
        if core.streaming:
            self._queue_stream(core.stream(now), now)
        if core.uncommitted:
            self._apply(core.commit(), now)

    def _guarded(self, work: Any, now: float) -> None:
        """Timer work (ticks, streams, commits) that raises is logged and counted, never fatal."""
        try:
            work(now)
        except Exception:
            self.core.counters["internal_errors"] += 1
            log.exception("internal error in the broker's timer work")

    def _publish_snapshot(self, http: MonitorServer) -> None:
        now = time.monotonic()
        try:
            snap = snapshot(
                self.core, self.outbox, now=now, started=self._started, wall=time.time(), in_bytes=self.bytes_in
            )
        except Exception:
            self.core.counters["internal_errors"] += 1
            log.exception("internal error building the monitoring snapshot")
            return
        http.publish(snap)

    def _drain_wake(self) -> None:
        assert self._wake_r is not None
        try:
            while self._wake_r.recv(64):
                pass
        except OSError:
            pass

    def _receive(self, sock: zmq.Socket[bytes], now: float) -> None:
        handle = self.core.handle
        sessions = self.core.sessions
        forgotten = self.core.forgotten
        monitor = self._monitor
        assert monitor is not None
        curve = self.zap is not None
        received = 0
        recv = sock.recv
        for i in range(RECV_BATCH):
            # The routing id frame is received as a zmq.Frame to read, from the
            # message itself, the connection it came on and (under CURVE) the
            # authenticated identity: never trusted from the routing id, which
            # a peer chooses.  zmq.Again ends the batch: one exception per
            # wake-up is cheaper than asking ZMQ_EVENTS per message (measured),
            # except when a wake-up brings one message (light load): so ask once.
            try:
                empty = i == 1 and not cast(int, sock.getsockopt(EVENTS)) & POLLIN
                first = None if empty else recv(NOBLOCK, copy=False)
            except zmq.Again:
                first = None
            if first is None:
                # Read empty: whatever a connection reported closed sent before it
                # closed has been handled, so its session can go now.
                if self.core.closing:
                    self._apply(self.core.forget_closed(now, drained=True), now)
                self.bytes_in += received
                return
            rest = _recv_rest(sock) if first.more else []
            identity = ANONYMOUS
            if curve:
                try:
                    identity = str(first.get("User-Id")) or ANONYMOUS
                except zmq.ZMQError:
                    pass
            routing_id = first.bytes
            if routing_id not in sessions:
                # A new connection may reuse the fd number of one that just closed, and the
                # monitor names closes by fd: read the closes already reported (libzmq reports
                # a close before it frees the fd) so that they unbind the old connection
                # before this one binds, or a late close would end the new session.
                self._connections_closed(monitor, now)
            try:
                out = handle(routing_id, rest, now, identity, first.get(SRCFD))
            except Exception as exc:  # the per-message guard: one message's fault costs that message only
                out = self.core.internal_error(routing_id, rest, exc)
            if out or forgotten:
                self._apply(out, now)
            if rest:
                received += len(rest[-1])
                if received >= RECV_BYTES:
                    break
        self.bytes_in += received
        if self.core.closing:  # a full batch, not read empty: only overdue closes
            self._apply(self.core.forget_closed(now, drained=False), now)

    def _connections_closed(self, monitor: zmq.Socket[bytes], now: float) -> None:
        """Report the closes the monitor has; the core forgets them once the socket reads empty.

        libzmq queues a connection's last messages before it reports the close,
        so reading the socket empty after this has handled all of them.
        """
        while True:
            try:
                event = zmq.utils.monitor.parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.core.connection_closed(int(event["value"]), now)

    def _reload(self, now: float) -> None:
        """Re-read the allowed folder (and the config's permissions); apply the difference."""
        asked, self._reload_asked = self._reload_asked, False
        out: list[Out] = []
        if self.allowed is not None and (asked or self.allowed.changed()):
            revoked = self.allowed.load(strict=False)
            self.core.allow(self.allowed.identities)
            if revoked:
                log.warning("keys revoked: %s", ", ".join(sorted(revoked)))
                out += self.core.revoke(revoked, now)
            asked = True
        if asked and self.config_path:
            try:
                fresh = load(self.config_path)
            except ConfigError as exc:
                log.error("permissions not reloaded: %s", exc)
            else:
                self.config = dataclasses.replace(self.config, permissions=fresh.permissions)
                permissions = with_memodb_identity(fresh.permissions, self.config.memodb.identity)
                out += self.core.set_permissions(permissions, now)
        if out:
            self._apply(out, now)

    def _apply(self, out: Iterable[Out], now: float) -> None:
        """Queue what the core returned, each message in its peer's outbox.

        First the queues of peers the core just forgot are discarded (their
        backlog is freed at once; what ``out`` still says to them, such as a
        429, gets a short-lived queue of its own).  A message over its
        peer's budget is refused and reported to the core as a drop; the
        core's answer to that (an eviction) is queued in turn, boundedly.
        """
        core = self.core
        outbox = self.outbox
        sessions = core.sessions
        pending: Iterable[Out] = out
        for _ in range(MAX_FOLLOW_UP_ROUNDS):
            for routing_id in core.take_forgotten():
                outbox.discard(routing_id)
                if self.nng is not None:
                    self.nng.forgotten(routing_id)  # its waiting NNG request is answered
            follow_up: list[Out] = []
            for routing_id, payload in pending:
                peer = sessions.get(routing_id)
                batched = peer is not None and peer.batched
                if peer is not None and peer.enveloped:  # an mc0d-era DEALER's session
                    payload = peer.framed(payload)
                if not outbox.put(routing_id, payload, batched=batched, known=peer is not None, now=now):
                    follow_up += core.send_failed(routing_id, now, unreachable=False)
            if not follow_up and not core.forgotten:
                return
            pending = follow_up

    def _flush(self, sock: zmq.Socket[bytes], now: float) -> None:
        """Send what is queued: per peer, everything it accumulated (batched peers: in as few
        BATCH messages as fit); a peer whose pipe is full keeps the rest for a retry."""
        outbox = self.outbox
        if not outbox.pending:
            return
        shared: dict[int, list[zmq.Frame]] = {}  # fan-out's frames as zmq.Frames, once per flush
        for routing_id in outbox.ready(now):
            if self.core.closing and self.core.peers.is_closing(routing_id):  # another key may hold it by now
                continue
            if self.nng is not None and self.nng.memodb.owns(routing_id):
                self._apply(self.nng.flush(self.core, outbox, routing_id, now), now)
                continue
            while (message := outbox.next_message(routing_id)) is not None:
                try:
                    if len(message) > 3 and max(map(len, message)) >= SHARE_FRAMES_FROM:
                        frames = shared.get(id(message))
                        if frames is None:
                            frames = shared[id(message)] = [zmq.Frame(f) for f in message]
                        _send_frames(sock, routing_id, frames, copy=False)
                    else:
                        _send_frames(sock, routing_id, message)
                except zmq.Again:
                    outbox.blocked(routing_id, now)
                    break
                except zmq.ZMQError as exc:
                    if exc.errno != errno.EHOSTUNREACH:
                        raise
                    outbox.discard(routing_id)
                    self._apply(self.core.send_failed(routing_id, now, unreachable=True), now)
                    break
                outbox.sent(routing_id)

    def _queue_stream(self, out: list[StreamOut], now: float) -> None:
        """Replay and fetch pages: queued while the peer's backlog is small; otherwise the stream
        is paused and rewound (``core.stream_blocked``), so a replay never overruns a slow reader's
        budget and is never counted as a drop.  Once one page of a peer is held back, every later
        one is too, so each stream resumes at its first unsent message, in order."""
        outbox = self.outbox
        sessions = self.core.sessions
        blocked: set[bytes] = set()
        for item in out:
            routing_id = item.routing_id
            peer = sessions.get(routing_id)
            if (
                routing_id in blocked
                or peer is None
                or outbox.backlog(routing_id) > STREAM_WINDOW
                or not outbox.put(routing_id, peer.framed(item.frames), batched=peer.batched, known=True, now=now)
            ):
                blocked.add(routing_id)
                self.core.stream_blocked(item, now)

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
