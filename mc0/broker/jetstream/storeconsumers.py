"""StoreConsumers: durable consumers of a JetStream journal, kept by JetStream and shared cluster-wide.

Contract: the ``mc0.consumer`` ops on a journal with ``store = "jetstream"``
that keeps no mailboxes (``kept_by_jetstream``; this is the
:class:`~mc0.broker.core.consumers.ConsumerBackend` of those journals:
:class:`~mc0.broker.core.consumers.Consumers` hands their requests here) keep their
meaning, but the consumer is a JetStream durable pull consumer of the
journal's stream (R as the journal), so one created at broker A is pulled at
B and an ack at B is seen everywhere.  Each request is validated whole first,
400 as for a local consumer (a ``create``'s config here, by ``parse_config``;
every other op comes parsed by :mod:`mc0.protocol.consumerrequests`), then
answered when the store answers (a store call; an answer that failed is the
store's code, 503 when it did not answer).
What stays the core's: the owner (kept in the consumer's metadata: only its
identity uses it; checked against JetStream's own at every op, as below),
the owner's grants at each pull (a record they may not be
handed is terminated unsent and counted ``filtered``, as a SUB's deny list
drops it), ``max_deliver`` (a record pulled for the (max_deliver+1)-th time
is dead-lettered on ``mc0.sys.dead.<journal>.<consumer>`` and terminated: the
stream's consumer itself delivers without a bound, so no record is lost
between a broker's crash and its dead letter), the per-identity and
per-cluster quotas (counted over the streams' consumers at create), and
``deliver`` all/new.  ``ack_wait``, ``nak`` (with its delay), ``term``,
``max_ack_pending`` and redelivery are JetStream's own.  An ack JetStream did
not confirm within a second (a seq not pending) is counted ``ignored``.  These
requests are not queued in :mod:`mc0.broker.core.rpc`, so their bound is
here: at most ``max_calls`` (``MAX_STORE_CALLS``, or the broker's
``max_requests`` when that is lower) store calls made for one client are in
flight at once (a cancelled pull's too, until the store answers it), and at
most ``max_total`` (``MAX_STORE_CALLS_TOTAL``) for all clients together (so
many connections cannot multiply the first bound); a request beyond either
is answered 429 and changes nothing.
What a broker learnt of a consumer (owner, config, creation nonce) is a
cache, never the truth: another broker may delete it and another identity
make one of the same name.  So every op names the consumer it means
(``expect``: owner and nonce) and the store acts only on that one (a pull
also checks what it brought): else it answers ``changed`` with the consumer there
now, nothing done (records a pull brought are given back, never
terminated), and the op is decided again on that one (403 for another
owner).  A 404 forgets what was learnt.
Pure: no sockets, no clock.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from ... import protocol as P
from ...errors import InvalidTopic, ProtocolError
from ...message import Record
from ...permissions import Grants
from ...protocol import CONSUMER_SERVICE, Status
from ...protocol import jetstream as jsw
from ...protocol.consumerrequests import (
    ConsumerConfig,
    ConsumerDelete,
    ConsumerInfo,
    ConsumerPull,
    ConsumerRequest,
    ConsumerSettle,
    parse_config,
    parse_consumer_request,
)
from ...protocol.jetstream import MAX_STORE_CALLS, MAX_STORE_CALLS_TOTAL
from ...topics import pattern_matches, split_pattern, split_topic
from ..core.access import may_read
from ..core.consumerstate import DeadLetter
from ..core.peers import Out, Peer
from ..storage.port import JournalStore
from .storecalls import StoreCalls, failure

log = logging.getLogger("mc0.broker")

# What was learnt of a consumer is used this long, then asked again.  Never trusted: every op names the
# consumer it means (owner, creation nonce) and the store acts only if that one is there (else: changed).
KNOWN_S = 10.0
REPORT_INTERVAL = 2.0  # seconds: how often the monitor asks JetStream for its consumers' figures, at most
_SERVICE_TOKENS = split_topic(CONSUMER_SERVICE)


def kept_by_jetstream(journal: JournalStore) -> bool:
    """A journal JetStream keeps records in (not one that keeps mailboxes): its consumers are JetStream's."""
    return journal.settings.replicated and not journal.settings.mailboxes


class Known:
    """What this broker knows of a store consumer: its config (patterns), owner and creation nonce
    (``made``: which consumer of that name it is)."""

    __slots__ = ("config", "patterns", "owner", "made")

    def __init__(self, config: ConsumerConfig, owner: str, made: str = "") -> None:
        self.config = config
        self.patterns = tuple(split_pattern(t) for t in config.topics)
        self.owner = owner
        self.made = made

    @property
    def expect(self) -> dict[str, str]:
        """What an op on it asks the store to check first (the store acts only on this consumer)."""
        return {"owner": self.owner, "made": self.made}

    def matches(self, tokens: tuple[str, ...] | None) -> bool:
        return tokens is not None and any(pattern_matches(p, tokens) for p in self.patterns)


def known_of(data: dict[str, Any]) -> Known:
    """The consumer an answer describes (its metadata); ValueError/KeyError/TypeError if it is not mc0's."""
    metadata = data["metadata"]
    saved = json.loads(metadata[jsw.CONFIG_KEY])
    config = ConsumerConfig(**{**saved, "topics": tuple(saved["topics"])})
    return Known(config, str(metadata.get(jsw.OWNER_KEY, "")), str(data.get("made", "")))


def refusal(peer: Peer, patterns: Sequence[tuple[str, ...]], topics: Sequence[str]) -> str | None:
    """Why ``peer``'s grants do not allow a consumer of these patterns (None: they do)."""
    if not peer.grants.may_call(_SERVICE_TOKENS):
        return f"{peer.identity} may not call {CONSUMER_SERVICE}"
    for pattern, tokens in zip(topics, patterns, strict=True):
        if not peer.grants.may_subscribe(tokens):
            return f"{peer.identity} may not subscribe to {pattern}"
    return None


class StoreConsumers:
    def __init__(
        self,
        calls: StoreCalls,
        counters: Counter[str],
        *,
        journals: Sequence[JournalStore],
        tokens_of: Callable[[str], tuple[str, ...] | None],
        max_wait_ms: int,
        max_consumers: int,
        max_per_identity: int,
        max_calls: int = MAX_STORE_CALLS,
        max_total: int = MAX_STORE_CALLS_TOTAL,
    ) -> None:
        """Keeps the consumers of those of ``journals`` JetStream keeps (``kept_by_jetstream``);
        ``max_wait_ms``: a pull's longest wait; ``max_calls``: store calls one client may have in
        flight, ``max_total``: all clients together (429 beyond either)."""
        self.calls = calls
        self.counters = counters
        self.journals: dict[str, JournalStore] = {j.name: j for j in journals if kept_by_jetstream(j)}
        self._tokens_of = tokens_of
        self._max_wait_ms = max_wait_ms
        self._dead_letters: list[DeadLetter] = []  # not yet taken (take_dead_letters)
        self.max_consumers = max_consumers
        self.max_per_identity = max_per_identity
        self.max_calls = max_calls
        self.max_total = max_total
        # What this broker learnt of each consumer, and until when it uses it.  Another broker may delete
        # it and another identity make one of that name: each op names the one it means (``expect``)
        # and the store checks it against JetStream's own (see handle).
        self.known: dict[tuple[str, str], Known] = {}
        self._known_until: dict[tuple[str, str], float] = {}
        self._asking: dict[tuple[bytes, str], int] = {}  # (client, rid) -> the store call answering it
        # /consumerz: every mc0 consumer of the JetStream journals as JetStream last said (``monitor``),
        # with this broker's own dead-letter tallies (JetStream has none: mc0 dead-letters).
        self.reported: list[dict[str, object]] = []
        self.dead_lettered: Counter[tuple[str, str]] = Counter()
        self._report_due = 0.0
        self._reporting = False

    def keeps(self, journal: JournalStore) -> bool:
        """``journal``'s consumers are JetStream's (it is one of those it was built with)."""
        return self.journals.get(journal.name) is journal

    def take_dead_letters(self) -> list[DeadLetter]:
        """The dead letters pulls found since the last call, oldest first; a new list starts."""
        letters = self._dead_letters
        if letters:
            self._dead_letters = []
        return letters

    # ------------------------------------------------------------ monitoring
    def monitor_rows(self) -> list[dict[str, object]]:
        """/consumerz: the consumers of the JetStream journals as JetStream last said (``monitor``)."""
        return list(self.reported)

    def monitor(self, journals: Sequence[str], now: float) -> None:
        """The monitor is read: ask JetStream for its consumers' figures (one call in flight, at
        most every ``REPORT_INTERVAL``); ``reported`` holds the last answer."""
        if self._reporting or now < self._report_due or not journals:
            return
        self._reporting = True
        self._report_due = now + REPORT_INTERVAL

        def reported(data: dict[str, Any], records: Sequence[Record], now: float) -> list[Out]:
            self._reporting = False
            if failure(data) is None:
                self.reported = [
                    {**row, "dead_lettered": self.dead_lettered[str(row.get("journal")), str(row.get("name"))]}
                    for row in data.get("consumers", [])
                    if isinstance(row, dict)
                ]
            return []

        self.calls.call({"op": "consumer_report", "journals": list(journals)}, reported)

    # ------------------------------------------------------------ plumbing
    @staticmethod
    def _final(client: Peer, rid: str, user: dict[str, str], data: object) -> list[Out]:
        body = json.dumps(data, sort_keys=True).encode()
        return [(client.routing_id, client.dialect.final(rid, CONSUMER_SERVICE, {}, user, [body]))]

    @staticmethod
    def _error(client: Peer, rid: str, code: int, reason: str) -> list[Out]:
        try:
            status = Status(code)
        except ValueError:  # a code mc0 has no status for
            status = Status.NO_WORKER
        return [(client.routing_id, client.dialect.error(rid, CONSUMER_SERVICE, status, reason))]

    def _call(
        self,
        client: Peer,
        rid: str,
        request: dict[str, Any],
        then: Callable[[dict[str, Any], Sequence[Record], float], list[Out]],
        about: tuple[str, str] | None = None,
    ) -> list[Out]:
        """A store call answering ``client``'s request ``rid`` (a failed one answers the error; a 404
        about consumer ``about`` (journal, name) also forgets what was learnt of it)."""
        key = (client.routing_id, rid)

        def answered(data: dict[str, Any], records: Sequence[Record], now: float) -> list[Out]:
            if self._asking.get(key) != token:
                return []  # cancelled, or its client went
            del self._asking[key]
            problem = failure(data)
            if problem is not None:
                if about is not None and problem[0] == Status.NOT_FOUND:
                    self.forget(*about)
                return self._error(client, rid, *problem)
            return then(data, records, now)

        token = self.calls.call(request, answered, client.routing_id)
        self._asking[key] = token
        return []

    def _admit(self, client: Peer, rid: str) -> None:
        """429 (a ProtocolError, nothing changed) when ``client`` has ``max_calls`` store calls in flight,
        or all clients together ``max_total``."""
        if client.route:
            return  # a route carries many clients' requests (as in rpc.admit)
        held = self.calls.in_flight(client.routing_id)
        if held >= self.max_calls:
            self.counters["store_calls_refused"] += 1
            reason = f"{held} requests to JetStream in flight, the limit per client ({self.max_calls})"
            raise ProtocolError(Status.OVER_LIMIT, reason, rid)
        total = self.calls.in_flight_total
        if total >= self.max_total:
            self.counters["store_calls_refused"] += 1
            reason = f"{total} requests to JetStream in flight on this broker, the limit ({self.max_total})"
            raise ProtocolError(Status.OVER_LIMIT, reason, rid)

    def _learn(self, journal: str, name: str, known: Known, now: float) -> None:
        self.known[journal, name] = known
        self._known_until[journal, name] = now + KNOWN_S

    def forget(self, journal: str, name: str) -> bool:
        """What this broker learnt of a consumer goes (an operator removed it): the next request on
        its name asks JetStream again.  True if something was known."""
        self._known_until.pop((journal, name), None)
        return self.known.pop((journal, name), None) is not None

    def waiting_for(self, peer: Peer, rid: str) -> bool:
        return (peer.routing_id, rid) in self._asking

    def cancel(self, peer: Peer, rid: str) -> bool:
        """A pull (or any request) under way is dropped; what the store hands it is redelivered after ack_wait."""
        return self._asking.pop((peer.routing_id, rid), None) is not None

    def drop_peer(self, peer: Peer) -> None:
        gone = [key for key in self._asking if key[0] == peer.routing_id]
        self.calls.abandon([self._asking.pop(key) for key in gone])
        self.calls.forget(peer.routing_id)

    # ------------------------------------------------------------ requests
    def list_with(self, client: Peer, rid: str, user: dict[str, str], names: list[str]) -> list[Out]:
        """``list``: the caller's own, ``names`` (this broker's) and the store's."""
        self._admit(client, rid)
        request = {"op": "consumer_list", "journals": sorted(self.journals), "owner": client.identity}

        def listed(data: dict[str, Any], records: Sequence[Record], now: float) -> list[Out]:
            kept = [f"{j}/{n}" for j, n in data.get("consumers", [])]
            return self._final(client, rid, user, sorted(names + kept))

        return self._call(client, rid, request, listed)

    def create(self, client: Peer, rid: str, user: dict[str, str], query: dict[str, Any], now: float) -> list[Out]:
        """``create`` on a journal it keeps (``keeps``): the config checked here, then the store asked
        (an existing consumer of that name answered if it is the caller's with this config)."""
        journal = self.journals[str(query.get("journal", ""))]
        config, patterns = parse_config(journal.name, query, rid)
        reason = refusal(client, patterns, config.topics)
        if reason is not None:
            raise ProtocolError(Status.FORBIDDEN, reason, rid)
        self._admit(client, rid)
        owner = client.identity
        lookup = {"op": "consumer_lookup", "journal": journal.name, "name": config.name, "owner": owner}

        def looked(data: dict[str, Any], records: Sequence[Record], now: float) -> list[Out]:
            existing = data.get("info")
            if existing is not None:
                try:
                    known = known_of(existing)
                except (ValueError, KeyError, TypeError, InvalidTopic):
                    return self._error(client, rid, Status.CONFLICT, f"consumer {config.name} exists and is not mc0's")
                if known.owner and known.owner != owner:
                    reason = f"consumer {config.name} on journal {journal.name} belongs to another identity"
                    return self._error(client, rid, Status.FORBIDDEN, reason)
                if known.config != config:
                    reason = f"consumer {config.name} exists with another config"
                    return self._error(client, rid, Status.CONFLICT, reason)
                self._learn(journal.name, config.name, known, now)
                return self._final(client, rid, user, self._info(known, existing))
            owned, total = int(data.get("owned", 0)), int(data.get("total", 0))
            if owned >= self.max_per_identity:
                reason = (
                    f"{owner} has {owned} consumers in the cluster, the limit per identity "
                    f"(max_consumers_per_identity {self.max_per_identity})"
                )
                return self._error(client, rid, Status.OVER_LIMIT, reason)
            if total >= self.max_consumers:
                reason = f"{total} consumers in the cluster's JetStream journals (max_consumers {self.max_consumers})"
                return self._error(client, rid, Status.OVER_LIMIT, reason)
            create = {
                "op": "consumer_create",
                "journal": journal.name,
                "name": config.name,
                "owner": owner,
                "config": asdict(config),
                "replicas": journal.settings.replicas,
            }
            return self._call(client, rid, create, created)

        def created(data: dict[str, Any], records: Sequence[Record], now: float) -> list[Out]:
            known = Known(config, owner, str(data["info"].get("made", "")))  # (its nonce: the next op checks it)
            self._learn(journal.name, config.name, known, now)
            self.counters["consumers_created"] += 1
            return self._final(client, rid, user, self._info(known, data["info"]))

        return self._call(client, rid, lookup, looked)

    def handle(
        self, client: Peer, rid: str, user: dict[str, str], query: dict[str, Any], deadline: float, now: float
    ) -> list[Out]:
        """Every op but create and list, on a consumer of a journal it keeps (``keeps``): the request
        checked whole first (:func:`~mc0.protocol.consumerrequests.parse_consumer_request`)."""
        asked = parse_consumer_request(query, rid, max_wait_ms=self._max_wait_ms)
        journal = self.journals[asked.journal]
        name = asked.name
        request = self._store_request(asked, journal.name, deadline - now)
        self._admit(client, rid)

        key = (journal.name, name)
        deleting = isinstance(asked, ConsumerDelete)

        def with_known(known: Known, again: bool = False) -> list[Out]:
            if known.owner and known.owner != client.identity:
                reason = f"consumer {name} on journal {journal.name} belongs to another identity"
                return self._error(client, rid, Status.FORBIDDEN, reason)
            refused = refusal(client, known.patterns, known.config.topics) if not deleting else None
            if refused is not None:  # (its owner may always delete it)
                return self._error(client, rid, Status.FORBIDDEN, refused)

            def done(data: dict[str, Any], records: Sequence[Record], now: float) -> list[Out]:
                if "changed" not in data:
                    return self._done(client, rid, user, known, asked, data, records, now)
                # Another consumer of that name than the one learnt here (deleted and made again,
                # through another broker): the store did nothing; decided again on the one there now.
                self.counters["consumer_changed"] += 1
                try:
                    fresh = known_of(data["changed"])
                except (ValueError, KeyError, TypeError, InvalidTopic):
                    self.forget(*key)
                    return self._error(
                        client, rid, Status.NOT_FOUND, f"no mc0 consumer {name[:64]!r} on journal {journal.name}"
                    )
                self._learn(journal.name, name, fresh, now)
                if again:  # (made again twice while asked: the caller asks again)
                    reason = f"consumer {name} on journal {journal.name} was made again while asked: ask again"
                    return self._error(client, rid, Status.NO_WORKER, reason)
                return with_known(fresh, again=True)

            return self._call(client, rid, {**request, "expect": known.expect}, done, key)

        known = self.known.get(key)
        if known is not None and self._known_until.get(key, 0.0) > now:
            return with_known(known)
        info = {"op": "consumer_info", "journal": journal.name, "name": name}

        def found(data: dict[str, Any], records: Sequence[Record], now: float) -> list[Out]:
            try:
                found = known_of(data["info"])
            except (ValueError, KeyError, TypeError, InvalidTopic):
                self.forget(*key)
                reason = f"no mc0 consumer {name[:64]!r} on journal {journal.name}"
                return self._error(client, rid, Status.NOT_FOUND, reason)
            self._learn(journal.name, name, found, now)
            return with_known(found)

        return self._call(client, rid, info, found, key)

    @staticmethod
    def _store_request(asked: ConsumerRequest, journal: str, time_left: float) -> dict[str, Any]:
        """What the store is asked for the client's request ``asked``; a pull's long poll ends
        before the request's deadline (``time_left`` s)."""
        request: dict[str, Any] = {"journal": journal, "name": asked.name}
        if isinstance(asked, ConsumerPull):
            wait_ms = max(0, min(asked.wait_ms, int(time_left * 1000) - 50))  # answered before the deadline
            request.update(op="consumer_pull", batch=asked.batch, wait_ms=wait_ms)
        elif isinstance(asked, ConsumerSettle):
            request.update(op="consumer_settle", how=asked.how, seqs=list(asked.seqs), delay_ms=asked.delay_ms)
        else:
            request.update(op="consumer_info" if isinstance(asked, ConsumerInfo) else "consumer_delete")
        return request

    def _done(
        self,
        client: Peer,
        rid: str,
        user: dict[str, str],
        known: Known,
        asked: ConsumerRequest,
        data: dict[str, Any],
        records: Sequence[Record],
        now: float,
    ) -> list[Out]:
        config = known.config
        if isinstance(asked, ConsumerInfo):
            return self._final(client, rid, user, self._info(known, data["info"]))
        if isinstance(asked, ConsumerDelete):
            self.forget(config.journal, config.name)
            return self._final(client, rid, user, {"deleted": config.name})
        if isinstance(asked, ConsumerSettle):
            op = asked.how
            done = int(data.get("done", 0))
            self.counters[f"consumer_{op}ed"] += done
            return self._final(client, rid, user, {op: done, "ignored": int(data.get("ignored", 0))})
        return self._page(client, rid, user, known, data, records, now)

    def _page(
        self,
        client: Peer,
        rid: str,
        user: dict[str, str],
        known: Known,
        data: dict[str, Any],
        records: Sequence[Record],
        now: float,
    ) -> list[Out]:
        """A pull's records: what the owner may be handed, in a journal page with each one's
        delivery count; the rest terminated (filtered, or dead-lettered past max_deliver)."""
        config = known.config
        deliveries: list[int] = [int(d) for d in data.get("deliveries", [])]
        grants: Grants = client.grants
        given: list[Record] = []
        counts: list[int] = []
        ended: list[int] = []
        for record, count in zip(records, deliveries, strict=True):
            tokens = self._tokens_of(record.topic)
            if count > config.max_deliver:
                topic = f"{P.SYS_DEAD_PREFIX}{config.journal}.{config.name}"
                reason = f"not acknowledged after {count - 1} deliveries (max_deliver {config.max_deliver})"
                self._dead_letters.append((topic, record, reason, count - 1))
                self.counters["consumer_dead_lettered"] += 1
                self.dead_lettered[config.journal, config.name] += 1
                ended.append(record.seq)
            elif not known.matches(tokens) or not may_read(grants, tokens, record.headers):
                self.counters["consumer_filtered"] += 1
                ended.append(record.seq)
            else:
                given.append(record)
                counts.append(count)
        if ended:
            settle = {"op": "consumer_settle", "journal": config.journal, "name": config.name, "how": "term"}
            self.calls.call({**settle, "seqs": ended, "delay_ms": 0}, lambda d, r, n: [], client.routing_id)
        self.counters["consumer_delivered"] += len(given)
        client.last_sent = now
        frames = [*P.journal_page(given), json.dumps(counts).encode()]
        return [(client.routing_id, client.dialect.final(rid, CONSUMER_SERVICE, {}, user, frames))]

    @staticmethod
    def _info(known: Known, info: dict[str, Any]) -> dict[str, object]:
        """mc0's info of a consumer, from JetStream's (what JetStream counts; no per-broker tallies)."""
        pending = int(info.get("num_ack_pending", 0))
        return {
            "config": asdict(known.config),
            "owner": known.owner,
            "store": "jetstream",
            "ack_floor": int(info.get("ack_floor", 0)),
            "cursor": int(info.get("delivered", 0)) + 1,
            "pending": pending,
            "redelivered": int(info.get("num_redelivered", 0)),
            "waiting_pulls": int(info.get("num_waiting", 0)),
            "lag": int(info.get("num_pending", 0)),  # exact: JetStream applies the topic filter
        }
