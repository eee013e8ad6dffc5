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
of it (``state_blob``, built once per change of interest and shared by
every route it goes to).  Interest learned from one route is never passed to
another: a message or request crosses at most one route (as over
nats-server's routes).  Pure: no sockets, no clock (``now`` is passed in).

Which brokers get a route (``admit``): one heard twice under the same epoch
(a beacon, or a route message, then another: a name heard once costs a
line of a bounded table, never a route), at most ``MAX_ROUTES`` of them,
and at most ``NEW_ROUTES_BURST`` opened at once, ``NEW_ROUTES_PER_S`` a
second after that; whatever the beacons (anyone with the brokers' NATS
login can send them, made up or not), what routes cost stays bounded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from ... import protocol as P
from ...permissions import ALLOW_ALL
from ...protocol import Header, Verb, batch
from ...protocol.routes import MAX_BROKER_LIST
from ...settings import MAX_ROUTE_PATTERNS
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

# A cluster is at most 256 brokers (a TRIED / REFUSED header names each at most once): routes past that
# are refused (counted, logged within the log's bound).
MAX_ROUTES = MAX_BROKER_LIST - 1
# Routes opened for a new broker (or a new run of one): this many at once, then this many a second (a whole
# cluster of 50 restarting at once joins within ~2 s; a flood of made-up names costs at most this).
NEW_ROUTES_BURST = 32
NEW_ROUTES_PER_S = 8.0
HEARD_ONCE_KEPT = 1024  # names heard once (a route opens at the second hearing), the oldest forgotten first

# Another broker beaconing under this one's name is shown (``name_collision``: /healthz degraded) until this
# long after its last beacon.
NAME_COLLISION_SHOWN_S = 10.0
NAME_COLLISION_REMINDER_S = 60.0  # said again this often while it lasts (beacons come 4 a second)

# What ``admit`` says: open the route, or why not yet.
ADMITTED, HEARD_ONCE, TOO_MANY, TOO_FAST = "admitted", "heard_once", "too_many", "too_fast"


def _record(verb: Verb, headers: Mapping[str, str], payload: tuple[bytes, ...] = ()) -> bytes:
    return batch.frames_record(P.encode(verb, headers, payload))


class Routes:
    def __init__(self, counters: Counter[str], *, name: str = "", ttl: float = 1.0) -> None:
        """``name``: this broker's (empty while standalone); ``ttl``: how long a route lives without
        a beacon or a message from it (beacon interval x beacons it may miss)."""
        self.counters = counters
        self.name = name
        self.ttl = ttl
        self.max_patterns = MAX_ROUTE_PATTERNS  # patterns one route may announce (``join``)
        self.over_budget: set[str] = set()  # routes that went past max_patterns since they opened (said once)
        self.by_name: dict[str, Peer] = {}
        self.epochs: dict[str, int] = {}
        self.generation = 0  # counts every route opened or dropped (what the shell shows the link is kept in step)
        self._interest: Counter[Interest] = Counter()  # local holders of each pattern
        self._capacity: dict[str, int] = {}  # service -> total capacity of local workers (announced)
        self._identities: Counter[str] = Counter()  # identity -> local sessions
        self._pending: list[bytes] = []  # records every route must get, in order
        self._overflowed: dict[str, None] = {}  # routes that lost messages past their queue's budget
        self._state: bytes | None = None  # the whole state as records (None: changed since it was built)
        self._hello: bytes | None = None  # CONNECT and the whole state (what opens a route)
        self._heard_once: dict[str, int] = {}  # name -> epoch heard once, no route yet (bounded)
        self._tokens = float(NEW_ROUTES_BURST)  # routes that may open now (refilled with time)
        self._tokens_at: float | None = None
        self._collision: tuple[int, float] | None = None  # (epoch, when) of the last beacon under our own name
        self._collision_said: float | None = None  # when it was last logged

    @property
    def enabled(self) -> bool:
        return bool(self.name)

    def join(self, name: str, ttl: float, max_patterns: int = MAX_ROUTE_PATTERNS) -> None:
        """This broker is ``name`` in a cluster (call before any peer connects): from now on its own
        peers' interest, services and identities are kept here and announced to the other brokers;
        ``ttl``: how long a route lives without a beacon or a message from it; ``max_patterns``: how
        many patterns one route may announce here."""
        self.name, self.ttl, self.max_patterns = name, ttl, max_patterns
        self._state = self._hello = None  # (its CONNECT says the TTL; interest is kept from now on)

    def own_name(self) -> str:
        """This broker's name in the cluster ("" while standalone): what the rooms that name this broker ask."""
        return self.name

    def routes_by_name(self) -> list[tuple[str, Peer]]:
        """The other brokers this one has a route to, sorted by name: (name, its route peer)."""
        return sorted(self.by_name.items())

    # ------------------------------------------------------------ route peers
    def collided(self, epoch: int, now: float) -> bool:
        """A beacon under this broker's own name, of another broker (started under ``epoch``): two brokers
        share a name (each gets the route traffic for it; the others keep a route to one of them only).
        True when it is to be said: news (the first, a new epoch, one after ``NAME_COLLISION_SHOWN_S`` of
        quiet) or ``NAME_COLLISION_REMINDER_S`` since it was last said."""
        last = self._collision
        self._collision = (epoch, now)
        self.counters["route_name_collisions"] += 1
        news = last is None or last[0] != epoch or now - last[1] > NAME_COLLISION_SHOWN_S
        if news or self._collision_said is None or now - self._collision_said >= NAME_COLLISION_REMINDER_S:
            self._collision_said = now
            return True
        return False

    def name_collision(self, now: float) -> dict[str, object] | None:
        """The other broker under this one's name, heard within ``NAME_COLLISION_SHOWN_S`` (None: none)."""
        if self._collision is None or now - self._collision[1] > NAME_COLLISION_SHOWN_S:
            return None
        epoch, heard = self._collision
        return {"name": self.name, "epoch": f"{epoch:016x}", "heard_s_ago": round(max(0.0, now - heard), 1)}

    def admit(self, name: str, epoch: int, now: float) -> str:
        """Whether broker ``name`` (under ``epoch``), heard now and with no route under that epoch, gets
        one: ``ADMITTED`` (the caller opens it) or why not yet (``HEARD_ONCE``: the next hearing opens
        it; ``TOO_MANY``, ``TOO_FAST``: refused now, tried again at its next beacon)."""
        if self._heard_once.get(name) != epoch:
            self._heard_once.pop(name, None)
            if len(self._heard_once) >= HEARD_ONCE_KEPT:
                del self._heard_once[next(iter(self._heard_once))]
            self._heard_once[name] = epoch
            return HEARD_ONCE
        if name not in self.by_name and len(self.by_name) >= MAX_ROUTES:
            return TOO_MANY
        if self._tokens_at is not None:
            self._tokens = min(float(NEW_ROUTES_BURST), self._tokens + (now - self._tokens_at) * NEW_ROUTES_PER_S)
        self._tokens_at = now
        if self._tokens < 1.0:
            return TOO_FAST
        self._tokens -= 1.0
        del self._heard_once[name]
        return ADMITTED

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
        self.generation += 1
        self.counters["routes_opened"] += 1
        return peer

    def dropped(self, peer: Peer) -> None:
        """``peer`` (a route) was forgotten."""
        name = peer.identity[len(ROUTE_IDENTITY_PREFIX) :]
        if self.by_name.get(name) is peer:
            del self.by_name[name]
            self.epochs.pop(name, None)
            self.over_budget.discard(name)
            self.generation += 1

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

    def hello(self) -> bytes:
        """What opens a session with another broker: CONNECT (it resets its view of us and answers
        with its own state), then everything it must know of us.  Built once per change of interest:
        every route opened meanwhile is handed the same bytes."""
        if self._hello is None:
            headers: dict[str, str] = {Header.VERSION: P.FULL_VERSION, Header.TTL: str(round(self.ttl * 1000))}
            self._hello = _record(Verb.CONNECT, headers) + self.state_blob()
        return self._hello

    def state_blob(self) -> bytes:
        """Everything another broker must know of this one, as records (built once per change of interest)."""
        if self._state is None:
            self._state = b"".join(self.full_state())
        return self._state

    def _announce(self, record: bytes) -> None:
        """A change every route must be told of (``drain``), and one the whole state no longer shows."""
        self._pending.append(record)
        self._state = self._hello = None

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
            self._announce(self._sub(Verb.SUB, group, pattern, exact))

    def unsubscribed(self, group: str | None, pattern: str, exact: bool) -> None:
        if not self.name:
            return
        key = (group, pattern, exact)
        held = self._interest.get(key, 0)
        if held <= 1:
            self._interest.pop(key, None)
            if held == 1:
                self._announce(self._sub(Verb.UNSUB, group, pattern, exact))
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
        self._state = self._hello = None
        if self.enabled:
            self._announce(self._ready(service, total))

    def online(self, identity: str) -> None:
        if not self.name:
            return
        self._identities[identity] += 1
        if self._identities[identity] == 1:
            self._announce(_record(Verb.SUB, {Header.TO: identity}))

    def offline(self, identity: str) -> None:
        if not self.name:
            return
        held = self._identities.get(identity, 0)
        if held <= 1:
            self._identities.pop(identity, None)
            if held == 1:
                self._announce(_record(Verb.UNSUB, {Header.TO: identity}))
        else:
            self._identities[identity] = held - 1
