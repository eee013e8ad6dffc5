"""The ``mc0.consumer`` service's requests, parsed once into typed ones; a consumer's config.

Contract: pure, no I/O.  A request's body is a JSON object ``{"op": OP,
"journal": J, "name": N, ...its arguments}`` (docs/PROTOCOL.md, Durable
consumers).  :func:`consumer_query` reads the body, :func:`consumer_op` names
the op of a request on one consumer (``info``, ``pull``, ``ack``, ``nak``,
``term``, ``delete``; ``create`` and ``list`` are not on one consumer), and
:func:`consumer_request` checks that op's arguments whole into a frozen
request: :class:`ConsumerInfo`, :class:`ConsumerDelete`, :class:`ConsumerPull`,
:class:`ConsumerSettle` (ack, nak and term).  Each refusal is a
``ProtocolError`` 400 naming the field; nothing is changed by one.  Both
consumer backends use these (the broker's own, ``core/localconsumers.py``, and
JetStream's, ``jetstream/storeconsumers.py``), so a request means the same and
is refused with the same words whichever keeps the consumer.  The op and its
arguments are two steps because the broker's own consumers check the
caller's grants between them (a request both refused and malformed is
answered as it always was).  :func:`parse_config` checks a ``create``'s
config whole into a :class:`ConsumerConfig` (what is saved with the consumer)
and its topics' patterns.  :func:`int_field` is the one check of an integer
argument.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import InvalidTopic, ProtocolError, quoted
from ..topics import split_pattern
from .bodies import json_body
from .model import Status

ConsumerOp = Literal["info", "pull", "ack", "nak", "term", "delete"]
SettleOp = Literal["ack", "nak", "term"]
CONSUMER_OPS: tuple[ConsumerOp, ...] = ("info", "pull", "ack", "nak", "term", "delete")
OPS_TEXT = "create, pull, ack, nak, term, info, delete, list"  # every op, as an unknown op's answer names them
MAX_PULL = 1_000  # messages per pull
DEFAULT_PULL = 100
MAX_ACKS = 10_000  # sequence numbers per ack/nak/term
MAX_NAK_DELAY_MS = 86_400_000  # a day
CONSUMER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a consumer name is a topic token of its dead-letter topic


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """A ``create`` request's config (saved with the consumer; JetStream's keep it in their metadata)."""

    journal: str
    name: str
    topics: tuple[str, ...] = (">",)
    ack_wait_ms: int = 30_000
    max_deliver: int = 5
    max_ack_pending: int = 1_000
    deliver: str = "all"  # "all": from the journal's first record; "new": from its end at creation


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """``info``: the consumer's config, owner and figures."""

    journal: str
    name: str


@dataclass(frozen=True, slots=True)
class ConsumerDelete:
    """``delete``: the consumer goes (its owner may always delete it)."""

    journal: str
    name: str


@dataclass(frozen=True, slots=True)
class ConsumerPull:
    """``batch``: at most this many messages; ``wait_ms``: how long to wait for one (0: answer now),
    at most the broker's ``max_wait_ms``."""

    journal: str
    name: str
    batch: int
    wait_ms: int


@dataclass(frozen=True, slots=True)
class ConsumerSettle:
    """``ack``, ``nak`` or ``term`` (``how``) of ``seqs`` (in the order sent, repeats kept);
    ``delay_ms``: a nak's delay before the messages are due again (0 for ack and term)."""

    journal: str
    name: str
    how: SettleOp
    seqs: tuple[int, ...]
    delay_ms: int


ConsumerRequest = ConsumerInfo | ConsumerDelete | ConsumerPull | ConsumerSettle


def consumer_query(body: Sequence[bytes], rid: str) -> dict[str, Any]:
    """A request's body frames as its JSON object (400 when it is none; 413/400 from ``json_body``)."""
    text = b"".join(bytes(b) for b in body).decode("utf-8", "replace").strip()
    query = json_body(text, rid)
    if not isinstance(query, dict):
        raise ProtocolError(Status.BAD_REQUEST, "body must be a JSON object", rid)
    return query


def consumer_target(query: Mapping[str, Any]) -> tuple[str, str]:
    """``(journal, name)`` a request names (each "" when absent: no such consumer)."""
    return str(query.get("journal", "")), str(query.get("name", ""))


def consumer_op(query: Mapping[str, Any], rid: str) -> ConsumerOp:
    """The op of a request on one consumer; 400 for any other (``create`` and ``list`` included)."""
    op = query.get("op")
    for known in CONSUMER_OPS:
        if op == known:
            return known
    raise ProtocolError(Status.BAD_REQUEST, f"unknown op {quoted(str(op))}; ops: {OPS_TEXT}", rid)


def consumer_request(op: ConsumerOp, query: Mapping[str, Any], rid: str, *, max_wait_ms: int) -> ConsumerRequest:
    """``op``'s arguments in ``query``, checked whole (400 naming the first field that is wrong)."""
    journal, name = consumer_target(query)
    if op == "info":
        return ConsumerInfo(journal, name)
    if op == "delete":
        return ConsumerDelete(journal, name)
    if op == "pull":
        batch = int_field(query, "max", DEFAULT_PULL, 1, MAX_PULL, rid)
        wait_ms = int_field(query, "wait_ms", 0, 0, max_wait_ms, rid)
        return ConsumerPull(journal, name, batch, wait_ms)
    seqs = query.get("seqs")
    if (
        not isinstance(seqs, list)
        or len(seqs) > MAX_ACKS
        or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in seqs)
    ):
        raise ProtocolError(Status.BAD_REQUEST, f"seqs must be a list of at most {MAX_ACKS} positive integers", rid)
    delay_ms = int_field(query, "delay_ms", 0, 0, MAX_NAK_DELAY_MS, rid) if op == "nak" else 0
    return ConsumerSettle(journal, name, op, tuple(seqs), delay_ms)


def parse_consumer_request(query: Mapping[str, Any], rid: str, *, max_wait_ms: int) -> ConsumerRequest:
    """The op and its arguments at once (for a caller with nothing to check between them)."""
    return consumer_request(consumer_op(query, rid), query, rid, max_wait_ms=max_wait_ms)


def parse_config(
    journal: str, query: Mapping[str, Any], rid: str
) -> tuple[ConsumerConfig, tuple[tuple[str, ...], ...]]:
    """A ``create`` request's config and its topics' tokens, validated whole (400 otherwise)."""
    name = query.get("name")
    if not isinstance(name, str) or not CONSUMER_NAME.match(name):
        raise ProtocolError(Status.BAD_REQUEST, "name must be 1-64 letters, digits, '-' or '_'", rid)
    topics = query.get("topics", [">"])
    if isinstance(topics, str):
        topics = [topics]
    if not isinstance(topics, list) or not topics or not all(isinstance(t, str) for t in topics):
        raise ProtocolError(Status.BAD_REQUEST, "topics must be a non-empty list of patterns", rid)
    try:
        patterns = tuple(split_pattern(t) for t in topics)
    except InvalidTopic as exc:
        raise ProtocolError(Status.BAD_REQUEST, str(exc), rid) from None
    deliver = query.get("deliver", "all")
    if deliver not in ("all", "new"):
        raise ProtocolError(Status.BAD_REQUEST, "deliver must be 'all' or 'new'", rid)
    config = ConsumerConfig(
        journal,
        name,
        tuple(topics),
        int_field(query, "ack_wait_ms", 30_000, 1, 86_400_000, rid),
        int_field(query, "max_deliver", 5, 1, 1_000_000, rid),
        int_field(query, "max_ack_pending", 1_000, 1, 100_000, rid),
        deliver,
    )
    return config, patterns


def int_field(query: Mapping[str, Any], key: str, default: int, low: int, high: int, rid: str) -> int:
    """``query[key]`` (``default`` when absent): an integer in [low, high], never a bool (400 otherwise)."""
    value = query.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ProtocolError(Status.BAD_REQUEST, f"{key} must be an integer in [{low}, {high}]", rid)
    return value
