"""Monitoring snapshots: what ``/varz``, ``/connz``, ``/subsz``, ``/servicez``, ``/consumerz``, ``/journalz``,
``/mailboxz`` and ``/metrics`` show.

Contract: the loop *captures* (``capture(core, outbox, parts, now=..., ...)``)
and the HTTP side *builds* (``build(capture)``), so that what the loop pays
is a copy, never the pages.  A :class:`Capture` holds only immutable or
freshly copied values: per peer one tuple of its figures read in C
(``operator.attrgetter``), the closed connections (frozen records),
subscribers per pattern (a dict the pub/sub room keeps as subscriptions
change, copied in C), the consumers' rows (their figures kept as they
change), counters, services and journals; and only the ``parts`` some
waiting request needs (an idle /varz poll copies no peer).  ``build`` turns
it into one self-contained, JSON-ready :class:`Snapshot` (plain dicts,
lists and numbers, RFC 3339 times, rows sorted) on the HTTP thread, once
per capture whatever the number of requests that share it.
``snapshot(core, outbox, ...)`` is both at once (every part), for tests and
reports.  Pure: the clock is passed in, no I/O, changes nothing.  Peers are
named as ``Peer.name`` (``identity#n``), never by routing id.

The big pages are paged, sorted and filtered here, over the snapshot's rows
(:func:`connz`, :func:`subsz`, :func:`consumerz`): each takes ``sort``,
``limit`` (default ``PAGE_DEFAULT_LIMIT``, at most ``PAGE_MAX_LIMIT``;
``/connz?subs=1`` at most ``SUBS_MAX_LIMIT``), ``offset`` and ``filter`` (a
case-insensitive substring of the row's names, at most ``FILTER_MAX``
characters).  Every parameter is checked against its page's table
(``PAGE_PARAMETERS``): a number is ASCII digits only; anything else is
:class:`BadQuery`, one line naming the parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from typing import Protocol

from ..core.dispatch import BrokerCore
from ..core.peers import Closed, Peer

# /connz rows' fields a ``sort`` may name: numbers sort descending (the busiest first), text and
# ``connected_at`` ascending (``closed_at`` descending: the newest close first), as nats-server's.
CONNZ_NUMBERS = (
    "num_subscriptions", "pending_bytes", "idle_s", "delivered", "dropped", "in_flight",
    "msgs_in", "bytes_in", "msgs_out", "bytes_out", "uptime_s",
)  # fmt: skip
CONNZ_TEXTS = ("name", "identity", "dialect", "protocol", "address", "connected_at", "reason")
CONNZ_STATES = ("open", "closed", "all")
PAGE_DEFAULT_LIMIT = 1024  # rows of a paged page when ``limit`` is not given (nats-server's /connz default)
PAGE_MAX_LIMIT = 10_000  # rows of a paged page at most
SUBS_MAX_LIMIT = 1_000  # /connz?subs=1: connections at most (each with every pattern it holds)
CONNZ_DEFAULT_LIMIT, CONNZ_MAX_LIMIT = PAGE_DEFAULT_LIMIT, PAGE_MAX_LIMIT  # (the names /connz had)
FILTER_MAX = 200  # characters of a ``filter``
NUMBER_DIGITS = 12  # digits a number parameter may have
SUBSZ_SORTS = ("pattern", "subscribers")
CONSUMERZ_NUMBERS = ("num_pending", "num_ack_pending", "ack_floor", "redelivered", "dead_lettered", "delivered")
CONSUMERZ_TEXTS = ("name", "journal", "owner", "store")

# What a capture copies for each page (``parts``): /varz, /healthz, /servicez and /journalz need only
# what every capture has (counters, services, journals: few).
CONNZ, CLOSED, SUBS, SUBSZ, CONSUMERZ, MAILBOXZ = "connz", "closed", "subs", "subsz", "consumerz", "mailboxz"
ALL_PARTS = frozenset((CONNZ, CLOSED, SUBS, SUBSZ, CONSUMERZ, MAILBOXZ))
PAGE_PARTS: dict[str, frozenset[str]] = {
    "/connz": frozenset((CONNZ, CLOSED)),
    "/subsz": frozenset((SUBSZ,)),
    "/consumerz": frozenset((CONSUMERZ,)),
    "/mailboxz": frozenset((MAILBOXZ,)),
    "/metrics": frozenset((CONSUMERZ,)),
}


class QueueFigures(Protocol):
    """What a snapshot reads of the shell's outgoing queues (``mc0.broker.outbox.Outbox`` has it)."""

    sent_messages: int
    sent_bytes: int
    queued_bytes: int

    def backlog(self, routing_id: bytes) -> int: ...


# A peer's figures, read in one C call per peer: the order of ``_PEER_FIELDS`` is the tuple's.
_PEER_FIELDS = (
    "name", "identity", "dialect.name", "version", "address", "connected", "last_recv",
    "msgs_in", "bytes_in", "msgs_out", "bytes_out", "delivered", "drops", "routing_id",
)  # fmt: skip
_peer_figures = attrgetter(*_PEER_FIELDS)
PeerFigures = tuple[str, str, str, str, str, float, float, int, int, int, int, int, int, bytes]


@dataclass(frozen=True, slots=True)
class Capture:
    """What the loop hands the HTTP side: copies, never the rooms (see the module's contract)."""

    taken: float  # the loop's monotonic clock
    wall: float
    started: float
    in_bytes: int
    parts: frozenset[str]
    counters: dict[str, int]
    sent: tuple[int, int, int]  # the outbox's sent messages, sent bytes, queued bytes
    num_peers: int
    num_subscriptions: int
    services: dict[str, dict[str, object]]
    latency: dict[str, tuple[list[tuple[float, int]], float]]
    journal_infos: dict[str, dict[str, object]]
    journal_stores: dict[str, str]
    cluster: dict[str, object] | None
    # (parts)
    peers: list[PeerFigures] = field(default_factory=list)
    peer_extras: dict[str, tuple[int, tuple[str, ...], int, tuple[str, ...], int]] = field(default_factory=dict)
    patterns_of: dict[str, tuple[str, ...]] = field(default_factory=dict)
    closed: tuple[Closed, ...] = ()
    patterns: dict[str, int] = field(default_factory=dict)
    groups: dict[str, dict[str, int]] = field(default_factory=dict)
    topics: list[dict[str, object]] = field(default_factory=list)
    consumers: list[dict[str, object]] = field(default_factory=list)
    mailboxz: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken: float  # the loop's monotonic clock when captured
    varz: dict[str, object]
    connections: list[dict[str, object]]  # every open connection (as /connz shows it, without subscriptions)
    subsz: dict[str, object]
    servicez: dict[str, dict[str, object]]
    closed: list[dict[str, object]] = field(default_factory=list)  # the last closed connections, newest first
    subscriptions_of: dict[str, list[str]] = field(default_factory=dict)  # peer name -> its patterns (?subs=1)
    consumerz: dict[str, object] = field(default_factory=dict)
    journalz: dict[str, object] = field(default_factory=dict)
    mailboxz: dict[str, object] = field(default_factory=dict)
    # service -> (cumulative bucket counts as (upper bound, count) ending with +Inf, sum of seconds)
    latency: dict[str, tuple[list[tuple[float, int]], float]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    parts: frozenset[str] = ALL_PARTS  # what its capture copied


def rfc3339(wall: float) -> str:
    """Wall-clock seconds as RFC 3339 UTC with milliseconds (``2025-01-31T12:00:00.123Z``)."""
    return datetime.fromtimestamp(wall, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _closed_row(entry: Closed, wall_of: float) -> dict[str, object]:
    """A closed connection (``wall_of``: add to the loop's clock for wall-clock seconds)."""
    return {
        "name": entry.name,
        "identity": entry.identity,
        "dialect": entry.dialect,
        "protocol": entry.protocol,
        "address": entry.address,
        "connected_at": rfc3339(entry.connected + wall_of),
        "closed_at": rfc3339(entry.closed + wall_of),
        "uptime_s": round(max(0.0, entry.closed - entry.connected), 3),
        "reason": entry.reason,
        "msgs_in": entry.msgs_in,
        "bytes_in": entry.bytes_in,
        "msgs_out": entry.msgs_out,
        "bytes_out": entry.bytes_out,
        "delivered": entry.delivered,
        "dropped": entry.dropped,
    }


# ============================================================== the loop's side


def capture(
    core: BrokerCore,
    outbox: QueueFigures,
    parts: Collection[str] = ALL_PARTS,
    *,
    now: float,
    started: float,
    wall: float,
    in_bytes: int,
    cluster: dict[str, object] | None = None,
) -> Capture:
    """What the pages of ``parts`` need, copied as of ``now`` (``started``: the loop's clock at
    start; ``wall``: wall-clock seconds now; ``in_bytes``: the message bytes the shell has
    received; ``cluster``: the cluster link's state, if any).  Costs O(peers) only for ``connz``
    (one C call and four lookups per peer), O(patterns held) only for ``subs``, O(consumers) for
    ``consumerz``; the rest is O(services + journals)."""
    rpc = core.rpc
    pubsub = core.pubsub
    parts = frozenset(parts)
    services = {name: core.builtins.service_report(service) for name, service in rpc.services.items()}
    peers: list[PeerFigures] = []
    extras: dict[str, tuple[int, tuple[str, ...], int, tuple[str, ...], int]] = {}
    patterns_of: dict[str, tuple[str, ...]] = {}
    if CONNZ in parts:
        known = list(core.peers.by_id.values())
        peers = list(map(_peer_figures, known))
        extras = _peer_extras(core, outbox, known)
        if SUBS in parts:
            patterns_of = {peer.name: tuple(pubsub.patterns_of(peer)) for peer in known}
    return Capture(
        taken=now,
        wall=wall,
        started=started,
        in_bytes=in_bytes,
        parts=parts,
        counters=dict(core.counters),
        sent=(outbox.sent_messages, outbox.sent_bytes, outbox.queued_bytes),
        num_peers=len(core.peers.by_id),
        num_subscriptions=len(pubsub.subscriptions),
        services=services,
        latency={name: (s.latency.cumulative(), s.latency.sum) for name, s in rpc.services.items()},
        journal_infos={name: journal.info() for name, journal in core.journaling.journals.items()},
        journal_stores={name: journal.settings.store for name, journal in core.journaling.journals.items()},
        cluster=cluster,
        peers=peers,
        peer_extras=extras,
        patterns_of=patterns_of,
        closed=tuple(core.peers.closed) if CLOSED in parts else (),
        patterns=dict(pubsub.subscribers_per_pattern) if SUBSZ in parts else {},
        groups=pubsub.group_report() if SUBSZ in parts else {},
        topics=core.traffic.report() if SUBSZ in parts else [],
        consumers=core.consumers.monitor_rows() if CONSUMERZ in parts else [],
        mailboxz=(
            {"summary": core.mailboxes.summary(), "mailboxes": core.mailboxes.report()} if MAILBOXZ in parts else {}
        ),
    )


def _peer_extras(
    core: BrokerCore, outbox: QueueFigures, known: Iterable[Peer]
) -> dict[str, tuple[int, tuple[str, ...], int, tuple[str, ...], int]]:
    """Per peer what other rooms keep of it: (subscriptions, queue groups, queued bytes, services,
    requests in flight); only peers with groups or services cost more than three lookups."""
    count_of = core.pubsub.count_of
    groups_of = core.pubsub.groups_of
    worker_state = core.rpc.worker_state
    backlog = outbox.backlog
    extras = {}
    for peer in known:
        state = worker_state(peer)
        extras[peer.name] = (
            count_of(peer),
            tuple(groups_of(peer)),
            backlog(peer.routing_id),
            tuple(state.services) if state else (),
            len(state.jobs) if state else 0,
        )
    return extras


# ============================================================== the HTTP side


def build(cap: Capture) -> Snapshot:
    """The pages' data from a capture (the HTTP thread's work: rows, times, sorting)."""
    now = cap.taken
    wall_of = cap.wall - now
    counters = dict(sorted(cap.counters.items()))
    services = dict(sorted(cap.services.items()))
    rows = _connections(cap, wall_of)
    closed = [_closed_row(entry, wall_of) for entry in reversed(cap.closed)]
    sent_messages, sent_bytes, queued_bytes = cap.sent
    varz: dict[str, object] = {
        "now": rfc3339(cap.wall),
        "now_s": round(cap.wall, 3),
        "start": rfc3339(cap.started + wall_of),
        "uptime_s": round(now - cap.started, 3),
        "connections": cap.num_peers,
        "subscriptions": cap.num_subscriptions,
        "services": len(services),
        "in_msgs": counters.get("received", 0),
        "in_bytes": cap.in_bytes,
        "out_msgs": sent_messages,
        "out_bytes": sent_bytes,
        "published": counters.get("published", 0),
        "delivered": counters.get("delivered", 0),
        "dropped": counters.get("dropped", 0),
        "slow_consumers": counters.get("forgotten_too_slow", 0),
        "pending_bytes": queued_bytes,
        # RPC over every service: requests taken, and those that failed (an ERROR answer or a timeout).
        "rpc_requests": sum(int(s["requests"]) for s in services.values()),  # type: ignore[call-overload]
        "rpc_errors": sum(int(s["errors"]) + int(s["timeouts"]) for s in services.values()),  # type: ignore[call-overload]
        # Messages refused (every 4xx/5xx answered to a peer) and internal errors.
        "errors": sum(n for k, n in counters.items() if k.startswith("rejected_")) + counters.get("internal_errors", 0),
        "closed_connections": len(cap.closed),
        "journals": cap.journal_infos,
        "counters": counters,
        "cluster": cap.cluster if cap.cluster is not None else {"name": "", "nats_connected": False, "brokers": []},
    }
    subsz: dict[str, object] = {
        "subscriptions": cap.num_subscriptions,
        "patterns": dict(sorted(cap.patterns.items())),
        "groups": cap.groups,
        "topics": cap.topics,  # the busiest topics published to since the start (messages, bytes)
    }
    return Snapshot(
        taken=now,
        varz=varz,
        connections=rows,
        subsz=subsz,
        servicez=services,
        closed=closed,
        subscriptions_of={name: sorted(patterns) for name, patterns in cap.patterns_of.items()},
        consumerz={"consumers": cap.consumers},
        journalz=_journalz(cap.journal_infos, cap.journal_stores),
        mailboxz=cap.mailboxz,
        latency=cap.latency,
        counters=counters,
        parts=cap.parts,
    )


def snapshot(
    core: BrokerCore,
    outbox: QueueFigures,
    *,
    now: float,
    started: float,
    wall: float,
    in_bytes: int,
    cluster: dict[str, object] | None = None,
) -> Snapshot:
    """Every page's data as of ``now``: ``build(capture(...))`` with every part."""
    return build(
        capture(core, outbox, ALL_PARTS, now=now, started=started, wall=wall, in_bytes=in_bytes, cluster=cluster)
    )


def _connections(cap: Capture, wall_of: float) -> list[dict[str, object]]:
    """/connz's open connections, by name."""
    now = cap.taken
    extras = cap.peer_extras
    rows: list[dict[str, object]] = []
    for figures in cap.peers:
        name, identity, dialect, version, address, connected, last_recv = figures[:7]
        msgs_in, bytes_in, msgs_out, bytes_out, delivered, drops = figures[7:13]
        subscriptions, groups, pending, services, in_flight = extras[name]
        rows.append(
            {
                "name": name,
                "identity": identity,
                "dialect": dialect,
                "protocol": version,
                "address": address,
                "connected_at": rfc3339(connected + wall_of),
                "uptime_s": round(max(0.0, now - connected), 3),
                "subscriptions": subscriptions,  # (with ?subs=1: the patterns themselves)
                "num_subscriptions": subscriptions,
                "groups": sorted(groups),
                "pending_bytes": pending,
                "idle_s": round(max(0.0, now - last_recv), 3),
                "msgs_in": msgs_in,
                "bytes_in": bytes_in,
                "msgs_out": msgs_out,
                "bytes_out": bytes_out,
                "delivered": delivered,
                "dropped": drops,
                "services": list(services),
                "in_flight": in_flight,
            }
        )
    rows.sort(key=lambda r: str(r["name"]))
    return rows


def _journalz(infos: dict[str, dict[str, object]], stores: dict[str, str]) -> dict[str, object]:
    """/journalz: each journal's store, first and last seq, and the rest of its info."""
    return {
        "journals": [
            {
                "name": name,
                "store": stores[name],
                "first_seq": info.get("first_seq", 0),
                "last_seq": int(info.get("next_seq", 1)) - 1,  # type: ignore[call-overload]
                **{k: v for k, v in info.items() if k not in ("first_seq",)},
            }
            for name, info in sorted(infos.items())
        ]
    }


# ============================================================== paged pages and their parameters


class BadQuery(ValueError):
    """A query a page cannot answer (the HTTP side answers 400 with its text: one line naming the parameter)."""


@dataclass(frozen=True, slots=True)
class Parameter:
    """One query parameter of a page: a number (ASCII digits, at most ``most``), one of ``choices``,
    or free text (at most ``FILTER_MAX`` printable characters)."""

    kind: str  # "number" | "choice" | "text"
    most: int = 0
    choices: tuple[str, ...] = ()

    def read(self, name: str, text: str) -> int | str:
        if self.kind == "number":
            if not (text.isascii() and text.isdigit() and len(text) <= NUMBER_DIGITS) or int(text) > self.most:
                raise BadQuery(f"{name} must be a whole number 0-{self.most} (ASCII digits), got {text[:20]!r}")
            return int(text)
        if self.kind == "choice":
            if text not in self.choices:
                raise BadQuery(f"{name} must be one of {', '.join(self.choices)}, got {text[:20]!r}")
            return text
        if len(text) > FILTER_MAX or not text.isprintable():
            raise BadQuery(f"{name} must be at most {FILTER_MAX} printable characters")
        return text


_LIMIT = Parameter("number", most=PAGE_MAX_LIMIT)
_OFFSET = Parameter("number", most=10**NUMBER_DIGITS - 1)
_FILTER = Parameter("text")
_FLAG = Parameter("choice", choices=("", "0", "1", "true", "false", "detail"))
_ORDER = Parameter("choice", choices=("asc", "desc"))
MAX_AGE_MOST = 10_000  # ms: the oldest snapshot ``max_age_ms`` may accept
# Every page takes ``max_age_ms``: a snapshot taken at most that long before the request will do (default 0:
# one taken after the request arrived).  The console asks so for a sort, a page or a filter of what it shows.
COMMON_PARAMETERS: dict[str, Parameter] = {"max_age_ms": Parameter("number", most=MAX_AGE_MOST)}
# Each paged page's parameters (a parameter not named here is left to the HTTP side's rules).
PAGE_PARAMETERS: dict[str, dict[str, Parameter]] = {
    "/connz": {
        "state": Parameter("choice", choices=CONNZ_STATES),
        "sort": Parameter("choice", choices=(*CONNZ_NUMBERS, *CONNZ_TEXTS, "closed_at", "subscriptions")),
        "limit": _LIMIT,
        "offset": _OFFSET,
        "subs": _FLAG,
        "filter": _FILTER,
        "order": _ORDER,
    },
    "/subsz": {
        "sort": Parameter("choice", choices=SUBSZ_SORTS),
        "limit": _LIMIT,
        "offset": _OFFSET,
        "filter": _FILTER,
        "order": _ORDER,
    },
    "/consumerz": {
        "sort": Parameter("choice", choices=(*CONSUMERZ_NUMBERS, *CONSUMERZ_TEXTS)),
        "limit": _LIMIT,
        "offset": _OFFSET,
        "filter": _FILTER,
        "order": _ORDER,
    },
}


def parameters(path: str, query: dict[str, str]) -> dict[str, int | str]:
    """``query``'s parameters of ``path`` read by its table (an empty value: not given); BadQuery
    naming the first one that is wrong."""
    table = {**COMMON_PARAMETERS, **PAGE_PARAMETERS.get(path, {})}
    read: dict[str, int | str] = {}
    for name, spec in table.items():
        text = query.get(name)
        if text:
            read[name] = spec.read(name, text)
    return read


def _matching(rows: list[dict[str, object]], needle: str, keys: tuple[str, ...]) -> list[dict[str, object]]:
    """The rows one of whose ``keys`` holds ``needle`` (case-insensitive)."""
    if not needle:
        return rows
    needle = needle.casefold()
    return [r for r in rows if any(needle in str(r.get(k, "")).casefold() for k in keys)]


def _ordered(
    rows: list[dict[str, object]],
    sort: str,
    numbers: tuple[str, ...],
    name: Callable[[dict[str, object]], str],
    order: str | None = None,
) -> list[dict[str, object]]:
    """Numbers descending (the busiest first), text ascending, unless ``order`` says; ties by name."""
    if sort in numbers:
        ordered = sorted(rows, key=lambda r: (-float(r.get(sort, 0)), name(r)))  # type: ignore[arg-type]
        return ordered[::-1] if order == "asc" else ordered
    ordered = sorted(rows, key=lambda r: (str(r.get(sort, "")), name(r)))
    return ordered[::-1] if order == "desc" else ordered


def _page_of(read: dict[str, int | str], most: int = PAGE_MAX_LIMIT) -> tuple[int, int]:
    limit = int(read["limit"]) if "limit" in read else min(PAGE_DEFAULT_LIMIT, most)
    if limit > most:
        raise BadQuery(f"limit must be a whole number 0-{most} with this query, got {limit}")
    return limit, int(read.get("offset", 0))


CONNZ_FILTERED = ("name", "identity", "address", "dialect", "protocol", "reason")


def connz(snap: Snapshot, query: dict[str, str]) -> dict[str, object]:
    """/connz for ``query`` (``state`` open|closed|all, ``sort`` a field, ``limit``, ``offset``,
    ``filter`` (a substring of a connection's name, identity, address, dialect, protocol or close
    reason), ``subs`` 1: each open connection's ``subscriptions`` are its patterns, not their count,
    which ``num_subscriptions`` always has); BadQuery otherwise."""
    read = parameters("/connz", query)
    state = str(read.get("state", "open"))
    sort = str(read.get("sort", "closed_at" if state == "closed" else "name"))
    sort = "num_subscriptions" if sort == "subscriptions" else sort
    subs = read.get("subs", "") in ("1", "true", "detail")
    limit, offset = _page_of(read, SUBS_MAX_LIMIT if subs else PAGE_MAX_LIMIT)
    rows = (snap.connections if state != "closed" else []) + (snap.closed if state != "open" else [])
    rows = _matching(rows, str(read.get("filter", "")), CONNZ_FILTERED)
    order = read.get("order")
    if sort == "closed_at":
        ordered = sorted(rows, key=lambda r: str(r.get("closed_at", "")), reverse=order != "asc")
    else:
        ordered = _ordered(rows, sort, CONNZ_NUMBERS, lambda r: str(r["name"]), str(order) if order else None)
    page = ordered[offset : offset + limit]
    if subs:
        page = [
            {**r, "subscriptions": snap.subscriptions_of.get(str(r["name"]), [])} if "closed_at" not in r else r
            for r in page
        ]
    return {
        "now": snap.varz["now"],
        "state": state,
        "sort": sort,
        "count": len(rows),
        "total": len(snap.connections if state == "open" else snap.closed if state == "closed" else rows),
        "offset": offset,
        "limit": limit,
        "num_connections": len(page),
        "connections": page,
    }


def subsz(snap: Snapshot, query: dict[str, str]) -> dict[str, object]:
    """/subsz for ``query``: ``patterns`` (subscribers per pattern) is a page, sorted by ``sort``
    (pattern, or subscribers: the most first), ``filter`` a substring of the pattern;
    ``num_patterns`` counts those that matched the filter."""
    read = parameters("/subsz", query)
    limit, offset = _page_of(read)
    sort = str(read.get("sort", "pattern"))
    patterns: dict[str, int] = snap.subsz.get("patterns", {})  # type: ignore[assignment]
    needle = str(read.get("filter", "")).casefold()
    items = [(p, n) for p, n in patterns.items() if needle in p.casefold()] if needle else list(patterns.items())
    if sort == "subscribers":
        items.sort(key=lambda pn: (-pn[1], pn[0]))  # (patterns is sorted by pattern already)
    if read.get("order") == ("asc" if sort == "subscribers" else "desc"):
        items.reverse()
    return {
        **snap.subsz,
        "sort": sort,
        "num_patterns": len(items),
        "offset": offset,
        "limit": limit,
        "patterns": dict(items[offset : offset + limit]),
    }


CONSUMERZ_FILTERED = ("name", "journal", "owner")


def consumerz(snap: Snapshot, query: dict[str, str]) -> dict[str, object]:
    """/consumerz for ``query``: a page of the consumers sorted by ``sort`` (journal then name by
    default), ``filter`` a substring of a consumer's name, journal or owner; ``count`` counts those
    that matched."""
    read = parameters("/consumerz", query)
    limit, offset = _page_of(read)
    rows: list[dict[str, object]] = snap.consumerz.get("consumers", [])  # type: ignore[assignment]
    rows = _matching(rows, str(read.get("filter", "")), CONSUMERZ_FILTERED)
    sort = read.get("sort")
    order = read.get("order")
    if sort is not None:
        key = CONSUMERZ_NUMBERS
        rows = _ordered(rows, str(sort), key, lambda r: f"{r['journal']}\0{r['name']}", str(order) if order else None)
    elif order == "desc":
        rows = rows[::-1]
    return {"count": len(rows), "offset": offset, "limit": limit, "consumers": rows[offset : offset + limit]}
