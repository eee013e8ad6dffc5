"""Bodies the broker itself reads or writes: built-in services' JSON requests (bounded in size
and nesting before a parser sees them) and ``mc0.journal`` fetch pages, in two encodings: the JSON
page every client reads, and the columns page (``columns/1``) a fetch asks for, built column by
column so a reader makes Arrow arrays from its buffers (validated whole by ``parse_columns_page``)."""

from __future__ import annotations

import functools
import json
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

from ..errors import ProtocolError
from ..message import Record
from .model import Status

MAX_JSON_BYTES = 64 * 1024
MAX_JSON_DEPTH = 16


def json_body(text: str, request_id: str | None) -> object:
    """A built-in service's JSON body, or ProtocolError (413 too large, 400 malformed or too deep)."""
    if len(text) > MAX_JSON_BYTES:
        raise ProtocolError(Status.TOO_LARGE, f"body of {len(text)} bytes, the limit is {MAX_JSON_BYTES}", request_id)
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _json_depth(text) > MAX_JSON_DEPTH:
        raise ProtocolError(Status.BAD_REQUEST, f"body nests deeper than {MAX_JSON_DEPTH}", request_id)
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise ProtocolError(Status.BAD_REQUEST, "body must be JSON", request_id) from None


def _json_depth(text: str) -> int:
    """Deepest nesting of [ and { outside strings (the slow path, for bodies with many brackets)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def journal_page(records: Sequence[Record]) -> list[bytes]:
    """A fetch page, two frames: JSON metadata of each record (``parts`` = its
    body frames' lengths), then every record's body frames concatenated."""
    meta = [
        {
            "seq": r.seq,
            "ts": r.ts,
            "topic": r.topic,
            "sender": r.sender,
            "headers": r.headers,
            "parts": [len(p) for p in r.parts],
        }
        for r in records
    ]
    return [json.dumps(meta, separators=(",", ":")).encode(), b"".join(p for r in records for p in r.parts)]


def parse_journal_page(frames: Sequence[bytes]) -> list[Record]:
    """The inverse of ``journal_page`` (clients use it); ValueError if malformed."""
    try:
        meta = json.loads(bytes(frames[0]))
        blob = memoryview(bytes(frames[1])) if len(frames) > 1 else memoryview(b"")
        records = []
        pos = 0
        for m in meta:
            parts = []
            for n in m["parts"]:
                parts.append(bytes(blob[pos : pos + n]))
                pos += n
            records.append(
                Record(int(m["seq"]), float(m["ts"]), m["topic"], m["sender"], dict(m["headers"]), tuple(parts))
            )
    except (KeyError, TypeError, IndexError, AttributeError, ValueError, RecursionError) as exc:
        raise ValueError(f"malformed journal page: {exc}") from None
    if pos != len(blob):
        raise ValueError("malformed journal page: body length mismatch")
    return records


# ---------------------------------------------------------------- columns pages (fetch "page": "columns/1")

PAGE_JSON = "json"
PAGE_COLUMNS = "columns/1"
PAGE_FORMATS = (PAGE_JSON, PAGE_COLUMNS)
COLUMNS_MAGIC = b"mc0c"
COLUMNS_VERSION = 1
# magic, version, reserved, records, header entries, body parts, reserved, next_seq
_COLUMNS_HEAD = struct.Struct("<4sHHIIIIQ")
_OFFSET_LIMIT = (1 << 31) - 1  # offsets are int32 (Arrow's string/binary layout)
_LITTLE = sys.byteorder == "little"


class PageColumns(NamedTuple):
    """A page's records column by column, as the broker builds it (text as UTF-8 bytes).

    ``header_counts[i]`` / ``part_counts[i]``: how many of ``header_keys`` /
    ``parts`` belong to record i, in order.
    """

    seqs: list[int]
    tss: list[float]
    topics: list[bytes]
    senders: list[bytes]
    header_counts: list[int]
    header_keys: list[bytes]
    header_values: list[bytes]
    part_counts: list[int]
    parts: list[bytes]


def page_columns(records: Sequence[Record]) -> PageColumns:
    """Records as columns (what a store without a faster path hands ``columns_page``)."""
    keys: list[bytes] = []
    values: list[bytes] = []
    parts: list[bytes] = []
    for r in records:
        for k, v in r.headers.items():
            keys.append(k.encode())
            values.append(v.encode())
        parts += r.parts
    return PageColumns(
        [r.seq for r in records],
        [r.ts for r in records],
        [r.topic.encode() for r in records],
        [r.sender.encode() for r in records],
        [len(r.headers) for r in records],
        keys,
        values,
        [len(r.parts) for r in records],
        parts,
    )


def _fixed(typecode: str, values: Iterable[int] | Iterable[float]) -> bytes:
    """``values`` as little-endian ``q`` (i64), ``d`` (f64) or ``i`` (i32): one ``struct.pack`` of the
    list (about half what an ``array`` built from an iterator costs, measured: 30 against 55-100 ns
    an element, the bulk of a columns page's build)."""
    items = values if isinstance(values, list) else list(values)
    return struct.pack(f"<{len(items)}{typecode}", *items)


def _pad(size: int) -> bytes:
    return b"\0" * (-size % 8)


def columns_page(columns: PageColumns, next_seq: int) -> bytes:
    """One fetch page, one frame, column by column (docs/PROTOCOL.md, "Columns pages").

    Layout (little endian): a 32-byte head (``mc0c``, version 1, 0, records n,
    header entries h, body parts p, 0, next_seq: where the fetch continues),
    then these sections, each zero-padded to a multiple of 8 bytes: seq i64[n],
    ts f64[n]; topic offsets i32[n+1], topic bytes; sender offsets i32[n+1],
    sender bytes; header index i32[n+1] (record i's entries are
    ``index[i]:index[i+1]``), key offsets i32[h+1], key bytes, value offsets
    i32[h+1], value bytes; part index i32[n+1], part offsets i32[p+1], body
    bytes (a record's parts are adjacent: its body is one slice).  Offsets
    start at 0 and end at their data's length: Arrow's string/binary layout,
    so a reader builds its arrays from the buffers without a per-record step.
    """
    n = len(columns.seqs)
    h = len(columns.header_keys)
    p = len(columns.parts)
    chunks: list[bytes] = [_COLUMNS_HEAD.pack(COLUMNS_MAGIC, COLUMNS_VERSION, 0, n, h, p, 0, next_seq)]

    def section(data: bytes) -> None:
        chunks.append(data)
        chunks.append(_pad(len(data)))

    def strings(values: list[bytes]) -> None:
        offsets = _fixed("i", accumulate(map(len, values), initial=0))
        section(offsets)
        section(b"".join(values))

    section(_fixed("q", columns.seqs))
    section(_fixed("d", columns.tss))
    strings(columns.topics)
    strings(columns.senders)
    section(_fixed("i", accumulate(columns.header_counts, initial=0)) if h else bytes(4 * (n + 1)))
    strings(columns.header_keys)
    strings(columns.header_values)
    one_each = p == n and columns.part_counts.count(1) == n  # the common page: one body frame per record
    section(_counting(n) if one_each else _fixed("i", accumulate(columns.part_counts, initial=0)))
    strings(columns.parts)
    return b"".join(chunks)


@functools.lru_cache(maxsize=8)
def _counting(n: int) -> bytes:
    """0, 1, ..., n as the page's int32s: the part index of records with one body frame each."""
    return _fixed("i", range(n + 1))


@dataclass(frozen=True, slots=True)
class ColumnsPage:
    """A validated columns page: its sections as memoryviews of the frame (no copies).

    Made by ``parse_columns_page``, which checked every length, offset and
    index, so a reader may build arrays straight from these buffers (Arrow
    does not check them itself); text is checked as UTF-8 when it is decoded
    (``records``) or by the Arrow reader's validation.
    """

    count: int
    next_seq: int  # where the fetch continues after this page
    seqs: memoryview  # i64[count]
    tss: memoryview  # f64[count], seconds
    topic_offsets: memoryview
    topics: memoryview
    sender_offsets: memoryview
    senders: memoryview
    header_index: memoryview
    key_offsets: memoryview
    keys: memoryview
    value_offsets: memoryview
    values: memoryview
    part_index: memoryview
    part_offsets: memoryview
    bodies: memoryview

    @property
    def header_count(self) -> int:
        return len(self.key_offsets) // 4 - 1

    @property
    def part_count(self) -> int:
        return len(self.part_offsets) // 4 - 1

    @property
    def one_part_each(self) -> bool:
        """Every record has one body frame (the part offsets are then the bodies' offsets)."""
        return self.part_count == self.count and self.part_index == _counting(self.count)

    def __len__(self) -> int:
        return self.count

    def seq_list(self) -> list[int]:
        return _ints("q", self.seqs)

    def records(self) -> list[Record]:
        """The page as Records (UTF-8 checked here: ValueError if a text is not)."""
        try:
            return self._records()
        except UnicodeDecodeError as exc:
            raise ValueError(f"malformed columns page: {exc}") from None

    def _records(self) -> list[Record]:
        seqs = self.seq_list()
        tss = array("d")
        tss.frombytes(self.tss)
        if not _LITTLE:  # pragma: no cover
            tss.byteswap()
        topics = _texts(self.topic_offsets, self.topics)
        senders = _texts(self.sender_offsets, self.senders)
        header_index = _ints("i", self.header_index)
        keys = _texts(self.key_offsets, self.keys)
        values = _texts(self.value_offsets, self.values)
        part_index = _ints("i", self.part_index)
        part_offsets = _ints("i", self.part_offsets)
        bodies = self.bodies
        out = []
        for i in range(self.count):
            h0, h1 = header_index[i], header_index[i + 1]
            headers = dict(zip(keys[h0:h1], values[h0:h1], strict=True)) if h1 > h0 else {}
            p0, p1 = part_index[i], part_index[i + 1]
            parts = tuple(bytes(bodies[part_offsets[k] : part_offsets[k + 1]]) for k in range(p0, p1))
            out.append(Record(seqs[i], tss[i], topics[i], senders[i], headers, parts))
        return out


def _ints(typecode: str, view: memoryview) -> list[int]:
    data = array(typecode)
    data.frombytes(view)
    if not _LITTLE:  # pragma: no cover
        data.byteswap()
    return data.tolist()


def _texts(offsets: memoryview, data: memoryview) -> list[str]:
    bounds = _ints("i", offsets)
    raw = bytes(data)
    return [raw[a:b].decode() for a, b in zip(bounds, bounds[1:], strict=False)]


def parse_columns_page(frame: bytes | memoryview) -> ColumnsPage:
    """Check a columns page whole and return its sections; ValueError (saying what is wrong) if it is malformed.

    Checked: the head, every section's length against the frame, zero
    padding, that offsets start at 0, never decrease and end at their data's
    length, that the header and part indexes end at h and p, that seqs
    increase and stay below next_seq, and that nothing follows the last section.
    """
    view = memoryview(frame).cast("B")
    if len(view) >= len(COLUMNS_MAGIC) and view[: len(COLUMNS_MAGIC)] != COLUMNS_MAGIC:
        raise ValueError(f"malformed columns page: starts {bytes(view[:4])!r}, not {COLUMNS_MAGIC!r}")
    if len(view) < _COLUMNS_HEAD.size:
        raise ValueError(f"malformed columns page: {len(view)} bytes, shorter than its {_COLUMNS_HEAD.size}-byte head")
    _, version, reserved, n, h, p, reserved2, next_seq = _COLUMNS_HEAD.unpack_from(view)
    if version != COLUMNS_VERSION:
        raise ValueError(f"columns page version {version}: this client reads version {COLUMNS_VERSION}")
    if reserved or reserved2:
        raise ValueError("malformed columns page: reserved head fields are not 0")
    position = _COLUMNS_HEAD.size

    def section(name: str, size: int) -> memoryview:
        nonlocal position
        start = position
        end = start + size
        padded = end + (-size % 8)
        if padded > len(view):
            raise ValueError(f"malformed columns page: {name} needs {size} bytes at {start}, the page has {len(view)}")
        if any(view[end:padded]):
            raise ValueError(f"malformed columns page: padding after {name} is not zero")
        position = padded
        return view[start:end]

    def offsets(name: str, count: int, end: int | None = None) -> tuple[memoryview, int]:
        """count + 1 int32 offsets from 0, never decreasing; their last value (or ``end``, which it must be)."""
        raw = section(name, 4 * (count + 1))
        values = _ints("i", raw)
        if values[0] != 0 or values != sorted(values):
            raise ValueError(f"malformed columns page: {name} must start at 0 and never decrease")
        if end is not None and values[-1] != end:
            raise ValueError(f"malformed columns page: {name} ends at {values[-1]}, not {end}")
        return raw, values[-1]

    def strings(name: str, count: int) -> tuple[memoryview, memoryview]:
        raw, size = offsets(f"{name} offsets", count)
        return raw, section(f"{name} bytes", size)

    seqs = section("seqs", 8 * n)
    values = _ints("q", seqs)
    if n and (values != sorted(set(values)) or values[0] < 0 or values[-1] >= next_seq):
        raise ValueError("malformed columns page: seqs must increase and stay below next_seq")
    tss = section("timestamps", 8 * n)
    topic_offsets, topics = strings("topic", n)
    sender_offsets, senders = strings("sender", n)
    header_index, _ = offsets("header index", n, h)
    key_offsets, keys = strings("header key", h)
    value_offsets, header_values = strings("header value", h)
    part_index, _ = offsets("part index", n, p)
    part_offsets, bodies = strings("body", p)
    if position != len(view):
        raise ValueError(f"malformed columns page: {len(view) - position} bytes after the last section")
    return ColumnsPage(
        n,
        next_seq,
        seqs,
        tss,
        topic_offsets,
        topics,
        sender_offsets,
        senders,
        header_index,
        key_offsets,
        keys,
        value_offsets,
        header_values,
        part_index,
        part_offsets,
        bodies,
    )


def is_columns_page(frame: bytes | memoryview) -> bool:
    """A columns page (an old broker answers a ``columns/1`` fetch with JSON pages, which start with ``[``)."""
    return bytes(frame[:4]) == COLUMNS_MAGIC
