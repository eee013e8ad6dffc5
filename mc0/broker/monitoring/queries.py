"""What each page of the monitoring listener may be asked: every query parameter of every page, and
its parser, in one table (``PAGES``).

Contract: ``parse_query(path, raw)`` reads a request's query string (after ``?``) for the page
``path`` (one of ``PAGES``) and returns a value for each of that page's parameters (its default
when absent or empty), or raises :class:`BadQuery` with one line naming the parameter and what it
must be: a parameter the page does not take, one given twice, a number that is not ASCII digits
within its bounds (``str.isdigit`` also accepts ``'²'``, which ``int`` refuses), a word that is not
one of its choices, a filter too long or not printable, a ``limit`` past what the rest of the query
allows (``/connz?subs=1``: at most ``SUBS_MAX_LIMIT``).  A paged page's ``limit`` comes back settled
(its default when not given).  A new parameter joins a page by a row in ``PAGES``; its value reaches
the page's renderer (mc0.broker.monitoring.snapshot: ``connz``, ``subsz``, ``consumerz``) already
parsed.  Pure: no sockets, no clock.
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
CONNZ_STATES = ("open", "closed", "all")
SUBSZ_SORTS = ("pattern", "subscribers")
# /consumerz rows' fields a ``sort`` may name: numbers descending, text ascending (default: journal then name).
CONSUMERZ_NUMBERS = ("num_pending", "num_ack_pending", "ack_floor", "redelivered", "dead_lettered", "delivered")
CONSUMERZ_TEXTS = ("name", "journal", "owner", "store")
ORDERS = ("asc", "desc")  # ``order``: "" (not given) is the sort field's own direction
PAGE_DEFAULT_LIMIT = 1024  # rows of a paged page when ``limit`` is not given (nats-server's /connz default)
PAGE_MAX_LIMIT = 10_000  # rows of a paged page at most
SUBS_MAX_LIMIT = 1_000  # /connz?subs=1: connections at most (each with every pattern it holds)
MAX_OFFSET = 10**12 - 1  # (12 digits)
FILTER_MAX = 200  # characters of a ``filter``
MAX_AGE_MOST = 10_000  # ms: the oldest snapshot ``max_age_ms`` may accept
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
    default: Value | None  # None: settled by the page's other parameters (``limit``)


def number(name: str, default: int | None, most: int) -> Parameter:
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


def text(name: str, most: int) -> Parameter:
    """Free text of at most ``most`` printable characters (a filter: matched, never parsed further)."""

    def parse(value: str) -> str:
        if len(value) > most or not value.isprintable():
            raise ValueError(value)
        return value

    return Parameter(name, f"at most {most} printable characters", parse, "")


FLAG_ON, FLAG_OFF = ("1", "true", "detail"), ("0", "false")


def flag(name: str) -> Parameter:
    """On (``1``, ``true``, ``detail``) or off (``0``, ``false``)."""

    def parse(text: str) -> bool:
        if text not in FLAG_ON and text not in FLAG_OFF:
            raise ValueError(text)
        return text in FLAG_ON

    return Parameter(name, f"one of {', '.join(FLAG_ON + FLAG_OFF)}", parse, False)


# Every page takes ``max_age_ms``: a snapshot taken at most that long before the request will do (default 0:
# one taken after the request arrived).  The console asks so for a sort, a page or a filter of what it shows.
MAX_AGE = number("max_age_ms", 0, MAX_AGE_MOST)
LIMIT = number("limit", None, PAGE_MAX_LIMIT)  # (settled by ``_settle_limit``)
OFFSET = number("offset", 0, MAX_OFFSET)
FILTER = text("filter", FILTER_MAX)
ORDER = choice("order", ORDERS, "")

# Every page and the parameters it takes (docs/OPERATIONS.md, "The JSON pages").  "" for a ``sort``:
# the page's own order (/connz: by ``name``, or ``closed_at`` when ``state=closed``; /consumerz: by
# journal then name).
PAGES: dict[str, tuple[Parameter, ...]] = {
    "/": (),
    "/console.css": (),
    "/console.js": (),
    "/healthz": (MAX_AGE,),
    "/varz": (MAX_AGE,),
    "/connz": (
        choice("state", CONNZ_STATES, "open"),
        choice("sort", CONNZ_SORTS, ""),
        ORDER,
        FILTER,
        LIMIT,
        OFFSET,
        flag("subs"),
        MAX_AGE,
    ),
    "/subsz": (choice("sort", SUBSZ_SORTS, "pattern"), ORDER, FILTER, LIMIT, OFFSET, MAX_AGE),
    "/servicez": (MAX_AGE,),
    "/consumerz": (choice("sort", (*CONSUMERZ_NUMBERS, *CONSUMERZ_TEXTS), ""), ORDER, FILTER, LIMIT, OFFSET, MAX_AGE),
    "/journalz": (MAX_AGE,),
    "/mailboxz": (MAX_AGE,),
    "/metrics": (MAX_AGE,),
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
    values: dict[str, Value | None] = {}
    for name, parameter in parameters.items():
        value = given.get(name, "")
        if value == "":
            values[name] = parameter.default
            continue
        try:
            values[name] = parameter.parse(value)
        except ValueError:
            raise BadQuery(f"{name} must be {parameter.promise}, got {shown(value)}") from None
    return _settle_limit(values)


def _settle_limit(values: dict[str, Value | None]) -> dict[str, Value]:
    """A paged page's ``limit``: as given, else ``PAGE_DEFAULT_LIMIT``; with ``subs`` on, at most
    ``SUBS_MAX_LIMIT`` (each row then carries every pattern its connection holds)."""
    if "limit" in values:
        most = SUBS_MAX_LIMIT if values.get("subs") else PAGE_MAX_LIMIT
        limit = values["limit"]
        if limit is None:
            values["limit"] = min(PAGE_DEFAULT_LIMIT, most)
        elif int(limit) > most:
            raise BadQuery(f"limit must be a whole number 0-{most} with subs=1, got {limit}")
    return {name: value for name, value in values.items() if value is not None}
