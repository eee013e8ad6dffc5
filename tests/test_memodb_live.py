"""MemoDB (seed 003) against real broker processes: peers written from the seed text (raw pynng Req0
sockets, one nng_ctx per client or worker, cbor2 headers), not mc0's client.  Cross-dialect calls
both ways, many peers multiplexed over one NNG socket, the JOB timeout, DISCONNECT after a broker
restart, a malformed table after which everyone is still answered, and --check-config."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0 import ports
from mc0 import protocol as P
from mc0.process import BrokerProcess

from .conftest import require

cbor2 = require("cbor2")  # the memodb extra (never a skip: a missing one fails naming its install)
pynng = require("pynng")

READY, JOB, RESULT, HEARTBEAT, DISCONNECT = 1, 2, 3, 4, 5


def msg(kind: int, wid: bytes, *fields: object, payload: bytes = b"") -> bytes:
    return cbor2.dumps(["memo01", kind, wid, *fields], canonical=True) + payload


def split(data: bytes) -> tuple[list[Any], bytes]:
    head = cbor2.loads(data)
    return head, data[len(cbor2.dumps(head, canonical=True)) :]


def free_port() -> int:
    return ports.free_port()  # leased below the ephemeral range: no other process takes it meanwhile


class Memo:
    """One NNG req0 socket (one connection to the broker) on which peers open their own contexts."""

    def __init__(self, address: str, timeout_ms: int = 5000) -> None:
        self.socket = pynng.Req0(recv_timeout=timeout_ms, send_timeout=timeout_ms)
        self.socket.dial(address, block=False)  # NNG redials by itself (a broker restart)
        self.contexts: list[Any] = []

    def context(self) -> Any:
        ctx = self.socket.new_context()
        self.contexts.append(ctx)
        return ctx

    def ask(self, ctx: Any, data: bytes) -> tuple[list[Any], bytes]:
        ctx.send(data)
        return split(ctx.recv())

    def close(self) -> None:
        for ctx in self.contexts:
            ctx.close()
        self.socket.close()


def memo_worker(
    memo: Memo, services: list[str], handler: Callable[[str, bytes], bytes], jobs: int
) -> Callable[[], None]:
    """A worker from the seed text: READY, then JOB -> RESULT, HEARTBEAT -> HEARTBEAT, DISCONNECT -> READY."""

    def run() -> None:
        ctx = memo.context()
        head, payload = memo.ask(ctx, msg(READY, b"", services))
        done = 0
        for _ in range(200):  # bounded: heartbeats, jobs and reconnects
            kind, wid = head[1], head[2]
            if kind == JOB:
                done += 1
                last = done == jobs
                head, payload = memo.ask(
                    ctx, msg(RESULT, wid, *([True] if last else []), payload=handler(head[3], payload))
                )
                if last:
                    assert head[1] == DISCONNECT
                    return
            elif kind == HEARTBEAT:
                head, payload = memo.ask(ctx, msg(HEARTBEAT, wid))
            else:
                assert kind == DISCONNECT
                head, payload = memo.ask(ctx, msg(READY, b"", services))
        raise AssertionError("worker loop bound reached")

    return run


def start(target: Callable[[], None]) -> threading.Thread:
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)
            raise

    thread = threading.Thread(target=guarded, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def joined(*threads: threading.Thread, timeout: float = 20) -> None:
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a MemoDB peer thread did not finish"
        assert not thread.errors, thread.errors  # type: ignore[attr-defined]


def config(tmp_path: Path, port: int, extra: str = "") -> str:
    path = tmp_path / "mc0.toml"
    path.write_text(
        f'[memodb]\nenabled = true\nlisten = "tcp://127.0.0.1:{port}"\nheartbeat_ms = 300\n'
        # The tests' mc0 clients read the peers report: peer telemetry is granted by name.
        '[permissions.default]\nsubscribe = [">", "mc0.sys.>"]\n'
        f"[permissions.identity.memodb]\n{extra}"
    )
    return str(path)


@pytest.fixture
def memodb(tmp_path: Path) -> Iterator[tuple[BrokerProcess, str]]:
    port = free_port()
    with BrokerProcess(config=config(tmp_path, port), insecure=True) as broker:
        yield broker, f"tcp://127.0.0.1:{port}"


def _wait_served(client: mc0.Client, service: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # bounded: poll the broker's MMI until the worker registered
        if client.request(P.MMI_SERVICE, service.encode(), timeout=2).body == b"200":
            return
        time.sleep(0.02)
    raise AssertionError(f"{service} never served")


def test_memodb_client_calls_an_mc0_worker_and_an_mc0_client_a_memodb_worker(memodb: tuple[BrokerProcess, str]) -> None:
    broker, address = memodb
    memo = Memo(address)
    worker = mc0.Worker(broker.endpoint)
    worker.service("mc0-rev")(lambda r: r.body[::-1])
    thread = start(memo_worker(memo, ["memo-upper"], lambda service, data: data.upper(), jobs=2))
    try:
        with worker, mc0.Client(broker.endpoint) as client:
            _wait_served(client, "mc0-rev")
            head, payload = memo.ask(memo.context(), msg(JOB, b"", "mc0-rev", 5000, payload=b"memodb"))
            assert head == ["memo01", RESULT, b""] and payload == b"bdomem"
            _wait_served(client, "memo-upper")
            assert client.request("memo-upper", b"from mc0", timeout=5).body == b"FROM MC0"
            peers = json.loads(client.request(P.BROKER_SERVICE, b'{"op":"peers"}', timeout=5).body)
            assert "memodb-worker" in {p["kind"] for p in peers}
            assert client.request("memo-upper", b"last", timeout=5).body == b"LAST"  # its 2nd: RESULT disconnecting
        joined(thread)
    finally:
        memo.close()


def test_several_clients_and_workers_multiplexed_over_one_nng_socket(memodb: tuple[BrokerProcess, str]) -> None:
    broker, address = memodb
    memo = Memo(address)  # one connection: every peer below is a context on it
    workers = [start(memo_worker(memo, ["mux"], lambda s, d, i=i: b"w%d:" % i + d, jobs=3)) for i in range(2)]
    answers: dict[int, bytes] = {}

    def client(n: int) -> Callable[[], None]:
        def run() -> None:
            ctx = memo.context()
            for k in range(2):
                head, payload = memo.ask(ctx, msg(JOB, b"", "mux", 5000, payload=b"%d-%d" % (n, k)))
                assert head[1] == RESULT
                answers[n * 10 + k] = payload

        return run

    try:
        with mc0.Client(broker.endpoint) as mc0_client:
            _wait_served(mc0_client, "mux")
            clients = [start(client(n)) for n in range(3)]
            joined(*clients, *workers)
        assert sorted(p.split(b":")[1] for p in answers.values()) == sorted(
            b"%d-%d" % (n, k) for n in range(3) for k in range(2)
        )
        assert {p.split(b":")[0] for p in answers.values()} == {b"w0", b"w1"}  # both workers served
    finally:
        memo.close()


def test_job_timeout_gives_up_on_the_worker_and_its_late_result_is_disconnected(
    memodb: tuple[BrokerProcess, str],
) -> None:
    broker, address = memodb
    memo = Memo(address, timeout_ms=1500)  # the drop comes at 300 ms; no answer by 1.5 s is none
    try:
        worker_ctx, client_ctx = memo.context(), memo.context()
        worker_ctx.send(msg(READY, b"", ["slow"]))
        with mc0.Client(broker.endpoint) as client:
            _wait_served(client, "slow")
        started = time.monotonic()
        client_ctx.send(msg(JOB, b"", "slow", 300, payload=b"q"))
        head, _ = split(worker_ctx.recv())
        assert head[1] == JOB and head[3] == "slow" and 0 < head[4] <= 300
        with pytest.raises(pynng.Timeout):  # the broker drops the client at the timeout
            client_ctx.recv()
        assert time.monotonic() - started >= 0.3
        worker_ctx.send(msg(RESULT, head[2], payload=b"too late"))
        assert split(worker_ctx.recv())[0] == ["memo01", DISCONNECT, head[2]]
    finally:
        memo.close()


def test_a_worker_gets_disconnect_after_a_broker_restart_and_comes_back(tmp_path: Path) -> None:
    port = free_port()
    path = config(tmp_path, port)
    memo = Memo(f"tcp://127.0.0.1:{port}", timeout_ms=3000)
    try:
        with BrokerProcess(config=path, insecure=True) as first:
            ctx = memo.context()
            ctx.send(msg(READY, b"", ["again"]))
            head, _ = split(ctx.recv())  # a HEARTBEAT after the interval (300 ms)
            assert head[1] == HEARTBEAT
            wid = head[2]
        assert first.proc is not None and first.proc.poll() is not None
        with BrokerProcess(config=path, insecure=True) as second:
            deadline = time.monotonic() + 10
            while True:  # bounded: NNG redials the new broker; a request sent meanwhile times out
                try:
                    head, _ = memo.ask(ctx, msg(HEARTBEAT, wid))
                    break
                except pynng.Timeout:
                    assert time.monotonic() < deadline, "the restarted broker never answered"
            assert head == ["memo01", DISCONNECT, wid]  # out of sync: the new broker does not know it
            head, _ = memo.ask(ctx, msg(READY, b"", ["again"]))
            assert head[1] == HEARTBEAT and head[2] != wid
            with mc0.Client(second.endpoint) as client:
                _wait_served(client, "again")
    finally:
        memo.close()


MALFORMED: list[tuple[str, bytes, str]] = [
    ("empty", b"", "disconnect"),
    ("not CBOR", b"\xff\xfe", "disconnect"),
    ("a map", cbor2.dumps({"a": 1}), "disconnect"),
    ("short array", cbor2.dumps(["memo01", 1]), "disconnect"),
    ("wrong version", cbor2.dumps(["memo02", READY, b"", ["s"]]), "disconnect"),
    ("wrong version JOB", cbor2.dumps(["memo00", JOB, b"", "s", 100]), "drop"),
    ("unknown type", msg(42, b""), "disconnect"),
    ("type as text", cbor2.dumps(["memo01", "JOB", b"", "s", 100]), "disconnect"),
    ("ID as text", cbor2.dumps(["memo01", HEARTBEAT, "x"]), "disconnect"),
    ("READY services a string", msg(READY, b"", "svc"), "disconnect"),
    ("READY 65 services", msg(READY, b"", [f"s{i}" for i in range(65)]), "disconnect"),
    ("READY reserved service", msg(READY, b"", ["mc0.broker"]), "disconnect"),
    ("huge array claimed", b"\x9b" + b"\xff" * 8, "disconnect"),
    ("deep nesting", b"\x81" * 1000, "disconnect"),
    ("a tag", cbor2.dumps(["memo01", READY, b"", [cbor2.CBORTag(35, "(a+)+$")]]), "disconnect"),
    ("JOB timeout text", msg(JOB, b"", "s", "100"), "drop"),
    ("JOB timeout zero", msg(JOB, b"", "s", 0), "drop"),
    ("JOB service bad", msg(JOB, b"", "a b", 100), "drop"),
    ("JOB no worker", msg(JOB, b"", "nobody-serves-this", 100), "drop"),
    ("RESULT unknown ID", msg(RESULT, b"nobody"), "disconnect"),
    ("HEARTBEAT unknown ID", msg(HEARTBEAT, b"\x00" * 16), "disconnect"),
    ("DISCONNECT from a peer", msg(DISCONNECT, b""), "disconnect"),
]


def test_malformed_table_gets_the_seeds_reactions_and_everyone_is_still_answered(
    memodb: tuple[BrokerProcess, str],
) -> None:
    broker, address = memodb
    memo = Memo(address, timeout_ms=3000)
    bad = Memo(address, timeout_ms=500)  # a dropped request: no answer within this (the others come at once)
    thread = start(memo_worker(memo, ["still"], lambda s, d: b"ok " + d, jobs=len(MALFORMED)))
    try:
        with mc0.Client(broker.endpoint) as client:
            _wait_served(client, "still")
            for case, data, reaction in MALFORMED:
                ctx = bad.context()
                ctx.send(data)
                if reaction == "drop":
                    with pytest.raises(pynng.Timeout):
                        ctx.recv()
                else:
                    head, _ = split(ctx.recv())
                    assert head[:2] == ["memo01", DISCONNECT], case
                # Everyone is still answered: mc0, and a MemoDB client through the MemoDB worker
                # (whose last RESULT says it is disconnecting).
                assert client.request(P.MMI_SERVICE, b"still", timeout=2).body == b"200"
                head, payload = memo.ask(memo.context(), msg(JOB, b"", "still", 3000, payload=case.encode()))
                assert payload == b"ok " + case.encode(), case
            stats = json.loads(client.request(P.BROKER_SERVICE, b'{"op":"stats"}', timeout=5).body)
            assert stats["counters"]["memodb_malformed"] >= 10, stats["counters"]
        joined(thread)
    finally:
        bad.close()
        memo.close()


def test_parked_workers_never_hold_up_a_clients_job(tmp_path: Path) -> None:
    """max_workers (1,024) anonymous workers park (READY, never a job for them) with the default
    max_pending (256) NNG contexts: a good client's JOB is still answered at once (it took 2-4 s
    when parked workers held every context until their next heartbeat)."""
    port = free_port()
    path = tmp_path / "mc0.toml"
    path.write_text(  # max_pending, max_workers and heartbeat_ms: the defaults
        f'[memodb]\nenabled = true\nlisten = "tcp://127.0.0.1:{port}"\n'
        '[permissions.default]\nsubscribe = [">", "mc0.sys.>"]\n'
        '[permissions.identity.memodb]\nserve = ["park.>"]\ncall = ["good"]\n'
    )
    address = f"tcp://127.0.0.1:{port}"
    parkers = [Memo(address) for _ in range(4)]
    good = Memo(address, timeout_ms=10_000)
    try:
        with BrokerProcess(config=str(path), insecure=True) as broker, mc0.Client(broker.endpoint) as client:
            worker = mc0.Worker(broker.endpoint)
            worker.service("good")(lambda r: b"good " + r.body)
            with worker:
                _wait_served(client, "good")
                for i in range(1024):
                    parkers[i % 4].context().send(msg(READY, b"", [f"park.{i}"]))

                def parked(at_least: int) -> None:
                    deadline = time.monotonic() + 20
                    while True:  # bounded: until the broker holds them parked (their heartbeat is 5 s off)
                        peers = json.loads(client.request(P.BROKER_SERVICE, b'{"op":"peers"}', timeout=5).body)
                        if sum(p["kind"] == "memodb-worker" for p in peers) >= at_least:
                            return
                        assert time.monotonic() < deadline, f"fewer than {at_least} workers parked"
                        time.sleep(0.05)

                parked(256)  # as many as there are contexts for requests
                for k in range(5):
                    started = time.monotonic()
                    head, payload = good.ask(good.context(), msg(JOB, b"", "good", 5000, payload=b"%d" % k))
                    assert (head, payload) == (["memo01", RESULT, b""], b"good %d" % k)
                    assert time.monotonic() - started < 1.0, f"JOB {k} took {time.monotonic() - started:.1f} s"
                parked(1024)  # parked workers have contexts of their own, up to max_workers
    finally:
        good.close()
        for memo in parkers:
            memo.close()


def test_identity_without_a_grant_may_do_nothing(tmp_path: Path) -> None:
    port = free_port()
    path = tmp_path / "mc0.toml"
    path.write_text(f'[memodb]\nenabled = true\nlisten = "tcp://127.0.0.1:{port}"\n')
    memo = Memo(f"tcp://127.0.0.1:{port}", timeout_ms=800)
    try:
        with BrokerProcess(config=str(path), insecure=True):
            ctx = memo.context()
            deadline = time.monotonic() + 10
            while True:  # bounded: until NNG has connected
                try:
                    head, _ = memo.ask(ctx, msg(READY, b"", ["svc"]))
                    break
                except pynng.Timeout:
                    assert time.monotonic() < deadline
            assert head[1] == DISCONNECT  # serve refused: the identity has no [permissions.identity.memodb]
    finally:
        memo.close()


def test_check_config_reports_memodb_and_refuses_a_bad_address(tmp_path: Path) -> None:
    path = Path(config(tmp_path, 12703))
    run = [sys.executable, "-m", "mc0", "broker", "--insecure", "--check-config", "--config", str(path)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "memodb: NNG rep0 on tcp://127.0.0.1:12703 (on loopback)" in done.stdout
    for bad, said in (
        ('listen = "udp://x:1"', "memodb.listen"),
        ('listen = "tcp://127.0.0.1"', "memodb.listen"),
        ('identity = "anonymous"', "memodb.identity"),
    ):
        path.write_text(f"[memodb]\nenabled = true\n{bad}\n")
        done = subprocess.run(run, capture_output=True, text=True, timeout=30)
        assert done.returncode != 0 and said in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_in_process_oversize_refused_by_nng_foreign_dialects_false_opens_nothing_close_is_idempotent() -> None:
    from mc0.broker.embedded import BrokerThread
    from mc0.broker.server import Broker
    from mc0.config import parse

    port = free_port()
    text = (
        '[broker]\nbind = ["tcp://127.0.0.1:*"]\n[broker.limits]\nmax_message_bytes = 1000\n[security]\ncurve = false\n'
        f'[memodb]\nenabled = true\nlisten = "tcp://127.0.0.1:{port}"\nheartbeat_ms = 200\n'
        "[permissions.identity.memodb]\n"
    )
    with BrokerThread(parse(text)) as thread:
        bridge = thread.broker.nng
        assert bridge is not None and bridge.address == f"tcp://127.0.0.1:{port}"
        memo = Memo(bridge.address, timeout_ms=1000)
        try:
            big = memo.context()
            big.send(msg(JOB, b"", "svc", 100, payload=b"x" * (1000 + 70_000)))  # over max_message_bytes + header room
            with pytest.raises(pynng.Timeout):
                big.recv()
            deadline = time.monotonic() + 10
            while True:  # bounded: NNG closed that connection; it redials, then READY is served
                try:
                    head, _ = memo.ask(memo.context(), msg(READY, b"", ["svc"]))
                    break
                except pynng.Timeout:
                    assert time.monotonic() < deadline
            assert head[1] == HEARTBEAT
            assert bridge.pending == 0  # every request answered: nothing holds a context
        finally:
            memo.close()
    thread.broker.close()  # again: idempotent
    off = Broker(parse(text.replace("[broker]\n", "[broker]\nforeign_dialects = false\n")))
    assert off.nng is None  # foreign_dialects = false refuses MemoDB too: no listener
    off.close()


def test_a_waiting_worker_is_told_disconnect_when_the_broker_stops() -> None:
    from mc0.broker.embedded import BrokerThread
    from mc0.config import parse

    port = free_port()
    text = (
        '[broker]\nbind = ["tcp://127.0.0.1:*"]\n[security]\ncurve = false\n'
        f'[memodb]\nenabled = true\nlisten = "tcp://127.0.0.1:{port}"\nheartbeat_ms = 10000\n'
        "[permissions.identity.memodb]\n"
    )
    memo = Memo(f"tcp://127.0.0.1:{port}", timeout_ms=20_000)  # (a wait for the DISCONNECT: room for a slow box)
    try:
        thread = BrokerThread(parse(text))
        thread.start()
        bridge = thread.broker.nng
        assert bridge is not None
        ctx = memo.context()
        ctx.send(msg(READY, b"", ["parked"]))
        deadline = time.monotonic() + 10
        while bridge.pending != 1:  # bounded: until the READY waits at the broker
            assert time.monotonic() < deadline, "the READY never reached the broker"
            time.sleep(0.01)
        thread.stop()
        head, _ = split(ctx.recv())
        assert head[:2] == ["memo01", DISCONNECT] and len(head[2]) == 16
    finally:
        memo.close()
