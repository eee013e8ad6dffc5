"""Seed 000 ("Protocol 0.1", MDP with request ids) on the mc0 broker.

Contract: ``is_mdpx(frames, peer)`` recognises a message of this dialect;
``decode`` turns one into a :class:`Seed000Command` or raises ProtocolError;
``handle`` drives the broker core through :class:`~mc0.broker.dialects.mdp.CoreOps`
(the narrow interface every foreign dialect uses), so these clients and
workers share one service registry with mc0, MDP/0.2 and the other dialects.
Pure: no sockets, no clock.

The seed leaves frame 0's protocol name open.  We chose ``MDPXC01`` for
clients and ``MDPXW01`` for workers ("MDP eXtended", protocol 0.1): seven
bytes, so never MDP/0.2's ``MDPC02``/``MDPW02``, which keep meaning MDP/0.2.
Client and worker need different names because their command codes overlap
(client 0x01 is REQUEST, worker 0x01 is READY).  No empty envelope frame:
the seed's peers are DEALERs.  Frames (after the routing id)::

    client -> broker   MDPXC01 0x01 service request-id body...        (REQUEST, many in flight)
    broker -> client   MDPXC01 0x02|0x03 service request-id body...   (PARTIAL | FINAL)
    worker -> broker   MDPXW01 0x01 service                           (READY, once)
                       MDPXW01 0x03|0x04 address "" request-id body... (PARTIAL | FINAL)
                       MDPXW01 "PING"                                  -> MDPXW01 "PONG"
                       MDPW02 0x06  (or MDPXW01 0x06)                  (DISCONNECT)
    broker -> worker   MDPXW01 0x02 address "" request-id body...     (REQUEST)
                       MDPW02 0x06                                     (DISCONNECT, as the seed writes it)

The client's request id is its own: a FINAL (or error) carries it back, and
an id still outstanding is refused (an error FINAL with 409).  A worker
sees the broker's request token in both the address and the request-id
frame: clients' ids are unique only per client, a worker's must be unique
among everything it holds.  Its replies are routed by the address frame
and must repeat the request id.  An error for a client (no worker, deadline,
...) is a FINAL whose body is three frames: ``ERROR``, the status code, the
reason (as for MDP/0.2).

Refusals, as the seed prescribes: an invalid message is dropped and counted
(and a known worker that sent it is disconnected: "treat that peer as
invalid"); a valid but unexpected worker command (PING or a reply before
READY, a second READY) is answered with DISCONNECT and the worker forgotten.
The broker never PINGs: it answers PING with PONG and forgets a worker
silent for ``liveness`` x ``foreign_ttl_ms``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...errors import ProtocolError
from ...protocol import Dialect, Status, Verb, in_band_body, in_band_error
from ..core.peers import Out, Peer
from .base import Admission, CoreOps

log = logging.getLogger("mc0.broker")

CLIENT = b"MDPXC01"
WORKER = b"MDPXW01"
MDP_WORKER = b"MDPW02"  # the seed writes DISCONNECT with MDP/0.2's worker header
# Client commands
REQUEST = b"\x01"
C_PARTIAL = b"\x02"
C_FINAL = b"\x03"
# Worker commands
READY = b"\x01"
W_REQUEST = b"\x02"
W_PARTIAL = b"\x03"
W_FINAL = b"\x04"
DISCONNECT = b"\x06"
PING = b"PING"
PONG = b"PONG"

ERROR_MARK = b"ERROR"
MAX_REQUEST_ID_BYTES = 255  # a client's request id (the seed suggests a uuid)
DISCONNECT_FRAMES = [MDP_WORKER, DISCONNECT]


@dataclass(frozen=True, slots=True)
class Seed000Command:
    role: bytes  # CLIENT or WORKER
    command: bytes
    service: str | None = None
    token: str | None = None  # a worker reply's address frame (the broker's request token)
    request_id: str | None = None
    body: Sequence[bytes] = ()


def is_mdpx(frames: Sequence[bytes], peer: Peer | None) -> bool:
    """This dialect's message: its own header, or MDP's DISCONNECT from one of its workers."""
    first = frames[0]
    if first == CLIENT or first == WORKER:
        return True
    return peer is not None and peer.dialect is WORKER_DIALECT and first == MDP_WORKER


def _text(frame: bytes, what: str, limit: int = MAX_REQUEST_ID_BYTES) -> str:
    if not frame or len(frame) > limit:
        raise ProtocolError(Status.BAD_REQUEST, f"seed-000 {what} is empty or over {limit} bytes")
    try:
        return bytes(frame).decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(Status.BAD_REQUEST, f"seed-000 {what} is not UTF-8") from None


def decode(frames: Sequence[bytes]) -> Seed000Command:
    """Frames (routing id removed) -> a command; ProtocolError if invalid."""
    if len(frames) < 2:
        raise ProtocolError(Status.BAD_REQUEST, "seed-000 message without a command frame")
    role, command = bytes(frames[0]), bytes(frames[1])
    if role == CLIENT:
        if command != REQUEST or len(frames) < 4:
            raise ProtocolError(Status.BAD_REQUEST, f"seed-000 client command {command[:8]!r} invalid or short")
        return Seed000Command(
            role,
            command,
            service=_text(frames[2], "service"),
            request_id=_text(frames[3], "request id"),
            body=frames[4:],
        )
    if role == MDP_WORKER:
        if command != DISCONNECT or len(frames) != 2:
            raise ProtocolError(Status.BAD_REQUEST, "only DISCONNECT may use the MDPW02 header")
        return Seed000Command(WORKER, command)
    if command == READY:
        if len(frames) != 3:
            raise ProtocolError(Status.BAD_REQUEST, "seed-000 READY takes exactly one service frame")
        return Seed000Command(role, command, service=_text(frames[2], "service"))
    if command in (W_PARTIAL, W_FINAL):
        if len(frames) < 5 or frames[3]:
            raise ProtocolError(Status.BAD_REQUEST, "seed-000 reply needs address, empty delimiter, request id")
        token, request_id = _text(frames[2], "address"), _text(frames[4], "request id")
        if token != request_id:
            raise ProtocolError(Status.BAD_REQUEST, "seed-000 reply's request id does not match its address")
        return Seed000Command(role, command, token=token, request_id=request_id, body=frames[5:])
    if command in (PING, DISCONNECT):
        if len(frames) != 2:
            raise ProtocolError(Status.BAD_REQUEST, f"seed-000 {command!r} takes no more frames")
        return Seed000Command(role, command)
    raise ProtocolError(Status.BAD_REQUEST, f"seed-000 worker command {command[:8]!r} unknown")


def _reply_body(body: Sequence[bytes]) -> Sequence[bytes]:
    """A reply's body for a seed-000 client: at least one frame (the seed's PARTIAL and FINAL are
    "5 or more frames"), and never a worker's imitation of the broker's in-band error."""
    return in_band_body(body) if body else (b"",)


class ClientDialect:
    """Broker -> seed-000 client rendering (clients take no heartbeats)."""

    name = "seed000-client"
    heartbeats = False
    one_frame = False

    def to_worker(
        self, bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        raise AssertionError("a seed-000 client is never given work")  # pragma: no cover

    def cancel(self, bid: str) -> list[bytes] | None:
        return None

    def partial(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        return [CLIENT, C_PARTIAL, service.encode(), rid.encode(), *_reply_body(body)]

    def final(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        return [CLIENT, C_FINAL, service.encode(), rid.encode(), *_reply_body(body)]

    def error(self, rid: str | None, service: str, code: int, reason: str) -> list[bytes]:
        return [CLIENT, C_FINAL, service.encode(), (rid or "").encode(), *in_band_error(code, reason)]

    def heartbeat(self) -> Sequence[bytes] | None:
        return None

    def disconnect(self) -> Sequence[bytes] | None:
        return None


class WorkerDialect:
    """Broker -> seed-000 worker rendering (the worker PINGs; the broker only answers)."""

    name = "seed000-worker"
    heartbeats = True  # liveness applies: a worker silent for liveness x TTL is forgotten
    one_frame = False

    def to_worker(
        self, bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        token = bid.encode()
        return [WORKER, W_REQUEST, token, b"", token, *body]

    def cancel(self, bid: str) -> list[bytes] | None:
        return None  # no cancel in the seed: a late reply is dropped and counted

    def partial(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        raise AssertionError("a seed-000 worker sends no requests")  # pragma: no cover

    final = partial

    def error(self, rid: str | None, service: str, code: int, reason: str) -> list[bytes]:
        return list(DISCONNECT_FRAMES)  # a worker has no error message: being refused is being disconnected

    def heartbeat(self) -> Sequence[bytes] | None:
        return None

    def disconnect(self) -> Sequence[bytes] | None:
        return list(DISCONNECT_FRAMES)


CLIENT_DIALECT = ClientDialect()
WORKER_DIALECT = WorkerDialect()


def _drop_worker(core: CoreOps, peer: Peer, why: str, now: float) -> list[Out]:
    """DISCONNECT a worker and forget it (it must reconnect on a new socket)."""
    return [(peer.routing_id, list(DISCONNECT_FRAMES)), *core.forget(peer, why, now)]


class MdpxAdmission(Admission[Seed000Command]):
    """Seed 000 through the shared skeleton (``base.Admission``)."""

    name = "seed000"  # (its counters and the protocol its peers are shown with, as before)

    def decode(self, frames: Sequence[bytes]) -> Seed000Command:
        return decode(frames)

    def owns(self, dialect: Dialect) -> bool:
        return dialect is CLIENT_DIALECT or dialect is WORKER_DIALECT

    def newcomer(self, command: Seed000Command) -> Dialect:
        return CLIENT_DIALECT if command.role == CLIENT else WORKER_DIALECT

    def malformed(self, core: CoreOps, peer: Peer | None, now: float) -> list[Out]:
        if peer is not None and peer.dialect is WORKER_DIALECT:
            return _drop_worker(core, peer, "invalid", now)
        return []

    def early(
        self, core: CoreOps, peer: Peer | None, routing_id: bytes, command: Seed000Command, now: float
    ) -> list[Out] | None:
        if peer is not None and peer.dialect is not self.newcomer(command):
            core.counters["seed000_mismatch"] += 1
            return []
        if peer is None and command.command == DISCONNECT and command.role == WORKER:
            return []
        if peer is None and command.role == WORKER and command.command != READY:
            # Valid but unexpected (nothing before READY but DISCONNECT): DISCONNECT.
            core.counters["seed000_unexpected"] += 1
            return [(routing_id, list(DISCONNECT_FRAMES))]
        if peer is not None and command.role == WORKER and command.command == READY:
            core.counters["seed000_unexpected"] += 1  # "The worker MUST NOT send a further READY"
            return _drop_worker(core, peer, "unexpected", now)
        return None

    def act(self, core: CoreOps, peer: Peer, routing_id: bytes, command: Seed000Command, now: float) -> list[Out]:
        if command.role == CLIENT:
            assert command.service is not None and command.request_id is not None
            if not command.body:  # "a REQUEST command consists of ... 5 or more frames"
                raise ProtocolError(Status.BAD_REQUEST, "a seed-000 REQUEST needs a body frame (5 or more frames)")
            return core.call(peer, command.service, command.body, now, rid=command.request_id)
        if command.command == READY:
            assert command.service is not None
            return core.serve(peer, (command.service,), 1, now)
        if command.command == DISCONNECT:
            return core.forget(peer, "disconnected", now)
        if command.command == PING:
            peer.last_sent = now
            return [(routing_id, [WORKER, PONG])]
        assert command.token is not None
        verb = Verb.FINAL if command.command == W_FINAL else Verb.PARTIAL
        return core.worker_reply(peer, verb, command.token, command.body, now)

    def refused(
        self, core: CoreOps, peer: Peer, routing_id: bytes, command: Seed000Command, exc: ProtocolError, now: float
    ) -> list[Out]:
        if command.role == CLIENT:
            return [(routing_id, peer.dialect.error(command.request_id, command.service or "", exc.code, exc.reason))]
        return _drop_worker(core, peer, "refused", now)  # a refused READY: the seed's only refusal is DISCONNECT


handle = MdpxAdmission().handle  # (the dialect router's handler)
