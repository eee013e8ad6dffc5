"""BrokerCore: the dispatcher on top of the rooms: the verb table, and the shell's API.

Contract: ``handle(routing_id, frames, now, identity, fd)`` and ``tick(now)``
map input to a list of ``(routing_id, frames)`` to send; the shell
(:mod:`mc0.broker.server`) performs those sends and reports failures back
through ``send_failed``.  ``now`` is monotonic seconds supplied by the
shell, so every timing rule (heartbeats, expiry, deadlines, slow consumers)
is testable without sleeps.  No sockets, no clock, no disk: journals are
reached through the :class:`~mc0.broker.storage.port.JournalStore` port.

A peer's input can never raise out of ``handle``: every malformed message is
answered with ERROR (or, for MDP peers, which have no error reply, dropped)
and counted.

Below it, :class:`~mc0.broker.core.rooms.Rooms` builds the rooms, each owning
one kind of state (:mod:`.peers`, :mod:`.pubsub`, :mod:`.rpc` with
:mod:`.jobs`, :mod:`.journaling`, :mod:`.mailboxes`, :mod:`.consumers`,
:mod:`.builtin_services`, :mod:`.sysbus`, :mod:`.routes`, and the JetStream
wing's), and holds what crosses them (``forget``, ``open_peer``,
``with_finished``, ``reject``, ``internal_error``).  The dispatcher hands each
command to the input module that does it (:mod:`.verbs`, :mod:`.sessions`,
:mod:`.batched`, the foreign dialects through :mod:`.dialect_ops`), each given
the rooms, never the dispatcher: the arrows point down.  The rooms are also
this object's attributes (``peers``, ``pubsub``, ``rpc`` ...), the same
objects, as the shell, the monitor and the reports read them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ... import protocol as P
from ...errors import ProtocolError
from ...permissions import Permissions
from ...protocol import Side, Status, Verb
from ...settings import CoreSettings
from ...trie import TopicTrie
from ..storage.port import JournalStore
from . import sessions, verbs
from .batched import BatchedInput
from .dialect_ops import DialectOps
from .journaling import PageOut
from .peers import Out, Peer
from .rooms import Rooms
from .routes import is_route_id
from .workers import Service

__all__ = ["BrokerCore", "CoreSettings", "Out", "Peer", "PageOut"]

log = logging.getLogger("mc0.broker")

_BATCH = P.batch.BATCH
_CONNECT = Verb.CONNECT
_CONNECT_VERB = Verb.CONNECT.encode()  # the first frame of a CONNECT
_NOOP = P.NOOP_FRAMES[0]  # a bare heartbeat: [b"NOOP"]
# What a revoked identity is told: its sessions as they end, and a CONNECT it sends afterwards.
_KEY_REVOKED = "key revoked"
_MC0_NAME = P.MC0_DIALECT.name
# A foreign dialect's handler: (core, peer or None, routing id, frames, now, identity, fd) -> what to send.
ForeignHandler = Callable[
    [DialectOps, Peer | None, bytes, Sequence[bytes], float, str, int | None],
    list[Out],
]
# What recognises a foreign dialect by a message's first frames (mc0.broker.dialects.recognise, handed in by
# the shell: the core never imports a dialect): its handler, or None for mc0's own protocol.
DialectRecogniser = Callable[[Sequence[bytes], Peer | None], ForeignHandler | None]


def _mc0_only(frames: Sequence[bytes], peer: Peer | None) -> ForeignHandler | None:
    return None


class BrokerCore:
    def __init__(
        self,
        settings: CoreSettings | None = None,
        permissions: Permissions | None = None,
        *,
        generated_ids_only: bool = False,
        journals: Sequence[JournalStore] = (),
        wall_offset: float = 0.0,
        dialects: DialectRecogniser = _mc0_only,
        backlog: Callable[[bytes], int] | None = None,
        group_skip_bytes: int = 0,
        first_serial: int = 1,
    ) -> None:
        """``generated_ids_only``: refuse peers that choose their routing id (off in the broker: a session
        is bound to its routing id, identity and connection, see docs/SECURITY.md).

        ``journals`` are opened by the caller (the shell owns them); the core
        appends to them and ``commit()`` makes the appends durable, through the
        :class:`JournalStore` port.  ``wall_offset`` turns ``now`` (monotonic)
        into wall-clock time for telemetry records and retention.  ``dialects``
        recognises foreign dialects (the shell passes ``mc0.broker.dialects.recognise``;
        by default every message is read as mc0's own).

        ``backlog`` is the shell's figure of the bytes still queued for a routing id
        (the outbox; None: everything leaves at once).  A queue-group member with more
        than ``group_skip_bytes`` queued is passed over while another can take the
        message, and a journaled letter is recorded delivered only once its session's
        queue is empty.

        ``first_serial``: the ``n`` of the first peer's name ``identity#n`` (the shell passes
        ``peernames.first_serial`` of the run's start, so no run repeats an earlier run's names).
        """
        rooms = self.rooms = Rooms(
            settings or CoreSettings(),
            permissions or Permissions(),
            generated_ids_only=generated_ids_only,
            journals=journals,
            wall_offset=wall_offset,
            backlog=backlog,
            group_skip_bytes=group_skip_bytes,
            first_serial=first_serial,
        )
        self._dialect_of = dialects
        # The rooms, as the shell, the monitor and the reports read them (the same objects).
        self.settings = rooms.settings
        self.counters = rooms.counters
        self.forgotten = rooms.forgotten
        self.peers = rooms.peers
        self.pubsub = rooms.pubsub
        self.journaling = rooms.journaling
        self.rpc = rooms.rpc
        self.mailboxes = rooms.mailboxes
        self.consumers = rooms.consumers
        self.routes = rooms.routes
        self.builtins = rooms.builtins
        self.traffic = rooms.traffic
        self.sysbus = rooms.sysbus
        self.calls = rooms.calls
        self.replication = rooms.replication
        # The verb table (mc0.broker.core.verbs), and the two verbs that are sessions (.sessions).
        self.verbs: dict[Verb, verbs.Handler] = {
            **verbs.VERBS,
            Verb.CONNECT: sessions.reconnect,
            Verb.DISCONNECT: sessions.disconnect,
        }
        self.batched = BatchedInput(rooms, self.verbs)  # batches walked in slices (see batched.py)
        self.dialect_ops = DialectOps(rooms)  # the core as foreign dialects see it
        self._unfinished = rooms.walks  # (read per message: the dict itself, not a property)

    @property
    def permissions(self) -> Permissions:
        return self.rooms.permissions

    @property
    def generated_ids_only(self) -> bool:
        return self.rooms.generated_ids_only

    # ------------------------------------------------------------ views the shell and reports use
    @property
    def sessions(self) -> dict[bytes, Peer]:
        """Every known peer by routing id."""
        return self.peers.by_id

    @property
    def subscriptions(self) -> TopicTrie[Peer]:
        return self.pubsub.subscriptions

    @property
    def services(self) -> dict[str, Service]:
        return self.rpc.services

    def monitoring(self, now: float) -> None:
        """The monitor is being read: refresh what it shows that the store keeps (JetStream's
        consumer figures, asked at most every few seconds; see ``StoreConsumers.monitor``)."""
        replicated = [j.name for j in self.journaling.every_journal() if j.settings.replicated]
        self.rooms.store_consumers.monitor(replicated, now)

    def report(self, op: str) -> object | None:
        """The data behind ``mc0.broker`` ops (None for an unknown op)."""
        return self.builtins.report(op)

    # ================================================================ input
    def handle(
        self,
        routing_id: bytes,
        frames: Sequence[bytes],
        now: float,
        identity: str = P.ANONYMOUS,
        fd: int | None = None,
    ) -> list[Out]:
        """One message from a peer -> what to send.

        ``identity`` is the authenticated identity of *this message* and ``fd``
        the connection it came on.  A routing id is only a name a peer chose:
        when either differs from its peer's, the connection behind that
        routing id changed hands, and the stale peer is forgotten before
        anything else (nothing of it reaches the newcomer).
        """
        self.counters["received"] += 1
        if is_route_id(routing_id):  # a route speaks only through the cluster link (routeinput.py)
            self.counters["route_id_refused"] += 1
            return []
        return self._received(routing_id, frames, now, identity, fd)

    def _received(
        self, routing_id: bytes, frames: Sequence[bytes], now: float, identity: str, fd: int | None
    ) -> list[Out]:
        """``handle``'s work on a message already counted (one that waited behind its peer's batch
        comes here when its turn comes: see ``resume``)."""
        if self._unfinished and routing_id in self._unfinished:  # behind its own batch, in order
            return self.batched.defer(routing_id, frames, now, identity, fd)
        if identity in self.peers.revoked:
            self.counters["revoked_dropped"] += 1
            return self._revoked_connect(routing_id, frames)
        out: list[Out] = []
        peer = self.peers.by_id.get(routing_id)
        if peer is not None and (peer.identity != identity or (fd is not None and peer.fd != fd)):
            self.counters["routing_id_changed_hands"] += 1
            out = self.rooms.forget(peer, "replaced", now)
            peer = None
        foreign = self._dialect_of(frames, peer) if frames else None
        if foreign is not None:  # MDP/0.2, seed 000, eMQP, DCP: see mc0.broker.dialects
            if not self.settings.foreign_dialects:
                self.counters["foreign_refused"] += 1
                return out
            if peer is not None:
                peer.msgs_in += 1
                peer.bytes_in += len(frames[-1])
            return out + foreign(self.dialect_ops, peer, routing_id, frames, now, identity, fd)
        if frames and not frames[0]:  # enveloped: "" VERB ... (an mc0d-era DEALER)
            answers = self._command(routing_id, peer, frames[1:], now, identity, fd, True)
            if routing_id not in self.peers.by_id:  # no session carries the framing (the shell's job): here
                answers = [(r, _enveloped_to(routing_id, r, p)) for r, p in answers]
        else:
            answers = self._command(routing_id, peer, frames, now, identity, fd, False)
        return out + answers if out else answers

    def _revoked_connect(self, routing_id: bytes, frames: Sequence[bytes]) -> list[Out]:
        """A revoked identity's messages are dropped, but for an mc0 CONNECT: a connection whose handshake
        passed just before the revocation took effect asks for a session, and is answered 401 "key
        revoked" (with its ID, in its framing) so that its client says why instead of timing out.  Only
        a CONNECT is decoded: what else such a connection sends costs a comparison."""
        enveloped = len(frames) > 1 and not frames[0]
        body = frames[1:] if enveloped else frames
        if not body or body[0] != _CONNECT_VERB:
            return []
        try:
            command = P.decode(body, sender=Side.PEER, limits=self.settings.limits)
        except ProtocolError:
            return []  # (not even a CONNECT: dropped, as everything else it sends)
        answer = P.error(Status.NOT_CONNECTED, _KEY_REVOKED, command.id)
        return [(routing_id, P.enveloped(answer) if enveloped else answer)]

    def _command(
        self,
        routing_id: bytes,
        peer: Peer | None,
        frames: Sequence[bytes],
        now: float,
        identity: str,
        fd: int | None,
        enveloped: bool,
    ) -> list[Out]:
        """One mc0 command (its envelope, if any, removed) from ``peer`` (None: not connected)."""
        rooms = self.rooms
        if peer is not None:
            peer.last_recv = now
            if len(frames) == 3 and frames[0] == _BATCH and not frames[1]:
                peer.bytes_in += len(frames[2])  # (its records count as messages as they are walked)
                return self.batched.batch(peer, frames[2], now)
            peer.msgs_in += 1
            peer.bytes_in += len(frames[-1]) if frames else 0  # the body, as /varz in_bytes counts
            if (
                len(frames) == 1
                and frames[0] == _NOOP
                and peer.enveloped is enveloped
                and peer.dialect.name == _MC0_NAME
            ):
                # A bare heartbeat (no ID: nothing to answer) from an mc0 session in its framing: heard is
                # all it means, as the verb table would find (answer() with no ID), without its decode.
                # Idle peers send nothing else: at 10,000 of them this is most of the broker's input.
                return []
        out: list[Out] = []
        try:
            command = P.decode(frames, sender=Side.PEER, limits=self.settings.limits)
            if peer is None:
                if command.verb is Verb.CONNECT:
                    return sessions.connect(
                        rooms,
                        routing_id,
                        identity,
                        command,
                        now,
                        fd=fd,
                        enveloped=enveloped,
                    )
                if command.verb is Verb.DISCONNECT:
                    return [(routing_id, P.ok(command.id))] if command.id is not None else []
                raise ProtocolError(Status.NOT_CONNECTED, "not connected: send CONNECT first", command.id)
            if peer.dialect.name != P.MC0_DIALECT.name:
                raise ProtocolError(Status.BAD_REQUEST, "an MDP peer cannot switch to mc0 frames", command.id)
            if peer.enveloped is not enveloped:  # a new CONNECT may change the framing, nothing else
                if command.verb is _CONNECT:
                    out += sessions.connect(
                        rooms, routing_id, identity, command, now, replacing=peer, enveloped=enveloped
                    )
                    return rooms.with_finished(out, now)
                framing = "behind an empty frame" if peer.enveloped else "without an empty first frame"
                raise ProtocolError(
                    Status.BAD_REQUEST, f"this session was opened {framing}: keep its framing", command.id
                )
            if peer.legacy and not P.PEER_GRAMMAR[command.verb].seed:
                raise ProtocolError(
                    Status.BAD_REQUEST, f"{command.verb} is not part of protocol {peer.version}", command.id
                )
            out += self.verbs[command.verb](rooms, peer, command, now)
        except ProtocolError as exc:
            out += rooms.reject(routing_id, peer, frames, exc, now)
        return rooms.with_finished(out, now)

    @property
    def unfinished(self) -> bool:
        """Batches (or messages waiting behind them) are left for ``resume``."""
        return bool(self._unfinished)

    def resume(self, now: float, budget: int) -> list[Out]:
        """Walk on through unfinished batches (see :meth:`BatchedInput.resume`), about ``budget``
        records; each message that waited behind a batch is handled here, in its turn."""
        out: list[Out] = []
        for routing_id, frames, identity, fd in self.batched.resume(now, budget, out):
            try:
                out += self._received(routing_id, frames, now, identity, fd)
            except Exception as exc:  # the per-message guard, as the shell's for what it reads
                out += self.rooms.internal_error(routing_id, frames, exc, now=now)
        return out

    # ================================================================ the guards' answers
    def internal_error(
        self,
        routing_id: bytes,
        frames: Sequence[bytes],
        exc: BaseException,
        request_id: str | None = None,
        *,
        now: float = 0.0,
    ) -> list[Out]:
        """The shell's per-message guard caught ``exc`` (see :meth:`Rooms.internal_error`)."""
        return self.rooms.internal_error(routing_id, frames, exc, request_id, now=now)

    def listener_fault(self, listener: str, exc: BaseException, now: float) -> None:
        """The shell's guard caught ``exc`` while it handled what a listener (MemoDB, the cluster
        link) received (a bug, or storage that failed): counted and logged within the log's bound;
        what the listener received next is still handled."""
        self.counters["internal_errors"] += 1
        if self.rooms.log_limit.allow(f"listener {listener}", f"receiving:{type(exc).__name__}", now):
            log.error("internal error handling what the %s listener received", listener, exc_info=exc)
        else:
            self.counters["log_lines_left_out"] += 1

    def peer_fault(self, routing_id: bytes, doing: str, exc: BaseException, now: float) -> list[Out]:
        """The shell's per-peer guard caught ``exc`` while ``doing`` something for this peer (a bug;
        its queue is already gone): count and log it, close the session (it heals by reconnecting)
        and tell it so; nothing else changes."""
        rooms = self.rooms
        self.counters["internal_errors"] += 1
        peer = self.peers.get(routing_id)
        rooms.log_fault(peer, doing, exc, now)
        if peer is None:
            return []
        out = rooms.forget(peer, "internal_error", now)
        reason = f"internal error: {type(exc).__name__}; session closed"
        out.append((routing_id, peer.dialect.error(None, "", Status.HANDLER_FAILED, reason)))
        return rooms.with_finished(out, now)

    # ================================================================ connections
    def take_forgotten(self) -> list[bytes]:
        """Routing ids whose peers were forgotten since the last call: the shell frees their queues."""
        taken = self.forgotten[:]
        self.forgotten.clear()  # in place: the shell may hold the list
        return taken

    def forget(self, peer: Peer, why: str, now: float, *, reason: str | None = None) -> list[Out]:
        """Drop a peer and everything it held, in every room (see :meth:`Rooms.forget`)."""
        return self.rooms.forget(peer, why, now, reason=reason)

    def connection_opened(self, fd: int, address: str) -> None:
        """The shell read a first message from connection ``fd``, whose transport says it comes from
        ``address``: a peer that connects on it shows it (/connz)."""
        self.peers.opened(fd, address)

    def connection_closed(self, fd: int, now: float) -> None:
        """The shell saw connection ``fd`` close; its peer goes at ``forget_closed``.

        What that connection sent before it closed may still wait in the
        shell's socket queue (a worker's FINAL, then its DISCONNECT), so the
        peer stays until the shell has read the queue empty.  The fd is
        unbound at once: a new connection may reuse the number before then.
        """
        self.peers.connection_closed(fd, now)

    def caught_up(self, when: float) -> None:
        """The shell read every message peers sent before ``when`` (its socket read empty, or
        polled empty): a peer's silence is measured up to here, never into time the broker
        spent busy without reading (``PeerTable.expired``)."""
        self.peers.heard_until = when

    @property
    def closing(self) -> bool:
        """Closes are waiting for the shell to read its socket empty."""
        return self.peers.closing

    def forget_closed(self, now: float, *, drained: bool) -> list[Out]:
        """Forget the peers of closed connections.

        ``drained``: the shell read its socket empty after those closes were
        reported, so all they sent has been handled.  Otherwise (a socket that
        never reads empty under load) only closes older than
        ``CLOSE_WAIT_LIMIT`` go: fair queueing has read their last messages by then.
        """
        rooms = self.rooms
        out: list[Out] = []
        for peer in self.peers.closed_peers(now, drained=drained, reading=self._unfinished):
            out += rooms.forget(peer, "closed", now)
        return rooms.with_finished(out, now)

    # ================================================================ journals
    @property
    def uncommitted(self) -> bool:
        """``commit()`` has work: appends to write, consumer state to save or answers to release."""
        return self.journaling.uncommitted or self.consumers.uncommitted or self.mailboxes.uncommitted

    def commit(self) -> list[Out]:
        """Commit the journals' appends (one write and, per policy, one fsync each); the OKs now due."""
        mailboxes = self.mailboxes
        mailboxes.before_commit()
        out = self.journaling.commit()
        if mailboxes.journal is not None:
            mailboxes.after_commit(mailboxes.journal.name in self.journaling.failed)
        return out + self.consumers.commit()

    def restore(self, now: float) -> None:
        """Rebuild what the journals keep besides records (the mailboxes); once, after they are open."""
        self.mailboxes.restore(now)

    @property
    def paging(self) -> bool:
        """Replays or fetches are sending pages (call ``pages`` every loop turn)."""
        return self.journaling.paging

    def pages(self, now: float) -> list[PageOut]:
        """One page of every running replay and fetch (see :meth:`Journaling.pages`)."""
        return self.journaling.pages(now)

    def page_blocked(self, blocked: PageOut, now: float) -> None:
        """A page could not be queued: rewind its replay or fetch and pause it briefly."""
        peer = self.peers.get(blocked.routing_id)
        if peer is not None:
            self.journaling.page_blocked(blocked, peer, now)

    # ================================================================ time and failures
    def tick(self, now: float) -> list[Out]:
        """Deadlines, heartbeats, expiry and retention; call at ``next_deadline()`` or later."""
        rooms = self.rooms
        self.journaling.enforce_retention(now)
        self.traffic.prune(now)
        for line in rooms.log_limit.summary(now):
            log.warning("%s", line)
        self.mailboxes.expire(now)
        out = self.rpc.expire(now) + self.consumers.tick(now) + self.builtins.admin.expire(now)
        if now >= self.peers.next_sweep:
            expired, beats = self.peers.sweep(now, self.settings.liveness, self.rpc.has_requests)
            for peer in expired:
                out += rooms.forget(peer, "expired", now)
            out += beats
        return rooms.with_finished(out, now)

    def next_deadline(self) -> float:
        """When ``tick`` (or a paused replay or fetch) next has work (monotonic seconds)."""
        if self.consumers.has_work():
            return 0.0  # a waiting pull can be answered
        earliest = self.consumers.next_deadline(min(self.peers.next_sweep, self.mailboxes.next_expiry))
        if self.mailboxes.stored is not None:
            earliest = self.mailboxes.stored.next_deadline(earliest)
        deadline = self.rpc.next_deadline()
        if deadline is not None:
            earliest = min(earliest, deadline)
        return self.journaling.next_deadline(earliest)

    def send_failed(self, routing_id: bytes, now: float, *, unreachable: bool) -> list[Out]:
        """The shell could not send to a peer: gone (unreachable) or at HWM."""
        peer = self.peers.get(routing_id)
        if peer is None:
            return []
        if peer.route:  # its queue is over budget (NATS slow or stalled): counted, the route resynced
            self.counters["route_queue_dropped"] += 1
            self.routes.overflowed(peer)
            return []
        if unreachable:
            return self.rooms.with_finished(self.rooms.forget(peer, "unreachable", now), now)
        self.counters["dropped"] += 1
        if not self.peers.dropped(peer, now, self.settings.slow_consumer_ms):
            return []
        return self._evict_slow(peer, now)

    def evict_stalled(self, routing_id: bytes, now: float) -> list[Out]:
        """The shell says this peer's queue has refused messages and the socket has taken nothing
        for it for ``slow_consumer_ms``: a slow consumer, whether or not input kept coming (while
        the input is held for a reader nothing is dropped for it, but it is no less stuck)."""
        peer = self.peers.get(routing_id)
        if peer is not None and peer.route:  # (its queue is gone: what it held is lost) resynced, not evicted
            self.counters["route_queue_stalled"] += 1
            self.routes.overflowed(peer)
            return []
        return self._evict_slow(peer, now) if peer is not None and self.settings.slow_consumer_ms else []

    def _evict_slow(self, peer: Peer, now: float) -> list[Out]:
        rooms = self.rooms
        routing_id = peer.routing_id
        if rooms.log_limit.allow(peer.identity, "too slow", now):
            log.warning("peer %s too slow: %d messages dropped; disconnecting", peer.name, peer.drops)
        else:
            self.counters["log_lines_left_out"] += 1
        out = rooms.forget(peer, "too_slow", now)
        reason = f"consumer too slow: {peer.drops} messages dropped; disconnected"
        out.append((routing_id, _last_words(peer, P.error(Status.OVER_LIMIT, reason))))
        out.append((routing_id, _last_words(peer, P.DISCONNECT_FRAMES)))
        return rooms.with_finished(out, now)

    # ================================================================ security changes
    def revoke(self, identities: set[str], now: float) -> list[Out]:
        """Keys withdrawn: their peers get 401 and are forgotten; later messages are dropped."""
        rooms = self.rooms
        self.peers.revoked |= identities
        out: list[Out] = []
        for peer in [p for p in self.peers.by_id.values() if p.identity in identities]:
            log.warning("identity %s revoked: dropping %s", peer.identity, peer.name)
            out += rooms.forget(peer, "revoked", now)
            revoked = peer.dialect.error(None, "", Status.NOT_CONNECTED, _KEY_REVOKED)
            out.append((peer.routing_id, _last_words(peer, revoked)))
        return rooms.with_finished(out, now)

    def allow(self, identities: set[str]) -> None:
        """Keys (re)admitted: stop dropping their messages."""
        self.peers.revoked -= identities

    def set_permissions(self, permissions: Permissions, now: float) -> list[Out]:
        """New policy: recompute grants; withdraw subscriptions, services and durable consumers'
        waiting pulls it no longer allows (each told 403)."""
        self.rooms.permissions = permissions
        out: list[Out] = []
        # (Routes are not: their brokers check their own peers.)
        for peer in [p for p in self.peers.by_id.values() if not p.route]:
            grants = peer.grants = permissions.grants(peer.identity)
            out += self.pubsub.withdraw_denied(peer, grants)
            sent, dropped = self.rpc.withdraw_denied(peer, grants, now)
            if dropped:
                out += sent
                reason = f"serving {dropped} withdrawn by policy"
                out.append((peer.routing_id, peer.dialect.error(None, "", Status.FORBIDDEN, reason)))
        out += self.consumers.withdraw_denied()
        return self.rooms.with_finished(out, now)

    def shutdown(self, now: float) -> list[Out]:
        """DISCONNECT every peer (that has a way to be told) and forget them all."""
        rooms = self.rooms
        out: list[Out] = []
        for peer in list(self.peers.by_id.values()):
            frames = peer.dialect.disconnect()
            if frames is not None:
                out.append((peer.routing_id, _last_words(peer, frames)))
        for peer in list(self.peers.by_id.values()):
            rooms.forget(peer, "broker_shutdown", now)
        self._unfinished.clear()
        rooms.with_finished([], now)  # telemetry of the shutdown goes to the journals, not to peers
        return out


def _enveloped_to(routing_id: bytes, to: bytes, payload: Sequence[bytes] | bytes) -> Sequence[bytes] | bytes:
    """``payload`` for ``to``, behind an empty frame when it goes to ``routing_id`` (an enveloped peer
    with no session to carry its framing) and is frames, not a batch record."""
    return P.enveloped(payload) if to == routing_id and not isinstance(payload, bytes) else payload


def _last_words(peer: Peer, frames: Sequence[bytes]) -> Sequence[bytes]:
    """What is sent to a peer the core just forgot, in its session's framing: the shell
    envelopes only what it sends to a known peer."""
    return P.enveloped(frames) if peer.enveloped else frames
