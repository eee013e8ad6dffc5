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
(:func:`connz`, :func:`subsz`, :func:`consumerz`): each takes its query as
parsed by :func:`.queries.parse_query` (the one table of every parameter of
every page, which refuses what the docs do not promise): ``sort``, ``order``,
``limit`` (settled there), ``offset`` and ``filter`` (a case-insensitive
substring of the row's names).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, Protocol

from ..core.dispatch import BrokerCore
from ..core.peers import Closed
from .queries import CONNZ_NUMBERS, CONSUMERZ_NUMBERS, Value

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

    def backlogs(self) -> dict[bytes, int]: ...


# A peer's figures, read in one C call per peer: the order of ``_PEER_FIELDS`` is the tuple's.
_PEER_FIELDS = (
    "name", "identity", "dialect.name", "version", "address", "connected", "last_recv",
    "msgs_in", "bytes_in", "msgs_out", "bytes_out", "delivered", "drops", "routing_id",
)  # fmt: skip
_peer_figures = attrgetter(*_PEER_FIELDS)
PeerFigures = tuple[Any, ...]  # (str x5, float x2, int x6, bytes): the fields above, in order
NAME, IDENTITY, DIALECT, VERSION, ADDRESS, CONNECTED, LAST_RECV = range(7)
# (the counters' places in a PeerFigures, by /connz field)
_COUNTER_AT = {"msgs_in": 7, "bytes_in": 8, "msgs_out": 9, "bytes_out": 10, "delivered": 11, "dropped": 12}


@dataclass(frozen=True, slots=True)
class PeerExtras:
    """What other rooms keep of the peers, only for the peers that have any (by name; queued bytes by
    routing id)."""

    subscriptions: dict[str, int]
    groups: dict[str, tuple[str, ...]]
    pending: dict[bytes, int]
    workers: dict[str, tuple[tuple[str, ...], int]]  # services, requests in flight


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
    extras: PeerExtras | None = None
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
    peers: list[PeerFigures]  # every open connection's figures (/connz sorts, filters and pages these)
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
    extras: PeerExtras | None = None
    wall_of: float = 0.0  # add to the loop's clock for wall-clock seconds

    @property
    def connections(self) -> list[dict[str, object]]:
        """Every open connection as /connz shows it (without subscriptions), by name."""
        return [_connection_row(self, figures) for figures in sorted(self.peers)]


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
    extras = None
    patterns_of: dict[str, tuple[str, ...]] = {}
    if CONNZ in parts:
        known = list(core.peers.by_id.values())
        peers = list(map(_peer_figures, known))
        extras = _peer_extras(core, outbox)
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
        journal_infos=core.journaling.journal_info(),
        journal_stores={journal.name: journal.settings.store for journal in core.journaling.every_journal()},
        cluster=cluster,
        peers=peers,
        extras=extras,
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


def _peer_extras(core: BrokerCore, outbox: QueueFigures) -> PeerExtras:
    """What the other rooms keep of the peers, from each room's own table (one pass over the peers
    that hold subscriptions; the rest over the few in groups, serving, or with bytes queued)."""
    return PeerExtras(
        subscriptions={peer.name: n for peer, n in core.pubsub.subscription_counts().items()},
        groups={peer.name: groups for peer, groups in core.pubsub.grouped_peers().items()},
        pending=outbox.backlogs(),
        workers={peer.name: (tuple(state.services), len(state.jobs)) for peer, state in core.rpc.workers.items()},
    )


# ============================================================== the HTTP side


def build(cap: Capture) -> Snapshot:
    """The pages' data from a capture (the HTTP thread's work: rows, times, sorting)."""
    now = cap.taken
    wall_of = cap.wall - now
    counters = dict(sorted(cap.counters.items()))
    services = dict(sorted(cap.services.items()))
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
        # RPC over every service: requests taken, and those that failed (an ERROR answer or a 504: each once).
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
        peers=cap.peers,
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
        extras=cap.extras,
        wall_of=wall_of,
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


_NO_EXTRAS = PeerExtras({}, {}, {}, {})


def _connection_row(snap: Snapshot, figures: PeerFigures) -> dict[str, object]:
    """One open connection as /connz shows it (built for the rows of a page only)."""
    now = snap.taken
    extras = snap.extras or _NO_EXTRAS
    name, identity, dialect, version, address, connected, last_recv = figures[:7]
    msgs_in, bytes_in, msgs_out, bytes_out, delivered, drops, routing_id = figures[7:]
    subscriptions = extras.subscriptions.get(name, 0)
    services, in_flight = extras.workers.get(name, ((), 0))
    return {
        "name": name,
        "identity": identity,
        "dialect": dialect,
        "protocol": version,
        "address": address,
        "connected_at": rfc3339(connected + snap.wall_of),
        "uptime_s": round(max(0.0, now - connected), 3),
        "subscriptions": subscriptions,  # (with ?subs=1: the patterns themselves)
        "num_subscriptions": subscriptions,
        "groups": list(extras.groups.get(name, ())),
        "pending_bytes": extras.pending.get(routing_id, 0),
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


def _open_sort_key(snap: Snapshot, sort: str) -> Callable[[PeerFigures], tuple[Any, ...]]:
    """How /connz sorts open connections by ``sort``, over their figures (numbers negated: descending)."""
    now = snap.taken
    extras = snap.extras or _NO_EXTRAS
    counter = _COUNTER_AT.get(sort)
    if counter is not None:
        place = counter
        return lambda t: (-float(t[place]), t[NAME])
    if sort in ("uptime_s", "connected_at"):  # the longest up first is the earliest connected first
        return lambda t: (float(t[CONNECTED]), t[NAME])
    if sort == "idle_s":
        return lambda t: (-(now - t[LAST_RECV]), t[NAME])
    if sort == "num_subscriptions":
        return lambda t: (-float(extras.subscriptions.get(t[NAME], 0)), t[NAME])
    if sort == "pending_bytes":
        return lambda t: (-float(extras.pending.get(t[-1], 0)), t[NAME])
    if sort == "in_flight":
        return lambda t: (-float(extras.workers.get(t[NAME], ((), 0))[1]), t[NAME])
    text = {"name": NAME, "identity": IDENTITY, "dialect": DIALECT, "protocol": VERSION, "address": ADDRESS}.get(sort)
    if text is not None:
        field_at = text
        return lambda t: (str(t[field_at]), t[NAME])
    return lambda t: ("", t[NAME])  # (a closed connection's field: "reason", "closed_at")


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


# ============================================================== paged pages (their queries: .queries)


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
    order: str,
) -> list[dict[str, object]]:
    """Numbers descending (the busiest first), text ascending, unless ``order`` says; ties by name."""
    if sort in numbers:
        ordered = sorted(rows, key=lambda r: (-float(r.get(sort, 0)), name(r)))  # type: ignore[arg-type]
        return ordered[::-1] if order == "asc" else ordered
    ordered = sorted(rows, key=lambda r: (str(r.get(sort, "")), name(r)))
    return ordered[::-1] if order == "desc" else ordered


CONNZ_FILTERED = ("name", "identity", "address", "dialect", "protocol", "reason")


def connz(snap: Snapshot, query: Mapping[str, Value]) -> dict[str, object]:
    """/connz for ``query``, parsed by :func:`.queries.parse_query` (``state`` open|closed|all,
    ``sort`` a field, ``order``, ``limit``, ``offset``, ``filter`` (a substring of a connection's
    name, identity, address, dialect, protocol or close reason), ``subs``: each open connection's
    ``subscriptions`` are its patterns, not their count, which ``num_subscriptions`` always has).
    Open connections are filtered and sorted as their figures, and only the page's rows are built."""
    state = str(query["state"])
    sort = str(query["sort"]) or ("closed_at" if state == "closed" else "name")
    sort = "num_subscriptions" if sort == "subscriptions" else sort
    limit, offset, subs = int(query["limit"]), int(query["offset"]), bool(query["subs"])
    order = str(query["order"])
    needle = str(query["filter"]).casefold()
    if state == "open":
        peers = snap.peers
        if needle:
            peers = [t for t in peers if any(needle in str(t[i]).casefold() for i in _OPEN_FILTERED)]
        reverse = order == ("asc" if sort in CONNZ_NUMBERS else "desc")
        chosen = sorted(peers, key=_open_sort_key(snap, sort), reverse=reverse)
        count, total = len(chosen), len(snap.peers)
        page = [_connection_row(snap, t) for t in chosen[offset : offset + limit]]
    else:
        rows = (snap.connections if state == "all" else []) + snap.closed
        rows = _matching(rows, needle, CONNZ_FILTERED)
        if sort == "closed_at":
            ordered = sorted(rows, key=lambda r: str(r.get("closed_at", "")), reverse=order != "asc")
        else:
            ordered = _ordered(rows, sort, CONNZ_NUMBERS, lambda r: str(r["name"]), order)
        count, total = len(rows), len(snap.closed) + (len(snap.peers) if state == "all" else 0)
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
        "count": count,
        "total": total,
        "offset": offset,
        "limit": limit,
        "num_connections": len(page),
        "connections": page,
    }


_OPEN_FILTERED = (NAME, IDENTITY, ADDRESS, DIALECT, VERSION)


def subsz(snap: Snapshot, query: Mapping[str, Value]) -> dict[str, object]:
    """/subsz for ``query`` (parsed by :func:`.queries.parse_query`): ``patterns`` (subscribers per
    pattern) is a page, sorted by ``sort`` (pattern, or subscribers: the most first), ``filter`` a
    substring of the pattern; ``num_patterns`` counts those that matched the filter."""
    limit, offset = int(query["limit"]), int(query["offset"])
    sort = str(query["sort"])
    patterns: dict[str, int] = snap.subsz.get("patterns", {})  # type: ignore[assignment]
    needle = str(query["filter"]).casefold()
    items = [(p, n) for p, n in patterns.items() if needle in p.casefold()] if needle else list(patterns.items())
    if sort == "subscribers":
        items.sort(key=lambda pn: (-pn[1], pn[0]))  # (patterns is sorted by pattern already)
    if query["order"] == ("asc" if sort == "subscribers" else "desc"):
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


def consumerz(snap: Snapshot, query: Mapping[str, Value]) -> dict[str, object]:
    """/consumerz for ``query`` (parsed by :func:`.queries.parse_query`): a page of the consumers
    sorted by ``sort`` (journal then name when ""), ``filter`` a substring of a consumer's name,
    journal or owner; ``count`` counts those that matched."""
    limit, offset = int(query["limit"]), int(query["offset"])
    rows: list[dict[str, object]] = snap.consumerz.get("consumers", [])  # type: ignore[assignment]
    rows = _matching(rows, str(query["filter"]), CONSUMERZ_FILTERED)
    sort, order = str(query["sort"]), str(query["order"])
    if sort:
        rows = _ordered(rows, sort, CONSUMERZ_NUMBERS, lambda r: f"{r['journal']}\0{r['name']}", order)
    elif order == "desc":
        rows = rows[::-1]
    return {"count": len(rows), "offset": offset, "limit": limit, "consumers": rows[offset : offset + limit]}
