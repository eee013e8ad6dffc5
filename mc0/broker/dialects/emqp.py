"""eMQP/1.0 (seed 002, EventMQ's protocol) on the mc0 broker.

Contract: ``is_emqp(frames)`` recognises a message of this dialect (an empty
frame, then ``eMQP/1.0``); ``decode`` turns one into an :class:`EmqpCommand`
or raises ProtocolError; ``handle`` drives the broker core through
:class:`~mc0.broker.dialects.mdp.CoreOps`, so eMQP clients and workers share one
service registry (an eMQP queue is an mc0 service) with every other dialect.
Pure: no sockets, no clock (message ids the broker makes come from a counter).

Frames (after the routing id), as the seed writes them and as the ``eventmq``
package (0.3.13) sends them where it differs::

    client -> broker  "" eMQP/1.0 REQUEST msgid queue headers message
    broker -> client  "" eMQP/1.0 REPLY msgid message                 (msgid: the request's)
                      "" eMQP/1.0 REPLY msgid ERROR code reason       (an mc0 error)
    worker -> broker  "" eMQP/1.0 INFORM msgid queues [type]          (csv, or eventmq's JSON [[weight, name]...])
                      "" eMQP/1.0 READY msgid                         (one more job, please)
                      "" eMQP/1.0 REPLY msgid message                 (seed: msgid is the request's)
                      "" eMQP/1.0 REPLY msgid message request-msgid   (eventmq)
                      "" eMQP/1.0 HEARTBEAT msgid [timestamp]
                      "" eMQP/1.0 DISCONNECT|KBYE msgid
    broker -> worker  "" eMQP/1.0 ACK msgid inform-msgid              (eventmq's JobManager waits for it)
                      "" eMQP/1.0 REQUEST msgid queue headers message (msgid: the broker's request token)
                      "" eMQP/1.0 HEARTBEAT msgid | DISCONNECT msgid

Flow control is eMQP's: INFORM registers the queues with no capacity; each
READY is room for one more job; each REPLY uses one up (so an mc0 worker's
capacity here is READYs minus REPLYs).  A client's headers: ``timeout:S``
sets the request's deadline, ``reply-requested`` asks for the REPLY (without
it the client is sent nothing: the job runs, its answer is dropped and
counted), and every other header crosses to the worker as it came (an mc0
worker sees them as ``X-Emqp-Headers``, the csv; an mc0 client may send that
header to an eMQP worker).  The headers a worker gets always include
``reply-requested`` (its REPLY is what frees its slot) and ``timeout:S`` (the
seconds left before the request's deadline).  eMQP has no partial replies
(a PARTIAL is not forwarded) and no error command (an error is a REPLY of
three frames, ``ERROR``, code, reason, where a result is one).  A message is one frame: a service with an
eMQP worker refuses multi-frame requests (400), and a multi-frame reply for an
eMQP client is an error REPLY (500) rather than its frames run together.
Invalid or unexpected messages are dropped and counted, as eventmq's router
does; a broker restart is seen by the worker's heartbeat check.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...errors import ProtocolError
from ...protocol import MAX_SERVICE_BYTES, Dialect, Status, Verb, in_band_error, json_body
from ..core.peers import Out, Peer
from .base import Admission, CoreOps

log = logging.getLogger("mc0.broker")

VERSION = b"eMQP/1.0"
REQUEST, REPLY, INFORM, READY = b"REQUEST", b"REPLY", b"INFORM", b"READY"
HEARTBEAT, DISCONNECT, KBYE, ACK = b"HEARTBEAT", b"DISCONNECT", b"KBYE", b"ACK"
WORKER_TYPE = b"worker"
DEFAULT_QUEUE = "default"  # eventmq's queue when INFORM names none
REPLY_REQUESTED = "reply-requested"
TIMEOUT_HEADER = "timeout"
HEADERS_HEADER = "X-Emqp-Headers"  # an eMQP client's other headers, for (and from) mc0 peers
ERROR_MARK = b"ERROR"
MAX_MSGID_BYTES = 255
MAX_QUEUES = 64  # queues one INFORM may name


@dataclass(frozen=True, slots=True)
class EmqpCommand:
    command: bytes
    msgid: str
    queues: tuple[str, ...] = ()  # INFORM; REQUEST: the one queue
    timeout_ms: int | None = None  # REQUEST: from its "timeout:S" header
    reply_requested: bool = False  # REQUEST: its "reply-requested" header
    headers: str = ""  # REQUEST: its other headers, csv, as they came
    request_id: str | None = None  # REPLY: the request it answers
    body: Sequence[bytes] = ()


def is_emqp(frames: Sequence[bytes]) -> bool:
    return len(frames) > 1 and not frames[0] and frames[1] == VERSION


def _text(frame: bytes, what: str, limit: int = MAX_MSGID_BYTES) -> str:
    if not frame or len(frame) > limit:
        raise ProtocolError(Status.BAD_REQUEST, f"eMQP {what} is empty or over {limit} bytes")
    try:
        return bytes(frame).decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(Status.BAD_REQUEST, f"eMQP {what} is not UTF-8") from None


def parse_queues(frame: bytes) -> tuple[str, ...]:
    """INFORM's queue names: csv (the seed) or eventmq's JSON ``[[weight, name], ...]``; empty: default."""
    if not frame:
        return (DEFAULT_QUEUE,)
    text = _text(frame, "queue names", MAX_QUEUES * (MAX_SERVICE_BYTES + 16))
    if text.startswith("["):
        parsed = json_body(text, None)
        names = []
        for item in parsed if isinstance(parsed, list) else [None]:
            if isinstance(item, list) and len(item) == 2 and isinstance(item[1], str):
                item = item[1]  # [weight, name]: mc0 serves a worker's queues by age, not weight
            if not isinstance(item, str):
                raise ProtocolError(Status.BAD_REQUEST, "eMQP INFORM queues: a list of [weight, name] or names")
            names.append(item)
    else:
        names = text.split(",")
    queues = tuple(dict.fromkeys(name.strip() for name in names))
    if not queues or len(queues) > MAX_QUEUES or not all(queues):
        raise ProtocolError(Status.BAD_REQUEST, f"eMQP INFORM names 1..{MAX_QUEUES} non-empty queues")
    return queues


def timeout_of(headers: bytes) -> int | None:
    """The ``timeout:S`` header of a csv header frame, in ms (None: absent or 0)."""
    return parse_headers(headers)[0]


def parse_headers(frame: bytes) -> tuple[int | None, bool, str]:
    """A REQUEST's csv header frame -> (timeout ms or None, reply-requested, the other headers as csv)."""
    text = _text(frame, "headers", 4096) if frame else ""
    timeout: int | None = None
    reply = False
    others: list[str] = []
    for header in (h.strip() for h in text.split(",")):
        key, _, value = header.partition(":")
        if key == TIMEOUT_HEADER:
            if not (value.isascii() and value.isdigit()) or len(value) > 9:
                raise ProtocolError(Status.BAD_REQUEST, "eMQP timeout header is not a number of seconds")
            timeout = int(value) * 1000 or None
        elif header == REPLY_REQUESTED:
            reply = True
        elif header:
            others.append(header)
    return timeout, reply, ",".join(others)


def worker_headers(timeout_ms: int, user: Mapping[str, str]) -> bytes:
    """The header frame an eMQP worker gets: reply-requested, the time left, then the client's others."""
    _, _, others = parse_headers(user.get(HEADERS_HEADER, "").encode()) if HEADERS_HEADER in user else (0, 0, "")
    fixed = f"{REPLY_REQUESTED},{TIMEOUT_HEADER}:{max(1, math.ceil(timeout_ms / 1000))}"
    return f"{fixed},{others}".encode() if others else fixed.encode()


def decode(frames: Sequence[bytes]) -> EmqpCommand:
    """Frames (routing id removed; ``is_emqp``) -> a command; ProtocolError if invalid."""
    if len(frames) < 4:
        raise ProtocolError(Status.BAD_REQUEST, "eMQP message without command and msgid")
    command, size = bytes(frames[2]), len(frames)
    msgid = _text(frames[3], "msgid")
    if command == REQUEST:
        if size != 7:
            raise ProtocolError(Status.BAD_REQUEST, "eMQP REQUEST is msgid, queue, headers, message")
        queue = _text(frames[4], "queue", MAX_SERVICE_BYTES)
        timeout, reply, others = parse_headers(frames[5])
        return EmqpCommand(command, msgid, (queue,), timeout, reply, others, body=frames[6:])
    if command == INFORM:
        if size not in (5, 6) or (size == 6 and frames[5] != WORKER_TYPE):
            raise ProtocolError(Status.BAD_REQUEST, "eMQP INFORM is msgid, queues [, worker]")
        return EmqpCommand(command, msgid, parse_queues(frames[4]))
    if command == REPLY:
        if size == 5:  # the seed: the msgid is the request's
            return EmqpCommand(command, msgid, request_id=msgid, body=frames[4:])
        if size == 6:  # eventmq: its own msgid, the reply, the request's msgid
            return EmqpCommand(command, msgid, request_id=_text(frames[5], "request msgid"), body=frames[4:5])
        raise ProtocolError(Status.BAD_REQUEST, "eMQP REPLY is msgid, message [, request msgid]")
    if command in (READY, DISCONNECT, KBYE):
        if size != 4:
            raise ProtocolError(Status.BAD_REQUEST, f"eMQP {command.decode()} takes only a msgid")
        return EmqpCommand(DISCONNECT if command == KBYE else command, msgid)
    if command == HEARTBEAT:
        if size > 5:
            raise ProtocolError(Status.BAD_REQUEST, "eMQP HEARTBEAT is msgid [, timestamp]")
        return EmqpCommand(command, msgid)
    raise ProtocolError(Status.BAD_REQUEST, f"eMQP command {command[:16]!r} unsupported")


class EmqpDialect:
    """Broker -> eMQP peer rendering; one instance for clients (no heartbeats), one for workers."""

    one_frame = True  # a worker's REQUEST carries one message frame

    def __init__(self, name: str, heartbeats: bool) -> None:
        self.name = name
        self.heartbeats = heartbeats
        self._ids = itertools.count(1)  # the broker's own msgids (unique per broker run)

    def frames(self, command: bytes, *rest: bytes) -> list[bytes]:
        return [b"", VERSION, command, f"mc0-{next(self._ids)}".encode(), *rest]

    def to_worker(
        self, bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        if len(body) > 1:  # queued before the service's first eMQP worker came (new ones are refused): joined
            log.warning("an eMQP worker is given a request of %d frames, joined into one", len(body))
        message = body[0] if len(body) == 1 else b"".join(body)
        return [b"", VERSION, REQUEST, bid.encode(), service.encode(), worker_headers(timeout_ms, user), message]

    def cancel(self, bid: str) -> list[bytes] | None:
        return None  # eMQP has no cancel: a late REPLY is dropped and counted

    def partial(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes] | None:
        return None  # eMQP has no partial replies (a HEARTBEAT to a client would be unsolicited)

    def final(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        # A REPLY carries one message frame; an error three (ERROR, code, reason), so a worker's
        # reply is never taken for the broker's error.  Several frames would run together: refused.
        if len(body) != 1:
            reason = f"[the reply has {len(body)} frames; eMQP carries one]"
            return self.error(rid, service, Status.HANDLER_FAILED, reason)
        return [b"", VERSION, REPLY, rid.encode(), body[0]]

    def error(self, rid: str | None, service: str, code: int, reason: str) -> list[bytes]:
        return [b"", VERSION, REPLY, (rid or "").encode(), *in_band_error(code, reason)]

    def heartbeat(self) -> Sequence[bytes] | None:
        return self.frames(HEARTBEAT) if self.heartbeats else None

    def disconnect(self) -> Sequence[bytes] | None:
        return self.frames(DISCONNECT)


CLIENT_DIALECT = EmqpDialect("emqp-client", heartbeats=False)
WORKER_DIALECT = EmqpDialect("emqp-worker", heartbeats=True)


def _set_capacity(core: CoreOps, worker: Peer, change: int, now: float) -> list[Out]:
    services, capacity, _ = core.worker_load(worker)
    capacity = min(max(capacity + change, 0), core.settings.max_capacity)
    return core.serve(worker, services, capacity, now)


class EmqpAdmission(Admission[EmqpCommand]):
    """eMQP/1.0 through the shared skeleton (``base.Admission``)."""

    name = "emqp"

    def decode(self, frames: Sequence[bytes]) -> EmqpCommand:
        return decode(frames)

    def owns(self, dialect: Dialect) -> bool:
        return dialect is CLIENT_DIALECT or dialect is WORKER_DIALECT

    def newcomer(self, command: EmqpCommand) -> Dialect:
        return WORKER_DIALECT if command.command == INFORM else CLIENT_DIALECT

    def early(
        self, core: CoreOps, peer: Peer | None, routing_id: bytes, command: EmqpCommand, now: float
    ) -> list[Out] | None:
        verb = command.command
        if peer is None and verb not in (REQUEST, INFORM):
            core.counters["emqp_unexpected"] += 1  # eventmq's router ignores unknown peers too
            return []
        if peer is not None and verb in (READY, REPLY) and peer.dialect is not WORKER_DIALECT:
            core.counters["emqp_unexpected"] += 1  # no INFORM yet
            return []
        return None

    def act(self, core: CoreOps, peer: Peer, routing_id: bytes, command: EmqpCommand, now: float) -> list[Out]:
        verb = command.command
        if verb == REQUEST:
            user = {HEADERS_HEADER: command.headers} if command.headers else {}
            quiet = not command.reply_requested  # it asked for no REPLY: none is sent, errors included
            return core.call(
                peer, command.queues[0], command.body, now, rid=command.msgid, timeout_ms=command.timeout_ms,
                user=user, quiet=quiet,
            )  # fmt: skip
        if verb == INFORM:
            peer.dialect = WORKER_DIALECT  # a client may become a worker too; heartbeats from now on
            _, capacity, _ = core.worker_load(peer)
            out = core.serve(peer, command.queues, capacity, now)
            peer.last_sent = now
            out.append((routing_id, WORKER_DIALECT.frames(ACK, command.msgid.encode())))
            return out
        if verb == READY:
            return _set_capacity(core, peer, +1, now)
        if verb == REPLY:
            assert command.request_id is not None
            out = _set_capacity(core, peer, -1, now)  # first: the freed slot is not room for more
            return out + core.worker_reply(peer, Verb.FINAL, command.request_id, command.body, now)
        if verb == DISCONNECT:
            return core.forget(peer, "disconnected", now)
        return []

    def refused(
        self, core: CoreOps, peer: Peer, routing_id: bytes, command: EmqpCommand, exc: ProtocolError, now: float
    ) -> list[Out]:
        if command.command == REQUEST and not command.reply_requested:
            core.counters["answers_unwanted"] += 1
            return []
        if command.command == REQUEST:
            return [(routing_id, peer.dialect.error(command.msgid, command.queues[0], exc.code, exc.reason))]
        # an INFORM for a reserved or forbidden queue: the worker is told to go
        return [*core.forget(peer, "refused", now), (routing_id, WORKER_DIALECT.frames(DISCONNECT))]


handle = EmqpAdmission().handle  # (the dialect router's handler)
