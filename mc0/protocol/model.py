"""The wire model: every verb, header, status code, limit and the per-side grammar table.

Contract: data only (no parsing here: see :mod:`mc0.protocol.codec`).  The
package docstring (:mod:`mc0.protocol`) is the grammar in prose.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum, StrEnum

from .. import errors
from ..topics import DEFAULT_MAX_TOPIC_BYTES, DEFAULT_MAX_TOPIC_TOKENS


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
    BATCH = "BATCH"  # framing: many commands in one message (mc0.protocol.batch), once negotiated


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
    BATCH = "BATCH"  # CONNECT / OK: batched framing asked for / granted ("1")
    ECHO = "ECHO"  # CONNECT: "0" = never deliver this peer's own publishes back to it (NATS no_echo)
    GROUP = "GROUP"  # SUB / UNSUB: a queue group (each message to one member); MESSAGE: delivered for it
    TO = "TO"  # PUT: a direct message to one identity (its mailbox); MESSAGE: the identity it was sent to
    MAILBOX = "MAILBOX"  # OK to a PUT TO: "delivered" (to a session now) or "stored" (kept until it connects)
    EXACT = "EXACT"  # SUB / UNSUB between brokers (routes): "1" = the patterns are 0.x peers' exact topics
    # A queue-group copy between brokers (routes; the names: mc0.protocol.routes.broker_list):
    TRIED = "TRIED"  # the brokers that already handed this copy back (none of their members could take it)
    REFUSED = "REFUSED"  # the copy handed back to the broker that chose: these brokers could not place it


USER_HEADER_PREFIX = "X-"


class Status(IntEnum):
    BAD_REQUEST = 400  # malformed or invalid
    NOT_CONNECTED = 401  # no CONNECT yet, or the broker does not know the peer
    FORBIDDEN = 403
    NOT_FOUND = 404  # no such durable consumer (or journal)
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


# The codes a worker's ERROR may pass to its caller: the application's own.  Every
# other code speaks for the broker or the connection (401 would make the caller
# reconnect; 499/502/503/504 are the broker's verdicts on the request; 505 and
# 507 are about the protocol and the journal), so a worker sending one has it
# mapped to 500 with the code it sent named in the message.
WORKER_CODES = frozenset({400, 403, 404, 409, 410, 412, 413, 415, 422, 429, 500, 501})


REMOTE_ERRORS: dict[int, type[errors.RemoteError]] = {
    Status.BAD_REQUEST: errors.BadRequest,
    Status.NOT_CONNECTED: errors.NotConnected,
    Status.FORBIDDEN: errors.Forbidden,
    Status.TOO_LARGE: errors.TooLarge,
    Status.CONFLICT: errors.Conflict,
    Status.GONE: errors.Gone,
    Status.NOT_FOUND: errors.NotFound,
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
# CONNECT without VERSION or TTL (the seed gives no default; mc0d and its load tester
# mc0torture send "CONNECT ID x"): the oldest version, and this TTL (answered in the OK).
# Such a peer promised no heartbeat rate, so it is not expired for silence (see PROTOCOL.md).
OLDEST_VERSION = "0.1"
DEFAULT_TTL_MS = 5_000
# Each side sends NOOP once it has sent nothing to the other for this fraction of the TTL:
# the original peers give up at exactly TTL (the Ruby mc0d at 1.05 x TTL), so the other
# side's silence must stay clearly under it, with room for a loop turn and the sweep's step.
HEARTBEAT_FRACTION = 0.5
# A peer whose first frame is empty is "enveloped" (the original mc0d peers are DEALERs that
# send ["", VERB, ...]): its session puts this frame in front of everything sent to it.
ENVELOPE = b""


class Unbatched(list[bytes]):
    """Frames that go to a batched peer as a message of their own, never as a record inside a
    ``BATCH``: the OK to ``CONNECT ... BATCH 1``, which a peer reads before it reads any batch
    (docs/PROTOCOL.md, "Batched framing": the start-up)."""

    __slots__ = ()


ANONYMOUS = "anonymous"  # SENDER when the peer has no authenticated identity
BROKER_SERVICE = "mc0.broker"  # built-in: stats / services / topics / peers reports
MMI_SERVICE = "mmi.service"  # built-in: Majordomo's MMI (is a service served? 200 / 404)
JOURNAL_SERVICE = "mc0.journal"  # built-in: info / fetch over the broker's journals
CONSUMER_SERVICE = "mc0.consumer"  # built-in: durable consumers on a journal (create, pull, ack, nak, term, info)
MAILBOX_DELIVERED, MAILBOX_STORED = "delivered", "stored"  # OK ... MAILBOX x to a PUT TO
# mc0.broker {"op": "identity", "identity": NAME} -> {"identity", "seen", "connected"}: was NAME ever seen here
# (a letter "stored" for one never seen may be misaddressed); asked by a caller that may send to NAME.
IDENTITY_OP = "identity"
ECHO_OFF = "0"  # CONNECT ... ECHO 0
RESERVED_TOPIC_PREFIX = "mc0.sys."  # only the broker publishes here
SYS_RPC_TOPIC = RESERVED_TOPIC_PREFIX + "rpc"  # one JSON record per finished request
SYS_PEER_TOPIC = RESERVED_TOPIC_PREFIX + "peer"  # connects and disconnects
# A durable consumer's dead letters: mc0.sys.dead.<journal>.<consumer>, the message's body and X-
# headers plus X-Dead-*; X-Dead-Topic (its original topic) decides who may be handed it.
SYS_DEAD_PREFIX = RESERVED_TOPIC_PREFIX + "dead."
DEAD_TOPIC_HEADER = "X-Dead-Topic"
# A journal that keeps mailboxes ([journals.NAME] mailboxes = true) holds only these records:
# a kept letter, and which kept letters were settled (delivered, expired, dropped).
SYS_MAILBOX_PATTERN = RESERVED_TOPIC_PREFIX + "mailbox.>"
SYS_MAILBOX_LETTER = RESERVED_TOPIC_PREFIX + "mailbox.letter"
SYS_MAILBOX_SETTLED = RESERVED_TOPIC_PREFIX + "mailbox.settled"
MAILBOX_EXPIRES = "EXPIRES"  # a kept letter's record header: when it expires (wall-clock ms since the epoch)


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
    max_batch_bytes: int = 16 * 1024 * 1024  # one BATCH message (each record is also held to the limits above)


DEFAULT_LIMITS = Limits()
MAX_SERVICE_BYTES = 255  # a service name, like a topic, in UTF-8
MAX_GROUP_BYTES = 255  # a queue group's name: UTF-8, no whitespace


def valid_group(name: str) -> bool:
    """A queue group name (or a TO identity): 1..MAX_GROUP_BYTES UTF-8 bytes, no whitespace
    (a group name is a client's routing key too)."""
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return 0 < size <= MAX_GROUP_BYTES and not any(ch.isspace() for ch in name)


class Side(Enum):
    __hash__ = object.__hash__  # a singleton member; Enum's __hash__ is Python code, and decode looks it up per message

    PEER = "peer"
    BROKER = "broker"
    ROUTE = "route"  # another broker of the cluster (mc0.broker.core.routes)


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
    Verb.CONNECT: Grammar(optional=_h(Header.VERSION, Header.TTL, Header.ID, Header.BATCH, Header.ECHO)),
    Verb.DISCONNECT: Grammar(optional=_ID),
    Verb.NOOP: Grammar(optional=_ID),
    Verb.PING: Grammar(_ID, seed=False),
    Verb.SUB: Grammar(optional=_h(Header.ID, Header.FROM, Header.JOURNAL, Header.GROUP), payload=Payload.REQUIRED),
    Verb.UNSUB: Grammar(optional=_h(Header.ID, Header.GROUP), payload=Payload.REQUIRED),
    Verb.PUT: Grammar(_h(Header.TOPIC), _h(Header.ID, Header.MSGID, Header.TO), True, Payload.REQUIRED),
    # READY with no services: serve nothing more (a draining worker); what it holds may still finish.
    Verb.READY: Grammar(optional=_h(Header.ID, Header.CAPACITY), payload=Payload.OPTIONAL, seed=False),
    Verb.REQUEST: Grammar(
        _h(Header.SERVICE, Header.ID), _h(Header.TIMEOUT, Header.ALL), True, Payload.OPTIONAL, seed=False
    ),
    Verb.CANCEL: Grammar(_ID, seed=False),
    Verb.PARTIAL: Grammar(_ID, user_headers=True, payload=Payload.OPTIONAL, seed=False),
    Verb.FINAL: Grammar(_ID, user_headers=True, payload=Payload.OPTIONAL, seed=False),
    Verb.ERROR: Grammar(_h(Header.ID, Header.CODE, Header.MESSAGE), seed=False),
    Verb.BATCH: Grammar(payload=Payload.REQUIRED, seed=False),
}

# What the broker may send to a peer.
BROKER_GRAMMAR: dict[Verb, Grammar] = {
    Verb.OK: Grammar(_ID, _h(Header.TTL, Header.BATCH, Header.JOURNAL, Header.SEQ, Header.DUPLICATE, Header.MAILBOX)),
    # Without ID: TOPIC (GROUP) = that subscription withdrawn; JOURNAL j TOPIC p = the replay of j that a
    # SUB FROM of p started ended (retention, a read error, a copy behind), the SUB itself stays live.
    Verb.ERROR: Grammar(_h(Header.CODE, Header.MESSAGE), _h(Header.ID, Header.TOPIC, Header.GROUP, Header.JOURNAL)),
    Verb.MESSAGE: Grammar(
        _h(Header.TOPIC), _h(Header.SENDER, Header.JOURNAL, Header.SEQ, Header.GROUP, Header.TO), True, Payload.REQUIRED
    ),
    Verb.NOOP: Grammar(),
    Verb.PONG: Grammar(_ID, seed=False),
    Verb.DISCONNECT: Grammar(),
    Verb.REQUEST: Grammar(
        _h(Header.SERVICE, Header.ID, Header.CALLER, Header.TIMEOUT), frozenset(), True, Payload.OPTIONAL
    ),
    Verb.CANCEL: Grammar(_ID),
    Verb.PARTIAL: Grammar(_ID, _h(Header.WORKER, Header.CODE, Header.MESSAGE), True, Payload.OPTIONAL),
    Verb.FINAL: Grammar(_ID, _h(Header.COUNT, Header.MISSING), True, Payload.OPTIONAL),
    Verb.BATCH: Grammar(payload=Payload.REQUIRED, seed=False),
}

# What one broker of a cluster may send another (a route; docs/PROTOCOL.md "Between brokers"): the
# interest, services and identities of its own peers, then the traffic they cause.  Never a 0.x shape.
ROUTE_GRAMMAR: dict[Verb, Grammar] = {
    # It (re)opens its side of the session: the receiver resets its route to it and answers its own state.
    Verb.CONNECT: Grammar(_h(Header.VERSION, Header.TTL)),
    Verb.DISCONNECT: Grammar(),  # it stops: forget its route now, not after its beacons stop
    Verb.NOOP: Grammar(),
    # Its own peers' patterns (GROUP: of that queue group; EXACT 1: 0.x peers' exact topics); TO: an
    # identity with a session there (letters for it may go there).
    Verb.SUB: Grammar(optional=_h(Header.GROUP, Header.EXACT, Header.TO), payload=Payload.OPTIONAL),
    Verb.UNSUB: Grammar(optional=_h(Header.GROUP, Header.EXACT, Header.TO), payload=Payload.OPTIONAL),
    # One service and the total capacity of the workers that serve it there (0: none left).
    Verb.READY: Grammar(_h(Header.CAPACITY), payload=Payload.REQUIRED),
    # A request of one of its clients (CALLER: who; ALL: scatter to every worker here).
    Verb.REQUEST: Grammar(
        _h(Header.SERVICE, Header.ID, Header.CALLER, Header.TIMEOUT), _h(Header.ALL), True, Payload.OPTIONAL
    ),
    Verb.CANCEL: Grammar(_ID),
    Verb.PARTIAL: Grammar(_ID, _h(Header.WORKER, Header.CODE, Header.MESSAGE), True, Payload.OPTIONAL),
    Verb.FINAL: Grammar(_ID, _h(Header.COUNT, Header.MISSING), True, Payload.OPTIONAL),
    Verb.ERROR: Grammar(_h(Header.ID, Header.CODE, Header.MESSAGE)),
    # A publication there that our peers want (GROUP: for our members of that group; TO: a letter).
    # A group copy none of our members can take goes back to the broker that chose (REFUSED: with
    # every broker that could not, ourselves last), which chooses again among the others (TRIED).
    Verb.MESSAGE: Grammar(
        _h(Header.TOPIC, Header.SENDER),
        _h(Header.JOURNAL, Header.SEQ, Header.GROUP, Header.TO, Header.TRIED, Header.REFUSED),
        True,
        Payload.REQUIRED,
    ),
    Verb.BATCH: Grammar(payload=Payload.REQUIRED),
}

GRAMMAR: dict[Side, dict[Verb, Grammar]] = {
    Side.PEER: PEER_GRAMMAR,
    Side.BROKER: BROKER_GRAMMAR,
    Side.ROUTE: ROUTE_GRAMMAR,
}


def is_user_header(key: str) -> bool:
    """A key a sender may use for its own header: ``X-`` and at least one more ASCII character."""
    return key.startswith(USER_HEADER_PREFIX) and key.isascii() and len(key) > len(USER_HEADER_PREFIX)
