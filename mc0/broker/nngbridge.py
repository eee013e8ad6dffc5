"""The MemoDB listener's shell: an NNG rep0 socket (pynng) in its own thread, bridged to the broker loop.

Contract: the constructor does no I/O; ``start(context)`` binds a zmq PAIR
socket on an inproc address of the broker's context, opens the pynng
``Rep0`` socket and listens (a bad or taken address raises
:class:`~mc0.errors.ConfigError` naming ``memodb.listen``), then starts the
thread.  The thread runs an asyncio loop with a pool of ``max_pending`` NNG
contexts (pynng ``Context``); each receives one request at a time, tags it
with a fresh token (8 bytes, never reused), forwards ``[token, data]`` over
the PAIR socket and waits for the broker's answer for that token:
``[token, reply]`` is sent on the context, ``[token]`` alone drops the
request (the context receives again; NNG discards the old request, so
nothing leaks).  A worker's request (READY, RESULT, HEARTBEAT:
:func:`~mc0.broker.memodb.is_worker_request`) parks at the broker until a
job or a heartbeat, so a context that receives one hands its place in the
pool to a new context and is closed once answered: parked workers (at most
``max_workers`` on contexts of their own) never take the ``max_pending``
contexts that clients' JOBs are received on.  A message over the broker's
``max_message_bytes`` (plus the header's room) is refused by NNG itself
(``recv_max_size``).

The broker loop polls :attr:`socket` like its ROUTER and calls
:meth:`receive` (requests -> :class:`~mc0.broker.dialects.memodb.MemoDB`), :meth:`flush`
for what the core queued to a MemoDB routing id, and :meth:`forgotten` when
the core forgot a MemoDB peer; each sends the replies the pure module
returns.  ``close()`` (idempotent) sends what is owed, stops the thread and
closes both sockets.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from ..errors import ConfigError
from ..settings import Config, MemodbConfig
from .core.loglimit import LogLimiter
from .core.peers import Out
from .dialects.memodb import HAVE_CBOR2, MAX_HEADER_BYTES, MemoDB, Reply, is_worker_request
from .outbox import Outbox

try:
    import pynng
except ImportError:  # the memodb extra: require_modules says so, in one line, before any listener opens
    pynng = None

if TYPE_CHECKING:
    from .dialects.base import CoreOps

log = logging.getLogger("mc0.broker")

RECV_BATCH = 256  # requests handled per readiness event before the loop looks at its timers
SEND_LINGER = 0.5  # seconds close() waits for replies still being sent on NNG contexts
_STOP = b""  # on the PAIR socket: the broker is closing


MEMODB_EXTRA = "pip install 'mc0[memodb]'"


def require_modules() -> None:
    """:class:`ConfigError` naming ``memodb.enabled`` and the extra when pynng or cbor2 is missing."""
    missing = [name for name, present in (("pynng", pynng is not None), ("cbor2", HAVE_CBOR2)) if not present]
    if missing:
        raise ConfigError("memodb.enabled", f"MemoDB needs {' and '.join(missing)}, not installed: {MEMODB_EXTRA}")


def check_listen(listen: str) -> bool:
    """Whether an NNG listen address (``tcp://HOST:PORT``, ``tcp://[::1]:PORT``, ``ipc:///path``)
    stays on this machine; :class:`ConfigError` naming ``memodb.listen`` if it is not one."""
    scheme, sep, rest = listen.partition("://")
    example = "tcp://127.0.0.1:12703, tcp://[::1]:12703 or ipc:///run/memodb.socket"
    if not sep or scheme not in ("tcp", "ipc") or not rest:
        raise ConfigError("memodb.listen", f"not an NNG address ({example}): {listen!r}")
    if scheme == "ipc":
        return True
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not port.isascii() or int(port) > 65535:
        raise ConfigError("memodb.listen", f"tcp needs HOST:PORT ({example}): {listen!r}")
    return host in ("localhost", "[::1]") or host.startswith("127.")


class NngBridge:
    def __init__(self, config: MemodbConfig, *, max_message_bytes: int) -> None:
        self.config = config
        self.memodb = MemoDB(
            identity=config.identity,
            nonce=os.urandom(8),  # worker IDs of this run: a restarted broker knows none of the old
            heartbeat_ms=config.heartbeat_ms,
            max_workers=config.max_workers,
            max_payload=max_message_bytes,
        )
        self.max_message_bytes = max_message_bytes
        self.log_limit = LogLimiter()  # what MemoDB peers' requests may make the broker log
        self.address = ""  # what the listener is bound to, once started ("tcp://127.0.0.1:PORT")
        self.socket: zmq.Socket[bytes] | None = None
        self._rep: pynng.Rep0 | None = None
        self._thread: threading.Thread | None = None
        self._inproc = f"inproc://mc0-memodb-{id(self):x}"
        self._closed = False
        self.pending = 0  # NNG requests waiting for the broker (the thread's figure, for reports)

    @classmethod
    def configured(cls, config: Config) -> NngBridge | None:
        """The bridge ``config`` asks for: None when ``[memodb]`` is off or ``foreign_dialects = false``
        (which refuses MemoDB with every other foreign dialect)."""
        if not (config.memodb.enabled and config.broker.foreign_dialects):
            return None
        require_modules()
        return cls(config.memodb, max_message_bytes=config.broker.limits.max_message_bytes)

    # ------------------------------------------------------------ lifecycle
    def start(self, context: zmq.Context[Any]) -> str:
        if not check_listen(self.config.listen):
            log.warning("MemoDB listens on %s: it has no authentication (docs/SECURITY.md)", self.config.listen)
        pair = context.socket(zmq.PAIR)
        pair.setsockopt(zmq.LINGER, 0)
        pair.setsockopt(zmq.SNDHWM, 0)  # bounded by the pool: at most max_pending requests are owed a reply
        pair.setsockopt(zmq.RCVHWM, 0)
        pair.bind(self._inproc)
        try:
            rep = pynng.Rep0(recv_max_size=self.max_message_bytes + MAX_HEADER_BYTES)
        except pynng.NNGException as exc:  # pragma: no cover - the library could not make a socket
            pair.close()
            raise ConfigError("memodb", f"cannot open an NNG socket: {exc}") from None
        try:
            rep.listen(self.config.listen)
        except pynng.NNGException as exc:
            rep.close()
            pair.close()
            raise ConfigError("memodb.listen", f"cannot listen on {self.config.listen}: {exc}") from None
        self.address = self._bound(rep)
        self.socket, self._rep = pair, rep
        self._thread = threading.Thread(target=self._run, args=(context,), name="mc0-memodb", daemon=True)
        self._thread.start()
        log.info("MemoDB (NNG rep0) listening on %s as identity %r", self.address, self.config.identity)
        return self.address

    def _bound(self, rep: pynng.Rep0) -> str:
        listen = self.config.listen
        if not listen.startswith("tcp://") or not rep.listeners:
            return listen
        # pynng's Listener.local_address.port is byte-swapped; its str() is right ("host:port").
        port = str(rep.listeners[0].local_address).rpartition(":")[2]
        host = listen[len("tcp://") :].rpartition(":")[0]
        return f"tcp://{host}:{port}"

    def close(self) -> None:
        """Stop the thread (after the replies already sent) and close both sockets (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.socket is not None:
            try:
                self.socket.send(_STOP, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        if self._thread is not None:
            self._thread.join(SEND_LINGER + 2.0)
        if self._rep is not None:
            self._rep.close()
        if self.socket is not None:
            self.socket.close(linger=0)

    # ------------------------------------------------------------ the broker loop's side
    def receive(self, core: CoreOps, now: float) -> list[Out]:
        """Handle the requests the thread forwarded (up to RECV_BATCH); what the core sends."""
        sock = self.socket
        assert sock is not None
        out: list[Out] = []
        for _ in range(RECV_BATCH):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 2:  # pragma: no cover - the thread always sends [token, data]
                continue
            token, data = frames
            try:
                more, replies = self.memodb.handle(core, token, data, now)
            except Exception:  # the per-message guard: a bug costs this request (dropped), never the loop
                core.counters["internal_errors"] += 1
                if self.log_limit.allow("memodb", "handling", now):  # (every MemoDB peer is one identity)
                    log.exception("internal error handling a MemoDB request")
                more, replies = [], [(token, None)]
            out += more
            self._send(replies)
        return out

    def flush(self, core: CoreOps, outbox: Outbox, routing_id: bytes, now: float) -> list[Out]:
        """Carry what the outbox holds for a MemoDB peer as replies on its waiting request."""
        out: list[Out] = []
        while (message := outbox.next_message(routing_id)) is not None:
            outbox.sent(routing_id)
            try:
                more, replies = self.memodb.deliver(core, routing_id, message, now)
            except Exception:
                core.counters["internal_errors"] += 1
                if self.log_limit.allow("memodb", "delivering", now):
                    log.exception("internal error delivering to a MemoDB peer")
                continue
            out += more
            self._send(replies)
        return out

    def forgotten(self, routing_id: bytes) -> None:
        if self.memodb.owns(routing_id):
            self._send(self.memodb.forgotten(routing_id))

    def _send(self, replies: Sequence[Reply]) -> None:
        sock = self.socket
        if sock is None:
            return
        for token, data in replies:
            sock.send_multipart([token] if data is None else [token, data], zmq.NOBLOCK)

    # ------------------------------------------------------------ the thread
    def _run(self, context: zmq.Context[Any]) -> None:
        try:
            asyncio.run(self._main(context))
        except Exception:  # pragma: no cover - logged: MemoDB peers then time out, mc0 goes on
            log.exception("the MemoDB listener stopped")

    async def _main(self, context: zmq.Context[Any]) -> None:
        rep = self._rep
        assert rep is not None
        loop = asyncio.get_running_loop()
        actx = zmq.asyncio.Context.shadow(context.underlying)
        pair = actx.socket(zmq.PAIR)
        pair.setsockopt(zmq.LINGER, 0)
        pair.setsockopt(zmq.SNDHWM, 0)
        pair.setsockopt(zmq.RCVHWM, 0)
        pair.connect(self._inproc)
        waiting: dict[bytes, asyncio.Future[bytes | None]] = {}
        tokens = itertools.count(1)
        sending: set[asyncio.Task[None]] = set()
        contexts: set[pynng.Context] = set()
        servers: set[asyncio.Task[None]] = set()
        parked = 0  # contexts holding a worker's request, beside the pool

        async def send(ctx: pynng.Context, data: bytes) -> None:
            try:
                await ctx.asend(data)
            except pynng.NNGException:  # the requester went away: nothing to answer
                pass

        def receiver() -> None:
            """One more context receiving requests (the pool's, or one taking a parked one's place)."""
            ctx = rep.new_context()
            contexts.add(ctx)
            task = loop.create_task(serve(ctx))
            servers.add(task)
            task.add_done_callback(servers.discard)

        async def serve(ctx: pynng.Context) -> None:
            nonlocal parked
            while True:
                try:
                    data = await ctx.arecv()
                except pynng.NNGException:
                    return  # closed
                worker = is_worker_request(data) and parked < self.config.max_workers
                if worker:  # it may wait a heartbeat interval: a new context takes its place at once
                    parked += 1
                    receiver()
                token = next(tokens).to_bytes(8, "big")
                answer = waiting[token] = loop.create_future()
                self.pending = len(waiting)
                await pair.send_multipart([token, data], copy=False)
                reply = await answer
                if reply is not None:
                    task = loop.create_task(send(ctx, reply))
                    sending.add(task)
                    await task
                    sending.discard(task)
                if worker:  # the pool has its size already: this context goes
                    parked -= 1
                    contexts.discard(ctx)
                    ctx.close()
                    return

        for _ in range(self.config.max_pending):
            receiver()
        try:
            while True:
                frames = await pair.recv_multipart()
                if frames == [_STOP]:
                    break
                answer = waiting.pop(frames[0], None)
                self.pending = len(waiting)
                if answer is not None and not answer.done():
                    answer.set_result(frames[1] if len(frames) > 1 else None)
            await asyncio.sleep(0)  # the contexts just answered start their sends
            if sending:
                await asyncio.wait(list(sending), timeout=SEND_LINGER)
        finally:
            for task in list(servers):
                task.cancel()
            await asyncio.gather(*servers, return_exceptions=True)
            for ctx in contexts:
                ctx.close()
            pair.close(linger=0)
