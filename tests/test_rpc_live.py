"""Service requests against a real broker: in-process workers for behaviour, processes to kill."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0.process import BrokerProcess

from .conftest import headers_of, payload_of

ROOT = Path(__file__).parent.parent


class WorkerProcess:
    """``mc0 serve tests.handlers:NAME`` as a child process, ready once it printed its line."""

    def __init__(self, endpoint: str, handler: str, *services: str, ttl: float = 0.1, capacity: int = 1) -> None:
        command = [sys.executable, "-m", "mc0", "serve", f"tests.handlers:{handler}", "--endpoint", endpoint]
        command += ["--ttl", str(ttl), "--capacity", str(capacity)]
        for service in services:
            command += ["--service", service]
        self.proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded by the test timeout
        assert line.startswith("mc0 worker serving"), line + (self.proc.stderr.read() if self.proc.poll() else "")

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def fast_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker that notices a dead worker within ~0.3 s (TTL 100 ms, liveness 3)."""
    config = tmp_path / "mc0.toml"
    config.write_text("[broker]\nmin_ttl_ms = 50\n")
    with BrokerProcess(config=str(config), insecure=True) as broker:
        yield broker


async def start_worker(api: Any, endpoint: str, services: dict[str, Any], capacity: int = 1, **kw: Any) -> Any:
    worker = (mc0.Worker if api.name == "sync" else mc0.aio.Worker)(endpoint, capacity=capacity, **kw)
    for name, handler in services.items():
        worker.service(name)(handler)
    await api(worker.connect())
    return worker


# ------------------------------------------------------------------ behaviour, both APIs


@pytest.mark.asyncio
async def test_lru_spreads_requests_over_workers(api: Any, broker: BrokerProcess) -> None:
    workers = []
    for i in range(3):
        workers.append(await start_worker(api, broker.endpoint, {"who": lambda r, i=i: str(i).encode()}))
    client = await api(api.Client(broker.endpoint).connect())
    answers = Counter()
    for _ in range(9):
        answers[(await api(client.request("who", timeout=5))).body] += 1
    assert answers == {b"0": 3, b"1": 3, b"2": 3}
    for w in (*workers, client):
        await api(w.close())


@pytest.mark.asyncio
async def test_capacity_above_one_runs_requests_concurrently(api: Any, broker: BrokerProcess) -> None:
    running, peak, lock = [0], [0], threading.Lock()

    def slow(request: mc0.Request) -> bytes:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.3)
        with lock:
            running[0] -= 1
        return b"ok"

    worker = await start_worker(api, broker.endpoint, {"slow": slow}, capacity=3)
    client = await api(api.Client(broker.endpoint).connect())
    started = time.monotonic()
    if api.name == "sync":
        futures = [client.submit("slow", timeout=10) for _ in range(6)]
        replies = [f.result(15) for f in futures]
    else:
        replies = await asyncio.gather(*[client.submit("slow", timeout=10) for _ in range(6)])
    assert [r.body for r in replies] == [b"ok"] * 6
    assert peak[0] == 3
    assert time.monotonic() - started < 1.5  # two rounds of 0.3 s, not six
    await api(worker.close())
    await api(client.close())


@pytest.mark.asyncio
async def test_one_worker_serves_several_services(api: Any, broker: BrokerProcess) -> None:
    worker = await start_worker(api, broker.endpoint, {"a": lambda r: b"A", "b": lambda r: b"B"})
    client = await api(api.Client(broker.endpoint).connect())
    assert (await api(client.request("a"))).body == b"A"
    assert (await api(client.request("b"))).body == b"B"
    await api(worker.close())
    await api(client.close())


@pytest.mark.asyncio
async def test_add_service_registers_as_the_decorator_does_and_only_before_connect(
    api: Any, broker: BrokerProcess
) -> None:
    worker = (mc0.Worker if api.name == "sync" else mc0.aio.Worker)(broker.endpoint)
    worker.add_service("plain", lambda r: b"added " + r.body)
    await api(worker.connect())
    client = await api(api.Client(broker.endpoint).connect())
    assert (await api(client.request("plain", b"x", timeout=5))).body == b"added x"
    with pytest.raises(RuntimeError, match="before connect"):
        worker.add_service("late", lambda r: b"")
    await api(worker.close())
    await api(client.close())


@pytest.mark.asyncio
async def test_a_worker_can_make_requests_itself(api: Any, broker: BrokerProcess) -> None:
    back = await start_worker(api, broker.endpoint, {"db": lambda r: b"row for " + r.caller.encode()})
    front_holder: list[Any] = []

    if api.name == "sync":

        def page(request: mc0.Request) -> bytes:
            return b"page(" + front_holder[0].request("db", timeout=5).body + b")"
    else:

        async def page(request: mc0.Request) -> bytes:  # type: ignore[misc]
            return b"page(" + (await front_holder[0].request("db", timeout=5)).body + b")"

    front = await start_worker(api, broker.endpoint, {"api": page})
    front_holder.append(front)
    client = await api(api.Client(broker.endpoint).connect())
    assert (await api(client.request("api", timeout=5))).body == b"page(row for anonymous)"
    for w in (back, front, client):
        await api(w.close())


@pytest.mark.asyncio
async def test_hundred_outstanding_requests_from_one_client_all_answered(api: Any, broker: BrokerProcess) -> None:
    worker = await start_worker(api, broker.endpoint, {"echo": lambda r: r.body}, capacity=4)
    client = await api(api.Client(broker.endpoint).connect())
    if api.name == "sync":
        futures = [client.submit("echo", str(i), timeout=10) for i in range(100)]
        replies = [f.result(20) for f in futures]
    else:
        replies = await asyncio.gather(*[client.submit("echo", str(i), timeout=10) for i in range(100)])
    assert [r.body for r in replies] == [str(i).encode() for i in range(100)]
    await api(worker.close())
    await api(client.close())


@pytest.mark.asyncio
async def test_partials_stream_in_order_and_headers_echo(api: Any, broker: BrokerProcess) -> None:
    def chunks(request: mc0.Request) -> Any:
        for i in range(20):
            yield f"{i}"
        return "end"

    def own(request: mc0.Request) -> mc0.Reply:
        return mc0.Reply((b"x",), {"X-Mine": "1"})

    worker = await start_worker(api, broker.endpoint, {"chunks": chunks, "own": own}, capacity=2)
    client = await api(api.Client(broker.endpoint).connect())
    stream = await api(client.stream("chunks", headers={"X-Trace": "t-9"}))
    if api.name == "sync":
        replies = list(stream)
    else:
        replies = [r async for r in stream]
    assert [r.body for r in replies] == [str(i).encode() for i in range(20)] + [b"end"]
    assert [r.final for r in replies] == [False] * 20 + [True]
    assert all(r.headers == {"X-Trace": "t-9"} for r in replies)
    reply = await api(client.request("own", headers={"X-Trace": "t"}))
    assert reply.headers == {"X-Mine": "1"}
    await api(worker.close())
    await api(client.close())


@pytest.mark.asyncio
async def test_no_worker_is_503_at_once(api: Any, broker: BrokerProcess) -> None:
    client = await api(api.Client(broker.endpoint).connect())
    started = time.monotonic()
    with pytest.raises(mc0.NoResponders) as info:
        await api(client.request("nobody.home", timeout=10))
    assert info.value.code == 503 and time.monotonic() - started < 1
    await api(client.close())


@pytest.mark.asyncio
async def test_deadline_gives_504_and_the_worker_is_cancelled(api: Any, broker: BrokerProcess) -> None:
    cancelled = asyncio.Event() if api.name == "async" else threading.Event()

    async def forever(request: mc0.Request) -> bytes:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b"never"

    worker = await start_worker(api, broker.endpoint, {"forever": forever})
    client = await api(api.Client(broker.endpoint).connect())
    started = time.monotonic()
    with pytest.raises(mc0.DeadlineExceeded) as info:
        await api(client.request("forever", timeout=0.3))
    assert info.value.code == 504 and 0.25 < time.monotonic() - started < 2
    for _ in range(50):
        if cancelled.is_set():
            break
        await asyncio.sleep(0.05)
    assert cancelled.is_set(), "the handler was not cancelled"
    await api(worker.close())
    await api(client.close())


@pytest.mark.asyncio
async def test_cancel_gives_499(api: Any, broker: BrokerProcess) -> None:
    async def slow(request: mc0.Request) -> bytes:
        await asyncio.sleep(60)
        return b""

    worker = await start_worker(api, broker.endpoint, {"slow": slow})
    client = await api(api.Client(broker.endpoint).connect())
    stream = await api(client.stream("slow", timeout=30))
    await api(stream.cancel())
    with pytest.raises(mc0.Cancelled) as info:
        if api.name == "sync":
            next(iter(stream))
        else:
            await stream.__anext__()
    assert info.value.code == 499
    await api(worker.close())
    await api(client.close())


@pytest.mark.asyncio
async def test_handler_exception_is_500(api: Any, broker: BrokerProcess) -> None:
    def boom(request: mc0.Request) -> bytes:
        raise KeyError("missing thing")

    worker = await start_worker(api, broker.endpoint, {"boom": boom})
    client = await api(api.Client(broker.endpoint).connect())
    with pytest.raises(mc0.HandlerFailed) as info:
        await api(client.request("boom"))
    assert info.value.code == 500 and "KeyError" in info.value.reason and "missing thing" in info.value.reason
    await api(worker.close())
    await api(client.close())


@pytest.mark.asyncio
async def test_worker_heals_after_broker_restart(api: Any) -> None:
    first = BrokerProcess(insecure=True).start()
    endpoint = first.endpoint
    worker = await start_worker(api, endpoint, {"svc": lambda r: b"alive"}, ttl=0.2, timeout=3)
    first.kill()
    with BrokerProcess(bind=(endpoint,), insecure=True) as second:
        client = await api(api.Client(second.endpoint, timeout=3).connect())
        reply = None
        for _ in range(50):  # bounded: the worker re-registers within about one TTL
            try:
                reply = await api(client.request("svc", timeout=2))
                break
            except mc0.NoResponders:
                await asyncio.sleep(0.1)
        assert reply is not None and reply.body == b"alive"
        await api(client.close())
        await api(worker.close())
    first.kill()


# ------------------------------------------------------------------ the wire, raw peers


def test_duplicate_request_id_is_409_and_forged_final_is_dropped(raw: Any) -> None:
    worker, client, forger = raw(), raw(), raw()
    worker.send("READY", "ID", "r", "", "svc")
    assert worker.recv() == [b"OK", b"ID", b"r"]
    forger.send("READY", "ID", "r", "", "svc")
    assert forger.recv() == [b"OK", b"ID", b"r"]
    client.send("REQUEST", "SERVICE", "svc", "ID", "q1", "", "body")
    job = forger.recv_skipping_noop()  # the forger registered last: it gets the first request
    client.send("REQUEST", "SERVICE", "svc", "ID", "q1", "", "body")
    reply = client.recv_skipping_noop()
    assert headers_of(reply)["CODE"] == "409" and headers_of(reply)["ID"] == "q1"
    bid = headers_of(job)["ID"]
    worker.send("FINAL", "ID", bid, "", "forged")  # a worker answering a request it was not given
    worker.send("FINAL", "ID", "999999", "", "invented")
    assert client.nothing(0.3)
    forger.send("FINAL", "ID", bid, "", "real")
    final = client.recv_skipping_noop()
    assert final[0] == b"FINAL" and payload_of(final) == [b"real"]


def test_a_worker_that_answers_and_closes_at_once_still_has_its_final_delivered(raw: Any) -> None:
    # libzmq reports the close while the FINAL may still wait in the broker's queue:
    # the session must outlive what its connection sent (once seen as a 504 under load).
    client = raw()
    for round_no in range(30):
        worker = raw()
        worker.send("READY", "ID", "r", "", "svc")
        assert worker.recv() == [b"OK", b"ID", b"r"]
        client.send("REQUEST", "SERVICE", "svc", "ID", f"q{round_no}", "TIMEOUT", "3000", "", "body")
        job = worker.recv_skipping_noop()
        worker.send("FINAL", "ID", headers_of(job)["ID"], "", f"answer {round_no}")
        worker.socket.close(linger=1000)  # no DISCONNECT: gone right after its answer
        final = client.recv_skipping_noop()
        assert final[0] == b"FINAL" and headers_of(final)["ID"] == f"q{round_no}", final
        assert payload_of(final) == [f"answer {round_no}".encode()]


# ------------------------------------------------------------------ dying and frozen workers


def test_sigkilled_worker_with_a_spare_gives_exactly_one_final_20_times(
    fast_broker: BrokerProcess, tmp_path: Path
) -> None:
    spare = WorkerProcess(fast_broker.endpoint, "answer", "job")
    client = mc0.Client(fast_broker.endpoint).connect()
    try:
        for attempt in range(20):
            victim = WorkerProcess(fast_broker.endpoint, "hold", "job")  # fresh: least recently used
            marker = tmp_path / f"got-{attempt}"
            try:
                stream = client.stream("job", str(marker), timeout=10)
                for _ in range(500):  # bounded (10 s, the request's timeout): until the victim holds it
                    if marker.exists():
                        break
                    time.sleep(0.02)
                assert marker.read_text() == str(victim.proc.pid)
                victim.kill()
                replies = list(stream)
                assert [r.final for r in replies] == [True]
                assert replies[0].body == f"answered by {spare.proc.pid}".encode()
            finally:
                victim.close()
    finally:
        client.close()
        spare.close()


def test_worker_killed_after_a_partial_gives_502(fast_broker: BrokerProcess, tmp_path: Path) -> None:
    spare = WorkerProcess(fast_broker.endpoint, "answer", "job")
    victim = WorkerProcess(fast_broker.endpoint, "partial_then_hold", "job")
    marker = tmp_path / "got"
    try:
        with mc0.Client(fast_broker.endpoint) as client:
            stream = client.stream("job", str(marker), timeout=10)
            first = next(iter(stream))
            assert (first.body, first.final) == (b"first half", False)
            victim.kill()
            with pytest.raises(mc0.WorkerLost) as info:
                next(iter(stream))
            assert info.value.code == 502
    finally:
        victim.close()
        spare.close()


def test_scatter_over_three_workers_with_one_frozen(fast_broker: BrokerProcess) -> None:
    workers = [WorkerProcess(fast_broker.endpoint, "whoami", "fleet", ttl=5.0) for _ in range(3)]
    frozen = workers[1]
    frozen.signal(signal.SIGSTOP)
    try:
        with mc0.Client(fast_broker.endpoint) as client:
            stream = client.scatter("fleet", timeout=1.0)
            replies = list(stream)
            assert (stream.count, stream.missing) == (2, 1)
            pids = {int(r.body) for r in replies}
            assert pids == {w.proc.pid for w in workers} - {frozen.proc.pid}
            assert all(r.worker and r.worker.startswith("anonymous#") for r in replies)
    finally:
        frozen.signal(signal.SIGCONT)
        for worker in workers:
            worker.close()


# ------------------------------------------------------------------ Majordomo interop


def test_majortomo_client_calls_an_mc0_worker(broker: BrokerProcess) -> None:
    from majortomo import Client as MdpClient

    worker = mc0.Worker(broker.endpoint)
    worker.service("upper")(lambda r: [r.body.upper(), b"second frame"])
    with worker:
        with MdpClient(broker.endpoint) as mdp_client:
            mdp_client.send(b"upper", b"hello from majortomo")
            frames = mdp_client.recv_all_as_list(timeout=5)
            assert frames == [b"upper", b"HELLO FROM MAJORTOMO", b"second frame"]
            mdp_client.send(b"mmi.service", b"upper")
            assert mdp_client.recv_all_as_list(timeout=5) == [b"mmi.service", b"200"]
            mdp_client.send(b"nobody", b"x")
            assert mdp_client.recv_all_as_list(timeout=5) == [b"nobody", b"ERROR", b"503", b"no worker for nobody"]


def test_mc0_client_calls_a_majortomo_worker(broker: BrokerProcess) -> None:
    from majortomo import Worker as MdpWorker

    def serve(requests: int) -> None:
        # Exactly as many requests as the test makes: a stop flag raced the last one (the
        # worker could leave before it came, and the request then waited out its deadline).
        with MdpWorker(broker.endpoint, b"reverse") as mdp_worker:
            for _ in range(requests):
                client_token, frames = mdp_worker.wait_for_request()
                mdp_worker.send_reply_partial(client_token, [b"working"])
                mdp_worker.send_reply_final(client_token, [frames[0][::-1]])

    thread = threading.Thread(target=serve, args=(2,), daemon=True)
    thread.start()
    with mc0.Client(broker.endpoint) as client:
        replies: list[mc0.Reply] = []
        for _ in range(50):  # bounded wait for the MDP worker's READY
            try:
                stream = client.stream("reverse", b"olleh", timeout=5)
                replies = list(stream)
                break
            except mc0.NoResponders:
                time.sleep(0.1)
        assert [(r.body, r.final) for r in replies] == [(b"working", False), (b"hello", True)]
        assert client.request("reverse", b"xy", timeout=5).body == b"yx"  # the worker's second and last
    thread.join(5)
    assert not thread.is_alive()
