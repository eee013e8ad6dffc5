"""SocketLoop: the broker loop's sockets, turn by turn: wait for them, read them into the core, send the turn's output.

Contract: built once the ROUTER is bound, over a :class:`~mc0.broker.routerio.RouterIO`
(native, or its pure-Python fallback) whose items are the ROUTER, the wake
pipe, the monitor socket, each listener's socket and the ZAP socket, in that
order.  Each turn the broker (``server.Broker``) calls ``wait(timeout_ms,
held)``: one poll (without the ROUTER while the input is held), after which
the wake pipe is drained, a ZAP handshake answered and the closes the
monitor reports are told to the core; then ``read(ready, held)``: the
ROUTER's messages of this wake-up, received in one batch (at most
``RECV_BATCH`` messages or ``RECV_BYTES``), each handed to
``core.handle`` under its own guard (anything that raises becomes ``ERROR
500``), then a slice of the batches left to walk on (``WALK_BUDGET``), then
what each ready listener received; and, after its timer work, ``flush(now)``:
every output queued, sent by the :class:`~mc0.broker.sender.Sender` through
the same RouterIO.  The clock is read once per step.  Every decision is the
core's; this module moves bytes and reads the identity (``User-Id``) and the
connection (``SRCFD``) of each message from the message itself, never from
the routing id a peer chooses.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq
import zmq.utils.monitor

from ..protocol import ANONYMOUS
from ..security import ZapHandler
from .core.dispatch import BrokerCore
from .listeners import Listener
from .routerio import RouterIO
from .sender import Sender

# Messages handled per readiness event before timers get a look in: large
# enough to amortise the poll, small enough that heartbeats stay on time.
RECV_BATCH = 512
# ... or this many bytes of batches: a turn then flushes what it produced (a 256 KiB batch is
# ~2,000 commands; reading 512 of them before sending anything would stall every subscriber).
RECV_BYTES = 256 * 1024
# Seconds of a loop turn spent walking on through big batches (BrokerCore.resume), a slice at a time.
WALK_BUDGET = 0.01
ROUTER_BIT, WAKE_BIT, MONITOR_BIT = 1, 2, 4  # RouterIO's items: the ROUTER, the wake pipe, the monitor ...
FIRST_LISTENER = 3  # ... then each listener's socket, then the ZAP socket


def peer_address(host: str, fd: int) -> str:
    """Where connection ``fd`` comes from: libzmq's ``Peer-Address`` property of its message (``host``:
    the IP over TCP), with the port the socket's peer name adds (``ip:port``, ``[ip6]:port``); "" when
    neither says.  The peer name is read only when it agrees with libzmq's address (the number
    ``fd`` names this connection still)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as conn:  # a duplicate: closing it leaves libzmq's alone
            name = conn.getpeername()
    except OSError:
        return host
    if isinstance(name, tuple) and len(name) >= 2 and (not host or name[0] == host):
        return f"[{name[0]}]:{name[1]}" if ":" in str(name[0]) else f"{name[0]}:{name[1]}"
    return host


def router_io(
    router: zmq.Socket[bytes],
    wake: socket.socket,
    monitor: zmq.Socket[bytes],
    listeners: Sequence[Listener],
    zap: ZapHandler | None,
) -> RouterIO:
    """The RouterIO over the loop's items, in SocketLoop's order."""
    others: list[Any] = [wake.fileno(), monitor]
    for listener in listeners:
        if listener.socket is not None:  # (none: a listener on the broker's own asyncio loop, never polled)
            others.append(listener.socket)
    if zap is not None:
        assert zap.zap_socket is not None
        others.append(zap.zap_socket)
    return RouterIO(router, others, curve=zap is not None)


class SocketLoop:
    def __init__(
        self,
        core: BrokerCore,
        sender: Sender,
        io: RouterIO,
        *,
        wake: socket.socket,
        monitor: zmq.Socket[bytes],
        listeners: Sequence[Listener],
        zap: ZapHandler | None,
    ) -> None:
        self.core = core
        self.sender = sender
        self.io = io
        self.wake = wake
        self.monitor = monitor
        self.listeners = tuple(listeners)
        self.zap = zap
        polled = [listener for listener in self.listeners if listener.socket is not None]  # (router_io's order)
        self.listener_bits = [
            1 << (FIRST_LISTENER + polled.index(listener)) if listener in polled else 0 for listener in self.listeners
        ]
        self.zap_bit = 1 << (FIRST_LISTENER + len(polled)) if zap is not None else 0
        self.bytes_in = 0  # message body bytes received (for /varz and /metrics)

    def fds(self) -> list[int]:
        """The file descriptors an asyncio loop watches for these sockets (a zmq socket's ``ZMQ_FD``)."""
        items: list[Any] = [self.io.router, self.wake.fileno(), self.monitor]
        items += [listener.socket for listener in self.listeners if listener.socket is not None]
        if self.zap is not None and self.zap.zap_socket is not None:
            items.append(self.zap.zap_socket)
        return [item if isinstance(item, int) else int(item.getsockopt(zmq.FD)) for item in items]

    def listeners_behind(self) -> bool:
        """Some listener has received work left for the next turn (route traffic walked in part)."""
        return any(listener.unfinished for listener in self.listeners)

    def wait(self, timeout_ms: int, held: bool) -> int:
        """One poll of at most ``timeout_ms`` (without the ROUTER while ``held``); what was ready (RouterIO's
        bits), the wake pipe drained, a ZAP handshake answered and the monitor's closes told already."""
        ready: int = self.io.poll(timeout_ms, held)
        if ready:
            self.attend(ready)
        return ready

    def attend(self, ready: int) -> None:
        """What a poll found besides the ROUTER and the listeners: wake-ups, a handshake, closes."""
        if ready & WAKE_BIT:
            self._drain_wake()
        if ready & self.zap_bit:
            assert self.zap is not None
            self.zap.handle()
        if ready & MONITOR_BIT:  # closes first: see _receive
            self._connections_closed(time.monotonic())

    def read(self, ready: int, held: bool) -> None:
        """The ROUTER's messages of this turn (unless the input is held), a slice of the batches left to
        walk on, then what each ready listener received."""
        if not held:
            self._read(ready & ROUTER_BIT != 0)
        if self.listeners:
            self._read_listeners(ready)

    def flush(self, now: float) -> None:
        self.sender.flush(self.io, now)

    def _read(self, readable: bool) -> None:
        """The ROUTER's messages of this turn (when it is readable, or closes wait for it to read
        empty), then a slice of the batches left to walk on."""
        core = self.core
        now = time.monotonic()
        if readable or core.closing:
            if self._receive(now):
                core.caught_up(now)  # read empty: every peer's silence up to now is real
        else:
            core.caught_up(now)  # polled empty
        if core.unfinished:
            self._walk_batches(time.monotonic())

    def _read_listeners(self, ready: int) -> None:
        """What each ready listener received (MemoDB requests, other brokers' traffic)."""
        for listener, bit in zip(self.listeners, self.listener_bits, strict=True):
            if ready & bit or listener.unfinished:
                now = time.monotonic()
                try:
                    news = listener.receive(self.core, now)
                except Exception as exc:  # (each listener guards its items too: never fatal)
                    self.core.listener_fault(listener.name, exc, now)
                    continue
                self.sender.apply(news, now)

    def _walk_batches(self, now: float) -> None:
        """Walk on through big batches, a slice at a time, for at most ``WALK_BUDGET`` seconds of
        this turn (the next turn reads the socket first: other peers are served between slices)."""
        core = self.core
        sender = self.sender
        stop = now + WALK_BUDGET
        while core.unfinished:
            sender.apply(core.resume(now, core.batched.batch_slice), now)
            if time.monotonic() >= stop or sender.holding_input(now):
                return

    def _drain_wake(self) -> None:
        try:
            while self.wake.recv(64):
                pass
        except OSError:
            pass

    def _receive(self, now: float) -> bool:
        """One turn's messages (bounded in count and bytes), received in one batch and handed to the core
        one by one in order; True when the socket was read empty."""
        core = self.core
        handle = core.handle
        sessions = core.sessions
        apply = self.sender.apply
        io = self.io
        messages = io.receive(RECV_BATCH, RECV_BYTES, sessions)
        read_empty: bool = io.read_empty
        closes = 0
        for routing_id, rest, fd, identity, address in messages:
            if routing_id not in sessions:
                # A new connection may reuse the fd number of one that just closed, and the
                # monitor names closes by fd: read the closes already reported (libzmq reports
                # a close before it frees the fd) so that they unbind the old connection
                # before this one binds, or a late close would end the new session.
                closes += self._connections_closed(now)
                if not core.peers.knows_address(fd):  # (once per connection: /connz shows it)
                    core.connection_opened(fd, peer_address(address or "", fd))
            try:
                out = handle(routing_id, rest, now, identity or ANONYMOUS, fd)
            except Exception as exc:  # the per-message guard: one message's fault costs that message only
                out = core.internal_error(routing_id, rest, exc, now=now)
            if out or core.forgotten:
                apply(out, now)
        self.bytes_in += io.received_bytes
        if core.closing:
            # Read empty before the closes reported since were read: whatever those connections sent
            # before they closed has been handled, so their sessions can go now.  A full batch, or a
            # close read after the socket read empty (its last messages may still wait): only overdue ones.
            apply(core.forget_closed(now, drained=read_empty and not closes), now)
        return read_empty

    def _connections_closed(self, now: float) -> int:
        """Report the closes the monitor has (how many); the core forgets them once the socket reads empty.

        libzmq queues a connection's last messages before it reports the close,
        so reading the socket empty after this has handled all of them.
        """
        monitor = self.monitor
        told = 0
        while True:
            try:
                event = zmq.utils.monitor.parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return told
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.core.connection_closed(int(event["value"]), now)
                told += 1


REST = 8  # runs of the asyncio loop between two turns while route traffic waits (nats-py's reads)


class AsyncTurns:
    """The broker's turns as callbacks of the running asyncio loop: a broker of a cluster, whose link runs
    nats-py on the same loop and thread (no thread crossed per message).

    Each turn (``turn(ready, held)``: the broker's read, timers and flush) runs when a socket's fd is
    readable, the link posted (``wake``), its deadline came (``timeout(start, held)`` ms: 0 at once),
    or a look at the sockets found them ready after the last turn: ``ZMQ_FD`` is edge-triggered, and a
    send or receive of the turn may have taken the signal of what is ready, so every turn ends with a
    poll that does not wait (the next turn starts from what it found).  Between turns asyncio runs
    whatever else is ready (nats-py's reads, the link's tasks), each step of it bounded; while route
    traffic waits for the next turn (a listener ``unfinished``), the loop first runs ``REST`` more
    times: nats-py reads its socket at most 256 KiB per run of the loop, and the server's PONGs wait
    behind what it has not read (two late ones and nats-py leaves the server).  ``run()``
    returns once ``stopping()`` says so; a turn that raises ends it with that error (as in the poll loop).
    """

    def __init__(
        self,
        sockets: SocketLoop,
        turn: Callable[[int, bool], None],
        *,
        holding: Callable[[float], bool],
        timeout: Callable[[float, bool], int],
        stopping: Callable[[], bool],
    ) -> None:
        self.sockets = sockets
        self.turn = turn
        self.holding = holding
        self.timeout = timeout
        self.stopping = stopping
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Future[None] | None = None
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._carried = 0  # what the poll at the end of the last turn found ready (attended already)
        self._resting = 0  # runs of the loop left before the next turn (due at once) after a long one
        self._due = False  # a turn is due whatever the sockets say (a post, a deadline, more left to do)
        self.turns = 0

    async def run(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        fds = self.sockets.fds()
        for fd in fds:
            loop.add_reader(fd, self._look)
        try:
            self.wake()
            await self._done
        finally:
            for fd in fds:
                loop.remove_reader(fd)
            if self._timer is not None:
                self._timer.cancel()

    def wake(self) -> None:
        """A turn at the loop's next step (once, however many ask before it runs; after a rest under way)."""
        self._due = True
        self._look()

    def _look(self) -> None:
        """An fd is readable: a look at the sockets at the loop's next step, and a turn if one is ready.
        (A zmq socket's fd also signals what is no input: a send's acknowledgement, a peer's pipe
        freed.  zmq_poll looks past those in C; here such a wake-up costs a look, not a turn.)"""
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._step)

    def _again(self) -> None:
        """The next turn at once; after a rest for the link's reads while route traffic waits for it."""
        assert self._loop is not None
        self._scheduled = self._due = True  # (a wake meanwhile changes nothing: this turn comes first)
        self._resting = REST if self.sockets.listeners_behind() else 0
        self._loop.call_soon(self._rest)

    def _rest(self) -> None:
        if self._resting > 0:
            self._resting -= 1
            assert self._loop is not None
            self._loop.call_soon(self._rest)
        else:
            self._step()

    def _step(self) -> None:
        self._scheduled = False
        done = self._done
        if done is None or done.done():
            return
        try:
            if self.stopping():
                done.set_result(None)
                return
            sockets = self.sockets
            start = time.monotonic()
            held = self.holding(start)
            if held:  # (its messages wait; its commands are taken, so that its fd does not wake each step)
                sockets.io.router.getsockopt(zmq.EVENTS)
            # (what the last turn's closing look found ready, or a look now: woken by an fd, a post, a timer)
            ready = self._carried or sockets.wait(0, held)
            self._carried = 0
            due, self._due = self._due, False
            if not ready and not due:
                return  # (an fd's signal of no input: the deadline's timer stays as it was)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self.turn(ready, held)
            self.turns += 1
            now = time.monotonic()
            held = self.holding(now)
            wait_ms = self.timeout(now, held)
            if self.stopping() or wait_ms <= 0:
                self._again()
                return
            self._carried = sockets.wait(0, held)  # (what a send or receive of this turn may have hidden)
            if self._carried:
                self._again()
            else:
                assert self._loop is not None
                self._timer = self._loop.call_later(wait_ms / 1000.0, self.wake)
        except BaseException as exc:  # (the poll loop would raise out of run(): so does this one)
            done.set_exception(exc)
