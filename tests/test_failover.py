"""Endpoint lists and failover (issue 21, the client side): ``"tcp://a:1,tcp://b:2"`` everywhere an
endpoint is accepted; the first broker that answers wins; a broker killed with SIGKILL (or gone
silent) is left for the next one within 2 s, with every SUB (GROUP, FROM), a worker's READY and
the unanswered confirmed publishes (with their MSGID) sent again there.  Real broker processes on
free ports, sync and asyncio APIs, CURVE on and off (the brokers share one keypair)."""

from __future__ import annotations

import socket

import pytest

import mc0
import mc0.aio
from mc0.endpoints import failover_order, none_answered, parse_endpoints
from mc0.errors import ConfigError
from mc0.session import ClientSession, Reconnecting

FAILOVER_BUDGET = 2.0  # seconds: the bound from SIGKILL to the client on another broker
A, B, C = "tcp://127.0.0.1:1001", "tcp://127.0.0.1:1002", "tcp://127.0.0.1:1003"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- lists: tables of literal cases


@pytest.mark.parametrize(
    ("text", "endpoints"),
    [
        (A, (A,)),
        (f"{A},{B}", (A, B)),
        (f" {A} , {B} ,{C}", (A, B, C)),
        (f"ipc:///tmp/mc0.sock,{A}", ("ipc:///tmp/mc0.sock", A)),
        (
            "tcp://[::1]:61616,tcp://broker-2.example.org:61616",
            ("tcp://[::1]:61616", "tcp://broker-2.example.org:61616"),
        ),
    ],
)
def test_parse_endpoints_good(text: str, endpoints: tuple[str, ...]) -> None:
    assert parse_endpoints(text) == endpoints


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (f"{A},", f"endpoint: '{A},': entry 2 is empty"),
        (f",{A}", f"endpoint: ',{A}': entry 1 is empty"),
        (f"{A},,{B}", "entry 2 is empty"),
        (f"{A}, ", "entry 2 is empty"),
        (f"{A},127.0.0.1:1002", "endpoint entry 2: '127.0.0.1:1002' has no scheme (e.g. tcp://127.0.0.1:1002)"),
        (f"{A},http://h:1", "endpoint entry 2: 'http://h:1': scheme 'http' is not one of tcp, ipc, inproc"),
        (f"{A},tcp://*:1", "endpoint entry 2: 'tcp://*:1': '*' binds every interface"),
        (f"tcp://h,{A}", "endpoint entry 1: 'tcp://h' needs host:port"),
        (f"{A},{B},tcp://127.0.0.1:0", "endpoint entry 3: 'tcp://127.0.0.1:0': port '0' is not a number 1-65535"),
        (f"{A},{B},{A}", f"{A} is listed twice"),
        (f"{A}, {A}", f"{A} is listed twice"),
    ],
)
def test_parse_endpoints_bad_is_one_line_naming_the_entry(text: str, line: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_endpoints(text)
    message = str(info.value)
    assert line in message and "\n" not in message


@pytest.mark.parametrize(
    ("endpoints", "lost", "order"),
    [
        ((A, B), A, (B, A)),
        ((A, B), B, (A, B)),
        ((A, B, C), A, (B, C, A)),
        ((A, B, C), B, (C, A, B)),
        ((A, B, C), C, (A, B, C)),
        ((A, B), C, (A, B)),  # not in the list (cannot happen): the list as given
    ],
)
def test_failover_order_starts_after_the_lost_broker(
    endpoints: tuple[str, ...], lost: str, order: tuple[str, ...]
) -> None:
    assert failover_order(endpoints, lost) == order


@pytest.mark.parametrize(
    ("outcomes", "kind", "text"),
    [
        (
            {A: mc0.Unreachable(f"{A}: connection refused", verdict="refused"), B: mc0.Timeout(f"connect to {B}", 2.5)},
            mc0.Timeout,
            f"connect to any of 2 endpoints: no answer within 5s ({A}: connection refused; {B}: no answer within 2.5s)",
        ),
        (
            {A: mc0.Unreachable(f"{A}: cannot resolve", verdict="unresolvable")},
            mc0.Unreachable,
            f"no broker reachable: {A}: cannot resolve",
        ),
        (
            {A: mc0.AuthFailed(f"{A}: key refused"), B: mc0.Unreachable(f"{B}: refused", verdict="refused")},
            mc0.AuthFailed,
            f"no broker accepted this client's key: {A}: key refused; {B}: refused",
        ),
        (
            {A: mc0.Timeout(f"connect to {A}", 1), B: mc0.UnsupportedVersion(505, "version 9 unsupported")},
            mc0.UnsupportedVersion,
            f"505 no broker accepted the connection: {A}: no answer within 1s; {B}: 505 version 9 unsupported",
        ),
    ],
)
def test_none_answered_names_every_endpoint(outcomes: dict[str, Exception], kind: type, text: str) -> None:
    error = none_answered(outcomes, 5.0)
    assert type(error) is kind and str(error) == text


# ---------------------------------------------------------------- the session in failover mode


def _connected(session: ClientSession) -> None:
    frames = session.connect(0.0)
    connect_id = frames[frames.index(b"ID") + 1]
    events, _ = session.receive([b"OK", b"ID", connect_id, b"TTL", b"1000"], 0.0)
    assert session.connected and events


@pytest.mark.parametrize("failover", [False, True])
def test_a_lost_broker_is_left_to_the_shell_only_in_failover_mode(failover: bool) -> None:
    """With one endpoint the session CONNECTs again itself (as always); with a list it reports the
    loss (``lost=True``) and sends nothing: the shell opens a link to another broker."""
    for lose in ("silence", "disconnect"):
        session = ClientSession(ttl_ms=1000, liveness=3, failover=failover)
        _connected(session)
        if lose == "silence":
            events, frames = session.tick(3.5)
        else:
            events, frames = session.receive([b"DISCONNECT"], 1.0)
        assert [type(e) for e in events] == [Reconnecting] and events[0].lost  # type: ignore[union-attr]
        assert not session.connected
        assert [f[0] for f in frames] == ([] if failover else [b"CONNECT"])
        if failover:  # the silence clock restarted: the loss is not reported again on the next tick
            assert session.tick(3.6) == ([], [])
    session = ClientSession(ttl_ms=1000, failover=True)
    _connected(session)  # a broker that answers but forgot us (401) is CONNECTed to again, list or not
    events, frames = session.receive([b"ERROR", b"CODE", b"401", b"MESSAGE", b"who?"], 1.0)
    assert any(isinstance(e, Reconnecting) and not e.lost for e in events) and frames[0][0] == b"CONNECT"
