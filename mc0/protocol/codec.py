"""Frames <-> :class:`Command`: the decoder every received message goes through, and its helpers.

Contract: ``decode(frames, sender=...)`` checks, in order, frame count, byte
total, verb, headers and the verb's grammar, and returns a :class:`Command`
or raises ``ProtocolError(code, reason, request_id)``; numbers are parsed
by ``decimal`` (bounded ASCII digits only).  Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..errors import ProtocolError, quoted, wire_text
from .model import (
    DEFAULT_LIMITS,
    GRAMMAR,
    USER_HEADER_PREFIX,
    WORKER_CODES,
    Header,
    Limits,
    Payload,
    Side,
    Status,
    Verb,
)

_VERBS: dict[bytes, Verb] = {v.value.encode(): v for v in Verb}
_HEADERS: dict[bytes, Header] = {h.value.encode(): h for h in Header}
_USER_PREFIX_B = USER_HEADER_PREFIX.encode()


class Command(NamedTuple):
    """One decoded message: verb, headers (reserved and ``X-``), positional frames."""

    verb: Verb
    headers: dict[str, str]
    payload: Sequence[bytes]

    @property
    def id(self) -> str | None:
        return self.headers.get(Header.ID)

    def user_headers(self) -> dict[str, str]:
        """The ``X-`` headers (the one place they are told apart from reserved ones)."""
        return {k: v for k, v in self.headers.items() if k.startswith(USER_HEADER_PREFIX)}


def find_id(frames: Sequence[bytes], max_headers: int) -> str | None:
    """Best-effort read of the ID header without validating anything else.

    Used so that a command rejected before parsing (too large, bad verb) is
    still answered with its ID; bounded by ``max_headers`` pairs.
    """
    i = 1
    end = min(len(frames), 1 + 2 * max_headers)
    while i + 1 < end and frames[i]:
        if frames[i] == b"ID":
            try:
                return bytes(frames[i + 1]).decode("utf-8")
            except UnicodeDecodeError:
                return None
        i += 2
    return None


def decode(frames: Sequence[bytes], *, sender: Side, limits: Limits = DEFAULT_LIMITS) -> Command:
    """Frames -> Command, or ProtocolError(code, reason, request_id).

    Order: frame count, byte total, verb, headers, grammar.  Topic and pattern
    contents are validated by the receiver (it needs their tokens).  A
    command refused anywhere carries its ID whenever the frames hold one,
    even after the fault (seed 004: an ID always gets its OK or ERROR).
    """
    try:
        return _decode(frames, sender, limits)
    except ProtocolError as exc:
        if exc.request_id is None and frames:
            request_id = find_id(frames, limits.max_headers)
            if request_id is not None:
                raise ProtocolError(exc.code, exc.reason, request_id) from None
        raise


def _decode(frames: Sequence[bytes], sender: Side, limits: Limits) -> Command:
    if not frames:
        raise ProtocolError(Status.BAD_REQUEST, "empty message")
    if len(frames) > limits.max_frames:
        raise ProtocolError(
            Status.TOO_LARGE,
            f"{len(frames)} frames, the limit is {limits.max_frames}",
            find_id(frames, limits.max_headers),
        )
    total = sum(map(len, frames))
    if total > limits.max_message_bytes:
        raise ProtocolError(
            Status.TOO_LARGE,
            f"{total} bytes, the limit is {limits.max_message_bytes}",
            find_id(frames, limits.max_headers),
        )
    verb = _VERBS.get(bytes(frames[0]))
    if verb is None:
        raise ProtocolError(
            Status.BAD_REQUEST, f"unknown verb {wire_text(frames[0])}", find_id(frames, limits.max_headers)
        )
    grammar = GRAMMAR[sender].get(verb)
    if grammar is None:
        raise ProtocolError(Status.BAD_REQUEST, f"{verb} is not sent by a {sender.value}")
    headers: dict[str, str] = {}
    n = len(frames)
    i = 1
    request_id: str | None = None
    while i < n:
        key_frame = frames[i]
        if not key_frame:  # start of the positional part
            i += 1
            break
        if i + 1 >= n:
            raise ProtocolError(Status.BAD_REQUEST, f"header {wire_text(key_frame)} has no value", request_id)
        if len(headers) >= limits.max_headers:
            raise ProtocolError(Status.TOO_LARGE, f"more than {limits.max_headers} headers", request_id)
        key_bytes = bytes(key_frame)
        reserved = _HEADERS.get(key_bytes)
        if reserved is not None:
            key: str = reserved
            if reserved not in grammar.required and reserved not in grammar.optional:
                raise ProtocolError(Status.BAD_REQUEST, f"{verb} does not take header {key}", request_id)
        elif key_bytes.startswith(_USER_PREFIX_B) and key_bytes.isascii() and len(key_bytes) > 2:
            if not grammar.user_headers:
                raise ProtocolError(Status.BAD_REQUEST, f"{verb} does not take user headers", request_id)
            key = key_bytes.decode("ascii")
        else:
            raise ProtocolError(Status.BAD_REQUEST, f"unknown header {wire_text(key_frame)}", request_id)
        if key in headers:
            raise ProtocolError(Status.BAD_REQUEST, f"header {key} repeated", request_id)
        try:
            value = bytes(frames[i + 1]).decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(Status.BAD_REQUEST, f"header {key} is not UTF-8", request_id) from None
        headers[key] = value
        if reserved is Header.ID:
            request_id = value
        i += 2
    else:
        i = n
    payload = frames[i:]
    for needed in grammar.required:
        if needed not in headers:
            raise ProtocolError(Status.BAD_REQUEST, f"{verb} needs header {needed}", request_id)
    if payload:
        if grammar.payload is Payload.NONE:
            raise ProtocolError(Status.BAD_REQUEST, f"{verb} takes no positional frames", request_id)
    elif grammar.payload is Payload.REQUIRED:
        raise ProtocolError(Status.BAD_REQUEST, f"{verb} needs positional frames after an empty frame", request_id)
    return Command(verb, headers, payload)


MAX_DECIMAL_DIGITS = 18  # every number on the wire fits in 63 bits


def decimal(text: str, max_digits: int = MAX_DECIMAL_DIGITS) -> int | None:
    """``text`` as a non-negative decimal integer of ASCII digits, or None.

    Bounded on purpose: ``str.isdigit`` accepts Unicode digits ("²") that
    ``int`` refuses, and ``int`` refuses strings over 4,300 digits; either
    would raise where a peer's bad number must be an answer.
    """
    if not text or len(text) > max_digits or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def parse_int(command: Command, header: Header, *, minimum: int = 0) -> int:
    """A header's value as a decimal integer >= minimum, else ProtocolError 400."""
    text = command.headers[header]
    parsed = decimal(text)
    if parsed is None:
        raise ProtocolError(
            Status.BAD_REQUEST, f"{header} must be a decimal integer, got {quoted(text, 20)}", command.id
        )
    value = parsed
    if value < minimum:
        raise ProtocolError(Status.BAD_REQUEST, f"{header} must be at least {minimum}, got {value}", command.id)
    return value


IN_BAND_ERROR = b"ERROR"  # first body frame of an error for a dialect with no error reply (MDP, seed 000, DCP, eMQP)


def in_band_error(code: int, reason: str) -> list[bytes]:
    """An error as the body of a final reply, for dialects without an error reply: ERROR, code, reason."""
    return [IN_BAND_ERROR, str(int(code)).encode(), reason.encode()]


def in_band_body(body: Sequence[bytes]) -> Sequence[bytes]:
    """A worker's reply body for a client whose errors arrive in-band (``in_band_error``).

    A body shaped like one (three frames: ERROR, a three-digit code, a reason) whose code is not an
    application's (``WORKER_CODES``) is shown as the broker shows an mc0 worker's ERROR with that
    code: 500 ``[worker sent code ...]``.  So 401, 499, 502, 503, 504, 505 and 507 in-band always
    come from the broker, never from a worker speaking for it.
    """
    if len(body) != 3 or body[0] != IN_BAND_ERROR:
        return body
    try:
        code_text = bytes(body[1]).decode("ascii")
    except UnicodeDecodeError:
        return body
    code = decimal(code_text, 3)
    if code is None or len(code_text) != 3 or code in WORKER_CODES:
        return body
    reason = bytes(body[2]).decode("utf-8", "replace")
    return in_band_error(*worker_error(code_text, reason))


def worker_error(code_text: str, reason: str) -> tuple[int, str]:
    """A worker's ERROR CODE and MESSAGE -> what its caller gets (see ``WORKER_CODES``)."""
    code = decimal(code_text, 3)
    if code in WORKER_CODES:
        return code, reason
    return Status.HANDLER_FAILED, f"[worker sent code {quoted(code_text, 8)}] {reason}"
