"""What each page of the monitoring listener may be asked: every query parameter of every page, and
its parser, in one table (``PAGES``).

Contract: ``parse_query(path, raw)`` reads a request's query string (after ``?``) for the page
``path`` (one of ``PAGES``) and returns a value for each of that page's parameters (its default
when absent or empty), or raises :class:`BadQuery` with one line naming the parameter and what it
must be: a parameter the page does not take, one given twice, a number that is not ASCII digits
within its bounds (``str.isdigit`` also accepts ``'²'``, which ``int`` refuses), a word that is not
one of its choices.  A new parameter joins a page by a row in ``PAGES``; its value reaches the page's
renderer already parsed.  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl

Value = str | int | bool

# /connz rows' fields a ``sort`` may name: numbers sort descending (the busiest first), text and
# ``connected_at`` ascending (``closed_at`` descending: the newest close first), as nats-server's.
CONNZ_NUMBERS = (
    "num_subscriptions", "pending_bytes", "idle_s", "delivered", "dropped", "in_flight",
    "msgs_in", "bytes_in", "msgs_out", "bytes_out", "uptime_s",
)  # fmt: skip
CONNZ_TEXTS = ("name", "identity", "dialect", "protocol", "address", "connected_at", "reason")
CONNZ_SORTS = (*CONNZ_NUMBERS, *CONNZ_TEXTS, "closed_at", "subscriptions")  # subscriptions: num_subscriptions
CONNZ_DEFAULT_LIMIT = 1024  # as nats-server's /connz
CONNZ_MAX_LIMIT = 10_000
CONNZ_MAX_OFFSET = 1 << 40
CONNZ_STATES = ("open", "closed", "all")
MAX_PARAMETERS = 32  # a query of more pairs than this is refused whole
SHOWN_CHARS = 20  # of a refused value, quoted in the error


class BadQuery(ValueError):
    """A query a page cannot answer (the HTTP side answers 400 with its text, one line)."""


@dataclass(frozen=True, slots=True)
class Parameter:
    """One query parameter: ``parse`` returns its value or raises ValueError; ``promise`` is what
    the docs promise it is (the error says it)."""

    name: str
    promise: str
    parse: Callable[[str], Value]
    default: Value


def number(name: str, default: int, most: int) -> Parameter:
    """A whole number 0..``most`` written in ASCII digits."""

    def parse(text: str) -> int:
        # (ASCII first: '²'.isdigit() is True and int('²') raises; a bounded length before int(), whose
        # own bound is 4,300 digits)
        if not (text.isascii() and text.isdigit()) or len(text) > len(str(most)) or int(text) > most:
            raise ValueError(text)
        return int(text)

    return Parameter(name, f"a whole number 0-{most} in ASCII digits", parse, default)


def choice(name: str, choices: tuple[str, ...], default: str) -> Parameter:
    """One of ``choices`` (exactly as written)."""

    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(text)
        return text

    return Parameter(name, f"one of {', '.join(choices)}", parse, default)


FLAG_ON, FLAG_OFF = ("1", "true", "detail"), ("0", "false")


def flag(name: str) -> Parameter:
    """On (``1``, ``true``, ``detail``) or off (``0``, ``false``)."""

    def parse(text: str) -> bool:
        if text not in FLAG_ON and text not in FLAG_OFF:
            raise ValueError(text)
        return text in FLAG_ON

    return Parameter(name, f"one of {', '.join(FLAG_ON + FLAG_OFF)}", parse, False)


# Every page and the parameters it takes (docs/OPERATIONS.md, "The JSON pages").  "" for ``sort``:
# by ``name``, or ``closed_at`` when ``state=closed`` (the page decides).
PAGES: dict[str, tuple[Parameter, ...]] = {
    "/": (),
    "/console.css": (),
    "/console.js": (),
    "/healthz": (),
    "/varz": (),
    "/connz": (
        choice("state", CONNZ_STATES, "open"),
        choice("sort", CONNZ_SORTS, ""),
        number("limit", CONNZ_DEFAULT_LIMIT, CONNZ_MAX_LIMIT),
        number("offset", 0, CONNZ_MAX_OFFSET),
        flag("subs"),
    ),
    "/subsz": (),
    "/servicez": (),
    "/consumerz": (),
    "/journalz": (),
    "/mailboxz": (),
    "/metrics": (),
}


def shown(text: str) -> str:
    """A value as an error quotes it: cut, and escaped so that the error stays one line."""
    return repr(text[:SHOWN_CHARS]) + ("..." if len(text) > SHOWN_CHARS else "")


def parse_query(path: str, raw: str) -> dict[str, Value]:
    """``raw`` (the query string) for the page ``path`` -> each of its parameters' values;
    BadQuery (one line, naming the parameter) otherwise."""
    parameters = {p.name: p for p in PAGES[path]}
    try:
        pairs = parse_qsl(raw, keep_blank_values=True, max_num_fields=MAX_PARAMETERS, errors="replace")
    except ValueError:  # (more than max_num_fields)
        raise BadQuery(f"more than {MAX_PARAMETERS} query parameters") from None
    given: dict[str, str] = {}
    for key, text in pairs:
        if key not in parameters:
            takes = ", ".join(parameters) if parameters else "no parameters"
            raise BadQuery(f"{path} takes {takes}; got the parameter {shown(key)}")
        if key in given:
            raise BadQuery(f"{key} is given twice")
        given[key] = text
    values: dict[str, Value] = {}
    for name, parameter in parameters.items():
        text = given.get(name, "")
        if text == "":
            values[name] = parameter.default
            continue
        try:
            values[name] = parameter.parse(text)
        except ValueError:
            raise BadQuery(f"{name} must be {parameter.promise}, got {shown(text)}") from None
    return values
