#!/usr/bin/env python3
"""Where an RPC call's time goes: CPU per call of each process (client, broker, worker), and py-spy inside them.

python scripts/profile_rpc.py                          # 100 in flight, mc0-aio and nats, CPU per call
python scripts/profile_rpc.py --window 1 --spy         # sequential, and py-spy on every mc0 process
python scripts/profile_rpc.py --systems mc0-sync --window 100 --spy --seconds 5

The load is the library benchmark's own (benchmarks/library_mc0.py and
library_nats.py: the same worker and client processes as the ``lib RPC``
rows), one broker per system at its defaults.  While the client calls,
psutil reads each process's CPU time (user + system); with ``--spy`` py-spy
(the bench group) samples every mc0 process at ``--rate`` Hz and the samples
are grouped into stages by the file and function they are in (the leaf
first: the innermost frame of ours that a stage names).  py-spy slows what
it samples: read its shares, not its rates.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: benchmarks/ is not installed

import psutil  # type: ignore[import-untyped]  # noqa: E402

from benchmarks.common import BODY, Options  # noqa: E402
from benchmarks.library import MAINS, Crew, target  # noqa: E402
from benchmarks.library_load import percentile  # noqa: E402

# (stage, substrings of a py-spy frame "function (file:line)"); the first stage that names a frame,
# from the leaf up, takes the sample.
STAGES = [
    ("poll / wait (idle)", ("poll (", "select (", "wait (threading.py", "_wait_for_tstate_lock", "_worker (conc")),
    (
        "zmq send / recv (pyzmq)",
        ("zmq/sugar/socket.py", "send (zmq", "recv (zmq", "getsockopt", "zmq/backend", "libzmq"),
    ),
    # (py-spy --native names a compiled module's functions CPyDef_MODULE___...: matched as "MODULE___")
    ("batch records encode / decode", ("protocol/batch.py", "_batch___", " batch___")),
    ("protocol frames, decode", ("protocol/codec.py", "protocol/builders.py", "protocol/model.py", "builders___")),
    ("broker: batched walk", ("core/batched.py", "batched___")),
    (
        "broker: rpc, jobs, workers",
        (
            "core/rpc.py",
            "core/jobs.py",
            "core/workers.py",
            "core/verbs.py",
            "rpc___",
            "jobs___",
            "workers___",
            "verbs___",
        ),
    ),
    (
        "broker: deadlines, trie, peers, pub/sub",
        ("deadlines", "trie", "core/peers.py", "pubsub", "peers___", "histogram"),
    ),
    ("broker: outbox, delivery", ("broker/outbox.py", "broker/sender.py")),
    ("broker: loop, dispatch", ("broker/server.py", "core/dispatch.py", "core/peers.py", "core/histogram.py")),
    ("client: session decode", ("mc0/session", "mc0/events.py", "mc0/message.py")),
    ("client: link (socket on the loop)", ("mc0/aio/link.py",)),
    ("client: futures, dispatch", ("mc0/aio/connection.py", "mc0/aio/client.py", "mc0/client.py")),
    ("worker: handler, task, reply", ("mc0/aio/worker.py", "benchmarks/library_mc0.py")),
    ("sync: cross-thread hand-over", ("mc0/sync_loop.py", "threading.py", "concurrent/futures")),
    ("asyncio loop, tasks, futures", ("asyncio/",)),
    ("nats-py", ("nats/",)),
]
WAITING = "poll / wait (idle)"
# py-spy comes with the bench group, beside this interpreter (a venv's bin need not be on PATH).
SPY = shutil.which("py-spy") or next((str(p) for p in [Path(sys.executable).parent / "py-spy"] if p.exists()), None)


def stage_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for stage, needles in STAGES:
            if any(n in frame for n in needles):
                return stage
    return "other"


def stages(path: Path) -> tuple[Counter[str], Counter[str], int]:
    """(samples per stage, samples per leaf frame, total) of a py-spy raw profile."""
    by_stage: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    if not path.exists():
        return by_stage, leaves, 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        by_stage[stage_of(frames)] += int(n)
        leaves[frames[-1]] += int(n)
        total += int(n)
    return by_stage, leaves, total


def cpu(pid: int) -> dict[int, float]:
    """CPU time (user + system) of each thread of a process so far."""
    try:
        return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}
    except psutil.Error:
        return {}


def split(pid: int, before: dict[int, float], after: dict[int, float]) -> tuple[float, float]:
    """(the main thread's CPU seconds, every other thread's) between two readings."""
    main = after.get(pid, 0.0) - before.get(pid, 0.0)
    rest = sum(t - before.get(tid, 0.0) for tid, t in after.items() if tid != pid)
    return main, rest


def run(
    system: str, window: int, seconds: float, spy: bool, rate: int, folder: Path, native: bool = False
) -> dict[str, Any]:
    mains = MAINS[system]
    spec_options = Options()
    del spec_options  # (the load bodies take plain arguments)
    curve: dict[str, Any] = {}
    with target(system, curve) as where, Crew() as crew:
        crew.start(mains.worker, where.endpoint, where.options, 0)
        crew.wait_ready(1, 90)
        crew.start(mains.client, where.endpoint, where.options, window, seconds, 0)
        crew.wait_ready(1, 90)
        pids = {"broker": where.pid, "worker": crew.processes[0].pid, "client": crew.processes[1].pid}
        spies: dict[str, subprocess.Popen[bytes]] = {}
        if spy and system.startswith("mc0"):
            for name, pid in pids.items():
                out = folder / f"{system}-{name}.txt"
                command = [str(SPY), "record", "-p", str(pid), "-o", str(out), "-f", "raw", "-r", str(rate)]
                command += ["--native"] if native else ["--nonblocking"]
                spies[name] = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # attached before the load starts
        before = {name: cpu(pid) for name, pid in pids.items()}
        crew.link.go.set()
        results = crew.collect({"client": 1}, seconds + 120)
        after = {name: cpu(pid) for name, pid in pids.items()}
        for process in spies.values():
            process.send_signal(signal.SIGINT)
        for process in spies.values():
            process.wait(30)
    client = next((r for role, r in results if role == "client"), {})
    latencies = sorted(client.get("latencies_ns", ()))
    calls = len(latencies)
    report: dict[str, Any] = {
        "calls": calls,
        "rate": calls / client["seconds"] if client.get("seconds") else 0.0,
        "p50_ms": percentile(latencies, 0.5) / 1e6,
        "errors": client.get("errors", 0),
        "cpu_us": {
            name: [x * 1e6 / max(1, calls) for x in split(pid, before[name], after[name])] for name, pid in pids.items()
        },
        "profiles": {name: folder / f"{system}-{name}.txt" for name in spies},
    }
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="mc0-aio,nats", help="mc0-aio, mc0-sync, nats (comma-separated)")
    parser.add_argument("--window", type=int, default=100, help="requests in flight (1: sequential)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--spy", action="store_true", help="py-spy on every mc0 process")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=12, help="leaf frames shown per process")
    parser.add_argument(
        "--native", action="store_true", help="py-spy --native: see into compiled modules (mypyc's C functions)"
    )
    parser.add_argument("--keep", help="a folder to keep py-spy's raw profiles in (SYSTEM-PROCESS.txt)")
    args = parser.parse_args()
    if args.spy and SPY is None:
        print("profile_rpc: py-spy is not installed (pip install --group bench, in a checkout)", file=sys.stderr)
        return 1
    load = os.getloadavg()[0]
    print(f"window {args.window}, {args.seconds:g} s, {BODY}-byte bodies, load average {load:.1f}")
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or scratch
        Path(folder).mkdir(parents=True, exist_ok=True)
        for system in [s for s in args.systems.split(",") if s]:
            got = run(system, args.window, args.seconds, args.spy, args.rate, Path(folder), args.native)
            cpu_text = ", ".join(f"{name} {main:.1f} + {rest:.1f}" for name, (main, rest) in got["cpu_us"].items())
            total = sum(sum(x) for x in got["cpu_us"].values())
            print(
                f"{system:<9} {got['rate']:>9,.0f} calls/s  p50 {got['p50_ms']:.2f} ms  errors {got['errors']}  "
                f"CPU us/call (main thread + others): {cpu_text} (total {total:.1f})"
            )
            for name, path in got["profiles"].items():
                by_stage, leaves, samples = stages(path)
                busy = samples - by_stage[WAITING]
                if not busy:
                    continue
                print(f"  {name}: {samples} samples, {busy} not waiting; share of those:")
                for stage, n in by_stage.most_common():
                    if stage != WAITING:
                        print(f"    {n / busy:6.1%}  {stage}")
                print("    hottest leaves:")
                for frame, n in leaves.most_common(args.top):
                    print(f"    {n / samples:6.1%}  {frame[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
