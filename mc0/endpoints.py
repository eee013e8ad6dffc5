"""Endpoints: checked before any socket sees them, and why a connection did not come up.

Contract: ``check_endpoint(text)`` returns the endpoint unchanged when
ZeroMQ can use it (``tcp://host:port``, ``ipc://path``, ``inproc://name``;
``bind=True`` also allows ``*`` as host or port) and otherwise raises
:class:`mc0.errors.ConfigError` with one line: what is wrong and a good
example.  ``parse_endpoints(text)`` reads one endpoint or a comma-separated
list of them (each checked; an empty entry or one listed twice is refused,
naming it) and ``failover_order(endpoints, lost)`` says where a client goes
after losing a broker: the endpoints after it, round the list, the lost one
last; ``none_answered(outcomes, seconds)`` is the one error for a list none of
whose brokers let the client in, naming each endpoint and what it did.
``diagnose(events, connected_ever)`` turns the socket monitor's
event names seen while connecting into a verdict: ``"refused"`` (TCP
attempts are rejected), ``"unresolvable"`` (libzmq retries without ever
starting a TCP attempt: the host name does not resolve) or ``None`` (no
verdict: connected, or still trying).  ``unreachable_message`` renders a
verdict for people.  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from ipaddress import ip_address

from .errors import AuthFailed, ConfigError, Error, RemoteError, Timeout, Unreachable

EXAMPLE = "tcp://127.0.0.1:61616"
SCHEMES = ("tcp", "ipc", "inproc")
# How long refusals may go on (while connecting) before the client reports them: long enough for
# a broker that is starting, short enough to tell "refused" within about a second.
REFUSED_AFTER = 1.0
LIST_SEPARATOR = ","


def check_endpoint(text: object, *, bind: bool = False, where: str = "endpoint") -> str:
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(where, f"no endpoint given (e.g. {EXAMPLE})")
    endpoint = text.strip()
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        hint = f"tcp://{endpoint}" if ":" in endpoint else EXAMPLE
        raise ConfigError(where, f"{text!r} has no scheme (e.g. {hint})")
    if scheme not in SCHEMES:
        raise ConfigError(where, f"{text!r}: scheme {scheme!r} is not one of {', '.join(SCHEMES)} (e.g. {EXAMPLE})")
    if not rest:
        raise ConfigError(where, f"{text!r} names no address (e.g. {EXAMPLE})")
    if scheme != "tcp":
        return endpoint
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        raise ConfigError(where, f"{text!r} needs host:port (e.g. {EXAMPLE})")
    if not (port.isdigit() and 0 < int(port) <= 65535) and not (bind and port == "*"):
        raise ConfigError(where, f"{text!r}: port {port!r} is not a number 1-65535 (e.g. {EXAMPLE})")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ConfigError(where, f"{text!r}: an IPv6 host goes in brackets (e.g. tcp://[::1]:61616)")
        try:
            ip_address(host[1:-1])
        except ValueError:
            raise ConfigError(where, f"{text!r}: {host} is not an IPv6 address (e.g. tcp://[::1]:61616)") from None
    elif ";" in host:  # libzmq's source-address form (tcp://src;dst:port): pass it on
        return endpoint
    elif host == "*":
        if not bind:
            raise ConfigError(where, f"{text!r}: '*' binds every interface; a client names a host (e.g. {EXAMPLE})")
    elif not all(c.isalnum() or c in "-._" for c in host):
        raise ConfigError(where, f"{text!r}: {host!r} is not a host name or address (e.g. {EXAMPLE})")
    return endpoint


def parse_endpoints(text: object, *, where: str = "endpoint") -> tuple[str, ...]:
    """One endpoint, or a comma-separated list of them (a client fails over between them), checked.

    A single endpoint is ``check_endpoint``'s alone (same errors, same
    result).  In a list every entry is checked and an error names the entry
    (``endpoint entry 2: ...``); an empty entry and an endpoint listed twice
    are refused rather than dropped: either is a typo hiding the broker meant.
    """
    if not isinstance(text, str) or LIST_SEPARATOR not in text:
        return (check_endpoint(text, where=where),)
    entries = text.split(LIST_SEPARATOR)
    checked: list[str] = []
    for number, entry in enumerate(entries, 1):
        if not entry.strip():
            raise ConfigError(where, f"{text!r}: entry {number} is empty (e.g. {EXAMPLE},tcp://127.0.0.1:61617)")
        endpoint = check_endpoint(entry, where=f"{where} entry {number}")
        if endpoint in checked:
            raise ConfigError(where, f"{text!r}: {endpoint} is listed twice")
        checked.append(endpoint)
    return tuple(checked)


def failover_order(endpoints: Sequence[str], lost: str) -> tuple[str, ...]:
    """Where to try after losing ``lost``: the endpoints after it in the list, round to the start,
    ``lost`` itself last (it may be back by then).  Every client of a lost broker that shares the
    list goes to the same next broker."""
    at = list(endpoints).index(lost) + 1 if lost in endpoints else 0
    return (*endpoints[at:], *endpoints[:at])


def diagnose(events: Sequence[str], connected_ever: bool) -> str | None:
    """The verdict on a connection that has not come up, from the monitor's event names."""
    if connected_ever:
        return None
    if "CONNECT_RETRIED" not in events:
        return None
    if "CONNECT_DELAYED" in events:
        return "refused"
    return "unresolvable"


def unreachable_message(endpoint: str, verdict: str) -> str:
    """One line for people: why connecting to ``endpoint`` failed (a verdict of ``diagnose``), and
    what to do about it."""
    scheme, _, rest = endpoint.partition("://")
    if scheme == "ipc":  # no host to resolve: nothing listens at that path (no socket file, or a stale one)
        return f"{endpoint}: no broker listening at {rest} (start one there with `mc0 broker --bind {endpoint}`)"
    if verdict == "refused":
        return f"{endpoint}: connection refused (is a broker running there? start one with `mc0 broker`)"
    host = rest.rpartition(":")[0]
    return f"{endpoint}: cannot resolve host {host!r} (check the name, or give an address: e.g. {EXAMPLE})"


def no_answer_detail(connected_ever: bool) -> str:
    """What a connect timeout means, by whether a TCP connection was ever made."""
    if connected_ever:
        return " (a connection was made: not an mc0 broker, or one too busy to answer)"
    return " (no connection was made: host down, or a firewall drops it)"


def outcome_line(endpoint: str, error: BaseException) -> str:
    """``endpoint: what happened`` (the error's own text, without the endpoint it may start with)."""
    text = str(error)
    for prefix in (f"{endpoint}: ", f"connect to {endpoint}: "):
        text = text.removeprefix(prefix)
    return f"{endpoint}: {text}"


def none_answered(outcomes: Mapping[str, Exception], seconds: float) -> Error:
    """The error for an endpoint list none of whose brokers accepted the client, naming every
    endpoint tried.  Its class is the most telling outcome's: a broker that refused the CONNECT
    (its RemoteError), then refused keys (AuthFailed), then silence (Timeout), else Unreachable."""
    detail = "; ".join(outcome_line(endpoint, error) for endpoint, error in outcomes.items())
    errors = list(outcomes.values())
    for error in errors:
        if isinstance(error, RemoteError):
            return type(error)(error.code, f"no broker accepted the connection: {detail}")
    if any(isinstance(error, AuthFailed) for error in errors):
        return AuthFailed(f"no broker accepted this client's key: {detail}")
    if any(isinstance(error, Timeout) for error in errors):
        return Timeout(f"connect to any of {len(outcomes)} endpoints", seconds, f" ({detail})")
    verdicts = {getattr(error, "verdict", "refused") for error in errors}
    verdict = "unresolvable" if verdicts == {"unresolvable"} else "refused"
    return Unreachable(f"no broker reachable: {detail}", verdict=verdict)
