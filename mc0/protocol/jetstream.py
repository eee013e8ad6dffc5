"""The JetStream wire: how a journal kept by JetStream (``store = "jetstream"``) is laid out in NATS.

Contract: pure names and small codecs, no I/O.  Journal ``NAME`` is the stream
``MC0_J_NAME`` over the subjects ``mc0.j.NAME.>``: a record on topic ``T`` is
a message on ``mc0.j.NAME.T`` (a topic is a NATS subject already: the same
tokens, the same wildcards), whose body is the record's payload as the file
journal writes it (:mod:`mc0.protocol.journalrecords`) and whose seq and time
are the stream's, so every broker reads the same record at the same seq.  A
durable consumer ``C`` is the JetStream durable pull consumer ``C`` of that
stream, its mc0 owner, config and creation nonce in the consumer's metadata.  A kept letter
for identity ``I`` (the journal that keeps mailboxes) is a message on
``mc0.j.NAME.<hex of I>``: one subject per identity, so its letters are read
in order and removed (purged) up to the last one delivered.

Headers, on a message that needs them (most need none: nothing for NATS to
write or parse): ``Nats-Msg-Id`` (JetStream's dedup: the publisher's identity
and MSGID) and ``Mc0-Origin`` (the broker and the publisher's connection, when
a queue group matched there or the publisher said ``ECHO 0``: that broker picks
the group's member, and does not hand the publisher its own message).
"""

from __future__ import annotations

STREAM_PREFIX = "MC0_J_"
SUBJECT_PREFIX = "mc0.j."
MSG_ID = "Nats-Msg-Id"
ORIGIN = "Mc0-Origin"
OWNER_KEY = "mc0_owner"  # consumer metadata: the identity that created it
CONFIG_KEY = "mc0_config"  # consumer metadata: its mc0 config (JSON)
# Consumer metadata: a nonce made at its creation.  A consumer deleted and made again under the same
# name (by anyone, through any broker) has another: what a broker learnt of the old one never passes
# for the new one.  (One made before mc0 wrote it goes by JetStream's creation time.)
MADE_KEY = "mc0_made"
# A client's mc0.consumer requests on JetStream journals in flight at once (each is a store call the
# cluster link runs, not a queued request; 429 beyond, or beyond the broker's max_requests when lower).
MAX_STORE_CALLS = 64
# All clients' together, per broker: many connections cannot multiply MAX_STORE_CALLS (429 beyond).
MAX_STORE_CALLS_TOTAL = 4096
# Where a broker's local copy of a JetStream journal stands (``copy_state`` in ``mc0.journal info`` and
# /journalz, mc0.broker.jetstream.copystate): the copy has not learnt the stream's state since the broker
# started; it follows the stream; it follows it and is behind; its feed makes its consumer again; one of
# those for too long; the copy cannot be written.
COPY_STARTING, COPY_FOLLOWING, COPY_CATCHING_UP, COPY_RESTARTING, COPY_STUCK, COPY_BROKEN = (
    "starting", "following", "catching_up", "restarting", "stuck", "broken",
)  # fmt: skip
COPY_STATES = (COPY_STARTING, COPY_FOLLOWING, COPY_CATCHING_UP, COPY_RESTARTING, COPY_STUCK, COPY_BROKEN)


def stream_name(journal: str) -> str:
    return STREAM_PREFIX + journal


def journal_of(stream: str) -> str | None:
    return stream[len(STREAM_PREFIX) :] if stream.startswith(STREAM_PREFIX) else None


def subjects(journal: str) -> str:
    """The subjects the journal's stream takes."""
    return f"{SUBJECT_PREFIX}{journal}.>"


def subject(journal: str, topic: str) -> str:
    """Where a record on ``topic`` is published (a pattern gives a consumer's filter the same way)."""
    return f"{SUBJECT_PREFIX}{journal}.{topic}"


def topic_of(journal: str, subject_: str) -> str:
    return subject_[len(SUBJECT_PREFIX) + len(journal) + 1 :]


def letter_subject(journal: str, identity: str) -> str:
    """The subject of ``identity``'s kept letters (hex: an identity may hold any character but whitespace)."""
    return f"{SUBJECT_PREFIX}{journal}.{identity.encode().hex()}"


def msg_id(sender: str, msgid: str) -> str:
    """JetStream's dedup id for a publisher's MSGID (the sender's length first: no two pairs meet)."""
    return f"{len(sender)}:{sender}:{msgid}"


def origin(broker: str, routing_id: bytes = b"") -> str:
    return f"{broker}/{routing_id.hex()}"


def parse_origin(text: str) -> tuple[str, bytes] | None:
    """(broker, publisher's routing id) of an ``Mc0-Origin`` header, None if malformed."""
    broker, slash, peer = text.partition("/")
    if not slash:
        return None
    try:
        return broker, bytes.fromhex(peer)
    except ValueError:
        return None
