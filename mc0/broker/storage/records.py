"""The record codec of the file journal (and of a JetStream journal's messages).

Contract: pure functions over bytes, no I/O.  A record on disk is ``head payload``
(see :mod:`.filestore` for the format); ``encode_payload`` is the payload alone,
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

from ...message import Record
from ...protocol import PageColumns

HEAD = struct.Struct("<IIQd")
SEQ_TS = struct.Struct("<Qd")
PAYLOAD_HEAD = struct.Struct("<HHHH")
_HEADER = struct.Struct("<HI")
_PART = struct.Struct("<I")
_RECORD_HEAD = struct.Struct("<IIQdHHHH")  # head then the payload's head: one unpack per record
# A length field beyond this is corruption, not a record (the broker's frame limit is far below).
MAX_PAYLOAD = 1 << 30


def encode_record(
    seq: int, ts: float, topic: str, sender: str, headers: Mapping[str, str], parts: Sequence[bytes]
) -> bytes:
    payload = encode_payload(topic, sender, headers, parts)
    seq_ts = SEQ_TS.pack(seq, ts)
    crc = zlib.crc32(payload, zlib.crc32(seq_ts))
    return HEAD.pack(len(payload), crc, seq, ts) + payload


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
