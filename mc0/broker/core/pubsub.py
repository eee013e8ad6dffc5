"""Pub/sub: who subscribes to what, and one MESSAGE per PUT handed to each of them.

Contract: owns the subscription trie (patterns -> peers), each peer's
pattern set and the topic-token cache.  ``parse_patterns`` and
``check_subscribe`` validate a SUB whole before ``add`` changes anything;
``fan_out`` builds the MESSAGE frames once and returns one ``(routing id,
frames)`` per peer that may see it (exactly once per peer however many of
its patterns match; seed 0.x peers get the seed's shape; subscribe-deny
patterns are applied at delivery).

Queue groups (``SUB GROUP g``) live beside the plain subscriptions: a
message matching a group goes to exactly one member of it, the least
recently chosen member that can take it (members whose queue is backing up
are skipped, not waited for: :class:`~mc0.broker.core.groups.GroupChoice`
chooses), as a MESSAGE with ``GROUP g``; a batched member's copy joins the
other records for it, as a plain subscriber's does.  Plain subscribers get their
copy as before.  A publisher that connected with ``ECHO 0`` is never handed
its own message.  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

from ... import protocol as P
from ...errors import InvalidTopic, ProtocolError, quoted
from ...permissions import Grants
from ...protocol import Command, Header, Limits, Status, batch
from ...topics import seed_topic, split_pattern, split_topic
from ...trie import TopicTrie
from .groups import Chosen, GroupChoice, HandedBack, Member
from .peers import Out, Peer

TOPIC_CACHE_SIZE = 4096

Pattern = tuple[str, tuple[str, ...]]  # (text, tokens)


class InterestListener(Protocol):
    """Told when this broker's own peers start or stop wanting a pattern (the cluster's routes:
    :class:`mc0.broker.core.routes.Routes`); ``exact``: a 0.x peer's opaque topic."""

    def subscribed(self, group: str | None, pattern: str, exact: bool) -> None: ...

    def unsubscribed(self, group: str | None, pattern: str, exact: bool) -> None: ...


def topic_error(exc: InvalidTopic, request_id: str | None) -> ProtocolError:
    code = Status.TOO_LARGE if exc.oversize else Status.BAD_REQUEST
    return ProtocolError(code, str(exc), request_id)


def _copies(
    out: list[Out],
    targets: Sequence[Peer],
    tokens: tuple[str, ...],
    topic_b: bytes,
    sender: bytes,
    user: list[bytes],
    body: Sequence[bytes],
    where: tuple[bytes, int] | None,
    now: float,
    skip: Peer | None,
    held_back: set[Peer] | None,
    admits: Callable[[Grants], bool] | None,
) -> None:
    """One message's copy for each of ``targets`` that may see it, added to ``out``: each shape (a
    MESSAGE's frames, a batched subscriber's record, a 0.x peer's seed frames) built once, when the
    first subscriber that needs it comes up (``PubSub.fan_out`` says who is skipped and why)."""
    frames: list[bytes] | None = None
    record: bytes | None = None  # for batched subscribers
    seed_frames: list[bytes] | None = None
    for target in targets:
        if target.grants.deny_subscribe and not target.grants.delivers(tokens):
            continue  # a wildcard overlapping a denied topic: never delivered
        if held_back and target in held_back:
            continue
        if target is skip:
            continue
        if admits is not None and not admits(target.grants):
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


class PubSub:
    def __init__(
        self,
        limits: Limits,
        counters: Counter[str],
        *,
        interest: InterestListener | None = None,
        can_take: Callable[[bytes], bool] | None = None,
    ) -> None:
        """``interest``: told of every pattern this broker's own peers start or stop holding (the
        cluster's routes); ``can_take``: whether a queue-group member may be chosen now (see
        :class:`~mc0.broker.core.groups.GroupChoice`)."""
        self.limits = limits
        self.counters = counters
        self.subscriptions: TopicTrie[Peer] = TopicTrie()
        self._patterns: dict[Peer, dict[str, tuple[str, ...]]] = {}
        self._topics: dict[str, tuple[str, ...]] = {}
        self._record_topics: dict[bytes, tuple[str, tuple[str, ...]]] = {}  # a PUT record's topic -> (text, tokens)
        self._seed_topics: dict[str, tuple[str, ...]] = {}  # a 0.x PUT's topic -> tokens, () when opaque
        self._opaque: dict[str, dict[Peer, None]] = {}  # an opaque 0.x topic -> its (0.x) subscribers
        # Subscribers per pattern text (plain and opaque alike), kept as subscriptions come and go: what
        # /subsz shows, copied by a monitoring capture in C (never a walk over the trie per scrape).
        self.subscribers_per_pattern: dict[str, int] = {}
        self.version = 0  # bumped whenever a subscription is added or removed (for cached interest checks)
        self.groups: TopicTrie[Member] = TopicTrie()
        self._group_patterns: dict[Member, dict[str, tuple[str, ...]]] = {}
        self._groups_of: dict[Peer, set[str]] = {}
        self.choice = GroupChoice(self.groups, can_take=can_take)  # which member gets each message
        self.interest = interest

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

    def seed_topic_tokens(self, topic: str, request_id: str | None) -> tuple[str, ...]:
        """A 0.x peer's topic, validated once and cached: its tokens, or ``()`` when opaque (400/413)."""
        tokens = self._seed_topics.get(topic)
        if tokens is None:
            limits = self.limits
            try:
                tokens = seed_topic(topic, max_bytes=limits.max_topic_bytes, max_tokens=limits.max_topic_tokens)
            except InvalidTopic as exc:
                raise topic_error(exc, request_id) from None
            if len(self._seed_topics) >= TOPIC_CACHE_SIZE:
                self._seed_topics.clear()
            self._seed_topics[topic] = tokens
        return tokens

    def record_topic(self, topic_b: bytes) -> tuple[str, tuple[str, ...]]:
        """A PUT record's topic bytes -> (text, tokens), validated once (ProtocolError 400/413)."""
        known = self._record_topics.get(topic_b)
        if known is None:
            try:
                topic = topic_b.decode()
            except UnicodeDecodeError:
                raise ProtocolError(Status.BAD_REQUEST, "topic is not UTF-8") from None
            known = (topic, self.topic_tokens(topic, None))
            if len(self._record_topics) >= TOPIC_CACHE_SIZE:
                self._record_topics.clear()
            self._record_topics[topic_b] = known
        return known

    def tokens_of(self, topic: str) -> tuple[str, ...] | None:
        """A stored topic's tokens (journal records), None if it is not a valid topic."""
        tokens = self._topics.get(topic)
        if tokens is None:
            try:
                tokens = split_topic(topic)
            except InvalidTopic:
                return None
        return tokens

    def parse_patterns(self, command: Command, *, legacy: bool = False) -> list[Pattern]:
        """A SUB/UNSUB's patterns; a 0.x (``legacy``) peer's are exact topics (``seed_topic``)."""
        limits = self.limits
        result = []
        for frame in command.payload:
            try:
                pattern = bytes(frame).decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError(Status.BAD_REQUEST, "pattern is not UTF-8", command.id) from None
            if legacy:
                result.append((pattern, self.seed_topic_tokens(pattern, command.id)))
                continue
            try:
                tokens = split_pattern(pattern, max_bytes=limits.max_topic_bytes, max_tokens=limits.max_topic_tokens)
            except InvalidTopic as exc:
                raise topic_error(exc, command.id) from None
            result.append((pattern, tokens))
        return result

    def check_group(self, peer: Peer, command: Command) -> str | None:
        """The GROUP of a SUB/UNSUB, validated (None: a plain subscription)."""
        group = command.headers.get(Header.GROUP)
        if group is None:
            return None
        if peer.legacy:
            raise ProtocolError(Status.BAD_REQUEST, f"queue groups need protocol {P.FULL_VERSION}", command.id)
        if Header.FROM in command.headers:
            raise ProtocolError(Status.BAD_REQUEST, "a queue group cannot replay (GROUP with FROM)", command.id)
        if not P.valid_group(group):
            raise ProtocolError(
                Status.BAD_REQUEST,
                f"group {quoted(group, 64)}: 1 to {P.MAX_GROUP_BYTES} UTF-8 bytes without whitespace",
                command.id,
            )
        return group

    def held(self, peer: Peer, group: str | None) -> dict[str, tuple[str, ...]]:
        """``peer``'s patterns (in ``group``, if given)."""
        if group is None:
            return self._patterns.get(peer, {})
        return self._group_patterns.get((group, peer), {})

    def count(self, peer: Peer) -> int:
        """The patterns ``peer`` holds, plain and in every queue group."""
        return self._count_all(peer)

    def _count_all(self, peer: Peer) -> int:
        count = len(self._patterns.get(peer, ()))
        for group in self._groups_of.get(peer, ()):
            count += len(self._group_patterns.get((group, peer), ()))
        return count

    def check_subscribe(
        self, peer: Peer, patterns: list[Pattern], request_id: str | None, group: str | None = None
    ) -> dict[str, tuple[str, ...]]:
        """The patterns ``peer`` does not hold yet (in ``group``, if given), once every one
        is allowed and within the limit (plain and group patterns count together)."""
        for pattern, tokens in patterns:
            if not (peer.grants.may_subscribe(tokens) if tokens else peer.grants.may_use_opaque("subscribe")):
                reason = f"{peer.identity} may not subscribe to {pattern}"
                if peer.grants.hides_peers(tokens):
                    reason += f" (it reaches {P.SYS_PEER_TOPIC}, which needs a subscribe grant naming it)"
                raise ProtocolError(Status.FORBIDDEN, reason, request_id)
        held = self.held(peer, group)
        new = {p: t for p, t in patterns if p not in held}
        limit = self.limits.max_subscriptions
        total = self._count_all(peer) + len(new)
        if total > limit:
            raise ProtocolError(
                Status.OVER_LIMIT,
                f"{total} subscriptions, the limit per peer is {limit} (broker.limits.max_subscriptions)",
                request_id,
            )
        return new

    # ------------------------------------------------------------ changes
    def add(self, peer: Peer, new: dict[str, tuple[str, ...]], group: str | None = None) -> None:
        if not new:
            return
        if group is not None:
            member = (group, peer)
            held = self._group_patterns.setdefault(member, {})
            self._groups_of.setdefault(peer, set()).add(group)
            for pattern, tokens in new.items():
                held[pattern] = tokens
                self.groups.insert(tokens, member)
                self._announce(peer, group, pattern, tokens, True)
            self.version += 1
            return
        held = self._patterns.setdefault(peer, {})
        counts = self.subscribers_per_pattern
        for pattern, tokens in new.items():
            if pattern not in held:
                counts[pattern] = counts.get(pattern, 0) + 1
            held[pattern] = tokens
            if tokens:
                self.subscriptions.insert(tokens, peer)
            else:
                self._opaque.setdefault(pattern, {})[peer] = None
            self._announce(peer, None, pattern, tokens, True)
        self.version += 1

    def _announce(self, peer: Peer, group: str | None, pattern: str, tokens: tuple[str, ...], held: bool) -> None:
        """Tell the interest listener that one of this broker's own peers took or dropped a pattern."""
        interest = self.interest
        if interest is not None and not peer.route:
            (interest.subscribed if held else interest.unsubscribed)(group, pattern, not tokens)

    def _uncount(self, pattern: str) -> None:
        counts = self.subscribers_per_pattern
        left = counts.get(pattern, 0) - 1
        if left > 0:
            counts[pattern] = left
        else:
            counts.pop(pattern, None)

    def _remove_opaque(self, topic: str, peer: Peer) -> None:
        subscribers = self._opaque.get(topic)
        if subscribers is not None:
            subscribers.pop(peer, None)
            if not subscribers:
                del self._opaque[topic]

    def _remove_member(self, peer: Peer, group: str, patterns: Sequence[Pattern] | None) -> None:
        """Drop ``patterns`` (None: all) of ``peer`` in ``group``."""
        member = (group, peer)
        held = self._group_patterns.get(member)
        if held:
            for pattern in list(held) if patterns is None else [p for p, _ in patterns]:
                tokens = held.pop(pattern, None)
                if tokens is not None:
                    self.groups.remove(tokens, member)
                    self._announce(peer, group, pattern, tokens, False)
        if not held:
            self._group_patterns.pop(member, None)
            self.choice.forget(member)
            groups = self._groups_of.get(peer)
            if groups is not None:
                groups.discard(group)
                if not groups:
                    del self._groups_of[peer]
        self.version += 1

    def remove(self, peer: Peer, patterns: Sequence[Pattern], group: str | None = None) -> list[tuple[str, ...]]:
        """Drop these patterns of ``peer`` (in ``group``); returns the tokens of the plain ones it held."""
        if group is not None:
            self._remove_member(peer, group, patterns)
            return []
        held = self._patterns.get(peer)
        removed: list[tuple[str, ...]] = []
        if not held:
            return removed
        for pattern, _ in patterns:
            tokens = held.pop(pattern, None)
            if tokens is not None:
                self._uncount(pattern)
            if tokens:
                self.subscriptions.remove(tokens, peer)
                removed.append(tokens)
            elif tokens is not None:
                self._remove_opaque(pattern, peer)
            if tokens is not None:
                self._announce(peer, None, pattern, tokens, False)
        if not held:
            del self._patterns[peer]
        self.version += 1
        return removed

    def drop_peer(self, peer: Peer) -> None:
        for pattern, tokens in self._patterns.pop(peer, {}).items():
            self._uncount(pattern)
            if tokens:
                self.subscriptions.remove(tokens, peer)
            else:
                self._remove_opaque(pattern, peer)
            self._announce(peer, None, pattern, tokens, False)
        for group in list(self._groups_of.get(peer, ())):
            self._remove_member(peer, group, None)
        self.version += 1

    def withdraw_denied(self, peer: Peer, grants: Grants) -> list[Out]:
        """A new policy: drop ``peer``'s patterns it may no longer subscribe to, telling it each one."""
        out: list[Out] = []
        held = self._patterns.get(peer, {})
        for pattern, tokens in list(held.items()):
            if not (grants.may_subscribe(tokens) if tokens else grants.may_use_opaque("subscribe")):
                del held[pattern]
                self._uncount(pattern)
                if tokens:
                    self.subscriptions.remove(tokens, peer)
                else:
                    self._remove_opaque(pattern, peer)
                self._announce(peer, None, pattern, tokens, False)
                reason = f"subscription {pattern} withdrawn by policy"
                out.append((peer.routing_id, P.error(Status.FORBIDDEN, reason, topic=pattern)))
        if not held:
            self._patterns.pop(peer, None)
        for group in list(self._groups_of.get(peer, ())):
            denied = [
                (p, t) for p, t in self._group_patterns.get((group, peer), {}).items() if not grants.may_subscribe(t)
            ]
            if denied:
                self._remove_member(peer, group, denied)
                for pattern, _ in denied:
                    reason = f"subscription {pattern} in group {group} withdrawn by policy"
                    out.append((peer.routing_id, P.error(Status.FORBIDDEN, reason, topic=pattern, group=group)))
        self.version += 1
        return out

    # ------------------------------------------------------------ delivery
    def wanted(self, tokens: tuple[str, ...]) -> bool:
        return bool(self.subscriptions.match(tokens)) or bool(self._group_patterns and self.groups.match(tokens))

    def _group_copies(
        self,
        chosen: list[Chosen],
        topic_b: bytes,
        sender: bytes,
        user: Sequence[bytes],
        body: Sequence[bytes],
        tried: bytes | None = None,
    ) -> list[Out]:
        """The copy for each chosen member; ``tried``: brokers that handed this copy back (a route
        chosen now is told them, to name them again if it hands the copy back too)."""
        out: list[Out] = []
        one_frame = not user and len(body) == 1 and tried is None
        for group_b, peer in chosen:
            if peer.batched and one_frame:  # the common case, in one pass
                out.append((peer.routing_id, batch.group_message_record(topic_b, sender, group_b, bytes(body[0]))))
                continue
            passed = (Header.TRIED.encode(), tried) if tried is not None and peer.route else None
            frames = P.message(topic_b, sender, user, body, group=group_b, passed=passed)
            out.append((peer.routing_id, batch.frames_record(frames) if peer.batched else frames))
        return out

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
        publisher: Peer | None = None,
        admits: Callable[[Grants], bool] | None = None,
        from_route: tuple[str | None] | None = None,
        back: HandedBack | None = None,
    ) -> list[Out]:
        """One MESSAGE built once, handed to every subscriber that may see it, and one
        copy to a member of each queue group it matches.

        ``position`` is ``(journal, seq)`` of a journaled message;
        ``held_back`` are peers whose running replay will deliver it instead;
        ``publisher`` is skipped when it connected with ``ECHO 0``;
        ``admits``: a further check of each receiver's grants (a dead letter's original topic);
        ``from_route``: the message came from another broker, which handled the other brokers:
        ``(None,)`` its plain copy (this broker's own plain subscribers only), ``(g,)`` the copy
        for queue group g it chose this broker for (one own member of g, nobody else);
        ``back`` with ``(g,)``: this broker's copy for g, handed back by the broker it chose (an own
        member of g or a route that has not refused it).
        """
        skip = publisher if publisher is not None and not publisher.echo else None
        targets: Sequence[Peer]
        if from_route is None:
            targets = self.subscriptions.match(tokens)
            chosen = self.choice.chosen(self.version, tokens, skip, admits) if self._group_patterns else []
        elif from_route[0] is None:
            targets = tuple(t for t in self.subscriptions.match(tokens) if not t.route)
            chosen = []
        else:
            targets = ()
            chosen = self.choice.chosen(self.version, tokens, skip, admits, only=from_route[0], back=back)
        out: list[Out] = []
        if not targets and not chosen:
            return out
        # Most PUTs carry TOPIC (and ID) only: skip the scan for X- headers then.
        user = P.user_header_frames(headers) if len(headers) > 1 + (Header.ID in headers) else []
        topic_b = topic.encode()
        if chosen:
            out += self._group_copies(chosen, topic_b, sender, user, body, back.tried if back is not None else None)
            for _, member in chosen:
                member.last_sent = now
                member.delivered += 1
        if targets:
            where = (position[0].encode(), position[1]) if position is not None else None
            _copies(out, targets, tokens, topic_b, sender, user, body, where, now, skip, held_back, admits)
        self.counters["delivered"] += len(out)  # skipped (denied) targets are not deliveries
        return out

    def handed_back(self, tokens: tuple[str, ...], group: str, route: Peer) -> None:
        """``route`` handed back this broker's copy for ``group``: its members may not take the topic;
        it is passed over for the topic while another member may (until a subscription changes)."""
        self.choice.handed_back(self.version, tokens, group, route)

    def fan_out_groups(
        self, topic: str, tokens: tuple[str, ...], sender: bytes, headers: dict[str, str], body: Sequence[bytes],
        now: float, publisher: Peer | None = None, admits: Callable[[Grants], bool] | None = None,
    ) -> list[Out]:  # fmt: skip
        """Only the one copy per matching queue group (a member here, or a route): a record JetStream
        delivered, whose plain copies every broker makes for its own subscribers."""
        chosen = self.choice.chosen(
            self.version, tokens, publisher if publisher is not None and not publisher.echo else None, admits
        )
        for _, member in chosen:
            member.last_sent, member.delivered = now, member.delivered + 1
        user = P.user_header_frames(headers) if len(headers) > 1 else []
        return self._group_copies(chosen, topic.encode(), sender, user, body) if chosen else []

    def fan_out_opaque(
        self,
        topic: str,
        sender: bytes,
        headers: dict[str, str],
        body: Sequence[bytes],
        now: float,
        *,
        from_route: bool = False,
    ) -> list[Out]:
        """A 0.x PUT on an opaque topic: to the 0.x peers that subscribed that exact string
        (the seed's MESSAGE shape, every X- header kept), and to the other brokers that have
        such peers, with the SENDER (unless it came from one: ``from_route``)."""
        targets = self._opaque.get(topic)
        if not targets:
            return []
        user = P.user_header_frames(headers)
        frames = P.message(topic.encode(), None, user, body)
        out: list[Out] = []
        for target in targets:
            if target.route:
                if from_route:
                    continue
                out.append((target.routing_id, batch.frames_record(P.message(topic.encode(), sender, user, body))))
            else:
                out.append((target.routing_id, frames))
            target.last_sent = now
            target.delivered += 1
        self.counters["delivered"] += len(out)
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
        appended to ``out``.  Each matching queue group's chosen member gets one copy (a
        ``GROUP`` record, built once), collected in ``sink`` too when it is batched."""
        skip = publisher if not publisher.echo else None
        targets = self.subscriptions.match(tokens)
        delivered = 0
        if self._group_patterns:
            chosen = self.choice.chosen(self.version, tokens, skip)
            if chosen:
                # Each member's copy goes with the other records for it (``sink``), as a plain subscriber's.
                topic_b = put_body[2:data_at]
                data = put_body[data_at:]
                for group_b, member in chosen:
                    if member.batched:
                        copy = batch.group_message_record(topic_b, publisher.sender, group_b, data)
                        held = sink.get(member.routing_id)
                        if held is None:
                            sink[member.routing_id] = [copy]
                        else:
                            held.append(copy)
                    else:
                        out.append(
                            (member.routing_id, P.message(topic_b, publisher.sender, (), (data,), group=group_b))
                        )
                    member.last_sent = now
                    member.delivered += 1
                delivered += len(chosen)
        if not targets:
            self.counters["delivered"] += delivered
            return
        record: bytes | None = None
        frames: list[bytes] | None = None
        seed_frames: list[bytes] | None = None
        for target in targets:
            if target.grants.deny_subscribe and not target.grants.delivers(tokens):
                continue
            if target is skip:
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

    def fan_out_journaled(
        self,
        tokens: tuple[str, ...],
        publisher: Peer,
        topic_b: bytes,
        data: bytes,
        position: tuple[bytes, int],
        held_back: set[Peer] | None,
        now: float,
        out: list[Out],
        sink: dict[bytes, list[bytes]],
    ) -> None:
        """``fan_out`` for a journaled PUT record (TOPIC and one body frame, just appended at
        ``position``, ``(journal, seq)``): what ``fan_out`` delivers, the live copies with ``JOURNAL``
        and ``SEQ`` (none to ``held_back``, whose replay delivers it), a batched subscriber's record
        built once (``batch.journaled_message_record``) and collected in ``sink`` as ``fan_out_put``
        collects them, one copy to a member of each matching queue group."""
        skip = publisher if not publisher.echo else None
        sender = publisher.sender
        delivered = 0
        if self._group_patterns:
            chosen = self.choice.chosen(self.version, tokens, skip, None)
            for group_b, member in chosen:
                if member.batched:
                    copy = batch.group_message_record(topic_b, sender, group_b, data)
                    held = sink.get(member.routing_id)
                    if held is None:
                        sink[member.routing_id] = [copy]
                    else:
                        held.append(copy)
                else:
                    out.append((member.routing_id, P.message(topic_b, sender, (), (data,), group=group_b)))
                member.last_sent = now
                member.delivered += 1
            delivered += len(chosen)
        record: bytes | None = None
        frames: list[bytes] | None = None
        seed_frames: list[bytes] | None = None
        for target in self.subscriptions.match(tokens):
            if target.grants.deny_subscribe and not target.grants.delivers(tokens):
                continue
            if held_back and target in held_back:
                continue
            if target is skip:
                continue
            if target.batched:
                if record is None:
                    record = batch.journaled_message_record(topic_b, sender, position[0], position[1], data)
                held = sink.get(target.routing_id)
                if held is None:
                    sink[target.routing_id] = [record]
                else:
                    held.append(record)
            elif target.legacy:
                if seed_frames is None:
                    seed_frames = P.message(topic_b, None, (), (data,))
                out.append((target.routing_id, seed_frames))
            else:
                if frames is None:
                    frames = P.message(topic_b, sender, (), (data,), position)
                out.append((target.routing_id, frames))
            target.last_sent = now
            target.delivered += 1
            delivered += 1
        self.counters["delivered"] += delivered

    # ------------------------------------------------------------ reports
    def count_of(self, peer: Peer) -> int:
        return len(self._patterns.get(peer, ()))

    def subscription_count(self) -> int:
        """The plain subscriptions held: (pattern, peer) pairs (queue groups' and 0.x opaque topics' not counted)."""
        return len(self.subscriptions)

    def has_subscribers(self) -> bool:
        """Some peer holds a subscription, plain or in a queue group."""
        return bool(len(self.subscriptions) or len(self.groups))

    def interest_of(self, peer: Peer) -> tuple[list[str], list[str]]:
        """``peer``'s plain patterns and its exact (0.x, opaque) topics, each in the order it took them."""
        held = self._patterns.get(peer, {})
        return [p for p, tokens in held.items() if tokens], [p for p, tokens in held.items() if not tokens]

    def subscription_counts(self) -> dict[Peer, int]:
        """Each subscribed peer's number of patterns (a monitoring capture's: one pass over those peers)."""
        return {peer: len(held) for peer, held in self._patterns.items()}

    def grouped_peers(self) -> dict[Peer, tuple[str, ...]]:
        """Each queue-group member's groups, sorted (peers in no group are not here)."""
        return {peer: tuple(sorted(groups)) for peer, groups in self._groups_of.items()}

    def patterns_of(self, peer: Peer) -> list[str]:
        return list(self._patterns.get(peer, ()))

    def groups_of(self, peer: Peer) -> dict[str, list[str]]:
        """``peer``'s queue groups and its patterns in each."""
        return {g: list(self._group_patterns.get((g, peer), ())) for g in sorted(self._groups_of.get(peer, ()))}

    def group_report(self) -> dict[str, dict[str, int]]:
        """Each queue group: its member count per pattern."""
        report: dict[str, dict[str, int]] = {}
        for pattern, members in self.groups.patterns():
            for group, _ in members:
                counts = report.setdefault(group, {})
                key = ".".join(pattern)
                counts[key] = counts.get(key, 0) + 1
        return dict(sorted(report.items()))

    def report(self) -> dict[str, int]:
        """Subscribers per pattern (and per opaque 0.x topic), sorted by pattern (the counts kept as
        subscriptions change: no walk over the trie)."""
        return dict(sorted(self.subscribers_per_pattern.items()))

    def walked_report(self) -> dict[str, int]:
        """``report`` as a walk over the trie finds it (what the kept counts are tested against)."""
        report = {
            ".".join(pattern): len(values)
            for pattern, values in sorted(self.subscriptions.patterns(), key=lambda pv: pv[0])
        }
        for topic, subscribers in sorted(self._opaque.items()):
            report[topic] = report.get(topic, 0) + len(subscribers)  # "a.*" may be both
        return dict(sorted(report.items()))
