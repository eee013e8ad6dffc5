"""asyncio client: ``mc0.aio.Client`` (the operations; the connection is :mod:`mc0.aio.connection`).

Contract: ``publish`` queues into one outgoing buffer coalesced into one
send per event-loop turn (waiting for room only when ``max_outgoing`` bytes
are already waiting: back-pressure, never silent loss); ``subscribe``
returns a :class:`~mc0.aio.subscription.Subscription` fed a whole received batch
at a time; ``request``/``submit`` resolve one future per request (no task,
no timer of their own); ``stream``/``scatter`` iterate replies.  The sync
:class:`mc0.Client` mirrors these names.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from .. import protocol as P
from ..errors import BadRequest, ClosedError, ProtocolError, Timeout
from ..message import Ack, FetchResult, Record, Reply
from ..protocol import JOURNAL_SERVICE, Command, Header, Status, parse_journal_page
from ..session import MAILBOX_KEY, group_key, replay_key
from .connection import DEFAULT_MAX_OUTGOING, Connection, Waiter
from .consumer import Consumer
from .pages import PageStream
from .replies import ReplyStream
from .subscription import DEFAULT_MAX_PENDING, DEFAULT_MAX_PENDING_BYTES, Subscription

if TYPE_CHECKING:
    from opentelemetry.trace import Span

DEFAULT_REQUEST_TIMEOUT = 30.0
# What a broker from before letters took a MSGID answered one (400): the automatic MSGID is dropped there.
OLD_BROKER_TO_MSGID = "MSGID is for journaled topics, not for TO"
# How fetch() asks for its pages: columns, as large as the broker builds them.
FETCH_PAGES = {"page": P.PAGE_COLUMNS, "page_records": 4000, "page_bytes": 4 << 20}

__all__ = ["DEFAULT_MAX_OUTGOING", "DEFAULT_REQUEST_TIMEOUT", "Client", "ack_of"]


DRAIN_POLL = 0.005  # seconds between checks for outstanding requests while draining


class Client(Connection):
    """Publish, subscribe, ping and make requests over one DEALER connection."""

    _draining = False  # drain() started: no new subscriptions
    _mailbox: Subscription | None = None

    async def connect(self) -> Self:
        self.mailbox  # noqa: B018 - opened before CONNECT: a letter kept for us arrives right after the OK
        return await super().connect()

    @property
    def mailbox(self) -> Subscription:
        """Direct messages sent to this client's identity (``send_to``), including those the
        broker kept while none of the identity's sessions was connected."""
        if self._mailbox is None:
            self._mailbox = Subscription(self, (), DEFAULT_MAX_PENDING, tracing=self.tracing)
            self._subscriptions[MAILBOX_KEY] = [self._mailbox]
        return self._mailbox

    async def consume(
        self,
        journal: str,
        name: str,
        *,
        topics: Sequence[str] = (">",),
        ack_wait: float = 30.0,
        max_deliver: int = 5,
        max_ack_pending: int = 1_000,
        deliver: str = "all",
        timeout: float | None = None,
    ) -> Consumer:
        """A durable consumer named ``name`` on ``journal`` (created if new; the same
        config again is fine, another one is ``Conflict``).  The broker keeps its
        position across restarts; it belongs to this client's identity, whose clients
        share its messages (another identity gets ``Forbidden``).  ``deliver``: ``"all"``
        (from the oldest record kept) or ``"new"`` (from the journal's end now).
        A message not settled within ``ack_wait`` seconds is delivered again, at
        most ``max_deliver`` times in all, then published to
        ``mc0.sys.dead.<journal>.<name>``; at most ``max_ack_pending`` are out unsettled."""
        query = {
            "op": "create",
            "journal": journal,
            "name": name,
            "topics": list(topics),
            "ack_wait_ms": max(1, round(ack_wait * 1000)),
            "max_deliver": max_deliver,
            "max_ack_pending": max_ack_pending,
            "deliver": deliver,
        }
        await self.request(P.CONSUMER_SERVICE, json.dumps(query), timeout=timeout)
        return Consumer(self, journal, name, tracing=self.tracing)

    async def send_to(
        self,
        identity: str,
        topic: str,
        body: bytes | Sequence[bytes],
        *,
        headers: Mapping[str, str] | None = None,
        confirm: bool = False,
        msgid: str | None = None,
        timeout: float | None = None,
    ) -> str | None:
        """A direct message to one authenticated identity (``PUT TO``): delivered to its newest
        session, or kept by the broker until one connects (bounded; 429 when full).  With
        ``confirm`` returns the broker's word: ``"delivered"`` or ``"stored"``.  ``msgid`` makes a
        retry safe, as for ``publish``: a repeat within the dedup window is taken once (answered
        with the first one's word); a confirmed letter without one gets one of its own, so the copy
        a failover sends again is taken once."""
        given = msgid
        request_id = self.session.new_id() if confirm else None
        if request_id is not None and msgid is None:
            msgid = self.auto_msgid_prefix + request_id
        span = None
        if self.tracing is not None:
            span, headers = self.tracing.publish(topic, headers, msgid=msgid, sender=self.identity, to=identity)
        try:
            if request_id is None:
                self._send(self.session.publish(topic, body, headers, msgid=msgid, to=identity))
                return None
            frames = self.session.publish(topic, body, headers, request_id, msgid, to=identity)
            what = f"send to {identity!r}"
            try:
                answer = await self._call(request_id, frames, timeout, what)
            except BadRequest as exc:
                if given is not None or OLD_BROKER_TO_MSGID not in exc.reason:
                    raise
                # A broker from before letters took MSGIDs refuses ours (it dedups no letter): without it.
                request_id = self.session.new_id()
                frames = self.session.publish(topic, body, headers, request_id, to=identity)
                answer = await self._call(request_id, frames, timeout, what)
            return answer.headers.get(Header.MAILBOX)
        except BaseException as exc:
            if span is not None:
                self._traced_failure(span, exc)
            raise
        finally:
            if span is not None:
                span.end()

    # ------------------------------------------------------------ publishing
    async def publish(
        self,
        topic: str,
        body: bytes | Sequence[bytes],
        *,
        headers: Mapping[str, str] | None = None,
        confirm: bool = False,
        msgid: str | None = None,
        timeout: float | None = None,
    ) -> Ack | None:
        """PUT; with ``confirm`` wait for the broker's OK (raise its ERROR) and return it.

        Without ``confirm`` the message joins the outgoing buffer and this
        returns at once, unless ``max_outgoing`` bytes already wait to be
        sent: then it waits for room (bounded by ``timeout``), so a fast
        publisher is slowed, never silently dropped.  On a journaled topic the
        OK comes once the message is written (per the journal's fsync policy)
        and names its ``seq``; ``msgid`` makes a retry safe: a repeat within
        the journal's dedup window is acknowledged as a duplicate and not
        delivered again.  A confirmed publish without ``msgid`` gets one of its
        own, unique to this client (``auto_msgid_prefix`` + its request id), so
        the copy a failover sends again to another broker is stored once.
        """
        if not confirm:
            out = self._outgoing()
            if headers is None and msgid is None and type(body) is bytes and self.tracing is None:
                out.send_record(self.session.publish_record(topic, body))
            elif self.tracing is None:
                out.send(self.session.publish(topic, body, headers, msgid=msgid))
            else:
                out.send_record(self._traced_record(topic, body, headers, msgid))
            if out.pending >= out.max_bytes:
                await self._room(timeout)
            return None
        request_id = self.session.new_id()
        if msgid is None:
            msgid = self.auto_msgid_prefix + request_id
        if self.tracing is not None:
            return await self._confirmed_traced(topic, body, headers, msgid, request_id, timeout)
        frames = self.session.publish(topic, body, headers, request_id, msgid)
        answer = await self._call(request_id, frames, timeout, f"publish to {topic!r}")
        return ack_of(answer)

    def _traced_record(
        self, topic: str, body: bytes | Sequence[bytes], headers: Mapping[str, str] | None, msgid: str | None
    ) -> bytes:
        """A fire-and-forget PUT as a record, under its PRODUCER span (``tracing`` is on): the span
        covers validating and queueing it, in the caller's thread and context."""
        assert self.tracing is not None
        span, headers = self.tracing.publish(topic, headers, msgid=msgid, sender=self.identity)
        try:
            return self.session.to_send(self.session.publish(topic, body, headers, msgid=msgid))
        except BaseException as exc:
            self._traced_failure(span, exc)
            raise
        finally:
            span.end()

    async def _confirmed_traced(
        self,
        topic: str,
        body: bytes | Sequence[bytes],
        headers: Mapping[str, str] | None,
        msgid: str,
        request_id: str,
        timeout: float | None,
    ) -> Ack:
        """A confirmed PUT under its PRODUCER span, which ends at the broker's OK (or ERROR)."""
        assert self.tracing is not None
        span, headers = self.tracing.publish(topic, headers, msgid=msgid, sender=self.identity)
        try:
            frames = self.session.publish(topic, body, headers, request_id, msgid)
            ack = ack_of(await self._call(request_id, frames, timeout, f"publish to {topic!r}"))
            self.tracing.stored(span, ack.journal, ack.seq)
            return ack
        except BaseException as exc:
            self._traced_failure(span, exc)
            raise
        finally:
            span.end()

    def _traced_failure(self, span: Span, error: BaseException) -> None:
        if self.tracing is not None and not isinstance(error, asyncio.CancelledError | GeneratorExit):
            self.tracing.failed(span, error)

    def publish_nowait(
        self,
        topic: str,
        body: bytes | Sequence[bytes],
        *,
        headers: Mapping[str, str] | None = None,
        msgid: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Fire-and-forget PUT without awaiting; safe to call from any thread.

        Bad input raises here, in the caller.  From another thread this
        blocks while ``max_outgoing`` bytes wait to be sent (``Timeout`` after
        ``timeout``); on the client's own loop it never blocks (``publish``
        is the one that waits for room there).
        """
        if headers is None and msgid is None and type(body) is bytes and self.tracing is None:
            record = self.session.publish_record(topic, body)
        elif self.tracing is None:
            record = self.session.to_send(self.session.publish(topic, body, headers, msgid=msgid))
        else:
            record = self._traced_record(topic, body, headers, msgid)
        out = self._outgoing()
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            out.send_record(record)
            return
        out.wait_for_room_threadsafe(self.timeout if timeout is None else timeout)
        out.send_record_threadsafe(record)

    async def flush(self, *, timeout: float | None = None) -> None:
        """Return once everything queued so far has reached the broker (a PING round trip)."""
        await self.ping(timeout=timeout)

    async def _room(self, timeout: float | None) -> None:
        wait = self.timeout if timeout is None else timeout
        try:
            await asyncio.wait_for(self._outgoing().wait_for_room(), wait)
        except TimeoutError:
            state = "connected" if self.session.connected else "disconnected"
            raise Timeout(f"room in the outgoing buffer ({state}, {self.max_outgoing} bytes)", wait) from None

    # ------------------------------------------------------------ subscribing
    async def subscribe(
        self,
        *patterns: str,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        from_seq: int | None = None,
        journal: str | None = None,
        timeout: float | None = None,
        group: str | None = None,
    ) -> Subscription:
        """Subscribe to one or more patterns; returns once the broker confirmed them.

        A message matching several of the patterns is delivered once.  The
        subscription holds at most ``max_pending`` messages / ``max_pending_bytes``
        of bodies that the application has not taken yet; beyond that it drops
        new ones, counts them (``dropped``), logs and reports a ``SlowConsumer``
        fault.  With ``from_seq`` the broker first replays the journaled history
        from that sequence number (0 = the oldest kept; ``journal`` picks the
        journal when several keep these topics), then continues live, in order
        and without gaps or repeats; ``Gone`` if that history was trimmed.
        The replayed history is this subscription's alone (another subscription
        of the pattern, which heard it live, does not get it again).  A replay
        the broker ends early (410 trimmed, 507 unreadable, 504 a JetStream
        copy behind) ends this subscription alone: reading it then raises
        ``ClosedError`` naming the code and reason (``error`` holds it), while
        other subscriptions of the same patterns go on.
        With ``group`` this subscription joins a queue group: each matching
        message goes to one member of the group (the least recently chosen one
        that keeps up), while plain subscriptions still get every message.
        """
        self.ensure_open()
        if self._draining:
            raise ClosedError("client is draining: no new subscriptions")
        if not patterns:
            raise ValueError("subscribe needs at least one pattern")
        if group is not None and from_seq is not None:
            raise ProtocolError(
                Status.BAD_REQUEST, "a queue group subscription cannot replay history (group with from_seq)"
            )
        request_id = self.session.new_id() if from_seq is not None else ""
        sub = Subscription(
            self,
            tuple(dict.fromkeys(patterns)),
            max_pending,
            max_pending_bytes,
            group=group,
            from_seq=from_seq,
            journal=journal,
            replay_key=replay_key(request_id) if from_seq is not None else None,
            tracing=self.tracing,
        )
        added: list[str] = []
        if from_seq is not None and sub.replay_key is not None:
            replay = self.session.replay_patterns(sub.patterns, from_seq, journal, request_id)
            self._subscriptions[sub.replay_key] = [sub]  # (its history: mc0.session routes it there alone)
            for pattern in sub.patterns:
                added.append(pattern)
                self._subscriptions.setdefault(pattern, []).append(sub)
            try:
                answer = await self._call(request_id, replay, timeout, f"subscribe from {from_seq} to {sub.pattern!r}")
            except BaseException:
                await self._release(sub, added)
                raise
            journal_name, end = answer.headers.get(Header.JOURNAL), P.decimal(answer.headers.get(Header.SEQ, ""))
            if journal_name is not None and end is not None:
                sub.history = (journal_name, end)  # (its records are linked, not parented, by tracing)
            return sub
        try:
            for pattern in sub.patterns:
                request_id = self.session.new_id()
                frames = self.session.add_pattern(pattern, request_id, group)
                added.append(pattern)
                self._subscriptions.setdefault(group_key(pattern, group), []).append(sub)
                if frames is not None:
                    what = f"subscribe to {pattern!r}" + (f" in group {group!r}" if group else "")
                    await self._call(request_id, frames, timeout, what)
        except BaseException:
            await self._release(sub, added)
            raise
        return sub

    async def unsubscribe(self, subscription: Subscription | str) -> None:
        """End a subscription (or every plain subscription that includes a pattern)."""
        if isinstance(subscription, str):
            for sub in list(self._subscriptions.get(subscription, ())):
                await self.unsubscribe(sub)
            return
        await self._release(subscription, subscription.patterns)

    async def _release(self, sub: Subscription, patterns: Sequence[str], *, tell_broker: bool = True) -> None:
        self._release_now(sub, patterns, tell_broker=tell_broker)

    # ------------------------------------------------------------ draining
    async def drain(self, *, timeout: float | None = None) -> None:
        """Stop receiving, let what is outstanding finish, then close (NATS' drain).

        1. Every subscription is withdrawn at the broker, and that is confirmed,
           so nothing new is routed here; what the broker routed before still
           arrives in its subscription.
        2. Publishes queued so far reach the broker, and requests already sent
           get their answers (or their own timeouts).
        3. ``close()``.  Nothing received is thrown away: each subscription
           yields what it holds, then ends (iteration stops).

        Bounded by ``timeout`` (default: the client's ``timeout``): past it the
        client closes anyway and raises ``Timeout`` naming what was left.
        New subscriptions are refused once draining started.
        """
        self.ensure_open()
        wait = self.timeout if timeout is None else timeout
        self._draining = True
        subs = list({id(s): s for holders in self._subscriptions.values() for s in holders}.values())
        try:
            async with asyncio.timeout(wait):
                if self.session.connected:
                    for sub in subs:
                        for pattern in sub.patterns:
                            self._send(self.session.unsub_frames(pattern, sub.group))
                    await self.flush()  # the UNSUBs (and every publish before them) reached the broker
                for sub in subs:
                    await self._release(sub, sub.patterns, tell_broker=False)
                await self._until_idle(lambda: bool(self._calls or self._reply_streams or self._pending))
        except TimeoutError:
            left = f"{len(self._calls) + len(self._reply_streams)} requests unanswered"
            await self.close()
            raise Timeout(f"drain ({left})", wait) from None
        await self.close()

    @staticmethod
    async def _until_idle(busy: Callable[[], bool]) -> None:
        """Poll every DRAIN_POLL until ``busy()`` is false; the caller bounds it with a timeout."""
        for _ in range(1_000_000):  # and by count: 5,000 s
            if not busy():
                return
            await asyncio.sleep(DRAIN_POLL)

    # ------------------------------------------------------------ journals
    async def journal_info(self, *, timeout: float | None = None) -> dict[str, dict[str, Any]]:
        """Every journal's ``first_seq``, ``next_seq``, size and settings (``mc0.journal info``)."""
        reply = await self.request(JOURNAL_SERVICE, b'{"op":"info"}', timeout=timeout)
        info: dict[str, dict[str, Any]] = json.loads(reply.body)
        return info

    async def fetch(
        self,
        journal: str,
        *,
        from_seq: int = 0,
        to_seq: int | None = None,
        topics: Sequence[str] = (),
        max_records: int | None = None,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> FetchResult:
        """Records ``from_seq <= seq < to_seq`` of a journal (0 = the oldest kept).

        One call returns at most the broker's page limits (``max_records`` /
        ``max_bytes`` lower them); continue from ``next_seq``.  Deterministic:
        the same arguments give the same records.  ``Gone`` if ``from_seq`` was
        trimmed by retention; only topics this identity may subscribe to are
        returned.
        """
        # Columns pages (the broker builds them ~3x cheaper than JSON ones); a broker from before
        # them ignores the option and sends JSON pages, read as ever.
        query: dict[str, object] = {
            "op": "fetch",
            "journal": journal,
            "from_seq": from_seq,
            "topics": list(topics),
            **FETCH_PAGES,
        }
        if to_seq is not None:
            query["to_seq"] = to_seq
        if max_records is not None:
            query["max_records"] = max_records
        if max_bytes is not None:
            query["max_bytes"] = max_bytes
        records: list[Record] = []
        stream = await self.stream(JOURNAL_SERVICE, json.dumps(query).encode(), timeout=timeout)
        async with stream:
            async for reply in stream:
                if reply.final:
                    pass
                elif reply.parts and P.is_columns_page(reply.parts[0]):
                    records += P.parse_columns_page(reply.parts[0]).records()
                else:
                    records += parse_journal_page(reply.parts)
        assert stream.final is not None
        summary = json.loads(stream.final.body)
        return FetchResult(records, int(summary["next_seq"]), int(summary["first_seq"]), int(summary["end_seq"]))

    async def fetch_pages(
        self,
        journal: str,
        *,
        from_seq: int = 0,
        to_seq: int | None = None,
        topics: Sequence[str] = (),
        max_records: int | None = None,
        max_bytes: int | None = None,
        page_records: int | None = None,
        page_bytes: int | None = None,
        timeout: float | None = None,
    ) -> PageStream:
        """``fetch`` as a stream of columns pages, each handed out as it arrives (for bulk readers:
        ``mc0.spark`` builds Arrow batches from their buffers).  Same range, limits and
        determinism as ``fetch``; continue from the stream's ``next_seq`` once it ended.
        ``page_records`` / ``page_bytes`` ask for larger pages than the broker's 1,000 records /
        1 MiB (at most 4,000 / 4 MiB; fewer hand-overs per record, the same broker time per turn)."""
        query: dict[str, object] = {
            "op": "fetch",
            "journal": journal,
            "from_seq": from_seq,
            "topics": list(topics),
            "page": P.PAGE_COLUMNS,
        }
        if to_seq is not None:
            query["to_seq"] = to_seq
        if max_records is not None:
            query["max_records"] = max_records
        if max_bytes is not None:
            query["max_bytes"] = max_bytes
        if page_records is not None:
            query["page_records"] = page_records
        if page_bytes is not None:
            query["page_bytes"] = page_bytes
        return PageStream(await self.stream(JOURNAL_SERVICE, json.dumps(query).encode(), timeout=timeout))

    async def ping(self, *, timeout: float | None = None) -> float:
        """Round trip to the broker in seconds (everything sent before it has reached the broker)."""
        request_id = self.session.new_id()
        started = time.perf_counter()
        await self._call(request_id, self.session.ping(request_id), timeout, "ping")
        return time.perf_counter() - started

    # ------------------------------------------------------------ requests
    async def stream(
        self,
        service: str,
        body: bytes | str | Sequence[bytes] = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> ReplyStream:
        """Send a REQUEST; iterate the returned stream for PARTIALs then the FINAL."""
        return await self._start(service, body, timeout, headers, scatter=False)

    async def request(
        self,
        service: str,
        body: bytes | str | Sequence[bytes] = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """Send a REQUEST and return its FINAL (PARTIALs are skipped); ERROR raises."""
        if headers or not isinstance(body, bytes | str) or self.tracing is not None:
            stream = await self._start(service, body, timeout, headers, scatter=False)
            async for _ in stream:
                pass
            assert stream.final is not None
            return stream.final
        return await self._request(service, body, timeout)

    def _request(self, service: str, body: bytes | str, timeout: float | None) -> asyncio.Future[Reply]:
        """A REQUEST whose FINAL resolves one future: no stream, no task, no timer of its own."""
        out = self._outgoing()
        record, request_id, give_up = self._call_record(service, body, timeout)
        assert self._loop is not None
        future: asyncio.Future[Reply] = self._loop.create_future()
        self._await_call(request_id, future, give_up)
        out.send_record(record)
        return future

    def request_threadsafe(
        self, service: str, body: bytes | str = b"", *, timeout: float | None = None
    ) -> concurrent.futures.Future[Reply]:
        """``request`` from any other thread, answered on a ``concurrent.futures.Future``.

        Bad input raises here, in the caller; the REQUEST joins the outgoing
        buffer with one wake-up of the client's loop per burst (no task per
        call), and the FINAL (or ERROR, as its exception) resolves the future.
        """
        out = self._outgoing()
        if self.tracing is not None:  # the span is made on the loop, in this thread's context (copied)
            assert self._loop is not None
            return asyncio.run_coroutine_threadsafe(self.request(service, body, timeout=timeout), self._loop)
        record, request_id, give_up = self._call_record(service, body, timeout)
        future: concurrent.futures.Future[Reply] = concurrent.futures.Future()
        # Registered on the loop just before the record is queued there: before any answer.
        out.send_record_threadsafe(record, functools.partial(self._await_call, request_id, future, give_up))
        return future

    def _call_record(self, service: str, body: bytes | str, timeout: float | None) -> tuple[bytes, str, float]:
        seconds = self.request_timeout if timeout is None else timeout
        request_id = self.session.new_id()
        data = body.encode() if isinstance(body, str) else body
        record = self.session.call_record(service, data, request_id, max(1, round(seconds * 1000)))
        # The broker enforces the deadline and always answers; the grace covers its answer's trip.
        give_up = time.monotonic() + seconds + max(1.0, 2 * self.session.ttl)
        return record, request_id, give_up

    def _await_call(self, request_id: str, future: Waiter[Reply], give_up: float) -> None:
        self._calls[request_id] = future
        self._call_deadlines.add(give_up, request_id)
        self._arm_timer(give_up)

    async def scatter(
        self,
        service: str,
        body: bytes | str | Sequence[bytes] = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> ReplyStream:
        """Send the request to every worker of the service; iterate per-worker replies."""
        return await self._start(service, body, timeout, headers, scatter=True)

    def submit(
        self,
        service: str,
        body: bytes | str | Sequence[bytes] = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> asyncio.Future[Reply]:
        """``request`` without awaiting it, for many requests at once (``asyncio.gather``)."""
        if headers or not isinstance(body, bytes | str) or self.tracing is not None:
            return asyncio.ensure_future(self.request(service, body, timeout=timeout, headers=headers))
        return self._request(service, body, timeout)

    async def _start(
        self,
        service: str,
        body: bytes | str | Sequence[bytes],
        timeout: float | None,
        headers: Mapping[str, str] | None,
        scatter: bool,
    ) -> ReplyStream:
        self.ensure_open()
        seconds = self.request_timeout if timeout is None else timeout
        request_id = self.session.new_id()
        traced = None
        if self.tracing is not None:
            how = "scatter" if scatter else "request"
            span, headers = self.tracing.request(service, headers, request_id=request_id, caller=self.identity, how=how)
            traced = (self.tracing, span)
        try:
            frames = self.session.request(service, body, request_id, max(1, round(seconds * 1000)), headers, scatter)  # type: ignore[arg-type]
        except BaseException as exc:
            if traced is not None:
                traced[0].answered(traced[1], exc)
            raise
        # The broker enforces the deadline and always answers; the grace covers its answer's trip.
        wait = seconds + max(1.0, 2 * self.session.ttl)
        stream = ReplyStream(self, request_id, service, scatter, wait, traced=traced)
        self._reply_streams[request_id] = stream
        try:
            self._send(frames)
        except BaseException as exc:
            stream.finish(exc)
            raise
        return stream


def ack_of(answer: Command) -> Ack:
    """The OK to a confirmed publish as an Ack."""
    headers = answer.headers
    seq = headers.get(Header.SEQ)
    return Ack(headers.get(Header.JOURNAL), P.decimal(seq) if seq else None, headers.get(Header.DUPLICATE) == "1")
