"""MemoDB (seed 003) on the mc0 broker: CBOR headers over NNG req/rep <-> the core's RPC operations.

Contract: pure (no sockets, no clock, no randomness: the shell passes ``now``
and a per-run ``nonce``).  The shell (:mod:`mc0.broker.nngbridge`) hands each
NNG request to :meth:`MemoDB.handle` with the *token* of the request (an
opaque name for the NNG context that waits for its one reply); every method
returns ``(outs, replies)``: what the core wants sent to ROUTER peers, and
``(token, data)`` replies for the NNG contexts, ``data`` None meaning "drop
the request" (the context is freed without a reply, as the seed's broker
drops a client it cannot serve).  Each token gets exactly one reply or drop.

A message is a CBOR header (an array) then the payload::

    READY      ["memo01", 1, b"", [service, ...]]          worker, no ID yet
    JOB        ["memo01", 2, ID, service, timeout_ms]     client -> broker (ID b""), broker -> worker
    RESULT     ["memo01", 3, ID (, disconnecting)]        worker -> broker, broker -> client (ID b"")
    HEARTBEAT  ["memo01", 4, ID]                          both ways, worker only
    DISCONNECT ["memo01", 5, ID]                          broker -> worker (out of sync)

Mapping onto mc0: a MemoDB worker is a peer (``memodb-worker``) serving its
services with capacity 1 while its request waits at the broker ("parked":
its READY, RESULT or HEARTBEAT) and 0 while it holds a job (so the core never
assigns a job it has no context to carry); the parked request is answered by
the core's next job for it, or by the core's heartbeat after the heartbeat
interval.  A client's JOB is one request of a one-shot peer
(``memodb-client``), forgotten when its reply goes.  The job's timeout is
the request's deadline; at the deadline the broker gives up on the worker
(forgets it: its late RESULT is answered DISCONNECT, its ID being unknown).
Worker IDs are ``nonce + counter``, so a restarted broker never recognises
an old worker: anything with an unknown ID gets DISCONNECT.

Refusals, per the seed: a worker's invalid or unexpected message gets
DISCONNECT (and the worker, if known, is forgotten: its job goes back to its
queue); a client's JOB that is invalid or cannot be served (no worker,
forbidden, deadline) is dropped (MemoDB has no error reply).  Headers are
decoded with cbor2 with semantic tags refused and nesting bounded, and must
be deterministically encoded (RFC 8949 4.2), as the seed asks.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

try:
    import cbor2
except ImportError:  # the memodb extra; the broker refuses [memodb] enabled without it (nngbridge.require_modules)
    cbor2 = None  # type: ignore[assignment]

from ...errors import ProtocolError
from ...permissions import ACTIONS, Permissions, Rules
from ...protocol import MAX_SERVICE_BYTES, Verb
from ..core.peers import Out, Peer

if TYPE_CHECKING:
    from .base import CoreOps

HAVE_CBOR2 = cbor2 is not None

log = logging.getLogger("mc0.broker")

VERSION = "memo01"
READY, JOB, RESULT, HEARTBEAT, DISCONNECT = 1, 2, 3, 4, 5
NAMES = {READY: "READY", JOB: "JOB", RESULT: "RESULT", HEARTBEAT: "HEARTBEAT", DISCONNECT: "DISCONNECT"}
MAX_SERVICES = 64  # services one READY may name
MAX_HEADER_BYTES = 64 * 1024  # READY's list is the only part that grows: 64 names of 255 bytes fit
MAX_ID_BYTES = 64
MAX_TIMEOUT_MS = (1 << 32) - 1
PEER_VERSION = "memodb"
# A job's end this close to its timeout is its timeout (``due`` is taken when the JOB is
# carried, a loop turn after the core set the deadline).
DUE_SLACK = 0.1
# Routing ids of MemoDB peers: a zero byte then not 5 bytes long, so never one libzmq makes
# (5 bytes, zero first) nor one a ZeroMQ peer may choose (never zero first).
ROUTING_PREFIX = b"\x00memodb"
WORKER_PREFIX = ROUTING_PREFIX + b"w"
CLIENT_PREFIX = ROUTING_PREFIX + b"c"

# What the dialects below render (the core's Outs to MemoDB peers); ``deliver`` turns them
# into replies on the peer's waiting NNG request.  First frame: the kind.
_JOB, _HEARTBEAT, _DISCONNECT, _GIVE_UP, _RESULT, _DROP = b"J", b"H", b"D", b"G", b"R", b"X"


def _reject_tag(decoder: Any, *tag: Any) -> Any:
    raise cbor2.CBORDecodeError("a MemoDB header has no tags")


# Every semantic tag cbor2 knows is refused (a header is text, integers, bytes, a bool and a list).
_NO_TAGS = dict.fromkeys(range(0, 300), _reject_tag) | dict.fromkeys((1004, 55799), _reject_tag)


@dataclass(frozen=True, slots=True)
class Message:
    kind: int
    wid: bytes
    services: tuple[str, ...] = ()  # READY
    service: str = ""  # JOB
    timeout_ms: int = 0  # JOB
    disconnecting: bool = False  # RESULT
    payload: bytes = b""


class Malformed(Exception):
    """A message this dialect cannot take; ``client`` when it is shaped as a client's JOB."""

    def __init__(self, reason: str, *, wid: bytes = b"", client: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.wid = wid
        self.client = client


def header(kind: int, wid: bytes, *fields: object) -> bytes:
    """One deterministically encoded header."""
    return cbor2.dumps([VERSION, kind, wid, *fields], canonical=True)


def decode(data: bytes, max_payload: int) -> Message:
    """An NNG message -> a :class:`Message`; :class:`Malformed` says why not (and whose it looks)."""
    try:
        head = cbor2.loads(
            data[:MAX_HEADER_BYTES],
            semantic_decoders=_NO_TAGS,
            tag_hook=_reject_tag,
            max_depth=3,
            allow_indefinite=False,
        )
    except Exception as exc:  # cbor2 raises several kinds on garbage (decode, value, overflow, memory)
        raise Malformed(f"not a CBOR header: {type(exc).__name__}") from None
    if not isinstance(head, list) or len(head) < 3:
        raise Malformed("the header is not an array of at least 3 items")
    version, kind, wid = head[0], head[1], head[2]
    if not isinstance(wid, bytes) or len(wid) > MAX_ID_BYTES:
        raise Malformed("the ID is not a byte string of at most 64 bytes")
    client = kind == JOB and not wid and type(kind) is int
    if version != VERSION:
        raise Malformed(f"version is not {VERSION!r}", wid=wid, client=client)
    if type(kind) is not int or kind not in NAMES:
        raise Malformed("unknown message type", wid=wid)
    try:
        encoded = header(kind, wid, *head[3:])  # what a deterministic encoder makes of it
    except Exception:  # pragma: no cover - whatever cbor2 decoded it can encode; kept as a guard
        raise Malformed("the header cannot be re-encoded", wid=wid) from None
    if not data.startswith(encoded):
        raise Malformed("the header is not deterministically encoded CBOR", wid=wid, client=client)
    payload = data[len(encoded) :]
    if len(payload) > max_payload:
        raise Malformed(f"payload over {max_payload} bytes", wid=wid, client=client)
    rest = head[3:]
    if kind == READY:
        if wid or len(rest) != 1 or not isinstance(rest[0], list) or payload:
            raise Malformed("READY is [version, 1, b'', [services]] with no payload")
        names = rest[0]
        if not 0 < len(names) <= MAX_SERVICES or not all(_service_ok(n) for n in names):
            raise Malformed(f"READY names 1..{MAX_SERVICES} services of 1..{MAX_SERVICE_BYTES} UTF-8 bytes")
        return Message(kind, wid, services=tuple(dict.fromkeys(names)))
    if kind == JOB:
        if len(rest) != 2 or not _service_ok(rest[0]) or type(rest[1]) is not int:
            raise Malformed("JOB is [version, 2, ID, service, timeout ms]", wid=wid, client=client)
        if not 0 < rest[1] <= MAX_TIMEOUT_MS:
            raise Malformed("JOB's timeout is not 1..2**32-1 ms", wid=wid, client=client)
        return Message(kind, wid, service=rest[0], timeout_ms=rest[1], payload=payload)
    if kind == RESULT:
        if len(rest) > 1 or (rest and type(rest[0]) is not bool):
            raise Malformed("RESULT is [version, 3, ID (, disconnecting bool)]", wid=wid)
        return Message(kind, wid, disconnecting=bool(rest and rest[0]), payload=payload)
    if rest or payload:
        raise Malformed(f"{NAMES[kind]} is [version, {kind}, ID] with no payload", wid=wid)
    return Message(kind, wid)


_VERSION_CBOR = bytes([0x60 | len(VERSION)]) + VERSION.encode()  # cbor2.dumps(VERSION): b"\x66memo01"
_PARKING = frozenset({READY, RESULT, HEARTBEAT})


def is_worker_request(data: bytes) -> bool:
    """Whether an NNG request is a worker's (READY, RESULT or HEARTBEAT: it parks at the broker
    until a job or a heartbeat), read from its first bytes: a deterministic header starts with
    an array of 3 or 4 items, ``"memo01"``, the kind.  A client's JOB, or anything malformed, is
    not.  The shell keeps the two apart (parked workers must not take the contexts clients' JOBs
    need); a request that lies about its kind is refused at once by ``handle`` anyway."""
    return len(data) >= 9 and data[0] in (0x83, 0x84) and data[1:8] == _VERSION_CBOR and data[8] in _PARKING


def _service_ok(name: object) -> bool:
    return isinstance(name, str) and 0 < len(name.encode("utf-8", "replace")) <= MAX_SERVICE_BYTES


class MemoWorkerDialect:
    """Broker -> MemoDB worker, as kinds ``MemoDB.deliver`` renders on the worker's parked request."""

    name = "memodb-worker"
    heartbeats = True
    one_frame = True  # a MemoDB payload is one frame

    def to_worker(
        self, bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        return [_JOB, bid.encode(), service.encode(), str(int(timeout_ms)).encode(), *body]

    def cancel(self, bid: str) -> list[bytes] | None:
        return [_GIVE_UP, bid.encode()]  # the deadline passed while the worker held the job

    def partial(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        raise AssertionError("a MemoDB worker sends no requests")  # pragma: no cover

    final = partial

    def error(self, rid: str | None, service: str, code: int, reason: str) -> list[bytes]:
        return [_DISCONNECT]  # refused (revoked, a service withdrawn): the seed's only word is DISCONNECT

    def heartbeat(self) -> Sequence[bytes] | None:
        return [_HEARTBEAT]

    def disconnect(self) -> Sequence[bytes] | None:
        return [_DISCONNECT]


class MemoClientDialect:
    """Broker -> MemoDB client: a RESULT, or nothing (a dropped request)."""

    name = "memodb-client"
    heartbeats = False
    one_frame = False

    def to_worker(
        self, bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        raise AssertionError("a MemoDB client is never given work")  # pragma: no cover

    def cancel(self, bid: str) -> list[bytes] | None:
        return None

    def partial(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        return [_DROP]  # MemoDB has no partial results: the client waits for the final one

    def final(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        return [_RESULT, *body]

    def error(self, rid: str | None, service: str, code: int, reason: str) -> list[bytes]:
        return [_DROP, str(int(code)).encode()]

    def heartbeat(self) -> Sequence[bytes] | None:
        return None

    def disconnect(self) -> Sequence[bytes] | None:
        return None


WORKER_DIALECT = MemoWorkerDialect()
CLIENT_DIALECT = MemoClientDialect()

Reply = tuple[bytes, bytes | None]  # (token, reply data | None = drop the request)
Result = tuple[list[Out], list[Reply]]


class _Worker:
    __slots__ = ("peer", "wid", "token", "bid", "due", "services")

    def __init__(self, peer: Peer, wid: bytes, services: tuple[str, ...]) -> None:
        self.peer = peer
        self.wid = wid
        self.token: bytes | None = None  # its request waiting at the broker (parked)
        self.bid: str | None = None  # the job it holds
        self.due = 0.0  # ... and when its timeout passes
        self.services = services


class MemoDB:
    """The MemoDB peers of one NNG listener: workers by ID, each peer's waiting request."""

    def __init__(self, *, identity: str, nonce: bytes, heartbeat_ms: int, max_workers: int, max_payload: int) -> None:
        self.identity = identity
        self.nonce = nonce
        self.ttl = heartbeat_ms / 1000.0
        self.max_workers = max_workers
        self.max_payload = max_payload
        self._serial = 0
        self.workers: dict[bytes, _Worker] = {}  # by ID
        self._by_routing: dict[bytes, _Worker] = {}
        self.clients: dict[bytes, tuple[bytes, Peer]] = {}  # routing id -> (its JOB's token, the peer)

    @staticmethod
    def owns(routing_id: bytes) -> bool:
        return routing_id.startswith(ROUTING_PREFIX)

    # ------------------------------------------------------------ input
    def handle(self, core: CoreOps, token: bytes, data: bytes, now: float) -> Result:
        """One NNG request (its one reply goes to ``token``)."""
        core.counters["memodb_received"] += 1
        if not core.settings.foreign_dialects:
            core.counters["foreign_refused"] += 1
            return [], [(token, None)]
        try:
            message = decode(data, self.max_payload)
        except Malformed as exc:
            core.counters["memodb_malformed"] += 1
            log.debug("a MemoDB peer: %s", exc.reason)
            if exc.client:
                return [], [(token, None)]
            return self._out_of_sync(core, self.workers.get(exc.wid), exc.wid, token, "malformed", now)
        if message.kind == JOB and not message.wid:
            return self._call(core, token, message, now)
        if message.kind == READY:
            return self._ready(core, token, message, now)
        worker = self.workers.get(message.wid)
        if worker is None or message.kind in (JOB, DISCONNECT):
            # Unknown (a broker restart, a forgotten worker) or not a worker's word: out of sync.
            core.counters["memodb_out_of_sync"] += 1
            return self._out_of_sync(core, worker, message.wid, token, "out_of_sync", now)
        worker.peer.last_recv = now
        replies: list[Reply] = []
        if worker.token is not None:  # it asked again (NNG resent its request): the older one is void
            replies.append((worker.token, None))
            worker.token = None
        if message.kind == HEARTBEAT:
            if worker.bid is not None:  # it holds a job: it gave it up without a word
                core.counters["memodb_out_of_sync"] += 1
                return self._out_of_sync(core, worker, worker.wid, token, "out_of_sync", now, replies)
            out = self._park(core, worker, token, now)
            return out, replies
        if worker.bid is None:  # a RESULT for no job
            core.counters["memodb_out_of_sync"] += 1
            return self._out_of_sync(core, worker, worker.wid, token, "out_of_sync", now, replies)
        bid, worker.bid = worker.bid, None
        out = core.worker_reply(worker.peer, Verb.FINAL, bid, [message.payload], now)
        if message.disconnecting:
            more, _ = self._forget(core, worker, "disconnecting", now)
            return core.published(out + more, now), [*replies, (token, header(DISCONNECT, worker.wid))]
        out += self._park(core, worker, token, now)
        return core.published(out, now), replies

    def _call(self, core: CoreOps, token: bytes, message: Message, now: float) -> Result:
        limit = core.settings.max_request_timeout_ms
        if message.timeout_ms > limit:  # refused, not cut short: a capped job would be given up on and resent
            core.counters["memodb_timeout_over_limit"] += 1
            log.warning("a MemoDB JOB asks %d ms, over max_request_timeout_ms (%d): dropped", message.timeout_ms, limit)
            return [], [(token, None)]
        routing_id = CLIENT_PREFIX + token
        if routing_id in self.clients:  # the shell never reuses a token; two requests on one would leak
            core.counters["memodb_token_reused"] += 1
            return [], [(token, None)]
        peer = Peer(routing_id, self.identity, PEER_VERSION, self.ttl, now, CLIENT_DIALECT)
        out = core.open_peer(peer, now)
        self.clients[routing_id] = (token, peer)
        try:
            out += core.call(peer, message.service, [message.payload], now, timeout_ms=message.timeout_ms)
        except ProtocolError as exc:  # a bad or forbidden service name: dropped, as the seed does
            core.counters["memodb_rejected"] += 1
            log.debug("a MemoDB client's JOB: %s %s", exc.code, exc.reason)
            del self.clients[routing_id]
            out += core.forget(peer, "refused", now)
            return core.published(out, now), [(token, None)]
        return core.published(out, now), []

    def _ready(self, core: CoreOps, token: bytes, message: Message, now: float) -> Result:
        if len(self.workers) >= self.max_workers:
            core.counters["memodb_too_many_workers"] += 1
            return [], [(token, header(DISCONNECT, b""))]
        self._serial += 1
        wid = self.nonce + self._serial.to_bytes(8, "big")
        peer = Peer(WORKER_PREFIX + wid, self.identity, PEER_VERSION, self.ttl, now, WORKER_DIALECT)
        worker = _Worker(peer, wid, message.services)
        out = core.open_peer(peer, now)
        self.workers[wid] = worker
        self._by_routing[peer.routing_id] = worker
        try:
            core.serve(peer, message.services, 0, now)  # checked and registered, no work yet
        except ProtocolError as exc:  # a reserved, invalid or forbidden service
            core.counters["memodb_rejected"] += 1
            log.debug("a MemoDB worker's READY: %s %s", exc.code, exc.reason)
            more, _ = self._forget(core, worker, "refused", now)
            return core.published(out + more, now), [(token, header(DISCONNECT, b""))]
        out += self._park(core, worker, token, now)
        return core.published(out, now), []

    def _park(self, core: CoreOps, worker: _Worker, token: bytes, now: float) -> list[Out]:
        """``worker`` waits at the broker on ``token``: room for one job (or a heartbeat in due time)."""
        worker.token = token
        worker.peer.last_sent = now  # the heartbeat comes one interval after it started waiting
        return core.serve(worker.peer, worker.services, 1, now)

    def _out_of_sync(
        self,
        core: CoreOps,
        worker: _Worker | None,
        wid: bytes,
        token: bytes,
        why: str,
        now: float,
        replies: Sequence[Reply] = (),
    ) -> Result:
        """DISCONNECT (the seed's answer to a worker out of sync), forgetting the worker if known."""
        out: list[Out] = []
        more: list[Reply] = []
        if worker is not None:
            out, more = self._forget(core, worker, why, now)
            out = core.published(out, now)
        return out, [*replies, *more, (token, header(DISCONNECT, wid))]

    def _forget(self, core: CoreOps, worker: _Worker, why: str, now: float) -> Result:
        """Forget ``worker`` everywhere (its job, if any, goes back to its queue); a request it had
        waiting is answered DISCONNECT."""
        self.workers.pop(worker.wid, None)
        self._by_routing.pop(worker.peer.routing_id, None)
        token, worker.token = worker.token, None
        replies: list[Reply] = [(token, header(DISCONNECT, worker.wid))] if token is not None else []
        return core.forget(worker.peer, why, now), replies

    # ------------------------------------------------------------ output
    def deliver(self, core: CoreOps, routing_id: bytes, frames: Sequence[bytes], now: float) -> Result:
        """One message the core queued for a MemoDB peer -> the reply on its waiting request."""
        if not frames:
            return [], []
        kind = bytes(frames[0])
        worker = self._by_routing.get(routing_id)
        if worker is not None:
            return self._to_worker(core, worker, kind, frames, now)
        client = self.clients.get(routing_id)
        if client is None or kind not in (_RESULT, _DROP) or (kind == _DROP and len(frames) == 1):
            return [], []  # a forgotten peer's last words, or a partial: nothing to carry them
        del self.clients[routing_id]
        token, peer = client
        reply = header(RESULT, b"") + b"".join(frames[1:]) if kind == _RESULT else None
        return core.published(core.forget(peer, "answered", now), now), [(token, reply)]

    def _to_worker(self, core: CoreOps, worker: _Worker, kind: bytes, frames: Sequence[bytes], now: float) -> Result:
        if kind == _GIVE_UP and now < worker.due - DUE_SLACK:
            # Cancelled before its timeout (the client went, or sent CANCEL): MemoDB cannot say so;
            # the worker finishes, its RESULT is dropped by the core and it waits for more.
            core.counters["memodb_job_cancelled"] += 1
            return [], []
        if kind in (_GIVE_UP, _DISCONNECT):  # its job's timeout passed, or the core refused it
            if kind == _GIVE_UP:
                core.counters["memodb_job_timeouts"] += 1
            out, replies = self._forget(core, worker, "job_timeout" if kind == _GIVE_UP else "refused", now)
            return core.published(out, now), replies
        token = worker.token
        if token is None:
            if kind == _JOB:  # no request to carry it (cannot happen at capacity 0): the job goes back
                core.counters["memodb_job_without_request"] += 1
                out, replies = self._forget(core, worker, "unreachable", now)
                return core.published(out, now), replies
            return [], []  # a heartbeat while the worker works: it is silent until its RESULT
        worker.token = None
        out = core.serve(worker.peer, worker.services, 0, now)  # no more until it waits again
        if kind == _HEARTBEAT:
            return out, [(token, header(HEARTBEAT, worker.wid))]
        bid, service, timeout = bytes(frames[1]).decode(), bytes(frames[2]).decode(), int(frames[3])
        worker.bid = bid
        worker.due = now + timeout / 1000.0
        # Silent until its RESULT: it counts as heard from until the job's timeout, when the
        # deadline gives up on it (``_GIVE_UP``); liveness is only the backstop.
        worker.peer.last_recv = now + timeout / 1000.0
        return out, [(token, header(JOB, worker.wid, service, timeout) + b"".join(frames[4:]))]

    def forgotten(self, routing_id: bytes) -> list[Reply]:
        """The core forgot a MemoDB peer itself (expired, revoked, shutdown): answer what it waits on."""
        worker = self._by_routing.pop(routing_id, None)
        if worker is not None:
            self.workers.pop(worker.wid, None)
            token, worker.token = worker.token, None
            return [(token, header(DISCONNECT, worker.wid))] if token is not None else []
        client = self.clients.pop(routing_id, None)
        return [(client[0], None)] if client is not None else []

    def report(self) -> dict[str, int]:
        return {
            "workers": len(self.workers),
            "waiting_workers": sum(1 for w in self.workers.values() if w.token is not None),
            "clients": len(self.clients),
        }


def with_memodb_identity(permissions: Permissions, identity: str) -> Permissions:
    """The policy, with MemoDB's identity allowed nothing unless ``[permissions.identity.NAME]``
    names it (MemoDB has no authentication: anyone who reaches the listener is this identity)."""
    if identity in permissions.identities:
        return permissions
    nothing = Rules(allow=dict.fromkeys(ACTIONS, ()))
    return dataclasses.replace(permissions, identities={**permissions.identities, identity: nothing})
