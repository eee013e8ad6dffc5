"""The broker's own services: ``mc0.broker`` (reports), ``mmi.service`` (MDP's MMI) and ``mc0.journal``
(``mc0.admin``, the operator's actions, is :mod:`.admin`'s: its desk is kept here).

Contract: ``answer(client, name, rid, user, body)`` answers one admitted
request to a built-in service, rendered in the client's dialect: a report
as JSON, ``200``/``404`` for MMI, a journal's ``info``, or a ``fetch``
started on the journaling room (its pages follow from ``Journaling.pages``).  A
malformed body is an ERROR answer, never an exception.  Reads every room,
changes none but the journaling room's fetches.  No sockets, no clock.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ... import protocol as P
from ...errors import InvalidTopic, ProtocolError, quoted
from ...permissions import ALLOW_ALL, Grants
from ...protocol import BROKER_SERVICE, JOURNAL_SERVICE, MMI_SERVICE, Status
from ...topics import pattern_matches, split_pattern
from .admindesk import AdminDesk
from .consumers import Consumers
from .journaling import (
    COLUMNS_PAGE_BYTES,
    COLUMNS_PAGE_RECORDS,
    FETCH_MAX_BYTES,
    FETCH_MAX_RECORDS,
    FETCH_PAGE_BYTES,
    FETCH_PAGE_RECORDS,
    Journaling,
    PageShape,
    private,
)
from .mailboxes import Mailboxes, identity_tokens
from .peers import Out, Peer, PeerTable
from .pubsub import TOPIC_CACHE_SIZE, PubSub, topic_error
from .routes import Routes
from .rpc import Rpc
from .traffic import TopicTraffic
from .workers import Service

BUILTIN_SERVICES = frozenset({BROKER_SERVICE, MMI_SERVICE, JOURNAL_SERVICE, P.CONSUMER_SERVICE, P.ADMIN_SERVICE})
RESERVED_SERVICES = frozenset({BROKER_SERVICE, MMI_SERVICE, P.ADMIN_SERVICE})  # no worker may serve these
REPORT_OPS = ("stats", "services", "topics", "groups", "mailboxes", "consumers", "peers", "traffic")


class FetchQuery(NamedTuple):
    """An ``mc0.journal fetch``'s arguments, checked (see ``Builtins._journal``)."""

    from_seq: int
    to_seq: int | None
    max_records: int
    max_bytes: int
    page: PageShape
    wanted: list[tuple[str, ...]]  # the topics asked for (none: every topic)


def _fetch_query(query: dict[str, Any], rid: str) -> FetchQuery:
    """A fetch's arguments out of its JSON query: each an integer within its bounds, the page
    encoding one of the formats, the topics patterns (400 naming the first that is not)."""

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
    encoding = query.get("page", P.PAGE_JSON)
    if encoding not in P.PAGE_FORMATS:
        raise ProtocolError(Status.BAD_REQUEST, f"page must be one of {', '.join(P.PAGE_FORMATS)}", rid)
    columns = encoding == P.PAGE_COLUMNS
    most_records = COLUMNS_PAGE_RECORDS if columns else FETCH_PAGE_RECORDS
    most_bytes = COLUMNS_PAGE_BYTES if columns else FETCH_PAGE_BYTES
    page = PageShape(
        str(encoding),
        integer("page_records", FETCH_PAGE_RECORDS, 1, most_records) or 1,
        integer("page_bytes", FETCH_PAGE_BYTES, 1, most_bytes) or 1,
    )
    raw_topics = query.get("topics") or []
    if isinstance(raw_topics, str):
        raw_topics = [raw_topics]
    if not isinstance(raw_topics, list) or not all(isinstance(t, str) for t in raw_topics):
        raise ProtocolError(Status.BAD_REQUEST, "topics must be a list of patterns", rid)
    try:
        wanted = [split_pattern(t) for t in raw_topics]
    except InvalidTopic as exc:
        raise topic_error(exc, rid) from None
    return FetchQuery(from_seq, to_seq, max_records, max_bytes, page, wanted)


class Builtins:
    def __init__(
        self,
        peers: PeerTable,
        pubsub: PubSub,
        rpc: Rpc,
        journaling: Journaling,
        counters: Counter[str],
        mailboxes: Mailboxes,
        consumers: Consumers,
        routes: Routes | None = None,
        traffic: TopicTraffic | None = None,
    ) -> None:
        self.peers = peers
        self.traffic = traffic
        self.routes = routes
        self.mailboxes = mailboxes
        self.consumers = consumers
        self.pubsub = pubsub
        self.rpc = rpc
        self.journaling = journaling
        self.counters = counters
        self.admin = AdminDesk(counters, is_current=peers.is_current)  # mc0.admin's actions in flight

    def answer(self, client: Peer, name: str, rid: str, user: dict[str, str], body: Sequence[bytes]) -> list[Out]:
        text = b"".join(bytes(b) for b in body).decode("utf-8", "replace").strip()
        dialect = client.dialect
        if name == MMI_SERVICE:
            service = self.rpc.services.get(text)
            known = service is not None and bool(service.workers)
            answer = b"200" if known or text in RESERVED_SERVICES else b"404"
            return [(client.routing_id, dialect.final(rid, name, {}, user, [answer]))]
        if name == JOURNAL_SERVICE:
            try:
                return self._journal(client, rid, user, text)
            except ProtocolError as exc:
                return [(client.routing_id, dialect.error(rid, name, exc.code, exc.reason))]
        op = text
        if text.startswith("{"):
            try:
                query = P.json_body(text, rid)
            except ProtocolError as exc:
                return [(client.routing_id, dialect.error(rid, name, exc.code, exc.reason))]
            op = str(query.get("op", "")) if isinstance(query, dict) else ""
        if op == P.IDENTITY_OP:
            return self._identity(client, rid, user, query if text.startswith("{") else None)
        if op == "peers" and not (client.grants.sees_peers or client.grants.admin):  # peer telemetry's rule
            reason = f"the peers report needs a subscribe grant naming {P.SYS_PEER_TOPIC} (or the mc0.admin grant)"
            return [(client.routing_id, dialect.error(rid, name, Status.FORBIDDEN, reason))]
        report = self.report(op)
        if report is None:
            reason = f"unknown op {quoted(op)}; ops: {', '.join(REPORT_OPS)}, {P.IDENTITY_OP}"
            return [(client.routing_id, dialect.error(rid, name, Status.BAD_REQUEST, reason))]
        data = json.dumps(report, sort_keys=True).encode()
        return [(client.routing_id, dialect.final(rid, name, {}, user, [data]))]

    def _identity(self, client: Peer, rid: str, user: dict[str, str], query: object) -> list[Out]:
        """``{"op": "identity", "identity": NAME}``: whether NAME was seen here since the start (``seen``:
        true, false, or null past ``SEEN_MAX``) and is ``connected`` (here or at another broker), for a
        caller that may send to it (403 otherwise): what tells a letter ``stored`` for nobody."""
        name = query.get("identity") if isinstance(query, dict) else None
        error: tuple[int, str] | None = None
        if not isinstance(name, str) or not P.valid_group(name):
            error = (Status.BAD_REQUEST, '{"op": "identity", "identity": NAME} with an identity NAME')
        elif not client.grants.may_send_to(identity_tokens(name)):
            error = (Status.FORBIDDEN, f"{client.identity} may not send to {name}")
        if error is not None:
            return [(client.routing_id, client.dialect.error(rid, BROKER_SERVICE, *error))]
        assert isinstance(name, str)
        report = {
            "identity": name,
            "seen": self.mailboxes.seen(name),
            "connected": bool(self.mailboxes.sessions_of(name)),
        }
        data = json.dumps(report, sort_keys=True).encode()
        return [(client.routing_id, client.dialect.final(rid, BROKER_SERVICE, {}, user, [data]))]

    def _journal(self, client: Peer, rid: str, user: dict[str, str], text: str) -> list[Out]:
        """``mc0.journal``: ``info``, or ``fetch`` sent as PARTIAL pages then a FINAL.

        fetch: ``{"op": "fetch", "journal": j, "from_seq": a, "to_seq": b,
        "topics": [pattern...], "max_records": n, "max_bytes": m, "page": f,
        "page_records": r, "page_bytes": s}``.  With ``page`` ``json`` (the
        default) each PARTIAL's body is a JSON list of record metadata (seq,
        ts, topic, sender, headers, parts = how many body frames follow) then
        the body frames; with ``columns/1`` it is one columns page
        (``mc0.protocol.columns_page``).  A PARTIAL holds at most
        ``page_records`` records / about ``page_bytes`` of bodies (default and
        most 1,000 / 1 MiB; a columns page may ask up to 4,000 / 4 MiB).  The
        FINAL's JSON says ``next_seq`` (where to continue), ``records`` and the
        journal's ``first_seq``/``end_seq``.  Only records
        the caller may subscribe to are returned (a dead letter: only if it may
        subscribe to the topic it died on too).  Deterministic; 410 when
        ``from_seq`` was trimmed.
        """
        journals = self.journaling.journals
        query = P.json_body(text, rid) if text.startswith("{") else {"op": text}
        if not isinstance(query, dict):
            raise ProtocolError(Status.BAD_REQUEST, "body must be a JSON object", rid)
        op = query.get("op")
        if op == "info":
            data = {n: j.info() for n, j in journals.items()}
            final = client.dialect.final(rid, JOURNAL_SERVICE, {}, user, [json.dumps(data).encode()])
            return [(client.routing_id, final)]
        if op != "fetch":
            raise ProtocolError(Status.BAD_REQUEST, f"unknown op {quoted(str(op))}; ops: info, fetch", rid)
        journal = journals.get(str(query.get("journal", "")))
        if journal is None:
            known = ", ".join(journals) or "none configured"
            raise ProtocolError(
                Status.BAD_REQUEST, f"unknown journal {quoted(str(query.get('journal')))} ({known})", rid
            )
        private(journal, rid)
        fetch = _fetch_query(query, rid)
        match = self._readable(client.grants, fetch.wanted)
        self.journaling.start_fetch(
            client,
            rid,
            user,
            journal,
            fetch.from_seq,
            fetch.to_seq,
            match,
            fetch.max_records,
            fetch.max_bytes,
            fetch.page,
        )
        return []  # pages follow from pages(), one per loop turn

    def _readable(self, grants: Grants, wanted: list[tuple[str, ...]]) -> Callable[[str], bool] | None:
        """Which topics a fetch returns: those ``wanted`` (all when none) that ``grants`` let it
        receive, each topic's verdict kept (None: every record, nothing to filter)."""
        if not wanted and grants is ALLOW_ALL:
            return None
        verdicts: dict[str, bool] = {}
        tokens_of = self.pubsub.tokens_of

        def match(topic: str) -> bool:
            verdict = verdicts.get(topic)
            if verdict is None:
                tokens = tokens_of(topic)
                verdict = (
                    tokens is not None
                    and (not wanted or any(pattern_matches(p, tokens) for p in wanted))
                    and grants.may_receive(tokens)
                )
                if len(verdicts) < TOPIC_CACHE_SIZE:
                    verdicts[topic] = verdict
            return verdict

        return match

    def report(self, op: str) -> object | None:
        """The data behind ``mc0.broker`` ops (None for an unknown op)."""
        rpc = self.rpc
        if op == "services":
            return {name: self.service_report(s) for name, s in sorted(rpc.services.items())}
        if op == "topics":
            return self.pubsub.report()
        if op == "groups":
            return self.pubsub.group_report()
        if op == "mailboxes":
            return self.mailboxes.report()
        if op == "consumers":
            return self.consumers.report()
        if op == "traffic":  # messages and bytes published per topic since the start, the busiest first
            return self.traffic.report() if self.traffic is not None else []
        if op == "peers":
            rows = []
            for peer in self.peers.by_id.values():
                state = rpc.worker_state(peer)
                rows.append(
                    {
                        "name": peer.name,
                        "identity": peer.identity,
                        "protocol": peer.version,
                        "kind": peer.dialect.name,
                        "ttl_ms": round(peer.ttl * 1000),
                        "subscriptions": self.pubsub.count_of(peer),
                        "groups": self.pubsub.groups_of(peer),
                        "delivered": peer.delivered,
                        "dropped": peer.drops,
                        "address": peer.address,
                        "msgs_in": peer.msgs_in,
                        "bytes_in": peer.bytes_in,
                        "msgs_out": peer.msgs_out,
                        "bytes_out": peer.bytes_out,
                        "services": list(state.services) if state else [],
                        "capacity": state.capacity if state else 0,
                        "in_flight": len(state.jobs) if state else 0,
                        "served": state.served if state else 0,
                        "requests_outstanding": len(rpc.requests.get(peer, ())),
                    }
                )
            return rows
        if op == "stats":
            return {
                "peers": len(self.peers),
                "subscriptions": len(self.pubsub.subscriptions),
                "services": len(rpc.services),
                "queued": sum(s.queued for s in rpc.services.values()),
                "in_flight": sum(len(w.jobs) for w in rpc.workers.values()),
                "counters": dict(sorted(self.counters.items())),
                "journals": {name: journal.info() for name, journal in self.journaling.journals.items()},
                "mailboxes": self.mailboxes.summary(),
                "cluster": self.cluster_report(),
            }
        return None

    def cluster_report(self, limit: int = 1000) -> dict[str, object]:
        """This broker's name in its cluster ("" standalone), the brokers it has a route to and what
        each announced: its peers' patterns (plain, exact 0.x topics, per queue group), services with
        their capacity, identities with a session there (at most ``limit`` of each)."""
        routes = self.routes
        if routes is None or not routes.enabled:
            return {"name": "", "brokers": [], "routes": {}}
        report: dict[str, object] = {}
        for name, route in sorted(routes.by_name.items()):
            held = self.pubsub.held(route, None)
            state = self.rpc.worker_state(route)
            report[name] = {
                "patterns": sorted(p for p, t in held.items() if t)[:limit],
                "exact": sorted(p for p, t in held.items() if not t)[:limit],
                "groups": {g: ps[:limit] for g, ps in self.pubsub.groups_of(route).items()},
                "services": dict(state.per_service or {}) if state is not None else {},
                "identities": self.mailboxes.identities_of(route)[:limit],
            }
        return {"name": routes.name, "brokers": sorted(routes.by_name), "routes": report}

    def _in_flight(self, service: Service) -> int:
        workers = self.rpc.workers
        return sum(1 for w in service.workers for j in workers[w].jobs.values() if j.service == service.name)

    def service_report(self, service: Service) -> dict[str, object]:
        return {
            "workers": len(service.workers),
            "idle": len(service.ready),
            "queued": service.queued,
            "in_flight": self._in_flight(service),
            "requests": service.requests,
            "served": service.served,
            "errors": service.errors,
            "timeouts": service.timeouts,
            # From the latency histogram's buckets, as PromQL's histogram_quantile (one definition).
            "latency_ms": service.latency.percentiles_ms(),
        }
