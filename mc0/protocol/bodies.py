"""Bodies the broker itself reads or writes: built-in services' JSON requests (bounded in size
and nesting before a parser sees them) and ``mc0.journal`` fetch pages."""

from __future__ import annotations

import json
from collections.abc import Sequence

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
