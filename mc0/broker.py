"""Broker: the ROUTER socket and poller loop around :class:`mc0.core.BrokerCore`.

Contract: the constructor does no I/O; ``bind()`` opens the socket and
returns the real endpoints (``tcp://127.0.0.1:*`` picks a free port);
``run()`` loops until ``stop()`` (thread-safe, also wired to SIGINT/SIGTERM
when run in the main thread), then DISCONNECTs every peer and closes.
All protocol decisions are the core's; this file only reads the clock,
receives in batches and performs the sends the core returns.
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from types import FrameType, TracebackType
from typing import Any

import zmq

from .config import BrokerConfig
from .core import BrokerCore, Out

log = logging.getLogger("mc0.broker")

# Messages handled per readiness event before timers get a look in: large
# enough to amortise the poll, small enough that heartbeats stay on time.
RECV_BATCH = 512
LINGER_MS = 500
# Measured here: sharing zmq.Frames across a fan-out beats copying from a few KiB up
# (4x at 64 KiB, 10 subscribers) and loses below.
SHARE_FRAMES_FROM = 4096
MAX_FOLLOW_UP_ROUNDS = 64


class Broker:
    def __init__(self, config: BrokerConfig | None = None, *, context: zmq.Context[zmq.Socket[bytes]] | None = None):
        self.config = config or BrokerConfig()
        self.core = BrokerCore(self.config)
        self._context = context
        self._socket: zmq.Socket[bytes] | None = None
        self._wake_r, self._wake_w = (None, None)  # type: tuple[socket.socket | None, socket.socket | None]
        self._stopping = threading.Event()
        self._closed = False
        self.endpoints: list[str] = []

    # ------------------------------------------------------------ lifecycle
    def bind(self) -> list[str]:
        """Create the ROUTER socket and bind every configured endpoint."""
        if self._socket is not None:
            return self.endpoints
        context = self._context or zmq.Context.instance()
        sock = context.socket(zmq.ROUTER)
        cfg = self.config
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # HWM and gone peers raise instead of dropping silently
        sock.setsockopt(zmq.SNDHWM, cfg.send_hwm)
        sock.setsockopt(zmq.RCVHWM, max(cfg.send_hwm, 1000))
        sock.setsockopt(zmq.MAXMSGSIZE, cfg.limits.max_frame_bytes)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        try:
            for endpoint in cfg.bind:
                sock.bind(endpoint)
                self.endpoints.append(sock.getsockopt_string(zmq.LAST_ENDPOINT))
        except zmq.ZMQError:
            sock.close(linger=0)
            self.endpoints.clear()
            raise
        self._socket = sock
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        return self.endpoints

    def stop(self) -> None:
        """Ask ``run`` to finish (any thread, or a signal handler)."""
        self._stopping.set()
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass

    def close(self) -> None:
        """Release the socket (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._socket is not None:
            self._socket.close()
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()

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
        core = self.core
        handle = core.handle
        recv = sock.recv_multipart
        try:
            while not self._stopping.is_set():
                wait_ms = max(0.0, (core.next_deadline() - time.monotonic()) * 1000.0)
                ready = dict(poller.poll(int(min(wait_ms, 1000.0)) + 1))
                if sock in ready:
                    now = time.monotonic()
                    for _ in range(RECV_BATCH):
                        try:
                            frames = recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        out = handle(frames[0], frames[1:], now)
                        if out:
                            self._send(out, now)
                now = time.monotonic()
                if now >= core.next_deadline():
                    self._send(core.tick(now), now)
            self._send(core.shutdown(), time.monotonic())
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.close()
            log.info("broker stopped")

    def _send(self, out: Iterable[Out], now: float) -> None:
        """Send what the core returned; a failed send may make the core return more.

        A vanished peer (EHOSTUNREACH) or a full queue (EAGAIN) is reported to
        the core, whose answer (a re-dispatched request, a 429 notice) is sent
        in turn.  Follow-ups are bounded so a cascade cannot spin forever.
        """
        sock = self._socket
        assert sock is not None
        pending: list[Iterable[Out]] = [out]
        rounds = 0
        while pending and rounds < MAX_FOLLOW_UP_ROUNDS:
            rounds += 1
            follow_up: list[Out] = []
            for batch in pending:
                follow_up += self._send_batch(sock, batch, now)
            pending = [follow_up] if follow_up else []

    def _send_batch(self, sock: zmq.Socket[bytes], out: Iterable[Out], now: float) -> list[Out]:
        follow_up: list[Out] = []
        last: Sequence[bytes] | None = None
        shared: list[zmq.Frame] | None = None
        for routing_id, frames in out:
            # Fan-out hands the same frames list to every subscriber. Large
            # bodies become zmq.Frames once and are sent by reference
            # (libzmq refcounts them); small ones are cheaper to copy.
            if frames is last:
                if shared is None and max(map(len, frames)) >= SHARE_FRAMES_FROM:
                    shared = [zmq.Frame(f) for f in frames]
            else:
                last, shared = frames, None
            try:
                sock.send(routing_id, zmq.SNDMORE | zmq.NOBLOCK)
                if shared is not None:
                    sock.send_multipart(shared, zmq.NOBLOCK, copy=False)
                else:
                    sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                follow_up += self.core.send_failed(routing_id, now, unreachable=False)
            except zmq.ZMQError as exc:
                if exc.errno != errno.EHOSTUNREACH:
                    raise
                follow_up += self.core.send_failed(routing_id, now, unreachable=True)
        return follow_up

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: shutting down", signum)
            self.stop()

        return {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}


class BrokerThread:
    """A broker running in a background thread (for embedding and the demo)."""

    def __init__(self, config: BrokerConfig | None = None) -> None:
        self.broker = Broker(config)
        self._thread: threading.Thread | None = None

    def start(self) -> list[str]:
        endpoints = self.broker.bind()
        self._thread = threading.Thread(
            target=self.broker.run, kwargs={"install_signals": False}, name="mc0-broker", daemon=True
        )
        self._thread.start()
        return endpoints

    def stop(self, timeout: float = 5.0) -> None:
        self.broker.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> BrokerThread:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
