"""The wire protocol against a real broker process, with raw DEALER peers."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq

from mc0 import ports
from mc0.process import BrokerProcess

from .conftest import RawPeer, headers_of, payload_of, write_config


def code_of(frames: list[bytes]) -> int:
    assert frames[0] == b"ERROR", frames
    return int(headers_of(frames)["CODE"])


def test_connect_gets_ok_with_the_clamped_ttl(tmp_path: Path, zctx: zmq.Context[Any]) -> None:
    config = write_config(tmp_path, "[broker]\nmin_ttl_ms = 200\nmax_ttl_ms = 3000\n")
    with BrokerProcess(config=config, insecure=True) as broker:
        peer = RawPeer(broker.endpoint, zctx)
        assert peer.connect(ttl=10) == [b"OK", b"ID", b"c", b"TTL", b"200"]
        assert peer.connect(ttl=999999) == [b"OK", b"ID", b"c", b"TTL", b"3000"]
        assert peer.connect(ttl=1234) == [b"OK", b"ID", b"c", b"TTL", b"1234"]
        peer.close()


def test_sub_put_message_with_wildcards_once_per_peer(raw: Any) -> None:
    sub, other, pub = raw(), raw(), raw()
    sub.send("SUB", "ID", "s", "", "orders.>", "orders.*", "*.eu")
    assert sub.recv() == [b"OK", b"ID", b"s"]
    other.send("SUB", "ID", "s", "", "billing.*")
    assert other.recv() == [b"OK", b"ID", b"s"]
    pub.send("PUT", "TOPIC", "orders.eu", "X-Trace", "abc", "ID", "p1", "", "hello", "world")
    assert pub.recv() == [b"OK", b"ID", b"p1"]
    frames = sub.recv_skipping_noop()
    assert frames[0] == b"MESSAGE"
    assert headers_of(frames) == {"TOPIC": "orders.eu", "SENDER": "anonymous", "X-Trace": "abc"}
    assert payload_of(frames) == [b"hello", b"world"]
    assert sub.nothing(0.3), "a peer with three matching patterns got the message more than once"
    assert other.nothing(0.1)
    pub.send("PUT", "TOPIC", "billing.q1", "", "x")
    assert headers_of(other.recv_skipping_noop())["TOPIC"] == "billing.q1"


def test_unsub_stops_delivery(raw: Any) -> None:
    sub, pub = raw(), raw()
    sub.send("SUB", "ID", "1", "", "a.*", "b")
    sub.recv()
    sub.send("UNSUB", "ID", "2", "", "a.*", "never-subscribed")
    assert sub.recv() == [b"OK", b"ID", b"2"]
    pub.send("PUT", "TOPIC", "a.x", "", "gone")
    pub.send("PUT", "TOPIC", "b", "ID", "3", "", "kept")
    pub.recv()
    assert payload_of(sub.recv_skipping_noop()) == [b"kept"]


def test_id_gets_ok_and_no_id_gets_nothing(raw: Any) -> None:
    peer = raw()
    peer.send("NOOP", "ID", "n1")
    assert peer.recv() == [b"OK", b"ID", b"n1"]
    peer.send("NOOP")
    peer.send("SUB", "", "x")
    peer.send("PUT", "TOPIC", "y", "", "z")
    assert peer.nothing(0.3)


def test_ping_pong(raw: Any) -> None:
    peer = raw()
    peer.send("PING", "ID", "echo-me")
    assert peer.recv() == [b"PONG", b"ID", b"echo-me"]


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker with small limits for the read-only bad-input table (each case has its own peer)."""
    config = write_config(
        tmp_path_factory.mktemp("limited"),
        "[broker.limits]\nmax_message_bytes = 65536\nmax_frame_bytes = 131072\nmax_subscriptions = 5\n",
    )
    with BrokerProcess(config=config, insecure=True) as broker:
        yield broker


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        (["PUT", "TOPIC", "a..b", "ID", "1", "", "x"], 400),
        (["PUT", "TOPIC", "mc0.sys.rpc", "ID", "1", "", "x"], 403),
        (["PUT", "TOPIC", "t", "ID", "1", "", "x" * 70_000], 413),
        (["SUB", "ID", "1", "", *[f"p{i}" for i in range(6)]], 429),
    ],
)
def test_status_codes_from_bad_input(
    limited: BrokerProcess, zctx: zmq.Context[Any], frames: list[str], code: int
) -> None:
    peer = RawPeer(limited.endpoint, zctx)  # a peer of its own: the refused input changed nothing
    peer.connect()
    peer.send(*frames)
    reply = peer.recv()
    assert code_of(reply) == code
    assert headers_of(reply)["ID"] == "1"
    peer.send("PING", "ID", "after")
    assert peer.recv() == [b"PONG", b"ID", b"after"]
    peer.close()


def test_401_before_connect_and_505_for_unknown_version(broker: BrokerProcess, zctx: zmq.Context[Any]) -> None:
    peer = RawPeer(broker.endpoint, zctx)
    peer.send("SUB", "ID", "early", "", "x")
    assert code_of(peer.recv()) == 401
    peer.send("CONNECT", "VERSION", "9.9", "TTL", "1000", "ID", "v")
    reply = peer.recv()
    assert code_of(reply) == 505 and headers_of(reply)["ID"] == "v"
    peer.close()


MALFORMED = [
    [],
    [b""],
    [b"HELLO"],
    [b"put", b"TOPIC", b"t", b"", b"x"],
    [b"PUT"],
    [b"PUT", b"TOPIC"],
    [b"PUT", b"TOPIC", b"t"],
    [b"PUT", b"TOPIC", b"t", b""],
    [b"PUT", b"TOPIC", b"a.*", b"", b"x"],
    [b"PUT", b"TOPIC", b"", b"", b"x"],
    [b"PUT", b"TOPIC", b"a b", b"", b"x"],
    [b"PUT", b"TOPIC", b"\xff\xfe", b"", b"x"],
    [b"PUT", b"TOPIC", b"t", b"SENDER", b"root", b"", b"x"],
    [b"PUT", b"TOPIC", b"t", b"TOPIC", b"u", b"", b"x"],
    [b"PUT", b"TOPIC", b"t", b"Bogus", b"1", b"", b"x"],
    [b"PUT", b"TOPIC", ".".join(["t"] * 10_000).encode(), b"", b"x"],
    [b"SUB"],
    [b"SUB", b"", b"a.>.b"],
    [b"SUB", b"", b"\xff"],
    [b"UNSUB", b"", b""],
    [b"CONNECT", b"VERSION", b"1.0", b"TTL", b"soon"],
    [b"CONNECT", b"VERSION", b"1.0", b"TOPIC", b"t"],  # a header CONNECT does not take
    [b"PING"],
    [b"NOOP", b"", b"payload"],
    [b"MESSAGE", b"TOPIC", b"t", b"", b"forged"],
    [b"OK", b"ID", b"1"],
    [b"\x00" * 100],
    [b"PUT", b"X-A", b"1"] * 50,
    [b"PUT", b"TOPIC", b"t", b"", b"x"] + [b"y"] * 5000,
]


def test_twenty_plus_malformed_messages_then_ping_still_answers(raw: Any) -> None:
    peer = raw()
    answered = 0
    for frames in MALFORMED:
        if not frames:
            continue  # zmq cannot send a zero-frame message
        peer.send(*frames)
        reply = peer.recv_skipping_noop()
        assert reply[0] == b"ERROR", (frames[:3], reply)
        assert code_of(reply) in (400, 413), (frames[:3], reply)
        answered += 1
    assert answered >= 20
    peer.send("PING", "ID", "alive")
    assert peer.recv_skipping_noop() == [b"PONG", b"ID", b"alive"]


def test_frame_beyond_maxmsgsize_drops_only_that_peer(tmp_path: Path, zctx: zmq.Context[Any]) -> None:
    config = write_config(tmp_path, "[broker.limits]\nmax_message_bytes = 65536\nmax_frame_bytes = 131072\n")
    with BrokerProcess(config=config, insecure=True) as broker:
        rogue, good = RawPeer(broker.endpoint, zctx), RawPeer(broker.endpoint, zctx)
        rogue.connect()
        good.connect()
        rogue.send("PUT", "TOPIC", "t", "ID", "big", "", b"x" * 300_000)
        good.send("PING", "ID", "after")
        assert good.recv_skipping_noop() == [b"PONG", b"ID", b"after"]
        assert rogue.nothing(0.3)  # libzmq cut the connection; nothing was processed
        rogue.close()
        good.close()


def test_heartbeats_flow_and_a_silent_peer_expires(tmp_path: Path, zctx: zmq.Context[Any]) -> None:
    config = write_config(tmp_path, "[broker]\nmin_ttl_ms = 50\nliveness = 3\n")
    with BrokerProcess(config=config, insecure=True) as broker:
        silent, pub = RawPeer(broker.endpoint, zctx), RawPeer(broker.endpoint, zctx)
        assert silent.connect(ttl=100)[:3] == [b"OK", b"ID", b"c"]
        pub.connect(ttl=5000)
        silent.send("SUB", "ID", "s", "", "news")
        assert silent.recv() == [b"OK", b"ID", b"s"]
        assert silent.recv(1.0) == [b"NOOP"]  # the broker heartbeats an idle peer after TTL
        time.sleep(0.6)  # > liveness x TTL of silence from the peer
        pub.send("PUT", "TOPIC", "news", "ID", "p", "", "x")
        assert pub.recv_skipping_noop() == [b"OK", b"ID", b"p"]
        assert silent.nothing(0.3), "an expired peer still got a message"
        silent.send("NOOP", "ID", "back")
        assert code_of(silent.recv_skipping_noop()) == 401
        silent.close()
        pub.close()


def test_slow_subscriber_does_not_stall_a_fast_one_and_is_evicted(tmp_path: Path, zctx: zmq.Context[Any]) -> None:
    # The slow peer's queue holds about 200 of these messages (4 MB), counted by the broker.
    config = write_config(tmp_path, "[broker]\nmax_queue_bytes = 4000000\nslow_consumer_ms = 300\n")
    with BrokerProcess(config=config, insecure=True) as broker:
        slow, fast, pub = (RawPeer(broker.endpoint, zctx) for _ in range(3))
        slow.socket.setsockopt(zmq.RCVHWM, 10)
        for peer in (slow, fast, pub):
            peer.connect()
        for peer in (slow, fast):
            peer.send("SUB", "ID", "s", "", "flood")
            assert peer.recv() == [b"OK", b"ID", b"s"]
        count, body = 3000, b"x" * 20_000
        received = [0]

        def drain_fast() -> None:
            deadline = time.monotonic() + 30
            while received[0] < count and time.monotonic() < deadline:
                if fast.socket.poll(200):
                    received[0] += fast.socket.recv_multipart()[0] == b"MESSAGE"

        reader = threading.Thread(target=drain_fast)
        reader.start()
        for i in range(count):
            confirm = i % 50 == 49
            pub.send("PUT", "TOPIC", "flood", *(("ID", str(i)) if confirm else ()), "", body)
            if confirm:  # pace the publisher by the broker, not by the slow peer
                assert pub.recv_skipping_noop() == [b"OK", b"ID", str(i).encode()]
                time.sleep(0.02)  # spread the flood over > slow_consumer_ms
        reader.join(35)
        assert received[0] == count, "the fast subscriber lost messages or was stalled"
        # The slow one was dropped by the broker: once it drains what was queued, its NOOP gets 401.
        slow_messages = 0
        while slow.socket.poll(1000) and slow_messages <= count:
            slow_messages += slow.socket.recv_multipart()[0] == b"MESSAGE"
        slow.send("NOOP", "ID", "still-there?")
        verdict = code_of(slow.recv_skipping_noop())
        assert verdict == 401
        assert slow_messages < count
        for peer in (slow, fast, pub):
            peer.close()


def test_seed_client_speaks_protocol_0_1(raw: Any) -> None:
    old = raw(connect=False)
    old.send("CONNECT", "VERSION", "0.1", "TTL", "1000")  # the seed's own example; no ID, so no answer
    old.send("SUB", "", "topic1")
    old.send("NOOP", "ID", "sync")
    assert old.recv() == [b"OK", b"ID", b"sync"]
    pub = raw()
    pub.send("PUT", "TOPIC", "topic1", "ID", "1", "", "body")
    pub.recv()
    assert old.recv_skipping_noop() == [b"MESSAGE", b"TOPIC", b"topic1", b"", b"body"]
    old.send("PING", "ID", "p")
    assert code_of(old.recv_skipping_noop()) == 400


def test_sigterm_disconnects_peers_and_exits_zero(zctx: zmq.Context[Any]) -> None:
    broker = BrokerProcess(insecure=True).start()
    peer = RawPeer(broker.endpoint, zctx)
    peer.connect()
    assert broker.stop() == 0
    assert peer.recv_skipping_noop(5) == [b"DISCONNECT"]
    peer.close()


def test_large_bodies_fan_out_intact_to_every_subscriber(raw: Any) -> None:
    subs = [raw() for _ in range(4)]
    for peer in subs:
        peer.send("SUB", "ID", "s", "", "big")
        assert peer.recv() == [b"OK", b"ID", b"s"]
    body = bytes(range(256)) * 400  # 100 KiB: sent as shared frames
    pub = raw()
    for i in range(3):
        pub.send("PUT", "TOPIC", "big", "ID", str(i), "", body, b"tail")
        assert pub.recv() == [b"OK", b"ID", str(i).encode()]
    for peer in subs:
        for _ in range(3):
            assert payload_of(peer.recv_skipping_noop()) == [body, b"tail"]


def test_broker_process_start_is_idempotent_so_with_start_does_not_leak_a_broker() -> None:
    process = BrokerProcess(insecure=True).start()
    try:
        pid = process.proc.pid if process.proc else None
        with process.start() as same:  # the pattern `with setup.start() as broker` in the fixtures
            assert same.proc is not None and same.proc.pid == pid
        assert process.proc is not None and process.proc.poll() is not None
    finally:
        process.kill()


@pytest.mark.long
@pytest.mark.timeout(120)
def test_a_new_connection_on_the_fd_of_a_killed_one_is_not_ended_by_that_close(broker: BrokerProcess) -> None:
    """libzmq reuses a closed connection's fd number; the close, reported late, must not end the new session."""
    import subprocess
    import sys

    import mc0

    # Each child is a bare DEALER with a session (CONNECT answered), killed with no DISCONNECT; pyzmq
    # alone starts in a fraction of the time mc0's client takes, and the broker sees the same peer.
    child = (
        "import sys, time, zmq\n"
        "s = zmq.Context().socket(zmq.DEALER)\n"
        "s.connect(sys.argv[1])\n"
        "s.send_multipart([b'CONNECT', b'VERSION', b'1.0', b'TTL', b'60000', b'ID', b'c'])\n"
        "assert s.poll(10000) and s.recv_multipart()[0] == b'OK'\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    reset = 0
    for _ in range(15):
        kids = [
            subprocess.Popen([sys.executable, "-c", child, broker.endpoint], stdout=subprocess.PIPE, text=True)
            for _ in range(4)
        ]
        try:
            for kid in kids:
                assert kid.stdout is not None and kid.stdout.readline() == "up\n"
        finally:
            for kid in kids:
                kid.kill()  # no DISCONNECT: the broker learns of it from the socket monitor
        with mc0.Client(broker.endpoint) as client:
            for _ in range(5):
                try:
                    client.ping(timeout=2)
                except mc0.NotConnected:
                    reset += 1
                time.sleep(0.02)
            reset += client.reconnects
        for kid in kids:
            kid.wait(10)
            assert kid.stdout is not None
            kid.stdout.close()
    assert reset == 0


# ------------------------------------------------------------ an idle loop sleeps
IDLE_WINDOW_S = 3.0
# An idle broker's loop wakes at most once a second (its poll timeout) and its HTTP thread sleeps in
# accept: ~0.00 s of CPU per window.  A loop spinning on an undrained wake pipe burns a whole core,
# and still gets at least a sixth of one beside a CPU hog per core and other load (0.5 s a window):
# the bound lies between, with room both ways.
IDLE_CPU_BOUND_S = 0.25


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _idle_cpu(process: psutil.Process) -> float:
    """CPU seconds the broker process used in one idle window."""
    before = _cpu_seconds(process)
    time.sleep(IDLE_WINDOW_S)  # measuring a window of idleness: nothing to poll for
    return _cpu_seconds(process) - before


def _varz(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + "/varz", timeout=10) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


@pytest.mark.timeout(60)
@pytest.mark.parametrize("wake", ["http", "sighup"])
def test_an_idle_broker_sleeps_after_a_wake_up(wake: str) -> None:
    """A wake-up (an HTTP request wanting a snapshot, a SIGHUP asking a reload) is read off the
    loop's wake pipe: the broker sleeps again after it (Broker.run; pyzmq reports a plain socket
    by its fd, never as the object registered)."""
    port = ports.free_port()
    base = f"http://127.0.0.1:{port}"
    with BrokerProcess("--http", f"127.0.0.1:{port}", insecure=True) as broker:
        assert broker.proc is not None
        process = psutil.Process(broker.proc.pid)
        before = _idle_cpu(process)
        if wake == "http":
            assert _varz(base)["counters"].get("reloads", 0) == 0
        else:
            broker.signal(signal.SIGHUP)  # handled at once: the signal interrupts the loop's poll
        after = [_idle_cpu(process) for _ in range(2)]
        # (asked after the windows: a GET before them would wake the loop as well)
        assert _varz(base)["counters"].get("reloads", 0) == (1 if wake == "sighup" else 0)
        assert max(after) < IDLE_CPU_BOUND_S, (wake, before, after)
