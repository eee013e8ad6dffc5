"""What the JetStream part of the cluster link and the broker loop say to each other, and the streams.

Contract: pure data and codecs (plus ``api``, the one JetStream API request
helper, which the link thread's coroutines share).  ``specs_of(config)``: the
stream of each ``store = "jetstream"`` journal (:class:`StreamSpec`, its
JetStream config).  The loop sends the link thread ``OP_PUBLISH`` (one
proposal) and ``OP_CALL`` (a store call, :func:`call_frames`); the thread
posts back what :func:`parse_inbound` reads: ``Acks`` (proposals stored: token,
seq, duplicate), ``Failed`` (a proposal not stored: mc0's status and why),
``StreamState`` (where a stream starts and ends, and where its delivery to
the local copy starts), ``FeedStatus`` (whether the feed follows the stream
now, and why not), ``Records`` (what the stream delivered, in seq order:
seq, time, origin, payload) and ``Answer`` (a store call's answer, with the
payloads of the records it carries).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ...protocol import jetstream as jsw
from ...protocol import linkframes
from ...protocol.linkframes import NS
from ...settings import Config, JournalSettings

# Frames the loop sends the link thread (the first frame; route names never start with \x01).
OP_PUBLISH, OP_CALL = b"\x01P", b"\x01C"
# Frames the link thread posts to the loop.
ACKS, FAILED, STATE, RECORDS, ANSWER, FEED = b"A", b"F", b"S", b"W", b"C", b"L"  # (none of cluster.posts.KINDS)
# (Their frames' layouts: mc0.protocol.linkframes.)
API_TIMEOUT_S = 5.0
NOT_FOUND_ERRORS = {10014, 10059}  # JetStream's consumer / stream not found


@dataclass(frozen=True, slots=True)
class StreamSpec:
    journal: str
    replicas: int
    max_age_s: float
    max_bytes: int
    max_msgs: int
    duplicate_window_s: float
    mailboxes: bool = False
    max_msgs_per_subject: int = -1

    def config(self) -> dict[str, Any]:
        """The stream's JetStream config (durations in nanoseconds)."""
        config: dict[str, Any] = {
            "name": jsw.stream_name(self.journal),
            "subjects": [jsw.subjects(self.journal)],
            "retention": "limits",
            "storage": "file",
            "num_replicas": self.replicas,
            "discard": "new" if self.mailboxes else "old",
            "max_age": int(self.max_age_s * NS),
            "max_bytes": self.max_bytes or -1,
            "max_msgs": self.max_msgs or -1,
            "max_msgs_per_subject": self.max_msgs_per_subject,
            "duplicate_window": int(self.duplicate_window_s * NS),
            "allow_direct": True,
        }
        if self.mailboxes:
            config["discard_new_per_subject"] = True
        return config


def spec_of(name: str, journal: JournalSettings, config: Config) -> StreamSpec:
    """A JetStream journal's stream.  A journal that keeps mailboxes is bounded as mailboxes are:
    letters per identity (its subject), their age (the TTL), all of them in bytes; beyond: refused."""
    broker = config.broker
    window = journal.dedup_window_s or 120  # 0 = publishers' MSGIDs not used (mc0 journal copy's ids still are)
    if journal.mailboxes:
        age = broker.mailbox_ttl_ms / 1000.0
        return StreamSpec(
            name, journal.replicas, age, broker.mailboxes_max_bytes, 0, window, True, broker.mailbox_max_messages
        )
    return StreamSpec(name, journal.replicas, journal.max_age_s, journal.max_bytes, journal.max_messages, window)


def specs_of(config: Config) -> dict[str, StreamSpec]:
    return {n: spec_of(n, j, config) for n, j in sorted(config.journals.items()) if j.replicated}


class StoreError(Exception):
    """JetStream answered an error (or nothing): ``code`` is mc0's status, ``err_code`` JetStream's."""

    def __init__(self, code: int, description: str, err_code: int = 0, *, unanswered: bool = False) -> None:
        super().__init__(description)
        self.code = code
        self.description = description
        self.err_code = err_code
        self.unanswered = unanswered  # no answer came (timeout, no responders, the connection lost)


async def api(nc: Any, subject: str, request: dict[str, Any] | None = None, timeout: float = API_TIMEOUT_S) -> Any:
    """One JetStream API request (``$JS.API.<subject>``): its answer, or StoreError."""
    payload = json.dumps(request).encode() if request is not None else b""
    try:
        msg = await nc.request(f"$JS.API.{subject}", payload, timeout=timeout)
    except Exception as exc:  # timeout, no responders (no meta leader), connection lost
        raise StoreError(503, f"JetStream did not answer ({type(exc).__name__})", unanswered=True) from None
    try:
        answer = json.loads(msg.data or b"{}")
    except ValueError:
        raise StoreError(503, "JetStream answered something that is not JSON") from None
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict):
        err_code = int(error.get("err_code") or 0)
        code = 404 if err_code in NOT_FOUND_ERRORS else int(error.get("code") or 500)
        code = code if code in (400, 404, 409, 503) else 503 if code >= 500 else 400
        raise StoreError(code, str(error.get("description") or "JetStream refused"), err_code)
    return answer


def ack_tokens(reply: str) -> tuple[int, int, int, int] | None:
    """(delivery count, stream seq, consumer seq, ts ns) of a JetStream message's reply subject."""
    tokens = reply.split(".")
    try:
        if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<dc>.<sseq>.<dseq>.<ts>.<pending>
            return int(tokens[4]), int(tokens[5]), int(tokens[6]), int(tokens[7])
        if len(tokens) >= 11:  # $JS.ACK.<domain>.<hash>.<stream>.<consumer>.<dc>.<sseq>.<dseq>.<ts>.<pending>...
            return int(tokens[6]), int(tokens[7]), int(tokens[8]), int(tokens[9])
    except ValueError:
        return None
    return None


# ---------------------------------------------------------------- what the loop receives
@dataclass(frozen=True, slots=True)
class Acks:
    journal: str
    acks: list[tuple[int, int, bool]]  # (token, seq, duplicate)


@dataclass(frozen=True, slots=True)
class Failed:
    journal: str
    token: int
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class StreamState:
    journal: str
    first: int
    last: int
    created: str
    start: int


@dataclass(frozen=True, slots=True)
class FeedStatus:
    """The feed of ``journal`` follows the stream now (its consumer was made), or not (``reason``: why it
    stopped, or why it cannot start)."""

    journal: str
    following: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Records:
    journal: str
    records: list[tuple[int, float, str, bytes]]  # (seq, ts, origin, payload)


@dataclass(frozen=True, slots=True)
class Answer:
    token: int
    data: dict[str, Any]
    payloads: list[bytes]


StoreNews = Acks | Failed | StreamState | FeedStatus | Records | Answer


def parse_inbound(frames: Sequence[bytes]) -> StoreNews | None:
    """One post of the JetStream part (its frames), None if it is not one."""
    kind = frames[0]
    if kind == ACKS:
        return Acks(frames[1].decode(), linkframes.acks(frames[2]))
    if kind == FAILED:
        token, code = linkframes.read_failure(frames[2])
        return Failed(frames[1].decode(), token, code, frames[3].decode(errors="replace"))
    if kind == STATE:
        state = json.loads(frames[2])
        return StreamState(frames[1].decode(), state["first"], state["last"], state["created"], state["start"])
    if kind == FEED:
        return FeedStatus(frames[1].decode(), frames[2] == b"1", frames[3].decode(errors="replace"))
    if kind == RECORDS:
        return Records(frames[1].decode(), linkframes.read_records(frames[2], frames[3]))
    if kind == ANSWER:
        return Answer(linkframes.frame_number(frames[1]), json.loads(frames[2]), list(frames[3:]))
    return None


def state_frames(journal: str, first: int, last: int, created: str, start: int) -> tuple[bytes, ...]:
    state = {"first": first, "last": last, "created": created, "start": start}
    return (STATE, journal.encode(), json.dumps(state).encode())


def feed_frames(journal: str, following: bool, reason: str) -> tuple[bytes, ...]:
    return (FEED, journal.encode(), b"1" if following else b"0", reason.encode())


def records_frames(journal: str, items: list[tuple[int, int, str, bytes]]) -> tuple[bytes, ...]:
    """(seq, ts ns, origin, payload) each, in one message of four frames (a frame each costs a send)."""
    return (RECORDS, journal.encode(), linkframes.records_meta(items), b"".join(p for *_, p in items))


def proposals_frames(journal: str, proposals: Sequence[Any]) -> tuple[bytes, ...]:
    """A commit's proposals (``storage.replicated.Proposal``) to one journal, in one message of four frames."""
    meta = b"".join(
        linkframes.proposal_meta(p.token, p.subject.encode(), p.msgid.encode(), p.origin.encode(), len(p.payload))
        for p in proposals
    )
    return (OP_PUBLISH, journal.encode(), meta, b"".join(p.payload for p in proposals))


def parse_proposals(meta: bytes, blob: bytes) -> Iterator[tuple[int, str, str, str, bytes]]:
    """(token, subject, msgid, origin, payload) of each proposal of ``proposals_frames``, in order."""
    return linkframes.read_proposals(meta, blob)


def call_frames(token: int, request: dict[str, Any]) -> list[bytes]:
    return [OP_CALL, linkframes.number_frame(token), json.dumps(request).encode()]
