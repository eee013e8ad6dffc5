#!/usr/bin/env python3
"""Where a Spark scan of the journal spends its time: CPU per row of each process, and py-spy's view inside them.

python scripts/profile_spark_scan.py                     # 200,000 records of 100 B, local[2], 2 scans
python scripts/profile_spark_scan.py --no-spy --scans 3  # CPU per process only

A broker process keeps the records; ``spark.read.format("mc0")`` scans them
(the aggregation of benchmarks/spark_scan.py, so no column is pruned), and so
does the plain Python source over the same rows from an Arrow file (the
floor of Spark's own cost for a Python source).  While the scans run, psutil
reads the CPU time (user + system) of the broker, of the JVM and of Spark's
Python workers, and during the mc0 scans py-spy (the bench group) samples
the broker and the Python workers (``--subprocesses`` of pyspark's daemon);
samples are grouped into stages by the function and file they are in.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: benchmarks/ is not installed

import psutil  # noqa: E402

import benchmarks.spark_scan as scan  # noqa: E402
from mc0.process import BrokerProcess  # noqa: E402

# (stage, substrings of a py-spy frame "function (file:line)"), first match from the leaf wins.
STAGES = [
    ("journal read (segment -> records or columns)", ("broker/storage/filestore.py", "protocol/journalrecords.py")),
    ("page build / parse (protocol/bodies.py)", ("protocol/bodies.py",)),
    ("fetch pacing / fetch state", ("broker/core/journaling.py",)),
    ("batch framing", ("protocol/batch.py", "broker/core/batched.py", "broker/outbox.py")),
    ("zmq send / receive", ("zmq/sugar/socket.py",)),
    ("poll (idle)", ("poll",)),
    ("Record objects", ("message.py",)),
    ("Arrow building", ("pyarrow", "spark/source.py")),
    ("threads waiting", ("wait (threading.py", "_wait_for_tstate_lock")),
    (
        "client loop and hand-over (asyncio, link, session)",
        ("asyncio", "mc0/aio/", "mc0/session", "selectors.py", "mc0/sync_loop", "threading.py"),
    ),
    ("pyspark daemon waiting for tasks", ("manager (daemon.py",)),
    ("Spark's Python worker", ("pyspark", "serializers.py", "conversion.py", "plan_data_source_read.py")),
]


WAITING = {"poll (idle)", "threads waiting", "pyspark daemon waiting for tasks"}


def stage_of(stack: list[str]) -> str:
    for frame in reversed(stack):
        for stage, needles in STAGES:
            if any(n in frame for n in needles):
                return stage
    return "other"


def profile(path: Path, leaves: Counter[str]) -> tuple[Counter[str], int]:
    stages: Counter[str] = Counter()
    total = 0
    if not path.exists():
        return stages, 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        stages[stage_of(frames)] += int(n)
        leaves[frames[-1]] += int(n)
        total += int(n)
    return stages, total


def cpu_by_role(broker_pid: int) -> dict[str, float]:
    """CPU seconds so far of the broker, the JVM and Spark's Python workers (and their daemon)."""
    out = {"broker": 0.0, "JVM": 0.0, "Python workers": 0.0, "driver": 0.0}
    me = psutil.Process(os.getpid())
    out["driver"] = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            seconds = sum(child.cpu_times()[:2])
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if child.pid == broker_pid:
            out["broker"] += seconds
        elif "java" in cmdline:
            out["JVM"] += seconds
        elif "pyspark" in cmdline or "daemon" in cmdline or "worker" in cmdline:
            out["Python workers"] += seconds
    return out


def _is_daemon(process: psutil.Process) -> bool:
    """pyspark's daemon itself (its forked workers share its command line: py-spy follows them)."""
    try:
        parent = process.parent()
        return "pyspark.daemon" in " ".join(process.cmdline()) and (
            parent is None or "pyspark.daemon" not in " ".join(parent.cmdline())
        )
    except psutil.Error:  # gone, or a zombie
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--scans", type=int, default=2)
    parser.add_argument("--no-spy", action="store_true", help="CPU per process only")
    parser.add_argument("--top", type=int, default=0, help="also list the hottest leaf frames")
    parser.add_argument("--option", action="append", default=[], help="a source option KEY=VALUE")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    spy = not args.no_spy and Path(py_spy).exists()
    options = dict(o.split("=", 1) for o in args.option)
    import pyspark.cloudpickle as cloudpickle

    from mc0.spark import make_session

    cloudpickle.register_pickle_by_value(scan)
    with tempfile.TemporaryDirectory(prefix="mc0-profile-") as tmp:
        folder = Path(tmp)
        with BrokerProcess(config=scan._config(folder), insecure=True) as broker:
            assert broker.proc is not None
            asyncio.run(scan._fill(broker.endpoint, args.count, args.size))
            _, records = scan.fetch_all(broker.endpoint, args.count)
            scan.write_arrow_file(records, folder / "rows.arrow")
            del records
            spark = make_session("local[2]", app="mc0-profile", scratch=str(folder / "spark"))
            try:
                per_partition = int(options.get("maxRecordsPerPartition", scan.DEFAULT_PARTITION_RECORDS))
                spark.dataSource.register(scan.plain_source(folder / "rows.arrow", per_partition))
                plain = spark.read.format("mc0bench_plain").option("rows", str(args.count))
                reader = spark.read.format("mc0").option("endpoint", broker.endpoint)
                for key, value in options.items():
                    reader = reader.option(key, value)
                scan._scan(reader.load())  # warm up: the workers exist from here on
                scan._scan(plain.load())
                before = cpu_by_role(broker.proc.pid)
                started = time.perf_counter()
                for _ in range(args.scans):
                    scan._scan(plain.load())
                plain_wall = time.perf_counter() - started
                plain_cpu = {k: v - before[k] for k, v in cpu_by_role(broker.proc.pid).items()}
                spies = []
                if spy:
                    daemons = [p.pid for p in psutil.Process(os.getpid()).children(recursive=True) if _is_daemon(p)]
                    targets = [("broker", broker.proc.pid, []), *(("workers", d, ["--subprocesses"]) for d in daemons)]
                    for role, pid, extra in targets:
                        out = folder / f"{role}-{pid}.txt"
                        command = [py_spy, "record", "-p", str(pid), "-o", str(out), "-f", "raw", "-r", "250"]
                        command += ["--nonblocking", *extra]  # --nonblocking: the sampled process is not paused
                        quiet = subprocess.DEVNULL
                        spies.append((role, out, subprocess.Popen(command, stdout=quiet, stderr=quiet)))
                    time.sleep(1.5)  # py-spy attaches
                before = cpu_by_role(broker.proc.pid)
                started = time.perf_counter()
                for _ in range(args.scans):
                    result = scan._scan(reader.load())
                    if result["n"] != args.count:
                        print(f"profile_spark_scan: read {result['n']} rows, published {args.count}", file=sys.stderr)
                        return 1
                wall = time.perf_counter() - started
                after = cpu_by_role(broker.proc.pid)
                for _, _, process in spies:
                    process.send_signal(2)
                for _, _, process in spies:
                    process.wait(60)
                if os.environ.get("KEEP_PROFILES"):
                    for _, out, _ in spies:
                        if out.exists():
                            shutil.copy(out, os.environ["KEEP_PROFILES"])
            finally:
                spark.stop()
        rows = args.count * args.scans
        print(f"{args.scans} scans of {args.count:,} rows of {args.size} B, local[2]; load {os.getloadavg()[0]:.1f}")
        print(f"  {'':16} {'mc0':>9} {'plain':>9}")
        print(f"  {'rows/s':16} {rows / wall:9,.0f} {rows / plain_wall:9,.0f}")
        print("CPU per row, us (user + system):")
        for role in ("broker", "Python workers", "JVM", "driver"):
            print(f"  {role:16} {(after[role] - before[role]) / rows * 1e6:9.2f} {plain_cpu[role] / rows * 1e6:9.2f}")
        for role in ("broker", "workers"):
            stages: Counter[str] = Counter()
            leaves: Counter[str] = Counter()
            total = 0
            for who, out, _ in spies:
                if who == role:
                    got, n = profile(out, leaves)
                    stages += got
                    total += n
            if total:
                busy = total - sum(stages[s] for s in WAITING) or 1
                print(f"{role}: {total} samples (py-spy); share of all, share of the busy ones")
                for stage, n in stages.most_common():
                    share = "" if stage in WAITING else f"{n / busy:6.1%}"
                    print(f"  {n / total:6.1%} {share:>6} {stage}")
                for frame, n in leaves.most_common(args.top):
                    print(f"  {n / total:6.1%}        leaf {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
