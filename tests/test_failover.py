"""Endpoint lists and failover (issue 21, the client side): ``"tcp://a:1,tcp://b:2"`` everywhere an
endpoint is accepted; the first broker that answers wins; a broker killed with SIGKILL (or gone
silent) is left for the next one within 2 s, with every SUB (GROUP, FROM), a worker's READY and
the unanswered confirmed publishes (with their MSGID) sent again there.  Real broker processes on
free ports, sync and asyncio APIs, CURVE on and off (the brokers share one keypair)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq

import mc0
import mc0.aio
from mc0 import config as cfg
from mc0 import ports
from mc0.endpoints import failover_order, none_answered, parse_endpoints
from mc0.errors import ConfigError
from mc0.natsproc import NatsCluster
from mc0.process import BrokerProcess
from mc0.session import ClientSession, Reconnecting
from mc0.spark.options import Connection as SparkConnection

from .clusterbus import ClusterBus, nats_cluster
from .conftest import CurveSetup
from .test_jetstream_live import confirmed, fetch_all, journal
from .test_rpc_live import start_worker

FAILOVER_BUDGET = 2.0  # seconds: the bound from SIGKILL to the client on another broker
A, B, C = "tcp://127.0.0.1:1001", "tcp://127.0.0.1:1002", "tcp://127.0.0.1:1003"


def _free_port() -> int:
    return ports.free_port()  # leased below the ephemeral range: no other process takes it meanwhile


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


# ---------------------------------------------------------------- everywhere an endpoint is accepted


def test_library_env_and_config_take_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MC0_ENDPOINT", f"{A},{B}")
    for client in (mc0.Client(), mc0.aio.Client(), mc0.Worker(), mc0.aio.Worker()):
        assert client.endpoints == (A, B) and client.endpoint == A
    assert mc0.Client(f"{C},{A}").endpoints == (C, A)  # the argument first
    monkeypatch.setenv("MC0_ENDPOINT", f"{A},127.0.0.1:9")
    with pytest.raises(ConfigError, match="endpoint entry 2: '127.0.0.1:9' has no scheme"):
        mc0.Client()
    monkeypatch.delenv("MC0_ENDPOINT")
    config = cfg.parse(f'[client]\nendpoint = "{B},{C}"\n')
    assert mc0.Client(config=config.client).endpoints == (B, C)
    with pytest.raises(ConfigError, match=f"mc0.toml: client.endpoint: '{B},{B}': {B} is listed twice"):
        cfg.parse(f'[client]\nendpoint = "{B},{B}"\n', "mc0.toml")


def test_spark_endpoint_option_takes_a_list() -> None:
    assert SparkConnection.from_options({"endpoint": f"{A},{B}"}).endpoint == f"{A},{B}"
    with pytest.raises(ConfigError, match="option endpoint entry 2: 'b:2' has no scheme"):
        SparkConnection.from_options({"endpoint": f"{A},b:2"})


def _mc0(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "mc0", *args], capture_output=True, text=True, timeout=30, env=environment
    )


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        (["ping", "--endpoint", f"{A},127.0.0.1:2"], {}, "mc0: error: endpoint entry 2: '127.0.0.1:2' has no scheme"),
        (["pub", "t", "x", "--endpoint", f"{A},"], {}, f"mc0: error: endpoint: '{A},': entry 2 is empty"),
        (["sub", "t", "--endpoint", f"{A},{A}"], {}, f"mc0: error: endpoint: '{A},{A}': {A} is listed twice"),
        (["call", "s", "--endpoint", f"{A},tcp://h"], {}, "mc0: error: endpoint entry 2: 'tcp://h' needs host:port"),
        (["ping"], {"MC0_ENDPOINT": f"{A},ftp://x:1"}, "mc0: error: endpoint entry 2: 'ftp://x:1': scheme 'ftp'"),
        (
            ["ping", "--endpoint", "tcp://no-such-host.invalid:1,tcp://another.invalid:2"],
            {},
            "mc0: error: no broker reachable: tcp://no-such-host.invalid:1: cannot resolve host",
        ),
    ],
)
def test_cli_endpoint_lists_fail_in_one_line(args: list[str], env: dict[str, str], line: str) -> None:
    result = _mc0(*args, env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (only,) = result.stderr.strip().splitlines()
    assert line in only


def test_cli_pings_the_first_broker_of_the_list_that_answers() -> None:
    refused = f"tcp://127.0.0.1:{_free_port()}"
    with BrokerProcess(insecure=True) as broker:
        started = time.monotonic()
        result = _mc0("ping", "--endpoint", f"{refused},{broker.endpoint}")
        assert result.returncode == 0, result.stderr
        assert f"PONG from {broker.endpoint}" in result.stdout
        assert time.monotonic() - started < 10  # interpreter start-up + a refusal told in milliseconds


# ---------------------------------------------------------------- the first connection


@pytest.mark.asyncio
async def test_connect_skips_a_refused_endpoint_at_once(api: Any) -> None:
    refused = f"tcp://127.0.0.1:{_free_port()}"
    with BrokerProcess(insecure=True) as broker:
        started = time.monotonic()
        client = await api(api.Client(f"{refused},{broker.endpoint}", timeout=5).connect())
        took = time.monotonic() - started
        assert client.endpoint == broker.endpoint and client.connected
        assert took < 1.0, f"a refused endpoint cost {took:.3f} s"
        print(f"connected past a refused endpoint in {took:.3f} s")
        await api(client.close())


@pytest.mark.asyncio
async def test_connect_error_names_every_endpoint_tried(api: Any) -> None:
    first, second = f"tcp://127.0.0.1:{_free_port()}", f"tcp://127.0.0.1:{_free_port()}"
    client = api.Client(f"{first},{second}", timeout=5)
    started = time.monotonic()
    with pytest.raises(mc0.Unreachable) as info:
        await api(client.connect())
    # Told once every endpoint refused for REFUSED_AFTER (1 s), in rounds: about 1 s, far from the 5 s timeout
    # (2.56 s once beside the whole suite: 4 s is room for a loaded box and still not the timeout).
    assert info.value.verdict == "refused" and time.monotonic() - started < 4.0
    assert f"{first}: connection refused" in str(info.value) and f"{second}: connection refused" in str(info.value)
    with socket.socket() as silent:  # accepts TCP (the kernel's backlog), never speaks ZMTP
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        quiet = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        client = api.Client(f"{quiet},{first}", timeout=1.5)
        started = time.monotonic()
        with pytest.raises(mc0.Timeout) as timed_out:
            await api(client.connect())
        took = time.monotonic() - started
    text = str(timed_out.value)
    assert text.startswith("connect to any of 2 endpoints: no answer within 1.5s"), text
    assert f"{quiet}: no answer within 0.75s (a connection was made" in text and f"{first}: connection refused" in text
    assert took < 1.5 + 1.0  # the timeout covers the whole list (not 1.5 s per endpoint: 3 s)


# ---------------------------------------------------------------- failover, live


JOURNAL = '[journals.main]\ntopics = ["fo.>"]\nfolder = "{folder}"\n'


class Brokers:
    """Broker processes on free ports that a client list can name: without CURVE, or all with
    the same keypair and allowed keys (a client has one broker_key)."""

    def __init__(self, root: Path, curve: bool) -> None:
        self.root = root
        self.curve = CurveSetup(root) if curve else None
        self.running: dict[str, BrokerProcess] = {}
        self.options: dict[str, Any] = {}

    def start(self, name: str, port: int | None = None) -> str:
        """Start broker ``name`` (its own journal folder; its port again if it ran before)."""
        folder = self.root / name
        folder.mkdir(exist_ok=True)
        text = JOURNAL.format(folder=folder / "journal")
        if self.curve is not None:
            keys = f'[security]\nkeys_dir = "{self.curve.keys_dir}"\nallowed_dir = "{self.curve.allowed_dir}"\n'
            text = keys + text
        config = folder / "mc0.toml"
        config.write_text("[broker]\nmin_ttl_ms = 50\n" + text)
        bind = (f"tcp://127.0.0.1:{port}",) if port else ("tcp://127.0.0.1:*",)
        process = BrokerProcess(config=str(config), insecure=self.curve is None, bind=bind).start()
        self.running[name] = process
        if self.curve is not None:  # the first broker made the shared keypair: now it exists
            self.options = self.curve.client_options("alice")
        return process.endpoint

    def kill(self, name: str) -> float:
        """SIGKILL: no DISCONNECT, no goodbye; returns the time it was sent."""
        sent = time.monotonic()
        self.running[name].kill()
        return sent

    def signal(self, name: str, signum: int) -> None:
        self.running[name].signal(signum)

    def close(self) -> None:
        for process in self.running.values():
            process.kill()


@pytest.fixture(params=["plain", "curve"])
def brokers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Brokers]:
    group = Brokers(tmp_path, request.param == "curve")
    try:
        yield group
    finally:
        group.close()


async def until(condition: Callable[[], bool], within: float, what: str) -> float:
    """Poll ``condition`` every 5 ms for at most ``within`` s; the seconds it took."""
    started = time.monotonic()
    for _ in range(int(within / 0.005) + 1):
        if condition():
            return time.monotonic() - started
        await asyncio.sleep(0.005)
    raise AssertionError(f"{what}: not within {within} s")


def background(api: Any, call: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run a client call without waiting for it (a thread for the sync API)."""
    if api.name == "sync":
        return asyncio.get_running_loop().run_in_executor(None, call)
    return asyncio.ensure_future(call())


def inner(client: Any) -> Any:
    """The asyncio client under a sync one (to look at what it has in flight)."""
    return getattr(client, "_inner", client)


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_sigkill_moves_every_client_to_the_next_broker_within_2s(api: Any, brokers: Brokers) -> None:
    first, second = brokers.start("a"), brokers.start("b")
    endpoints = f"{first},{second}"
    options = brokers.options
    sub = await api(api.Client(endpoints, **options).connect())
    plain = await api(sub.subscribe("fo.live.>"))
    grouped = await api(sub.subscribe("fo.work.>", group="crew"))
    worker = await start_worker(api, endpoints, {"echo": lambda r: r.body}, **options)
    pub = await api(api.Client(endpoints, **options).connect())
    clients = (sub, worker, pub)
    assert [c.endpoint for c in clients] == [first] * 3
    killed = brokers.kill("a")

    # (reconnects counts the healed session once its Connected event is handled, a moment after connected
    # and endpoint say so: a reader in another thread, the sync API's, can see those first)
    def moved() -> bool:
        return all(c.connected and c.endpoint == second and c.reconnects for c in clients)

    await until(moved, 5, "failover")
    took = time.monotonic() - killed
    print(f"subscriber, worker and publisher on {second} {took:.3f} s after SIGKILL of {first}")
    assert took < FAILOVER_BUDGET
    assert sub.reconnects == worker.reconnects == pub.reconnects == 1
    await api(pub.publish("fo.live.1", b"plain"))
    assert (await api(plain.next(timeout=5))).body == b"plain"
    await api(pub.publish("fo.work.1", b"group"))
    message = await api(grouped.next(timeout=5))
    assert message.body == b"group" and message.group == "crew"
    assert (await api(pub.request("echo", b"served again", timeout=5))).body == b"served again"
    print(f"subscriptions, queue group and worker served again {time.monotonic() - killed:.3f} s after the kill")
    for client in clients:
        await api(client.close())


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_unanswered_confirmed_publish_is_sent_again_with_its_msgid(api: Any, brokers: Brokers) -> None:
    """The broker stops (SIGSTOP) holding a confirmed PUT and a REQUEST, then is killed: the PUT is
    sent again to the next broker with its MSGID and answered there; the request, which may have
    run, fails at once with a clear NotConnected instead of being sent twice."""
    first, second = brokers.start("a"), brokers.start("b")
    pub = await api(api.Client(f"{first},{second}", **brokers.options).connect())
    brokers.signal("a", signal.SIGSTOP)
    confirmed = background(
        api, functools.partial(pub.publish, "fo.orders", b"once", confirm=True, msgid="m-1", timeout=10)
    )
    asked = background(api, functools.partial(pub.request, "mmi.service", b"echo", timeout=10))
    state = inner(pub)
    await until(lambda: len(state._pending) == 1 and len(state._calls) == 1 and state._out.pending == 0, 5, "sent")
    killed = brokers.kill("a")
    with pytest.raises(mc0.NotConnected, match=f"the broker at {first} was lost before it answered"):
        await asyncio.wait_for(asked, 5)
    failed_after = time.monotonic() - killed
    ack = await asyncio.wait_for(confirmed, 5)
    answered_after = time.monotonic() - killed
    print(
        f"request failed {failed_after:.3f} s, confirmed publish answered by {pub.endpoint} "
        f"{answered_after:.3f} s after the kill"
    )
    assert pub.endpoint == second and answered_after < FAILOVER_BUDGET
    assert (ack.journal, ack.seq, ack.duplicate) == ("main", 1, False)
    again = await api(pub.publish("fo.orders", b"once", confirm=True, msgid="m-1"))
    assert again.duplicate, "the re-sent PUT did not carry MSGID m-1"
    records = (await api(pub.fetch("main"))).records
    assert [r.body for r in records] == [b"once"]
    await api(pub.close())


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_confirmed_publishes_the_lost_broker_answered_are_not_sent_again(brokers: Brokers) -> None:
    """The broker stores and answers 120 confirmed publishes (no MSGID) and is killed before the client
    read the answers: the client reads what the old socket holds before it settles, so every publish
    returns the lost broker's Ack and none is sent to the next broker (which would store it again)."""
    first, second = brokers.start("a"), brokers.start("b")
    pub = await mc0.aio.Client(f"{first},{second}", **brokers.options).connect()
    n = 120
    brokers.signal("a", signal.SIGSTOP)  # (so that no answer comes before the client's loop is held)
    publishes = [asyncio.ensure_future(pub.publish("fo.orders", b"%d" % i, confirm=True, timeout=30)) for i in range(n)]
    out = pub._out
    assert out is not None and pub._out.socket is not None
    await until(lambda: len(pub._pending) == n and out.pending == 0, 10, "every publish handed to the socket")
    # From here until libzmq saw the kill the client's loop is held (no await): the answers wait unread on
    # its socket when the loss is known (looking at ZMQ_EVENTS also keeps the Link from reading on its own).
    brokers.signal("a", signal.SIGCONT)
    with mc0.Client(first, **brokers.options) as look:
        deadline = time.monotonic() + 20
        while len(look.fetch("main").records) < n:  # stored at a, so a sent each OK in the same turn
            assert time.monotonic() < deadline, "the broker did not store the publishes"
            time.sleep(0.02)
    deadline = time.monotonic() + 10
    while not pub._out.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # the answers reached the client's socket
        assert time.monotonic() < deadline, "no answer reached the client"
        time.sleep(0.005)
    time.sleep(0.2)  # (an answer in a second batch: the same TCP connection, right behind)
    brokers.kill("a")
    port = int(first.rpartition(":")[2])
    deadline = time.monotonic() + 10
    while any(c.raddr and c.raddr.port == port for c in psutil.Process().net_connections("tcp")):
        assert time.monotonic() < deadline, "the kill was not seen"  # (libzmq closes a lost connection's fd)
        time.sleep(0.005)
    acks = await asyncio.wait_for(asyncio.gather(*publishes), 20)
    assert len(acks) == n and all(ack.journal == "main" for ack in acks)
    assert sorted(ack.seq for ack in acks) == list(range(1, n + 1))
    await until(lambda: pub.connected and pub.endpoint == second, 10, "failover")
    with mc0.Client(second, **brokers.options) as look:
        again = look.fetch("main").records
    assert again == [], f"{len(again)} of {n} publishes the lost broker had answered were stored again at {second}"
    await pub.close()


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_a_replaying_subscriber_resumes_at_the_next_seq(api: Any, brokers: Brokers) -> None:
    """A ``SUB FROM`` subscriber that took seqs 1..5 on the lost broker asks the next one FROM 6."""
    first, second = brokers.start("a"), brokers.start("b")
    for endpoint, count in ((first, 5), (second, 8)):
        with mc0.Client(endpoint, **brokers.options) as seeder:
            for i in range(count):
                seeder.publish(f"fo.log.{i}", f"{endpoint}#{i + 1}".encode(), confirm=True)
    sub = await api(api.Client(f"{first},{second}", **brokers.options).connect())
    stream = await api(sub.subscribe("fo.log.>", from_seq=0))
    seen = [await api(stream.next(timeout=5)) for _ in range(5)]
    assert [m.seq for m in seen] == [1, 2, 3, 4, 5]
    brokers.kill("a")
    resumed = [await api(stream.next(timeout=5)) for _ in range(3)]
    assert [(m.seq, m.body) for m in resumed] == [
        (6, f"{second}#6".encode()),
        (7, f"{second}#7".encode()),
        (8, f"{second}#8".encode()),
    ]
    with mc0.Client(second, **brokers.options) as live:
        live.publish("fo.log.live", b"live", confirm=True)
    assert (await api(stream.next(timeout=5))).seq == 9
    await api(sub.close())


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_with_no_broker_up_commands_wait_and_the_list_is_rotated(api: Any, tmp_path: Path) -> None:
    """Every broker down: publishes wait in the client (bounded, not lost), a request never sent
    and a confirmed publish wait too; the first broker to come back gets them all.  A broker that
    was lost is used again once it is back (rotation)."""
    brokers = Brokers(tmp_path, curve=False)
    try:
        a_port, b_port = _free_port(), _free_port()
        first, second = brokers.start("a", a_port), f"tcp://127.0.0.1:{b_port}"
        pub = await api(api.Client(f"{first},{second}", ttl=5).connect())
        brokers.kill("a")
        await until(lambda: not pub.connected, 5, "the client sees its broker lost")
        for i in range(100):
            await api(pub.publish("fo.buffered", str(i).encode()))
        asked = background(api, functools.partial(pub.request, "mmi.service", b"mc0.broker", timeout=20))
        confirmed = background(api, functools.partial(pub.publish, "fo.buffered", b"last", confirm=True, timeout=20))
        await until(lambda: len(inner(pub)._calls) == 1 and len(inner(pub)._pending) == 1, 5, "queued")
        assert not pub.connected
        came_back = brokers.start("b", b_port)
        assert (await asyncio.wait_for(asked, 10)).body == b"200"  # never sent to the dead broker: sent here
        assert (await asyncio.wait_for(confirmed, 10)).seq == 101
        print(f"on {pub.endpoint}; the request and the publish that waited were answered there")
        assert pub.endpoint == came_back == second
        records = (await api(pub.fetch("main"))).records
        assert [r.body for r in records] == [str(i).encode() for i in range(100)] + [b"last"]
        brokers.start("a", a_port)  # the lost broker is back: it is the next in the rotation
        killed = brokers.kill("b")
        await until(lambda: pub.connected and pub.endpoint == first, 5, "back to the first broker")
        took = time.monotonic() - killed
        print(f"back on {first} {took:.3f} s after SIGKILL of {second}")
        assert took < FAILOVER_BUDGET
        assert (await api(pub.request("mmi.service", b"mc0.broker", timeout=5))).body == b"200"
        await api(pub.close())
    finally:
        brokers.close()


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_a_silent_broker_is_left_after_the_heartbeat_budget(api: Any, brokers: Brokers) -> None:
    """SIGSTOP: the connection stays up, the broker says nothing; past liveness x TTL the client
    moves on (TTL 0.2 s x 3 here, so the whole failover fits the 2 s)."""
    first, second = brokers.start("a"), brokers.start("b")
    sub = await api(api.Client(f"{first},{second}", ttl=0.2, **brokers.options).connect())
    stream = await api(sub.subscribe("fo.quiet"))
    brokers.signal("a", signal.SIGSTOP)
    took = await until(lambda: sub.connected and sub.endpoint == second, 5, "failover from a silent broker")
    print(f"left the silent {first} for {second} in {took:.3f} s")
    assert took < FAILOVER_BUDGET
    # Heard at the second broker.  With a TTL of 0.2 s, a box loaded past its cores can starve the client
    # 0.6 s and make it leave (and rejoin) the second broker too: a message published while it was away
    # is not its (pub/sub without a journal), so one is published each second until one arrives (bounded).
    with mc0.Client(second, **brokers.options) as pub:
        for attempt in range(10):
            pub.publish("fo.quiet", b"heard %d" % attempt, confirm=True)
            with contextlib.suppress(mc0.Timeout):
                assert (await api(stream.next(timeout=1))).body.startswith(b"heard ")
                break
        else:
            raise AssertionError("nothing published at the second broker reached the subscription in 10 s")
    await api(sub.close())


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_close_while_failing_over_is_prompt(api: Any, tmp_path: Path) -> None:
    """No broker to go to: publishers wait for room (max_outgoing), and close() stops the failover
    at once and fails what waited (ClosedError)."""
    brokers = Brokers(tmp_path, curve=False)
    try:
        first, nowhere = brokers.start("a"), f"tcp://127.0.0.1:{_free_port()}"
        client = await api(api.Client(f"{first},{nowhere}", max_outgoing=4096).connect())
        brokers.kill("a")
        await until(lambda: not client.connected, 5, "the client sees its broker lost")
        with pytest.raises(mc0.Timeout, match="room in the outgoing buffer"):
            for _ in range(100):  # buffered while no broker is up, until max_outgoing: then the publisher waits
                await api(client.publish("fo.t", b"x" * 100, timeout=0.2))
        assert inner(client)._out.pending >= 4096  # kept, not dropped
        waiting = background(api, functools.partial(client.request, "mmi.service", b"x", timeout=20))
        await until(lambda: len(inner(client)._calls) == 1, 5, "the request queued")
        started = time.monotonic()
        await api(client.close())
        assert time.monotonic() - started < 1.0 and client.closed
        with pytest.raises(mc0.ClosedError):
            await asyncio.wait_for(waiting, 5)
    finally:
        brokers.close()


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_broker_that_stops_says_disconnect_and_its_clients_move(api: Any, tmp_path: Path) -> None:
    """SIGTERM: the broker says DISCONNECT to everyone before it goes; a client with a list moves on."""
    brokers = Brokers(tmp_path, curve=False)
    try:
        first, second = brokers.start("a"), brokers.start("b")
        client = await api(api.Client(f"{first},{second}").connect())
        sub = await api(client.subscribe("fo.after"))
        stopped = time.monotonic()
        assert brokers.running["a"].stop() == 0
        await until(lambda: client.connected and client.endpoint == second, 5, "failover after DISCONNECT")
        print(f"on {second} {time.monotonic() - stopped:.3f} s after SIGTERM of {first}")
        await api(client.publish("fo.after", b"here"))
        assert (await api(sub.next(timeout=5))).body == b"here"
        await api(client.close())
    finally:
        brokers.close()


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_close_during_connect_over_a_list_ends_it(api: Any) -> None:
    with socket.socket() as one, socket.socket() as two:  # accept TCP, never speak ZMTP
        for silent in (one, two):
            silent.bind(("127.0.0.1", 0))
            silent.listen()
        names = ",".join(f"tcp://127.0.0.1:{s.getsockname()[1]}" for s in (one, two))
        client = api.Client(names, timeout=10)
        connecting = background(api, client.connect)
        await until(lambda: inner(client)._out is not None, 5, "connect started")
        started = time.monotonic()
        await api(client.close())
        with pytest.raises(mc0.ClosedError):
            await asyncio.wait_for(connecting, 5)
        assert time.monotonic() - started < 1.0 and client.closed


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_confirmed_publish_without_a_msgid_gets_one_unique_to_its_client(api: Any, tmp_path: Path) -> None:
    """Two clients of one identity publish the same bodies confirmed, without a MSGID, twice each: every
    record is stored (no client's automatic MSGID dedups another's, nor a later publish of its own), and
    each carries its MSGID, the client's prefix and the request's id (what a failover re-send repeats)."""
    brokers = Brokers(tmp_path, curve=False)
    try:
        endpoint = brokers.start("a")
        clients = [await api(api.Client(endpoint).connect()) for _ in range(2)]
        for _ in range(2):
            for client in clients:
                ack = await api(client.publish("fo.orders", b"same", confirm=True))
                assert not ack.duplicate
        await api(clients[0].publish("fo.orders", b"own", confirm=True, msgid="mine"))
        records = (await api(clients[0].fetch("main"))).records
        msgids = [r.headers.get("MSGID", "") for r in records]
        assert len(records) == 5 and len(set(msgids)) == 5, msgids
        prefixes = [inner(c).auto_msgid_prefix for c in clients]
        assert prefixes[0] != prefixes[1] and all(len(p) == 17 and p.endswith(".") for p in prefixes)
        assert [m.rpartition(".")[0] + "." for m in msgids[:4]] == prefixes * 2 and msgids[4] == "mine"
        for client in clients:
            await api(client.close())
    finally:
        brokers.close()


# ---------------------------------------------------------------- a shared journal: JetStream
@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    yield from nats_cluster(tmp_path_factory.mktemp("nats"))


@pytest.mark.timeout(180)
def test_confirmed_publishes_without_a_msgid_are_stored_once_when_their_broker_is_killed_mid_flight(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """Brokers b1, b2 share a JetStream journal; a client (endpoints b1,b2) keeps 200 confirmed publishes
    without a MSGID in flight and b1 is killed -9 once it answered some.  The client sends again every one
    b1 had not answered, among them some b1 had handed to JetStream already: each carries the automatic
    MSGID it first went with, so the stream stores it once."""
    with ClusterBus(tmp_path, nats, 2, extra=journal("flow", '["flow.>"]')) as bus:
        bus.wait_joined()
        with bus.client(1) as look:
            confirmed(look, "flow.warmup", b"warm")

        async def publish_all() -> tuple[list[mc0.Ack], int]:
            async with mc0.aio.Client(bus.endpoints(0, 1)) as client:
                acks: list[mc0.Ack] = []
                answered_at_kill = -1
                for start in range(0, 3000, 200):
                    batch = [
                        asyncio.ensure_future(client.publish("flow.x", b"%d" % i, confirm=True, timeout=30))
                        for i in range(start, start + 200)
                    ]
                    if start >= 1000 and answered_at_kill < 0:
                        for _ in range(5000):  # (until b1 answered some: the rest were handed to it, many stored)
                            if any(t.done() for t in batch):
                                break
                            await asyncio.sleep(0.0005)
                        if not all(t.done() for t in batch):  # (else b1 answered all in one go: the next batch)
                            answered_at_kill = sum(t.done() for t in batch)
                            bus.kill(0)
                    acks += [a for a in await asyncio.gather(*batch) if a is not None]
                return acks, answered_at_kill

        acks, answered_at_kill = asyncio.run(publish_all())
        assert answered_at_kill >= 0, "b1 answered every batch at once: never killed mid-flight"
        print(f"b1 killed with {answered_at_kill} of 200 answered")
        assert len(acks) == 3000
        with bus.client(1) as look:
            bodies = [r.body for r in fetch_all(look, "flow") if r.topic == "flow.x"]
        twice = len(bodies) - len(set(bodies))
        assert twice == 0, f"{twice} of the publishes b1 had not answered were stored twice"
        assert set(bodies) == {b"%d" % i for i in range(3000)}
