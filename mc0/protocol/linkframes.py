"""The layouts of what the cluster link's side and the broker loop hand each other in frames.

Contract: pure functions over bytes, no I/O.  These frames never leave the process (the link runs on
the broker's loop or in a thread of its own: :mod:`mc0.broker.cluster.link`), but they are records
all the same, so their layouts live here with the others': a number in a frame of its own
(``number_frame``/``frame_number``: a token, an epoch, a count, 8 bytes big endian); JetStream's acks
and failures, the records a stream delivered and a commit's proposals, each a ``meta`` frame of
fixed fields and lengths beside a ``blob`` frame of the payloads joined (what
:mod:`mc0.broker.jetstream.streams` puts in its posts).  A frame that is not what its kind says
raises ``struct.error`` or ``ValueError``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

_ACK = struct.Struct("!QQB")  # token, seq, duplicate
_RECORD = struct.Struct("!QqHI")  # seq, ts (ns), origin length, payload length
_PROPOSAL = struct.Struct("!QHHHI")  # token, subject, msgid and origin lengths, payload length
_FAILURE = struct.Struct("!QH")  # token, mc0 status
NS = 1_000_000_000  # a stream's times are nanoseconds; mc0's are seconds


def number_frame(number: int) -> bytes:
    """A token, an epoch or a count as a frame of its own (8 bytes, big endian)."""
    return number.to_bytes(8, "big")


def frame_number(frame: bytes) -> int:
    """The number of a ``number_frame``."""
    return int.from_bytes(frame, "big")


def ack(token: int, seq: int, duplicate: bool) -> bytes:
    """One proposal stored (its token, its stream seq, whether the stream had it already); a post's
    acks are these joined."""
    return _ACK.pack(token, seq, duplicate)


def acks(frame: bytes) -> list[tuple[int, int, bool]]:
    """(token, seq, duplicate) of each ``ack`` joined in ``frame``."""
    return [(t, s, bool(d)) for t, s, d in _ACK.iter_unpack(frame)]


def failure(token: int, code: int) -> bytes:
    """A proposal not stored: its token and mc0's status for it."""
    return _FAILURE.pack(token, code)


def read_failure(frame: bytes) -> tuple[int, int]:
    """(token, code) of a ``failure``."""
    token, code = _FAILURE.unpack(frame)
    return token, code


def records_meta(items: Iterable[tuple[int, int, str, bytes]]) -> bytes:
    """The meta frame of (seq, ts ns, origin, payload) each: fixed fields and the origin's text; the
    payloads go, joined in the same order, in the blob frame beside it."""
    return b"".join(_RECORD.pack(s, t, len(o), len(p)) + o.encode() for s, t, o, p in items)


def read_records(meta: bytes, blob: bytes) -> list[tuple[int, float, str, bytes]]:
    """(seq, ts in seconds, origin, payload) of each record of a ``records_meta`` and its blob."""
    records: list[tuple[int, float, str, bytes]] = []
    pos = start = 0
    while pos < len(meta):
        seq, ts, size, length = _RECORD.unpack_from(meta, pos)
        pos += _RECORD.size
        origin = meta[pos : pos + size].decode(errors="replace")
        pos += size
        records.append((seq, ts / NS, origin, blob[start : start + length]))
        start += length
    return records


def proposal_meta(token: int, subject: bytes, msgid: bytes, origin: bytes, payload_length: int) -> bytes:
    """One proposal's part of a commit's meta frame (its payload goes in the blob frame, in order)."""
    return _PROPOSAL.pack(token, len(subject), len(msgid), len(origin), payload_length) + subject + msgid + origin


def read_proposals(meta: bytes, blob: bytes) -> Iterator[tuple[int, str, str, str, bytes]]:
    """(token, subject, msgid, origin, payload) of each proposal of a meta frame and its blob, in order."""
    pos = start = 0
    while pos < len(meta):
        token, subject, msgid, origin, length = _PROPOSAL.unpack_from(meta, pos)
        pos += _PROPOSAL.size
        texts = meta[pos : pos + subject + msgid + origin].decode()
        pos += subject + msgid + origin
        yield (
            token,
            texts[:subject],
            texts[subject : subject + msgid],
            texts[subject + msgid :],
            blob[start : start + length],
        )
        start += length
