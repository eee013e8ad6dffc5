"""Sessions of mc0 peers: CONNECT (a session opened, or replaced once the new one is valid) and DISCONNECT.

Contract: plain functions of the rooms (:class:`~mc0.broker.core.rooms.Rooms`), as the
verbs are: ``connect`` checks the whole CONNECT before anything changes
(routing id rule, VERSION, TTL, BATCH/ECHO), then opens the peer in every room
and answers OK with the TTL in force (a message of its own, never a record
in a ``BATCH``: ``P.Unbatched``), followed by the letters kept for its
identity.  Pure: no sockets, no clock.
"""

from __future__ import annotations

import logging

from ... import protocol as P
from ...errors import ProtocolError, quoted
from ...protocol import Command, Header, Status
from .peers import Out, Peer, connect_flag, generated_routing_id
from .rooms import Rooms

log = logging.getLogger("mc0.broker")


def connect(
    rooms: Rooms,
    routing_id: bytes,
    identity: str,
    command: Command,
    now: float,
    replacing: Peer | None = None,
    fd: int | None = None,
    enveloped: bool = False,
) -> list[Out]:
    """Open a session; a repeated CONNECT replaces the old one only once it is valid.

    Without VERSION the peer speaks the oldest (0.1); without TTL it gets
    ``DEFAULT_TTL_MS`` (in the OK) and is never expired for silence (mc0d
    and mc0torture send ``CONNECT ID x``).  An ``enveloped`` session is
    never batched (its frames, not records, carry the envelope).
    """
    if rooms.generated_ids_only and not generated_routing_id(routing_id):
        raise ProtocolError(
            Status.BAD_REQUEST,
            "this broker refuses chosen routing ids (unset ZMQ_ROUTING_ID)",
            command.id,
        )
    version = command.headers.get(Header.VERSION, P.OLDEST_VERSION)
    if version not in P.VERSIONS:
        raise ProtocolError(
            Status.UNSUPPORTED_VERSION,
            f"version {quoted(version, 16)} unsupported; this broker speaks {', '.join(sorted(P.VERSIONS))}",
            command.id,
        )
    named_ttl = Header.TTL in command.headers
    asked = P.parse_int(command, Header.TTL, minimum=1) if named_ttl else P.DEFAULT_TTL_MS
    ttl_ms = min(max(asked, rooms.settings.min_ttl_ms), rooms.settings.max_ttl_ms)
    batched, echo = (connect_flag(command, header, version) for header in (Header.BATCH, Header.ECHO))
    out: list[Out] = []
    if replacing is not None:
        out = rooms.forget(replacing, "reconnected", now)
        fd = replacing.fd
    batched = batched and not enveloped
    dialect = P.MC0_BATCHED_DIALECT if batched else P.MC0_DIALECT
    peer = Peer(routing_id, identity, version, ttl_ms / 1000.0, now, dialect, fd)
    peer.batched, peer.echo, peer.enveloped, peer.expires = batched, echo, enveloped, named_ttl
    peer.beat = ttl_ms / 1000.0 * P.HEARTBEAT_FRACTION
    out += rooms.open_peer(peer, now)
    log.info(
        "peer %s connected as %s (protocol %s, ttl %d ms%s)",
        peer.name,
        identity,
        version,
        ttl_ms,
        ", enveloped" if enveloped else "",
    )
    if command.id is not None:  # (never inside a BATCH: the peer switches to batches once it has read it)
        out.append((routing_id, P.Unbatched(P.ok(command.id, ttl_ms=ttl_ms, batch=peer.batched))))
    return out + rooms.mailboxes.online(peer, now)  # letters kept for it, after the OK


def reconnect(rooms: Rooms, peer: Peer, command: Command, now: float) -> list[Out]:
    """A CONNECT in the session's own framing (one that changes it is handled by the dispatcher's ``_command``)."""
    return connect(rooms, peer.routing_id, peer.identity, command, now, replacing=peer, enveloped=peer.enveloped)


def disconnect(rooms: Rooms, peer: Peer, command: Command, now: float) -> list[Out]:
    out = rooms.forget(peer, "disconnected", now)
    if command.id is not None:
        out.append((peer.routing_id, P.ok(command.id)))
    return out
