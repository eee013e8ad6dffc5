"""Builders: small, allocation-light constructors of the messages each side sends, and the
:class:`Dialect` interface the broker renders RPC traffic through (mc0 frames here; MDP and the
other seed dialects in :mod:`mc0.broker`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from . import batch as _batch
from .model import ENVELOPE, TRACE_HEADERS, USER_HEADER_PREFIX, Verb


def ok(request_id: str, *, ttl_ms: int | None = None, batch: bool = False) -> list[bytes]:
    if ttl_ms is None:
        return [b"OK", b"ID", request_id.encode()]
    frames = [b"OK", b"ID", request_id.encode(), b"TTL", str(ttl_ms).encode()]
    if batch:
        frames += (b"BATCH", b"1")
    return frames


def error(
    code: int, reason: str, request_id: str | None = None, *, topic: str | None = None, group: str | None = None
) -> list[bytes]:
    """ERROR frames; ``topic`` (and ``group``) name a subscription the broker withdrew."""
    head = [b"ERROR"] if request_id is None else [b"ERROR", b"ID", request_id.encode()]
    frames = [*head, b"CODE", str(int(code)).encode(), b"MESSAGE", reason.encode()]
    if topic is not None:
        frames += (b"TOPIC", topic.encode())
    if group is not None:
        frames += (b"GROUP", group.encode())
    return frames


def replay_ended(code: int, reason: str, journal: str, pattern: str) -> list[bytes]:
    """``ERROR CODE c MESSAGE m JOURNAL j TOPIC p``: the replay of ``journal`` a ``SUB FROM`` of ``pattern``
    (among others) started has ended with ``code``; the SUB stays, live (a withdrawal has no JOURNAL)."""
    return [*error(code, reason), b"JOURNAL", journal.encode(), b"TOPIC", pattern.encode()]


def ok_journaled(request_id: str, journal: str, seq: int, *, duplicate: bool = False) -> list[bytes]:
    frames = [b"OK", b"ID", request_id.encode(), b"JOURNAL", journal.encode(), b"SEQ", str(seq).encode()]
    if duplicate:
        frames += (b"DUPLICATE", b"1")
    return frames


def ok_mailbox(request_id: str, outcome: str, *, duplicate: bool = False) -> list[bytes]:
    """The OK to a ``PUT TO``: ``delivered`` (to a session now) or ``stored`` (until the identity connects);
    ``DUPLICATE 1``: a repeat of an earlier letter's MSGID, taken then (its outcome), not again."""
    frames = [b"OK", b"ID", request_id.encode(), b"MAILBOX", outcome.encode()]
    if duplicate:
        frames += (b"DUPLICATE", b"1")
    return frames


def user_header_frames(headers: Mapping[str, str]) -> list[bytes]:
    """The user headers (``X-`` and the trace context) of ``headers`` as flat key, value frames (for ``message``)."""
    frames: list[bytes] = []
    for key, value in headers.items():
        if key.startswith(USER_HEADER_PREFIX) or key in TRACE_HEADERS:  # as Command.user_headers, without a dict
            frames += (key.encode(), value.encode())
    return frames


def message(
    topic: bytes,
    sender: bytes | None,
    user_headers: Sequence[bytes],
    body: Sequence[bytes],
    position: tuple[bytes, int] | None = None,
    *,
    group: bytes | None = None,
    to: bytes | None = None,
    passed: tuple[bytes, bytes] | None = None,
) -> list[bytes]:
    """MESSAGE frames; ``sender=None`` builds the seed (0.x) shape without SENDER.

    ``position`` is ``(journal, seq)`` for a journaled message, ``group`` the
    queue group it is delivered for, ``to`` the identity of a direct message
    (1.0 peers only); ``passed`` (between brokers only: ``(b"TRIED" or b"REFUSED",
    broker list)``) the brokers a group copy was handed back by.
    """
    frames = [b"MESSAGE", b"TOPIC", topic]
    if sender is not None:
        frames += (b"SENDER", sender)
        if position is not None:
            frames += (b"JOURNAL", position[0], b"SEQ", str(position[1]).encode())
        if group is not None:
            frames += (b"GROUP", group)
        if to is not None:
            frames += (b"TO", to)
        if passed is not None:
            frames += passed
    frames += user_headers
    frames.append(b"")
    frames += body
    return frames


def enveloped(frames: Sequence[bytes]) -> list[bytes]:
    """``frames`` behind the empty frame an enveloped (mc0d-era DEALER) session expects."""
    return [ENVELOPE, *frames]


NOOP_FRAMES: tuple[bytes, ...] = (b"NOOP",)
DISCONNECT_FRAMES: tuple[bytes, ...] = (b"DISCONNECT",)


# ---------------------------------------------------------------- RPC builders


def encode(verb: Verb, headers: Mapping[str, str] | None = None, payload: Sequence[bytes] = ()) -> list[bytes]:
    """Command parts -> frames (the inverse of ``decode``)."""
    return _finish([verb.value.encode()], headers or {}, body=payload)


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
    bid: str,
    service: str,
    caller: str,
    timeout_ms: int,
    user: Mapping[str, str],
    body: Sequence[bytes],
    *,
    every_worker: bool = False,
) -> list[bytes]:
    """A REQUEST as a worker gets it; ``every_worker``: ``ALL 1``, a scatter leg sent to another
    broker of the cluster (a route), which scatters it to its own workers."""
    frames = [b"REQUEST", b"SERVICE", service.encode(), b"ID", bid.encode(), b"CALLER", caller.encode()]
    frames += (b"TIMEOUT", str(timeout_ms).encode())
    if every_worker:
        frames += (b"ALL", b"1")
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
    one_frame = False

    def to_worker(
        self, bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes] | bytes:
        return request_to_worker(bid, service, caller, timeout_ms, user, body)

    def cancel(self, bid: str) -> list[bytes] | None:
        return cancel(bid)

    def partial(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes] | bytes:
        return reply(Verb.PARTIAL, rid, fields, user, body)

    def final(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes] | bytes:
        return reply(Verb.FINAL, rid, fields, user, body)

    def error(self, rid: str | None, service: str, code: int, reason: str) -> list[bytes]:
        return error(code, reason, rid)

    def heartbeat(self) -> Sequence[bytes] | None:
        return NOOP_FRAMES

    def disconnect(self) -> Sequence[bytes] | None:
        return DISCONNECT_FRAMES


MC0_DIALECT = Mc0Dialect()


class Mc0BatchedDialect(Mc0Dialect):
    """Renders RPC traffic for an mc0 peer granted batched framing: the common shapes straight
    into batch records (REQUEST to a worker, PARTIAL, FINAL), anything else as frames (which
    the broker's shell turns into a record for that peer)."""

    def to_worker(
        self, bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes] | bytes:
        if not user and len(body) == 1:
            return _batch.work_record(service.encode(), bid.encode(), caller.encode(), timeout_ms, bytes(body[0]))
        return request_to_worker(bid, service, caller, timeout_ms, user, body)

    def partial(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes] | bytes:
        if not fields and not user and len(body) == 1:
            return _batch.reply_record(False, rid.encode(), bytes(body[0]))
        return reply(Verb.PARTIAL, rid, fields, user, body)

    def final(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes] | bytes:
        if not fields and not user and len(body) == 1:
            return _batch.reply_record(True, rid.encode(), bytes(body[0]))
        return reply(Verb.FINAL, rid, fields, user, body)


MC0_BATCHED_DIALECT = Mc0BatchedDialect()


class Mc0RouteDialect(Mc0BatchedDialect):
    """Renders what goes to another broker of a cluster (a route): the batched wire, without
    heartbeats (a route's liveness is its broker's beacon, not a NOOP per pair of brokers)."""

    name = "route"
    heartbeats = False

    def heartbeat(self) -> Sequence[bytes] | None:
        return None


MC0_ROUTE_DIALECT = Mc0RouteDialect()


class Dialect(Protocol):
    """How the broker renders RPC traffic and heartbeats for one kind of peer.

    ``one_frame``: a worker of this dialect takes a request body of one frame only (eMQP, MemoDB),
    so a service it serves refuses multi-frame requests.  ``partial`` returns None when the
    dialect has no partial replies for a client: the PARTIAL is not forwarded (counted).
    """

    name: str
    heartbeats: bool
    one_frame: bool

    def to_worker(
        self, bid: str, service: str, caller: str, timeout_ms: int, user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes] | bytes: ...

    def cancel(self, bid: str) -> list[bytes] | None: ...

    def partial(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes] | bytes | None: ...

    def final(
        self, rid: str, service: str, fields: Mapping[str, str], user: Mapping[str, str], body: Sequence[bytes]
    ) -> list[bytes] | bytes: ...

    def error(self, rid: str | None, service: str, code: int, reason: str) -> list[bytes]: ...

    def heartbeat(self) -> Sequence[bytes] | None: ...

    def disconnect(self) -> Sequence[bytes] | None: ...
