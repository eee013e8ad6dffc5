"""The broker's own services: ``mc0.broker`` (reports), ``mmi.service`` (MDP's MMI) and ``mc0.journal``
(``mc0.admin``, the operator's actions, is :mod:`.admin`'s: its desk is kept here).

Contract: ``answer(client, name, rid, user, body)`` answers one admitted
request to a built-in service, rendered in the client's dialect: a report
as JSON, ``200``/``404`` for MMI, a journal's ``info``, or a ``fetch``
started on the journaling room (its pages follow from ``Journaling.pages``).  A
malformed body is an ERROR answer, never an exception.  Reads every room,
changes none but the journaling room's fetches.  No sockets, no clock.

Each room is read through a narrow protocol naming only what is asked of it
(``PeerRoll``, ``ServiceBoard``, ``SubscriptionBook``, ``JournalDesk``,
``MailboxBook``, ``RouteBook``, ``Reporter``): figures and copies, never a
room's containers.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from ... import protocol as P
from ...errors import InvalidTopic, ProtocolError, quoted
from ...permissions import ALLOW_ALL, Grants
from ...protocol import BROKER_SERVICE, JOURNAL_SERVICE, MMI_SERVICE, Status
from ...topics import pattern_matches, split_pattern
from ..storage.port import JournalStore
from .admindesk import AdminDesk
from .journaling import (
    COLUMNS_PAGE_BYTES,
    COLUMNS_PAGE_RECORDS,
    FETCH_MAX_BYTES,
    FETCH_MAX_RECORDS,
    FETCH_PAGE_BYTES,
    FETCH_PAGE_RECORDS,
    FetchAsk,
    PageShape,
    private,
)
from .mailboxes import identity_tokens
from .peers import Out, Peer
from .pubsub import TOPIC_CACHE_SIZE, topic_error
from .workers import Service

BUILTIN_SERVICES = frozenset({BROKER_SERVICE, MMI_SERVICE, JOURNAL_SERVICE, P.CONSUMER_SERVICE, P.ADMIN_SERVICE})
RESERVED_SERVICES = frozenset({BROKER_SERVICE, MMI_SERVICE, P.ADMIN_SERVICE})  # no worker may serve these
REPORT_OPS = ("stats", "services", "topics", "groups", "mailboxes", "consumers", "peers", "traffic")


class FetchQuery(NamedTuple):
    """An ``mc0.journal fetch``'s arguments, checked (see ``Builtins._journal``)."""

    asked: FetchAsk  # seqs, bounds and pages: what the journaling room runs
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
    return FetchQuery(FetchAsk(from_seq, to_seq, max_records, max_bytes, page), wanted)


class PeerRoll(Protocol):
    """The peers known here, as the reports read them (the peer table: ``PeerTable``)."""

    def __len__(self) -> int: ...

    def all_peers(self) -> Iterator[Peer]: ...

    def is_current(self, peer: Peer) -> bool: ...


class ServiceBoard(Protocol):
    """The services and their workers, as MMI and the reports read them (the RPC room: ``Rpc``)."""

    def serves(self, service: str) -> bool: ...

    def services_report(self) -> dict[str, dict[str, object]]: ...

    def service_report(self, service: Service) -> dict[str, object]: ...

    def service_totals(self) -> dict[str, int]: ...

    def worker_figures(self, peer: Peer) -> dict[str, object]: ...

    def route_capacity(self, route: Peer) -> dict[str, int]: ...


class SubscriptionBook(Protocol):
    """Subscriptions and queue groups, as a fetch's filter and the reports read them (the pub/sub
    room: ``PubSub``)."""

    def tokens_of(self, topic: str) -> tuple[str, ...] | None: ...

    def report(self) -> dict[str, int]: ...

    def group_report(self) -> dict[str, dict[str, int]]: ...

    def subscription_count(self) -> int: ...

    def count_of(self, peer: Peer) -> int: ...

    def groups_of(self, peer: Peer) -> dict[str, list[str]]: ...

    def interest_of(self, peer: Peer) -> tuple[list[str], list[str]]: ...


class JournalDesk(Protocol):
    """The journals by name, their figures, and a fetch started (the journaling room: ``Journaling``)."""

    def journal(self, name: str) -> JournalStore | None: ...

    def journal_names(self) -> list[str]: ...

    def journal_info(self) -> dict[str, dict[str, object]]: ...

    def start_fetch(
        self,
        peer: Peer,
        rid: str,
        user: dict[str, str],
        journal: JournalStore,
        asked: FetchAsk,
        match: Callable[[str], bool] | None,
    ) -> None: ...


class MailboxBook(Protocol):
    """Identities' sessions and mailboxes, as the reports read them (the mailboxes room: ``Mailboxes``)."""

    def seen(self, identity: str) -> bool | None: ...

    def connected(self, identity: str) -> bool: ...

    def identities_of(self, route: Peer) -> list[str]: ...

    def report(self) -> dict[str, dict[str, int]]: ...

    def summary(self) -> dict[str, object]: ...


class RouteBook(Protocol):
    """The other brokers of the cluster, as the cluster report reads them (``Routes``)."""

    @property
    def enabled(self) -> bool: ...

    def own_name(self) -> str: ...

    def routes_by_name(self) -> list[tuple[str, Peer]]: ...


class Reporter(Protocol):
    """A room's own report (the consumers', the traffic's)."""

    def report(self) -> object: ...


class Builtins:
    def __init__(
        self,
        peers: PeerRoll,
        subscriptions: SubscriptionBook,
        services: ServiceBoard,
        journals: JournalDesk,
        counters: Counter[str],
        mailboxes: MailboxBook,
        consumers: Reporter,
        routes: RouteBook | None = None,
        traffic: Reporter | None = None,
    ) -> None:
        """Each room as the reports read it: ``peers`` (the peer table), ``subscriptions`` (pub/sub),
        ``services`` (RPC), ``journals`` (journaling: fetches start there), ``mailboxes``, ``consumers``,
        ``routes`` (the cluster's: None, or not enabled, standalone) and ``traffic`` (per topic)."""
        self._peers = peers
        self._traffic = traffic
        self._routes = routes
        self._mailboxes = mailboxes
        self._consumers = consumers
        self._subscriptions = subscriptions
        self._services = services
        self._journals = journals
        self.counters = counters
        self.admin = AdminDesk(counters, is_current=peers.is_current)  # mc0.admin's actions in flight

    def answer(self, client: Peer, name: str, rid: str, user: dict[str, str], body: Sequence[bytes]) -> list[Out]:
        text = b"".join(bytes(b) for b in body).decode("utf-8", "replace").strip()
        dialect = client.dialect
        if name == MMI_SERVICE:
            answer = b"200" if self._services.serves(text) or text in RESERVED_SERVICES else b"404"
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
            "seen": self._mailboxes.seen(name),
            "connected": self._mailboxes.connected(name),
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
        journals = self._journals
        query = P.json_body(text, rid) if text.startswith("{") else {"op": text}
        if not isinstance(query, dict):
            raise ProtocolError(Status.BAD_REQUEST, "body must be a JSON object", rid)
        op = query.get("op")
        if op == "info":
            data = journals.journal_info()
            final = client.dialect.final(rid, JOURNAL_SERVICE, {}, user, [json.dumps(data).encode()])
            return [(client.routing_id, final)]
        if op != "fetch":
            raise ProtocolError(Status.BAD_REQUEST, f"unknown op {quoted(str(op))}; ops: info, fetch", rid)
        journal = journals.journal(str(query.get("journal", "")))
        if journal is None:
            known = ", ".join(journals.journal_names()) or "none configured"
            raise ProtocolError(
                Status.BAD_REQUEST, f"unknown journal {quoted(str(query.get('journal')))} ({known})", rid
            )
        private(journal, rid)
        fetch = _fetch_query(query, rid)
        match = self._readable(client.grants, fetch.wanted)
        journals.start_fetch(client, rid, user, journal, fetch.asked, match)
        return []  # pages follow from pages(), one per loop turn

    def _readable(self, grants: Grants, wanted: list[tuple[str, ...]]) -> Callable[[str], bool] | None:
        """Which topics a fetch returns: those ``wanted`` (all when none) that ``grants`` let it
        receive, each topic's verdict kept (None: every record, nothing to filter)."""
        if not wanted and grants is ALLOW_ALL:
            return None
        verdicts: dict[str, bool] = {}
        tokens_of = self._subscriptions.tokens_of

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
        if op == "services":
            return self._services.services_report()
        if op == "topics":
            return self._subscriptions.report()
        if op == "groups":
            return self._subscriptions.group_report()
        if op == "mailboxes":
            return self._mailboxes.report()
        if op == "consumers":
            return self._consumers.report()
        if op == "traffic":  # messages and bytes published per topic since the start, the busiest first
            return self._traffic.report() if self._traffic is not None else []
        if op == "peers":
            return [self._peer_row(peer) for peer in self._peers.all_peers()]
        if op == "stats":
            return {
                "peers": len(self._peers),
                "subscriptions": self._subscriptions.subscription_count(),
                **self._services.service_totals(),  # services, queued, in_flight
                "counters": dict(sorted(self.counters.items())),
                "journals": self._journals.journal_info(),
                "mailboxes": self._mailboxes.summary(),
                "cluster": self.cluster_report(),
            }
        return None

    def _peer_row(self, peer: Peer) -> dict[str, object]:
        """One row of the ``peers`` report: the peer's own figures, its subscriptions, and its figures as
        a worker and a client (services, capacity, in_flight, served, requests_outstanding)."""
        subscriptions = self._subscriptions
        return {
            "name": peer.name,
            "identity": peer.identity,
            "protocol": peer.version,
            "kind": peer.dialect.name,
            "ttl_ms": round(peer.ttl * 1000),
            "subscriptions": subscriptions.count_of(peer),
            "groups": subscriptions.groups_of(peer),
            "delivered": peer.delivered,
            "dropped": peer.drops,
            "address": peer.address,
            "msgs_in": peer.msgs_in,
            "bytes_in": peer.bytes_in,
            "msgs_out": peer.msgs_out,
            "bytes_out": peer.bytes_out,
            **self._services.worker_figures(peer),
        }

    def cluster_report(self, limit: int = 1000) -> dict[str, object]:
        """This broker's name in its cluster ("" standalone), the brokers it has a route to and what
        each announced: its peers' patterns (plain, exact 0.x topics, per queue group), services with
        their capacity, identities with a session there (at most ``limit`` of each)."""
        routes = self._routes
        if routes is None or not routes.enabled:
            return {"name": "", "brokers": [], "routes": {}}
        report: dict[str, object] = {}
        by_name = routes.routes_by_name()
        for name, route in by_name:
            patterns, exact = self._subscriptions.interest_of(route)
            report[name] = {
                "patterns": sorted(patterns)[:limit],
                "exact": sorted(exact)[:limit],
                "groups": {g: ps[:limit] for g, ps in self._subscriptions.groups_of(route).items()},
                "services": self._services.route_capacity(route),
                "identities": self._mailboxes.identities_of(route)[:limit],
            }
        return {"name": routes.own_name(), "brokers": [name for name, _ in by_name], "routes": report}

    def service_report(self, service: Service) -> dict[str, object]:
        """One service's figures (the monitoring pages' ``services``): the RPC room's answer."""
        return self._services.service_report(service)
