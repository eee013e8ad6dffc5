"""BrokerCore: the broker's protocol logic with no sockets and no clock.

Contract: ``handle(routing_id, frames, now, identity)`` and ``tick(now)`` map
input to a list of ``(routing_id, frames)`` to send; the shell
(:mod:`mc0.broker`) performs those sends and reports failures back through
``send_failed``.  ``now`` is monotonic seconds supplied by the shell, so every
timing rule (heartbeats, expiry, slow consumers) is testable without sleeps.

A peer's input can never raise out of ``handle``: every malformed message is
answered with ERROR (or dropped, for peers that asked nothing) and counted.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from . import protocol as P
from .errors import InvalidTopic, ProtocolError
from .protocol import Command, Header, Limits, Side, Status, Verb
from .topics import split_pattern, split_topic
from .trie import TopicTrie

log = logging.getLogger("mc0.broker")

Out = tuple[bytes, Sequence[bytes]]

# The sweep for heartbeats/expiry runs at the earliest deadline found by the
# previous sweep, but never more often than this (it is O(peers)).
MIN_SWEEP_INTERVAL = 0.05
# Drops to a peer separated by less than this belong to one "queue stays full" episode.
DROP_EPISODE_GAP = 1.0
TOPIC_CACHE_SIZE = 4096


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


class Session:
    """One connected peer, as the broker sees it."""

    __slots__ = (
        "routing_id",
        "identity",
        "sender",
        "legacy",
        "version",
        "ttl",
        "last_recv",
        "last_sent",
        "patterns",
        "drops",
        "drop_episode_start",
        "last_drop",
        "delivered",
    )

    def __init__(self, routing_id: bytes, identity: str, version: str, ttl: float, now: float) -> None:
        self.routing_id = routing_id
        self.identity = identity
        self.sender = identity.encode()
        self.version = version
        self.legacy = version in P.SEED_VERSIONS
        self.ttl = ttl
        self.last_recv = now
        self.last_sent = now
        self.patterns: dict[str, tuple[str, ...]] = {}
        self.drops = 0
        self.drop_episode_start = 0.0
        self.last_drop = -1e18
        self.delivered = 0

    def __repr__(self) -> str:
        return f"<Session {self.routing_id.hex()} {self.identity} v{self.version}>"


class BrokerCore:
    def __init__(self, settings: CoreSettings | None = None) -> None:
        self.settings = settings or CoreSettings()
        self.sessions: dict[bytes, Session] = {}
        self.subscriptions: TopicTrie[Session] = TopicTrie()
        self.counters: Counter[str] = Counter()
        self._topics: dict[str, tuple[str, ...]] = {}
        self._next_sweep = 0.0

    # ------------------------------------------------------------ input
    def handle(self, routing_id: bytes, frames: Sequence[bytes], now: float, identity: str = P.ANONYMOUS) -> list[Out]:
        """One message from a peer -> what to send."""
        self.counters["received"] += 1
        session = self.sessions.get(routing_id)
        if session is not None and session.identity != identity:
            # Another key reusing this routing id: it gets nothing of the session.
            self.counters["identity_mismatch"] += 1
            session = None
            routing_known = True
        else:
            routing_known = False
        if session is not None:
            session.last_recv = now
        try:
            command = P.decode(frames, sender=Side.PEER, limits=self.settings.limits)
            if session is None:
                if command.verb is Verb.CONNECT and not routing_known:
                    return self._connect(routing_id, identity, command, now)
                if command.verb is Verb.DISCONNECT:
                    return [(routing_id, P.ok(command.id))] if command.id is not None else []
                raise ProtocolError(Status.NOT_CONNECTED, "not connected: send CONNECT first", command.id)
            return self._dispatch(session, command, now)
        except ProtocolError as exc:
            return self._reject(routing_id, session, frames, exc, now)

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
        if session.legacy and not P.GRAMMAR[verb].seed:
            raise ProtocolError(Status.BAD_REQUEST, f"{verb} is not part of protocol {session.version}", command.id)
        if verb is Verb.PUT:
            return self._put(session, command, now)
        if verb is Verb.NOOP:
            return self._answer(session, command, now)
        if verb is Verb.SUB:
            return self._subscribe(session, command, now)
        if verb is Verb.UNSUB:
            return self._unsubscribe(session, command, now)
        if verb is Verb.PING:
            session.last_sent = now
            return [(session.routing_id, P.encode(Verb.PONG, {Header.ID: command.headers[Header.ID]}))]
        if verb is Verb.CONNECT:
            return self._connect(session.routing_id, session.identity, command, now, replacing=session)
        if verb is Verb.DISCONNECT:
            self._forget(session, "disconnected")
            return [(session.routing_id, P.ok(command.id))] if command.id is not None else []
        raise AssertionError(f"decode admitted {verb} from a peer")  # pragma: no cover

    def _answer(self, session: Session, command: Command, now: float) -> list[Out]:
        if command.id is None:
            return []
        session.last_sent = now
        return [(session.routing_id, P.ok(command.id))]

    # ------------------------------------------------------------ verbs
    def _connect(
        self, routing_id: bytes, identity: str, command: Command, now: float, replacing: Session | None = None
    ) -> list[Out]:
        """Open a session; a repeated CONNECT replaces the old one only once it is valid."""
        version = command.headers[Header.VERSION]
        if version not in P.VERSIONS:
            raise ProtocolError(
                Status.UNSUPPORTED_VERSION,
                f"version {version[:16]!r} unsupported; this broker speaks {', '.join(sorted(P.VERSIONS))}",
                command.id,
            )
        asked = P.parse_int(command, Header.TTL, minimum=1)
        ttl_ms = min(max(asked, self.settings.min_ttl_ms), self.settings.max_ttl_ms)
        if replacing is not None:
            self._forget(replacing, "reconnected")
        session = Session(routing_id, identity, version, ttl_ms / 1000.0, now)
        self.sessions[routing_id] = session
        self.counters["connects"] += 1
        log.info("peer %s connected as %s (protocol %s, ttl %d ms)", routing_id.hex(), identity, version, ttl_ms)
        self._next_sweep = min(self._next_sweep, now + session.ttl)
        if command.id is None:
            return []
        return [(routing_id, P.ok(command.id, ttl_ms=ttl_ms))]

    def _topic_tokens(self, topic: str, command: Command) -> tuple[str, ...]:
        tokens = self._topics.get(topic)
        if tokens is None:
            limits = self.settings.limits
            try:
                tokens = split_topic(topic, max_bytes=limits.max_topic_bytes, max_tokens=limits.max_topic_tokens)
            except InvalidTopic as exc:
                raise _topic_error(exc, command) from None
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
        self.counters["published"] += 1
        targets = self.subscriptions.match(tokens)
        out: list[Out] = []
        if targets:
            user: list[bytes] = []
            if len(headers) > 1 + (Header.ID in headers):
                for key, value in headers.items():
                    if key.startswith(P.USER_HEADER_PREFIX):
                        user += (key.encode(), value.encode())
            topic_b = topic.encode()
            frames = P.message(topic_b, session.sender, user, command.payload)
            seed_frames: list[bytes] | None = None
            for target in targets:
                if target.legacy:
                    if seed_frames is None:
                        seed_frames = P.message(topic_b, None, user, command.payload)
                    out.append((target.routing_id, seed_frames))
                else:
                    out.append((target.routing_id, frames))
                target.last_sent = now
                target.delivered += 1
            self.counters["delivered"] += len(targets)
        if command.id is not None:
            session.last_sent = now
            out.append((session.routing_id, P.ok(command.id)))
        return out

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
                raise _topic_error(exc, command) from None
            result.append((pattern, tokens))
        return result

    def _subscribe(self, session: Session, command: Command, now: float) -> list[Out]:
        patterns = self._patterns(command)  # all validated before any change
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
        return self._answer(session, command, now)

    def _unsubscribe(self, session: Session, command: Command, now: float) -> list[Out]:
        for pattern, _ in self._patterns(command):
            tokens = session.patterns.pop(pattern, None)
            if tokens is not None:
                self.subscriptions.remove(tokens, session)
        return self._answer(session, command, now)

    # ------------------------------------------------------------ time and failures
    def _forget(self, session: Session, why: str) -> None:
        if self.sessions.get(session.routing_id) is session:
            del self.sessions[session.routing_id]
        for tokens in session.patterns.values():
            self.subscriptions.remove(tokens, session)
        session.patterns.clear()
        self.counters[f"forgotten_{why}"] += 1
        log.info("peer %s (%s) %s", session.routing_id.hex(), session.identity, why)

    def tick(self, now: float) -> list[Out]:
        """Heartbeats and expiry; call at ``next_deadline()`` or later."""
        if now < self._next_sweep:
            return []
        out: list[Out] = []
        liveness = self.settings.liveness
        earliest = now + 1.0
        for session in list(self.sessions.values()):
            expires = session.last_recv + session.ttl * liveness
            if now >= expires:
                self._forget(session, "expired")
                continue
            beat = session.last_sent + session.ttl
            if now >= beat:
                out.append((session.routing_id, P.NOOP_FRAMES))
                session.last_sent = now
                beat = now + session.ttl
            earliest = min(earliest, expires, beat)
        self._next_sweep = max(earliest, now + MIN_SWEEP_INTERVAL)
        return out

    def next_deadline(self) -> float:
        """When ``tick`` next has work (monotonic seconds)."""
        return self._next_sweep

    def send_failed(self, routing_id: bytes, now: float, *, unreachable: bool) -> list[Out]:
        """The shell could not send to a peer: gone (unreachable) or at HWM."""
        session = self.sessions.get(routing_id)
        if session is None:
            return []
        if unreachable:
            self._forget(session, "unreachable")
            return []
        self.counters["dropped"] += 1
        session.drops += 1
        if now - session.last_drop > DROP_EPISODE_GAP:
            session.drop_episode_start = now
        session.last_drop = now
        limit = self.settings.slow_consumer_ms
        if limit and now - session.drop_episode_start >= limit / 1000.0:
            log.warning(
                "peer %s (%s) too slow: %d messages dropped; disconnecting",
                routing_id.hex(),
                session.identity,
                session.drops,
            )
            self._forget(session, "too_slow")
            reason = f"consumer too slow: {session.drops} messages dropped; disconnected"
            return [(routing_id, P.error(Status.OVER_LIMIT, reason)), (routing_id, P.DISCONNECT_FRAMES)]
        return []

    def shutdown(self) -> list[Out]:
        """DISCONNECT every peer and forget them all."""
        out: list[Out] = [(rid, P.DISCONNECT_FRAMES) for rid in self.sessions]
        for session in list(self.sessions.values()):
            self._forget(session, "broker_shutdown")
        return out

    def stats(self) -> dict[str, object]:
        return {
            "peers": len(self.sessions),
            "subscriptions": len(self.subscriptions),
            "counters": dict(self.counters),
        }


def _topic_error(exc: InvalidTopic, command: Command) -> ProtocolError:
    code = Status.TOO_LARGE if exc.oversize else Status.BAD_REQUEST
    return ProtocolError(code, str(exc), command.id)
