"""Routes: the other brokers of a cluster, each one peer here, and what this broker tells them.

Contract: owns the route peers (one :class:`Peer` per other broker, by name,
with the epoch it started under) and this broker's *local* interest as the
other brokers must know it: the patterns its own peers subscribe to (plain
and per queue group, counted: announced when the first local holder comes,
withdrawn when the last goes), each service's total capacity over its local
workers, and the identities with a local session (letters for them may be
sent here).  Route peers talk the batched mc0 wire: what this room has to
say to them comes out as records (``SUB``/``UNSUB``, ``READY``, ``SUB TO``),
to every route at once (``drain``) or, when a route (re)connects, the whole
of it (``full_state``).  Interest learned from one route is never passed to
another: a message or request crosses at most one route (as over
nats-server's routes).  Pure: no sockets, no clock (``now`` is passed in).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from ... import protocol as P
from ...permissions import ALLOW_ALL
from ...protocol import Header, Verb, batch
from .peers import Out, Peer

# A route peer's routing id: a zero byte first (libzmq's own routing ids start with one and
# are 5 bytes long; a ZeroMQ peer that chooses one with this prefix is refused at the door).
ROUTE_PREFIX = b"\x00\xffroute:"
ROUTE_IDENTITY_PREFIX = "broker:"


def route_id(name: str) -> bytes:
    return ROUTE_PREFIX + name.encode()


def is_route_id(routing_id: bytes) -> bool:
    return routing_id.startswith(ROUTE_PREFIX)


# A pattern this broker's own peers hold: (queue group or None, pattern, a 0.x peer's exact topic?).
Interest = tuple[str | None, str, bool]


def _record(verb: Verb, headers: Mapping[str, str], payload: tuple[bytes, ...] = ()) -> bytes:
    return batch.frames_record(P.encode(verb, headers, payload))


class Routes:
    def __init__(self, counters: Counter[str], *, name: str = "", ttl: float = 1.0) -> None:
        """``name``: this broker's (empty while standalone); ``ttl``: how long a route lives without
        a beacon or a message from it (beacon interval x beacons it may miss)."""
        self.counters = counters
        self.name = name
        self.ttl = ttl
        self.by_name: dict[str, Peer] = {}
        self.epochs: dict[str, int] = {}
        self._interest: Counter[Interest] = Counter()  # local holders of each pattern
        self._capacity: dict[str, int] = {}  # service -> total capacity of local workers (announced)
        self._identities: Counter[str] = Counter()  # identity -> local sessions
        self._pending: list[bytes] = []  # records every route must get, in order
        self._overflowed: dict[str, None] = {}  # routes that lost messages past their queue's budget

    @property
    def enabled(self) -> bool:
        return bool(self.name)

    def join(self, name: str, ttl: float) -> None:
        """This broker is ``name`` in a cluster (call before any peer connects): from now on its own
        peers' interest, services and identities are kept here and announced to the other brokers;
        ``ttl``: how long a route lives without a beacon or a message from it."""
        self.name, self.ttl = name, ttl

    def own_name(self) -> str:
        """This broker's name in the cluster ("" while standalone): what the rooms that name this broker ask."""
        return self.name

    # ------------------------------------------------------------ route peers
    def known(self, name: str, epoch: int) -> Peer | None:
        """The route to broker ``name`` if one is open under ``epoch``."""
        peer = self.by_name.get(name)
        return peer if peer is not None and self.epochs.get(name) == epoch else None

    def make_peer(self, name: str, epoch: int, now: float) -> Peer:
        """A new route peer for broker ``name`` (the caller opens it in the peer table)."""
        peer = Peer(route_id(name), ROUTE_IDENTITY_PREFIX + name, P.FULL_VERSION, self.ttl, now, P.MC0_ROUTE_DIALECT)
        peer.batched = True
        peer.route = True
        peer.grants = ALLOW_ALL  # only brokers reach the cluster subjects (docs/SECURITY.md)
        self.by_name[name] = peer
        self.epochs[name] = epoch
        self.counters["routes_opened"] += 1
        return peer

    def dropped(self, peer: Peer) -> None:
        """``peer`` (a route) was forgotten."""
        name = peer.identity[len(ROUTE_IDENTITY_PREFIX) :]
        if self.by_name.get(name) is peer:
            del self.by_name[name]
            self.epochs.pop(name, None)

    def overflowed(self, peer: Peer) -> None:
        """``peer`` (a route) lost a message: its queue was over budget (NATS slow or stalled).  What it
        lost may have been an announcement, a request or a reply: the route is to be opened afresh."""
        name = peer.identity[len(ROUTE_IDENTITY_PREFIX) :]
        if self.by_name.get(name) is peer:
            self._overflowed[name] = None

    def take_overflowed(self) -> list[str]:
        """The routes that lost messages since the last call (each once), still open."""
        names = [name for name in self._overflowed if name in self.by_name]
        self._overflowed.clear()
        return names

    def hello(self) -> list[bytes]:
        """What opens a session with another broker: CONNECT (it resets its view of us and answers
        with its own state), then everything it must know of us."""
        connect = _record(Verb.CONNECT, {Header.VERSION: P.FULL_VERSION, Header.TTL: str(round(self.ttl * 1000))})
        return [connect, *self.full_state()]

    def full_state(self) -> list[bytes]:
        records = []
        for (group, pattern, exact), holders in self._interest.items():
            if holders > 0:
                records.append(self._sub(Verb.SUB, group, pattern, exact))
        for service, capacity in self._capacity.items():
            records.append(self._ready(service, capacity))
        for identity, sessions in self._identities.items():
            if sessions > 0:
                records.append(_record(Verb.SUB, {Header.TO: identity}))
        return records

    def drain(self) -> list[Out]:
        """What every route must be told since the last call (nothing without routes)."""
        if not self._pending:
            return []
        pending, self._pending = self._pending, []
        if not self.by_name:
            return []
        blob = b"".join(pending)
        return [(peer.routing_id, blob) for peer in self.by_name.values()]

    # ------------------------------------------------------------ local interest (hooks of the rooms)
    @staticmethod
    def _sub(verb: Verb, group: str | None, pattern: str, exact: bool) -> bytes:
        headers: dict[str, str] = {Header.GROUP: group} if group is not None else {}
        if exact:
            headers[Header.EXACT] = "1"
        return _record(verb, headers, (pattern.encode(),))

    @staticmethod
    def _ready(service: str, capacity: int) -> bytes:
        return _record(Verb.READY, {Header.CAPACITY: str(capacity)}, (service.encode(),))

    def subscribed(self, group: str | None, pattern: str, exact: bool) -> None:
        if not self.name:  # standalone: nobody to tell (a broker joins before any peer connects)
            return
        key = (group, pattern, exact)
        self._interest[key] += 1
        if self._interest[key] == 1:
            self._pending.append(self._sub(Verb.SUB, group, pattern, exact))

    def unsubscribed(self, group: str | None, pattern: str, exact: bool) -> None:
        if not self.name:
            return
        key = (group, pattern, exact)
        held = self._interest.get(key, 0)
        if held <= 1:
            self._interest.pop(key, None)
            if held == 1:
                self._pending.append(self._sub(Verb.UNSUB, group, pattern, exact))
        else:
            self._interest[key] = held - 1

    def capacity(self, service: str, total: int) -> None:
        """The local workers of ``service`` now have ``total`` capacity together (0: none left)."""
        if self._capacity.get(service, 0) == total:
            return
        if total:
            self._capacity[service] = total
        else:
            self._capacity.pop(service, None)
        if self.enabled:
            self._pending.append(self._ready(service, total))

    def online(self, identity: str) -> None:
        if not self.name:
            return
        self._identities[identity] += 1
        if self._identities[identity] == 1:
            self._pending.append(_record(Verb.SUB, {Header.TO: identity}))

    def offline(self, identity: str) -> None:
        if not self.name:
            return
        held = self._identities.get(identity, 0)
        if held <= 1:
            self._identities.pop(identity, None)
            if held == 1:
                self._pending.append(_record(Verb.UNSUB, {Header.TO: identity}))
        else:
            self._identities[identity] = held - 1
