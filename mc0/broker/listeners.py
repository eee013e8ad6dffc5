"""Listeners: the ways peers reach the broker besides its ROUTER socket, each behind one small interface.

Contract: a :class:`Listener` is polled by the broker loop on its ``socket``;
``receive(core, now)`` hands what arrived to the core and returns what the
core answered; the shell's outbox queues what the core says to the
listener's own peers (``owns`` tells them by routing id) and ``flush`` sends
what is queued for one of them; ``forgotten`` is told when the core forgot
one; ``turn`` is called once a loop turn (what the listener owes peers
without being asked).  ``start`` opens it (once the ROUTER is bound, so its
endpoints are known), ``close`` is idempotent, and ``status`` is what
monitoring shows of it.  The ROUTER side is the default: whatever no
listener owns goes out of the ROUTER socket (:mod:`mc0.broker.sender`).
A listener that stopped within its time budget with work in hand says so
(``unfinished``): the loop then calls ``receive`` again next turn, without
waiting for its socket.

Two listeners: :class:`NngListener` (MemoDB clients and workers over NNG,
:mod:`mc0.broker.nngbridge`) and :class:`ClusterListener` (the other brokers
of a cluster over NATS, :mod:`mc0.broker.cluster.link`; what crosses is
decided by :mod:`mc0.broker.core.routeinput`).
"""

from __future__ import annotations

import logging
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Protocol

import zmq

from ..errors import ConfigError
from ..message import Record
from ..protocol import batch
from ..protocol import routes as route_wire
from ..protocol.journalrecords import decode_payload
from ..settings import Config
from .cluster.link import (
    RECORD_SLACK_BYTES,
    ClusterLink,
    Hello,
    Inbound,
    LinkChange,
    RouteBlob,
    RouteResync,
    RoutesDropped,
)
from .core import routeinput
from .core.dispatch import BrokerCore, Out
from .core.routes import ROUTE_PREFIX, is_route_id
from .jetstream import fromstore
from .jetstream.replicated import ReplicatedJournal
from .jetstream.streams import Acks, Answer, Failed, FeedStatus, Records, StreamState, specs_of
from .nngbridge import NngBridge
from .outbox import Outbox

log = logging.getLogger("mc0.broker")

# Seconds of a loop turn spent on what the cluster link received (as server.WALK_BUDGET for a client's
# batches): the rest waits in the link's queue, bounded by its credit (cluster/credit.py), for the next turn.
ROUTE_WALK_BUDGET = 0.01
# ... on the broker's own asyncio loop (the link hosted there): a turn then comes between two of nats-py's reads
# of the socket, so a shorter budget keeps NATS read (its PONGs, the traffic behind it) while a burst is walked.
HOSTED_WALK_BUDGET = 0.002
ROUTE_SLICE = 512  # route records walked between looks at the clock


class Listener(Protocol):
    name: str

    @property
    def socket(self) -> zmq.Socket[bytes] | int | None:
        """What the loop polls for this listener (a zmq socket, or a file descriptor)."""

    @property
    def unfinished(self) -> bool: ...

    def start(self, context: zmq.Context[Any], endpoints: list[str], core: BrokerCore) -> None: ...

    def receive(self, core: BrokerCore, now: float) -> list[Out]: ...

    def owns(self, routing_id: bytes) -> bool: ...

    def flush(self, core: BrokerCore, outbox: Outbox, routing_id: bytes, now: float) -> list[Out]: ...

    def forgotten(self, routing_id: bytes) -> None: ...

    def turn(self, core: BrokerCore, now: float) -> list[Out]: ...

    def status(self, core: BrokerCore, now: float) -> dict[str, object]: ...

    def close(self) -> None: ...


class NngListener:
    """MemoDB (seed 003) over NNG req/rep: the bridge thread and the pure dialect behind it."""

    name = "memodb"

    def __init__(self, bridge: NngBridge) -> None:
        self.bridge = bridge

    @property
    def socket(self) -> zmq.Socket[bytes] | None:
        return self.bridge.socket

    @property
    def unfinished(self) -> bool:
        return False

    def start(self, context: zmq.Context[Any], endpoints: list[str], core: BrokerCore) -> None:
        self.bridge.start(context)  # ConfigError (names memodb.listen) when it cannot listen

    def receive(self, core: BrokerCore, now: float) -> list[Out]:
        return self.bridge.receive(core.dialect_ops, now)

    def owns(self, routing_id: bytes) -> bool:
        return self.bridge.memodb.owns(routing_id)

    def flush(self, core: BrokerCore, outbox: Outbox, routing_id: bytes, now: float) -> list[Out]:
        return self.bridge.flush(core.dialect_ops, outbox, routing_id, now)

    def forgotten(self, routing_id: bytes) -> None:
        self.bridge.forgotten(routing_id)  # its waiting NNG request is answered

    def turn(self, core: BrokerCore, now: float) -> list[Out]:
        return []

    def status(self, core: BrokerCore, now: float) -> dict[str, object]:
        return {"address": self.bridge.address}

    def close(self) -> None:
        self.bridge.close()


@dataclass(slots=True)
class RouteWalk:
    """A route message being walked a slice at a time: broker ``name``'s (under ``epoch``), from ``pos``."""

    name: str
    epoch: int
    blob: bytes
    pos: int = 0


class ClusterListener:
    """The other brokers of a cluster: route traffic over NATS (``[cluster]``), taken within a time
    budget per loop turn (``ROUTE_WALK_BUDGET``): a long route message is walked a slice at a time
    (``RouteWalk``), and what the link received after it waits in the link's queue meanwhile."""

    name = "cluster"

    def __init__(self, config: Config) -> None:
        self.config = config.cluster
        max_record = config.broker.limits.max_message_bytes + RECORD_SLACK_BYTES  # (what chunks may add up to)
        self.link = ClusterLink(config.cluster, streams=specs_of(config), max_record_bytes=max_record)
        self.broker_name = config.cluster.name
        self.replicated: dict[str, ReplicatedJournal] = {}  # the journals JetStream keeps (their local copies)
        self._routes_told = -1  # the routes' generation the link was last told of
        self._walk: RouteWalk | None = None  # a route message walked in part (its order kept: nothing after it yet)
        self._behind = False  # the last receive left what the link received unread
        self.walk_budget = HOSTED_WALK_BUDGET  # (seconds of a turn: the link runs on the broker's loop)

    @property
    def unfinished(self) -> bool:
        """Received route traffic is left for the next turn (a message in part, or the link's queue not read empty)."""
        return self._walk is not None or self._behind or (self.link.hosted and self.link.waiting)

    @property
    def socket(self) -> int | None:
        return self.link.socket  # (readable once the link's thread posted something)

    def start(self, context: zmq.Context[Any], endpoints: list[str], core: BrokerCore) -> None:
        try:
            import nats  # noqa: F401  (the link's thread imports it; say here, in one line, if it cannot)
        except ImportError:
            raise ConfigError("cluster.nats", "joining a cluster needs nats-py: pip install 'mc0[cluster]'") from None
        name = self.broker_name or route_wire.derived_name(socket.gethostname(), endpoints[0] if endpoints else "")
        self.broker_name = route_wire.check_name(name, "cluster.name")
        # A route is gone after route_liveness beacons missed (the core's sweep multiplies by its liveness).
        gone_after = self.config.hello_ms / 1000.0 * self.config.route_liveness
        ttl = gone_after / core.settings.liveness
        routeinput.join(core.rooms, self.broker_name, route_ttl=ttl, max_patterns=self.config.max_route_patterns)
        self.replicated = {j.name: j for j in core.journaling.every_journal() if isinstance(j, ReplicatedJournal)}
        positions = {name: journal.position() for name, journal in self.replicated.items()}
        self.link.start(context, self.broker_name, positions, hosted=True)  # (run on the broker's loop: host)

    def receive(self, core: BrokerCore, now: float) -> list[Out]:
        """What the link received, in order, for at most ``ROUTE_WALK_BUDGET`` of this turn (at least one
        slice): a message left in part goes on first next turn, and what follows it waits in the link's queue."""
        stop = time.monotonic() + self.walk_budget
        out: list[Out] = []
        read_empty = False
        if self._walk is not None:
            out += self._walk_on(core, self._walk, stop, now)
        look = True  # (the first take reads the wake-ups; the rest of the turn's takes need not)
        while self._walk is None and time.monotonic() < stop:
            items = self.link.receive(1, look=look)  # (one at a time: what is not taken waits, counted as credit)
            look = False
            if not items:
                read_empty = True
                break
            try:
                if isinstance(items[0], RouteBlob):
                    blob = items[0]
                    out += self._walk_on(core, RouteWalk(blob.name, blob.epoch, blob.blob), stop, now)
                else:
                    out += self._received(core, items[0], now)
            except Exception as exc:  # a bug, or the local copy's disk: counted, logged; the next item goes on
                self._walk = None
                core.listener_fault(self.name, exc, now)
        self._behind = not read_empty and self._walk is None
        if self._walk is not None or self._behind:
            routeinput.behind(core.rooms, now)  # (beacons may wait behind what is left: no route is silent)
        self._tell_routes(core)
        return out

    def _walk_on(self, core: BrokerCore, walk: RouteWalk, stop: float, now: float) -> list[Out]:
        """Slices of a route message until it is done or the turn's budget is spent (then kept for the next)."""
        out: list[Out] = []
        self._walk = walk
        while True:
            more, pos = routeinput.received_slice(
                core.rooms, walk.name, walk.epoch, walk.blob, walk.pos, ROUTE_SLICE, now
            )
            out += more
            if pos is None:
                self._walk = None
                return out
            walk.pos = pos
            if time.monotonic() >= stop:
                return out

    def _tell_routes(self, core: BrokerCore) -> None:
        """The link's thread learns the routes opened or dropped (only they may send chunked records)."""
        routes = core.routes
        if routes.generation != self._routes_told:
            self._routes_told = routes.generation
            self.link.set_routes(routes.epochs)

    def _received(self, core: BrokerCore, item: Inbound, now: float) -> list[Out]:
        out: list[Out] = []
        if isinstance(item, Hello):  # (a RouteBlob is walked by receive, a slice at a time)
            out += routeinput.hello(core.rooms, item.name, item.epoch, now)
        elif isinstance(item, LinkChange) and not item.up:
            out += routeinput.lost(core.rooms, now)  # cut off: serve own peers; beacons reopen the routes later
        elif isinstance(item, RoutesDropped):
            out += routeinput.reopen(core.rooms, now)  # (the link counted and logged the drops)
        elif isinstance(item, RouteResync):
            out += routeinput.reopen_route(core.rooms, item.name, now)  # (the link counted and logged the loss)
        elif isinstance(item, Records):
            out += self._arrived(core, item, now)
        elif isinstance(item, Acks):
            journal = self.replicated.get(item.journal)
            for token, seq, duplicate in item.acks:
                if journal is not None:
                    journal.acknowledged(seq)
                    journal.answered(token)
                out += fromstore.stored(core.rooms, item.journal, token, seq, duplicate, now)
        elif isinstance(item, Failed):
            failed = self.replicated.get(item.journal)
            if failed is not None:
                failed.answered(item.token)
            out += fromstore.failed(core.rooms, item.journal, item.token, item.code, item.reason, now)
        elif isinstance(item, Answer):
            rows = item.data.get("records", [])
            records = [
                _record(int(seq), ts / 1e9, payload) for (seq, ts), payload in zip(rows, item.payloads, strict=False)
            ]
            out += fromstore.answered(core.rooms, item.token, item.data, records, now)
        elif isinstance(item, StreamState):
            kept = self.replicated.get(item.journal)
            if kept is not None:
                kept.stream_state(item.first, item.last, item.created, item.start)
        elif isinstance(item, FeedStatus):
            fed = self.replicated.get(item.journal)
            if fed is not None:
                fed.feed_status(item.following, item.reason, now)
        return out

    def _arrived(self, core: BrokerCore, news: Records, now: float) -> list[Out]:
        """Records the stream delivered: into the local copy (in seq order), then to the core."""
        journal = self.replicated.get(news.journal)
        if journal is None:
            return []
        listening = fromstore.listening(core.rooms)
        fresh: list[tuple[Record, str]] = []
        for seq, ts, origin, payload in news.records:
            record = journal.arrived(seq, ts, payload)  # (None: had it, or no mc0 record: a hole, counted)
            if record is not None and listening:
                fresh.append((record, origin))
        journal.flush()
        return fromstore.arrived(core.rooms, news.journal, fresh, now) if fresh else []

    def owns(self, routing_id: bytes) -> bool:
        return is_route_id(routing_id)

    def flush(self, core: BrokerCore, outbox: Outbox, routing_id: bytes, now: float) -> list[Out]:
        """What is queued for a route, a BATCH at a time (a route is a batched peer), while the link's
        thread holds less than its budget: past it the rest waits in the route's queue (blocked, tried
        again shortly), where the queue's own budget bounds it (``core.send_failed`` beyond)."""
        name = routing_id[len(ROUTE_PREFIX) :].decode()
        link = self.link
        while True:
            if link.backlog >= link.send_budget:  # NATS is slow: the link has not sent what it holds
                outbox.blocked(routing_id, now)
                return []
            message = outbox.next_message(routing_id)
            if message is None:
                return []
            blob = message[2] if len(message) == 3 and message[0] == batch.BATCH else None
            if blob is None:  # (never: a route's queue is batched) counted, not sent raw over NATS
                core.counters["route_unbatched_dropped"] += 1
            else:
                link.send(name, bytes(blob))
            outbox.sent(routing_id, now)

    def forgotten(self, routing_id: bytes) -> None:
        pass

    def turn(self, core: BrokerCore, now: float) -> list[Out]:
        """The news of this broker's own peers (interest, services, identities) for every route; what
        the core asks of JetStream; whether each local copy follows its stream (stuck: logged once)."""
        for token, request in fromstore.calls(core.rooms):
            self.link.call(token, request)
        for journal in self.replicated.values():
            journal.watch(now)
        out = routeinput.news(core.rooms) + routeinput.resync_overflowed(core.rooms, now)
        self._tell_routes(core)  # (routes forgotten by the core's sweep, or resynced, since the last receive)
        return out

    def status(self, core: BrokerCore, now: float) -> dict[str, object]:
        return {
            "name": self.broker_name,
            # Another broker beaconing under this one's name, lately (None: none): /healthz is degraded.
            "name_collision": core.routes.name_collision(now),
            "nats_connected": self.link.connected,
            "nats_server": self.link.server,
            "brokers": sorted(core.routes.by_name),
            "link": dict(self.link.counters),
            # JetStream journals: proposals published / acknowledged / retried / failed, what is pending,
            # which streams are ready, records delivered to each local copy, and the copies' positions.
            "jetstream": {
                **(self.link.jetstream.status() if self.link.jetstream is not None else {}),
                "copies": {name: journal.position()[0] for name, journal in self.replicated.items()},
                "held_oks": core.replication.holding,
                "store_calls_waiting": core.calls.waiting,
            }
            if self.replicated
            else None,
        }

    def close(self) -> None:
        self.link.close()


def _record(seq: int, ts: float, payload: bytes) -> Record:
    """A JetStream journal's message as the record it holds (one that is not mc0's: no topic, filtered)."""
    try:
        return decode_payload(seq, ts, payload, 0, len(payload))
    except (ValueError, struct.error, UnicodeDecodeError):
        return Record(seq, ts, "", "", {}, (payload,))


def configured(config: Config) -> list[Listener]:
    """The listeners ``config`` asks for (none for a plain standalone broker)."""
    found: list[Listener] = []
    bridge = NngBridge.configured(config)  # MemoDB: NNG in its own thread, or None
    if bridge is not None:
        found.append(NngListener(bridge))
    if config.cluster.nats:
        found.append(ClusterListener(config))
    return found
