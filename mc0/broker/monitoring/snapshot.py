"""Monitoring snapshots: what ``/varz``, ``/connz``, ``/subsz``, ``/servicez``, ``/consumerz``, ``/journalz``,
``/mailboxz`` and ``/metrics`` show.

Contract: ``snapshot(core, outbox, now=..., started=..., wall=...)`` reads
the broker's rooms and returns one self-contained, JSON-ready ``Snapshot``
(plain dicts, lists and numbers, histogram counts copied), so the HTTP
thread can serve it while the loop goes on changing the rooms.  It is built
on the broker loop, only when the HTTP side asked for one (so an idle
monitor costs nothing); the cost is one walk over peers, subscription
patterns, services, consumers and journals.  Pure: the clock is passed in,
no I/O, changes nothing.  Peers are named as ``Peer.name`` (``identity#n``),
never by routing id.  Times people read are RFC 3339 UTC (``rfc3339``);
``/connz``'s sorting and paging are the HTTP side's (:func:`connz`), over
every row the snapshot holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from ..core.dispatch import BrokerCore
from ..core.peers import Closed
from .queries import CONNZ_NUMBERS, Value


class QueueFigures(Protocol):
    """What a snapshot reads of the shell's outgoing queues (``mc0.broker.outbox.Outbox`` has it)."""

    sent_messages: int
    sent_bytes: int
    queued_bytes: int

    def backlog(self, routing_id: bytes) -> int: ...


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken: float  # the loop's monotonic clock when built
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
    """Everything the monitor serves, as of ``now`` (``started``: the loop's clock at start;
    ``wall``: wall-clock seconds now, for the timestamps people read; ``in_bytes``: the
    message bytes the shell has received; ``cluster``: the cluster link's state, if any)."""
    wall_of = wall - now
    rpc = core.rpc
    pubsub = core.pubsub
    counters = dict(sorted(core.counters.items()))
    services = {name: core.builtins.service_report(rpc.services[name]) for name in sorted(rpc.services)}
    journal_infos = {name: journal.info() for name, journal in core.journaling.journals.items()}
    rows, subscriptions_of = _connections(core, outbox, now, wall_of)
    closed = [_closed_row(entry, wall_of) for entry in reversed(core.peers.closed)]
    varz: dict[str, object] = {
        "now": rfc3339(wall),
        "now_s": round(wall, 3),
        "start": rfc3339(started + wall_of),
        "uptime_s": round(now - started, 3),
        "connections": len(rows),
        "subscriptions": len(pubsub.subscriptions),
        "services": len(rpc.services),
        "in_msgs": counters.get("received", 0),
        "in_bytes": in_bytes,
        "out_msgs": outbox.sent_messages,
        "out_bytes": outbox.sent_bytes,
        "published": counters.get("published", 0),
        "delivered": counters.get("delivered", 0),
        "dropped": counters.get("dropped", 0),
        "slow_consumers": counters.get("forgotten_too_slow", 0),
        "pending_bytes": outbox.queued_bytes,
        # RPC over every service: requests taken, and those that failed (an ERROR answer or a 504: each once).
        "rpc_requests": sum(int(s["requests"]) for s in services.values()),  # type: ignore[call-overload]
        "rpc_errors": sum(int(s["errors"]) + int(s["timeouts"]) for s in services.values()),  # type: ignore[call-overload]
        # Messages refused (every 4xx/5xx answered to a peer) and internal errors.
        "errors": sum(n for k, n in counters.items() if k.startswith("rejected_")) + counters.get("internal_errors", 0),
        "closed_connections": len(closed),
        "journals": journal_infos,
        "counters": counters,
        "cluster": cluster if cluster is not None else {"name": "", "nats_connected": False, "brokers": []},
    }
    subsz: dict[str, object] = {
        "subscriptions": len(pubsub.subscriptions),
        "patterns": pubsub.report(),
        "groups": pubsub.group_report(),
        "topics": core.traffic.report(),  # the busiest topics published to since the start (messages, bytes)
    }
    return Snapshot(
        taken=now,
        varz=varz,
        connections=rows,
        subsz=subsz,
        servicez=services,
        closed=closed,
        subscriptions_of=subscriptions_of,
        consumerz={"consumers": core.consumers.monitor_rows()},
        journalz=_journalz(core, journal_infos),
        mailboxz={"summary": core.mailboxes.summary(), "mailboxes": core.mailboxes.report()},
        latency={name: (s.latency.cumulative(), s.latency.sum) for name, s in rpc.services.items()},
        counters=counters,
    )


def _connections(
    core: BrokerCore, outbox: QueueFigures, now: float, wall_of: float
) -> tuple[list[dict[str, object]], dict[str, list[str]]]:
    """/connz's open connections, by name, and each one's subscription patterns (for ``?subs=1``)."""
    pubsub = core.pubsub
    rows: list[dict[str, object]] = []
    subscriptions_of: dict[str, list[str]] = {}
    for peer in core.peers.by_id.values():
        state = core.rpc.worker_state(peer)
        rows.append(
            {
                "name": peer.name,
                "identity": peer.identity,
                "dialect": peer.dialect.name,
                "protocol": peer.version,
                "address": peer.address,
                "connected_at": rfc3339(peer.connected + wall_of),
                "uptime_s": round(max(0.0, now - peer.connected), 3),
                "subscriptions": pubsub.count_of(peer),  # (with ?subs=1: the patterns themselves)
                "num_subscriptions": pubsub.count_of(peer),
                "groups": sorted(pubsub.groups_of(peer)),
                "pending_bytes": outbox.backlog(peer.routing_id),
                "idle_s": round(max(0.0, now - peer.last_recv), 3),
                "msgs_in": peer.msgs_in,
                "bytes_in": peer.bytes_in,
                "msgs_out": peer.msgs_out,
                "bytes_out": peer.bytes_out,
                "delivered": peer.delivered,
                "dropped": peer.drops,
                "services": list(state.services) if state else [],
                "in_flight": len(state.jobs) if state else 0,
            }
        )
        subscriptions_of[peer.name] = sorted(pubsub.patterns_of(peer))
    rows.sort(key=lambda r: str(r["name"]))
    return rows, subscriptions_of


def _journalz(core: BrokerCore, infos: dict[str, dict[str, object]]) -> dict[str, object]:
    """/journalz: each journal's store, first and last seq, and the rest of its info."""
    journals = core.journaling.journals
    return {
        "journals": [
            {
                "name": name,
                "store": journals[name].settings.store,
                "first_seq": info.get("first_seq", 0),
                "last_seq": int(info.get("next_seq", 1)) - 1,  # type: ignore[call-overload]
                **{k: v for k, v in info.items() if k not in ("first_seq",)},
            }
            for name, info in sorted(infos.items())
        ]
    }


def connz(snap: Snapshot, query: Mapping[str, Value]) -> dict[str, object]:
    """/connz for ``query``, parsed by :func:`.queries.parse_query` (``state`` open|closed|all,
    ``sort`` a field, ``limit``, ``offset``, ``subs``: each open connection's ``subscriptions`` are its
    patterns, not their count, which ``num_subscriptions`` always has)."""
    state = str(query["state"])
    sort = str(query["sort"]) or ("closed_at" if state == "closed" else "name")
    sort = "num_subscriptions" if sort == "subscriptions" else sort
    limit, offset, subs = int(query["limit"]), int(query["offset"]), bool(query["subs"])
    rows = (snap.connections if state != "closed" else []) + (snap.closed if state != "open" else [])
    if sort in CONNZ_NUMBERS:
        ordered = sorted(rows, key=lambda r: (-float(r.get(sort, 0)), str(r["name"])))  # type: ignore[arg-type]
    elif sort == "closed_at":
        ordered = sorted(rows, key=lambda r: str(r.get("closed_at", "")), reverse=True)
    else:
        ordered = sorted(rows, key=lambda r: (str(r.get(sort, "")), str(r["name"])))
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
        "offset": offset,
        "limit": limit,
        "num_connections": len(page),
        "connections": page,
    }
