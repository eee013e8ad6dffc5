"""The client's socket to one broker of its endpoint list, and the move to another.

Contract: a mixin of :class:`mc0.aio.connection.Connection` (which owns the
state it names).  ``_dial(endpoint)`` opens the DEALER socket every
connection uses (its options, CURVE, the monitor).  With one endpoint
nothing else here runs: libzmq reconnects that socket and the session heals
on it.  With several (``"tcp://a:1,tcp://b:2"``):

* ``_connect_any``: the endpoints in the order given; the first whose broker
  answers the CONNECT with OK wins.  The client's ``timeout`` covers the
  whole list (each endpoint gets what is left divided by those left); a
  refused or unresolvable endpoint, a refused key or a refused CONNECT moves
  on at once; when none answers, one error names every endpoint and what it did.
* ``_lose``: the broker is gone (the monitor's DISCONNECTED, its DISCONNECT,
  silence past ``liveness x TTL``).  What its socket still holds is read
  first (answers it sent before it went settle their commands: a confirmed
  publish it answered is never sent again).  What it may have run is failed
  (``NotConnected``: a request is never sent twice), what no broker has seen
  waits in the Link, confirmed publishes (with their MSGID) and pings are
  queued to be sent again first; ``_fail_over`` then tries the endpoints
  after the lost one (``failover_order``), each on a new socket, until a
  broker accepts the CONNECT: the session's answer re-sends every SUB (GROUP;
  FROM at the next seq) and a worker's READY, and the Link flushes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import operator
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeAlias, TypeVar, cast

import zmq
import zmq.asyncio

from .. import keys as keyfiles
from ..deadlines import Deadlines
from ..endpoints import (
    REFUSED_AFTER,
    failover_order,
    no_answer_detail,
    none_answered,
    outcome_line,
    unreachable_message,
)
from ..errors import ClosedError, Error, NotConnected, Timeout, Unreachable
from ..message import Reply
from ..protocol import Command, Status, Verb
from ..security import HANDSHAKE_FAILURES, configure_client
from ..session import ClientSession, Frames
from .link import Link
from .streams import ReplyStream

log = logging.getLogger("mc0.client")

# Handshake failures (-> AuthFailed), and the link going down and up again (-> heal at once).
LINK_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
# What tells refused / unresolvable / no answer apart while connecting (see mc0.endpoints.diagnose).
CONNECT_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECT_RETRIED
MONITOR_EVENTS = functools.reduce(operator.or_, HANDSHAKE_FAILURES) | LINK_EVENTS | CONNECT_EVENTS
EVENT_NAMES = {int(e): e.name or "" for e in zmq.Event}
SOCKET_HWM = 64
# How long one endpoint may take to accept the CONNECT during a failover: a live broker answers
# in milliseconds, so this only bounds a host that swallows the connection attempt.
FAILOVER_ATTEMPT = 1.0
# Between rounds of the list when no broker answered (refused everywhere): soon, then each second.
ROUND_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0)
# Commands a failover sends again when the lost broker had them unanswered: a PUT (a journal drops
# a repeat by its MSGID) and a PING.  Anything else it may have acted on is failed instead.
RESENT_VERBS = frozenset({Verb.PUT.value.encode(), Verb.PING.value.encode()})

T = TypeVar("T")
# What a request's answer resolves: an asyncio future, or a concurrent one for another thread
# (both have done / set_result / set_exception, all the loop uses).
Waiter: TypeAlias = "asyncio.Future[T] | concurrent.futures.Future[T]"


class Failover:
    endpoint: str
    endpoints: tuple[str, ...]
    timeout: float
    session: ClientSession
    _context: zmq.asyncio.Context | None
    _curve: tuple[keyfiles.KeyPair, bytes] | None
    _socket: zmq.Socket[bytes] | None
    _monitor: zmq.asyncio.Socket | None
    _out: Link | None
    _tasks: list[asyncio.Task[None]]
    _connected: asyncio.Future[int] | None
    _seen: list[str]
    _connected_ever: bool
    _closed: bool
    _closing: bool
    _pending: dict[str, asyncio.Future[Command]]
    _calls: dict[str, Waiter[Reply]]
    _call_deadlines: Deadlines[str]
    _streams: dict[str, ReplyStream]
    _watch: Callable[[zmq.asyncio.Socket], Coroutine[Any, Any, None]]
    _watcher: asyncio.Task[None] | None = None
    _failing: asyncio.Task[None] | None = None
    _reading_lost = False  # reading what the lost broker's socket held (_lose)
    # Confirmed publishes and pings in flight, by ID: what a failover sends again.
    _resend: dict[str, Frames]

    def _dial(self, endpoint: str) -> zmq.Socket[bytes]:
        """A DEALER socket connecting to ``endpoint``, with its monitor (``_socket``, ``_monitor``)."""
        context = self._context or zmq.asyncio.Context.instance()
        # A plain socket (its FD on the event loop, see Link), from the asyncio context so the
        # monitor socket made from it is an asyncio one.
        sock: zmq.Socket[bytes] = zmq.Socket(context, zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # Small libzmq queues (in messages, which are batches of up to 256 KiB): what waits to be sent
        # is in the Link's buffer, counted in bytes, where back-pressure reaches the publisher.
        sock.setsockopt(zmq.SNDHWM, SOCKET_HWM)
        sock.setsockopt(zmq.RCVHWM, SOCKET_HWM)
        # One endpoint: queue only to a connection that is up: what is sent while it is down waits in
        # the Link (counted, bounded) instead of in libzmq, where it would reach a restarted broker
        # ahead of the CONNECT and be refused.  A list: a lost broker's socket is never used again
        # (each attempt dials a new one), and what the broker sent before it went must stay readable
        # (_lose reads it): under IMMEDIATE libzmq drops a lost connection's unread messages as soon
        # as the socket next processes its commands (any send, or a look at ZMQ_EVENTS).
        sock.setsockopt(zmq.IMMEDIATE, 0 if len(self.endpoints) > 1 else 1)
        if self._curve is not None:
            configure_client(sock, *self._curve)
        self._monitor = cast(zmq.asyncio.Socket, sock.get_monitor_socket(MONITOR_EVENTS))
        sock.connect(endpoint)
        self._socket = sock
        self.endpoint = endpoint
        self._seen = []
        self._connected_ever = False
        return sock

    def _watch_monitor(self) -> None:
        assert self._monitor is not None
        self._watcher = asyncio.get_running_loop().create_task(self._watch(self._monitor), name="mc0-monitor")
        self._tasks.append(self._watcher)

    async def _switch_to(self, endpoint: str) -> None:
        """A new socket to ``endpoint`` under the Link; the old one, its monitor and watcher closed."""
        assert self._out is not None
        old_socket, old_monitor, old_watcher = self._socket, self._monitor, self._watcher
        if old_watcher is not None:
            old_watcher.cancel()
            self._tasks.remove(old_watcher)
            try:
                await old_watcher
            except asyncio.CancelledError:
                pass
        if self._closing or self._closed:  # close() ran meanwhile (it closed the old socket): dial nothing
            raise ClosedError("client closed")
        if old_socket is not None and old_monitor is not None:
            old_socket.disable_monitor()
            old_monitor.close(linger=0)
        self._out.replace_socket(self._dial(endpoint))
        if old_socket is not None:
            old_socket.close(linger=0)
        self._watch_monitor()

    async def _attempt(self, endpoint: str, budget: float, *, switch: bool = True) -> None:
        """CONNECT to ``endpoint`` (on a new socket unless ``switch`` is false) and wait up to
        ``budget`` for the OK; raises what went wrong (the monitor fails it early when refused)."""
        if self._closing or self._closed:
            raise ClosedError("client closed")
        if switch:
            await self._switch_to(endpoint)
        assert self._out is not None
        self._connected = connected = asyncio.get_running_loop().create_future()
        self._out.send_now(self.session.connect(time.monotonic()))
        try:
            await asyncio.wait_for(asyncio.shield(connected), budget)
        except TimeoutError:
            raise Timeout(f"connect to {endpoint}", round(budget, 3), no_answer_detail(self._connected_ever)) from None
        finally:
            connected.cancel()  # a late answer or failure for this attempt is nobody's business

    def _early_verdict(self, verdict: str | None) -> None:
        """The monitor diagnosed the endpoint being tried (refused / unresolvable): with a list,
        move on at once instead of waiting for the attempt's budget."""
        connected = self._connected
        if verdict is not None and len(self.endpoints) > 1 and connected is not None and not connected.done():
            connected.set_exception(Unreachable(unreachable_message(self.endpoint, verdict), verdict=verdict))

    async def _connect_any(self) -> None:
        """The first connection with a list: in order, the first broker to accept wins, within ``timeout``."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.timeout
        outcomes: dict[str, Exception] = {}
        fresh = True  # connect() dialed the first endpoint already
        rounds = 0
        while True:
            for left_in_round, endpoint in zip(range(len(self.endpoints), 0, -1), self.endpoints, strict=True):
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    await self._attempt(endpoint, left / left_in_round, switch=not fresh)
                    return
                except ClosedError:
                    raise
                except Error as exc:
                    outcomes[endpoint] = exc
                fresh = False
            # Only refusals (a broker may be starting) are worth another round, and only briefly.
            refused_only = all(isinstance(e, Unreachable) for e in outcomes.values())
            if not refused_only or loop.time() - started >= min(self.timeout, REFUSED_AFTER):
                break
            await asyncio.sleep(ROUND_PAUSES[min(rounds, len(ROUND_PAUSES) - 1)])
            rounds += 1
        raise none_answered(outcomes, self.timeout)

    # ------------------------------------------------------------ losing a broker
    def _lose(self, reason: str) -> None:
        """The broker we were on is gone: settle what was in flight and fail over (once at a time)."""
        if self._closing or self._closed or not self.session.ever_connected or self._out is None:
            return
        lost = self.endpoint
        failing = self._failing is not None and not self._failing.done()
        if not failing:
            if self._reading_lost:
                return  # (a DISCONNECT among what the lost broker's socket held: this loss)
            # What the lost broker said before it went (answers, messages) is read first: a confirmed
            # publish it answered is settled by its answer, never sent again.  (Not while a failover
            # runs: the socket then is one being tried, whose CONNECT answer must not pass as a session.)
            self._reading_lost = True
            try:
                self._out.read_left()
            finally:
                self._reading_lost = False
        self._settle_in_flight(lost)  # (again while a failover runs: what waits stays, nothing twice)
        if failing:
            return  # the failover under way goes on: it checks the broker it reached is still there
        log.warning("lost the broker at %s (%s): failing over", lost, reason)
        self._failing = asyncio.get_running_loop().create_task(
            self._fail_over(lost, time.monotonic()), name="mc0-failover"
        )
        self._tasks.append(self._failing)

    def _settle_in_flight(self, lost: str) -> None:
        """What the lost broker had: requests it may have run fail (NotConnected); confirmed
        publishes and pings go again, first; whatever no broker has seen stays where it waits."""
        out = self._out
        assert out is not None
        out.hold_blocked()
        unsent = out.unsent_ids()
        error = NotConnected(
            Status.NOT_CONNECTED, f"the broker at {lost} was lost before it answered (not sent again: it may have run)"
        )
        again: list[Frames] = []
        for request_id, future in list(self._pending.items()):
            if request_id in unsent or future.done():  # (done: its answer is in, only not yet taken)
                continue
            frames = self._resend.get(request_id)
            if frames is not None:
                again.append(frames)
                continue
            del self._pending[request_id]
            future.set_exception(error)
        for request_id in [r for r in self._calls if r not in unsent]:
            call = self._calls.pop(request_id)
            self._call_deadlines.discard(request_id)
            if not call.done():
                call.set_exception(error)
        for request_id in [r for r in self._streams if r not in unsent]:
            self._streams.pop(request_id)._feed(error)
        out.send_first(again)

    async def _fail_over(self, lost: str, started: float) -> None:
        """Round the list from the endpoint after ``lost`` until a broker accepts us (or close())."""
        order = failover_order(self.endpoints, lost)
        budget = min(self.timeout, FAILOVER_ATTEMPT)
        rounds = 0
        while not self._closing:
            for endpoint in order:
                try:
                    await self._attempt(endpoint, budget)
                except Error as exc:
                    log.info("failover: %s", outcome_line(endpoint, exc))
                    continue
                if not self.session.connected:  # accepted, then lost before this task went on
                    continue
                log.warning("failed over from %s to %s in %.3f s", lost, endpoint, time.monotonic() - started)
                return
            await asyncio.sleep(ROUND_PAUSES[min(rounds, len(ROUND_PAUSES) - 1)])
            rounds += 1
