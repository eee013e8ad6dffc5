"""Worker.drain() and `mc0 serve` on SIGTERM: no new work, running handlers finish and reply (so
nothing runs twice), then close; past the deadline, or on a second signal, what still runs is
cancelled.  Sync and asyncio APIs, CURVE on and off."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import mc0

from .test_rpc_live import start_worker

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


class Gate:
    """A handler that counts its calls and blocks until released (bounded: 20 s)."""

    def __init__(self) -> None:
        self.started = 0
        self.lock = threading.Lock()
        self.release = threading.Event()

    def __call__(self, request: mc0.Request) -> bytes:
        with self.lock:
            self.started += 1
        self.release.wait(20)
        return b"done " + request.body


def drain_in_background(api: Any, worker: Any, timeout: float) -> asyncio.Future[Any]:
    if api.name == "sync":
        return asyncio.ensure_future(asyncio.to_thread(worker.drain, timeout=timeout))
    return asyncio.ensure_future(worker.drain(timeout=timeout))


async def until(condition: Any, what: str, limit: float = 10) -> None:
    deadline = time.monotonic() + limit
    for _ in range(10_000):  # bounded in count and (below) in time
        if condition():
            return
        assert time.monotonic() < deadline, f"not within {limit} s: {what}"
        await asyncio.sleep(0.01)


async def mc0_aio_runner(value: Any) -> Any:
    return await value


async def workers_of(api: Any, client: Any, service: str) -> int:
    report = json.loads((await api(client.request("mc0.broker", "services", timeout=5))).body)
    return int(report.get(service, {}).get("workers", 0))


async def until_workers(api: Any, client: Any, service: str, count: int, what: str, limit: float = 10) -> None:
    """Poll the broker's services report until ``service`` has ``count`` workers (bounded in time)."""
    deadline = time.monotonic() + limit
    for _ in range(10_000):  # and in count
        if await workers_of(api, client, service) == count:
            return
        assert time.monotonic() < deadline, f"not within {limit} s: {what}"
        await asyncio.sleep(0.01)


async def test_drain_lets_running_handlers_finish_and_takes_no_new_work(api: Any, bus: Any) -> None:
    gate = Gate()
    worker = await start_worker(api, bus.endpoint, {"slow": gate}, capacity=2, **bus.options)
    client = await api(api.Client(bus.endpoint, **bus.options).connect())
    futures = [client.submit("slow", str(i), timeout=20) for i in range(2)]
    await until(lambda: gate.started == 2, "both requests running")
    draining = drain_in_background(api, worker, timeout=15)
    await until_workers(api, client, "slow", 0, "the draining worker still takes work")
    with pytest.raises(mc0.NoResponders):  # nobody serves it now: not queued for the draining worker
        await api(client.request("slow", b"late", timeout=2))
    assert not draining.done() and not worker.closed  # still waiting for its two handlers
    gate.release.set()
    answers = [f.result(10) if api.name == "sync" else await f for f in futures]
    assert [a.body for a in answers] == [b"done 0", b"done 1"]  # replied, not cancelled
    await asyncio.wait_for(draining, 10)
    assert worker.closed and gate.started == 2  # nothing ran twice
    await api(client.close())


async def test_drain_past_its_deadline_cancels_and_says_how_many_were_left(api: Any, bus: Any) -> None:
    gate = Gate()
    worker = await start_worker(api, bus.endpoint, {"stuck": gate}, **bus.options)
    client = await api(api.Client(bus.endpoint, **bus.options).connect())
    future = client.submit("stuck", timeout=3)
    await until(lambda: gate.started == 1, "the request running")
    started = time.monotonic()
    with pytest.raises(mc0.Timeout, match="1 handlers still running"):
        await api(worker.drain(timeout=0.3))
    assert time.monotonic() - started < 5 and worker.closed
    gate.release.set()
    with pytest.raises(mc0.WorkerLost):  # re-queued as after a crash, no worker left: 502 after a second, never a hang
        await (asyncio.wrap_future(future) if api.name == "sync" else future)
    await api(client.close())


async def test_drain_of_an_idle_worker_closes_at_once(api: Any, bus: Any) -> None:
    worker = await start_worker(api, bus.endpoint, {"idle": lambda r: b""}, **bus.options)
    client = await api(api.Client(bus.endpoint, **bus.options).connect())
    assert await workers_of(api, client, "idle") == 1
    await api(worker.drain(timeout=5))
    assert worker.closed
    with pytest.raises(mc0.ClosedError):
        await api(worker.drain(timeout=5))  # local misuse raises
    await api(client.close())


# ---------------------------------------------------------------- `mc0 serve` and signals

HANDLER = """
import pathlib, time
def handle(request):
    pathlib.Path("started-" + request.body.decode()).touch()
    time.sleep(float(request.body.decode().split(":")[1]))
    return b"served " + request.body
"""


def serve(tmp_path: Path, endpoint: str) -> subprocess.Popen[str]:
    (tmp_path / "slowmod.py").write_text(HANDLER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    command = [sys.executable, "-m", "mc0", "serve", "slowmod:handle", "--service", "slowcli",
               "--endpoint", endpoint, "--timeout", "20"]  # fmt: skip
    return subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def test_serve_drains_on_sigterm_and_a_second_signal_cancels(tmp_path: Path, broker: Any) -> None:
    client = await mc0.aio.Client(broker.endpoint).connect()
    worker = serve(tmp_path, broker.endpoint)
    try:
        await until_workers(mc0_aio_runner, client, "slowcli", 1, "the worker registered")
        answer = asyncio.ensure_future(client.request("slowcli", b"a:1.5", timeout=20))
        await until(lambda: (tmp_path / "started-a:1.5").exists(), "the handler running")
        worker.send_signal(signal.SIGTERM)
        assert (await answer).body == b"served a:1.5"  # finished and replied, not cancelled
        assert worker.wait(10) == 0, worker.stderr.read() if worker.stderr else ""
    finally:
        worker.kill()
        worker.wait(5)
    second = serve(tmp_path, broker.endpoint)
    try:
        await until_workers(mc0_aio_runner, client, "slowcli", 1, "the worker registered")
        stuck = asyncio.ensure_future(client.request("slowcli", b"b:30", timeout=6))
        await until(lambda: (tmp_path / "started-b:30").exists(), "the handler running")
        second.send_signal(signal.SIGTERM)
        await until_workers(mc0_aio_runner, client, "slowcli", 0, "the first signal's drain withdrew the worker")
        second.send_signal(signal.SIGTERM)  # sent only now: two pending SIGTERMs would merge into one
        assert second.wait(10) == 1  # did not wait for the 30 s handler
        assert second.stderr is not None
        assert (
            second.stderr.read().strip().splitlines()[-1]
            == "mc0 serve: stopped with 1 handlers still running (cancelled)"
        )
        with pytest.raises(mc0.WorkerLost):  # re-queued as after a crash; no worker: 502 after a second, not a hang
            await stuck
    finally:
        second.kill()
        second.wait(5)
        await client.close()


# Fills stdout's pipe at import: `mc0 serve`'s main thread then blocks on its "serving" line until the
# test reads it, as on a loaded box where the main thread runs late (or under a supervisor that reads
# its output late), while the background loop already serves.
STALLED_STDOUT = """
import fcntl, os
os.write(1, b"#" * fcntl.fcntl(1, fcntl.F_GETPIPE_SZ))
"""


async def test_serve_drains_a_sigterm_sent_before_its_main_thread_announced_it(tmp_path: Path, broker: Any) -> None:
    """A SIGTERM that arrives once the worker is registered drains it, however late `mc0 serve`'s
    main thread runs: the signal handling is in place before the broker may dispatch to it."""
    (tmp_path / "stall.py").write_text(STALLED_STDOUT)
    (tmp_path / "sitecustomize.py").write_text("import stall\n")
    client = await mc0.aio.Client(broker.endpoint).connect()
    worker = serve(tmp_path, broker.endpoint)
    try:
        await until_workers(mc0_aio_runner, client, "slowcli", 1, "the worker registered")
        answer = asyncio.ensure_future(client.request("slowcli", b"a:1.5", timeout=20))
        await until(lambda: (tmp_path / "started-a:1.5").exists(), "the handler running")
        worker.send_signal(signal.SIGTERM)  # its main thread is still stuck writing "mc0 worker serving"
        assert (await answer).body == b"served a:1.5"  # finished and replied, not killed by the signal
        out, err = worker.communicate(timeout=10)
        assert worker.returncode == 0, err
        assert out.lstrip("#").startswith("mc0 worker serving slowcli")
    finally:
        worker.kill()
        worker.wait(5)
        await client.close()


AIO_WORKER = """
import asyncio, pathlib, sys
import mc0.aio

async def main() -> None:
    worker = mc0.aio.Worker(sys.argv[1])

    @worker.service("slowaio")
    async def handle(request):
        pathlib.Path("started-" + request.body.decode()).touch()
        await asyncio.sleep(1.5)
        return b"served " + request.body

    await worker.run(drain_timeout=20)
    print("closed", worker.closed, flush=True)

asyncio.run(main())
"""


async def test_aio_run_drains_on_sigterm(tmp_path: Path, broker: Any) -> None:
    client = await mc0.aio.Client(broker.endpoint).connect()
    worker = subprocess.Popen([sys.executable, "-c", AIO_WORKER, broker.endpoint], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        await until_workers(mc0_aio_runner, client, "slowaio", 1, "the worker registered")
        answer = asyncio.ensure_future(client.request("slowaio", b"a", timeout=20))
        await until(lambda: (tmp_path / "started-a").exists(), "the handler running")
        worker.send_signal(signal.SIGTERM)
        assert (await answer).body == b"served a"  # finished and replied, not cancelled
        out, err = worker.communicate(timeout=10)
        assert worker.returncode == 0, err
        assert out.strip() == "closed True"
    finally:
        worker.kill()
        worker.wait(5)
        await client.close()


async def test_an_aio_worker_run_calls_ready_once_it_is_registered(broker: Any) -> None:
    """``run(ready=...)``, as the sync view has it: called once the broker knows the worker."""
    client = await mc0.aio.Client(broker.endpoint).connect()
    worker = mc0.aio.Worker(broker.endpoint)
    worker.service("readysvc")(lambda request: b"ok")
    seen: list[int] = []

    def ready() -> None:
        seen.append(1)

    running = asyncio.ensure_future(worker.run(ready=ready))
    try:
        await until(lambda: bool(seen), "ready called")
        assert await workers_of(mc0_aio_runner, client, "readysvc") == 1  # registered before it was called
        assert (await client.request("readysvc", b"", timeout=10)).body == b"ok"
    finally:
        worker.stop()
        await asyncio.wait_for(running, 10)
        await worker.close()
        await client.close()
    assert seen == [1]
