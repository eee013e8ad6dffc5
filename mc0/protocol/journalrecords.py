"""The layouts of a journal's records: a record in a file journal's segment, the body of a JetStream
journal's message, and a frame of a consumer's state log.

Contract: pure functions over bytes, no I/O; every ``struct`` layout of the journals is here (the
wire's are in :mod:`.batch`, :mod:`.bodies` and :mod:`.routes`), and the stores
(:mod:`mc0.broker.storage.filestore`, :mod:`mc0.broker.storage.consumerfiles`,
:mod:`mc0.broker.jetstream.replicated`) build and read records only through these functions.
A record on disk is ``head payload`` (``HEAD``: payload length, CRC-32 of seq, time and payload,
seq, time; see :mod:`mc0.broker.storage.filestore` for the segments); ``encode_payload`` is the payload alone,
which is also the body of a JetStream journal's message (its seq and time are the
stream's), so a record reads back the same from either store.  ``decode_payload``
and ``payload_columns`` raise ``struct.error``/``ValueError`` on inconsistent bytes.
A record with an empty payload is a *hole*: a seq its store holds that is no
mc0 record (a message in a JetStream journal's stream that mc0 did not write):
it keeps the seqs contiguous and every reader skips it (``payload_columns``
here, ``filestore`` for records).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Mapping, Sequence

from ..message import Record
from .bodies import PageColumns

HEAD = struct.Struct("<IIQd")
SEQ_TS = struct.Struct("<Qd")
PAYLOAD_HEAD = struct.Struct("<HHHH")
_HEADER = struct.Struct("<HI")
_PART = struct.Struct("<I")
_RECORD_HEAD = struct.Struct("<IIQdHHHH")  # head then the payload's head: one unpack per record
_TOPIC_LENGTH = struct.Struct("<H")  # the payload head's first field
# A length field beyond this is corruption, not a record (the broker's frame limit is far below).
MAX_PAYLOAD = 1 << 30
HEAD_BYTES = HEAD.size
PAYLOAD_HEAD_BYTES = PAYLOAD_HEAD.size
# A consumer's state log: frames of ``length crc body``; a length with CHANGE_FLAG set is a change to
# the state before it, not a whole state.
_STATE_FRAME = struct.Struct("<II")
CHANGE_FLAG = 1 << 31


def read_head(data: bytes | memoryview, pos: int) -> tuple[int, int, int, float]:
    """The head of the record at ``data[pos:]``: (payload length, CRC, seq, time); struct.error if
    fewer than ``HEAD_BYTES`` are left."""
    length, crc, seq, ts = HEAD.unpack_from(data, pos)
    return length, crc, seq, ts


def topic_stop(data: bytes, pos: int, end: int) -> int:
    """Where the topic of the payload ``data[pos:end]`` ends (it starts ``PAYLOAD_HEAD_BYTES`` after
    ``pos``); past ``end`` when the payload is too short for its head or its topic (a hole, or not an
    mc0 record).  Its u16 length read from two bytes: the topic index's hot path, no struct call."""
    start = pos + PAYLOAD_HEAD_BYTES
    return start + (data[pos] | data[pos + 1] << 8) if start <= end else end + 1


def record_crc(payload: bytes | memoryview, seq: int, ts: float) -> int:
    """The CRC a record's head holds: CRC-32 of its seq and time, continued over its payload."""
    return zlib.crc32(payload, zlib.crc32(SEQ_TS.pack(seq, ts)))


def frame_payload(seq: int, ts: float, payload: bytes) -> bytes:
    """The record on disk of a payload already encoded (``encode_payload``, or a JetStream message's)."""
    return HEAD.pack(len(payload), record_crc(payload, seq, ts), seq, ts) + payload


def payload_topic(data: bytes | memoryview, pos: int) -> bytes:
    """The topic's bytes of the payload at ``data[pos:]`` (struct.error if too short for its head)."""
    (length,) = _TOPIC_LENGTH.unpack_from(data, pos)
    start = pos + PAYLOAD_HEAD.size
    return bytes(data[start : start + length])


def state_frame(body: bytes, *, change: bool) -> bytes:
    """A frame of a consumer's state log: a whole state, or (``change``) a change to the one before it;
    ValueError for a change too long for its length field."""
    if change:
        if len(body) >= CHANGE_FLAG:
            raise ValueError(f"a change of {len(body)} bytes")
        return _STATE_FRAME.pack(len(body) | CHANGE_FLAG, zlib.crc32(body)) + body
    return _STATE_FRAME.pack(len(body), zlib.crc32(body)) + body


def read_state_frame(data: bytes, pos: int) -> tuple[bytes, bool, int] | None:
    """The frame of a consumer's state log at ``data[pos:]``: (its body, whether it is a change, where
    it ends); None when fewer bytes than a frame's head are left, ValueError when it is torn or corrupt."""
    head = _STATE_FRAME.size
    if pos + head > len(data):
        return None
    length, crc = _STATE_FRAME.unpack_from(data, pos)
    end = pos + head + (length & ~CHANGE_FLAG)
    if end > len(data) or zlib.crc32(data[pos + head : end]) != crc:
        raise ValueError(f"a torn or corrupt frame at byte {pos}")
    return data[pos + head : end], bool(length & CHANGE_FLAG), end


def encode_record(
    seq: int, ts: float, topic: str, sender: str, headers: Mapping[str, str], parts: Sequence[bytes]
) -> bytes:
    return frame_payload(seq, ts, encode_payload(topic, sender, headers, parts))


def payload_prefix(topic: str, sender: str) -> bytes:
    """What ``encode_payload`` starts with for a record with no headers and one body frame: its
    payload's head, topic and sender (then come the body's length and the body)."""
    topic_b = topic.encode()
    sender_b = sender.encode()
    return PAYLOAD_HEAD.pack(len(topic_b), len(sender_b), 0, 1) + topic_b + sender_b


def encode_body_record(seq: int, ts: float, prefix: bytes, body: bytes) -> bytes:
    """``encode_record`` of a record with no headers and one body frame (a PUT record's), ``prefix``
    its ``payload_prefix``: the same bytes, without building the payload first (its CRC is taken
    piece by piece, as zlib continues one)."""
    part = _PART.pack(len(body))
    crc = zlib.crc32(body, zlib.crc32(part, zlib.crc32(prefix, zlib.crc32(SEQ_TS.pack(seq, ts)))))
    return b"".join((HEAD.pack(len(prefix) + _PART.size + len(body), crc, seq, ts), prefix, part, body))


def encode_payload(topic: str, sender: str, headers: Mapping[str, str], parts: Sequence[bytes]) -> bytes:
    """A record's payload (everything but its seq and time): also what a JetStream journal's message holds."""
    topic_b = topic.encode()
    sender_b = sender.encode()
    chunks: list[bytes] = [PAYLOAD_HEAD.pack(len(topic_b), len(sender_b), len(headers), len(parts)), topic_b, sender_b]
    for key, value in headers.items():
        k = key.encode()
        v = value.encode()
        chunks += (_HEADER.pack(len(k), len(v)), k, v)
    for part in parts:
        chunks += (_PART.pack(len(part)), bytes(part))
    return b"".join(chunks)


def decode_payload(seq: int, ts: float, data: bytes | memoryview, pos: int, end: int) -> Record:
    """One record's payload ``data[pos:end]`` -> Record (struct.error / ValueError if malformed)."""
    topic_len, sender_len, n_headers, n_parts = PAYLOAD_HEAD.unpack_from(data, pos)
    pos += PAYLOAD_HEAD.size
    topic = bytes(data[pos : pos + topic_len]).decode()
    pos += topic_len
    sender = bytes(data[pos : pos + sender_len]).decode()
    pos += sender_len
    headers: dict[str, str] = {}
    for _ in range(n_headers):
        klen, vlen = _HEADER.unpack_from(data, pos)
        pos += _HEADER.size
        headers[bytes(data[pos : pos + klen]).decode()] = bytes(data[pos + klen : pos + klen + vlen]).decode()
        pos += klen + vlen
    parts: list[bytes] = []
    for _ in range(n_parts):
        (n,) = _PART.unpack_from(data, pos)
        pos += _PART.size
        parts.append(bytes(data[pos : pos + n]))
        pos += n
    if pos != end:
        raise ValueError("record payload length mismatch")
    return Record(seq, ts, topic, sender, headers, tuple(parts))


def payload_columns(data: bytes, match: Callable[[str], bool] | None, columns: PageColumns) -> None:
    """Append the records in ``data`` (whole records) whose topic passes ``match`` to ``columns``.

    The hot loop of a columns fetch: one struct unpack per record and slices
    of ``data``; a record's topic is decoded only to ask ``match``, once per
    distinct topic.  struct.error / ValueError if a record is inconsistent.
    """
    seqs, tss, topics, senders = columns.seqs, columns.tss, columns.topics, columns.senders
    header_counts, keys, values = columns.header_counts, columns.header_keys, columns.header_values
    part_counts, parts = columns.part_counts, columns.parts
    verdicts: dict[bytes, bool] = {}
    unpack_record = _RECORD_HEAD.unpack_from
    unpack_header = _HEADER.unpack_from
    unpack_part = _PART.unpack_from
    pos = 0
    size = len(data)
    head, record_head, part_head = _RECORD_HEAD.size, HEAD.size, _PART.size  # locals: read per record
    while pos < size:
        try:
            length, _crc, seq, ts, topic_len, sender_len, n_headers, n_parts = unpack_record(data, pos)
        except struct.error:  # a hole last: no payload head after its head (anything else is corrupt)
            if HEAD.unpack_from(data, pos)[0]:
                raise
            length = 0
        if not length:  # a hole: no record
            pos += record_head
            continue
        p = pos + head
        pos += record_head + length  # the next record: this one ends here
        t = p + topic_len
        topic = data[p:t]
        if match is not None:
            verdict = verdicts.get(topic)
            if verdict is None:
                verdict = verdicts[topic] = match(topic.decode())
            if not verdict:
                continue
        seqs.append(seq)
        tss.append(ts)
        topics.append(topic)
        p = t + sender_len
        senders.append(data[t:p])
        if n_headers == 0 and n_parts == 1:  # the common record: no headers, one body frame
            header_counts.append(0)
            part_counts.append(1)
            if unpack_part(data, p)[0] != pos - p - part_head:
                raise ValueError(f"record {seq}: payload length mismatch")
            parts.append(data[p + part_head : pos])
            continue
        for _ in range(n_headers):
            klen, vlen = unpack_header(data, p)
            p += _HEADER.size
            keys.append(data[p : p + klen])
            values.append(data[p + klen : p + klen + vlen])
            p += klen + vlen
        for _ in range(n_parts):
            (n,) = unpack_part(data, p)
            p += part_head
            parts.append(data[p : p + n])
            p += n
        header_counts.append(n_headers)
        part_counts.append(n_parts)
        if p != pos:
            raise ValueError(f"record {seq}: payload length mismatch")
