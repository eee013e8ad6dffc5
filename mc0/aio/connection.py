"""The client's connection: socket, session, the reader and timer tasks, and what they dispatch.

Contract: :class:`Connection` is the base of :class:`mc0.aio.Client`: the
constructor does no I/O; ``connect()`` opens a DEALER socket, sends CONNECT
(asking for batched framing) and waits for the broker's OK; a reader task
decodes each received message (a batch in one pass; ``Link`` calls
``_on_message``) and dispatches what it holds: messages to subscriptions, answers to whoever waits for them; one
timer (a loop ``call_later`` handle at the earliest deadline, moved only when a
deadline comes earlier: no task, no wake-up per request) heartbeats, heals
(CONNECT again, re-SUB every pattern) and times out requests the broker never
answered; ``close()`` is idempotent.  Everything
sent and received goes through :class:`~mc0.aio.link.Link`.  The socket,
its monitor and the Link are its :class:`~mc0.aio.dialer.Dialer`'s: the
endpoint may be a comma-separated list, the client is on one broker at a
time (``endpoint``) and the dialer fails over to another when it loses it;
the connection settles what the lost broker had in flight.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Self, TypeAlias, TypeVar

import zmq
import zmq.asyncio

from .. import keys as keyfiles
from .. import protocol as P
from ..deadlines import Deadlines
from ..endpoints import parse_endpoints
from ..errors import AuthFailed, ClosedError, ConfigError, Error, NotConnected, Timeout
from ..message import Message, Reply, frozen_builder
from ..protocol import Command, Limits, Status, Verb, batch
from ..session import (
    Answer,
    ClientSession,
    Connected,
    ConnectRefused,
    Event,
    Fault,
    Frames,
    Received,
    Reconnecting,
    ReplayEnded,
    answer_error,
    group_key,
)
from ..settings import ENV_BROKER_KEY, ENV_ENDPOINT, ENV_KEY, ClientConfig
from ..tracing import tracing_for
from .dialer import SOCKET_HWM, Dialer
from .link import Link
from .replies import ReplyStream
from .subscription import Subscription

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["DEFAULT_MAX_OUTGOING", "SOCKET_HWM", "Connection", "Waiter"]

log = logging.getLogger("mc0.client")

# What may wait to be sent (buffered while connected, or while the connection heals) before a
# publisher waits for room: nats-py's pending_size is 2 MiB; batches make more useful here.
DEFAULT_MAX_OUTGOING = 8 * 1024 * 1024
_new_reply = frozen_builder(Reply)
_NO_HEADERS: Mapping[str, str] = {}
# Commands a failover sends again when the lost broker had them unanswered: a PUT (a journal drops
# a repeat by its MSGID) and a PING.  Anything else it may have acted on is failed instead.
RESENT_VERBS = frozenset({Verb.PUT.value.encode(), Verb.PING.value.encode()})

T = TypeVar("T")
# What a request's answer resolves: an asyncio future, or a concurrent one for another thread
# (both have done / set_result / set_exception, all the loop uses).
Waiter: TypeAlias = "asyncio.Future[T] | concurrent.futures.Future[T]"


class Connection:
    """One DEALER connection to a broker (of the endpoint list) and the state of what travels over it."""

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
        batch: bool = True,
        max_outgoing: int = DEFAULT_MAX_OUTGOING,
        on_fault: Callable[[Exception], None] | None = None,
        echo: bool = True,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """``key``: this client's secret key (a NAME.key_secret path or a KeyPair);
        ``broker_key``: the broker's public key (a NAME.key path, Z85 bytes or a KeyPair).
        Each falls back to ``MC0_KEY`` / ``MC0_BROKER_KEY``, then the config; with
        neither the client speaks without CURVE.  Files are read by ``connect()``.
        ``batch``: ask the broker for batched framing (many commands per message);
        ``max_outgoing``: bytes that may wait to be sent before a publisher waits;
        ``on_fault``: called (on the event loop) with each fault also kept in ``faults``:
        what the broker reported unasked, a subscription dropping messages, an eviction;
        ``echo=False``: the broker never hands this client its own publishes (NATS no_echo).
        ``endpoint``: one, or a comma-separated list to fail over between (``endpoints``; the
        one in use is ``endpoint``).
        ``tracer_provider``: the OpenTelemetry provider this client makes its spans with
        (:mod:`mc0.tracing`); None: the global one, if the application set one before
        making the client, else no spans and no trace context sent (``tracing`` is None).
        """
        config = config or ClientConfig()
        self._key_spec = key or os.environ.get(ENV_KEY) or config.key or None
        self._broker_key_spec = broker_key or os.environ.get(ENV_BROKER_KEY) or config.broker_key or None
        self.identity: str | None = None  # our key's name, once connected with CURVE
        # One precedence everywhere (CLI, library, pipeline): argument > MC0_ENDPOINT > config > default.
        self.endpoints = parse_endpoints(endpoint or os.environ.get(ENV_ENDPOINT) or config.endpoint)
        self.timeout = timeout if timeout is not None else config.timeout_ms / 1000.0
        self.request_timeout = config.request_timeout_ms / 1000.0
        ttl_ms = round(ttl * 1000) if ttl is not None else config.ttl_ms
        self.session = ClientSession(
            ttl_ms=ttl_ms, liveness=liveness, limits=limits, batch=batch, echo=echo, failover=len(self.endpoints) > 1
        )
        # Confirmed publishes without a MSGID get "<this>.<request id>": unique to this client (its ids
        # never repeat; another client of the identity draws another), so one a failover sends again
        # is stored once by the journal's dedup (docs/PROTOCOL.md, "Failing over to another broker").
        self.auto_msgid_prefix = os.urandom(8).hex() + "."
        self.faults: collections.deque[Exception] = collections.deque(maxlen=100)
        self.on_fault = on_fault
        self.reconnects = 0
        self.max_outgoing = max_outgoing
        self.tracing = tracing_for(tracer_provider)  # (None: off, and nothing of it on any path)
        self._dialer = Dialer(
            self.endpoints,
            self.session,
            context,
            on_link_lost=self._link_lost,
            on_link_up=self._rearm_timer,
            on_refused=self._refused,
            on_broker_lost=self._settle_in_flight,
        )
        # Confirmed publishes and pings in flight, by ID: what a failover sends again.
        self._resend: dict[str, Frames] = {}
        self._out: Link | None = None  # the dialer's, once connect() opened it
        self._timer: asyncio.TimerHandle | None = None  # the next look at the deadlines (_on_timer)
        self._timer_due = math.inf  # when it fires (time.monotonic())
        self._pending: dict[str, asyncio.Future[Command]] = {}  # OK / ERROR / PONG awaited by id
        self._calls: dict[str, Waiter[Reply]] = {}  # request() awaiting a FINAL by id
        self._call_deadlines: Deadlines[str] = Deadlines()  # when to give up on each of _calls
        self._reply_streams: dict[str, ReplyStream] = {}
        self._subscriptions: dict[str, list[Subscription]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop connect() ran on
        self._closed = False
        self._closing = False

    @property
    def endpoint(self) -> str:
        """The endpoint in use (or being tried), one of ``endpoints``."""
        return self._dialer.endpoint

    # ------------------------------------------------------------ lifecycle
    async def connect(self) -> Self:
        """Open the connection and wait for the broker to accept it."""
        if self._closed:
            raise ClosedError("client is closed")
        if self._out is not None:
            return self
        curve = self._curve_keys()  # KeyFileError names the file: before any socket exists
        loop = self._loop = asyncio.get_running_loop()
        self._out = self._dialer.open(loop, curve, self.max_outgoing, self._on_message)
        self._arm_timer()
        try:
            await self._dialer.connect_first(self.timeout)
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

    # What the dialer tells the connection (its constructor's callbacks).
    def _link_lost(self) -> None:
        self._dispatch(self.session.link_lost())

    def _rearm_timer(self) -> None:
        self._arm_timer()

    def _refused(self, error: AuthFailed) -> None:
        """The broker refused our key after it had accepted the session."""
        self.report_fault(error)
        self._fail_pending(error)

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
        for request_id in [r for r in self._reply_streams if r not in unsent]:
            self._reply_streams.pop(request_id).deliver(error)
        out.send_first(again)

    async def close(self) -> None:
        """Send what is queued, say DISCONNECT (confirmed, briefly), stop the tasks, fail what is
        pending (idempotent).

        Waiting for the broker's OK means that once ``close()`` returns the
        broker has forgotten us: no request is dispatched to a closed worker,
        and everything published before ``close()`` reached the broker.
        """
        if self._closed or self._closing:
            return
        self._closing = True
        self._dialer.stop()
        if self._out is not None and self.session.connected:
            request_id = self.session.new_id()
            try:
                await self._call(request_id, self.session.disconnect(request_id), min(1.0, self.timeout), "disconnect")
            except (Error, OSError, zmq.ZMQError):
                pass  # the broker is gone or slow: it will expire us
        self.session.connected = False
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._out is not None:
            self._out.close()
        tasks = self._dialer.tasks
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._fail_pending(ClosedError("client closed"))
        for subs in self._subscriptions.values():
            for sub in subs:
                sub.mark_ended()
        self._subscriptions.clear()
        self._dialer.close()

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

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
        for call in self._calls.values():
            if not call.done():
                call.set_exception(error)
        self._calls.clear()
        self._call_deadlines.clear()
        for stream in list(self._reply_streams.values()):
            stream.deliver(error)
        self._reply_streams.clear()

    # ------------------------------------------------------------ plumbing
    def ensure_open(self) -> None:
        """Raise ``ClosedError`` unless ``connect()`` ran and ``close()`` did not."""
        if self._closed:
            raise ClosedError("client is closed")
        if self._out is None:
            raise ClosedError("client is not connected: call connect() first")

    def _outgoing(self) -> Link:
        self.ensure_open()
        assert self._out is not None
        return self._out

    def _send(self, frames: Frames) -> None:
        self._outgoing().send(frames)

    async def _call(self, request_id: str, frames: Frames, timeout: float | None, what: str) -> Command:
        self.ensure_open()
        future: asyncio.Future[Command] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        if self.session.failover and frames[0] in RESENT_VERBS:
            self._resend[request_id] = frames  # a failover sends it again if the lost broker had it
        wait = self.timeout if timeout is None else timeout
        try:
            self._send(frames)
            command = await asyncio.wait_for(future, wait)
        except TimeoutError:
            raise Timeout(what, wait) from None
        finally:
            self._pending.pop(request_id, None)
            self._resend.pop(request_id, None)
        if command.verb is Verb.ERROR:
            raise answer_error(command)
        return command

    def report_fault(self, error: Exception) -> None:
        """Record a fault the application should see: kept in ``faults``, logged, and ``on_fault``."""
        self.faults.append(error)
        log.warning("%s", error)
        if self.on_fault is not None:
            try:
                self.on_fault(error)
            except Exception:
                log.exception("on_fault callback raised")

    # What the client's subscriptions and reply streams ask of it (subscription.SubscriptionOwner:
    # report_fault and Client.unsubscribe; replies.ReplyOwner: these two and ``connected``):
    # they reach nothing else of the connection.
    def stream_ended(self, request_id: str) -> None:
        """A reply stream stopped listening: nothing more is fed to it."""
        self._reply_streams.pop(request_id, None)

    def cancel_request(self, request_id: str) -> None:
        """Send CANCEL for a request (``ClosedError`` once the client is closed)."""
        self._send(self.session.cancel(request_id))

    def _on_message(self, frames: list[bytes]) -> None:
        """One message from the broker (called by the Link, on the loop)."""
        session = self.session
        if len(frames) == 3 and frames[0] == batch.BATCH and not frames[1]:
            events, replies = session.receive_batch(frames[2], time.monotonic(), self._deliver_run, self._final)
        else:
            events, replies = session.receive(frames, time.monotonic())
        for reply in replies:
            self._send(reply)
        self._dispatch(events)

    def _arm_timer(self, due: float | None = None) -> None:
        """Look at the deadlines by ``due`` (a new deadline; None: the earliest of them all, e.g. after
        the session's changed), unless the timer fires earlier already: a look too early finds
        nothing due and arms again, so only an earlier deadline moves the timer."""
        if self._closing or self._loop is None:
            return
        if due is None:
            due = self.session.next_deadline()
            local = self._next_local_deadline()
            if local is not None:
                due = min(due, local)
        if due >= self._timer_due:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_due = due
        self._timer = self._loop.call_later(max(0.005, due - time.monotonic()), self._on_timer)

    def _on_timer(self) -> None:
        """Heartbeats, healing and request timeouts that are due; then the timer for the next one."""
        self._timer = None
        self._timer_due = math.inf
        if self._closing:
            return
        try:
            now = time.monotonic()
            self._expire_calls(now)
            events, frames = self.session.tick(now)
            for f in frames:
                self._send(f)
            self._dispatch(events)
        finally:
            self._arm_timer()

    def _next_local_deadline(self) -> float | None:
        """The earliest of our own deadlines (requests we wait for; a worker adds its handlers')."""
        return self._call_deadlines.next_due()

    def _expire_calls(self, now: float) -> None:
        for request_id in self._call_deadlines.pop_due(now):
            future = self._calls.pop(request_id, None)
            if future is not None and not future.done():
                future.set_exception(Timeout(f"request {request_id}", 0.0))
                if self.session.connected:
                    self.cancel_request(request_id)

    def _final(self, request_id: str, data: bytes) -> bool:
        """A FINAL record (one body frame, no header but its ID): resolves its ``request()`` at
        once, without an event (False: nobody waits for it that way; the general path then)."""
        call = self._calls.pop(request_id, None)
        if call is None:
            return False
        self._call_deadlines.discard(request_id)
        if not call.done():
            call.set_result(_new_reply((data,), {}, True, None, None))
        return True

    def _deliver_run(self, messages: list[Message], keys: tuple[str, ...]) -> None:
        """Received messages, in order, to every subscription held under their local keys (once each)."""
        if len(keys) == 1:
            for sub in self._subscriptions.get(keys[0], ()):
                sub.offer_run(messages)
        elif keys:
            interested = {id(s): s for k in keys for s in self._subscriptions.get(k, ())}
            for sub in interested.values():
                sub.offer_run(messages)

    def _dispatch(self, events: list[Event]) -> None:
        for event in events:
            if type(event) is Received:
                self._deliver_run([event.message], event.keys)
            else:
                self._on_event(event)

    def _on_event(self, event: Event) -> None:
        if isinstance(event, Answer):
            request_id = event.request_id
            call = self._calls.get(request_id)
            if call is not None:
                self._answer_call(request_id, call, event.command)
                return
            stream = self._reply_streams.get(request_id)
            if stream is not None:
                stream.deliver(event.command)
                return
            future = self._pending.get(request_id)
            if future is not None and not future.done():
                future.set_result(event.command)
        elif isinstance(event, Connected):
            self._arm_timer()
            if event.healed:
                self.reconnects += 1
                log.info("reconnected to %s; %d patterns restored", self.endpoint, len(self._subscriptions))
            if self._out is not None:
                self._out.flush()  # what waited while the connection healed
            self._dialer.accepted(event.ttl_ms)
        elif isinstance(event, ConnectRefused):
            if not self._dialer.refused(event.error):
                self.report_fault(event.error)
        elif isinstance(event, Fault):
            self.report_fault(event.error)
            if event.withdrawn is not None:  # a local key: the pattern, with its group if any
                for sub in self._subscriptions.pop(event.withdrawn, []):
                    sub.patterns = tuple(p for p in sub.patterns if group_key(p, sub.group) != event.withdrawn)
                    if not sub.patterns:
                        sub.mark_ended()
        elif isinstance(event, ReplayEnded):
            self.report_fault(event.error)
            self._replay_ended(event)
        elif isinstance(event, Reconnecting):
            if event.lost and self.session.failover:
                self._dialer.lose(event.reason, self.timeout)
                return
            log.info("reconnecting to %s: %s", self.endpoint, event.reason)
            # The broker forgets a session on reconnect: whatever we were waiting for is lost.
            self._fail_pending(NotConnected(Status.NOT_CONNECTED, f"connection to the broker reset: {event.reason}"))

    def _replay_ended(self, event: ReplayEnded) -> None:
        """End the one subscription whose replay the broker ended, with its reason: the newest that
        subscribed the pattern FROM a seq, naming that journal (else naming none; a journal allows one
        replay at a time).  Its patterns are released as by ``unsubscribe`` (UNSUB for those no other
        subscription holds), so the broker, which kept the SUB, and this client agree again."""
        if event.key is not None:  # its OK named the journal: that one, no guess (gone already: none)
            chosen = list(self._subscriptions.get(event.key, ()))
        else:
            replaying = [s for s in self._subscriptions.get(event.pattern, ()) if s.from_seq is not None]
            chosen = [s for s in replaying if s.journal == event.journal]
            chosen = chosen or [s for s in replaying if s.journal is None]
        if chosen:
            sub = chosen[-1]
            sub.mark_ended(event.error)
            self._release_now(sub, sub.patterns)

    def _release_now(self, sub: Subscription, patterns: Sequence[str], *, tell_broker: bool = True) -> None:
        """Stop feeding ``sub`` its ``patterns``; UNSUB (``tell_broker``) for each no other one holds."""
        sub.mark_ended()
        if sub.replay_key is not None:
            self._subscriptions.pop(sub.replay_key, None)
            self.session.end_replay(sub.replay_key)  # (a heal no longer resumes its replay)
        for pattern in patterns:
            key = group_key(pattern, sub.group)
            holders = self._subscriptions.get(key, [])
            if sub not in holders:
                continue
            holders.remove(sub)
            if not holders:
                del self._subscriptions[key]
            frames = self.session.drop_pattern(pattern, sub.group)
            if frames is not None and tell_broker and not self._closed:
                self._send(frames)

    def _answer_call(self, request_id: str, call: Waiter[Reply], command: Command) -> None:
        verb = command.verb
        if verb is Verb.PARTIAL:
            return  # request() returns the FINAL only
        del self._calls[request_id]
        self._call_deadlines.discard(request_id)
        if call.done():
            return
        if verb is Verb.FINAL:
            headers = command.user_headers() if len(command.headers) > 1 else {}
            call.set_result(_new_reply(tuple(command.payload), headers, True, None, None))
        elif verb is Verb.ERROR:
            call.set_exception(answer_error(command))
