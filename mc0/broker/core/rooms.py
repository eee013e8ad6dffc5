"""Rooms: the core's rooms, built together, and the few operations that cross them.

Contract: ``Rooms(settings, permissions, ...)`` builds every room with what it
needs handed to its constructor: the journals (the one that keeps mailboxes,
those JetStream keeps: their store calls, consumers and letters), the shell's
figure of what waits in each peer's queue (``backlog``), and the cluster's
routes, which the rooms that announce interest, identities and capacity tell
(``Routes`` keeps it to itself while the broker is standalone).  A room that
reads a sibling is handed it typed as a narrow protocol of the reading room's
own (``Builtins``, ``SysBus``, ``Replication``, ``Consumers``, ``Mailboxes``'
``presence``): it asks through calls, and state crosses rooms only through
calls that hand it over (``rpc.take_finished``, ``consumers.take_dead_letters``),
never through a shared or swapped container.  The
operations that cross rooms are here: ``open_peer``, ``forget`` (a peer and
everything it held, in every room), ``with_finished`` (what just finished:
dead letters and ``mc0.sys.rpc`` records, published), ``reject`` and
``internal_error`` (a refused or failed message answered, within the log's
bound).

The input modules (:mod:`.verbs`, :mod:`.sessions`, :mod:`.batched`,
:mod:`.dialect_ops`, :mod:`.routeinput`, :mod:`.admin`,
:mod:`mc0.broker.jetstream.fromstore`) drive the rooms through this object;
:class:`~mc0.broker.core.dispatch.BrokerCore` sits on top and keeps the
shell's API.  Nothing here imports an input module or the dispatcher: the
rooms never call back up.  Pure: no sockets, no clock.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence

from ... import protocol as P
from ...errors import ProtocolError
from ...permissions import Permissions
from ...protocol import Status
from ...protocol.jetstream import MAX_STORE_CALLS
from ...settings import CoreSettings
from ..jetstream.replication import Replication
from ..jetstream.storecalls import StoreCalls
from ..jetstream.storeconsumers import StoreConsumers
from ..storage.port import JournalStore
from .builtin_services import Builtins
from .consumers import Consumers
from .journaling import Journaling
from .localconsumers import LocalConsumers
from .loglimit import LogLimiter
from .mailboxes import Mailboxes
from .peers import Out, Peer, PeerTable, close_reason
from .pubsub import PubSub
from .routes import Routes
from .rpc import Rpc
from .sysbus import SysBus
from .telemetry import PeerEvent
from .traffic import TopicTraffic
from .walks import BatchCursor

log = logging.getLogger("mc0.broker")


class Rooms:
    def __init__(
        self,
        settings: CoreSettings,
        permissions: Permissions,
        *,
        generated_ids_only: bool = False,
        journals: Sequence[JournalStore] = (),
        wall_offset: float = 0.0,
        backlog: Callable[[bytes], int] | None = None,
        group_skip_bytes: int = 0,
        first_serial: int = 1,
    ) -> None:
        """See :class:`~mc0.broker.core.dispatch.BrokerCore` for the arguments."""
        self.settings = settings
        self.permissions = permissions
        self.generated_ids_only = generated_ids_only
        self.wall_offset = wall_offset
        counters: Counter[str] = Counter()
        self.counters = counters
        # Routing ids forgotten since the shell last took them (BrokerCore.take_forgotten).  The list object
        # never changes, so a shell may hold it and test it for work waiting (cheaper than a call per message).
        self.forgotten: list[bytes] = []
        # Each peer's batch walk under way (mc0.broker.core.batched walks them; forget cuts a peer's).
        self.walks: dict[bytes, BatchCursor] = {}
        routes = self.routes = Routes(counters)  # the other brokers, when this one joins a cluster
        self.peers = PeerTable(broker_name=routes.own_name, first_serial=first_serial)
        can_take = None if backlog is None else (lambda routing_id: backlog(routing_id) < group_skip_bytes)
        self.pubsub = PubSub(settings.limits, counters, interest=routes, can_take=can_take)
        self.journaling = Journaling(journals, counters, tokens_of=self.pubsub.tokens_of, wall_offset=wall_offset)
        self.sysbus = SysBus(self.pubsub, self.journaling, counters, wall_offset, broker_name=routes.own_name)
        # What the core asks of JetStream (journals with store = "jetstream"), and their held OKs.
        self.calls = StoreCalls(counters)
        self.replication = Replication(self.journaling, self.pubsub, self.peers, counters, broker_name=routes.own_name)
        keeper = next((j for j in self.journaling.every_journal() if j.settings.mailboxes), None)
        self.mailboxes = Mailboxes(
            settings, counters, keeper, wall_offset=wall_offset, presence=routes, backlog=backlog, calls=self.calls
        )
        self.rpc = Rpc(settings, counters, is_current=self.peers.is_current, wants_telemetry=self.sysbus.wants_rpc)
        # The durable consumers of the journals JetStream keeps (none: it keeps no journal's), and the
        # front that hands each journal's requests to its consumers' backend: JetStream's or this broker's.
        self.store_consumers = StoreConsumers(
            self.calls,
            counters,
            journals=self.journaling.every_journal(),
            tokens_of=self.pubsub.tokens_of,
            max_wait_ms=settings.max_request_timeout_ms,
            max_consumers=settings.max_consumers,
            max_per_identity=settings.max_consumers_per_identity,
            # A request on a JetStream consumer is one of the client's outstanding requests, held as a
            # store call: max_requests bounds them too when it is the lower.
            max_calls=min(settings.max_requests, MAX_STORE_CALLS),
        )
        local_consumers = LocalConsumers(
            self.journaling,
            counters,
            tokens_of=self.pubsub.tokens_of,
            is_current=self.peers.is_current,
            max_wait_ms=settings.max_request_timeout_ms,
            max_consumers=settings.max_consumers,
            max_per_identity=settings.max_consumers_per_identity,
        )
        self.consumers = Consumers(self.journaling, local_consumers, store=self.store_consumers)
        self.traffic = TopicTraffic()  # messages and bytes published per topic (monitoring)
        self.builtins = Builtins(
            self.peers,
            self.pubsub,
            self.rpc,
            self.journaling,
            counters,
            self.mailboxes,
            self.consumers,
            routes,
            traffic=self.traffic,
        )
        self.log_limit = LogLimiter()  # what a peer's faults may write to the log

    # ================================================================ connections
    def open_peer(self, peer: Peer, now: float) -> list[Out]:
        peer.grants = self.permissions.grants(peer.identity)
        self.peers.add(peer, now)
        self.counters["connects"] += 1
        return self._peer_event("connect", peer, "", now)

    def forget(self, peer: Peer, why: str, now: float, *, reason: str | None = None) -> list[Out]:
        """Drop a peer and everything it held, in every room; returns what that means for others.

        ``why`` is the reason's code (the ``forgotten_<why>`` counter, the mc0.sys.peer event);
        ``reason`` the words /connz?state=closed keeps with the closed connection (default: the
        code's, ``peers.close_reason``), e.g. ``"closed by alice"`` for an operator's close."""
        if self.peers.remove(peer, close_reason(why) if reason is None else reason, now):
            self.forgotten.append(peer.routing_id)
        walks = self.walks
        cursor = walks.get(peer.routing_id) if walks else None
        if cursor is not None and cursor.peer is peer:
            cursor.blob = b""  # the rest of its batch goes with it (what it sent after still waits its turn)
            if not cursor.deferred:
                del walks[peer.routing_id]
        self.pubsub.drop_peer(peer)
        self.journaling.drop_peer(peer)
        kept_again = self.mailboxes.offline(peer, now)
        self.consumers.drop_peer(peer)
        self.routes.dropped(peer)
        self.counters[f"forgotten_{why}"] += 1
        log.info("peer %s %s", peer.name, reason or why)
        out = kept_again + self.rpc.drop_peer(peer, now)
        out += self._peer_event("disconnect", peer, why, now)
        return out

    # ================================================================ answers
    def with_finished(self, out: list[Out], now: float) -> list[Out]:
        """``out`` plus the mc0.sys.rpc records of the requests that just finished (and dead letters)."""
        for topic, letter, reason, deliveries in self.consumers.take_dead_letters():
            out += self.sysbus.publish_dead_letter(topic, letter, reason, deliveries, now)
        for record in self.rpc.take_finished():
            out += self.sysbus.publish(record, now)
        return out

    def reject(
        self, routing_id: bytes, peer: Peer | None, frames: Sequence[bytes], exc: ProtocolError, now: float
    ) -> list[Out]:
        self.counters[f"rejected_{exc.code}"] += 1
        if log.isEnabledFor(logging.DEBUG):
            shown = " ".join(repr(bytes(f[:32])) for f in frames[:4])
            who = peer.name if peer is not None else "an unconnected peer"
            log.debug("%s: %s %s | %s", who, exc.code, exc.reason, shown)
        if peer is not None:
            peer.last_sent = now
        return [(routing_id, P.error(exc.code, exc.reason, exc.request_id))]

    def internal_error(
        self,
        routing_id: bytes,
        frames: Sequence[bytes],
        exc: BaseException,
        request_id: str | None = None,
        *,
        now: float = 0.0,
    ) -> list[Out]:
        """A per-message guard caught ``exc`` while this message was handled (a bug):
        count it, log it (within the log's per-peer bound), answer its sender ERROR 500
        (with its ID if it had one); nothing else."""
        self.counters["internal_errors"] += 1
        peer = self.peers.get(routing_id)
        self.log_fault(peer, "handling a message from", exc, now)
        if request_id is None and frames:
            request_id = P.find_id(frames, self.settings.limits.max_headers)
        reason = f"internal error: {type(exc).__name__}"
        if peer is not None:
            return [(routing_id, peer.dialect.error(request_id, "", Status.HANDLER_FAILED, reason))]
        answer = P.error(Status.HANDLER_FAILED, reason, request_id)
        return [(routing_id, P.enveloped(answer) if frames and not frames[0] else answer)]

    def log_fault(self, peer: Peer | None, doing: str, exc: BaseException, now: float) -> None:
        """An internal error caused by a peer's input, logged with its traceback within the bound
        (``LogLimiter``): no peer can grow the log without bound; the rest are counted."""
        who = peer.name if peer is not None else "an unconnected peer"
        if self.log_limit.allow(peer.identity if peer is not None else "", f"{doing}:{type(exc).__name__}", now):
            log.error("internal error %s %s", doing, who, exc_info=exc)
        else:
            self.counters["log_lines_left_out"] += 1

    # ================================================================ telemetry
    def _peer_event(self, event: str, peer: Peer, reason: str, now: float) -> list[Out]:
        if not self.sysbus.wants(P.SYS_PEER_TOPIC):
            return []
        record = PeerEvent(event, peer.name, peer.identity, peer.dialect.name, peer.version, reason)
        return self.sysbus.publish(record, now)
