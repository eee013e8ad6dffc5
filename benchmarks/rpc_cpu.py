"""Where a sequential RPC call's time goes: CPU per call of each thread of broker, worker and client.

Run: ``python -m benchmarks.rpc_cpu [--seconds 5]`` from the repository root.
A broker process (insecure, defaults), an ``mc0.aio.Worker`` echo service in
its own process and an ``mc0.aio.Client`` here calling it one request at a
time; prints calls/s, the wall time per call and, per process, the CPU time
per call of each thread (the main thread and libzmq's I/O thread) from psutil,
plus context switches.  Bounded: a warm-up of 200 calls, then ``--seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from typing import Any

import psutil  # type: ignore[import-untyped]

from mc0.process import BrokerProcess


def _worker_main(endpoint: str, ready: Any) -> None:
    import mc0.aio

    async def run() -> None:
        worker = mc0.aio.Worker(endpoint, capacity=100)

        @worker.service("echo")
        async def echo(request: Any) -> bytes:
            return bytes(request.body)

        await worker.connect()
        ready.put(os.getpid())
        await asyncio.sleep(120)

    asyncio.run(run())


def _threads(process: psutil.Process) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in process.threads()}


async def _client(endpoint: str, processes: dict[str, psutil.Process], seconds: float) -> None:
    import mc0.aio

    async with mc0.aio.Client(endpoint) as client:
        for _ in range(200):
            await client.request("echo", b"x")
        before = {name: _threads(p) for name, p in processes.items()}
        switches = {name: sum(p.num_ctx_switches()) for name, p in processes.items()}
        started = time.perf_counter()
        calls = 0
        while time.perf_counter() - started < seconds:
            await client.request("echo", b"x")
            calls += 1
        elapsed = time.perf_counter() - started
        after = {name: _threads(p) for name, p in processes.items()}
    print(f"sequential: {calls / elapsed:,.0f} calls/s, wall {elapsed / calls * 1e6:.0f} us per call")
    for name, process in processes.items():
        per_thread = {tid: (cpu - before[name].get(tid, 0.0)) / calls * 1e6 for tid, cpu in after[name].items()}
        busy = ", ".join(f"{us:.0f}" for us in sorted(per_thread.values(), reverse=True) if us >= 1)
        ctx = (sum(process.num_ctx_switches()) - switches[name]) / calls
        print(f"  {name:<7} CPU us per call by thread: {busy}; {ctx:.1f} context switches per call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    with BrokerProcess(insecure=True) as broker:
        assert broker.proc is not None
        ready = context.Queue()
        worker = context.Process(target=_worker_main, args=(broker.endpoint, ready), daemon=True)
        worker.start()
        try:
            worker_pid = ready.get(timeout=30)
            processes = {
                "broker": psutil.Process(broker.proc.pid),
                "worker": psutil.Process(worker_pid),
                "client": psutil.Process(),
            }
            asyncio.run(_client(broker.endpoint, processes, min(args.seconds, 60.0)))
        finally:
            worker.kill()
            worker.join(5)


if __name__ == "__main__":
    main()
