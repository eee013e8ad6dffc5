"""Batched framing: many commands in one ZeroMQ message.

Negotiated at CONNECT: a 1.0 peer that sends ``BATCH 1`` and is answered
``OK ... BATCH 1`` (a plain message, never inside a batch) may then send, and
will receive, messages of three frames ``BATCH "" blob`` (unbatched messages
stay valid both ways).  ``blob`` is
records back to back (little endian)::

    record  = size:u32  code:u8  body          size counts code and body
    FRAMES  (0) = n:u16  n * len:u32  frames   any command: its frames, verbatim
    PUT     (1) = tl:u16  topic  data          PUT TOPIC topic "" data
    MESSAGE (2) = sl:u16 sender  tl:u16 topic  data
                                               MESSAGE TOPIC topic SENDER sender "" data
    CALL    (3) = sl:u16 il:u16 timeout:u32  service id data
                                               REQUEST SERVICE service ID id TIMEOUT timeout "" data
    WORK    (4) = sl:u16 il:u16 cl:u16 timeout:u32  service id caller data
                                               REQUEST SERVICE service ID id CALLER caller TIMEOUT timeout "" data
    PARTIAL (5) = il:u16  id data              PARTIAL ID id "" data
    FINAL   (6) = il:u16  id data              FINAL ID id "" data
    OK      (7) = id                           OK ID id

(A MESSAGE ends with exactly the body of the PUT it delivers, ``tl topic
data``: the broker forwards that part of the publisher's record as it came.)

Codes 1-7 are shortcuts for the commonest shapes (one body frame, no other
header); each stands for exactly the frames shown, so every record expands
to frames (``frames_of``) and the one grammar applies.  Anything else is a
FRAMES record.  Limits apply per command as for an unbatched message (a
record larger than ``max_message_bytes`` is refused) and a batch has its own
byte limit (``Limits.max_batch_bytes``).  A malformed record is answered by
the receiver with its own ERROR (with the record's ID when it has one) and
does not spoil the others; a blob that cannot be split into records ends
where the damage starts.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

from ..errors import ProtocolError
from .codec import Command, decode
from .model import Header, Limits, Side, Status, Verb

BATCH = Verb.BATCH.value.encode()
BATCH_MARK = (BATCH, b"")  # the first two frames of a batch message

FRAMES, PUT, MESSAGE, CALL, WORK, PARTIAL, FINAL, OK = range(8)
CODES = range(8)

_HEAD = struct.Struct("<IB")  # size, code
U16 = struct.Struct("<H")
_U16 = U16
U16_PAIR = struct.Struct("<HH")
CALL_FIELDS = _CALL = struct.Struct("<HHI")
WORK_FIELDS = _WORK = struct.Struct("<HHHI")
_FRAME_LENGTHS = [struct.Struct(f"<{n}I") for n in range(64)]  # cached for the common frame counts
_NINE = U16.pack(9)

# Headers of the records: encoded once.
_PUT_B, _TOPIC_B, _MESSAGE_B, _SENDER_B = b"PUT", b"TOPIC", b"MESSAGE", b"SENDER"
_REQUEST_B, _SERVICE_B, _ID_B, _TIMEOUT_B, _CALLER_B = b"REQUEST", b"SERVICE", b"ID", b"TIMEOUT", b"CALLER"
_PARTIAL_B, _FINAL_B, _OK_B = b"PARTIAL", b"FINAL", b"OK"


_SHORT = "record shorter than its fixed fields"


def _fixed(packer: struct.Struct, blob: bytes | memoryview, start: int, end: int) -> tuple[int, ...]:
    """A record's fixed fields; ``struct.error`` when the record is shorter than them (they are
    never read from the record after it)."""
    if end - start < packer.size:
        raise struct.error(_SHORT)
    return packer.unpack_from(blob, start)


def batch_frames(blob: bytes) -> list[bytes]:
    """The message that carries ``blob``."""
    return [BATCH, b"", blob]


def is_batch(frames: Sequence[bytes]) -> bool:
    return len(frames) == 3 and frames[0] == BATCH and not frames[1]


# ---------------------------------------------------------------- encoding


_PUT_HEAD = struct.Struct("<IBH")


def put_record(topic: bytes, data: bytes) -> bytes:
    return b"".join((_PUT_HEAD.pack(3 + len(topic) + len(data), PUT, len(topic)), topic, data))


def message_record(topic: bytes, sender: bytes, data: bytes) -> bytes:
    size = 5 + len(topic) + len(sender) + len(data)
    return b"".join((_HEAD.pack(size, MESSAGE), _U16.pack(len(sender)), sender, _U16.pack(len(topic)), topic, data))


def sender_block(sender: bytes) -> bytes:
    """The part of a MESSAGE record that names its sender (a peer's is built once)."""
    return _U16.pack(len(sender)) + sender


def message_of_put(sender_block: bytes, put_body: bytes) -> bytes:
    """The MESSAGE record delivering a PUT record's body (``tl topic data``) from ``sender_block``."""
    return _HEAD.pack(1 + len(sender_block) + len(put_body), MESSAGE) + sender_block + put_body


def call_record(service: bytes, request_id: bytes, timeout_ms: int, data: bytes) -> bytes:
    size = 9 + len(service) + len(request_id) + len(data)
    return _HEAD.pack(size, CALL) + _CALL.pack(len(service), len(request_id), timeout_ms) + service + request_id + data


def work_record(service: bytes, bid: bytes, caller: bytes, timeout_ms: int, data: bytes) -> bytes:
    size = 11 + len(service) + len(bid) + len(caller) + len(data)
    fixed = _WORK.pack(len(service), len(bid), len(caller), timeout_ms)
    return _HEAD.pack(size, WORK) + fixed + service + bid + caller + data


def reply_record(final: bool, request_id: bytes, data: bytes) -> bytes:
    return (
        _HEAD.pack(3 + len(request_id) + len(data), FINAL if final else PARTIAL)
        + _U16.pack(len(request_id))
        + (request_id + data)
    )


def ok_record(request_id: bytes) -> bytes:
    return _HEAD.pack(1 + len(request_id), OK) + request_id


_GROUP_LENGTHS = _FRAME_LENGTHS[9]
_GROUP_FIXED = 1 + 2 + _GROUP_LENGTHS.size + len(b"MESSAGETOPICSENDERGROUP")
_GROUP_HEAD = struct.Struct("<IBH9I")  # a queue-group copy's record head, frame count and frame lengths


def group_message_record(topic: bytes, sender: bytes, group: bytes, data: bytes) -> bytes:
    """``frames_record(message(topic, sender, (), [data], group=group))`` in one pass: the
    copy a queue-group member gets, built per message (so the general path showed in profiles)."""
    lt, ls, lg, ld = len(topic), len(sender), len(group), len(data)
    head = _GROUP_HEAD.pack(_GROUP_FIXED + lt + ls + lg + ld, FRAMES, 9, 7, 5, lt, 6, ls, 5, lg, 0, ld)
    return b"".join((head, b"MESSAGETOPIC", topic, b"SENDER", sender, b"GROUP", group, data))


def group_message_fields(blob: bytes, start: int, end: int) -> tuple[bytes, bytes, bytes, bytes] | None:
    """``(topic, sender, group, data)`` when a FRAMES record is exactly what
    :func:`group_message_record` builds (a queue-group copy), else None: the
    receiver then takes the general path, so this is only a shortcut."""
    if end - start < 2 + _GROUP_LENGTHS.size or blob[start : start + 2] != _NINE:
        return None
    lengths = _GROUP_LENGTHS.unpack_from(blob, start + 2)
    if lengths[0] != 7 or lengths[1] != 5 or lengths[3] != 6 or lengths[5] != 5 or lengths[7] != 0:
        return None
    t = start + 2 + _GROUP_LENGTHS.size + 12
    s = t + lengths[2] + 6
    g = s + lengths[4] + 5
    d = g + lengths[6]
    if (
        d + lengths[8] != end
        or blob[t - 12 : t] != b"MESSAGETOPIC"
        or blob[s - 6 : s] != _SENDER_B
        or blob[g - 5 : g] != b"GROUP"
    ):
        return None
    return blob[t : s - 6], blob[s : g - 5], blob[g:d], blob[d:end]


def frames_record(frames: Sequence[bytes]) -> bytes:
    """Any command as a FRAMES record (its frames, verbatim)."""
    n = len(frames)
    lengths = [len(f) for f in frames]
    packer = _FRAME_LENGTHS[n] if n < len(_FRAME_LENGTHS) else struct.Struct(f"<{n}I")
    body = _U16.pack(n) + packer.pack(*lengths)
    return _HEAD.pack(1 + len(body) + sum(lengths), FRAMES) + body + b"".join(bytes(f) for f in frames)


def record_of(frames: Sequence[bytes]) -> bytes:
    """The shortest record for a command's frames: a shortcut when its shape allows, else FRAMES."""
    n = len(frames)
    verb = frames[0] if n else b""
    if n == 5 and verb == _PUT_B and frames[1] == _TOPIC_B and not frames[3]:
        return put_record(bytes(frames[2]), bytes(frames[4]))
    if n == 7 and verb == _MESSAGE_B and frames[1] == _TOPIC_B and frames[3] == _SENDER_B and not frames[5]:
        return message_record(bytes(frames[2]), bytes(frames[4]), bytes(frames[6]))
    if n == 5 and (verb == _FINAL_B or verb == _PARTIAL_B) and frames[1] == _ID_B and not frames[3]:
        return reply_record(verb == _FINAL_B, bytes(frames[2]), bytes(frames[4]))
    if n == 3 and verb == _OK_B and frames[1] == _ID_B:
        return ok_record(bytes(frames[2]))
    if (
        n == 11
        and verb == _REQUEST_B
        and frames[1] == _SERVICE_B
        and frames[3] == _ID_B
        and frames[5] == _CALLER_B
        and frames[7] == _TIMEOUT_B
        and not frames[9]
    ):
        timeout = int(frames[8])  # the broker's own rendering: always a decimal
        return work_record(bytes(frames[2]), bytes(frames[4]), bytes(frames[6]), timeout, bytes(frames[10]))
    return frames_record(frames)


# ---------------------------------------------------------------- decoding


def records(blob: bytes | memoryview, pos: int = 0) -> Iterator[tuple[int, int, int]]:
    """``(code, start, end)`` of each record's body in ``blob``, from the record at ``pos`` on
    (a record's end is where the next one starts: a walk resumes there).

    Raises ``ProtocolError`` (400) where the blob stops splitting into
    records (a size running past the end, an unknown code): the records
    before it are yielded first.
    """
    end = len(blob)
    unpack = _HEAD.unpack_from
    while pos < end:
        if pos + 5 > end:
            raise ProtocolError(Status.BAD_REQUEST, f"batch ends inside a record header at byte {pos}")
        size, code = unpack(blob, pos)
        stop = pos + 4 + size
        if size < 1 or stop > end:
            raise ProtocolError(Status.BAD_REQUEST, f"batch record at byte {pos} runs past the end ({size} bytes)")
        if code > OK:
            raise ProtocolError(Status.BAD_REQUEST, f"batch record at byte {pos} has unknown code {code}")
        yield code, pos + 5, stop
        pos = stop


def frames_of(blob: bytes | memoryview, code: int, start: int, end: int) -> list[bytes]:
    """A record's command as frames (what an unbatched peer would have sent); ProtocolError if malformed."""
    try:
        if code == PUT:
            (tl,) = _fixed(_U16, blob, start, end)
            t = start + 2 + tl
            _check(t <= end)
            return [_PUT_B, _TOPIC_B, bytes(blob[start + 2 : t]), b"", bytes(blob[t:end])]
        if code == MESSAGE:
            sender, topic, data = message_fields(blob, start, end)
            return [_MESSAGE_B, _TOPIC_B, bytes(topic), _SENDER_B, bytes(sender), b"", bytes(data)]
        if code == CALL:
            sl, il, timeout = _fixed(_CALL, blob, start, end)
            s = start + 8 + sl
            i = s + il
            _check(i <= end)
            service, rid = bytes(blob[start + 8 : s]), bytes(blob[s:i])
            return [
                _REQUEST_B,
                _SERVICE_B,
                service,
                _ID_B,
                rid,
                _TIMEOUT_B,
                str(timeout).encode(),
                b"",
                bytes(blob[i:end]),
            ]
        if code == WORK:
            sl, il, cl, timeout = _fixed(_WORK, blob, start, end)
            s = start + 10 + sl
            i = s + il
            c = i + cl
            _check(c <= end)
            return [
                _REQUEST_B,
                _SERVICE_B,
                bytes(blob[start + 10 : s]),
                _ID_B,
                bytes(blob[s:i]),
                _CALLER_B,
                bytes(blob[i:c]),
                _TIMEOUT_B,
                str(timeout).encode(),
                b"",
                bytes(blob[c:end]),
            ]
        if code == PARTIAL or code == FINAL:
            (il,) = _fixed(_U16, blob, start, end)
            i = start + 2 + il
            _check(i <= end)
            return [
                _FINAL_B if code == FINAL else _PARTIAL_B,
                _ID_B,
                bytes(blob[start + 2 : i]),
                b"",
                bytes(blob[i:end]),
            ]
        if code == OK:
            return [_OK_B, _ID_B, bytes(blob[start:end])]
        (n,) = _fixed(_U16, blob, start, end)
        pos = start + 2 + 4 * n
        _check(pos <= end)
        lengths = struct.unpack_from(f"<{n}I", blob, start + 2)
        frames = []
        for length in lengths:
            frames.append(bytes(blob[pos : pos + length]))
            pos += length
        _check(pos == end)
        return frames
    except struct.error:
        raise ProtocolError(Status.BAD_REQUEST, "batch record too short for its fields") from None


def message_fields(blob: bytes | memoryview, start: int, end: int) -> tuple[bytes, bytes, bytes]:
    """A MESSAGE record's ``(sender, topic, data)`` (struct.error / ProtocolError if malformed)."""
    if end - start < 2:  # (the hot paths check the fixed fields inline: see _fixed)
        raise struct.error(_SHORT)
    (sl,) = _U16.unpack_from(blob, start)
    s = start + 2 + sl
    if end - s < 2:
        raise struct.error(_SHORT)
    (tl,) = _U16.unpack_from(blob, s)
    t = s + 2 + tl
    _check(t <= end)
    return bytes(blob[start + 2 : s]), bytes(blob[s + 2 : t]), bytes(blob[t:end])  # (no copy when blob is bytes)


# ---------------------------------------------------------------- the broker's readers (its input hot path)
def put_topic(blob: bytes, start: int, end: int) -> tuple[bytes, int]:
    """A PUT record's topic and where its data starts, counted from ``start``: the data is
    ``blob[start + data_at : end]``, and ``blob[start:end]``, the record's body as it came, is what a
    MESSAGE to a batched subscriber ends with (``message_of_put``).  The broker's publish hot path
    reads a PUT this way, building nothing else; a record shorter than its fields is a 400."""
    if end - start < 2:
        raise ProtocolError(Status.BAD_REQUEST, "batch record too short for its fields")
    (tl,) = _U16.unpack_from(blob, start)
    data_at = 2 + tl
    if start + data_at > end:
        raise ProtocolError(Status.BAD_REQUEST, "PUT record fields run past its end")
    return blob[start + 2 : start + data_at], data_at


# ---------------------------------------------------------------- (end of the broker's readers)


def work_fields(blob: bytes, start: int, end: int) -> tuple[str, str, str, int, bytes]:
    """A WORK record's ``(service, bid, caller, timeout_ms, data)``; malformed raises struct.error or ProtocolError."""
    if end - start < 10:
        raise struct.error(_SHORT)
    sl, il, cl, timeout_ms = _WORK.unpack_from(blob, start)
    s = start + 10 + sl
    i = s + il
    c = i + cl
    _check(c <= end)
    return blob[start + 10 : s].decode(), blob[s:i].decode(), blob[i:c].decode(), timeout_ms, blob[c:end]


def call_fields(blob: bytes, start: int, end: int) -> tuple[str, str, int, bytes]:
    """A CALL record's ``(service, request id, timeout_ms, data)``."""
    if end - start < 8:
        raise struct.error(_SHORT)
    sl, il, timeout_ms = _CALL.unpack_from(blob, start)
    s = start + 8 + sl
    i = s + il
    _check(i <= end)
    return blob[start + 8 : s].decode(), blob[s:i].decode(), timeout_ms, blob[i:end]


def reply_fields(blob: bytes, start: int, end: int) -> tuple[str, bytes]:
    """A PARTIAL or FINAL record's ``(request id, data)``."""
    if end - start < 2:
        raise struct.error(_SHORT)
    (il,) = _U16.unpack_from(blob, start)
    i = start + 2 + il
    _check(i <= end)
    return blob[start + 2 : i].decode(), blob[i:end]


def _check(ok: bool) -> None:
    if not ok:
        raise ProtocolError(Status.BAD_REQUEST, "batch record fields run past its end")


def id_of(blob: bytes | memoryview, code: int, start: int, end: int) -> str | None:
    """Best-effort read of a record's ID (to answer a refused record with it)."""
    try:
        if code in (CALL, WORK):
            sl, il = _fixed(U16_PAIR, blob, start, end)
            offset = start + (8 if code == CALL else 10) + sl
            return bytes(blob[offset : offset + il]).decode() if offset + il <= end else None
        if code == PARTIAL or code == FINAL:
            (il,) = _fixed(_U16, blob, start, end)
            return bytes(blob[start + 2 : start + 2 + il]).decode() if start + 2 + il <= end else None
        if code == OK:
            return bytes(blob[start:end]).decode()
        if code == FRAMES:
            frames = frames_of(blob, code, start, end)
            for i in range(1, len(frames) - 1, 2):
                if not frames[i]:
                    break
                if frames[i] == Header.ID.value.encode():
                    return frames[i + 1].decode()
    except (struct.error, UnicodeDecodeError, ProtocolError):
        return None
    return None


def command_of(blob: bytes, code: int, start: int, end: int, limits: Limits, side: Side = Side.PEER) -> Command:
    """A peer's record as the Command ``decode`` would make of its frames (ProtocolError if it would refuse them).

    A peer's shortcuts become Commands directly, checked as ``decode`` would
    check their frames (size, UTF-8 header values: a shortcut's shape is
    always in the peer grammar); FRAMES records, and any record from
    another side (a route's grammar has no PUT, and its REQUEST needs a
    CALLER), go through ``decode`` itself, grammar and all.
    """
    if end - start > limits.max_message_bytes:
        reason = f"{end - start} bytes, the limit is {limits.max_message_bytes}"
        raise ProtocolError(Status.TOO_LARGE, reason, id_of(blob, code, start, end))
    if side is not Side.PEER:
        return decode(frames_of(blob, code, start, end), sender=side, limits=limits)
    try:
        if code == PUT:
            (tl,) = _fixed(_U16, blob, start, end)
            t = start + 2 + tl
            _check(t <= end)
            return Command(Verb.PUT, {Header.TOPIC: blob[start + 2 : t].decode()}, (blob[t:end],))
        if code == CALL:
            sl, il, timeout = _fixed(_CALL, blob, start, end)
            s = start + 8 + sl
            i = s + il
            _check(i <= end)
            rid = blob[s:i].decode()
            headers: dict[str, str] = {
                Header.SERVICE: blob[start + 8 : s].decode(),
                Header.ID: rid,
                Header.TIMEOUT: str(timeout),
            }
            return Command(Verb.REQUEST, headers, (blob[i:end],))
        if code == PARTIAL or code == FINAL:
            (il,) = _fixed(_U16, blob, start, end)
            i = start + 2 + il
            _check(i <= end)
            verb = Verb.FINAL if code == FINAL else Verb.PARTIAL
            return Command(verb, {Header.ID: blob[start + 2 : i].decode()}, (blob[i:end],))
    except struct.error:
        raise ProtocolError(Status.BAD_REQUEST, "batch record too short for its fields") from None
    except UnicodeDecodeError:
        raise ProtocolError(Status.BAD_REQUEST, "a header value is not UTF-8", id_of(blob, code, start, end)) from None
    return decode(frames_of(blob, code, start, end), sender=side, limits=limits)


# ---------------------------------------------------------------- a client's readers
# What a client reads of the batches its broker sends (mc0.session.ClientSession.receive_batch).

# A record as ``received`` reads it: (code, start, end, sender, topic, group, data).
ReceivedRecord = tuple[int, int, int, bytes, bytes, bytes | None, bytes]


def received(blob: bytes) -> Iterator[ReceivedRecord]:
    """Each record of a batch from the broker: ``(code, start, end, sender, topic, group, data)``.

    The two shapes a plain delivery takes come read, as code MESSAGE: a
    MESSAGE record (``group`` None) and a FRAMES record that is exactly a
    queue-group copy (:func:`group_message_record`).  Any other record comes
    as its code and span only, its fields empty (``frames_of``, ``work_fields``
    and ``reply_fields`` read it).  Raises ``ProtocolError`` where the blob
    stops splitting into records or a MESSAGE record's fields run past it,
    after the records before it.
    """
    # records() and message_fields() inline: this walk runs once per message a client receives.
    # The lengths are read byte by byte, each read checked against the end first: compiled
    # (mc0.native), that is native arithmetic, a quarter of the cost of struct's unpack_from
    # calls (measured: 0.54 -> 0.11-0.25 us a record); from source it costs more than struct
    # (0.39 -> 0.55 us), which the compiled hot path is there for.
    end_of_blob = len(blob)
    pos = 0
    while pos < end_of_blob:
        if pos + 5 > end_of_blob:
            raise ProtocolError(Status.BAD_REQUEST, f"batch ends inside a record header at byte {pos}")
        size = blob[pos] | blob[pos + 1] << 8 | blob[pos + 2] << 16 | blob[pos + 3] << 24
        code = blob[pos + 4]
        start = pos + 5
        end = pos + 4 + size
        if size < 1 or end > end_of_blob:
            raise ProtocolError(Status.BAD_REQUEST, f"batch record at byte {pos} runs past the end ({size} bytes)")
        if code > OK:
            raise ProtocolError(Status.BAD_REQUEST, f"batch record at byte {pos} has unknown code {code}")
        pos = end
        if code == MESSAGE:
            # sender length, sender, topic length, topic, data: each length read only inside the record.
            s = start + 2
            if s <= end:
                s += blob[start] | blob[start + 1] << 8
            t = s + 2
            if t <= end:
                t += blob[s] | blob[s + 1] << 8
            if t > end:
                raise ProtocolError(Status.BAD_REQUEST, "MESSAGE record fields run past its end")
            yield MESSAGE, start, end, blob[start + 2 : s], blob[s + 2 : t], None, blob[t:end]
        elif code == FRAMES and (fields := group_message_fields(blob, start, end)) is not None:
            topic, sender, group, data = fields
            yield MESSAGE, start, end, sender, topic, group, data
        else:
            yield code, start, end, b"", b"", None, b""
