"""DCP v1 (seed 001, the DagBox Communication Protocol, header ``DGBX``) on the mc0 broker.

Contract: ``is_dcp(frames)`` recognises a DCP message (an empty delimiter,
then ``DGBX`` and a version byte); ``decode`` turns one into a
:class:`DcpCommand` or raises ProtocolError; ``handle`` drives the broker
core through :class:`~mc0.broker.dialects.mdp.CoreOps`, so DCP clients and workers
share one service registry with every other dialect.  Pure: no sockets, no
clock (the broker's request ids come from a counter).

Frames (after the routing id; ``H`` is ``"" DGBX\\x01``)::

    worker -> broker   H 0x01 service                      (register; echoed on success)
                       H 0x02                              (ping) -> H 0x03 (pong), or H 0x06 (reconnect)
    any    -> broker   H 0x04 service [address] "" meta... "" data...   (request)
    worker -> broker   H 0x05 address "" meta... "" data...             (reply)
    broker -> worker   H 0x04 service address "" meta... "" data...     (address: the broker's request token)
    broker -> client   H 0x05 address "" meta... "" data...             (address: the client's, else the broker's id)

Service names may hold any bytes.  A name that is a valid mc0 service name
(UTF-8, no whitespace, wildcards or empty tokens) and does not start with
``dcp.x.`` is that mc0 service; any other is ``dcp.x.`` + its bytes in hex
(at most 124 bytes), so DCP names can neither collide with nor escape mc0's
namespace, and an mc0 peer calls DCP service ``b"a b"`` as ``dcp.x.612062``.

Metadata parts travel byte for byte: the broker keeps them with the request
(an mc0 worker sees them as the ``X-Dcp-Meta`` header, base64 parts joined
by commas) and puts them back in the reply, whatever the worker sends.  A
worker holds one request at a time until it replies; a ping while it holds
requests asks for one more (capacity = held + 1).  A worker may answer with
a request carrying the client address it was given: a hand-off, whose
service's reply reaches the original client.  Errors (503, 504, ...) reach a
DCP client as a reply whose data parts are ``ERROR``, code, reason.  Invalid
messages are dropped and counted.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...errors import InvalidTopic, ProtocolError
from ...protocol import MAX_SERVICE_BYTES, Dialect, Status, Verb, in_band_body, in_band_error
from ...topics import split_topic
from ..core.peers import Out, Peer
from .base import Admission, CoreOps

log = logging.getLogger("mc0.broker")

MAGIC = b"DGBX"
PROTOCOL = MAGIC + b"\x01"
REGISTER, PING, PONG, REQUEST, REPLY, RECONNECT = (bytes([n]) for n in range(1, 7))
ESCAPE = "dcp.x."  # DCP service names that are not mc0 names live here, in hex
META_HEADER = "X-Dcp-Meta"
ERROR_MARK = b"ERROR"
HEAD = [b"", PROTOCOL]

_ids = itertools.count(1)  # the broker's ids for DCP clients' requests (unique per broker run)


def is_dcp(frames: Sequence[bytes]) -> bool:
    return len(frames) > 1 and not frames[0] and len(frames[1]) == 5 and frames[1][:4] == MAGIC


def service_name(raw: bytes) -> str:
    """A DCP service name (any bytes) -> its mc0 service name (see the module docstring)."""
    if not raw:
        raise ProtocolError(Status.BAD_REQUEST, "DCP service name is empty")
    try:
        text = bytes(raw).decode("utf-8")
        split_topic(text, max_bytes=MAX_SERVICE_BYTES)
        if not text.startswith(ESCAPE):
            return text
    except (UnicodeDecodeError, InvalidTopic):
        pass
    name = ESCAPE + bytes(raw).hex()
    if len(name) > MAX_SERVICE_BYTES:
        raise ProtocolError(Status.BAD_REQUEST, "DCP service name too long to map")
    return name


def raw_service(name: str) -> bytes:
    """The DCP bytes of an mc0 service name (the inverse of ``service_name``)."""
    if name.startswith(ESCAPE):
        try:
            return bytes.fromhex(name[len(ESCAPE) :])
        except ValueError:
            pass  # an mc0 name under dcp.x. that no DCP name maps to
    return name.encode()


def _b64(parts: Sequence[bytes]) -> str:
    return ",".join(base64.b64encode(p).decode() for p in parts)


def _unb64(text: str) -> list[bytes]:
    try:
        return [base64.b64decode(p, validate=True) for p in text.split(",")] if text else []
    except (binascii.Error, ValueError):
        return []


@dataclass(frozen=True, slots=True)
class DcpCommand:
    kind: bytes
    service: bytes = b""
    address: bytes | None = None  # a request's or reply's client address (None: left out)
    meta: Sequence[bytes] = ()
    data: Sequence[bytes] = ()


def _envelope(frames: Sequence[bytes], start: int) -> tuple[Sequence[bytes], Sequence[bytes]]:
    """metadata parts ... "" data ... from ``start``; the metadata delimiter is required."""
    for i in range(start, len(frames)):
        if not frames[i]:
            return frames[start:i], frames[i + 1 :]
    raise ProtocolError(Status.BAD_REQUEST, "DCP message without a metadata delimiter")


def decode(frames: Sequence[bytes]) -> DcpCommand:
    """Frames (routing id removed; ``is_dcp``) -> a command; ProtocolError if invalid."""
    if frames[1] != PROTOCOL:
        raise ProtocolError(Status.UNSUPPORTED_VERSION, f"DCP version {frames[1][4]} unsupported (1 only)")
    if len(frames) < 3:
        raise ProtocolError(Status.BAD_REQUEST, "DCP message without a type")
    kind, size = bytes(frames[2]), len(frames)
    if kind == REGISTER:
        if size != 4:
            raise ProtocolError(Status.BAD_REQUEST, "DCP registration takes exactly one service part")
        return DcpCommand(kind, service=bytes(frames[3]))
    if kind == PING:
        if size != 3:
            raise ProtocolError(Status.BAD_REQUEST, "DCP heartbeats are header-only")
        return DcpCommand(kind)
    if kind == REQUEST:
        if size < 6:
            raise ProtocolError(Status.BAD_REQUEST, "DCP request too short")
        if not frames[4]:  # the client address was left out: the broker inserts one
            meta, data = _envelope(frames, 5)
            return DcpCommand(kind, bytes(frames[3]), None, meta, data)
        if size < 7 or frames[5]:
            raise ProtocolError(Status.BAD_REQUEST, "DCP client address without its delimiter")
        meta, data = _envelope(frames, 6)
        return DcpCommand(kind, bytes(frames[3]), bytes(frames[4]), meta, data)
    if kind == REPLY:
        if size < 6 or not frames[3] or frames[4]:
            raise ProtocolError(Status.BAD_REQUEST, "DCP reply needs a client address and its delimiter")
        meta, data = _envelope(frames, 5)
        return DcpCommand(kind, address=bytes(frames[3]), meta=meta, data=data)
    raise ProtocolError(Status.BAD_REQUEST, f"DCP message type {kind[:4]!r} not accepted from a peer")


_RID_SEPARATOR = "|"  # never in base64 (whose alphabet has "/" and "+") nor in _b64's commas


def _request_id(address: bytes | None, meta: Sequence[bytes]) -> str:
    """The broker's id for a DCP client's request; it carries what the reply must repeat.
    (An address is never empty: an empty frame ends the address-less form's service.)"""
    encoded = base64.b64encode(address).decode() if address else ""
    return _RID_SEPARATOR.join((f"dcp-{next(_ids)}", encoded, _b64(meta)))


def _reply_head(rid: str | None) -> tuple[bytes, list[bytes]]:
    """(client address, metadata) for a reply, from the request id ``_request_id`` made."""
    number, _, rest = (rid or "").partition(_RID_SEPARATOR)
    address, _, meta = rest.partition(_RID_SEPARATOR)
    return (base64.b64decode(address) if address else number.encode()), _unb64(meta)


class DcpDialect:
    """Broker -> DCP peer rendering; one instance for clients (no heartbeats), one for workers."""

    one_frame = False

    def __init__(self, name: str, heartbeats: bool) -> None:
        self.name = name
        self.heartbeats = heartbeats

    def to_worker(
        self, bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        meta = _unb64(user.get(META_HEADER, ""))
        return [*HEAD, REQUEST, raw_service(service), bid.encode(), b"", *meta, b"", *body]

    def cancel(self, bid: str) -> list[bytes] | None:
        return None  # DCP has no cancel: a late reply is dropped and counted

    def partial(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes] | None:
        return None  # DCP has no partial replies: not forwarded (a pong to a client would be unsolicited)

    def final(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        address, meta = _reply_head(rid)
        return [*HEAD, REPLY, address, b"", *meta, b"", *in_band_body(body)]

    def error(self, rid: str | None, service: str, code: int, reason: str) -> list[bytes]:
        address, meta = _reply_head(rid)
        return [*HEAD, REPLY, address, b"", *meta, b"", *in_band_error(code, reason)]

    def heartbeat(self) -> Sequence[bytes] | None:
        return None  # workers ping; the broker only answers

    def disconnect(self) -> Sequence[bytes] | None:
        return [*HEAD, RECONNECT] if self.heartbeats else None


CLIENT_DIALECT = DcpDialect("dcp-client", heartbeats=False)
WORKER_DIALECT = DcpDialect("dcp-worker", heartbeats=True)


def _request(core: CoreOps, peer: Peer, command: DcpCommand, now: float) -> list[Out]:
    name = service_name(command.service)
    user = {META_HEADER: _b64(command.meta)} if command.meta else {}
    if command.address is not None and peer.dialect is WORKER_DIALECT:
        # A worker answering with a request for another service, under the address it was given: a hand-off.
        handed = core.hand_off(peer, command.address.decode("utf-8", "replace"), name, user, command.data, now)
        if handed is not None:
            return handed
    rid = _request_id(command.address, command.meta)
    return core.call(peer, name, command.data, now, rid=rid, user=user)


class DcpAdmission(Admission[DcpCommand]):
    """DCP v1 through the shared skeleton (``base.Admission``)."""

    name = "dcp"

    def decode(self, frames: Sequence[bytes]) -> DcpCommand:
        return decode(frames)

    def owns(self, dialect: Dialect) -> bool:
        return dialect is CLIENT_DIALECT or dialect is WORKER_DIALECT

    def newcomer(self, command: DcpCommand) -> Dialect:
        return WORKER_DIALECT if command.kind == REGISTER else CLIENT_DIALECT

    def early(
        self, core: CoreOps, peer: Peer | None, routing_id: bytes, command: DcpCommand, now: float
    ) -> list[Out] | None:
        registered = peer is not None and peer.dialect is WORKER_DIALECT
        if command.kind == PING and not registered:
            core.counters["dcp_reconnect"] += 1  # a heartbeat from a worker not registered: reconnect
            return [(routing_id, [*HEAD, RECONNECT])]
        if command.kind == REPLY and not registered:
            core.counters["dcp_unexpected"] += 1
            return []
        return None

    def act(self, core: CoreOps, peer: Peer, routing_id: bytes, command: DcpCommand, now: float) -> list[Out]:
        kind = command.kind
        if kind == REQUEST:
            return _request(core, peer, command, now)
        if kind == REGISTER:
            name = service_name(command.service)
            services, capacity, _ = core.worker_load(peer)
            out = core.serve(peer, (*services, name), max(capacity, 1), now)
            peer.dialect = WORKER_DIALECT  # a client becomes a worker by registering
            peer.last_sent = now
            out.append((routing_id, [*HEAD, REGISTER, command.service]))  # confirmed: the same message
            return out
        if kind == PING:
            services, capacity, held = core.worker_load(peer)
            out = core.serve(peer, services, min(held + 1, core.settings.max_capacity), now)  # "more work"
            peer.last_sent = now
            out.append((routing_id, [*HEAD, PONG]))
            return out
        assert command.address is not None
        return core.worker_reply(peer, Verb.FINAL, command.address.decode("utf-8", "replace"), command.data, now)

    def refused(
        self, core: CoreOps, peer: Peer, routing_id: bytes, command: DcpCommand, exc: ProtocolError, now: float
    ) -> list[Out]:
        if command.kind == REQUEST:  # refused at once (403, 409, 429, a bad name): an error reply
            rid = _request_id(command.address, command.meta)
            return [(routing_id, peer.dialect.error(rid, "", exc.code, exc.reason))]
        return []  # a refused registration is not confirmed (the seed's only way to say no)


handle = DcpAdmission().handle  # (the dialect router's handler)
