"""LocalConsumers: durable consumers this broker keeps, on its own journals (with acks).

Contract: owns every durable consumer of a journal whose consumers are this
broker's (not JetStream's): its config, its ack floor, what it delivered and
is waiting to hear about, and the pulls waiting for messages.  It is one
:class:`~mc0.broker.core.consumers.ConsumerBackend`: the front
(:class:`~mc0.broker.core.consumers.Consumers`) hands it the ``mc0.consumer``
requests on those journals (``create``, ``handle``, ``list_with``), any
journal no other backend keeps (an unknown one is refused here), and an op
no backend knows.  A request is validated whole before it changes anything
(400/403/404/409 as ``ProtocolError``; its op and arguments parsed by
:mod:`mc0.protocol.consumerrequests`, the grants checked between the two).
Each delivered message is in one :class:`HeldState` state, moved only by
``held_transition`` (one table, tested as one): ``ack``/``term`` settle it, ``nak`` makes it due again (after a delay),
``ack_wait`` passing makes it due, and a due message that already had
``max_deliver`` deliveries is dead-lettered (published on
``mc0.sys.dead.<journal>.<consumer>`` with the reason) and settled.

Persistence goes through the :class:`~mc0.broker.storage.port.JournalStore` port: a
changed consumer is saved at the core's ``commit`` (whole, or only the seqs acked and
termed since: ``consumerstate.save``), and the answers to ack/nak/term/create/delete are
held until it is, so an acknowledged ack survives kill -9.  What a restart loses is only
*who* holds a delivery: messages delivered and not settled are due again at once, with
their delivery counts.  The journals are read through a narrow protocol
(``JournalShelf``: the journaling room); dead letters found are handed over by
``take_dead_letters``.  Pure: no sockets, no clock.
"""

from __future__ import annotations

import heapq
import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, Protocol

from ... import protocol as P
from ...errors import InvalidTopic, ProtocolError, quoted
from ...message import Record
from ...permissions import Grants
from ...protocol import CONSUMER_SERVICE, Status
from ...protocol.consumerrequests import (
    ConsumerInfo,
    ConsumerPull,
    ConsumerSettle,
    consumer_op,
    consumer_request,
    consumer_target,
    parse_config,
)
from ...topics import split_topic
from ..storage.port import JournalStore, StateUnreadable, Trimmed, storage_fault
from .access import is_dead_letter, origin_allowed
from .consumerstate import (
    Consumer,
    DeadLetter,
    Event,
    Held,
    HeldState,
    Waiting,
    consumer_of,
    held_transition,
    save,
    settled_body,
)
from .peers import Out, Peer

log = logging.getLogger("mc0.broker")

MAX_CONSUMERS = 1_000  # per broker (the default of [broker] max_consumers)
MAX_CONSUMERS_PER_IDENTITY = 100  # the default of [broker] max_consumers_per_identity
MAX_WAITING_PULLS = 512  # held pulls per consumer (429 beyond)
# Records a pull looks at past what its topics skip (its cost in a loop turn: a held pull goes on
# at the next turn), read PULL_SCAN_STEP at a time at least.
PULL_SCAN_RECORDS = 20_000
PULL_SCAN_STEP = 1_000
DEAD_LETTER_PREFIX = P.SYS_DEAD_PREFIX
_SERVICE_TOKENS = split_topic(CONSUMER_SERVICE)


class JournalShelf(Protocol):
    """The journals by name, as the consumers read them (the journaling room: ``Journaling``)."""

    def journal(self, name: str) -> JournalStore | None: ...

    def journal_names(self) -> list[str]: ...

    def every_journal(self) -> list[JournalStore]: ...


class LocalConsumers:
    def __init__(
        self,
        journals: JournalShelf,
        counters: Counter[str],
        *,
        tokens_of: Callable[[str], tuple[str, ...] | None],
        is_current: Callable[[Peer], bool],
        max_wait_ms: int,
        max_consumers: int = MAX_CONSUMERS,
        max_per_identity: int = MAX_CONSUMERS_PER_IDENTITY,
    ) -> None:
        """Restores the consumers saved in every journal of ``journals`` (``max_wait_ms``: a pull's
        longest wait; ``max_consumers``, ``max_per_identity``: the quotas at creation)."""
        self._journals = journals
        self.counters = counters
        self._tokens_of = tokens_of
        self._is_current = is_current
        self._max_wait_ms = max_wait_ms
        self.max_consumers = max_consumers
        self.max_per_identity = max_per_identity
        self.consumers: dict[tuple[str, str], Consumer] = {}
        # The consumers that may have timers or waiting pulls: every consumer an op reached (or restored
        # with held messages), until a walk over these finds it with neither.  The loop's per-turn
        # questions (has_work, next_deadline, tick) walk these, never every consumer: 10,000 idle
        # consumers cost a turn nothing.
        self._busy: dict[tuple[str, str], Consumer] = {}
        self._owned: Counter[str] = Counter()  # consumers per owner identity (the quota)
        self._dirty: set[tuple[str, str]] = set()  # to save whole
        self._settled: set[tuple[str, str]] = set()  # only acked or termed since the last save
        self._deleted: set[tuple[str, str]] = set()
        # Answers released once the state they report is saved: (who asked, its request id, the answer).
        self._held_answers: list[tuple[Peer, str, Out]] = []
        # Dead letters not yet taken (take_dead_letters): (topic, record, reason, deliveries).
        self._dead_letters: list[DeadLetter] = []
        for journal in journals.every_journal():
            changes = journal.load_consumer_changes()
            for name, raw in journal.load_consumers().items():
                self._restore(journal, name, raw, changes.get(name, ()))

    def keeps(self, journal: JournalStore) -> bool:
        """Any journal: this broker keeps the consumers of every journal no other backend keeps
        (the front asks it last)."""
        return True

    def take_dead_letters(self) -> list[DeadLetter]:
        """The dead letters found since the last call, handed over (oldest first: ``(topic, record,
        reason, deliveries)``); the room starts a new list."""
        letters = self._dead_letters
        if letters:
            self._dead_letters = []
        return letters

    # ------------------------------------------------------------ persistence
    def _journal(self, name: str) -> JournalStore:
        """The journal a consumer was kept in (always one configured: consumers are only of those)."""
        journal = self._journals.journal(name)
        if journal is None:
            raise KeyError(name)
        return journal

    def _restore(self, journal: JournalStore, name: str, raw: bytes, changes: Sequence[bytes]) -> None:
        """A saved consumer back (over today's quotas too: they bound creation, never drop state)."""
        try:
            consumer = consumer_of(journal, raw, changes)
        except (ValueError, KeyError, TypeError, InvalidTopic) as exc:
            self.counters["consumer_state_unreadable"] += 1
            raise StateUnreadable(
                f"journal {journal.name}: consumer {name}: unreadable saved state ({exc}); "
                "move its files (NAME.log, NAME.json) out of the journal's consumers/ folder "
                "to start without it"
            ) from None
        self.consumers[journal.name, name] = consumer
        self._owned[consumer.owner] += 1
        if consumer.timers:
            self._busy[consumer.key] = consumer

    @property
    def uncommitted(self) -> bool:
        return bool(self._dirty or self._settled or self._deleted or self._held_answers)

    def commit(self) -> list[Out]:
        """Save what changed (through the port); the answers now due (507 for a consumer that
        could not save)."""
        failed: dict[tuple[str, str], OSError] = {}
        for key in self._deleted:
            try:
                self._journal(key[0]).save_consumer(key[1], None)
            except OSError as exc:
                failed[key] = exc
        for key in self._dirty | self._settled:
            consumer = self.consumers.get(key)
            if consumer is not None:
                try:
                    save(consumer, key in self._dirty)
                except OSError as exc:
                    failed[key] = exc
        if failed:
            self.counters["consumer_save_failed"] += len(failed)

        self._dirty.clear()
        self._settled.clear()
        self._deleted.clear()
        answers, self._held_answers = self._held_answers, []
        if not failed:
            return [answer for _, _, answer in answers]
        # Which consumer each held answer reports on is not kept: every held answer fails
        # when any save failed (a disk error is rare, and the client's retry is safe).
        for (journal, name), fault in failed.items():  # (the file is named here, never on the wire)
            log.error("journal %s: consumer %s: state not saved: %s", journal, name, fault)
        reason = "consumer state could not be saved: " + "; ".join(
            f"{k[1]}: {storage_fault(e)}" for k, e in failed.items()
        )
        return [
            (client.routing_id, client.dialect.error(rid, CONSUMER_SERVICE, Status.STORAGE_FAILED, reason))
            for client, rid, _ in answers
        ]

    # ------------------------------------------------------------ requests
    def owned_by(self, identity: str) -> list[str]:
        """``journal/name`` of each consumer ``identity`` owns here, sorted."""
        return sorted(f"{j}/{n}" for (j, n), c in self.consumers.items() if c.owner == identity)

    def list_with(self, client: Peer, rid: str, user: dict[str, str], names: list[str]) -> list[Out]:
        """``list``: ``names`` (the caller's at another backend) and the caller's own here, answered now."""
        return [self._final(client, rid, user, sorted(names + self.owned_by(client.identity)))]

    def handle(
        self, client: Peer, rid: str, user: dict[str, str], query: dict[str, Any], deadline: float, now: float
    ) -> list[Out]:
        """Any op but ``create`` and ``list`` on one consumer (``query``: the request's JSON object): an
        answer now, a held answer, or a waiting pull.  Checked in this order, as it always was: the
        consumer (404), its owner (403), the op (400), then (but for a delete) the caller's grants (403),
        then the op's arguments (400)."""
        consumer = self._find(query, rid)
        self._check_owner(client, consumer, rid)
        known_op = consumer_op(query, rid)
        if known_op == "delete":  # its owner may always delete it (and free its quota)
            return self._delete(client, rid, user, consumer, now)
        self._check_grants(client, consumer, rid)  # (before the arguments are read, as it always was)
        request = consumer_request(known_op, query, rid, max_wait_ms=self._max_wait_ms)

        if isinstance(request, ConsumerInfo):
            self._claim(client, consumer)
            return [self._final(client, rid, user, self.info(consumer))]
        if isinstance(request, ConsumerPull):
            out = self._pull(client, rid, user, consumer, request, deadline, now)
        elif isinstance(request, ConsumerSettle):
            out = self._settle(client, rid, user, consumer, request, now)
        else:  # (a delete was answered above)
            raise AssertionError(request)
        self._claim(client, consumer)  # once the request was valid: a bad one changes nothing
        return out

    def _delete(
        self,
        client: Peer,
        rid: str,
        user: dict[str, str],
        consumer: Consumer,
        now: float,
    ) -> list[Out]:
        self._drop(consumer)
        for waiting in consumer.waiting:
            self._answer_pull(consumer, waiting, [], now)
        answer = self._final(client, rid, user, {"deleted": consumer.config.name})
        self._held_answers.append((client, rid, answer))
        return []

    def _drop(self, consumer: Consumer) -> None:
        """The consumer goes (its state removed at the next commit) and frees its owner's quota."""
        key = consumer.key
        del self.consumers[key]
        self._busy.pop(key, None)
        self._owned[consumer.owner] -= 1
        if not self._owned[consumer.owner]:
            del self._owned[consumer.owner]
        self._dirty.discard(key)
        self._settled.discard(key)
        self._deleted.add(key)

    def remove(self, journal: str, name: str, reason: str) -> list[Out] | None:
        """An operator removes the consumer, whoever owns it (``mc0.admin consumer.rm``): its state
        goes at the next commit, each waiting pull is answered 404 with ``reason``.  None: no such
        consumer."""
        consumer = self.consumers.get((journal, name))
        if consumer is None:
            return None
        self._drop(consumer)
        self.counters["consumers_removed"] += 1
        gone = f"consumer {name} on journal {journal} {reason}"
        return [
            (w.peer.routing_id, w.peer.dialect.error(w.rid, CONSUMER_SERVICE, Status.NOT_FOUND, gone))
            for w in consumer.waiting
            if self._is_current(w.peer)
        ]

    def _final(self, client: Peer, rid: str, user: dict[str, str], data: object) -> Out:
        body = json.dumps(data, sort_keys=True).encode()
        return (client.routing_id, client.dialect.final(rid, CONSUMER_SERVICE, {}, user, [body]))

    def _find(self, query: dict[str, Any], rid: str) -> Consumer:
        key = consumer_target(query)
        consumer = self.consumers.get(key)
        if consumer is None:
            reason = f"no consumer {quoted(key[1], 64)} on journal {quoted(key[0], 64)}"
            raise ProtocolError(Status.NOT_FOUND, reason, rid)
        self._busy[key] = consumer  # (an op may give it timers or a waiting pull)
        return consumer

    @staticmethod
    def _check_owner(client: Peer, consumer: Consumer, rid: str) -> None:
        """A consumer is its owner's: what it delivers passes the owner's grants, so another
        identity (with other deny lists) never shares it."""
        if consumer.owner and consumer.owner != client.identity:
            config = consumer.config
            reason = f"consumer {config.name} on journal {config.journal} belongs to another identity"
            raise ProtocolError(Status.FORBIDDEN, reason, rid)

    def _claim(self, client: Peer, consumer: Consumer) -> None:
        """A consumer saved before owners were kept becomes the first allowed user's."""
        if not consumer.owner:
            journal, name = consumer.key
            log.warning(
                "consumer %s/%s (saved without an owner) claimed by %s",
                journal,
                name,
                client.identity,
            )
            self._owned[""] -= 1
            if not self._owned[""]:
                del self._owned[""]
            consumer.owner = client.identity
            self._owned[client.identity] += 1
            self._dirty.add(consumer.key)

    @staticmethod
    def _refusal(peer: Peer, consumer: Consumer) -> str | None:
        """Why ``peer``'s grants no longer allow it to use ``consumer`` (None: they do)."""
        if not peer.grants.may_call(_SERVICE_TOKENS):
            return f"{peer.identity} may not call {CONSUMER_SERVICE}"
        for pattern, tokens in zip(consumer.config.topics, consumer.patterns, strict=True):
            if not peer.grants.may_subscribe(tokens):
                return f"{peer.identity} may not subscribe to {pattern}"
        return None

    @classmethod
    def _check_grants(cls, client: Peer, consumer: Consumer, rid: str) -> None:
        """Like a SUB: each pattern must be allowed and not wholly denied; a pattern that only
        overlaps a deny is accepted, and what the deny covers is filtered at delivery."""
        reason = cls._refusal(client, consumer)
        if reason is not None:
            raise ProtocolError(Status.FORBIDDEN, reason, rid)

    def create(
        self,
        client: Peer,
        rid: str,
        user: dict[str, str],
        query: dict[str, Any],
        now: float,
    ) -> list[Out]:
        """``create``: the consumer made (its answer held until it is saved), or, made already with
        the same config, its info now; refused whole otherwise (404 no journal, 403 a journal of
        mailboxes or grants, 409 another config, 429 a quota)."""
        journal = self._journals.journal(str(query.get("journal", "")))
        if journal is None:
            known = ", ".join(self._journals.journal_names()) or "none configured"
            reason = f"unknown journal {quoted(str(query.get('journal')))} ({known})"
            raise ProtocolError(Status.NOT_FOUND, reason, rid)
        if journal.settings.mailboxes:
            reason = f"journal {journal.name} keeps mailboxes: its letters are private"
            raise ProtocolError(Status.FORBIDDEN, reason, rid)
        config, patterns = parse_config(journal.name, query, rid)
        cursor = journal.first_seq if config.deliver == "all" else journal.next_seq
        consumer = Consumer(config, journal, patterns, cursor, client.identity)
        self._check_grants(client, consumer, rid)
        existing = self.consumers.get(consumer.key)
        if existing is not None:
            self._check_owner(client, existing, rid)
            if existing.config != config:
                reason = f"consumer {config.name} exists with another config"
                raise ProtocolError(Status.CONFLICT, reason, rid)
            self._claim(client, existing)
            return [self._final(client, rid, user, self.info(existing))]
        mine = self._owned[client.identity]
        if mine >= self.max_per_identity:
            reason = (
                f"{client.identity} has {mine} consumers, the limit per identity "
                f"(max_consumers_per_identity {self.max_per_identity})"
            )
            raise ProtocolError(Status.OVER_LIMIT, reason, rid)
        if len(self.consumers) >= self.max_consumers:
            limit = self.max_consumers
            reason = f"{len(self.consumers)} consumers, the broker's limit (max_consumers {limit})"
            raise ProtocolError(Status.OVER_LIMIT, reason, rid)
        self.consumers[consumer.key] = consumer
        self._owned[client.identity] += 1
        self._dirty.add(consumer.key)
        self.counters["consumers_created"] += 1
        self._held_answers.append((client, rid, self._final(client, rid, user, self.info(consumer))))
        return []

    def _settle(
        self,
        client: Peer,
        rid: str,
        user: dict[str, str],
        consumer: Consumer,
        request: ConsumerSettle,
        now: float,
    ) -> list[Out]:
        op = request.how
        delay = request.delay_ms / 1000.0
        event = {"ack": Event.ACK, "nak": Event.NAK, "term": Event.TERM}[op]
        done = ignored = 0
        for seq in request.seqs:
            held = consumer.held.get(seq)
            nxt = held_transition(held.state, event) if held is not None else None
            if held is None or nxt is None:
                ignored += 1
                continue
            done += 1
            if nxt is HeldState.SETTLED:
                self._settle_seq(consumer, seq)
                consumer.settled_unsaved.append(seq)
                consumer.stats["acked" if op == "ack" else "termed"] += 1
            else:
                held.state, held.due = nxt, now + delay
                heapq.heappush(consumer.timers, (held.due, seq))
                consumer.stats["naked"] += 1
        if done and op != "nak":  # a nak changes nothing saved (a restart makes every held message due)
            self._settled.add(consumer.key)
        body = settled_body(op, done, ignored)
        answer = (client.routing_id, client.dialect.final(rid, CONSUMER_SERVICE, {}, user, [body]))
        if done:
            self._held_answers.append((client, rid, answer))  # released once the new state is saved
            return self._serve_waiting(consumer, now) if op == "nak" and not delay else []
        return [answer]

    @staticmethod
    def _settle_seq(consumer: Consumer, seq: int) -> None:
        del consumer.held[seq]  # below the cursor and not held: settled

    def purged(self, journal: str, now: float) -> list[Out]:
        """``journal`` was purged: each of its consumers settles at once what it held before the new first
        seq (handed and not acked: nothing is left to deliver, ``num_ack_pending`` drops now, not at its
        next pull; saved at the commit) and moves its cursor there; a waiting pull is served from there.
        Walks the consumers once (an operator's action, not a turn's)."""
        out: list[Out] = []
        for (of, _), consumer in list(self.consumers.items()):
            if of != journal:
                continue
            first = consumer.journal.first_seq
            gone = [seq for seq in consumer.held if seq < first]
            for seq in gone:
                self._settle_seq(consumer, seq)
                consumer.settled_unsaved.append(seq)
            consumer.stats["purged"] += len(gone)
            if gone:
                self._settled.add(consumer.key)
            if consumer.cursor < first:
                consumer.cursor = first
                self._dirty.add(consumer.key)
            out += self._serve_waiting(consumer, now)
        return out

    # ------------------------------------------------------------ pulls
    def _pull(
        self,
        client: Peer,
        rid: str,
        user: dict[str, str],
        consumer: Consumer,
        request: ConsumerPull,
        deadline: float,
        now: float,
    ) -> list[Out]:
        count, wait_ms = request.batch, request.wait_ms
        taken = self._take(consumer, count, now, client.grants)
        # A pull that took nothing within its scan (a filtered consumer far behind its journal's end)
        # is held, even one that does not wait: it goes on looking at the next turns, answered once it
        # took something or looked at everything (``_serve_waiting``), so [] always means "none came".
        if taken or not (wait_ms or self._more_to_look_at(consumer)):
            return [self._page(client, rid, user, consumer, taken)]
        if len(consumer.waiting) >= MAX_WAITING_PULLS:
            raise ProtocolError(Status.OVER_LIMIT, f"{len(consumer.waiting)} pulls waiting, the limit", rid)
        consumer.waiting.append(Waiting(client, rid, user, count, min(deadline, now + wait_ms / 1000.0)))
        return []

    def _more_to_look_at(self, consumer: Consumer) -> bool:
        """Records past its cursor a pull did not look at yet, and room to hand them over."""
        return (
            consumer.cursor < consumer.journal.next_seq
            and self._pending_count(consumer) < consumer.config.max_ack_pending
        )

    def _take(self, consumer: Consumer, count: int, now: float, grants: Grants) -> list[tuple[Record, int]]:
        """Up to ``count`` messages: due redeliveries first (oldest seq first), then new records.

        ``grants`` are the owner's, as they are now: a record they may not be handed (a deny
        list, a grant withdrawn since it was first delivered) is settled unsent and counted
        ``filtered``, as a SUB's delivery filter drops it."""
        taken: list[tuple[Record, int]] = []
        self._expire(consumer, now)
        due = sorted(seq for seq, h in consumer.held.items() if h.state is HeldState.DUE and h.due <= now)
        for seq in due:
            if len(taken) >= count:
                break
            record = self._read_one(consumer, seq)
            held = consumer.held[seq]
            if record is None:  # trimmed by retention meanwhile: nothing left to deliver
                self._settle_seq(consumer, seq)
                consumer.stats["lost_to_retention"] += 1
                continue
            if not self._readable(grants, record):
                self._settle_seq(consumer, seq)
                consumer.stats["filtered"] += 1
                self._dirty.add(consumer.key)
                continue
            held.state = HeldState.PENDING
            held.deliveries += 1
            held.due = now + self._wait(consumer)
            heapq.heappush(consumer.timers, (held.due, seq))
            consumer.stats["redelivered"] += 1
            taken.append((record, held.deliveries))
        room = min(count - len(taken), consumer.config.max_ack_pending - self._pending_count(consumer))
        journal = consumer.journal
        scan = PULL_SCAN_RECORDS
        most = room  # the first read: as many as it may take (every record read is decoded)
        while room > 0 and scan > 0 and consumer.cursor < journal.next_seq:
            try:
                match = self._match(consumer, grants)
                # Scans past records its topics skip (a filtered consumer's page is still full), in
                # bigger steps once a read found fewer than it could take (the filter skips many);
                # takes at most ``room``: the cursor stops after the last record taken.
                records, next_seq = journal.read(consumer.cursor, None, match, max_records=min(scan, most))
            except Trimmed as exc:
                consumer.stats["lost_to_retention"] += exc.first - consumer.cursor
                consumer.cursor = exc.first
                continue
            if len(records) > room:
                records = records[:room]
                next_seq = records[-1].seq + 1
            most = max(room - len(records), PULL_SCAN_STEP)
            scan -= max(1, next_seq - consumer.cursor)
            consumer.cursor = next_seq
            if any(r.topic.startswith(DEAD_LETTER_PREFIX) for r in records):  # and the topic it died on

                def kept_for(record: Record) -> bool:
                    return not is_dead_letter(split_topic(record.topic)) or self._readable(grants, record)

                kept = [r for r in records if kept_for(r)]
                consumer.stats["filtered"] += len(records) - len(kept)
                records = kept
            for record in records:
                due_at = now + self._wait(consumer)
                consumer.held[record.seq] = Held(HeldState.PENDING, 1, due_at)
                heapq.heappush(consumer.timers, (due_at, record.seq))
                taken.append((record, 1))
            consumer.stats["delivered"] += len(records)
            room -= len(records)
        if taken:
            self._dirty.add(consumer.key)
        return taken

    @staticmethod
    def _wait(consumer: Consumer) -> float:
        return consumer.config.ack_wait_ms / 1000.0

    @staticmethod
    def _pending_count(consumer: Consumer) -> int:
        return sum(1 for h in consumer.held.values() if h.state is HeldState.PENDING)

    def _match(self, consumer: Consumer, grants: Grants) -> Callable[[str], bool]:
        """A journal read's filter: the consumer's topics, then the owner's grants (counted when
        they refuse)."""
        tokens_of = self._tokens_of
        # Each topic's verdict, for this read (a page holds few distinct topics): 0 no, 1 yes, 2 refused.
        verdicts: dict[str, int] = {}

        def match(topic: str) -> bool:
            verdict = verdicts.get(topic)
            if verdict is None:
                tokens = tokens_of(topic)
                verdict = 0 if not consumer.matches(tokens) else 1 if grants.may_receive(tokens or ()) else 2
                verdicts[topic] = verdict
            if verdict == 2:
                consumer.stats["filtered"] += 1
            return verdict == 1

        return match

    def _readable(self, grants: Grants, record: Record) -> bool:
        tokens = self._tokens_of(record.topic)
        if tokens is None or not grants.may_receive(tokens):
            return False
        return not is_dead_letter(tokens) or origin_allowed(grants, record.headers)

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
            if held.state is HeldState.PENDING:
                held.state = held_transition(held.state, Event.ACK_WAIT) or held.state
                consumer.stats["ack_wait_expired"] += 1
            if held.state is HeldState.DUE and held.deliveries >= consumer.config.max_deliver:
                record = self._read_one(consumer, seq)
                config = consumer.config
                if record is not None:
                    topic = f"{DEAD_LETTER_PREFIX}{config.journal}.{config.name}"
                    deliveries = held.deliveries
                    most = config.max_deliver
                    reason = f"not acknowledged after {deliveries} deliveries (max_deliver {most})"
                    self._dead_letters.append((topic, record, reason, held.deliveries))
                self._settle_seq(consumer, seq)
                consumer.stats["dead_lettered"] += 1
                self._dirty.add(consumer.key)

    def _page(
        self,
        client: Peer,
        rid: str,
        user: dict[str, str],
        consumer: Consumer,
        taken: list[tuple[Record, int]],
    ) -> Out:
        """One FINAL: the records as a journal page, then a JSON list of each one's delivery count."""
        records = [r for r, _ in taken]
        frames = [*P.journal_page(records), json.dumps([d for _, d in taken]).encode()]
        self.counters["consumer_delivered"] += len(records)
        return (client.routing_id, client.dialect.final(rid, CONSUMER_SERVICE, {}, user, frames))

    def _answer_pull(
        self,
        consumer: Consumer,
        waiting: Waiting,
        taken: list[tuple[Record, int]],
        now: float,
    ) -> Out:
        waiting.peer.last_sent = now
        return self._page(waiting.peer, waiting.rid, waiting.user, consumer, taken)

    def _serve_waiting(self, consumer: Consumer, now: float) -> list[Out]:
        """Each held pull that can be answered: it took something, or its wait is over and nothing
        is left to look at.  One scan budget (PULL_SCAN_RECORDS) per consumer per turn: once a pull
        spent it taking nothing, the others wait for the next turn (``has_work`` asks for it)."""
        out: list[Out] = []
        still: list[Waiting] = []
        looked_enough = False
        for waiting in consumer.waiting:
            if not self._is_current(waiting.peer):
                continue
            if looked_enough:
                still.append(waiting)
                continue
            taken = self._take(consumer, waiting.max, now, waiting.peer.grants)
            more = not taken and self._more_to_look_at(consumer)
            if taken or (waiting.until <= now and not more):
                out.append(self._answer_pull(consumer, waiting, taken, now))
            else:
                still.append(waiting)
            looked_enough = more
        consumer.waiting = still
        return out

    def cancel(self, peer: Peer, rid: str) -> bool:
        """Its waiting pull ``rid`` goes (True: there was one)."""
        for consumer in self._busy.values():
            for waiting in consumer.waiting:
                if waiting.peer is peer and waiting.rid == rid:
                    consumer.waiting.remove(waiting)
                    return True
        return False

    def waiting_for(self, peer: Peer, rid: str) -> bool:
        """``peer``'s pull ``rid`` waits here."""
        return any(w.peer is peer and w.rid == rid for c in self._busy.values() for w in c.waiting)

    # ------------------------------------------------------------ time
    def _still_busy(self) -> list[Consumer]:
        """The consumers with timers or waiting pulls (those found with neither leave ``_busy``):
        what the per-turn walks look at."""
        busy = self._busy
        idle = [key for key, c in busy.items() if not c.timers and not c.waiting]
        for key in idle:
            del busy[key]
        return list(busy.values())

    @property
    def watched(self) -> int:
        """Consumers the per-turn walks look at (those an op reached and not yet found idle)."""
        return len(self._busy)

    def has_work(self) -> bool:
        """A waiting pull could be answered now (new records, room under max_ack_pending)."""
        for consumer in self._busy.values():
            if consumer.waiting and consumer.cursor < consumer.journal.next_seq:
                if self._pending_count(consumer) < consumer.config.max_ack_pending:
                    return True
        return False

    def next_deadline(self, earliest: float) -> float:
        for consumer in self._busy.values():
            if consumer.timers:
                earliest = min(earliest, consumer.timers[0][0])
            for waiting in consumer.waiting:
                earliest = min(earliest, waiting.until)
        return earliest

    def tick(self, now: float) -> list[Out]:
        """Expire timers (dead letters collect for ``take_dead_letters``) and answer waiting pulls that can be."""
        out: list[Out] = []
        for consumer in self._still_busy():
            self._expire(consumer, now)
            if consumer.waiting:
                out += self._serve_waiting(consumer, now)
        return out

    def drop_peer(self, peer: Peer) -> None:
        """Its waiting pulls go; what it was delivered stays PENDING until ack_wait (then others get it)."""
        for consumer in self._busy.values():
            if consumer.waiting:
                consumer.waiting = [w for w in consumer.waiting if w.peer is not peer]

    def withdraw_denied(self) -> list[Out]:
        """A new policy (the peers' grants already recomputed): each waiting pull whose peer may no
        longer use its consumer is answered 403 and dropped.  The consumer stays, with its state;
        its owner's pulls are refused while the policy says so, and resume when it allows again."""
        out: list[Out] = []
        for consumer in list(self._busy.values()):
            if not consumer.waiting:
                continue
            still: list[Waiting] = []
            for waiting in consumer.waiting:
                reason = self._refusal(waiting.peer, consumer)
                if reason is None:
                    still.append(waiting)
                    continue
                self.counters["consumer_pulls_withdrawn"] += 1
                peer, config = waiting.peer, consumer.config
                pull = f"pull from consumer {config.name} on journal {config.journal}"
                reason = f"{pull} withdrawn by policy: {reason}"
                refused = peer.dialect.error(waiting.rid, CONSUMER_SERVICE, Status.FORBIDDEN, reason)
                out.append((peer.routing_id, refused))
            consumer.waiting = still
        return out

    # ------------------------------------------------------------ reports
    def info(self, consumer: Consumer) -> dict[str, object]:
        pending = self._pending_count(consumer)
        return {
            "config": asdict(consumer.config),
            "owner": consumer.owner,
            "ack_floor": consumer.ack_floor,
            "cursor": consumer.cursor,
            "pending": pending,
            "due": len(consumer.held) - pending,
            "waiting_pulls": len(consumer.waiting),
            # Records after the cursor its topics take (an upper bound when they could not be counted).
            "lag": self._pending(consumer)[0],
            **{
                k: consumer.stats[k]
                for k in ("delivered", "redelivered", "acked", "naked", "termed", "dead_lettered", "filtered")
            },
        }

    def report(self) -> dict[str, object]:
        return {f"{j}/{n}": self.info(c) for (j, n), c in sorted(self.consumers.items())}

    def _pending(self, consumer: Consumer) -> tuple[int, bool]:
        """``(records after its cursor its topics take, exact)``: the owner's grants are not
        applied (as JetStream's num_pending: a record they refuse is still pending, then filtered).

        Cost: the first count looks at the whole backlog through the journal's topic index; later
        ones only at what the cursor passed and what was appended since the last (every monitoring
        snapshot asks, for every consumer), and nothing at all when neither moved.  Counted again
        whole after retention or a purge."""
        stored = consumer.journal
        from_seq, end = max(consumer.cursor, stored.first_seq), stored.next_seq
        upper = max(0, end - from_seq)
        if consumer.config.topics == (">",) or not upper:
            consumer.pending_counted = None
            return upper, True
        tokens_of = self._tokens_of

        def count(lo: int, hi: int) -> int | None:
            return stored.count_matching(lo, lambda topic: consumer.matches(tokens_of(topic)), to_seq=hi)

        last = consumer.pending_counted
        counted: int | None
        if last is not None and last[0] == from_seq and last[1] == end:
            return last[2], True  # nothing passed or appended since: the count kept (no call into the store)
        if last is not None and stored.first_seq <= last[0] <= from_seq <= last[1] <= end:
            passed, added = count(last[0], from_seq), count(last[1], end)
            counted = None if passed is None or added is None else last[2] - passed + added
        else:
            counted = count(from_seq, end)
        consumer.pending_counted = None if counted is None else (from_seq, end, counted)
        return (upper, False) if counted is None else (counted, True)

    def monitor_rows(self) -> list[dict[str, object]]:
        """/consumerz: this broker's consumers, sorted by journal and name.

        ``num_pending``: stored records not yet handed to it that its topics take (from its
        cursor, past what retention trimmed; counted by the journal's topic index; when that
        would need too many records read one by one, an upper bound, the filter not applied,
        and ``num_pending_exact`` false); ``num_ack_pending``: handed and not settled (waiting
        for an ack, or due again)."""
        rows: list[dict[str, object]] = []
        for (journal, name), consumer in sorted(self.consumers.items()):
            stored = consumer.journal
            stats = consumer.stats
            num_pending, exact = self._pending(consumer)
            rows.append(
                {
                    "journal": journal,
                    "name": name,
                    "owner": consumer.owner,
                    "store": stored.settings.store,
                    "num_pending": num_pending,
                    "num_pending_exact": exact,
                    "num_ack_pending": len(consumer.held),
                    "ack_floor": consumer.ack_floor,
                    "redelivered": stats["redelivered"],
                    "dead_lettered": stats["dead_lettered"],
                    "delivered": stats["delivered"],
                    "waiting_pulls": len(consumer.waiting),
                }
            )
        return rows
