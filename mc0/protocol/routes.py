"""The route wire: what crosses NATS between brokers (subjects, the beacon, the frame around a route's batch).

Contract: pure functions, no I/O.  Subjects live under ``mc0.cl.`` (the NATS
user the brokers share is allowed ``mc0.>``; nobody else should be):

- ``mc0.cl.hello``: every broker's beacon, every ``hello_ms``: who it is
  (name, epoch) — discovery and liveness in one;
- ``mc0.cl.to.NAME``: the route traffic to broker NAME (batched-wire blobs
  of records, each NATS message below the server's ``max_payload``);
- ``mc0.cl.reply.NAME.>``: every reply subject broker NAME waits on
  (nats-py's ``inbox_prefix``: JetStream's deliveries to its local copies,
  pulls, letter reads, PubAcks, API answers), so none of them is under
  ``_INBOX.>``, which any NATS user doing request/reply may read and write.

A route message is ``from_len:u8 from epoch:u64 blob``: the sender's name and
epoch travel inside the payload (cheaper than NATS headers through nats-py).
An epoch is drawn at random when a broker starts: a beacon or message with a
new epoch from a known name means that broker restarted (its session is
replaced).  Broker names are 1-64 bytes of letters, digits, ``-`` and ``_``
(they are a NATS subject token).

NATS refuses a message over its ``max_payload`` (1 MiB by default), and a
route's blob may be bigger (a broker's whole state, a record up to
``max_message_bytes``).  ``route_messages`` splits a blob at record
boundaries into whole route messages that fit, and carries a record too big
for one in *chunks*: ``0x80|from_len:u8 from epoch:u64 total:u32 offset:u32
data``, ``total`` the record's bytes (its size and code included), ``offset``
where ``data`` goes in it.  A sender's chunks of one record go out one after
another on its one NATS connection, so a receiver puts them together with at
most one record under way per sender; a chunk that does not continue it
(another offset, another total, a new record, a whole message) means the
record under way was lost.  (A broker of an older wire refuses a chunk as a
malformed route message.)
"""

from __future__ import annotations

import json
import re
import struct
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ConfigError, ProtocolError
from . import batch

SUBJECT_PREFIX = "mc0.cl"
HELLO_SUBJECT = f"{SUBJECT_PREFIX}.hello"
REPLY_PREFIX = f"{SUBJECT_PREFIX}.reply"  # (mc0 journal copy's, and any client of the brokers' NATS user)
MAX_NAME_BYTES = 64
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_EPOCH = struct.Struct("!Q")
_CHUNK = struct.Struct("!QII")  # epoch, total, offset
CHUNK_FLAG = 0x80  # on the first byte (the name's length): a chunk of a record, not a whole message
MAX_CHUNKED_BYTES = (1 << 32) - 1  # what total:u32 can say
_RECORD_HEAD = 5  # a batch record's size:u32 code:u8
WIRE_VERSION = 1


def is_name(name: str) -> bool:
    """``name`` is a broker name (1-64 letters, digits, ``-`` or ``_``)."""
    return _NAME.fullmatch(name) is not None


def check_name(name: str, where: str = "cluster.name") -> str:
    """A broker name usable as a subject token (ConfigError naming ``where`` otherwise)."""
    if not is_name(name):
        raise ConfigError(where, f"1 to {MAX_NAME_BYTES} letters, digits, '-' or '_', got {name!r}")
    return name


# A queue-group copy one broker chose another for and that one could not place goes back with
# REFUSED (and on to another with TRIED): the brokers that could not place it, as comma-separated
# broker names, each once (at most one per broker of a cluster).
MAX_BROKER_LIST = 256


def broker_list(names: tuple[str, ...] | list[str]) -> bytes:
    """The TRIED / REFUSED value naming ``names`` (broker names, in order)."""
    return ",".join(names).encode()


def parse_broker_list(text: str) -> tuple[str, ...] | None:
    """The broker names of a TRIED / REFUSED value (each once, in order); None if malformed."""
    names = tuple(dict.fromkeys(text.split(",")))
    if len(names) > MAX_BROKER_LIST or not all(_NAME.fullmatch(n) for n in names):
        return None
    return names


def check_url(url: str, where: str = "cluster.nats") -> str:
    """A NATS server URL (``nats://[user:pass@]host:port`` or ``tls://...``); ConfigError otherwise."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("nats", "tls") or not parts.hostname or port is None:
        shown = urllib.parse.urlunsplit((parts.scheme, parts.hostname or "", "", "", "")) if parts.password else url
        raise ConfigError(where, f"not a NATS URL (nats://user:password@host:4222): {shown!r}")
    return url


def derived_name(host: str, endpoint: str) -> str:
    """The default broker name: the host and the port of the first bound endpoint (``web1-61616``)."""
    port = endpoint.rpartition(":")[2]
    base = re.sub(r"[^A-Za-z0-9_-]", "-", host.split(".")[0])[: MAX_NAME_BYTES - 8] or "mc0"
    return f"{base}-{port}" if port.isdigit() else base


def inbox(name: str) -> str:
    """The subject a broker receives its route traffic on."""
    return f"{SUBJECT_PREFIX}.to.{name}"


def reply_prefix(name: str) -> str:
    """nats-py's ``inbox_prefix`` for broker ``name``: its reply subjects are ``mc0.cl.reply.NAME.<nuid>``."""
    return f"{REPLY_PREFIX}.{name}"


def hello(name: str, epoch: int) -> bytes:
    return json.dumps({"v": WIRE_VERSION, "name": name, "epoch": epoch}, separators=(",", ":")).encode()


def parse_hello(data: bytes) -> tuple[str, int] | None:
    """(name, epoch) of a beacon, None if it is not one this broker understands."""
    try:
        beacon = json.loads(data)
        name, epoch, version = beacon["name"], beacon["epoch"], beacon["v"]
    except (ValueError, TypeError, KeyError):
        return None
    if version != WIRE_VERSION or not isinstance(name, str) or not _NAME.fullmatch(name):
        return None
    if not isinstance(epoch, int) or not 0 <= epoch < 1 << 64:
        return None
    return name, epoch


def route_message(sender: str, epoch: int, blob: bytes) -> bytes:
    head = sender.encode()
    return bytes((len(head),)) + head + _EPOCH.pack(epoch) + blob


def parse_route_message(data: bytes) -> tuple[str, int, bytes] | None:
    """(sender, epoch, blob) of a route message, None if malformed."""
    if not data:
        return None
    size = data[0]
    end = 1 + size + _EPOCH.size
    if size == 0 or size > MAX_NAME_BYTES or len(data) < end:
        return None
    try:
        sender = data[1 : 1 + size].decode("ascii")
    except UnicodeDecodeError:
        return None
    if not _NAME.fullmatch(sender):
        return None
    (epoch,) = _EPOCH.unpack_from(data, 1 + size)
    return sender, epoch, data[end:]


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of one record too big for a NATS message: ``data`` goes at ``offset`` of its ``total`` bytes."""

    sender: str
    epoch: int
    total: int
    offset: int
    data: bytes


def is_chunk(data: bytes) -> bool:
    return bool(data) and data[0] & CHUNK_FLAG != 0


def head_bytes(sender: str) -> int:
    """The bytes a whole route message from ``sender`` adds to its blob."""
    return 1 + len(sender) + _EPOCH.size


def chunk_head_bytes(sender: str) -> int:
    """The bytes a chunk from ``sender`` adds to its data."""
    return 1 + len(sender) + _CHUNK.size


def chunk_message(sender: str, epoch: int, total: int, offset: int, data: bytes | memoryview) -> bytes:
    head = sender.encode()
    return bytes((CHUNK_FLAG | len(head),)) + head + _CHUNK.pack(epoch, total, offset) + bytes(data)


def parse_chunk(data: bytes) -> Chunk | None:
    """The chunk ``data`` is, None if malformed (its data must fit its total at its offset)."""
    if not is_chunk(data):
        return None
    size = data[0] & ~CHUNK_FLAG
    end = 1 + size + _CHUNK.size
    if size == 0 or size > MAX_NAME_BYTES or len(data) < end:
        return None
    try:
        sender = data[1 : 1 + size].decode("ascii")
    except UnicodeDecodeError:
        return None
    if not _NAME.fullmatch(sender):
        return None
    epoch, total, offset = _CHUNK.unpack_from(data, 1 + size)
    piece = data[end:]
    if not piece or offset + len(piece) > total:
        return None
    return Chunk(sender, epoch, total, offset, piece)


def route_messages(sender: str, epoch: int, blob: bytes, max_payload: int) -> Iterator[bytes]:
    """The NATS messages that carry ``blob`` (records) from ``sender``, in order, each at most
    ``max_payload`` bytes: whole route messages of as many whole records as fit, and a record too
    big for one in chunks.  (A blob that stops splitting into records is sent on as it is from
    there: chunked if it must be; the receiver refuses its records as it would have anyway.)"""
    room = max_payload - head_bytes(sender)
    if len(blob) <= room:
        yield route_message(sender, epoch, blob)
        return
    view = memoryview(blob)
    start = end = 0  # the records [start, end) wait to go as one whole message
    damaged = False
    try:
        for _code, body, stop in batch.records(blob):
            record = body - _RECORD_HEAD
            if stop - record > room:  # too big for a message of its own: chunked
                if end > start:
                    yield route_message(sender, epoch, bytes(view[start:end]))
                yield from _chunks(sender, epoch, view[record:stop], max_payload)
                start = end = stop
            elif stop - start > room:  # (then start < record == end: the records before it go)
                yield route_message(sender, epoch, bytes(view[start:end]))
                start, end = record, stop
            else:
                end = stop
    except ProtocolError:
        damaged = True
    if end > start:
        yield route_message(sender, epoch, bytes(view[start:end]))
    if damaged and end < len(blob):
        rest = view[end:]
        if len(rest) <= room:
            yield route_message(sender, epoch, bytes(rest))
        else:
            yield from _chunks(sender, epoch, rest, max_payload)


def _chunks(sender: str, epoch: int, piece: memoryview, max_payload: int) -> Iterator[bytes]:
    step = max_payload - chunk_head_bytes(sender)
    if len(piece) > MAX_CHUNKED_BYTES or step < 1:
        raise ValueError(f"{len(piece)} bytes cannot be chunked into messages of {max_payload}")
    for offset in range(0, len(piece), step):
        yield chunk_message(sender, epoch, len(piece), offset, piece[offset : offset + step])
