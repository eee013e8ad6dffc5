"""Durable consumers: a named, server-side position on a journal, with acks (JetStream pull consumers).

Contract: owns every consumer (its config, its ack floor, what it delivered
and is waiting to hear about, and the pulls waiting for messages).  The
``mc0.consumer`` service's JSON ops arrive through ``handle``; a request is
validated whole before it changes anything (400/403/404/409 as
``ProtocolError``).  Each delivered message is in one :class:`Delivery`
state, moved only by ``delivery_transition`` (one table, tested as one):
``ack``/``term`` settle it, ``nak`` makes it due again (after a delay),
``ack_wait`` passing makes it due, and a due message that already had
``max_deliver`` deliveries is dead-lettered (published on
``mc0.sys.dead.<journal>.<consumer>`` with the reason) and settled.

Persistence goes through the :class:`~mc0.broker.storage.port.JournalStore` port
(``save_consumer``/``load_consumers``): a changed consumer is saved at the
core's ``commit``, and the answers to ack/nak/term/create/delete are held
until it is, so an acknowledged ack survives kill -9.  What a restart loses
is only *who* holds a delivery: messages delivered and not settled are due
again at once, with their delivery counts.  Pure: no sockets, no clock.
"""

from __future__ import annotations

import heapq
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from ... import protocol as P
from ...errors import InvalidTopic, ProtocolError
from ...message import Record
from ...protocol import CONSUMER_SERVICE, Status
from ...topics import pattern_matches, split_pattern
from ..storage.port import JournalStore, StateUnreadable, Trimmed
from .peers import Out, Peer

MAX_CONSUMERS = 1_000  # per broker
MAX_WAITING_PULLS = 512  # held pulls per consumer (429 beyond)
MAX_PULL = 1_000  # messages per pull
MAX_ACKS = 10_000  # sequence numbers per ack/nak/term
DEAD_LETTER_PREFIX = P.RESERVED_TOPIC_PREFIX + "dead."
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a consumer name is a topic token of its dead-letter topic


class Delivery(Enum):
    PENDING = "pending"  # delivered, waiting for ack/nak/term until its ack_wait passes
    DUE = "due"  # to be delivered again (nak, ack_wait passed, or a restart)
    SETTLED = "settled"  # acked, termed or dead-lettered: never delivered again


class Event(Enum):
    DELIVER = "deliver"  # a pull hands it out
    ACK = "ack"
    NAK = "nak"
    TERM = "term"
    ACK_WAIT = "ack_wait"  # its ack_wait passed without an answer
    EXHAUSTED = "exhausted"  # due, and it already had max_deliver deliveries


# (state, event) -> the next state; a missing pair leaves the state as it is (a late ack of a
# settled message, say) and is counted by the caller as ignored.
TRANSITIONS: dict[tuple[Delivery, Event], Delivery] = {
    (Delivery.DUE, Event.DELIVER): Delivery.PENDING,
    (Delivery.PENDING, Event.ACK): Delivery.SETTLED,
    (Delivery.PENDING, Event.TERM): Delivery.SETTLED,
    (Delivery.PENDING, Event.NAK): Delivery.DUE,
    (Delivery.PENDING, Event.ACK_WAIT): Delivery.DUE,
    (Delivery.DUE, Event.ACK): Delivery.SETTLED,  # an ack that arrives after ack_wait still counts
    (Delivery.DUE, Event.TERM): Delivery.SETTLED,
    (Delivery.DUE, Event.EXHAUSTED): Delivery.SETTLED,
}


def delivery_transition(state: Delivery, event: Event) -> Delivery | None:
    """The next state, or None when the event does not apply (nothing changes)."""
    return TRANSITIONS.get((state, event))


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    journal: str
    name: str
    topics: tuple[str, ...] = (">",)
    ack_wait_ms: int = 30_000
    max_deliver: int = 5
    max_ack_pending: int = 1_000
    deliver: str = "all"  # "all": from the journal's first record; "new": from its end at creation


@dataclass(slots=True)
class Held:
    """A delivered message the consumer has not settled."""

    state: Delivery
    deliveries: int
    due: float  # PENDING: when ack_wait passes; DUE: when it may be delivered again


@dataclass(slots=True)
class Waiting:
    peer: Peer
    rid: str
    user: dict[str, str]
    max: int
    until: float


@dataclass(slots=True)
class Consumer:
    config: ConsumerConfig
    journal: JournalStore
    patterns: tuple[tuple[str, ...], ...]
    cursor: int  # the next journal seq never looked at; every seq below it is settled unless held
    held: dict[int, Held] = field(default_factory=dict)
    timers: list[tuple[float, int]] = field(default_factory=list)  # (due, seq) heap, stale entries skipped
    waiting: list[Waiting] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)

    @property
    def ack_floor(self) -> int:
        """Every seq up to this one is settled (or never matched)."""
        return min(self.held, default=self.cursor) - 1

    def matches(self, topic_tokens: tuple[str, ...] | None) -> bool:
        return topic_tokens is not None and any(pattern_matches(p, topic_tokens) for p in self.patterns)

    def state(self) -> bytes:
        """What is persisted (JSON)."""
        return json.dumps(
            {
                "config": asdict(self.config),
                "cursor": self.cursor,
                "held": {str(seq): h.deliveries for seq, h in self.held.items()},
            },
            separators=(",", ":"),
        ).encode()


def _int(query: dict[str, Any], key: str, default: int, low: int, high: int, rid: str) -> int:
    value = query.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ProtocolError(Status.BAD_REQUEST, f"{key} must be an integer in [{low}, {high}]", rid)
    return value


class Consumers:
    def __init__(
        self,
        journals: dict[str, JournalStore],
        counters: Counter[str],
        *,
        tokens_of: Callable[[str], tuple[str, ...] | None],
        is_current: Callable[[Peer], bool],
        max_wait_ms: int,
    ) -> None:
        self.journals = journals
        self.counters = counters
        self._tokens_of = tokens_of
        self._is_current = is_current
        self._max_wait_ms = max_wait_ms
        self.consumers: dict[tuple[str, str], Consumer] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._deleted: set[tuple[str, str]] = set()
        # Answers released once the state they report is saved: (who asked, its request id, the answer).
        self._held_answers: list[tuple[Peer, str, Out]] = []
        self.dead_letters: list[tuple[str, Record, str, int]] = []  # (topic, record, reason, deliveries)
        for journal in journals.values():
            for name, raw in journal.load_consumers().items():
                self._restore(journal, name, raw)

    # ------------------------------------------------------------ persistence
    def _restore(self, journal: JournalStore, name: str, raw: bytes) -> None:
        try:
            saved = json.loads(raw)
            config = ConsumerConfig(**{**saved["config"], "topics": tuple(saved["config"]["topics"])})
            consumer = Consumer(config, journal, tuple(split_pattern(t) for t in config.topics), int(saved["cursor"]))
            for seq_text, deliveries in saved["held"].items():  # due at once: whoever held them is gone
                consumer.held[int(seq_text)] = Held(Delivery.DUE, int(deliveries), 0.0)
                heapq.heappush(consumer.timers, (0.0, int(seq_text)))
        except (ValueError, KeyError, TypeError, InvalidTopic) as exc:
            self.counters["consumer_state_unreadable"] += 1
            raise StateUnreadable(
                f"journal {journal.name}: consumer {name}: unreadable saved state ({exc}); "
                f"move its files (NAME.log, NAME.json) out of the journal's consumers/ folder to start without it"
            ) from None
        self.consumers[journal.name, name] = consumer

    @property
    def uncommitted(self) -> bool:
        return bool(self._dirty or self._deleted or self._held_answers)

    def commit(self) -> list[Out]:
        """Save what changed (through the port); the answers now due (507 for a consumer that could not save)."""
        failed: dict[tuple[str, str], OSError] = {}
        for key in self._deleted:
            try:
                self.journals[key[0]].save_consumer(key[1], None)
            except OSError as exc:
                failed[key] = exc
        for key in self._dirty:
            consumer = self.consumers.get(key)
            if consumer is not None:
                try:
                    consumer.journal.save_consumer(key[1], consumer.state())
                except OSError as exc:
                    failed[key] = exc
        if failed:
            self.counters["consumer_save_failed"] += len(failed)
        self._dirty.clear()
        self._deleted.clear()
        answers, self._held_answers = self._held_answers, []
        if not failed:
            return [answer for _, _, answer in answers]
        # Which consumer each held answer reports on is not kept: every held answer fails
        # when any save failed (a disk error is rare, and the client's retry is safe).
        reason = "consumer state could not be saved: " + "; ".join(f"{k[1]}: {e}" for k, e in failed.items())
        return [
            (client.routing_id, client.dialect.error(rid, CONSUMER_SERVICE, Status.STORAGE_FAILED, reason))
            for client, rid, _ in answers
        ]

    # ------------------------------------------------------------ requests
    def handle(
        self, client: Peer, rid: str, user: dict[str, str], body: Sequence[bytes], deadline: float, now: float
    ) -> list[Out]:
        """One ``mc0.consumer`` request: an answer now, a held answer, or a waiting pull."""
        text = b"".join(bytes(b) for b in body).decode("utf-8", "replace").strip()
        query = P.json_body(text, rid)
        if not isinstance(query, dict):
            raise ProtocolError(Status.BAD_REQUEST, "body must be a JSON object", rid)
        op = query.get("op")
        if op == "list":
            names = sorted(f"{j}/{n}" for j, n in self.consumers)
            return [self._final(client, rid, user, names)]
        if op == "create":
            return self._create(client, rid, user, query, now)
        consumer = self._find(query, rid)
        self._check_grants(client, consumer, rid)
        if op == "info":
            return [self._final(client, rid, user, self.info(consumer))]
        if op == "pull":
            return self._pull(client, rid, user, consumer, query, deadline, now)
        if op in ("ack", "nak", "term"):
            return self._settle(client, rid, user, consumer, op, query, now)
        if op == "delete":
            key = (consumer.config.journal, consumer.config.name)
            del self.consumers[key]
            self._dirty.discard(key)
            self._deleted.add(key)
            for waiting in consumer.waiting:
                self._answer_pull(consumer, waiting, [], now)
            self._held_answers.append((client, rid, self._final(client, rid, user, {"deleted": consumer.config.name})))
            return []
        ops = "create, pull, ack, nak, term, info, delete, list"
        raise ProtocolError(Status.BAD_REQUEST, f"unknown op {str(op)[:40]!r}; ops: {ops}", rid)

    def _final(self, client: Peer, rid: str, user: dict[str, str], data: object) -> Out:
        body = json.dumps(data, sort_keys=True).encode()
        return (client.routing_id, client.dialect.final(rid, CONSUMER_SERVICE, {}, user, [body]))

    def _find(self, query: dict[str, Any], rid: str) -> Consumer:
        key = (str(query.get("journal", "")), str(query.get("name", "")))
        consumer = self.consumers.get(key)
        if consumer is None:
            raise ProtocolError(Status.NOT_FOUND, f"no consumer {key[1][:64]!r} on journal {key[0][:64]!r}", rid)
        return consumer

    @staticmethod
    def _check_grants(client: Peer, consumer: Consumer, rid: str) -> None:
        for pattern, tokens in zip(consumer.config.topics, consumer.patterns, strict=True):
            if not client.grants.may_subscribe(tokens):
                raise ProtocolError(Status.FORBIDDEN, f"{client.identity} may not subscribe to {pattern}", rid)

    def _create(self, client: Peer, rid: str, user: dict[str, str], query: dict[str, Any], now: float) -> list[Out]:
        journal = self.journals.get(str(query.get("journal", "")))
        if journal is None:
            known = ", ".join(self.journals) or "none configured"
            raise ProtocolError(Status.NOT_FOUND, f"unknown journal {str(query.get('journal'))[:40]!r} ({known})", rid)
        if journal.settings.mailboxes:
            reason = f"journal {journal.name} keeps mailboxes: its letters are private"
            raise ProtocolError(Status.FORBIDDEN, reason, rid)
        name = query.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ProtocolError(Status.BAD_REQUEST, "name must be 1-64 letters, digits, '-' or '_'", rid)
        topics = query.get("topics", [">"])
        if isinstance(topics, str):
            topics = [topics]
        if not isinstance(topics, list) or not topics or not all(isinstance(t, str) for t in topics):
            raise ProtocolError(Status.BAD_REQUEST, "topics must be a non-empty list of patterns", rid)
        try:
            patterns = tuple(split_pattern(t) for t in topics)
        except InvalidTopic as exc:
            raise ProtocolError(Status.BAD_REQUEST, str(exc), rid) from None
        deliver = query.get("deliver", "all")
        if deliver not in ("all", "new"):
            raise ProtocolError(Status.BAD_REQUEST, "deliver must be 'all' or 'new'", rid)
        config = ConsumerConfig(
            journal.name,
            name,
            tuple(topics),
            _int(query, "ack_wait_ms", 30_000, 1, 86_400_000, rid),
            _int(query, "max_deliver", 5, 1, 1_000_000, rid),
            _int(query, "max_ack_pending", 1_000, 1, 100_000, rid),
            deliver,
        )
        consumer = Consumer(config, journal, patterns, journal.first_seq if deliver == "all" else journal.next_seq)
        self._check_grants(client, consumer, rid)
        existing = self.consumers.get((journal.name, name))
        if existing is not None:
            if existing.config != config:
                raise ProtocolError(Status.CONFLICT, f"consumer {name} exists with another config", rid)
            return [self._final(client, rid, user, self.info(existing))]
        if len(self.consumers) >= MAX_CONSUMERS:
            raise ProtocolError(Status.OVER_LIMIT, f"{len(self.consumers)} consumers, the limit", rid)
        self.consumers[journal.name, name] = consumer
        self._dirty.add((journal.name, name))
        self.counters["consumers_created"] += 1
        self._held_answers.append((client, rid, self._final(client, rid, user, self.info(consumer))))
        return []

    def _settle(
        self,
        client: Peer,
        rid: str,
        user: dict[str, str],
        consumer: Consumer,
        op: str,
        query: dict[str, Any],
        now: float,
    ) -> list[Out]:
        seqs = query.get("seqs")
        if (
            not isinstance(seqs, list)
            or len(seqs) > MAX_ACKS
            or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in seqs)
        ):
            raise ProtocolError(Status.BAD_REQUEST, f"seqs must be a list of at most {MAX_ACKS} positive integers", rid)
        delay = _int(query, "delay_ms", 0, 0, 86_400_000, rid) / 1000.0 if op == "nak" else 0.0
        event = {"ack": Event.ACK, "nak": Event.NAK, "term": Event.TERM}[op]
        done = ignored = 0
        for seq in seqs:
            held = consumer.held.get(seq)
            nxt = delivery_transition(held.state, event) if held is not None else None
            if held is None or nxt is None:
                ignored += 1
                continue
            done += 1
            if nxt is Delivery.SETTLED:
                self._settle_seq(consumer, seq)
                consumer.stats["acked" if op == "ack" else "termed"] += 1
            else:
                held.state, held.due = nxt, now + delay
                heapq.heappush(consumer.timers, (held.due, seq))
                consumer.stats["naked"] += 1
        if done:
            self._dirty.add((consumer.config.journal, consumer.config.name))
        answer = self._final(client, rid, user, {op: done, "ignored": ignored})
        if done:
            self._held_answers.append((client, rid, answer))  # released once the new state is saved
            return self._serve_waiting(consumer, now) if op == "nak" and not delay else []
        return [answer]

    @staticmethod
    def _settle_seq(consumer: Consumer, seq: int) -> None:
        del consumer.held[seq]  # below the cursor and not held: settled

    # ------------------------------------------------------------ pulls
    def _pull(
        self,
        client: Peer,
        rid: str,
        user: dict[str, str],
        consumer: Consumer,
        query: dict[str, Any],
        deadline: float,
        now: float,
    ) -> list[Out]:
        count = _int(query, "max", 100, 1, MAX_PULL, rid)
        wait_ms = _int(query, "wait_ms", 0, 0, self._max_wait_ms, rid)
        taken = self._take(consumer, count, now)
        if taken or not wait_ms:
            return [self._page(client, rid, user, consumer, taken)]
        if len(consumer.waiting) >= MAX_WAITING_PULLS:
            raise ProtocolError(Status.OVER_LIMIT, f"{len(consumer.waiting)} pulls waiting, the limit", rid)
        consumer.waiting.append(Waiting(client, rid, user, count, min(deadline, now + wait_ms / 1000.0)))
        return []

    def _take(self, consumer: Consumer, count: int, now: float) -> list[tuple[Record, int]]:
        """Up to ``count`` messages: due redeliveries first (oldest seq first), then new records."""
        taken: list[tuple[Record, int]] = []
        self._expire(consumer, now)
        due = sorted(seq for seq, h in consumer.held.items() if h.state is Delivery.DUE and h.due <= now)
        for seq in due:
            if len(taken) >= count:
                break
            record = self._read_one(consumer, seq)
            held = consumer.held[seq]
            if record is None:  # trimmed by retention meanwhile: nothing left to deliver
                self._settle_seq(consumer, seq)
                consumer.stats["lost_to_retention"] += 1
                continue
            held.state, held.deliveries, held.due = Delivery.PENDING, held.deliveries + 1, now + self._wait(consumer)
            heapq.heappush(consumer.timers, (held.due, seq))
            consumer.stats["redelivered"] += 1
            taken.append((record, held.deliveries))
        room = min(count - len(taken), consumer.config.max_ack_pending - self._pending_count(consumer))
        journal = consumer.journal
        while room > 0 and consumer.cursor < journal.next_seq:
            try:
                records, next_seq = journal.read(consumer.cursor, None, self._match(consumer), max_records=room)
            except Trimmed as exc:
                consumer.stats["lost_to_retention"] += exc.first - consumer.cursor
                consumer.cursor = exc.first
                continue
            consumer.cursor = next_seq
            for record in records:
                due_at = now + self._wait(consumer)
                consumer.held[record.seq] = Held(Delivery.PENDING, 1, due_at)
                heapq.heappush(consumer.timers, (due_at, record.seq))
                taken.append((record, 1))
            consumer.stats["delivered"] += len(records)
            room -= len(records)
            if not records:
                break
        if taken:
            self._dirty.add((consumer.config.journal, consumer.config.name))
        return taken

    @staticmethod
    def _wait(consumer: Consumer) -> float:
        return consumer.config.ack_wait_ms / 1000.0

    @staticmethod
    def _pending_count(consumer: Consumer) -> int:
        return sum(1 for h in consumer.held.values() if h.state is Delivery.PENDING)

    def _match(self, consumer: Consumer) -> Callable[[str], bool]:
        tokens_of = self._tokens_of
        return lambda topic: consumer.matches(tokens_of(topic))

    @staticmethod
    def _read_one(consumer: Consumer, seq: int) -> Record | None:
        try:
            records, _ = consumer.journal.read(seq, seq + 1)
        except (Trimmed, OSError):
            return None
        return records[0] if records else None

    def _expire(self, consumer: Consumer, now: float) -> None:
        """Move what the clock made due: PENDING past ack_wait -> DUE; DUE with max_deliver
        deliveries -> dead-lettered and settled."""
        timers = consumer.timers
        while timers and timers[0][0] <= now:
            due, seq = heapq.heappop(timers)
            held = consumer.held.get(seq)
            if held is None or held.due != due:
                continue  # settled, or re-timed since
            if held.state is Delivery.PENDING:
                held.state = delivery_transition(held.state, Event.ACK_WAIT) or held.state
                consumer.stats["ack_wait_expired"] += 1
            if held.state is Delivery.DUE and held.deliveries >= consumer.config.max_deliver:
                record = self._read_one(consumer, seq)
                config = consumer.config
                if record is not None:
                    topic = f"{DEAD_LETTER_PREFIX}{config.journal}.{config.name}"
                    reason = f"not acknowledged after {held.deliveries} deliveries (max_deliver {config.max_deliver})"
                    self.dead_letters.append((topic, record, reason, held.deliveries))
                self._settle_seq(consumer, seq)
                consumer.stats["dead_lettered"] += 1
                self._dirty.add((config.journal, config.name))

    def _page(
        self, client: Peer, rid: str, user: dict[str, str], consumer: Consumer, taken: list[tuple[Record, int]]
    ) -> Out:
        """One FINAL: the records as a journal page, then a JSON list of each one's delivery count."""
        records = [r for r, _ in taken]
        frames = [*P.journal_page(records), json.dumps([d for _, d in taken]).encode()]
        self.counters["consumer_delivered"] += len(records)
        return (client.routing_id, client.dialect.final(rid, CONSUMER_SERVICE, {}, user, frames))

    def _answer_pull(self, consumer: Consumer, waiting: Waiting, taken: list[tuple[Record, int]], now: float) -> Out:
        waiting.peer.last_sent = now
        return self._page(waiting.peer, waiting.rid, waiting.user, consumer, taken)

    def _serve_waiting(self, consumer: Consumer, now: float) -> list[Out]:
        out: list[Out] = []
        still: list[Waiting] = []
        for waiting in consumer.waiting:
            if not self._is_current(waiting.peer):
                continue
            taken = self._take(consumer, waiting.max, now)
            if taken or waiting.until <= now:
                out.append(self._answer_pull(consumer, waiting, taken, now))
            else:
                still.append(waiting)
        consumer.waiting = still
        return out

    def cancel(self, peer: Peer, rid: str) -> bool:
        for consumer in self.consumers.values():
            for waiting in consumer.waiting:
                if waiting.peer is peer and waiting.rid == rid:
                    consumer.waiting.remove(waiting)
                    return True
        return False

    def waiting_for(self, peer: Peer, rid: str) -> bool:
        return any(w.peer is peer and w.rid == rid for c in self.consumers.values() for w in c.waiting)

    # ------------------------------------------------------------ time
    def has_work(self) -> bool:
        """A waiting pull could be answered now (new records, room under max_ack_pending)."""
        for consumer in self.consumers.values():
            if consumer.waiting and consumer.cursor < consumer.journal.next_seq:
                if self._pending_count(consumer) < consumer.config.max_ack_pending:
                    return True
        return False

    def next_deadline(self, earliest: float) -> float:
        for consumer in self.consumers.values():
            if consumer.timers:
                earliest = min(earliest, consumer.timers[0][0])
            for waiting in consumer.waiting:
                earliest = min(earliest, waiting.until)
        return earliest

    def tick(self, now: float) -> list[Out]:
        """Expire timers (dead letters collect in ``dead_letters``) and answer waiting pulls that can be."""
        out: list[Out] = []
        for consumer in self.consumers.values():
            self._expire(consumer, now)
            if consumer.waiting:
                out += self._serve_waiting(consumer, now)
        return out

    def drop_peer(self, peer: Peer) -> None:
        """Its waiting pulls go; what it was delivered stays PENDING until ack_wait (then others get it)."""
        for consumer in self.consumers.values():
            if consumer.waiting:
                consumer.waiting = [w for w in consumer.waiting if w.peer is not peer]

    # ------------------------------------------------------------ reports
    def info(self, consumer: Consumer) -> dict[str, object]:
        pending = self._pending_count(consumer)
        return {
            "config": asdict(consumer.config),
            "ack_floor": consumer.ack_floor,
            "cursor": consumer.cursor,
            "pending": pending,
            "due": len(consumer.held) - pending,
            "waiting_pulls": len(consumer.waiting),
            # Records after the cursor not yet looked at (an upper bound: the topic filter is not applied).
            "lag": max(0, consumer.journal.next_seq - consumer.cursor),
            **{k: consumer.stats[k] for k in ("delivered", "redelivered", "acked", "naked", "termed", "dead_lettered")},
        }

    def report(self) -> dict[str, object]:
        return {f"{j}/{n}": self.info(c) for (j, n), c in sorted(self.consumers.items())}
