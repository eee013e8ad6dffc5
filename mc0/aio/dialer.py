"""The client's socket to one broker of its endpoint list, its monitor, and the move to another.

Contract: :class:`Dialer` is owned by :class:`mc0.aio.connection.Connection`
and owns the DEALER socket (its options, CURVE keys, its monitor and the task
that watches it), the Link over it, and the wait for a broker's answer to the
CONNECT; what it learns for the connection it calls back (``on_link_lost``,
``on_link_up``, ``on_refused``, ``on_broker_lost``, given to its constructor).
``open`` dials the first endpoint and makes the Link; ``connect_first`` waits
for the first broker to accept.  With one endpoint nothing else here runs:
libzmq reconnects that socket and the session heals on it.  With several
(``"tcp://a:1,tcp://b:2"``):

* connecting: the endpoints in the order given; the first whose broker
  answers the CONNECT with OK wins.  The client's ``timeout`` covers the
  whole list (each endpoint gets what is left divided by those left); a
  refused or unresolvable endpoint, a refused key or a refused CONNECT moves
  on at once; when none answers, one error names every endpoint and what it did.
* ``lose``: the broker is gone (the monitor's DISCONNECTED, its DISCONNECT,
  silence past ``liveness x TTL``).  What its socket still holds is read
  first (answers it sent before it went settle their commands: a confirmed
  publish it answered is never sent again).  The connection then settles
  what was in flight (``on_broker_lost``: what the broker may have run fails,
  confirmed publishes and pings go again first); a failover task then tries
  the endpoints after the lost one (``failover_order``), each on a new
  socket, until a broker accepts the CONNECT: the session's answer re-sends
  every SUB (GROUP; FROM at the next seq) and a worker's READY, and the Link
  flushes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
import time
from collections.abc import Callable
from typing import cast

import zmq
import zmq.asyncio
import zmq.utils.monitor

from .. import keys as keyfiles
from ..endpoints import (
    REFUSED_AFTER,
    diagnose,
    failover_order,
    no_answer_detail,
    none_answered,
    outcome_line,
    unreachable_message,
)
from ..errors import AuthFailed, ClosedError, Error, Timeout, Unreachable
from ..security import HANDSHAKE_FAILURES, NO_KEY_FAILURE, configure_client
from ..session import ClientSession
from .link import Link

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


class Dialer:
    """The socket to the broker in use (one of ``endpoints``), the Link over it, and the wait
    for a broker's answer to our CONNECT."""

    def __init__(
        self,
        endpoints: tuple[str, ...],
        session: ClientSession,
        context: zmq.asyncio.Context | None,
        *,
        on_link_lost: Callable[[], None],
        on_link_up: Callable[[], None],
        on_refused: Callable[[AuthFailed], None],
        on_broker_lost: Callable[[str], None],
    ) -> None:
        """No I/O.  ``on_link_lost``: the connection went down (the Link already holds what
        libzmq had not sent); ``on_link_up``: one endpoint's socket came back and its CONNECT
        was sent; ``on_refused``: the broker refused our key after it had accepted the
        session; ``on_broker_lost(endpoint)``: with a list, the broker at ``endpoint`` is
        gone and what it had must be settled before the failover."""
        self.endpoints = endpoints
        self.endpoint = endpoints[0]  # the one in use (or being tried)
        self.session = session
        self._context = context
        self._on_link_lost = on_link_lost
        self._on_link_up = on_link_up
        self._on_refused = on_refused
        self._on_broker_lost = on_broker_lost
        self.link: Link | None = None  # made by open()
        self._curve: tuple[keyfiles.KeyPair, bytes] | None = None
        self._socket: zmq.Socket[bytes] | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._failing: asyncio.Task[None] | None = None
        self._answer: asyncio.Future[int] | None = None  # the broker's answer to the CONNECT in flight
        self._seen: list[str] = []  # monitor events while connecting (bounded: see _watch)
        self._connected_ever = False
        self._reading_lost = False  # reading what the lost broker's socket held (lose)
        self._stopped = False  # the connection is closing: dial nothing more

    # ------------------------------------------------------------ lifecycle
    def open(
        self,
        loop: asyncio.AbstractEventLoop,
        curve: tuple[keyfiles.KeyPair, bytes] | None,
        max_outgoing: int,
        on_message: Callable[[list[bytes]], None],
    ) -> Link:
        """Dial the first endpoint (with ``curve``: our key pair and the broker's public key)
        and make the Link over its socket; its monitor is watched from now on."""
        self._curve = curve
        sock = self._dial(self.endpoints[0])
        self.link = Link(loop, sock, self.session, max_outgoing, on_message)
        self._answer = loop.create_future()
        self._watch_monitor()
        return self.link

    async def connect_first(self, timeout: float) -> None:
        """Wait until a broker accepted the session (the first to answer, with a list), within
        ``timeout``: AuthFailed, Unreachable, the broker's refusal or ``Timeout`` otherwise."""
        assert self.link is not None
        if len(self.endpoints) > 1:
            await self._connect_any(timeout)
            return
        self.link.send_now(self.session.connect(time.monotonic()))
        try:
            await self._await_answer(timeout)
        except TimeoutError:
            raise Timeout(f"connect to {self.endpoint}", timeout, no_answer_detail(self._connected_ever)) from None

    def accepted(self, ttl_ms: int) -> None:
        """The broker accepted our CONNECT."""
        if self._answer is not None and not self._answer.done():
            self._answer.set_result(ttl_ms)

    def refused(self, error: Exception) -> bool:
        """The broker refused our CONNECT: False when nobody was waiting for the answer."""
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)
            return True
        return False

    def stop(self) -> None:
        """The connection began to close: no socket is dialed from now on."""
        self._stopped = True

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The monitor's watcher and a failover under way (the connection ends them when it closes)."""
        return [t for t in (self._watcher, self._failing) if t is not None]

    def close(self) -> None:
        """Fail a wait for the broker's answer, close the monitor and the socket (after ``stop``,
        the Link closed and the tasks ended)."""
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(ClosedError("client closed"))
            self._answer.exception()  # mark retrieved
        sock = self._socket
        if self._monitor is not None:
            if sock is not None:
                sock.disable_monitor()
            self._monitor.close(linger=0)
        if sock is not None:
            sock.close(linger=100)

    # ------------------------------------------------------------ the socket and its monitor
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

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """The socket monitor: handshake failures become AuthFailed (promptly, not a hang); a
        lost connection stops sends at once and its return CONNECTs at once (healing takes a
        reconnect, not ``liveness x TTL``; with an endpoint list, the loss fails over instead)."""
        while True:
            event = zmq.utils.monitor.parse_monitor_message(await monitor.recv_multipart())
            kind = int(event["event"])
            if kind & CONNECT_EVENTS:
                if kind == zmq.EVENT_CONNECTED:
                    self._connected_ever = True
                elif len(self._seen) < 64 and not self._connected_ever:  # only the first attempts matter
                    self._seen.append(EVENT_NAMES.get(kind, ""))
                    self._early_verdict(diagnose(self._seen, self._connected_ever))
                continue
            if kind == zmq.EVENT_DISCONNECTED:
                if self.link is not None:
                    self.link.hold_blocked()
                self._on_link_lost()
                continue
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if self.session.failover:
                    continue  # each socket of a list gets its CONNECT when it is opened
                frames = self.session.link_up(time.monotonic())
                if frames is not None and self.link is not None and not self.link.closed:
                    self.link.send_now(frames)
                    self._on_link_up()
                continue
            reason = HANDSHAKE_FAILURES.get(kind)
            if reason is None:
                continue
            if self._curve is None:
                reason = NO_KEY_FAILURE
            error = AuthFailed(f"{self.endpoint}: {reason}")
            if not self.refused(error):
                self._on_refused(error)

    async def _await_answer(self, timeout: float) -> None:
        """Wait for the broker's OK; after REFUSED_AFTER (or the timeout, if shorter) a refused or
        unresolvable endpoint is reported as such (Unreachable) instead of waiting out the timeout."""
        assert self._answer is not None
        early = min(timeout, REFUSED_AFTER)
        try:
            await asyncio.wait_for(asyncio.shield(self._answer), early)
            return
        except TimeoutError:
            verdict = diagnose(self._seen, self._connected_ever)
            if verdict is not None:
                raise Unreachable(unreachable_message(self.endpoint, verdict), verdict=verdict) from None
            if early >= timeout:
                raise
        await asyncio.wait_for(asyncio.shield(self._answer), timeout - early)

    async def _switch_to(self, endpoint: str) -> None:
        """A new socket to ``endpoint`` under the Link; the old one, its monitor and watcher closed."""
        assert self.link is not None
        old_socket, old_monitor, old_watcher = self._socket, self._monitor, self._watcher
        if old_watcher is not None:
            old_watcher.cancel()
            self._watcher = None
            try:
                await old_watcher
            except asyncio.CancelledError:
                pass
        if self._stopped:  # close() ran meanwhile (it closed the old socket): dial nothing
            raise ClosedError("client closed")
        if old_socket is not None and old_monitor is not None:
            old_socket.disable_monitor()
            old_monitor.close(linger=0)
        self.link.replace_socket(self._dial(endpoint))
        if old_socket is not None:
            old_socket.close(linger=0)
        self._watch_monitor()

    async def _attempt(self, endpoint: str, budget: float, *, switch: bool = True) -> None:
        """CONNECT to ``endpoint`` (on a new socket unless ``switch`` is false) and wait up to
        ``budget`` for the OK; raises what went wrong (the monitor fails it early when refused)."""
        if self._stopped:
            raise ClosedError("client closed")
        if switch:
            await self._switch_to(endpoint)
        assert self.link is not None
        self._answer = connected = asyncio.get_running_loop().create_future()
        self.link.send_now(self.session.connect(time.monotonic()))
        try:
            await asyncio.wait_for(asyncio.shield(connected), budget)
        except TimeoutError:
            raise Timeout(f"connect to {endpoint}", round(budget, 3), no_answer_detail(self._connected_ever)) from None
        finally:
            connected.cancel()  # a late answer or failure for this attempt is nobody's business

    def _early_verdict(self, verdict: str | None) -> None:
        """The monitor diagnosed the endpoint being tried (refused / unresolvable): with a list,
        move on at once instead of waiting for the attempt's budget."""
        connected = self._answer
        if verdict is not None and len(self.endpoints) > 1 and connected is not None and not connected.done():
            connected.set_exception(Unreachable(unreachable_message(self.endpoint, verdict), verdict=verdict))

    async def _connect_any(self, timeout: float) -> None:
        """The first connection with a list: in order, the first broker to accept wins, within ``timeout``."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + timeout
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
            if not refused_only or loop.time() - started >= min(timeout, REFUSED_AFTER):
                break
            await asyncio.sleep(ROUND_PAUSES[min(rounds, len(ROUND_PAUSES) - 1)])
            rounds += 1
        raise none_answered(outcomes, timeout)

    # ------------------------------------------------------------ losing a broker
    def lose(self, reason: str, timeout: float) -> None:
        """The broker we were on is gone: the connection settles what was in flight, then we fail
        over (once at a time), each endpoint given at most ``timeout`` (and FAILOVER_ATTEMPT)."""
        if self._stopped or not self.session.ever_connected or self.link is None:
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
                self.link.read_left()
            finally:
                self._reading_lost = False
        self._on_broker_lost(lost)  # (again while a failover runs: what waits stays, nothing twice)
        if failing:
            return  # the failover under way goes on: it checks the broker it reached is still there
        log.warning("lost the broker at %s (%s): failing over", lost, reason)
        self._failing = asyncio.get_running_loop().create_task(
            self._fail_over(lost, time.monotonic(), timeout), name="mc0-failover"
        )

    async def _fail_over(self, lost: str, started: float, timeout: float) -> None:
        """Round the list from the endpoint after ``lost`` until a broker accepts us (or close())."""
        order = failover_order(self.endpoints, lost)
        budget = min(timeout, FAILOVER_ATTEMPT)
        rounds = 0
        while not self._stopped:
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
