"""The mc0 wire protocol: every verb, header, status code and limit, in one place.

Grammar (frames after the ROUTER routing id; ``""`` is an empty frame)::

    message    = VERB *(KEY VALUE) [ "" 1*POSITIONAL ]
    VERB       = one of Verb, ASCII
    KEY        = non-empty ASCII: a reserved Header, or a user header "X-..."
    VALUE      = UTF-8 text, may be empty
    POSITIONAL = opaque bytes (patterns for SUB/UNSUB, body frames for PUT/MESSAGE)

Headers are read in pairs; an empty frame where a *key* is expected starts
the positional part (so an empty header *value* is legal).  A key with no
value, a repeated key, a reserved key the verb does not take and any other
non-``X-`` key are malformed (400).  ``X-`` headers pass through untouched.

Peer -> broker::

    CONNECT    VERSION v TTL ms [ID id]            -> OK ID id TTL ms
    DISCONNECT [ID id]
    NOOP       [ID id]                             (heartbeat)
    PING       ID x                                -> PONG ID x        (1.0)
    SUB        [ID id] [FROM seq [JOURNAL j]] "" pattern...   (FROM: replay, then live)
    UNSUB      [ID id] "" pattern...
    PUT        TOPIC t [ID id] [MSGID m] [X-...] "" body...
    READY      [ID id] [CAPACITY n] "" service...  (1.0, a worker)
    REQUEST    SERVICE s ID rid [TIMEOUT ms] [ALL 1] [X-...] ["" body...]
    CANCEL     ID rid
    PARTIAL    ID bid [X-...] ["" body...]         (worker -> broker)
    FINAL      ID bid [X-...] ["" body...]
    ERROR      ID bid CODE c MESSAGE m             (a handler failure)

Broker -> peer::

    OK         ID id [TTL ms] [JOURNAL j SEQ n [DUPLICATE 1]]   (SEQ: a journaled PUT, once written)
    ERROR      [ID id] CODE nnn MESSAGE text [TOPIC pattern]   (TOPIC: a subscription withdrawn)
    MESSAGE    TOPIC t SENDER who [JOURNAL j SEQ n] [X-...] "" body...  (0.x peers: no SENDER)
    NOOP
    PONG       ID x
    DISCONNECT
    REQUEST    SERVICE s ID bid CALLER who TIMEOUT ms [X-...] ["" body...]   (to a worker)
    CANCEL     ID bid                                                     (to a worker)
    PARTIAL    ID rid [WORKER w [CODE c MESSAGE m]] [X-...] ["" body...]  (to a client)
    FINAL      ID rid [COUNT n MISSING m] [X-...] ["" body...]

A command carrying ``ID`` is answered ``OK``/``ERROR`` with that ID; without
``ID`` nothing comes back unless something exceptional happened, which always
gets an ``ERROR``.  A REQUEST's ID names the request instead: it is answered
by zero or more PARTIAL and exactly one terminal FINAL or ERROR with that ID.
Versions ``0.1``-``0.3`` are the seed's pub/sub (the seed verbs only);
``1.0`` is the full protocol.

Status codes: see :class:`Status`.  Limits: see :class:`Limits`.
docs/PROTOCOL.md is the prose version of this docstring.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum, StrEnum
from typing import NamedTuple, Protocol

from . import errors
from .errors import ProtocolError
from .message import Record
from .topics import DEFAULT_MAX_TOPIC_BYTES, DEFAULT_MAX_TOPIC_TOKENS


class Verb(StrEnum):
    CONNECT = "CONNECT"
    DISCONNECT = "DISCONNECT"
    NOOP = "NOOP"
    PING = "PING"
    PONG = "PONG"
    SUB = "SUB"
    UNSUB = "UNSUB"
    PUT = "PUT"
    MESSAGE = "MESSAGE"
    OK = "OK"
    ERROR = "ERROR"
    READY = "READY"
    REQUEST = "REQUEST"
    PARTIAL = "PARTIAL"
    FINAL = "FINAL"
    CANCEL = "CANCEL"


class Header(StrEnum):
    ID = "ID"
    VERSION = "VERSION"
    TTL = "TTL"
    TOPIC = "TOPIC"
    SENDER = "SENDER"
    CODE = "CODE"
    MESSAGE = "MESSAGE"
    CAPACITY = "CAPACITY"
    SERVICE = "SERVICE"
    TIMEOUT = "TIMEOUT"
    CALLER = "CALLER"
    ALL = "ALL"
    WORKER = "WORKER"
    COUNT = "COUNT"
    MISSING = "MISSING"
    MSGID = "MSGID"  # publisher's message id: a journal stores it once per dedup window
    SEQ = "SEQ"  # a journal's sequence number
    JOURNAL = "JOURNAL"
    DUPLICATE = "DUPLICATE"
    FROM = "FROM"  # SUB: replay from this sequence number, then continue live


USER_HEADER_PREFIX = "X-"


class Status(IntEnum):
    BAD_REQUEST = 400  # malformed or invalid
    NOT_CONNECTED = 401  # no CONNECT yet, or the broker does not know the peer
    FORBIDDEN = 403
    TOO_LARGE = 413
    CONFLICT = 409  # a request id reused while outstanding
    GONE = 410  # a journal position trimmed by retention
    OVER_LIMIT = 429  # a count limit, or a consumer too slow
    CANCELLED = 499  # the client cancelled the request
    HANDLER_FAILED = 500  # the worker's handler raised
    WORKER_LOST = 502  # worker gone after replies were forwarded, or attempts exhausted
    NO_WORKER = 503  # nobody serves the service (answered at once)
    DEADLINE = 504  # the request's deadline passed
    UNSUPPORTED_VERSION = 505
    STORAGE_FAILED = 507  # the journal could not write; the message is not acknowledged


REMOTE_ERRORS: dict[int, type[errors.RemoteError]] = {
    Status.BAD_REQUEST: errors.BadRequest,
    Status.NOT_CONNECTED: errors.NotConnected,
    Status.FORBIDDEN: errors.Forbidden,
    Status.TOO_LARGE: errors.TooLarge,
    Status.CONFLICT: errors.Conflict,
    Status.GONE: errors.Gone,
    Status.OVER_LIMIT: errors.OverLimit,
    Status.CANCELLED: errors.Cancelled,
    Status.HANDLER_FAILED: errors.HandlerFailed,
    Status.WORKER_LOST: errors.WorkerLost,
    Status.NO_WORKER: errors.NoResponders,
    Status.DEADLINE: errors.DeadlineExceeded,
    Status.UNSUPPORTED_VERSION: errors.UnsupportedVersion,
    Status.STORAGE_FAILED: errors.StorageFailed,
}


def remote_error(code: int, reason: str) -> errors.RemoteError:
    """The RemoteError subclass for a wire status code (base class if unknown)."""
    return REMOTE_ERRORS.get(code, errors.RemoteError)(code, reason)


SEED_VERSIONS = frozenset({"0.1", "0.2", "0.3"})
FULL_VERSION = "1.0"
VERSIONS = SEED_VERSIONS | {FULL_VERSION}

ANONYMOUS = "anonymous"  # SENDER when the peer has no authenticated identity
BROKER_SERVICE = "mc0.broker"  # built-in: stats / services / topics / peers reports
MMI_SERVICE = "mmi.service"  # built-in: Majordomo's MMI (is a service served? 200 / 404)
JOURNAL_SERVICE = "mc0.journal"  # built-in: info / fetch over the broker's journals
RESERVED_TOPIC_PREFIX = "mc0.sys."  # only the broker publishes here
SYS_RPC_TOPIC = RESERVED_TOPIC_PREFIX + "rpc"  # one JSON record per finished request
SYS_PEER_TOPIC = RESERVED_TOPIC_PREFIX + "peer"  # connects and disconnects


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-message limits, enforced by ``decode`` before any other work."""

    max_frames: int = 1024
    max_frame_bytes: int = 16 * 1024 * 1024  # ZMQ_MAXMSGSIZE: libzmq drops the peer beyond it
    max_message_bytes: int = 8 * 1024 * 1024
    max_headers: int = 32
    max_topic_bytes: int = DEFAULT_MAX_TOPIC_BYTES
    max_topic_tokens: int = DEFAULT_MAX_TOPIC_TOKENS
    max_subscriptions: int = 10_000  # per peer


DEFAULT_LIMITS = Limits()


class Side(Enum):
    PEER = "peer"
    BROKER = "broker"


class Payload(Enum):
    NONE = "none"
    OPTIONAL = "optional"
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class Grammar:
    """What one verb may carry when one side sends it."""

    required: frozenset[Header] = frozenset()
    optional: frozenset[Header] = frozenset()
    user_headers: bool = False
    payload: Payload = Payload.NONE
    seed: bool = True  # part of the seed protocol 0.x


def _h(*headers: Header) -> frozenset[Header]:
    return frozenset(headers)


_ID = _h(Header.ID)

# What a peer may send to the broker.
PEER_GRAMMAR: dict[Verb, Grammar] = {
    Verb.CONNECT: Grammar(_h(Header.VERSION, Header.TTL), _ID),
    Verb.DISCONNECT: Grammar(optional=_ID),
    Verb.NOOP: Grammar(optional=_ID),
    Verb.PING: Grammar(_ID, seed=False),
    Verb.SUB: Grammar(optional=_h(Header.ID, Header.FROM, Header.JOURNAL), payload=Payload.REQUIRED),
    Verb.UNSUB: Grammar(optional=_ID, payload=Payload.REQUIRED),
    Verb.PUT: Grammar(_h(Header.TOPIC), _h(Header.ID, Header.MSGID), True, Payload.REQUIRED),
    Verb.READY: Grammar(optional=_h(Header.ID, Header.CAPACITY), payload=Payload.REQUIRED, seed=False),
    Verb.REQUEST: Grammar(
        _h(Header.SERVICE, Header.ID), _h(Header.TIMEOUT, Header.ALL), True, Payload.OPTIONAL, seed=False
    ),
    Verb.CANCEL: Grammar(_ID, seed=False),
    Verb.PARTIAL: Grammar(_ID, user_headers=True, payload=Payload.OPTIONAL, seed=False),
    Verb.FINAL: Grammar(_ID, user_headers=True, payload=Payload.OPTIONAL, seed=False),
    Verb.ERROR: Grammar(_h(Header.ID, Header.CODE, Header.MESSAGE), seed=False),
}

# What the broker may send to a peer.
BROKER_GRAMMAR: dict[Verb, Grammar] = {
    Verb.OK: Grammar(_ID, _h(Header.TTL, Header.JOURNAL, Header.SEQ, Header.DUPLICATE)),
    Verb.ERROR: Grammar(_h(Header.CODE, Header.MESSAGE), _h(Header.ID, Header.TOPIC)),
    Verb.MESSAGE: Grammar(_h(Header.TOPIC), _h(Header.SENDER, Header.JOURNAL, Header.SEQ), True, Payload.REQUIRED),
    Verb.NOOP: Grammar(),
    Verb.PONG: Grammar(_ID, seed=False),
    Verb.DISCONNECT: Grammar(),
    Verb.REQUEST: Grammar(
        _h(Header.SERVICE, Header.ID, Header.CALLER, Header.TIMEOUT), frozenset(), True, Payload.OPTIONAL
    ),
    Verb.CANCEL: Grammar(_ID),
    Verb.PARTIAL: Grammar(_ID, _h(Header.WORKER, Header.CODE, Header.MESSAGE), True, Payload.OPTIONAL),
    Verb.FINAL: Grammar(_ID, _h(Header.COUNT, Header.MISSING), True, Payload.OPTIONAL),
}

GRAMMAR: dict[Side, dict[Verb, Grammar]] = {Side.PEER: PEER_GRAMMAR, Side.BROKER: BROKER_GRAMMAR}

_VERBS: dict[bytes, Verb] = {v.value.encode(): v for v in Verb}
_HEADERS: dict[bytes, Header] = {h.value.encode(): h for h in Header}
_USER_PREFIX_B = USER_HEADER_PREFIX.encode()


class Command(NamedTuple):
    """One decoded message: verb, headers (reserved and ``X-``), positional frames."""

    verb: Verb
    headers: dict[str, str]
    payload: Sequence[bytes]

    @property
    def id(self) -> str | None:
        return self.headers.get(Header.ID)

    def user_headers(self) -> dict[str, str]:
        """The ``X-`` headers (the one place they are told apart from reserved ones)."""
        return {k: v for k, v in self.headers.items() if k.startswith(USER_HEADER_PREFIX)}


def is_user_header(key: str) -> bool:
    """A key a sender may use for its own header: ``X-`` and at least one more ASCII character."""
    return key.startswith(USER_HEADER_PREFIX) and key.isascii() and len(key) > len(USER_HEADER_PREFIX)


def _snippet(frame: bytes, limit: int = 40) -> str:
    return repr(frame[:limit]) + ("..." if len(frame) > limit else "")


def find_id(frames: Sequence[bytes], max_headers: int) -> str | None:
    """Best-effort read of the ID header without validating anything else.

    Used so that a command rejected before parsing (too large, bad verb) is
    still answered with its ID; bounded by ``max_headers`` pairs.
    """
    i = 1
    end = min(len(frames), 1 + 2 * max_headers)
    while i + 1 < end and frames[i]:
        if frames[i] == b"ID":
            try:
                return bytes(frames[i + 1]).decode("utf-8")
            except UnicodeDecodeError:
                return None
        i += 2
    return None


def decode(frames: Sequence[bytes], *, sender: Side, limits: Limits = DEFAULT_LIMITS) -> Command:
    """Frames -> Command, or ProtocolError(code, reason, request_id).

    Order: frame count, byte total, verb, headers, grammar.  Topic and pattern
    contents are validated by the receiver (it needs their tokens).
    """
    if not frames:
        raise ProtocolError(Status.BAD_REQUEST, "empty message")
    if len(frames) > limits.max_frames:
        raise ProtocolError(
            Status.TOO_LARGE,
            f"{len(frames)} frames, the limit is {limits.max_frames}",
            find_id(frames, limits.max_headers),
        )
    total = sum(map(len, frames))
    if total > limits.max_message_bytes:
        raise ProtocolError(
            Status.TOO_LARGE,
            f"{total} bytes, the limit is {limits.max_message_bytes}",
            find_id(frames, limits.max_headers),
        )
    verb = _VERBS.get(bytes(frames[0]))
    if verb is None:
        raise ProtocolError(
            Status.BAD_REQUEST, f"unknown verb {_snippet(frames[0])}", find_id(frames, limits.max_headers)
        )
    grammar = GRAMMAR[sender].get(verb)
    if grammar is None:
        raise ProtocolError(Status.BAD_REQUEST, f"{verb} is not sent by a {sender.value}", find_id(frames, 8))
    headers: dict[str, str] = {}
    n = len(frames)
    i = 1
    request_id: str | None = None
    while i < n:
        key_frame = frames[i]
        if not key_frame:  # start of the positional part
            i += 1
            break
        if i + 1 >= n:
            raise ProtocolError(Status.BAD_REQUEST, f"header {_snippet(key_frame)} has no value", request_id)
        if len(headers) >= limits.max_headers:
            raise ProtocolError(Status.TOO_LARGE, f"more than {limits.max_headers} headers", request_id)
        key_bytes = bytes(key_frame)
        reserved = _HEADERS.get(key_bytes)
        if reserved is not None:
            key: str = reserved
            if reserved not in grammar.required and reserved not in grammar.optional:
                raise ProtocolError(Status.BAD_REQUEST, f"{verb} does not take header {key}", request_id)
        elif key_bytes.startswith(_USER_PREFIX_B) and key_bytes.isascii() and len(key_bytes) > 2:
            if not grammar.user_headers:
                raise ProtocolError(Status.BAD_REQUEST, f"{verb} does not take user headers", request_id)
            key = key_bytes.decode("ascii")
        else:
            raise ProtocolError(Status.BAD_REQUEST, f"unknown header {_snippet(key_frame)}", request_id)
        if key in headers:
            raise ProtocolError(Status.BAD_REQUEST, f"header {key} repeated", request_id)
        try:
            value = bytes(frames[i + 1]).decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(Status.BAD_REQUEST, f"header {key} is not UTF-8", request_id) from None
        headers[key] = value
        if reserved is Header.ID:
            request_id = value
        i += 2
    else:
        i = n
    payload = frames[i:]
    for needed in grammar.required:
        if needed not in headers:
            raise ProtocolError(Status.BAD_REQUEST, f"{verb} needs header {needed}", request_id)
    if payload:
        if grammar.payload is Payload.NONE:
            raise ProtocolError(Status.BAD_REQUEST, f"{verb} takes no positional frames", request_id)
    elif grammar.payload is Payload.REQUIRED:
        raise ProtocolError(Status.BAD_REQUEST, f"{verb} needs positional frames after an empty frame", request_id)
    return Command(verb, headers, payload)


def encode(verb: Verb, headers: Mapping[str, str] | None = None, payload: Sequence[bytes] = ()) -> list[bytes]:
    """Command parts -> frames (the inverse of ``decode``)."""
    return _finish([verb.value.encode()], headers or {}, body=payload)


def parse_int(command: Command, header: Header, *, minimum: int = 0) -> int:
    """A header's value as a decimal integer >= minimum, else ProtocolError 400."""
    text = command.headers[header]
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise ProtocolError(Status.BAD_REQUEST, f"{header} must be a decimal integer, got {text[:20]!r}", command.id)
    value = int(text)
    if value < minimum:
        raise ProtocolError(Status.BAD_REQUEST, f"{header} must be at least {minimum}, got {value}", command.id)
    return value


# ---------------------------------------------------------------- builders
# Small, allocation-light constructors for the messages each side sends.


def ok(request_id: str, *, ttl_ms: int | None = None) -> list[bytes]:
    if ttl_ms is None:
        return [b"OK", b"ID", request_id.encode()]
    return [b"OK", b"ID", request_id.encode(), b"TTL", str(ttl_ms).encode()]


def error(code: int, reason: str, request_id: str | None = None, *, topic: str | None = None) -> list[bytes]:
    head = [b"ERROR"] if request_id is None else [b"ERROR", b"ID", request_id.encode()]
    frames = [*head, b"CODE", str(int(code)).encode(), b"MESSAGE", reason.encode()]
    if topic is not None:
        frames += (b"TOPIC", topic.encode())
    return frames


def ok_journaled(request_id: str, journal: str, seq: int, *, duplicate: bool = False) -> list[bytes]:
    frames = [b"OK", b"ID", request_id.encode(), b"JOURNAL", journal.encode(), b"SEQ", str(seq).encode()]
    if duplicate:
        frames += (b"DUPLICATE", b"1")
    return frames


def user_header_frames(headers: Mapping[str, str]) -> list[bytes]:
    """The ``X-`` headers of ``headers`` as flat key, value frames (for ``message``)."""
    frames: list[bytes] = []
    for key, value in headers.items():
        if key.startswith(USER_HEADER_PREFIX):  # as Command.user_headers, without building a dict
            frames += (key.encode(), value.encode())
    return frames


def message(
    topic: bytes,
    sender: bytes | None,
    user_headers: Sequence[bytes],
    body: Sequence[bytes],
    position: tuple[bytes, int] | None = None,
) -> list[bytes]:
    """MESSAGE frames; ``sender=None`` builds the seed (0.x) shape without SENDER.

    ``position`` is ``(journal, seq)`` for a journaled message (1.0 peers only).
    """
    frames = [b"MESSAGE", b"TOPIC", topic]
    if sender is not None:
        frames += (b"SENDER", sender)
        if position is not None:
            frames += (b"JOURNAL", position[0], b"SEQ", str(position[1]).encode())
    frames += user_headers
    frames.append(b"")
    frames += body
    return frames


NOOP_FRAMES: tuple[bytes, ...] = (b"NOOP",)
DISCONNECT_FRAMES: tuple[bytes, ...] = (b"DISCONNECT",)


# ---------------------------------------------------------------- RPC builders

MAX_SERVICE_BYTES = 255


def _finish(frames: list[bytes], *headers: Mapping[str, str], body: Sequence[bytes]) -> list[bytes]:
    """Append header pairs, then (if any) the empty frame and the body."""
    for mapping in headers:
        for key, value in mapping.items():
            frames += (key.encode(), value.encode())
    if body:
        frames.append(b"")
        frames += body
    return frames


def request_to_worker(
    bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
) -> list[bytes]:
    frames = [b"REQUEST", b"SERVICE", service.encode(), b"ID", bid.encode(), b"CALLER", caller.encode()]
    frames += (b"TIMEOUT", str(timeout_ms).encode())
    return _finish(frames, user, body=body)


def reply(
    verb: Verb, request_id: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
) -> list[bytes]:
    """PARTIAL/FINAL frames: ID, then reserved ``fields``, then user headers, then the body."""
    return _finish([verb.value.encode(), b"ID", request_id.encode()], fields, user, body=body)


def cancel(request_id: str) -> list[bytes]:
    return [b"CANCEL", b"ID", request_id.encode()]


class Mc0Dialect:
    """Renders broker -> peer RPC traffic as mc0 frames (the MDP adapter has its own)."""

    name = "mc0"
    heartbeats = True

    def to_worker(
        self, bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        return request_to_worker(bid, service, caller, timeout_ms, user, body)

    def cancel(self, bid: str) -> list[bytes] | None:
        return cancel(bid)

    def partial(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        return reply(Verb.PARTIAL, rid, fields, user, body)

    def final(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]:
        return reply(Verb.FINAL, rid, fields, user, body)

    def error(self, rid: str | None, service: str, code: int, reason: str) -> list[bytes]:
        return error(code, reason, rid)

    def heartbeat(self) -> Sequence[bytes] | None:
        return NOOP_FRAMES

    def disconnect(self) -> Sequence[bytes] | None:
        return DISCONNECT_FRAMES


MC0_DIALECT = Mc0Dialect()


class Dialect(Protocol):
    """How the broker renders RPC traffic and heartbeats for one kind of peer."""

    name: str
    heartbeats: bool

    def to_worker(
        self, bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]: ...

    def cancel(self, bid: str) -> list[bytes] | None: ...

    def partial(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]: ...

    def final(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes]: ...

    def error(self, rid: str | None, service: str, code: int, reason: str) -> list[bytes]: ...

    def heartbeat(self) -> Sequence[bytes] | None: ...

    def disconnect(self) -> Sequence[bytes] | None: ...


# ---------------------------------------------------------------- mc0.journal pages


def journal_page(records: Sequence[Record]) -> list[bytes]:
    """A fetch page, two frames: JSON metadata of each record (``parts`` = its
    body frames' lengths), then every record's body frames concatenated."""
    meta = [
        {
            "seq": r.seq,
            "ts": r.ts,
            "topic": r.topic,
            "sender": r.sender,
            "headers": r.headers,
            "parts": [len(p) for p in r.parts],
        }
        for r in records
    ]
    return [json.dumps(meta, separators=(",", ":")).encode(), b"".join(p for r in records for p in r.parts)]


def parse_journal_page(frames: Sequence[bytes]) -> list[Record]:
    """The inverse of ``journal_page`` (clients use it); ValueError if malformed."""
    try:
        meta = json.loads(bytes(frames[0]))
        blob = memoryview(bytes(frames[1])) if len(frames) > 1 else memoryview(b"")
        records = []
        pos = 0
        for m in meta:
            parts = []
            for n in m["parts"]:
                parts.append(bytes(blob[pos : pos + n]))
                pos += n
            records.append(
                Record(int(m["seq"]), float(m["ts"]), m["topic"], m["sender"], dict(m["headers"]), tuple(parts))
            )
    except (KeyError, TypeError, IndexError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed journal page: {exc}") from None
    if pos != len(blob):
        raise ValueError("malformed journal page: body length mismatch")
    return records
