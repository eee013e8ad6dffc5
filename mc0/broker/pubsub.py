"""Pub/sub: who subscribes to what, and one MESSAGE per PUT handed to each of them.

Contract: owns the subscription trie (patterns -> peers), each peer's
pattern set and the topic-token cache.  ``parse_patterns`` and
``check_subscribe`` validate a SUB whole before ``add`` changes anything;
``fan_out`` builds the MESSAGE frames once and returns one ``(routing id,
frames)`` per peer that may see it (exactly once per peer however many of
its patterns match; seed 0.x peers get the seed's shape; subscribe-deny
patterns are applied at delivery).  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from .. import protocol as P
from ..errors import InvalidTopic, ProtocolError
from ..permissions import Grants
from ..protocol import Command, Header, Limits, Status, batch
from ..topics import split_pattern, split_topic
from ..trie import TopicTrie
from .peers import Out, Peer

TOPIC_CACHE_SIZE = 4096

Pattern = tuple[str, tuple[str, ...]]  # (text, tokens)


def topic_error(exc: InvalidTopic, request_id: str | None) -> ProtocolError:
    code = Status.TOO_LARGE if exc.oversize else Status.BAD_REQUEST
    return ProtocolError(code, str(exc), request_id)


class PubSub:
    def __init__(self, limits: Limits, counters: Counter[str]) -> None:
        self.limits = limits
        self.counters = counters
        self.subscriptions: TopicTrie[Peer] = TopicTrie()
        self._patterns: dict[Peer, dict[str, tuple[str, ...]]] = {}
        self._topics: dict[str, tuple[str, ...]] = {}
        self._routes: dict[bytes, tuple[str, tuple[str, ...]]] = {}  # a PUT record's topic -> (text, tokens)
        self.version = 0  # bumped whenever a subscription is added or removed (for cached interest checks)

    # ------------------------------------------------------------ validation
    def topic_tokens(self, topic: str, request_id: str | None) -> tuple[str, ...]:
        """A PUT's topic, validated once and cached (400/413 as ProtocolError)."""
        tokens = self._topics.get(topic)
        if tokens is None:
            limits = self.limits
            try:
                tokens = split_topic(topic, max_bytes=limits.max_topic_bytes, max_tokens=limits.max_topic_tokens)
            except InvalidTopic as exc:
                raise topic_error(exc, request_id) from None
            if len(self._topics) >= TOPIC_CACHE_SIZE:
                self._topics.clear()
            self._topics[topic] = tokens
        return tokens

    def route_of(self, topic_b: bytes) -> tuple[str, tuple[str, ...]]:
        """A PUT record's topic bytes -> (text, tokens), validated once (ProtocolError 400/413)."""
        route = self._routes.get(topic_b)
        if route is None:
            try:
                topic = topic_b.decode()
            except UnicodeDecodeError:
                raise ProtocolError(Status.BAD_REQUEST, "topic is not UTF-8") from None
            route = (topic, self.topic_tokens(topic, None))
            if len(self._routes) >= TOPIC_CACHE_SIZE:
                self._routes.clear()
            self._routes[topic_b] = route
        return route

    def tokens_of(self, topic: str) -> tuple[str, ...] | None:
        """A stored topic's tokens (journal records), None if it is not a valid topic."""
        tokens = self._topics.get(topic)
        if tokens is None:
            try:
                tokens = split_topic(topic)
            except InvalidTopic:
                return None
        return tokens

    def parse_patterns(self, command: Command) -> list[Pattern]:
        limits = self.limits
        result = []
        for frame in command.payload:
            try:
                pattern = bytes(frame).decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError(Status.BAD_REQUEST, "pattern is not UTF-8", command.id) from None
            try:
                tokens = split_pattern(pattern, max_bytes=limits.max_topic_bytes, max_tokens=limits.max_topic_tokens)
            except InvalidTopic as exc:
                raise topic_error(exc, command.id) from None
            result.append((pattern, tokens))
        return result

    def check_subscribe(
        self, peer: Peer, patterns: list[Pattern], request_id: str | None
    ) -> dict[str, tuple[str, ...]]:
        """The patterns ``peer`` does not hold yet, once every one is allowed and within the limit."""
        for pattern, tokens in patterns:
            if not peer.grants.may_subscribe(tokens):
                raise ProtocolError(Status.FORBIDDEN, f"{peer.identity} may not subscribe to {pattern}", request_id)
        held = self._patterns.get(peer, {})
        new = {p: t for p, t in patterns if p not in held}
        limit = self.limits.max_subscriptions
        if len(held) + len(new) > limit:
            raise ProtocolError(
                Status.OVER_LIMIT,
                f"{len(held) + len(new)} subscriptions, the limit per peer is {limit}",
                request_id,
            )
        return new

    # ------------------------------------------------------------ changes
    def add(self, peer: Peer, new: dict[str, tuple[str, ...]]) -> None:
        if not new:
            return
        held = self._patterns.setdefault(peer, {})
        for pattern, tokens in new.items():
            held[pattern] = tokens
            self.subscriptions.insert(tokens, peer)
        self.version += 1

    def remove(self, peer: Peer, patterns: Sequence[Pattern]) -> list[tuple[str, ...]]:
        """Drop these patterns of ``peer``; returns the tokens of those it held."""
        held = self._patterns.get(peer)
        removed: list[tuple[str, ...]] = []
        if not held:
            return removed
        for pattern, _ in patterns:
            tokens = held.pop(pattern, None)
            if tokens is not None:
                self.subscriptions.remove(tokens, peer)
                removed.append(tokens)
        if not held:
            del self._patterns[peer]
        self.version += 1
        return removed

    def drop_peer(self, peer: Peer) -> None:
        for tokens in self._patterns.pop(peer, {}).values():
            self.subscriptions.remove(tokens, peer)
        self.version += 1

    def withdraw_denied(self, peer: Peer, grants: Grants) -> list[Out]:
        """A new policy: drop ``peer``'s patterns it may no longer subscribe to, telling it each one."""
        out: list[Out] = []
        held = self._patterns.get(peer)
        if not held:
            return out
        for pattern, tokens in list(held.items()):
            if not grants.may_subscribe(tokens):
                del held[pattern]
                self.subscriptions.remove(tokens, peer)
                reason = f"subscription {pattern} withdrawn by policy"
                out.append((peer.routing_id, P.error(Status.FORBIDDEN, reason, topic=pattern)))
        if not held:
            del self._patterns[peer]
        self.version += 1
        return out

    # ------------------------------------------------------------ delivery
    def wanted(self, tokens: tuple[str, ...]) -> bool:
        return bool(self.subscriptions.match(tokens))

    def fan_out(
        self,
        topic: str,
        tokens: tuple[str, ...],
        sender: bytes,
        headers: dict[str, str],
        body: Sequence[bytes],
        now: float,
        position: tuple[str, int] | None = None,
        held_back: set[Peer] | None = None,
    ) -> list[Out]:
        """One MESSAGE built once, handed to every subscriber that may see it.

        ``position`` is ``(journal, seq)`` of a journaled message;
        ``held_back`` are peers whose running replay will deliver it instead.
        """
        targets = self.subscriptions.match(tokens)
        out: list[Out] = []
        if not targets:
            return out
        # Most PUTs carry TOPIC (and ID) only: skip the scan for X- headers then.
        user = P.user_header_frames(headers) if len(headers) > 1 + (Header.ID in headers) else []
        topic_b = topic.encode()
        where = (position[0].encode(), position[1]) if position is not None else None
        # Each shape is built once, when the first subscriber that needs it comes up.
        frames: list[bytes] | None = None
        record: bytes | None = None  # for batched subscribers
        seed_frames: list[bytes] | None = None
        for target in targets:
            if target.grants.deny_subscribe and not target.grants.delivers(tokens):
                continue  # a wildcard overlapping a denied topic: never delivered
            if held_back and target in held_back:
                continue
            if target.batched:
                if record is None:
                    if not user and where is None and len(body) == 1:
                        record = batch.message_record(topic_b, sender, bytes(body[0]))
                    else:
                        frames = frames or P.message(topic_b, sender, user, body, where)
                        record = batch.frames_record(frames)
                out.append((target.routing_id, record))
            elif target.legacy:
                if seed_frames is None:
                    seed_frames = P.message(topic_b, None, user, body)
                out.append((target.routing_id, seed_frames))
            else:
                if frames is None:
                    frames = P.message(topic_b, sender, user, body, where)
                out.append((target.routing_id, frames))
            target.last_sent = now
            target.delivered += 1
        self.counters["delivered"] += len(out)  # skipped (denied) targets are not deliveries
        return out

    def fan_out_put(
        self,
        topic: str,
        tokens: tuple[str, ...],
        publisher: Peer,
        put_body: bytes,
        data_at: int,
        now: float,
        out: list[Out],
        sink: dict[bytes, list[bytes]],
    ) -> None:
        """``fan_out`` for a PUT record (TOPIC and one body frame, no journal).  Batched
        subscribers get the publisher's record body forwarded as it came (``put_body`` is
        ``tl topic data``; the data starts at ``data_at``), collected per subscriber in
        ``sink`` (the caller joins each one's records into one payload); others get frames
        appended to ``out``."""
        targets = self.subscriptions.match(tokens)
        if not targets:
            return
        record: bytes | None = None
        frames: list[bytes] | None = None
        seed_frames: list[bytes] | None = None
        delivered = 0
        for target in targets:
            if target.grants.deny_subscribe and not target.grants.delivers(tokens):
                continue
            if target.batched:
                if record is None:
                    record = batch.message_of_put(publisher.sender_block, put_body)
                held = sink.get(target.routing_id)
                if held is None:
                    sink[target.routing_id] = [record]
                else:
                    held.append(record)
            elif target.legacy:
                if seed_frames is None:
                    seed_frames = P.message(topic.encode(), None, (), (put_body[data_at:],))
                out.append((target.routing_id, seed_frames))
            else:
                if frames is None:
                    frames = P.message(topic.encode(), publisher.sender, (), (put_body[data_at:],))
                out.append((target.routing_id, frames))
            target.last_sent = now
            target.delivered += 1
            delivered += 1
        self.counters["delivered"] += delivered

    # ------------------------------------------------------------ reports
    def count_of(self, peer: Peer) -> int:
        return len(self._patterns.get(peer, ()))

    def patterns_of(self, peer: Peer) -> list[str]:
        return list(self._patterns.get(peer, ()))

    def report(self) -> dict[str, int]:
        return {
            ".".join(pattern): len(values)
            for pattern, values in sorted(self.subscriptions.patterns(), key=lambda pv: pv[0])
        }
