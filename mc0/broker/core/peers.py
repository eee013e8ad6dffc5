"""Peers: the broker's view of each connection, and the table that finds them.

Contract: owns :class:`Peer` (identity, its name shown to others, protocol
version, dialect, liveness clocks, delivery and drop counters) and
:class:`PeerTable` (routing id -> peer, the names it gives its peers
(:mod:`mc0.protocol.peernames`: ``identity#n``, ``identity#n@BROKER`` in a
cluster), the connection-fd bindings that let a reported close find its peer,
closes waiting for the socket to read empty, revoked identities, the
heartbeat/expiry sweep from deadlines and the slow-consumer episode rule).  It decides;
the rooms (:mod:`mc0.broker.core.rooms`) carry the decisions out across
the other rooms.  Subscriptions, services, requests, replays and fetches are kept
by their own rooms, keyed by :class:`Peer`.  No sockets, no clock: ``now``
is passed in.

Liveness costs what is due, never a walk: each peer has one *look* (its next
heartbeat or its expiry, whichever comes first) in a heap keyed by its time.
Sending to a peer or hearing from it only moves ``last_sent`` /
``last_recv`` (a bare assignment where it happens); its look is not moved
then but taken when it comes (lazily): a peer that is not due after all is
put back at its real time, and a forgotten peer's look is skipped.  So a turn
with nothing due costs O(1) whatever the number of peers, and each peer
costs one look (O(log peers)) per heartbeat interval.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass

from ... import protocol as P
from ...errors import ProtocolError
from ...permissions import ALLOW_ALL, Grants
from ...protocol import Dialect, batch
from ...protocol.peernames import peer_name

# What the core asks the shell to send: (routing id, frames), or (routing id, a batch record)
# for a peer granted batched framing (bytes: the shell appends it to that peer's next batch).
Out = tuple[bytes, Sequence[bytes] | bytes]

# Peers' looks (a heartbeat or an expiry due) are taken at their time, but at most once per this many
# seconds (the looks due within it are taken together: a loop wake-up each, at most 20 a second).
MIN_SWEEP_INTERVAL = 0.05
# The looks heap is rebuilt from the live ones when it holds this many more than twice their number
# (a forgotten peer's look stays until its time or the next rebuild: a connect storm's churn is bounded).
LOOKS_SLACK = 1024
# Drops to a peer separated by less than this belong to one "queue stays full" episode.
DROP_EPISODE_GAP = 1.0
# A closed connection's peer waits for the shell to read its socket empty,
# at most this long (a socket under constant load never reads empty).
CLOSE_WAIT_LIMIT = 0.5
# /connz?state=closed: the last this many closed connections are kept (nats-server keeps 10,000 by default;
# each entry here is ~1 KB).
CLOSED_KEPT = 256
# Why a session ended, as /connz?state=closed says it, by its reason code (``Rooms.forget``'s
# ``why``, also the ``forgotten_<why>`` counter).  None: not the end of a connection (a MemoDB request's
# session ends with its answer), nothing is kept.  A code not listed is shown with its underscores as spaces.
CLOSE_REASONS: dict[str, str | None] = {
    "too_slow": "evicted: slow consumer",
    "revoked": "revoked",
    "expired": "heartbeat expired",
    "closed": "disconnected",  # the connection closed (the monitor saw it)
    "disconnected": "disconnected",  # it said DISCONNECT
    "unreachable": "disconnected",  # the socket says it is gone
    "replaced": "replaced: its routing id changed hands",
    "reconnected": "reconnected: a new CONNECT on the same session",
    "internal_error": "closed: internal error",
    "broker_shutdown": "broker shut down",
    "answered": None,
}


def close_reason(why: str) -> str | None:
    """The text /connz?state=closed gives for ``forget``'s reason code (None: nothing to keep)."""
    return CLOSE_REASONS.get(why, why.replace("_", " "))


@dataclass(frozen=True, slots=True)
class Closed:
    """One closed connection as /connz?state=closed shows it (times: the loop's monotonic clock)."""

    name: str
    identity: str
    dialect: str
    protocol: str
    address: str
    connected: float
    closed: float
    reason: str
    msgs_in: int
    bytes_in: int
    msgs_out: int
    bytes_out: int
    delivered: int
    dropped: int


class Peer:
    """One connected peer as the broker sees it (client, subscriber and/or worker)."""

    __slots__ = (
        "routing_id",
        "identity",
        "sender",
        "serial",
        "name",
        "legacy",
        "version",
        "dialect",
        "ttl",
        "last_recv",
        "last_sent",
        "drops",
        "drop_episode_start",
        "last_drop",
        "delivered",
        "grants",
        "fd",
        "batched",
        "sender_block",
        "echo",
        "route",
        "enveloped",
        "beat",
        "expires",
        "connected",
        "address",
        "msgs_in",
        "bytes_in",
        "msgs_out",
        "bytes_out",
    )

    def __init__(
        self,
        routing_id: bytes,
        identity: str,
        version: str,
        ttl: float,
        now: float,
        dialect: Dialect,
        fd: int | None = None,
    ) -> None:
        self.routing_id = routing_id
        self.identity = identity
        self.sender = identity.encode()
        self.sender_block = batch.sender_block(self.sender)  # its MESSAGE records' sender part, built once
        # Shown to others (WORKER header, stats): never the routing id, which could help a squatter.
        # Numbered and named by the table that takes it (``PeerTable.add``): ``identity#n[@broker]``.
        self.serial = 0
        self.name = identity
        self.fd = fd  # the connection it arrived on (ZMQ_SRCFD), when the shell knows it
        self.version = version
        self.legacy = version in P.SEED_VERSIONS
        self.dialect = dialect
        self.ttl = ttl
        self.last_recv = now
        self.last_sent = now
        self.drops = 0
        self.drop_episode_start = 0.0
        self.last_drop = -1e18
        self.delivered = 0
        self.grants: Grants = ALLOW_ALL
        self.batched = False  # granted BATCH 1 at CONNECT: what it is sent goes out as batch records
        self.echo = True  # False (CONNECT ECHO 0): never handed its own publishes
        self.route = False  # another broker of the cluster (mc0.broker.core.routes), not a client
        # Its session came behind an empty frame (an mc0d-era DEALER): everything sent to it gets one too.
        self.enveloped = False
        self.beat = ttl  # the broker heartbeats it after this much silence toward it (mc0 peers: a fraction of TTL)
        self.expires = True  # False: it named no TTL, so promised no rate: only its connection's close ends it
        self.connected = now  # (monitoring: /connz connected_at)
        self.address = ""  # the transport's peer address, where it has one (PeerTable.add, from the shell)
        # Traffic, for monitoring (each a bare increment where it happens: the dispatcher and batched.py count
        # what it sends, a BATCH as its records; the shell's Sender counts what is queued for it).
        self.msgs_in = 0
        self.bytes_in = 0
        self.msgs_out = 0
        self.bytes_out = 0

    def __repr__(self) -> str:
        return f"<Peer {self.name} {self.dialect.name} v{self.version}>"

    def framed(self, payload: Sequence[bytes] | bytes) -> Sequence[bytes] | bytes:
        """``payload`` as this peer's session takes it: behind an empty frame when it is enveloped
        (never a batch record: an enveloped session is never batched)."""
        return P.enveloped(payload) if self.enveloped and not isinstance(payload, bytes) else payload


# CONNECT's on/off options: the value a peer gets when it does not say.
CONNECT_FLAG_DEFAULTS = {P.Header.BATCH: False, P.Header.ECHO: True}


def connect_flag(command: P.Command, header: P.Header, version: str) -> bool:
    """A CONNECT option that is "0" or "1" (BATCH, ECHO); anything but the default needs 1.0."""
    default = CONNECT_FLAG_DEFAULTS[header]
    text = command.headers.get(header)
    if text is None:
        return default
    if text not in ("0", "1") or ((text == "1") != default and version != P.FULL_VERSION):
        raise ProtocolError(
            P.Status.BAD_REQUEST, f"{header} must be 0 or 1, and needs protocol {P.FULL_VERSION}", command.id
        )
    return text == "1"


def _standalone() -> str:
    return ""


def generated_routing_id(routing_id: bytes) -> bool:
    """libzmq's own routing ids are 5 bytes starting with a zero byte."""
    return len(routing_id) == 5 and routing_id[0] == 0


class PeerTable:
    """Every known peer by routing id, and what connection each came on."""

    def __init__(self, *, broker_name: Callable[[], str] = _standalone, first_serial: int = 1) -> None:
        """``broker_name()``: this broker's cluster name ("" standalone): its peers are named
        ``identity#n@broker``, unique in the whole cluster (mc0.protocol.peernames); ``first_serial``:
        the first ``n`` (the shell's ``peernames.first_serial`` of the run's start: no name of an
        earlier run repeats)."""
        self.by_id: dict[bytes, Peer] = {}
        self._broker_name = broker_name
        self._serials = itertools.count(max(1, first_serial))
        self._by_fd: dict[int, bytes] = {}
        self._closing: dict[bytes, tuple[int, float]] = {}  # routing id -> (fd, when reported closed)
        self.revoked: set[str] = set()  # identities whose every message is dropped
        # The transport's address of each open connection (by fd), as the shell reported it (``opened``);
        # a peer takes its connection's when it is added.
        self._addresses: dict[int, str] = {}
        self.closed: deque[Closed] = deque(maxlen=CLOSED_KEPT)  # the last closed connections, oldest first
        # Each peer's next look: never later than its heartbeat or expiry (both only move later as it
        # sends and is sent things, so a look that comes early puts the peer back at its real time).
        # The heap holds (time, serial, peer); ``_look_of`` the live one's serial per peer (others: stale).
        self._looks: list[tuple[float, int, Peer]] = []
        self._look_of: dict[Peer, int] = {}
        self._look_serials = itertools.count()
        self._swept = -1e18  # when the last sweep ran
        self.looks_taken = 0  # looks taken since the start (what liveness cost: a benchmark reads it)
        # Everything peers sent before this was read (the shell says so: BrokerCore.caught_up);
        # silence is measured up to here.  None: the shell does not say (silence is up to now).
        self.heard_until: float | None = None

    def __len__(self) -> int:
        return len(self.by_id)

    def get(self, routing_id: bytes) -> Peer | None:
        return self.by_id.get(routing_id)

    def all_peers(self) -> Iterator[Peer]:
        """Every known peer, in the order they were added (a report's walk: O(peers))."""
        return iter(self.by_id.values())

    def is_current(self, peer: Peer) -> bool:
        """``peer`` is still the one known under its routing id (not forgotten or replaced)."""
        return self.by_id.get(peer.routing_id) is peer

    def add(self, peer: Peer, now: float) -> None:
        if not peer.serial:  # (a peer re-added keeps its name)
            peer.serial = next(self._serials)
        peer.name = peer_name(peer.identity, peer.serial, self._broker_name())
        self.by_id[peer.routing_id] = peer
        if peer.fd is not None:
            peer.address = self._addresses.get(peer.fd, peer.address)
            if peer.routing_id not in self._closing:
                self._by_fd[peer.fd] = peer.routing_id
        self._look(peer, now + peer.beat)  # its first heartbeat (beat <= ttl: before any expiry)

    def remove(self, peer: Peer, reason: str | None = None, now: float = 0.0) -> bool:
        """Forget ``peer`` if it is still the current one; True if it was.  ``reason``: why its
        session ended, kept (with its traffic) among the last ``CLOSED_KEPT`` closed connections."""
        if self.by_id.get(peer.routing_id) is not peer:
            return False
        del self.by_id[peer.routing_id]
        self._look_of.pop(peer, None)  # (its look in the heap is stale now: skipped)
        if peer.fd is not None and self._by_fd.get(peer.fd) == peer.routing_id:
            del self._by_fd[peer.fd]
        if reason is not None:
            self.closed.append(
                Closed(
                    peer.name,
                    peer.identity,
                    peer.dialect.name,
                    peer.version,
                    peer.address,
                    peer.connected,
                    now,
                    reason,
                    peer.msgs_in,
                    peer.bytes_in,
                    peer.msgs_out,
                    peer.bytes_out,
                    peer.delivered,
                    peer.drops,
                )  # fmt: skip
            )
        return True

    # ------------------------------------------------------------ connections
    def knows_address(self, fd: int) -> bool:
        return fd in self._addresses

    def opened(self, fd: int, address: str) -> None:
        """The shell read the first message of connection ``fd``, from ``address`` (the transport's
        peer address: ``ip:port`` over TCP); a peer that connects on it shows it."""
        self._addresses[fd] = address

    def connection_closed(self, fd: int, now: float) -> None:
        """Connection ``fd`` closed: unbind the number now (libzmq may reuse it), forget the peer later."""
        self._addresses.pop(fd, None)
        routing_id = self._by_fd.pop(fd, None)
        if routing_id is not None:
            self._closing[routing_id] = (fd, now)

    @property
    def closing(self) -> bool:
        return bool(self._closing)

    def is_closing(self, routing_id: bytes) -> bool:
        """The session on ``routing_id`` is bound to a connection reported closed: what is queued for
        it must not be sent (a new connection, maybe another key's, may hold the routing id already)."""
        entry = self._closing.get(routing_id)
        if entry is None:
            return False
        peer = self.by_id.get(routing_id)
        return peer is not None and peer.fd == entry[0]

    def closed_peers(self, now: float, *, drained: bool, reading: Container[bytes] = ()) -> list[Peer]:
        """Peers whose connection closed and whose last messages have been handled.

        ``drained``: the shell read its socket empty since; otherwise only
        closes older than ``CLOSE_WAIT_LIMIT`` qualify.  Routing ids in
        ``reading`` still have messages being handled (a batch walked in
        slices): they wait until it is done.
        """
        gone: list[Peer] = []
        for routing_id, (fd, reported) in list(self._closing.items()):
            if (not drained and now - reported < CLOSE_WAIT_LIMIT) or routing_id in reading:
                continue
            del self._closing[routing_id]
            peer = self.by_id.get(routing_id)
            if peer is not None and peer.fd == fd:
                gone.append(peer)
        return gone

    # ------------------------------------------------------------ liveness
    def _look(self, peer: Peer, when: float) -> None:
        serial = next(self._look_serials)
        self._look_of[peer] = serial
        looks = self._looks
        heapq.heappush(looks, (when, serial, peer))
        if len(looks) > 2 * len(self._look_of) + LOOKS_SLACK:  # mostly stale: keep the live ones
            live = self._look_of
            self._looks = [entry for entry in looks if live.get(entry[2]) == entry[1]]
            heapq.heapify(self._looks)

    @property
    def next_sweep(self) -> float:
        """When a peer's heartbeat or expiry may next be due, at least ``MIN_SWEEP_INTERVAL`` after
        the last sweep (inf: no peer)."""
        looks, live = self._looks, self._look_of
        while looks and live.get(looks[0][2]) != looks[0][1]:
            heapq.heappop(looks)  # (a forgotten peer's, or one put back since)
        return max(looks[0][0], self._swept + MIN_SWEEP_INTERVAL) if looks else float("inf")

    @property
    def watched(self) -> int:
        """Peers with a look to come (every known peer: the test of the bookkeeping)."""
        return len(self._look_of)

    def sweep(self, now: float, liveness: int, busy: Callable[[Peer], bool]) -> tuple[list[Peer], list[Out]]:
        """The peers whose look is due: those not heard from for ``liveness`` x TTL (expired: the
        caller forgets them), and the heartbeats due to the others (a peer's is due ``beat`` after
        the broker last sent it anything).  Costs the peers due, not the peers known.

        A peer whose dialect takes no heartbeats (an MDP client) is kept past its liveness while
        ``busy(peer)`` (it waits for replies), looked at again a TTL later; one that named no TTL
        (``expires`` False) is never expired for silence.  Silence is measured up to
        ``heard_until``.
        """
        heard = now if self.heard_until is None else min(now, self.heard_until)
        self._swept = now
        expired: list[Peer] = []
        beats: list[Out] = []
        looks, live = self._looks, self._look_of
        due: list[Peer] = []
        while looks and looks[0][0] <= now:
            _, serial, peer = heapq.heappop(looks)
            if live.get(peer) == serial:
                due.append(peer)
        self.looks_taken += len(due)
        for peer in due:
            next_look = float("inf")
            if peer.expires:
                expires = peer.last_recv + peer.ttl * liveness
                if heard >= expires and (peer.dialect.heartbeats or not busy(peer)):
                    expired.append(peer)
                    del live[peer]  # (the caller forgets it)
                    continue
                if now >= expires:
                    expires = now + peer.ttl  # kept while busy (or not yet heard up to it): looked at again
                next_look = expires
            beat = peer.last_sent + peer.beat
            if now >= beat:
                frames = peer.dialect.heartbeat()
                if frames is not None:
                    beats.append((peer.routing_id, frames))
                peer.last_sent = now
                beat = now + peer.beat
            self._look(peer, min(next_look, beat))
        return expired, beats

    @staticmethod
    def dropped(peer: Peer, now: float, slow_consumer_ms: int) -> bool:
        """Count a message that could not be queued for ``peer``; True once it is a slow consumer
        (its sends kept failing for ``slow_consumer_ms``; 0 never evicts)."""
        peer.drops += 1
        if now - peer.last_drop > DROP_EPISODE_GAP:
            peer.drop_episode_start = now
        peer.last_drop = now
        return bool(slow_consumer_ms) and now - peer.drop_episode_start >= slow_consumer_ms / 1000.0
