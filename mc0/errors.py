"""The mc0 error hierarchy: one root, data as attributes, a matching builtin.

Contract: every exception mc0 raises is an :class:`Error`.  Each subclass also
inherits the builtin a caller would naturally catch (``Timeout`` is a
``TimeoutError``, ``ConfigError`` a ``ValueError`` ...).  Faults reported by the
broker arrive as :class:`RemoteError` subclasses, one per wire status code; the
mapping from code to class lives in :mod:`mc0.protocol` beside the codes.
This module imports nothing from mc0.
"""

from __future__ import annotations


class Error(Exception):
    """Root of every error mc0 raises."""


class ProtocolError(Error, ValueError):
    """A frame sequence that breaks the grammar (raised by ``protocol.decode``).

    ``code`` is the wire status the broker answers with, ``request_id`` the
    command's ``ID`` when it could be read (so the ERROR can carry it).
    """

    def __init__(self, code: int, reason: str, request_id: str | None = None) -> None:
        super().__init__(f"{code} {reason}")
        self.code = code
        self.reason = reason
        self.request_id = request_id


def wire_text(value: bytes | str, limit: int = 40) -> str:
    """What a peer sent, as an error text (an ``ERROR``'s ``MESSAGE``) shows it: never a Python repr.

    Printable UTF-8 characters as they are; a backslash as two; any other byte (a control
    character, a byte that is not UTF-8) as ``\\xNN``, NN its hex value.  Cut after ``limit``
    characters, with ``...``.  So ``unknown header FOO``, ``unknown verb \\x00ab``.
    """
    if isinstance(value, str):
        value = value[: limit + 1].encode("utf-8", "surrogateescape")
    text = bytes(value[: 4 * limit + 4]).decode("utf-8", "surrogateescape")  # (a character is at most 4 bytes)
    cut = len(text) > limit
    shown: list[str] = []
    for char in text[:limit]:
        if char == "\\":
            shown.append("\\\\")
        elif char.isprintable() and not "\udc80" <= char <= "\udcff":
            shown.append(char)
        else:
            shown.append("".join(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogateescape")))
    return "".join(shown) + ("..." if cut else "")


def quoted(value: bytes | str, limit: int = 40) -> str:
    """``wire_text`` between single quotes: how an error text shows a value the peer sent (``'1e3'``)."""
    return f"'{wire_text(value, limit)}'"


def _one_line(text: str) -> str:
    """``text`` with control characters (a config key or value may hold any) shown as escapes."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ConfigError(Error, ValueError):
    """A bad configuration value; ``where`` names the file and key (its message is one line)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(_one_line(f"{where}: {reason}"))
        self.where = where
        self.reason = reason


class KeyFileError(Error, OSError):
    """A key file that is missing, malformed, of the wrong kind or too readable."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class Timeout(Error, TimeoutError):
    """An operation did not finish within its timeout (``seconds``)."""

    def __init__(self, what: str, seconds: float, detail: str = "") -> None:
        super().__init__(f"{what}: no answer within {seconds:g}s{detail}")
        self.what = what
        self.seconds = seconds


class Unreachable(Error, ConnectionError):
    """The broker cannot be reached: ``verdict`` is ``"refused"`` (nothing listens there) or
    ``"unresolvable"`` (the host name does not resolve); told within about a second."""

    def __init__(self, message: str, *, verdict: str) -> None:
        super().__init__(message)
        self.verdict = verdict


class AuthFailed(Error, PermissionError):
    """The broker refused this client's credentials during the handshake."""


class ClosedError(Error, ConnectionError):
    """The client was closed (locally, or by the broker disconnecting it)."""


class SlowConsumer(Error, BufferError):
    """Messages were dropped because their consumer did not keep up.

    ``where`` is ``"client"`` (a subscription's pending limit was reached:
    the application did not take messages fast enough) or ``"broker"`` (the
    broker's queue for this connection was over its budget and the broker
    evicted it).  ``dropped`` counts what was lost, when known.
    """

    def __init__(self, message: str, *, where: str, dropped: int = 0) -> None:
        super().__init__(message)
        self.where = where
        self.dropped = dropped


class RemoteError(Error):
    """The broker (or a worker) answered ERROR; ``code`` and ``reason`` as sent."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{code} {reason}")
        self.code = code
        self.reason = reason

    def __reduce__(self) -> tuple[type[RemoteError], tuple[int, str]]:
        return (type(self), (self.code, self.reason))


class BadRequest(RemoteError, ValueError):
    """400: the command was malformed or invalid."""


class NotConnected(RemoteError, ConnectionError):
    """401: the broker does not know this peer (no CONNECT, or it restarted)."""


class Forbidden(RemoteError, PermissionError):
    """403: the identity may not do this."""


class TooLarge(RemoteError, ValueError):
    """413: a size limit (frames, bytes, headers, topic) was exceeded."""


class Conflict(RemoteError):
    """409: a request id reused while that request is still outstanding."""


class NotFound(RemoteError, LookupError):
    """404: no such durable consumer (or journal)."""


class Gone(RemoteError, LookupError):
    """410: the journal position asked for was trimmed by retention."""


class StorageFailed(RemoteError, OSError):
    """507: the broker's journal could not write; the message was not acknowledged."""


class OverLimit(RemoteError):
    """429: a count limit was exceeded, or the peer consumed too slowly."""


class Cancelled(RemoteError):
    """499: the request was cancelled by its client."""


class HandlerFailed(RemoteError):
    """500: the worker's handler raised; ``reason`` is its message."""


class WorkerLost(RemoteError, ConnectionError):
    """502: the worker died after replies were forwarded (or attempts ran out)."""


class NoResponders(RemoteError):
    """503: no worker serves the service (answered at once)."""


class DeadlineExceeded(RemoteError, TimeoutError):
    """504: the request's deadline passed before its worker finished."""


class UnsupportedVersion(RemoteError):
    """505: the broker does not speak the requested protocol version."""


class InvalidTopic(Error, ValueError):
    """A topic or pattern that breaks the topic rules.

    ``oversize`` is true when only a size rule (bytes or token count) was
    broken, which the broker answers with 413 rather than 400.
    """

    def __init__(self, topic: str, reason: str, *, oversize: bool = False) -> None:
        super().__init__(f"invalid topic {quoted(topic, 80)}: {reason}")
        self.topic = topic
        self.reason = reason
        self.oversize = oversize
