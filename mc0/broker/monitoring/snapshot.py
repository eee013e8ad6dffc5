"""Monitoring snapshots: what ``/varz``, ``/connz``, ``/subsz``, ``/servicez`` and ``/metrics`` show.

Contract: ``snapshot(core, outbox, now=..., started=..., wall=...)`` reads
the broker's rooms and returns one self-contained, JSON-ready ``Snapshot``
(plain dicts, lists and numbers, histogram counts copied), so the HTTP
thread can serve it while the loop goes on changing the rooms.  It is built
on the broker loop, only when the HTTP side asked for one (so an idle
monitor costs nothing); the cost is one walk over peers, subscription
patterns and services.  Pure: the clock is passed in, no I/O, changes
nothing.  Peers are named ``identity#n``, never by routing id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..core.dispatch import BrokerCore


class QueueFigures(Protocol):
    """What a snapshot reads of the shell's outgoing queues (``mc0.broker.outbox.Outbox`` has it)."""

    sent_messages: int
    sent_bytes: int
    queued_bytes: int

    def backlog(self, routing_id: bytes) -> int: ...


# /connz lists at most this many peers (the busiest by pending bytes first); the count is exact.
CONNZ_LIMIT = 1_000


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken: float  # the loop's monotonic clock when built
    varz: dict[str, object]
    connz: dict[str, object]
    subsz: dict[str, object]
    servicez: dict[str, dict[str, object]]
    # service -> (cumulative bucket counts as (upper bound, count) ending with +Inf, sum of seconds)
    latency: dict[str, tuple[list[tuple[float, int]], float]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)


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
    peers = list(core.peers.by_id.values())
    rpc = core.rpc
    pubsub = core.pubsub
    counters = dict(sorted(core.counters.items()))
    services = {name: core.builtins.service_report(rpc.services[name]) for name in sorted(rpc.services)}
    journals = {name: journal.info() for name, journal in core.streams.journals.items()}
    varz: dict[str, object] = {
        "now": round(wall, 3),
        "uptime_s": round(now - started, 3),
        "connections": len(peers),
        "subscriptions": len(pubsub.subscriptions),
        "services": len(rpc.services),
        "in_msgs": counters.get("received", 0),
        "in_bytes": in_bytes,
        "out_msgs": outbox.sent_messages,
        "out_bytes": outbox.sent_bytes,
        "delivered": counters.get("delivered", 0),
        "dropped": counters.get("dropped", 0),
        "slow_consumers": counters.get("forgotten_slow", 0),
        "pending_bytes": outbox.queued_bytes,
        "journals": journals,
        "counters": counters,
        "cluster": cluster if cluster is not None else {"name": "", "nats_connected": False, "brokers": []},
    }
    rows = []
    for peer in peers:
        state = rpc.worker_state(peer)
        rows.append(
            {
                "name": peer.name,
                "identity": peer.identity,
                "dialect": peer.dialect.name,
                "protocol": peer.version,
                "subscriptions": pubsub.count_of(peer),
                "groups": sorted(pubsub.groups_of(peer)),
                "pending_bytes": outbox.backlog(peer.routing_id),
                "idle_s": round(max(0.0, now - peer.last_recv), 3),
                "delivered": peer.delivered,
                "dropped": peer.drops,
                "services": list(state.services) if state else [],
                "in_flight": len(state.jobs) if state else 0,
            }
        )
    rows.sort(key=lambda r: (-int(r["pending_bytes"]), str(r["name"])))  # type: ignore[call-overload]
    connz: dict[str, object] = {"count": len(rows), "limit": CONNZ_LIMIT, "connections": rows[:CONNZ_LIMIT]}
    subsz: dict[str, object] = {
        "subscriptions": len(pubsub.subscriptions),
        "patterns": pubsub.report(),
        "groups": pubsub.group_report(),
    }
    latency = {name: (s.latency.cumulative(), s.latency.sum) for name, s in rpc.services.items()}
    return Snapshot(
        taken=now,
        varz=varz,
        connz=connz,
        subsz=subsz,
        servicez=services,
        latency=latency,
        counters=counters,
    )
