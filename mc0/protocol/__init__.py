"""The mc0 wire protocol: every verb, header, status code and limit, in one place.

Grammar (frames after the ROUTER routing id; ``""`` is an empty frame)::

    message    = VERB *(KEY VALUE) [ "" 1*POSITIONAL ]
    VERB       = one of Verb, ASCII
    KEY        = non-empty ASCII: a reserved Header, or a user header "X-..." (or the
                 W3C trace context's "traceparent" / "tracestate")
    VALUE      = UTF-8 text, may be empty
    POSITIONAL = opaque bytes (patterns for SUB/UNSUB, body frames for PUT/MESSAGE)

Headers are read in pairs; an empty frame where a *key* is expected starts
the positional part (so an empty header *value* is legal).  A key with no
value, a repeated key, a reserved key the verb does not take and any other
non-``X-`` key are malformed (400).  ``X-`` headers pass through untouched, and so
do ``traceparent`` and ``tracestate`` (user headers too: ``mc0.protocol.tracecontext``).

Peer -> broker::

    CONNECT    [VERSION v] [TTL ms] [ID id] [BATCH 1] [ECHO 0]  -> OK ID id TTL ms [BATCH 1]
               (no VERSION: 0.1; no TTL: DEFAULT_TTL_MS, and no expiry for silence; no ID: no OK;
               the OK is a message of its own, never inside a BATCH)
    DISCONNECT [ID id]
    NOOP       [ID id]                             (heartbeat)
    PING       ID x                                -> PONG ID x        (1.0)
    SUB        [ID id] [FROM seq [JOURNAL j] | GROUP g] "" pattern...   (FROM: replay, then live; GROUP: queue group)
    UNSUB      [ID id] [GROUP g] "" pattern...
    PUT        TOPIC t [ID id] [MSGID m] [TO identity] [X-...] "" body...   (TO: a direct message, a mailbox)
    READY      [ID id] [CAPACITY n] "" service...  (1.0, a worker)
    REQUEST    SERVICE s ID rid [TIMEOUT ms] [ALL 1] [X-...] ["" body...]
    CANCEL     ID rid
    PARTIAL    ID bid [X-...] ["" body...]         (worker -> broker)
    FINAL      ID bid [X-...] ["" body...]
    ERROR      ID bid CODE c MESSAGE m             (a handler failure)

    BATCH      "" blob                             (once BATCH 1 was granted: see mc0.protocol.batch)

Broker -> peer::

    OK         ID id [TTL ms] [BATCH 1] [JOURNAL j SEQ n [DUPLICATE 1]] [MAILBOX delivered|stored]
               (to a SUB FROM: JOURNAL j SEQ n, the journal replayed and where its history ends)
    ERROR      [ID id] CODE nnn MESSAGE text [TOPIC pattern [GROUP g]]   (TOPIC: a subscription withdrawn)
    ERROR      CODE nnn MESSAGE text JOURNAL j TOPIC pattern   (a SUB FROM's replay of j ended; the SUB stays)
    MESSAGE    TOPIC t SENDER who [JOURNAL j SEQ n] [GROUP g] [TO identity] [X-...] "" body...  (0.x: no SENDER)
    NOOP
    PONG       ID x
    DISCONNECT
    REQUEST    SERVICE s ID bid CALLER who TIMEOUT ms [X-...] ["" body...]   (to a worker)
    CANCEL     ID bid                                                     (to a worker)
    PARTIAL    ID rid [WORKER w [CODE c MESSAGE m]] [X-...] ["" body...]  (to a client)
    FINAL      ID rid [COUNT n MISSING m] [X-...] ["" body...]
    BATCH      "" blob                             (to a peer that was granted BATCH 1)

A command carrying ``ID`` is answered ``OK``/``ERROR`` with that ID; without
``ID`` nothing comes back unless something exceptional happened, which always
gets an ``ERROR``.  A REQUEST's ID names the request instead: it is answered
by zero or more PARTIAL and exactly one terminal FINAL or ERROR with that ID.
Versions ``0.1``-``0.3`` are the seed's pub/sub (the seed verbs only; a topic
is an exact string, no wildcards); ``1.0`` is the full protocol.  A message
whose first frame is empty (``"" VERB ...``, the original mc0d peers, which are
DEALERs) is *enveloped*: the session opened by such a CONNECT gets the empty
frame in front of everything sent to it.

Status codes: see :class:`Status`.  Limits: see :class:`Limits`.
docs/PROTOCOL.md is the prose version of this docstring.

The model lives in :mod:`.model` (verbs, headers, statuses, limits, the
grammar table), the decoder in :mod:`.codec`, the senders' builders and the
``Dialect`` interface in :mod:`.builders`, the bodies the broker itself
parses in :mod:`.bodies`, and batched framing in :mod:`.batch`; everything is re-exported here, so ``mc0.protocol``
is the one place to import from.  The built-in services' own requests are parsed in their modules, imported from
there: :mod:`.admin` (``mc0.admin``) and :mod:`.consumerrequests` (``mc0.consumer``'s ops on one consumer).
"""

from __future__ import annotations

from ..errors import ProtocolError, quoted, wire_text
from ..message import Record
from . import batch
from .admin import ADMIN_SERVICE
from .bodies import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    PAGE_COLUMNS,
    PAGE_FORMATS,
    PAGE_JSON,
    ColumnsPage,
    PageColumns,
    columns_page,
    is_columns_page,
    journal_page,
    json_body,
    page_columns,
    parse_columns_page,
    parse_journal_page,
)
from .builders import (
    DISCONNECT_FRAMES,
    MC0_BATCHED_DIALECT,
    MC0_DIALECT,
    MC0_ROUTE_DIALECT,
    NOOP_FRAMES,
    Dialect,
    Mc0BatchedDialect,
    Mc0Dialect,
    cancel,
    encode,
    enveloped,
    error,
    message,
    ok,
    ok_journaled,
    ok_mailbox,
    replay_ended,
    reply,
    request_to_worker,
    user_header_frames,
)
from .codec import (
    MAX_DECIMAL_DIGITS,
    Command,
    decimal,
    decode,
    find_id,
    in_band_body,
    in_band_error,
    parse_int,
    worker_error,
)
from .model import (
    ANONYMOUS,
    BROKER_GRAMMAR,
    BROKER_SERVICE,
    CONSUMER_SERVICE,
    DEAD_TOPIC_HEADER,
    DEFAULT_LIMITS,
    DEFAULT_TTL_MS,
    ECHO_OFF,
    ENVELOPE,
    FULL_VERSION,
    GRAMMAR,
    HEARTBEAT_FRACTION,
    IDENTITY_OP,
    JOURNAL_SERVICE,
    MAILBOX_DELIVERED,
    MAILBOX_EXPIRES,
    MAILBOX_STORED,
    MAX_GROUP_BYTES,
    MAX_SERVICE_BYTES,
    MMI_SERVICE,
    OLDEST_VERSION,
    PEER_GRAMMAR,
    REMOTE_ERRORS,
    RESERVED_TOPIC_PREFIX,
    SEED_VERSIONS,
    SYS_DEAD_PREFIX,
    SYS_MAILBOX_LETTER,
    SYS_MAILBOX_PATTERN,
    SYS_MAILBOX_SETTLED,
    SYS_PEER_TOPIC,
    SYS_RPC_TOPIC,
    TRACE_HEADERS,
    TRACEPARENT,
    TRACESTATE,
    USER_HEADER_PREFIX,
    VERSIONS,
    WORKER_CODES,
    Grammar,
    Header,
    Limits,
    Payload,
    Side,
    Status,
    Unbatched,
    Verb,
    carried,
    is_user_header,
    remote_error,
    valid_group,
)
from .tracecontext import reply_headers, trace_context, trace_frames, trace_id

__all__ = [
    "batch",
    "ADMIN_SERVICE",
    "PAGE_COLUMNS",
    "PAGE_FORMATS",
    "PAGE_JSON",
    "ColumnsPage",
    "PageColumns",
    "ANONYMOUS",
    "BROKER_GRAMMAR",
    "BROKER_SERVICE",
    "Command",
    "DEFAULT_LIMITS",
    "DEFAULT_TTL_MS",
    "ENVELOPE",
    "HEARTBEAT_FRACTION",
    "OLDEST_VERSION",
    "DISCONNECT_FRAMES",
    "Dialect",
    "FULL_VERSION",
    "GRAMMAR",
    "Grammar",
    "Header",
    "JOURNAL_SERVICE",
    "CONSUMER_SERVICE",
    "DEAD_TOPIC_HEADER",
    "MAILBOX_DELIVERED",
    "MAILBOX_EXPIRES",
    "MAILBOX_STORED",
    "IDENTITY_OP",
    "ECHO_OFF",
    "Limits",
    "MAX_DECIMAL_DIGITS",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_GROUP_BYTES",
    "MAX_SERVICE_BYTES",
    "valid_group",
    "MC0_BATCHED_DIALECT",
    "MC0_ROUTE_DIALECT",
    "MC0_DIALECT",
    "Mc0BatchedDialect",
    "MMI_SERVICE",
    "Mc0Dialect",
    "NOOP_FRAMES",
    "PEER_GRAMMAR",
    "Payload",
    "ProtocolError",
    "REMOTE_ERRORS",
    "RESERVED_TOPIC_PREFIX",
    "Record",
    "SEED_VERSIONS",
    "SYS_DEAD_PREFIX",
    "SYS_MAILBOX_LETTER",
    "SYS_MAILBOX_PATTERN",
    "SYS_MAILBOX_SETTLED",
    "SYS_PEER_TOPIC",
    "SYS_RPC_TOPIC",
    "Side",
    "Status",
    "TRACE_HEADERS",
    "TRACEPARENT",
    "TRACESTATE",
    "USER_HEADER_PREFIX",
    "Unbatched",
    "VERSIONS",
    "Verb",
    "WORKER_CODES",
    "cancel",
    "carried",
    "decimal",
    "decode",
    "encode",
    "enveloped",
    "error",
    "find_id",
    "in_band_body",
    "in_band_error",
    "is_user_header",
    "columns_page",
    "is_columns_page",
    "journal_page",
    "json_body",
    "message",
    "ok",
    "ok_journaled",
    "ok_mailbox",
    "replay_ended",
    "parse_int",
    "quoted",
    "wire_text",
    "page_columns",
    "parse_columns_page",
    "parse_journal_page",
    "remote_error",
    "reply",
    "request_to_worker",
    "reply_headers",
    "trace_context",
    "trace_frames",
    "trace_id",
    "user_header_frames",
    "worker_error",
]
