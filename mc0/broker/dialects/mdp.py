"""Majordomo MDP/0.2 on the mc0 broker: frames <-> the core's RPC operations.

Contract: ``is_mdp(frames)`` recognises a message whose first frame (after an
optional empty envelope frame, as REQ-emulating DEALERs such as majortomo
send) is ``MDPC02`` or ``MDPW02``; ``decode`` turns it into an
:class:`MdpCommand` or raises ProtocolError (the broker drops and counts
those: MDP has no error reply).  The dialect classes render the broker's RPC
traffic back into MDP frames, so MDP clients and workers share services with
mc0 ones.  The client-address frame an MDP worker sees is the broker's opaque
request token, never a routing id.

Frames (after the routing id), as majortomo 0.2 speaks them::

    client -> broker   [""] MDPC02 0x02 service body...
    broker -> client   [""] MDPC02 0x03|0x04 service body...     (PARTIAL | FINAL)
    worker -> broker   [""] MDPW02 0x01 service                  (READY)
                       [""] MDPW02 0x03|0x04 token "" body...    (PARTIAL | FINAL)
                       [""] MDPW02 0x05 | 0x06                   (HEARTBEAT | DISCONNECT)
    broker -> worker   [""] MDPW02 0x02 token "" body...         (REQUEST)
                       [""] MDPW02 0x05 | 0x06

An error for an MDP client (no worker, deadline, ...) arrives as a FINAL whose
body is three frames: ``ERROR``, the status code, the reason.

``handle`` drives the broker core through :class:`~mc0.broker.dialects.base.CoreOps`, the narrow
interface every foreign dialect uses (open a peer, forget it, call a
service, serve services, reply to a job).
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

CLIENT = b"MDPC02"
WORKER = b"MDPW02"
READY = b"\x01"
REQUEST = b"\x02"
PARTIAL = b"\x03"
FINAL = b"\x04"
HEARTBEAT = b"\x05"
DISCONNECT = b"\x06"

ERROR_MARK = b"ERROR"  # first body frame of an error FINAL to an MDP client


@dataclass(frozen=True, slots=True)
class MdpCommand:
    role: bytes  # CLIENT or WORKER
    command: bytes
    envelope: bool  # the peer framed its messages with a leading empty frame
    service: str | None = None
    token: str | None = None
    body: Sequence[bytes] = ()


def is_mdp(frames: Sequence[bytes]) -> bool:
    first = frames[0]
    if first == CLIENT or first == WORKER:
        return True
    return not first and len(frames) > 1 and (frames[1] == CLIENT or frames[1] == WORKER)


def _text(frame: bytes, what: str) -> str:
    try:
        text = bytes(frame).decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(Status.BAD_REQUEST, f"MDP {what} is not UTF-8") from None
    if not text:
        raise ProtocolError(Status.BAD_REQUEST, f"MDP {what} is empty")
    return text


def decode(frames: Sequence[bytes]) -> MdpCommand:
    envelope = not frames[0]
    rest = frames[1:] if envelope else frames
    if len(rest) < 2:
        raise ProtocolError(Status.BAD_REQUEST, "MDP message without a command frame")
    role, command = bytes(rest[0]), bytes(rest[1])
    if role == CLIENT:
        if command != REQUEST or len(rest) < 3:
            raise ProtocolError(Status.BAD_REQUEST, f"MDP client command {command!r} unsupported or short")
        return MdpCommand(role, command, envelope, service=_text(rest[2], "service"), body=rest[3:])
    if command == READY:
        if len(rest) != 3:
            raise ProtocolError(Status.BAD_REQUEST, "MDP READY takes exactly one service frame")
        return MdpCommand(role, command, envelope, service=_text(rest[2], "service"))
    if command in (PARTIAL, FINAL):
        if len(rest) < 4 or rest[3]:
            raise ProtocolError(Status.BAD_REQUEST, "MDP reply needs a client frame and an empty delimiter")
        return MdpCommand(role, command, envelope, token=_text(rest[2], "client token"), body=rest[4:])
    if command in (HEARTBEAT, DISCONNECT):
        return MdpCommand(role, command, envelope)
    raise ProtocolError(Status.BAD_REQUEST, f"MDP worker command {command!r} unsupported")


class MdpClientDialect:
    """Broker -> MDP client rendering (MDP clients take no heartbeats)."""

    name = "mdp-client"
    heartbeats = False
    one_frame = False

    def __init__(self, envelope: bool) -> None:
        self._head = [b"", CLIENT] if envelope else [CLIENT]

    def to_worker(
        self, bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        raise AssertionError("an MDP client is never given work")  # pragma: no cover

    def cancel(self, bid: str) -> list[bytes] | None:
        return None

    def partial(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        return [*self._head, PARTIAL, service.encode(), *in_band_body(body)]

    def final(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        return [*self._head, FINAL, service.encode(), *in_band_body(body)]

    def error(self, rid: str | None, service: str, code: int, reason: str) -> list[bytes]:
        return [*self._head, FINAL, service.encode(), *in_band_error(code, reason)]

    def heartbeat(self) -> Sequence[bytes] | None:
        return None

    def disconnect(self) -> Sequence[bytes] | None:
        return None


class MdpWorkerDialect:
    """Broker -> MDP worker rendering."""

    name = "mdp-worker"
    heartbeats = True
    one_frame = False

    def __init__(self, envelope: bool) -> None:
        self._head = [b"", WORKER] if envelope else [WORKER]

    def to_worker(
        self, bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        return [*self._head, REQUEST, bid.encode(), b"", *body]

    def cancel(self, bid: str) -> list[bytes] | None:
        return None  # MDP has no cancel: a late reply is dropped and counted

    def partial(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        raise AssertionError("an MDP worker sends no requests")  # pragma: no cover

    final = partial

    def error(self, rid: str | None, service: str, code: int, reason: str) -> list[bytes]:
        # MDP gives a worker no error message: being refused is being disconnected.
        return [*self._head, DISCONNECT]

    def heartbeat(self) -> Sequence[bytes] | None:
        return [*self._head, HEARTBEAT]

    def disconnect(self) -> Sequence[bytes] | None:
        return [*self._head, DISCONNECT]


DIALECTS: dict[tuple[bytes, bool], Dialect] = {
    (CLIENT, False): MdpClientDialect(False),
    (CLIENT, True): MdpClientDialect(True),
    (WORKER, False): MdpWorkerDialect(False),
    (WORKER, True): MdpWorkerDialect(True),
}


class MdpAdmission(Admission[MdpCommand]):
    """MDP/0.2 through the shared skeleton (``base.Admission``)."""

    name = "mdp"

    def decode(self, frames: Sequence[bytes]) -> MdpCommand:
        return decode(frames)

    def owns(self, dialect: Dialect) -> bool:
        return dialect in _OWN

    def newcomer(self, command: MdpCommand) -> Dialect:
        return DIALECTS[(command.role, command.envelope)]

    def early(
        self, core: CoreOps, peer: Peer | None, routing_id: bytes, command: MdpCommand, now: float
    ) -> list[Out] | None:
        dialect = DIALECTS[(command.role, command.envelope)]
        if peer is not None and peer.dialect is not dialect:  # a client turned worker, or a framing switch
            core.counters["mdp_mismatch"] += 1
            return []
        if peer is None and command.command == DISCONNECT:
            return []
        if peer is None and command.role == WORKER and command.command != READY:
            # MDP: a worker the broker does not know is told to reconnect.
            disconnect = dialect.disconnect()
            return [(routing_id, disconnect)] if disconnect is not None else []
        return None

    def act(self, core: CoreOps, peer: Peer, routing_id: bytes, command: MdpCommand, now: float) -> list[Out]:
        if command.role == CLIENT:
            assert command.service is not None
            return core.call(peer, command.service, command.body, now)
        if command.command == READY:
            assert command.service is not None
            return core.serve(peer, (command.service,), 1, now)
        if command.command == DISCONNECT:
            return core.forget(peer, "disconnected", now)
        if command.command == HEARTBEAT:
            return []
        assert command.token is not None
        verb = Verb.FINAL if command.command == FINAL else Verb.PARTIAL
        return core.worker_reply(peer, verb, command.token, command.body, now)

    def refused(
        self, core: CoreOps, peer: Peer, routing_id: bytes, command: MdpCommand, exc: ProtocolError, now: float
    ) -> list[Out]:
        if command.role != CLIENT:  # MDP has no refusal for a worker
            return []
        return [(routing_id, peer.dialect.error(None, command.service or "", exc.code, exc.reason))]


_OWN = frozenset(DIALECTS.values())
handle = MdpAdmission().handle  # (the dialect router's handler)
