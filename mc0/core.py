"""BrokerCore: the broker's protocol logic with no sockets and no clock.

Contract: ``handle(routing_id, frames, now, identity)`` and ``tick(now)`` map
input to a list of ``(routing_id, frames)`` to send; the shell
(:mod:`mc0.broker`) performs those sends and reports failures back through
``send_failed``.  ``now`` is monotonic seconds supplied by the shell, so every
timing rule (heartbeats, expiry, deadlines, slow consumers) is testable
without sleeps.

A peer's input can never raise out of ``handle``: every malformed message is
answered with ERROR (or, for MDP peers, which have no error reply, dropped)
and counted.

Pub/sub: sessions, a topic trie of subscriber sessions, one MESSAGE built per
PUT.  RPC: services with an LRU list of workers that have spare capacity and
a bounded FIFO queue; every REQUEST ends in exactly one terminal message to
its client (FINAL, or ERROR 499/500/502/503/504); requests whose worker dies
before anything was forwarded are re-queued at the front, up to
``max_attempts`` dispatches.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from . import mdp
from . import protocol as P
from .errors import InvalidTopic, ProtocolError
from .journal import Journal, Trimmed
from .message import Record
from .permissions import ALLOW_ALL, Grants, Permissions
from .protocol import Command, Dialect, Header, Limits, Side, Status, Verb
from .topics import pattern_covers, pattern_matches, split_pattern, split_topic
from .trie import TopicTrie

log = logging.getLogger("mc0.broker")

Out = tuple[bytes, Sequence[bytes]]

# The sweep for heartbeats/expiry runs at the earliest deadline found by the
# previous sweep, but never more often than this (it is O(peers)).
MIN_SWEEP_INTERVAL = 0.05
# Drops to a peer separated by less than this belong to one "queue stays full" episode.
DROP_EPISODE_GAP = 1.0
# A closed connection's session waits for the shell to read its socket empty,
# at most this long (a socket under constant load never reads empty).
CLOSE_WAIT_LIMIT = 0.5
TOPIC_CACHE_SIZE = 4096
LATENCY_SAMPLES = 1024  # per service, for the percentiles in mc0.broker stats

BROKER_SERVICE = "mc0.broker"
MMI_SERVICE = "mmi.service"
JOURNAL_SERVICE = P.JOURNAL_SERVICE
BUILTIN_SERVICES = frozenset({BROKER_SERVICE, MMI_SERVICE, JOURNAL_SERVICE})

# Telemetry the broker publishes about itself (when someone subscribes or a journal keeps it).
SYS_RPC_TOPIC = P.SYS_RPC_TOPIC
SYS_PEER_TOPIC = P.SYS_PEER_TOPIC
BROKER_SENDER = "mc0.broker"

# SUB FROM replay: records read per replaying subscription per loop turn, and
# the pause after its queue filled (it resumes where the send failed).
REPLAY_PAGE = 256
REPLAY_BACKOFF = 0.02
# mc0.journal fetch: one PARTIAL holds at most this; one fetch at most FETCH_MAX_*.
FETCH_PAGE_RECORDS = 1000
FETCH_PAGE_BYTES = 1 << 20
FETCH_MAX_RECORDS = 100_000
FETCH_MAX_BYTES = 16 << 20
MAX_FETCHES_PER_PEER = 8  # fetches under way at once per peer (each sends a page per loop turn)
RETENTION_INTERVAL = 1.0  # seconds between age-retention checks


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """The broker-core knobs (the config file's ``[broker]`` tables map onto these)."""

    limits: Limits = field(default_factory=Limits)
    min_ttl_ms: int = 100
    max_ttl_ms: int = 60_000
    liveness: int = 3
    # A peer whose sends keep failing at HWM for this long is told 429 and
    # forgotten; 0 keeps it (drops are still counted).
    slow_consumer_ms: int = 5_000
    request_timeout_ms: int = 30_000  # when a REQUEST has no TIMEOUT
    max_request_timeout_ms: int = 600_000  # TIMEOUT is clamped to this
    max_queue: int = 10_000  # queued requests per service (429 beyond)
    max_requests: int = 10_000  # outstanding requests per client (429 beyond)
    max_attempts: int = 3  # dispatches of one request before 502
    max_capacity: int = 1_000  # CAPACITY a worker may claim
    mdp_ttl_ms: int = 2_500  # heartbeat interval for MDP/0.2 workers (majortomo's default)


class Session:
    """One connected peer, as the broker sees it (client, subscriber and/or worker)."""

    __slots__ = (
        "routing_id",
        "identity",
        "sender",
        "name",
        "legacy",
        "version",
        "dialect",
        "ttl",
        "last_recv",
        "last_sent",
        "patterns",
        "drops",
        "drop_episode_start",
        "last_drop",
        "delivered",
        "services",
        "capacity",
        "jobs",
        "requests",
        "served",
        "grants",
        "fd",
        "replays",
        "fetches",
    )

    _serials = itertools.count(1)

    def __init__(
        self,
        routing_id: bytes,
        identity: str,
        version: str,
        ttl: float,
        now: float,
        dialect: Dialect,
        fd: int | None = None,
    ) -> None:
        self.routing_id = routing_id
        self.identity = identity
        self.sender = identity.encode()
        # Shown to others (WORKER header, stats): never the routing id, which could help a squatter.
        self.name = f"{identity}#{next(Session._serials)}"
        self.fd = fd  # the connection it arrived on (ZMQ_SRCFD), when the shell knows it
        self.version = version
        self.legacy = version in P.SEED_VERSIONS
        self.dialect = dialect
        self.ttl = ttl
        self.last_recv = now
        self.last_sent = now
        self.patterns: dict[str, tuple[str, ...]] = {}
        self.drops = 0
        self.drop_episode_start = 0.0
        self.last_drop = -1e18
        self.delivered = 0
        self.services: tuple[str, ...] = ()  # served, once READY
        self.capacity = 0
        self.jobs: dict[str, Job] = {}  # bid -> request held as a worker
        self.requests: dict[str, Job | Scatter] = {}  # rid -> request made as a client
        self.served = 0
        self.grants: Grants = ALLOW_ALL
        self.replays: dict[str, Replay] = {}  # journal name -> SUB FROM still catching up
        self.fetches: dict[str, Fetch] = {}  # rid -> mc0.journal fetch still sending pages

    def __repr__(self) -> str:
        return f"<Session {self.name} {self.dialect.name} v{self.version}>"


class Job:
    """One request to one worker (a plain REQUEST, or one leg of a scatter)."""

    __slots__ = (
        "bid",
        "client",
        "rid",
        "service",
        "user",
        "body",
        "created",
        "deadline",
        "attempts",
        "worker",
        "forwarded",
        "done",
        "parent",
        "size",
        "bytes_out",
    )

    def __init__(
        self,
        bid: str,
        client: Session,
        rid: str,
        service: str,
        user: dict[str, str],
        body: Sequence[bytes],
        now: float,
        deadline: float,
        parent: Scatter | None = None,
    ) -> None:
        self.bid = bid
        self.client = client
        self.rid = rid
        self.service = service
        self.user = user
        self.body = body
        self.created = now
        self.deadline = deadline
        self.attempts = 0
        self.worker: Session | None = None
        self.forwarded = False  # a PARTIAL reached the client: no retry after this
        self.done = False
        self.parent = parent
        self.size = sum(map(len, body))
        self.bytes_out = 0


class Scatter:
    """A REQUEST ... ALL 1: one Job per worker, then FINAL COUNT n MISSING m."""

    __slots__ = ("client", "rid", "service", "user", "deadline", "legs", "total", "answered", "done", "created")

    def __init__(self, client: Session, rid: str, service: str, user: dict[str, str], now: float, deadline: float):
        self.client = client
        self.rid = rid
        self.service = service
        self.user = user
        self.created = now
        self.deadline = deadline
        self.legs: dict[str, Job] = {}  # bid -> leg still outstanding
        self.total = 0
        self.answered = 0
        self.done = False


class Replay:
    """A ``SUB FROM seq``: the records still to send from one journal, then live.

    While it runs, live copies of records that it will deliver are held back
    (the replay reaches them in order), so each record arrives once.
    """

    __slots__ = ("journal", "patterns", "cursor", "resume_at")

    def __init__(self, journal: Journal, patterns: list[tuple[str, ...]], cursor: int) -> None:
        self.journal = journal
        self.patterns = patterns
        self.cursor = cursor
        self.resume_at = 0.0

    def matches(self, tokens: tuple[str, ...]) -> bool:
        return any(pattern_matches(p, tokens) for p in self.patterns)


class Fetch:
    """An ``mc0.journal fetch`` sent one page per loop turn (a large fetch never stalls the broker)."""

    __slots__ = (
        "rid",
        "user",
        "journal",
        "cursor",
        "end",
        "match",
        "records_left",
        "bytes_left",
        "count",
        "resume_at",
        "done",
    )

    def __init__(
        self,
        rid: str,
        user: dict[str, str],
        journal: Journal,
        cursor: int,
        end: int,
        match: Callable[[str], bool] | None,
        records_left: int,
        bytes_left: int,
    ) -> None:
        self.rid = rid
        self.user = user
        self.journal = journal
        self.cursor = cursor
        self.end = end
        self.match = match
        self.records_left = records_left
        self.bytes_left = bytes_left
        self.count = 0
        self.resume_at = 0.0
        self.done = False  # FINAL handed to the shell; forgotten next turn unless that send failed


class StreamOut(NamedTuple):
    """A message of a paced stream (a replay or a fetch) and where that stream resumes if it is not queued."""

    routing_id: bytes
    frames: Sequence[bytes]
    kind: str  # "replay" (key = journal name) or "fetch" (key = request id)
    key: str
    seq: int  # the stream's cursor to go back to
    records: int  # records this message carried (fetch accounting)


class Service:
    __slots__ = ("name", "workers", "ready", "queue", "served", "errors", "timeouts", "latencies", "requests")

    def __init__(self, name: str) -> None:
        self.name = name
        self.workers: dict[Session, None] = {}
        # Workers with spare capacity, least recently used first.
        self.ready: dict[Session, None] = {}
        self.queue: deque[Job] = deque()
        self.requests = 0
        self.served = 0
        self.errors = 0
        self.timeouts = 0
        self.latencies: deque[float] = deque(maxlen=LATENCY_SAMPLES)

    def in_flight(self) -> int:
        return sum(1 for w in self.workers for j in w.jobs.values() if j.service == self.name)


def _generated_routing_id(routing_id: bytes) -> bool:
    """libzmq's own routing ids are 5 bytes starting with a zero byte."""
    return len(routing_id) == 5 and routing_id[0] == 0


class BrokerCore:
    def __init__(
        self,
        settings: CoreSettings | None = None,
        permissions: Permissions | None = None,
        *,
        generated_ids_only: bool = False,
        journals: Sequence[Journal] = (),
        wall_offset: float = 0.0,
    ) -> None:
        """``generated_ids_only`` (the broker sets it under CURVE): refuse peers that choose their routing id.

        ``journals`` are opened by the caller; the core appends to them and
        ``commit()`` makes the appends durable.  ``wall_offset`` turns ``now``
        (monotonic) into wall-clock time for telemetry records.
        """
        self.settings = settings or CoreSettings()
        self.wall_offset = wall_offset
        self.journals: dict[str, Journal] = {j.name: j for j in sorted(journals, key=lambda j: j.name)}
        self._journal_routes: TopicTrie[Journal] = TopicTrie()
        for journal in self.journals.values():
            for pattern in journal.settings.topics:
                self._journal_routes.insert(split_pattern(pattern), journal)
        # OKs held until their records are written: (journal, peer, request id, OK frames).
        self._pending_acks: list[tuple[Journal, bytes, str, list[bytes]]] = []
        self._streaming: dict[Session, None] = {}  # sessions with replays or fetches under way
        self._sys_topics = {t: split_topic(t) for t in (SYS_RPC_TOPIC, SYS_PEER_TOPIC)}
        self._next_retention = 0.0
        self.permissions = permissions or Permissions()
        self.generated_ids_only = generated_ids_only
        self._by_fd: dict[int, bytes] = {}
        self._closing: dict[bytes, tuple[int, float]] = {}  # routing id -> (fd, when reported closed)
        self.revoked: set[str] = set()  # identities whose every message is dropped
        self.sessions: dict[bytes, Session] = {}
        self.subscriptions: TopicTrie[Session] = TopicTrie()
        self.services: dict[str, Service] = {}
        self.counters: Counter[str] = Counter()
        self._topics: dict[str, tuple[str, ...]] = {}
        self._service_names: dict[str, tuple[str, ...]] = {}
        self._next_sweep = 0.0
        self._deadlines: list[tuple[float, int, Job | Scatter]] = []
        self._seq = itertools.count(1)

    # ================================================================ input
    def handle(
        self,
        routing_id: bytes,
        frames: Sequence[bytes],
        now: float,
        identity: str = P.ANONYMOUS,
        fd: int | None = None,
    ) -> list[Out]:
        """One message from a peer -> what to send.

        ``identity`` is the authenticated identity of *this message* and ``fd``
        the connection it came on.  A routing id is only a name a peer chose:
        when either differs from its session's, the connection behind that
        routing id changed hands, and the stale session is forgotten before
        anything else (nothing of it reaches the newcomer).
        """
        self.counters["received"] += 1
        if identity in self.revoked:
            self.counters["revoked_dropped"] += 1
            return []
        out: list[Out] = []
        session = self.sessions.get(routing_id)
        if session is not None and (session.identity != identity or (fd is not None and session.fd != fd)):
            self.counters["routing_id_changed_hands"] += 1
            out = self._forget(session, "replaced", now)
            session = None
        if frames and mdp.is_mdp(frames):
            return out + self._handle_mdp(routing_id, frames, now, identity, fd)
        if session is not None:
            session.last_recv = now
        try:
            command = P.decode(frames, sender=Side.PEER, limits=self.settings.limits)
            if session is None:
                if command.verb is Verb.CONNECT:
                    return out + self._connect(routing_id, identity, command, now, fd=fd)
                if command.verb is Verb.DISCONNECT:
                    return out + ([(routing_id, P.ok(command.id))] if command.id is not None else [])
                raise ProtocolError(Status.NOT_CONNECTED, "not connected: send CONNECT first", command.id)
            if session.dialect is not P.MC0_DIALECT:
                raise ProtocolError(Status.BAD_REQUEST, "an MDP peer cannot switch to mc0 frames", command.id)
            return self._dispatch(session, command, now)
        except ProtocolError as exc:
            return out + self._reject(routing_id, session, frames, exc, now)

    def connection_closed(self, fd: int, now: float) -> None:
        """The shell saw connection ``fd`` close; its session goes at ``forget_closed``.

        What that connection sent before it closed may still wait in the
        shell's socket queue (a worker's FINAL, then its DISCONNECT), so the
        session stays until the shell has read the queue empty.  The fd is
        unbound at once: a new connection may reuse the number before then.
        """
        routing_id = self._by_fd.pop(fd, None)
        if routing_id is not None:
            self._closing[routing_id] = (fd, now)

    @property
    def closing(self) -> bool:
        """Closes are waiting for the shell to read its socket empty."""
        return bool(self._closing)

    def forget_closed(self, now: float, *, drained: bool) -> list[Out]:
        """Forget the sessions of closed connections.

        ``drained``: the shell read its socket empty after those closes were
        reported, so all they sent has been handled.  Otherwise (a socket that
        never reads empty under load) only closes older than
        ``CLOSE_WAIT_LIMIT`` go: fair queueing has read their last messages by then.
        """
        out: list[Out] = []
        for routing_id, (fd, reported) in list(self._closing.items()):
            if not drained and now - reported < CLOSE_WAIT_LIMIT:
                continue
            del self._closing[routing_id]
            session = self.sessions.get(routing_id)
            if session is not None and session.fd == fd:
                out += self._forget(session, "closed", now)
        return out

    def _reject(
        self, routing_id: bytes, session: Session | None, frames: Sequence[bytes], exc: ProtocolError, now: float
    ) -> list[Out]:
        self.counters[f"rejected_{exc.code}"] += 1
        if log.isEnabledFor(logging.DEBUG):
            shown = " ".join(repr(bytes(f[:32])) for f in frames[:4])
            log.debug("peer %s: %s %s | %s", routing_id.hex(), exc.code, exc.reason, shown)
        if session is not None:
            session.last_sent = now
        return [(routing_id, P.error(exc.code, exc.reason, exc.request_id))]

    def _dispatch(self, session: Session, command: Command, now: float) -> list[Out]:
        verb = command.verb
        if session.legacy and not P.PEER_GRAMMAR[verb].seed:
            raise ProtocolError(Status.BAD_REQUEST, f"{verb} is not part of protocol {session.version}", command.id)
        if verb is Verb.PUT:
            return self._put(session, command, now)
        if verb is Verb.REQUEST:
            return self._request_command(session, command, now)
        if verb is Verb.PARTIAL or verb is Verb.FINAL or verb is Verb.ERROR:
            return self._worker_reply_command(session, command, now)
        if verb is Verb.NOOP:
            return self._answer(session, command, now)
        if verb is Verb.SUB:
            return self._subscribe(session, command, now)
        if verb is Verb.UNSUB:
            return self._unsubscribe(session, command, now)
        if verb is Verb.READY:
            return self._ready_command(session, command, now)
        if verb is Verb.CANCEL:
            return self._cancel(session, command.headers[Header.ID], now)
        if verb is Verb.PING:
            session.last_sent = now
            return [(session.routing_id, P.encode(Verb.PONG, {Header.ID: command.headers[Header.ID]}))]
        if verb is Verb.CONNECT:
            return self._connect(session.routing_id, session.identity, command, now, replacing=session)
        if verb is Verb.DISCONNECT:
            out = self._forget(session, "disconnected", now)
            if command.id is not None:
                out.append((session.routing_id, P.ok(command.id)))
            return out
        raise AssertionError(f"decode admitted {verb} from a peer")  # pragma: no cover

    def _answer(self, session: Session, command: Command, now: float) -> list[Out]:
        if command.id is None:
            return []
        session.last_sent = now
        return [(session.routing_id, P.ok(command.id))]

    # ================================================================ sessions
    def _connect(
        self,
        routing_id: bytes,
        identity: str,
        command: Command,
        now: float,
        replacing: Session | None = None,
        fd: int | None = None,
    ) -> list[Out]:
        """Open a session; a repeated CONNECT replaces the old one only once it is valid."""
        if self.generated_ids_only and not _generated_routing_id(routing_id):
            raise ProtocolError(
                Status.BAD_REQUEST,
                "under CURVE a peer may not choose its routing id (unset ZMQ_ROUTING_ID)",
                command.id,
            )
        version = command.headers[Header.VERSION]
        if version not in P.VERSIONS:
            raise ProtocolError(
                Status.UNSUPPORTED_VERSION,
                f"version {version[:16]!r} unsupported; this broker speaks {', '.join(sorted(P.VERSIONS))}",
                command.id,
            )
        asked = P.parse_int(command, Header.TTL, minimum=1)
        ttl_ms = min(max(asked, self.settings.min_ttl_ms), self.settings.max_ttl_ms)
        out: list[Out] = []
        if replacing is not None:
            out = self._forget(replacing, "reconnected", now)
        if replacing is not None:
            fd = replacing.fd
        out += self._open(Session(routing_id, identity, version, ttl_ms / 1000.0, now, P.MC0_DIALECT, fd), now)
        log.info("peer %s connected as %s (protocol %s, ttl %d ms)", routing_id.hex(), identity, version, ttl_ms)
        if command.id is not None:
            out.append((routing_id, P.ok(command.id, ttl_ms=ttl_ms)))
        return out

    def _open(self, session: Session, now: float) -> list[Out]:
        session.grants = self.permissions.grants(session.identity)
        self.sessions[session.routing_id] = session
        if session.fd is not None and session.routing_id not in self._closing:
            self._by_fd[session.fd] = session.routing_id
        self.counters["connects"] += 1
        self._next_sweep = min(self._next_sweep, now + session.ttl)
        return self._peer_event("connect", session, "", now)

    def _peer_event(self, event: str, session: Session, reason: str, now: float) -> list[Out]:
        if not self._wanted(SYS_PEER_TOPIC):
            return []
        data: dict[str, object] = {
            "event": event,
            "peer": session.name,
            "identity": session.identity,
            "kind": session.dialect.name,
            "protocol": session.version,
        }
        if reason:
            data["reason"] = reason
        return self._emit(SYS_PEER_TOPIC, data, now)

    def _forget(self, session: Session, why: str, now: float) -> list[Out]:
        """Drop a session and everything it held; returns what that means for others."""
        if self.sessions.get(session.routing_id) is session:
            del self.sessions[session.routing_id]
            if session.fd is not None and self._by_fd.get(session.fd) == session.routing_id:
                del self._by_fd[session.fd]
        for tokens in session.patterns.values():
            self.subscriptions.remove(tokens, session)
        session.patterns.clear()
        session.replays.clear()
        session.fetches.clear()
        self._streaming.pop(session, None)
        self.counters[f"forgotten_{why}"] += 1
        log.info("peer %s %s", session.name, why)
        out: list[Out] = []
        # As a client: its requests are dropped; their workers are told to stop.
        for request in list(session.requests.values()):
            out += self._abandon(request, now)
        session.requests.clear()
        # As a worker: its requests go back to the front of their queues, or fail.
        for name in session.services:
            service = self.services.get(name)
            if service is not None:
                service.workers.pop(session, None)
                service.ready.pop(session, None)
        held = list(session.jobs.values())
        session.jobs.clear()
        session.services = ()
        touched: dict[str, None] = {}
        for job in held:
            job.worker = None
            if job.parent is not None:
                out += self._scatter_leg_done(job, None, now)
            elif job.forwarded or job.attempts >= self.settings.max_attempts:
                why_lost = "after replies were forwarded" if job.forwarded else f"after {job.attempts} attempts"
                out += self._terminate_error(job, Status.WORKER_LOST, f"worker lost {why_lost}", now)
            else:
                self.counters["requests_requeued"] += 1
                self._service(job.service).queue.appendleft(job)
                touched[job.service] = None
        for name in touched:
            out += self._pump(self._service(name), now)
        for name in list(self.services):
            self._drop_if_idle(name)
        out += self._peer_event("disconnect", session, why, now)
        return out

    # ================================================================ pub/sub
    def _topic_tokens(self, topic: str, command: Command) -> tuple[str, ...]:
        tokens = self._topics.get(topic)
        if tokens is None:
            limits = self.settings.limits
            try:
                tokens = split_topic(topic, max_bytes=limits.max_topic_bytes, max_tokens=limits.max_topic_tokens)
            except InvalidTopic as exc:
                raise _topic_error(exc, command.id) from None
            if len(self._topics) >= TOPIC_CACHE_SIZE:
                self._topics.clear()
            self._topics[topic] = tokens
        return tokens

    def _put(self, session: Session, command: Command, now: float) -> list[Out]:
        headers = command.headers
        topic = headers[Header.TOPIC]
        tokens = self._topic_tokens(topic, command)
        if topic.startswith(P.RESERVED_TOPIC_PREFIX):
            raise ProtocolError(Status.FORBIDDEN, f"topics {P.RESERVED_TOPIC_PREFIX}> are the broker's own", command.id)
        if not session.grants.may_publish(tokens):
            raise ProtocolError(Status.FORBIDDEN, f"{session.identity} may not publish to {topic}", command.id)
        self.counters["published"] += 1
        journals = self._journal_routes.match(tokens) if self.journals else ()
        if journals:
            return self._put_journaled(session, command, topic, tokens, journals, now)
        out = self._fan_out(topic, tokens, session.sender, headers, command.payload, now)
        if command.id is not None:
            session.last_sent = now
            out.append((session.routing_id, P.ok(command.id)))
        return out

    def _fan_out(
        self,
        topic: str,
        tokens: tuple[str, ...],
        sender: bytes,
        headers: dict[str, str],
        body: Sequence[bytes],
        now: float,
        position: tuple[Journal, int] | None = None,
        appended: Sequence[Journal] = (),
    ) -> list[Out]:
        """One MESSAGE built once, handed to every subscriber that may see it."""
        targets = self.subscriptions.match(tokens)
        out: list[Out] = []
        if not targets:
            return out
        # Most PUTs carry TOPIC (and ID) only: skip the scan for X- headers then.
        user = P.user_header_frames(headers) if len(headers) > 1 + (Header.ID in headers) else []
        topic_b = topic.encode()
        where = (position[0].name.encode(), position[1]) if position is not None else None
        frames = P.message(topic_b, sender, user, body, where)
        seed_frames: list[bytes] | None = None
        for target in targets:
            if target.grants.deny_subscribe and not target.grants.delivers(tokens):
                continue  # a wildcard overlapping a denied topic: never delivered
            if target.replays and self._replay_will_deliver(target, appended, tokens):
                continue
            if target.legacy:
                if seed_frames is None:
                    seed_frames = P.message(topic_b, None, user, body)
                out.append((target.routing_id, seed_frames))
            else:
                out.append((target.routing_id, frames))
            target.last_sent = now
            target.delivered += 1
        self.counters["delivered"] += len(out)  # skipped (denied) targets are not deliveries
        return out

    @staticmethod
    def _replay_will_deliver(target: Session, appended: Sequence[Journal], tokens: tuple[str, ...]) -> bool:
        for journal in appended:
            replay = target.replays.get(journal.name)
            if replay is not None and replay.matches(tokens):
                return True
        return False

    # ================================================================ journals
    def _put_journaled(
        self,
        session: Session,
        command: Command,
        topic: str,
        tokens: tuple[str, ...],
        journals: Sequence[Journal],
        now: float,
    ) -> list[Out]:
        """Append to every journal the topic belongs to, fan out, hold the OK until ``commit``.

        The OK names the first journal (by name) and the record's SEQ there; a
        repeat of an earlier ``(sender, MSGID)`` in that journal's dedup window
        is acknowledged ``DUPLICATE 1`` with the first copy's SEQ and goes nowhere.
        """
        headers = command.headers
        primary = _primary(journals)
        msgid = headers.get(Header.MSGID)
        if msgid is not None:
            earlier = primary.duplicate_of(session.identity, msgid)
            if earlier is not None:
                self.counters["duplicates"] += 1
                if command.id is None:
                    return []
                ok = P.ok_journaled(command.id, primary.name, earlier, duplicate=True)
                self._pending_acks.append((primary, session.routing_id, command.id, ok))
                return []
        stored = {k: v for k, v in headers.items() if k != Header.TOPIC and k != Header.ID}
        seq = self._append(journals, primary, topic, session.identity, stored, command.payload)
        if seq is None:
            raise ProtocolError(Status.STORAGE_FAILED, f"journal {primary.name} could not write", command.id)
        self.counters["journaled"] += 1
        out = self._fan_out(topic, tokens, session.sender, headers, command.payload, now, (primary, seq), journals)
        if command.id is not None:
            session.last_sent = now
            ok = P.ok_journaled(command.id, primary.name, seq)
            self._pending_acks.append((primary, session.routing_id, command.id, ok))
        return out

    @property
    def uncommitted(self) -> bool:
        """``commit()`` has work: appends to write or OKs to release."""
        return bool(self._pending_acks) or any(j.pending for j in self.journals.values())

    def commit(self) -> list[Out]:
        """Write (and fsync, per policy) what was appended; returns the OKs now due.

        A journal that fails to write turns its held OKs into ERROR 507: the
        publisher learns its message is not stored (and may retry with MSGID).
        """
        failed: dict[str, OSError] = {}
        for journal in self.journals.values():
            if journal.pending:
                try:
                    journal.commit()
                except OSError as exc:
                    failed[journal.name] = exc
                    self.counters["journal_write_failed"] += 1
                    log.error("journal %s: write failed: %s", journal.name, exc)
        acks, self._pending_acks = self._pending_acks, []
        out: list[Out] = []
        for journal, routing_id, request_id, ok in acks:
            failure = failed.get(journal.name)
            if failure is None:
                out.append((routing_id, ok))
            else:
                reason = f"journal {journal.name} could not write: {failure.strerror or failure}"
                out.append((routing_id, P.error(Status.STORAGE_FAILED, reason, request_id)))
        return out

    def _journal_for_sub(self, command: Command, patterns: list[tuple[str, tuple[str, ...]]]) -> Journal:
        name = command.headers.get(Header.JOURNAL)
        if name is not None:
            journal = self.journals.get(name)
            if journal is None:
                raise ProtocolError(Status.BAD_REQUEST, f"no journal named {name[:40]!r}", command.id)
            return journal
        candidates = [
            j
            for j in self.journals.values()
            if all(any(pattern_covers(split_pattern(jp), t) for jp in j.settings.topics) for _, t in patterns)
        ]
        if len(candidates) != 1:
            which = "no journal keeps" if not candidates else "several journals keep"
            raise ProtocolError(Status.BAD_REQUEST, f"{which} these topics; name one with JOURNAL", command.id)
        return candidates[0]

    def _start_replay(self, session: Session, command: Command, patterns: list[tuple[str, tuple[str, ...]]]) -> Replay:
        if session.legacy:
            raise ProtocolError(Status.BAD_REQUEST, "FROM needs protocol 1.0", command.id)
        from_seq = P.parse_int(command, Header.FROM)
        journal = self._journal_for_sub(command, patterns)
        if journal.name in session.replays:
            raise ProtocolError(Status.CONFLICT, f"a replay of {journal.name} is already running", command.id)
        from_seq = _start_seq(journal, from_seq, command.id)
        return Replay(journal, [t for _, t in patterns], min(from_seq, journal.next_seq))

    @property
    def streaming(self) -> bool:
        """Replays or fetches are sending pages (call ``stream`` every loop turn)."""
        return bool(self._streaming)

    def stream(self, now: float) -> list[StreamOut]:
        """One page of every running replay and fetch.

        The shell sends them in order and reports each one it could not
        queue (and each after it for that peer) to ``stream_blocked``, which
        rewinds that stream; nothing is lost and a slow reader only slows
        its own streams.
        """
        out: list[StreamOut] = []
        for session in list(self._streaming):
            for rid, fetch in list(session.fetches.items()):
                if fetch.done:
                    del session.fetches[rid]
                elif fetch.resume_at <= now:
                    out += self._fetch_page(session, fetch)
            for name, replay in list(session.replays.items()):
                if replay.resume_at <= now:
                    out += self._replay_page(session, name, replay)
            if not session.replays and not session.fetches:
                self._streaming.pop(session, None)
            session.last_sent = now
        return out

    def _replay_page(self, session: Session, name: str, replay: Replay) -> list[StreamOut]:
        journal = replay.journal
        rid = session.routing_id
        try:
            records, next_seq = journal.read(replay.cursor, None, None, max_records=REPLAY_PAGE)
        except (Trimmed, OSError) as exc:  # retention, or a segment gone or unreadable
            self._end_replay(session, name)
            code = Status.GONE if isinstance(exc, Trimmed) else Status.STORAGE_FAILED
            pattern = ".".join(replay.patterns[0])
            return [StreamOut(rid, P.error(code, str(exc), topic=pattern), "error", name, 0, 0)]
        out = []
        for record in records:
            tokens = self._record_tokens(record.topic)
            if tokens is None or not replay.matches(tokens):
                continue
            if session.grants.deny_subscribe and not session.grants.delivers(tokens):
                continue
            out.append(StreamOut(rid, self._record_message(record, name), "replay", name, record.seq, 1))
        self.counters["replayed"] += len(out)
        replay.cursor = next_seq
        # Ends only on a turn with nothing left, so a record whose send
        # failed in the last page is still resent (see stream_blocked).
        if not records and next_seq >= journal.next_seq:
            self._end_replay(session, name)
        return out

    def _fetch_page(self, session: Session, fetch: Fetch) -> list[StreamOut]:
        journal = fetch.journal
        rid = session.routing_id
        dialect = session.dialect
        start = fetch.cursor
        if start < fetch.end and fetch.records_left > 0 and fetch.bytes_left > 0:
            try:
                records, fetch.cursor = journal.read(
                    start,
                    fetch.end,
                    fetch.match,
                    max_records=min(FETCH_PAGE_RECORDS, fetch.records_left),
                    max_bytes=min(FETCH_PAGE_BYTES, fetch.bytes_left),
                )
            except (Trimmed, OSError) as exc:  # retention overtook a slow fetch, or a segment unreadable
                session.fetches.pop(fetch.rid, None)
                code = Status.GONE if isinstance(exc, Trimmed) else Status.STORAGE_FAILED
                frames = dialect.error(fetch.rid, JOURNAL_SERVICE, code, str(exc))
                return [StreamOut(rid, frames, "error", fetch.rid, 0, 0)]
            fetch.records_left -= len(records) or 1  # a page that matched nothing still costs
            fetch.bytes_left -= sum(len(p) for r in records for p in r.parts) or 1
            if not records:
                return []
            fetch.count += len(records)
            frames = dialect.partial(fetch.rid, JOURNAL_SERVICE, {}, fetch.user, P.journal_page(records))
            return [StreamOut(rid, frames, "fetch", fetch.rid, start, len(records))]
        summary = {
            "next_seq": fetch.cursor,
            "records": fetch.count,
            "first_seq": journal.first_seq,
            "end_seq": journal.next_seq,
        }
        fetch.done = True
        frames = dialect.final(fetch.rid, JOURNAL_SERVICE, {}, fetch.user, [json.dumps(summary).encode()])
        return [StreamOut(rid, frames, "fetch", fetch.rid, fetch.cursor, 0)]

    def stream_blocked(self, blocked: StreamOut, now: float) -> None:
        """A stream message could not be queued: rewind its stream and pause it briefly."""
        session = self.sessions.get(blocked.routing_id)
        if session is None:
            return
        if blocked.kind == "replay":
            replay = session.replays.get(blocked.key)
            if replay is not None:
                replay.cursor = min(replay.cursor, blocked.seq)
                replay.resume_at = now + REPLAY_BACKOFF
        elif blocked.kind == "fetch":
            fetch = session.fetches.get(blocked.key)
            if fetch is not None:
                if blocked.seq < fetch.cursor or fetch.done:
                    fetch.cursor = blocked.seq
                    fetch.count -= blocked.records
                    fetch.records_left += blocked.records
                fetch.done = False
                fetch.resume_at = now + REPLAY_BACKOFF
        else:
            return
        self._streaming[session] = None
        self.counters["stream_paused"] += 1

    def _end_replay(self, session: Session, name: str) -> None:
        session.replays.pop(name, None)
        if not session.replays and not session.fetches:
            self._streaming.pop(session, None)

    def _record_tokens(self, topic: str) -> tuple[str, ...] | None:
        tokens = self._topics.get(topic)
        if tokens is None:
            try:
                tokens = split_topic(topic)
            except InvalidTopic:
                return None
        return tokens

    @staticmethod
    def _record_message(record: Record, journal: str) -> list[bytes]:
        user = P.user_header_frames(record.headers)
        return P.message(
            record.topic.encode(), record.sender.encode(), user, record.parts, (journal.encode(), record.seq)
        )

    def _wanted(self, topic: str) -> bool:
        """Someone subscribes to, or a journal keeps, this telemetry topic (two cached trie lookups)."""
        tokens = self._sys_topics[topic]
        return bool(self.subscriptions.match(tokens)) or bool(self.journals and self._journal_routes.match(tokens))

    def _emit(self, topic: str, data: dict[str, object], now: float) -> list[Out]:
        """Publish the broker's own telemetry on a ``mc0.sys.*`` topic; callers check ``_wanted`` first."""
        tokens = self._sys_topics[topic]
        journals = self._journal_routes.match(tokens) if self.journals else ()
        data["ts"] = round(now + self.wall_offset, 6)
        body = [json.dumps(data, separators=(",", ":")).encode()]
        self.counters["telemetry"] += 1
        position: tuple[Journal, int] | None = None
        if journals:
            primary = _primary(journals)
            seq = self._append(journals, primary, topic, BROKER_SENDER, {}, body)
            if seq is not None:
                position = (primary, seq)
        appended = journals if position is not None else ()
        return self._fan_out(topic, tokens, BROKER_SENDER.encode(), {}, body, now, position, appended)

    def _append(
        self,
        journals: Sequence[Journal],
        primary: Journal,
        topic: str,
        sender: str,
        headers: dict[str, str],
        body: Sequence[bytes],
    ) -> int | None:
        """Append to each journal; the primary's seq, or None if it could not write (fsync=always,
        or a segment roll, write at once; a disk error must not take the broker down)."""
        seq: int | None = None
        for journal in journals:
            try:
                appended = journal.append(topic, sender, headers, body)
            except OSError as exc:
                self.counters["journal_write_failed"] += 1
                log.error("journal %s: write failed: %s", journal.name, exc)
                continue
            if journal is primary:
                seq = appended
        return seq

    def _rpc_done(
        self,
        service: str,
        client: Session,
        worker: Session | None,
        created: float,
        status: int,
        bytes_in: int,
        bytes_out: int,
        now: float,
    ) -> list[Out]:
        if not self._wanted(SYS_RPC_TOPIC):  # the common case: one dict lookup per finished request
            return []
        return self._emit(
            SYS_RPC_TOPIC,
            {
                "service": service,
                "caller": client.identity,
                "worker": worker.name if worker is not None else None,
                "latency_ms": round((now - created) * 1000.0, 3),
                "status": status,
                "bytes_in": bytes_in,
                "bytes_out": bytes_out,
            },
            now,
        )

    def _patterns(self, command: Command) -> list[tuple[str, tuple[str, ...]]]:
        limits = self.settings.limits
        result = []
        for frame in command.payload:
            try:
                pattern = bytes(frame).decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError(Status.BAD_REQUEST, "pattern is not UTF-8", command.id) from None
            try:
                tokens = split_pattern(pattern, max_bytes=limits.max_topic_bytes, max_tokens=limits.max_topic_tokens)
            except InvalidTopic as exc:
                raise _topic_error(exc, command.id) from None
            result.append((pattern, tokens))
        return result

    def _subscribe(self, session: Session, command: Command, now: float) -> list[Out]:
        patterns = self._patterns(command)  # all validated before any change
        for pattern, tokens in patterns:
            if not session.grants.may_subscribe(tokens):
                raise ProtocolError(Status.FORBIDDEN, f"{session.identity} may not subscribe to {pattern}", command.id)
        replay = self._start_replay(session, command, patterns) if Header.FROM in command.headers else None
        new = {p: t for p, t in patterns if p not in session.patterns}
        limit = self.settings.limits.max_subscriptions
        if len(session.patterns) + len(new) > limit:
            raise ProtocolError(
                Status.OVER_LIMIT,
                f"{len(session.patterns) + len(new)} subscriptions, the limit per peer is {limit}",
                command.id,
            )
        for pattern, tokens in new.items():
            session.patterns[pattern] = tokens
            self.subscriptions.insert(tokens, session)
        if replay is not None:
            session.replays[replay.journal.name] = replay
            self._streaming[session] = None
            self.counters["replays"] += 1
        return self._answer(session, command, now)

    def _unsubscribe(self, session: Session, command: Command, now: float) -> list[Out]:
        for pattern, _ in self._patterns(command):
            tokens = session.patterns.pop(pattern, None)
            if tokens is not None:
                self.subscriptions.remove(tokens, session)
                for name, replay in list(session.replays.items()):
                    if tokens in replay.patterns:
                        replay.patterns.remove(tokens)
                        if not replay.patterns:
                            self._end_replay(session, name)
        return self._answer(session, command, now)

    # ================================================================ RPC: workers
    def _service(self, name: str) -> Service:
        service = self.services.get(name)
        if service is None:
            service = self.services[name] = Service(name)
        return service

    def _drop_if_idle(self, name: str) -> None:
        service = self.services.get(name)
        if service is not None and not service.workers and not service.queue:
            del self.services[name]

    def _service_name(self, raw: str | bytes, request_id: str | None) -> str:
        name = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        self._service_tokens(name, request_id)
        return name

    def _service_tokens(self, name: str, request_id: str | None) -> tuple[str, ...]:
        tokens = self._service_names.get(name)  # validated once, not per request
        if tokens is None:
            try:
                tokens = split_topic(
                    name, max_bytes=P.MAX_SERVICE_BYTES, max_tokens=self.settings.limits.max_topic_tokens
                )
            except InvalidTopic as exc:
                raise ProtocolError(Status.BAD_REQUEST, f"service name: {exc}", request_id) from None
            if len(self._service_names) >= TOPIC_CACHE_SIZE:
                self._service_names.clear()
            self._service_names[name] = tokens
        return tokens

    def _ready_command(self, session: Session, command: Command, now: float) -> list[Out]:
        capacity = 1
        if Header.CAPACITY in command.headers:
            capacity = P.parse_int(command, Header.CAPACITY, minimum=1)
            if capacity > self.settings.max_capacity:
                raise ProtocolError(
                    Status.BAD_REQUEST, f"CAPACITY {capacity} exceeds {self.settings.max_capacity}", command.id
                )
        names = [self._service_name(bytes(f), command.id) for f in command.payload]
        for name in names:
            self._check_serve(session, name, command.id)
        out = self._ready(session, tuple(dict.fromkeys(names)), capacity, now)
        return out + self._answer(session, command, now)

    def _check_serve(self, session: Session, name: str, request_id: str | None) -> None:
        if name in (BROKER_SERVICE, MMI_SERVICE):
            raise ProtocolError(Status.FORBIDDEN, f"service {name} is the broker's own", request_id)
        if not session.grants.may_serve(self._service_tokens(name, request_id)):
            raise ProtocolError(Status.FORBIDDEN, f"{session.identity} may not serve {name}", request_id)

    def _ready(self, worker: Session, names: tuple[str, ...], capacity: int, now: float) -> list[Out]:
        """Register (or re-register) a worker for services with a capacity."""
        for old in worker.services:
            if old not in names and old in self.services:
                self.services[old].workers.pop(worker, None)
                self.services[old].ready.pop(worker, None)
                self._drop_if_idle(old)
        worker.services = names
        worker.capacity = capacity
        out: list[Out] = []
        for name in names:
            service = self._service(name)
            service.workers[worker] = None
            if len(worker.jobs) < capacity and worker not in service.ready:
                # Never used is least recently used: a new worker goes first.
                service.ready = {worker: None, **service.ready}
            log.info("worker %s serves %s (capacity %d)", worker.name, name, capacity)
        for name in names:
            out += self._pump(self.services[name], now)
        return out

    def _assign(self, worker: Session, job: Job, now: float) -> Out:
        job.worker = worker
        job.attempts += 1
        worker.jobs[job.bid] = job
        full = len(worker.jobs) >= worker.capacity
        for name in worker.services:
            ready = self.services[name].ready
            ready.pop(worker, None)
            if not full:
                ready[worker] = None  # now the most recently used
        remaining = max(1, round((job.deadline - now) * 1000))
        worker.last_sent = now
        frames = worker.dialect.to_worker(job.bid, job.service, job.client.identity, remaining, job.user, job.body)
        return (worker.routing_id, frames)

    def _pump(self, service: Service, now: float) -> list[Out]:
        """Dispatch queued requests while some worker has spare capacity."""
        out: list[Out] = []
        queue, ready = service.queue, service.ready
        while queue and ready:
            job = queue.popleft()
            if job.done:
                continue
            out.append(self._assign(next(iter(ready)), job, now))
        return out

    def _release(self, worker: Session, job: Job, now: float) -> list[Out]:
        """A worker finished (or lost) a job: free its slot and give it more work."""
        worker.jobs.pop(job.bid, None)
        job.worker = None
        if self.sessions.get(worker.routing_id) is not worker or len(worker.jobs) >= worker.capacity:
            return []
        heads: list[tuple[float, Service]] = []
        for name in worker.services:
            service = self.services[name]
            if worker not in service.ready:
                service.ready[worker] = None
            if service.queue:
                heads.append((service.queue[0].created, service))
        out: list[Out] = []
        for _, service in sorted(heads, key=lambda h: h[0]):  # oldest waiting request first
            out += self._pump(service, now)
        return out

    # ================================================================ RPC: requests
    def _request_command(self, client: Session, command: Command, now: float) -> list[Out]:
        headers = command.headers
        rid = headers[Header.ID]
        name = headers[Header.SERVICE]
        timeout_ms = self.settings.request_timeout_ms
        if Header.TIMEOUT in headers:
            timeout_ms = P.parse_int(command, Header.TIMEOUT, minimum=1)
        scatter = False
        if Header.ALL in headers:
            if headers[Header.ALL] not in ("0", "1"):
                raise ProtocolError(Status.BAD_REQUEST, "ALL must be 0 or 1", rid)
            scatter = headers[Header.ALL] == "1"
        return self._request(client, name, rid, timeout_ms, scatter, command.user_headers(), command.payload, now)

    def _request(
        self,
        client: Session,
        name: str,
        rid: str,
        timeout_ms: int,
        scatter: bool,
        user: dict[str, str],
        body: Sequence[bytes],
        now: float,
    ) -> list[Out]:
        fetching = client.fetches.get(rid)
        if rid in client.requests or (fetching is not None and not fetching.done):
            raise ProtocolError(Status.CONFLICT, f"request id {rid[:40]!r} is already outstanding", rid)
        tokens = self._service_tokens(name, rid)
        if not client.grants.may_call(tokens):
            raise ProtocolError(Status.FORBIDDEN, f"{client.identity} may not call {name}", rid)
        if len(client.requests) >= self.settings.max_requests:
            raise ProtocolError(Status.OVER_LIMIT, f"{len(client.requests)} requests outstanding, the limit", rid)
        timeout_ms = min(timeout_ms, self.settings.max_request_timeout_ms)
        deadline = now + timeout_ms / 1000.0
        self.counters["requests"] += 1
        client.last_sent = now
        if name in BUILTIN_SERVICES:
            # Not in mc0.sys.rpc: a journal reader's fetches would otherwise feed the journal it reads.
            return self._builtin(client, name, rid, user, body)
        service = self.services.get(name)
        if service is None or not service.workers:
            self.counters["no_worker"] += 1
            out = [(client.routing_id, client.dialect.error(rid, name, Status.NO_WORKER, f"no worker for {name}"))]
            return out + self._rpc_done(name, client, None, now, Status.NO_WORKER, sum(map(len, body)), 0, now)
        service.requests += 1
        if scatter:
            return self._scatter(client, service, rid, user, body, now, deadline)
        if len(service.queue) >= self.settings.max_queue and not service.ready:
            service.requests -= 1
            raise ProtocolError(Status.OVER_LIMIT, f"queue for {name} is full ({self.settings.max_queue})", rid)
        job = Job(str(next(self._seq)), client, rid, name, user, body, now, deadline)
        client.requests[rid] = job
        heapq.heappush(self._deadlines, (deadline, int(job.bid), job))
        service.queue.append(job)
        return self._pump(service, now)

    def _scatter(
        self,
        client: Session,
        service: Service,
        rid: str,
        user: dict[str, str],
        body: Sequence[bytes],
        now: float,
        deadline: float,
    ) -> list[Out]:
        """Every worker of the service gets its own leg at once, regardless of capacity."""
        gather = Scatter(client, rid, service.name, user, now, deadline)
        client.requests[rid] = gather
        heapq.heappush(self._deadlines, (deadline, next(self._seq), gather))
        out: list[Out] = []
        for worker in list(service.workers):
            leg = Job(str(next(self._seq)), client, rid, service.name, user, body, now, deadline, parent=gather)
            gather.legs[leg.bid] = leg
            gather.total += 1
            out.append(self._assign(worker, leg, now))
        return out

    def _cancel(self, client: Session, rid: str, now: float) -> list[Out]:
        """CANCEL ID rid: 499 to the client, CANCEL to the worker; unknown ids are ignored."""
        request = client.requests.pop(rid, None)
        if request is None:
            if client.fetches.pop(rid, None) is not None:
                client.last_sent = now
                return [(client.routing_id, client.dialect.error(rid, JOURNAL_SERVICE, Status.CANCELLED, "cancelled"))]
            self.counters["cancel_unknown"] += 1
            return []
        self.counters["cancelled"] += 1
        worker = request.worker if isinstance(request, Job) else None
        out = self._abandon(request, now)
        client.last_sent = now
        out.append((client.routing_id, client.dialect.error(rid, request.service, Status.CANCELLED, "cancelled")))
        size = request.size if isinstance(request, Job) else 0
        bytes_out = request.bytes_out if isinstance(request, Job) else 0
        return out + self._rpc_done(
            request.service, client, worker, request.created, Status.CANCELLED, size, bytes_out, now
        )

    def _abandon(self, request: Job | Scatter, now: float) -> list[Out]:
        """Stop a request without answering its client (the caller does that, if anyone)."""
        request.done = True
        legs = list(request.legs.values()) if isinstance(request, Scatter) else [request]
        out: list[Out] = []
        for job in legs:
            job.done = True
            worker = job.worker
            if worker is not None:
                notice = worker.dialect.cancel(job.bid)
                if notice is not None:
                    out.append((worker.routing_id, notice))
                out += self._release(worker, job, now)
        return out

    # ================================================================ RPC: replies
    def _worker_reply_command(self, worker: Session, command: Command, now: float) -> list[Out]:
        bid = command.headers[Header.ID]
        if command.verb is Verb.ERROR:
            code_text = command.headers[Header.CODE]
            code = int(code_text) if code_text.isdigit() and 100 <= int(code_text) <= 599 else Status.HANDLER_FAILED
            return self._worker_reply(worker, Verb.ERROR, bid, {}, (), now, code, command.headers[Header.MESSAGE])
        return self._worker_reply(worker, command.verb, bid, command.user_headers(), command.payload, now)

    def _worker_reply(
        self,
        worker: Session,
        verb: Verb,
        bid: str,
        user: dict[str, str],
        body: Sequence[bytes],
        now: float,
        code: int = 0,
        reason: str = "",
    ) -> list[Out]:
        job = worker.jobs.get(bid)
        if job is None:
            # Late (after deadline/cancel), forged, or never given to this worker.
            self.counters["replies_dropped"] += 1
            return []
        user = user or job.user  # the request's X- headers unless the worker set its own
        client = job.client
        client.last_sent = now
        if job.parent is not None:
            return self._scatter_reply(job, verb, user, body, now, code, reason)
        if verb is Verb.PARTIAL:
            job.forwarded = True
            job.bytes_out += sum(map(len, body))
            return [(client.routing_id, client.dialect.partial(job.rid, job.service, {}, user, body))]
        client.requests.pop(job.rid, None)
        job.done = True
        service = self.services.get(job.service)
        worker.served += 1
        if service is not None:
            service.latencies.append(now - job.created)
            if verb is Verb.FINAL:
                service.served += 1
            else:
                service.errors += 1
        if verb is Verb.FINAL:
            frames = client.dialect.final(job.rid, job.service, {}, user, body)
        else:
            frames = client.dialect.error(job.rid, job.service, code, reason)
        out = [(client.routing_id, frames), *self._release(worker, job, now)]
        status = 200 if verb is Verb.FINAL else code
        bytes_out = job.bytes_out + sum(map(len, body))
        return out + self._rpc_done(job.service, client, worker, job.created, status, job.size, bytes_out, now)

    def _scatter_reply(
        self, job: Job, verb: Verb, user: dict[str, str], body: Sequence[bytes], now: float, code: int, reason: str
    ) -> list[Out]:
        worker = job.worker
        assert worker is not None and job.parent is not None
        fields: dict[str, str] = {Header.WORKER: worker.name}
        if verb is Verb.ERROR:
            fields[Header.CODE] = str(code)
            fields[Header.MESSAGE] = reason
        client = job.client
        out: list[Out] = [(client.routing_id, client.dialect.partial(job.rid, job.service, fields, user, body))]
        if verb is Verb.PARTIAL:
            return out
        worker.served += 1
        out += self._release(worker, job, now)
        out += self._scatter_leg_done(job, verb, now)
        return out

    def _scatter_leg_done(self, job: Job, verb: Verb | None, now: float) -> list[Out]:
        """A leg finished (``verb``) or its worker vanished (None)."""
        gather = job.parent
        assert gather is not None
        job.done = True
        gather.legs.pop(job.bid, None)
        if verb is not None:
            gather.answered += 1
        if gather.legs or gather.done:
            return []
        return self._scatter_final(gather, now)

    def _scatter_final(self, gather: Scatter, now: float) -> list[Out]:
        gather.done = True
        client = gather.client
        client.requests.pop(gather.rid, None)
        out = self._abandon(gather, now)  # legs still out: cancelled, counted missing
        missing = gather.total - gather.answered
        fields: dict[str, str] = {Header.COUNT: str(gather.answered), Header.MISSING: str(missing)}
        service = self.services.get(gather.service)
        if service is not None:
            service.served += 1
            service.latencies.append(now - gather.created)
        out.append((client.routing_id, client.dialect.final(gather.rid, gather.service, fields, gather.user, ())))
        return out + self._rpc_done(gather.service, client, None, gather.created, 200, 0, 0, now)

    def _terminate_error(self, job: Job, code: int, reason: str, now: float) -> list[Out]:
        job.done = True
        client = job.client
        if client.requests.get(job.rid) is job:
            del client.requests[job.rid]
        service = self.services.get(job.service)
        if service is not None:
            service.errors += 1
            if code == Status.DEADLINE:
                service.timeouts += 1
        self.counters[f"requests_failed_{code}"] += 1
        telemetry = self._rpc_done(job.service, client, job.worker, job.created, code, job.size, job.bytes_out, now)
        if self.sessions.get(client.routing_id) is not client:
            return telemetry
        client.last_sent = now
        return [(client.routing_id, client.dialect.error(job.rid, job.service, code, reason)), *telemetry]

    # ================================================================ built-in services
    def _builtin(self, client: Session, name: str, rid: str, user: dict[str, str], body: Sequence[bytes]) -> list[Out]:
        text = b"".join(bytes(b) for b in body).decode("utf-8", "replace").strip()
        if name == MMI_SERVICE:
            known = text in self.services and bool(self.services[text].workers)
            answer = b"200" if known or text in (BROKER_SERVICE, MMI_SERVICE) else b"404"
            return [(client.routing_id, client.dialect.final(rid, name, {}, user, [answer]))]
        if name == JOURNAL_SERVICE:
            try:
                return self._journal_service(client, rid, user, text)
            except ProtocolError as exc:
                return [(client.routing_id, client.dialect.error(rid, name, exc.code, exc.reason))]
        op = text
        if text.startswith("{"):
            try:
                op = str(json.loads(text).get("op", ""))
            except (ValueError, AttributeError):
                op = ""
        report = self.report(op)
        if report is None:
            reason = f"unknown op {op[:40]!r}; ops: stats, services, topics, peers"
            return [(client.routing_id, client.dialect.error(rid, name, Status.BAD_REQUEST, reason))]
        data = json.dumps(report, sort_keys=True).encode()
        return [(client.routing_id, client.dialect.final(rid, name, {}, user, [data]))]

    def _journal_service(self, client: Session, rid: str, user: dict[str, str], text: str) -> list[Out]:
        """``mc0.journal``: ``info``, or ``fetch`` streamed as PARTIAL pages then a FINAL.

        fetch: ``{"op": "fetch", "journal": j, "from_seq": a, "to_seq": b,
        "topics": [pattern...], "max_records": n, "max_bytes": m}``.  Each
        PARTIAL's body is a JSON list of record metadata (seq, ts, topic,
        sender, headers, parts = how many body frames follow) then the body
        frames; the FINAL's JSON says ``next_seq`` (where to continue),
        ``records`` and the journal's ``first_seq``/``end_seq``.  Only records
        the caller may subscribe to are returned.  Deterministic; 410 when
        ``from_seq`` was trimmed.
        """
        name = JOURNAL_SERVICE
        try:
            query = json.loads(text) if text.startswith("{") else {"op": text}
        except ValueError:
            raise ProtocolError(Status.BAD_REQUEST, "body must be JSON or an op name", rid) from None
        if not isinstance(query, dict):
            raise ProtocolError(Status.BAD_REQUEST, "body must be a JSON object", rid)
        op = query.get("op")
        if op == "info":
            data = {n: j.info() for n, j in self.journals.items()}
            return [(client.routing_id, client.dialect.final(rid, name, {}, user, [json.dumps(data).encode()]))]
        if op != "fetch":
            raise ProtocolError(Status.BAD_REQUEST, f"unknown op {str(op)[:40]!r}; ops: info, fetch", rid)
        journal = self.journals.get(str(query.get("journal", "")))
        if journal is None:
            known = ", ".join(self.journals) or "none configured"
            raise ProtocolError(
                Status.BAD_REQUEST, f"unknown journal {str(query.get('journal'))[:40]!r} ({known})", rid
            )

        def integer(key: str, default: int | None, low: int, high: int) -> int | None:
            value = query.get(key, default)
            if value is None:
                return None
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ProtocolError(Status.BAD_REQUEST, f"{key} must be an integer in [{low}, {high}]", rid)
            return value

        from_seq = integer("from_seq", 0, 0, 1 << 62) or 0
        to_seq = integer("to_seq", None, 0, 1 << 62)
        max_records = integer("max_records", FETCH_MAX_RECORDS, 1, FETCH_MAX_RECORDS) or 1
        max_bytes = integer("max_bytes", FETCH_MAX_BYTES, 1, FETCH_MAX_BYTES) or 1
        raw_topics = query.get("topics") or []
        if isinstance(raw_topics, str):
            raw_topics = [raw_topics]
        if not isinstance(raw_topics, list) or not all(isinstance(t, str) for t in raw_topics):
            raise ProtocolError(Status.BAD_REQUEST, "topics must be a list of patterns", rid)
        try:
            wanted = [split_pattern(t) for t in raw_topics]
        except InvalidTopic as exc:
            raise _topic_error(exc, rid) from None
        grants = client.grants
        filtered = bool(wanted) or grants is not ALLOW_ALL
        verdicts: dict[str, bool] = {}

        def match(topic: str) -> bool:
            verdict = verdicts.get(topic)
            if verdict is None:
                tokens = self._record_tokens(topic)
                verdict = (
                    tokens is not None
                    and (not wanted or any(pattern_matches(p, tokens) for p in wanted))
                    and grants.may_subscribe(tokens)
                    and grants.delivers(tokens)
                )
                if len(verdicts) < TOPIC_CACHE_SIZE:
                    verdicts[topic] = verdict
            return verdict

        from_seq = _start_seq(journal, from_seq, rid)
        end = journal.next_seq if to_seq is None else min(to_seq, journal.next_seq)
        running = sum(1 for f in client.fetches.values() if not f.done)
        if running >= MAX_FETCHES_PER_PEER:
            raise ProtocolError(Status.OVER_LIMIT, f"{running} fetches under way, the limit per peer", rid)
        fetch = Fetch(rid, user, journal, from_seq, end, match if filtered else None, max_records, max_bytes)
        client.fetches[rid] = fetch
        self._streaming[client] = None
        self.counters["journal_fetches"] += 1
        return []  # pages follow from stream(), one per loop turn

    def report(self, op: str) -> object | None:
        """The data behind ``mc0.broker`` ops (None for an unknown op)."""
        if op == "services":
            return {name: self._service_report(s) for name, s in sorted(self.services.items())}
        if op == "topics":
            return {
                ".".join(pattern): len(values)
                for pattern, values in sorted(self.subscriptions.patterns(), key=lambda pv: pv[0])
            }
        if op == "peers":
            return [
                {
                    "name": s.name,
                    "identity": s.identity,
                    "protocol": s.version,
                    "kind": s.dialect.name,
                    "ttl_ms": round(s.ttl * 1000),
                    "subscriptions": len(s.patterns),
                    "delivered": s.delivered,
                    "dropped": s.drops,
                    "services": list(s.services),
                    "capacity": s.capacity,
                    "in_flight": len(s.jobs),
                    "served": s.served,
                    "requests_outstanding": len(s.requests),
                }
                for s in self.sessions.values()
            ]
        if op == "stats":
            return {
                "peers": len(self.sessions),
                "subscriptions": len(self.subscriptions),
                "services": len(self.services),
                "queued": sum(len(s.queue) for s in self.services.values()),
                "in_flight": sum(len(s.jobs) for s in self.sessions.values()),
                "counters": dict(sorted(self.counters.items())),
                "journals": {name: journal.info() for name, journal in self.journals.items()},
            }
        return None

    @staticmethod
    def _service_report(service: Service) -> dict[str, object]:
        latencies = sorted(service.latencies)

        def pct(q: float) -> float | None:
            if not latencies:
                return None
            return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 3)

        return {
            "workers": len(service.workers),
            "idle": len(service.ready),
            "queued": sum(1 for j in service.queue if not j.done),
            "in_flight": service.in_flight(),
            "requests": service.requests,
            "served": service.served,
            "errors": service.errors,
            "timeouts": service.timeouts,
            "latency_ms": {"p50": pct(0.50), "p90": pct(0.90), "p99": pct(0.99)},
        }

    # ================================================================ MDP/0.2
    def _handle_mdp(
        self, routing_id: bytes, frames: Sequence[bytes], now: float, identity: str, fd: int | None
    ) -> list[Out]:
        try:
            command = mdp.decode(frames)
        except ProtocolError as exc:
            self.counters["mdp_malformed"] += 1
            log.debug("MDP peer %s: %s", routing_id.hex(), exc.reason)
            return []
        session = self.sessions.get(routing_id)
        dialect = mdp.DIALECTS[(command.role, command.envelope)]
        if session is not None and session.dialect is not dialect:
            self.counters["mdp_mismatch"] += 1
            return []
        if session is None:
            if command.command == mdp.DISCONNECT:
                return []
            if self.generated_ids_only and not _generated_routing_id(routing_id):
                self.counters["mdp_chosen_routing_id"] += 1
                return []
            if command.role == mdp.WORKER and command.command != mdp.READY:
                # MDP: a worker the broker does not know is told to reconnect.
                disconnect = dialect.disconnect()
                return [(routing_id, disconnect)] if disconnect is not None else []
            session = Session(routing_id, identity, "mdp", self.settings.mdp_ttl_ms / 1000.0, now, dialect, fd)
            opened = self._open(session, now)
            if opened:
                return opened + self._handle_mdp(routing_id, frames, now, identity, fd)
        session.last_recv = now
        try:
            if command.role == mdp.CLIENT:
                assert command.service is not None
                name = self._service_name(command.service, None)
                rid = f"mdp{next(self._seq)}"
                timeout = self.settings.request_timeout_ms
                return self._request(session, name, rid, timeout, False, {}, command.body, now)
            if command.command == mdp.READY:
                assert command.service is not None
                name = self._service_name(command.service, None)
                self._check_serve(session, name, None)
                return self._ready(session, (name,), 1, now)
            if command.command == mdp.HEARTBEAT:
                return []
            if command.command == mdp.DISCONNECT:
                return self._forget(session, "disconnected", now)
            assert command.token is not None
            verb = Verb.FINAL if command.command == mdp.FINAL else Verb.PARTIAL
            return self._worker_reply(session, verb, command.token, {}, command.body, now)
        except ProtocolError as exc:
            self.counters["mdp_rejected"] += 1
            if command.role == mdp.CLIENT:
                return [(routing_id, session.dialect.error(None, command.service or "", exc.code, exc.reason))]
            return []

    # ================================================================ time and failures
    def tick(self, now: float) -> list[Out]:
        """Deadlines, heartbeats and expiry; call at ``next_deadline()`` or later."""
        out: list[Out] = []
        if self.journals and now >= self._next_retention:
            self._next_retention = now + RETENTION_INTERVAL
            for journal in self.journals.values():
                journal.enforce_retention(now + self.wall_offset)
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, _, request = heapq.heappop(deadlines)
            if not request.done:
                out += self._expire_request(request, now)
        if now < self._next_sweep:
            return out
        liveness = self.settings.liveness
        earliest = now + 1.0
        for session in list(self.sessions.values()):
            expires = session.last_recv + session.ttl * liveness
            if now >= expires:
                if session.dialect.heartbeats or not session.requests:
                    out += self._forget(session, "expired", now)
                    continue
                expires = now + session.ttl  # an MDP client waiting for replies
            beat = session.last_sent + session.ttl
            if now >= beat:
                frames = session.dialect.heartbeat()
                if frames is not None:
                    out.append((session.routing_id, frames))
                session.last_sent = now
                beat = now + session.ttl
            earliest = min(earliest, expires, beat)
        self._next_sweep = max(earliest, now + MIN_SWEEP_INTERVAL)
        return out

    def _expire_request(self, request: Job | Scatter, now: float) -> list[Out]:
        if isinstance(request, Scatter):
            return self._scatter_final(request, now)
        out = self._abandon(request, now)  # the worker, if any, is told CANCEL
        self.counters["deadline_expired"] += 1
        ms = round((request.deadline - request.created) * 1000)
        out += self._terminate_error(request, Status.DEADLINE, f"deadline of {ms} ms passed", now)
        return out

    def next_deadline(self) -> float:
        """When ``tick`` (or a paused ``stream``) next has work (monotonic seconds)."""
        earliest = self._next_sweep
        if self._deadlines:
            earliest = min(earliest, self._deadlines[0][0])
        if self.journals:
            earliest = min(earliest, self._next_retention)
        for session in self._streaming:
            for replay in session.replays.values():
                earliest = min(earliest, replay.resume_at)
            for fetch in session.fetches.values():
                earliest = min(earliest, fetch.resume_at)
        return earliest

    def send_failed(self, routing_id: bytes, now: float, *, unreachable: bool) -> list[Out]:
        """The shell could not send to a peer: gone (unreachable) or at HWM."""
        session = self.sessions.get(routing_id)
        if session is None:
            return []
        if unreachable:
            return self._forget(session, "unreachable", now)
        self.counters["dropped"] += 1
        session.drops += 1
        if now - session.last_drop > DROP_EPISODE_GAP:
            session.drop_episode_start = now
        session.last_drop = now
        limit = self.settings.slow_consumer_ms
        if limit and now - session.drop_episode_start >= limit / 1000.0:
            log.warning("peer %s too slow: %d messages dropped; disconnecting", session.name, session.drops)
            out = self._forget(session, "too_slow", now)
            reason = f"consumer too slow: {session.drops} messages dropped; disconnected"
            out.append((routing_id, P.error(Status.OVER_LIMIT, reason)))
            out.append((routing_id, P.DISCONNECT_FRAMES))
            return out
        return []

    # ================================================================ security changes
    def revoke(self, identities: set[str], now: float) -> list[Out]:
        """Keys withdrawn: their sessions get 401 and are forgotten; later messages are dropped."""
        self.revoked |= identities
        out: list[Out] = []
        for session in [s for s in self.sessions.values() if s.identity in identities]:
            log.warning("identity %s revoked: dropping %s", session.identity, session.name)
            out += self._forget(session, "revoked", now)
            out.append((session.routing_id, session.dialect.error(None, "", Status.NOT_CONNECTED, "key revoked")))
        return out

    def allow(self, identities: set[str]) -> None:
        """Keys (re)admitted: stop dropping their messages."""
        self.revoked -= identities

    def set_permissions(self, permissions: Permissions, now: float) -> list[Out]:
        """New policy: recompute grants; withdraw subscriptions and services it no longer allows."""
        self.permissions = permissions
        out: list[Out] = []
        for session in list(self.sessions.values()):
            grants = session.grants = permissions.grants(session.identity)
            for pattern, tokens in list(session.patterns.items()):
                if not grants.may_subscribe(tokens):
                    del session.patterns[pattern]
                    self.subscriptions.remove(tokens, session)
                    reason = f"subscription {pattern} withdrawn by policy"
                    out.append((session.routing_id, P.error(Status.FORBIDDEN, reason, topic=pattern)))
            if session.services:
                kept = tuple(n for n in session.services if grants.may_serve(self._service_tokens(n, None)))
                if kept != session.services:
                    dropped = ", ".join(n for n in session.services if n not in kept)
                    out += self._ready(session, kept, session.capacity, now)
                    reason = f"serving {dropped} withdrawn by policy"
                    out.append((session.routing_id, session.dialect.error(None, "", Status.FORBIDDEN, reason)))
        return out

    def shutdown(self, now: float) -> list[Out]:
        """DISCONNECT every peer (that has a way to be told) and forget them all."""
        out: list[Out] = []
        for session in list(self.sessions.values()):
            frames = session.dialect.disconnect()
            if frames is not None:
                out.append((session.routing_id, frames))
        for session in list(self.sessions.values()):
            self._forget(session, "broker_shutdown", now)
        return out


def _topic_error(exc: InvalidTopic, request_id: str | None) -> ProtocolError:
    code = Status.TOO_LARGE if exc.oversize else Status.BAD_REQUEST
    return ProtocolError(code, str(exc), request_id)


def _primary(journals: Sequence[Journal]) -> Journal:
    """The journal an OK or MESSAGE names when a topic is kept by several: the first by name."""
    return journals[0] if len(journals) == 1 else min(journals, key=lambda j: j.name)


def _start_seq(journal: Journal, from_seq: int, request_id: str | None) -> int:
    """Where a replay or fetch from ``from_seq`` starts (0 = the oldest kept); 410 if trimmed."""
    if from_seq == 0:
        return journal.first_seq
    if from_seq < journal.first_seq:
        raise ProtocolError(Status.GONE, str(Trimmed(journal.name, from_seq, journal.first_seq)), request_id)
    return from_seq
