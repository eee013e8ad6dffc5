"""Connection errors: endpoints checked up front (one line, with a good example), and a broker
that is not there told apart (refused / unresolvable host / no answer) within about a second,
in the library and the CLI alike; MC0_ENDPOINT honoured by ``mc0.Client()``."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from typing import Any

import pytest

import mc0
from mc0 import ports
from mc0.endpoints import check_endpoint, diagnose
from mc0.errors import ConfigError
from mc0.process import BrokerProcess

live = pytest.mark.asyncio


@pytest.mark.parametrize(
    ("text", "bind", "problem"),
    [
        ("tcp://127.0.0.1:61616", False, None),
        ("tcp://localhost:1", False, None),
        ("tcp://broker-1.example.org:61616", False, None),
        ("tcp://[::1]:61616", False, None),
        ("ipc:///tmp/mc0.sock", False, None),
        ("inproc://bus", False, None),
        ("tcp://*:61616", True, None),
        ("tcp://127.0.0.1:*", True, None),
        ("127.0.0.1:61616", False, "has no scheme (e.g. tcp://127.0.0.1:61616)"),
        ("localhost", False, "has no scheme (e.g. tcp://127.0.0.1:61616)"),
        ("http://localhost:61616", False, "scheme 'http' is not one of tcp, ipc, inproc"),
        ("tcp://127.0.0.1", False, "needs host:port"),
        ("tcp://127.0.0.1:port", False, "port 'port' is not a number"),
        ("tcp://127.0.0.1:0", False, "is not a number 1-65535"),
        ("tcp://127.0.0.1:70000", False, "is not a number 1-65535"),
        ("tcp://127.0.0.1:*", False, "port '*' is not a number"),
        ("tcp://*:61616", False, "'*' binds every interface"),
        ("tcp://[::1:61616", False, "IPv6 host goes in brackets"),
        ("tcp://[nope]:61616", False, "is not an IPv6 address"),
        ("tcp://bad host:1", False, "is not a host name or address"),
        ("tcp://", False, "names no address"),
        ("", False, "no endpoint given"),
    ],
)
def test_check_endpoint(text: str, bind: bool, problem: str | None) -> None:
    if problem is None:
        assert check_endpoint(text, bind=bind) == text
    else:
        with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
            check_endpoint(text, bind=bind)


@pytest.mark.parametrize(
    ("events", "connected", "verdict"),
    [
        ([], False, None),
        (["CONNECT_DELAYED"], False, None),  # still trying (a SYN with no answer yet)
        (["CONNECT_DELAYED", "CONNECT_RETRIED"], False, "refused"),
        (["CONNECT_RETRIED", "CONNECT_RETRIED"], False, "unresolvable"),
        (["CONNECT_DELAYED", "CONNECT_RETRIED"], True, None),  # it did connect once
    ],
)
def test_diagnose(events: list[str], connected: bool, verdict: str | None) -> None:
    assert diagnose(events, connected) == verdict


def _free_port() -> int:
    return ports.free_port()  # leased below the ephemeral range: no other process takes it meanwhile


@live
async def test_refused_is_told_within_a_second(api: Any) -> None:
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    client = api.Client(endpoint, timeout=10)
    start = time.monotonic()
    with pytest.raises(mc0.Unreachable, match="connection refused") as info:
        await api(client.connect())
    assert info.value.verdict == "refused" and time.monotonic() - start < 2.0
    with pytest.raises(mc0.ClosedError):
        await api(client.publish("t", b"x"))


@live
async def test_unresolvable_host_is_told_within_a_second(api: Any) -> None:
    client = api.Client("tcp://no-such-host.invalid:61616", timeout=10)
    start = time.monotonic()
    with pytest.raises(mc0.Unreachable, match="cannot resolve host 'no-such-host.invalid'"):
        await api(client.connect())
    assert time.monotonic() - start < 2.0


@live
async def test_a_peer_that_never_answers_is_a_timeout_that_says_so(api: Any) -> None:
    with socket.socket() as silent:  # accepts TCP (the kernel's backlog), never speaks ZMTP
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        client = api.Client(f"tcp://127.0.0.1:{silent.getsockname()[1]}", timeout=1.5)
        with pytest.raises(mc0.Timeout, match="no answer within 1.5s .a connection was made"):
            await api(client.connect())


@pytest.mark.parametrize("bad", ["127.0.0.1:61616", "http://localhost:61616"])
def test_library_refuses_a_bad_endpoint_at_once(bad: str) -> None:
    with pytest.raises(mc0.ConfigError, match="e.g. tcp://"):
        mc0.Client(bad)


def test_client_honours_mc0_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    with BrokerProcess(insecure=True) as broker:
        monkeypatch.setenv("MC0_ENDPOINT", broker.endpoint)
        with mc0.Client() as client:
            assert client.endpoint == broker.endpoint
            assert client.ping() > 0


def _mc0(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mc0", *args], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["ping", "--endpoint", "127.0.0.1:61616"], "mc0: error: endpoint: '127.0.0.1:61616' has no scheme"),
        (["ping", "--endpoint", "http://localhost:61616"], "mc0: error: endpoint: 'http://localhost:61616': scheme"),
        (["pub", "t", "x", "--endpoint", "tcp://h"], "mc0: error: endpoint: 'tcp://h' needs host:port"),
        (["broker", "--bind", "127.0.0.1:1"], "mc0: error: --bind: '127.0.0.1:1' has no scheme"),
        (["ping", "--endpoint", "tcp://no-such-host.invalid:1"], "cannot resolve host 'no-such-host.invalid'"),
    ],
)
def test_cli_bad_endpoints_are_one_line(args: list[str], line: str) -> None:
    result = _mc0(*args)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (only,) = result.stderr.strip().splitlines()
    assert line in only


def test_cli_refused_within_a_second() -> None:
    """A refused connection is said at once, not when the timeout ends: the CLI's start-up (measured
    here, so a loaded box has its room) plus a few seconds, against a 60 s timeout."""
    start = time.monotonic()
    assert _mc0("ping", "--help").returncode == 0
    start_up = time.monotonic() - start
    start = time.monotonic()
    result = _mc0("ping", "--timeout", "60", "--endpoint", f"tcp://127.0.0.1:{_free_port()}")
    assert result.returncode == 1
    assert "connection refused" in result.stderr and "is a broker running there" in result.stderr
    took = time.monotonic() - start
    assert took < 2 * start_up + 5.0, f"{took:.1f} s (start-up {start_up:.1f} s): refused only at the timeout?"
