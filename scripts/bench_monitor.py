#!/usr/bin/env python3
"""Does the monitoring HTTP side slow the broker loop?  Two tables, each alternating runs without and
with scrapers in one invocation:

* ``bus`` (issue 35's figure): RPC round trips (one caller, sequential calls to an echo worker) through a
  broker holding ``--sessions`` sessions (one subscription each) and ``--consumers`` durable consumers,
  without scrapers and with ``--scrapers`` scrapers each reading /connz?subs=1, /consumerz, /journalz and
  /metrics every ``--every`` seconds (benchmarks/monitor_load.py).  The row: p50 with / without (target
  <= 1.2x) and calls/s with / without (target >= 0.8x).
* ``pubsub``: pub/sub throughput with one scraper reading /metrics, /connz and /varz back to back as fast
  as it can (far harsher than Prometheus).

python scripts/bench_monitor.py --table bus --runs 3 --seconds 10     # 1,000 sessions, 2,000 consumers, 10 scrapers
python scripts/bench_monitor.py --table pubsub --runs 3 --count 100000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mc0
from mc0 import ports
from mc0.process import BrokerProcess

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ (the checkout's)


def free_port() -> int:
    return ports.free_port()  # leased below the ephemeral range: no other process takes it meanwhile


SCRAPER = """
import signal, sys, time, urllib.request
n = 0
def done(*_):
    print(n); sys.exit(0)
signal.signal(signal.SIGTERM, done)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    for page in ("/metrics", "/connz", "/varz"):
        urllib.request.urlopen(sys.argv[1] + page, timeout=5).read()
        n += 1
done()
"""


def one_run(endpoint: str, base: str, count: int, scrape: bool) -> tuple[float, int]:
    """Messages per second for ``count`` 100-byte messages through one subscriber; scrapes done."""
    scraper = None
    if scrape:  # its own process: its work must not steal this process's GIL from the clients
        scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, base], stdout=subprocess.PIPE, text=True)

    with mc0.Client(endpoint) as sub_client, mc0.Client(endpoint) as pub, sub_client.subscribe("bench.>") as sub:
        pub.publish("bench.warm", b"x", confirm=True)
        sub.next(timeout=5)
        body = b"x" * 100
        start = time.perf_counter()
        for _ in range(count):
            pub.publish("bench.x", body)
        received = 0
        while received < count:
            received += len(sub.next_batch(10_000, timeout=10)) or 0
        elapsed = time.perf_counter() - start
    scrapes = 0
    if scraper is not None:
        scraper.terminate()
        out, _ = scraper.communicate(timeout=10)
        scrapes = int(out.split()[-1]) if out.split() else 0
    return count / elapsed, scrapes


def bus_table(args: argparse.Namespace) -> int:
    """Issue 35's figure: the bus round trip with and without scrapers, alternating."""
    from benchmarks.monitor_load import Setup

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    runs: dict[int, list[dict[str, float]]] = {0: [], args.scrapers: []}
    started = time.monotonic()
    with Setup(sessions=args.sessions, consumers=args.consumers, every=args.every) as setup:
        print(f"set up: {args.sessions:,} sessions, {args.consumers:,} consumers in {time.monotonic() - started:.1f} s")
        for run in range(args.runs):
            for scrapers in (0, args.scrapers):
                figures = setup.calls(args.seconds, scrapers)
                runs[scrapers].append(figures)
                print(
                    f"run {run + 1} scrapers {scrapers:>2}: {figures['calls_per_s']:,.0f} calls/s,"
                    f" p50 {figures['p50_ms']:.3f} ms, p99 {figures['p99_ms']:.3f} ms, failed {figures['failed']:.0f},"
                    f" pages {figures['pages']:.0f} ({figures['page_failures']:.0f} failed,"
                    f" {figures['pages_stalled']:.0f} 503)",
                    flush=True,
                )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    def median(scrapers: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[scrapers])

    p50 = median(args.scrapers, "p50_ms") / max(1e-9, median(0, "p50_ms"))
    rate = median(args.scrapers, "calls_per_s") / max(1e-9, median(0, "calls_per_s"))
    failed = sum(r["failed"] + r["page_failures"] for rs in runs.values() for r in rs)
    print()
    print("| row | without scrapers | with scrapers | ratio | target |")
    print("|---|---:|---:|---:|---|")
    title = f"bus round trip, {args.sessions:,} sessions, {args.consumers:,} consumers, {args.scrapers} scrapers"
    without, with_ = median(0, "p50_ms"), median(args.scrapers, "p50_ms")
    print(f"| {title}: p50 | {without:.3f} ms | {with_:.3f} ms | {p50:.2f}x | <= 1.2x |")
    print(
        f"| {title}: calls/s | {median(0, 'calls_per_s'):,.0f} | {median(args.scrapers, 'calls_per_s'):,.0f}"
        f" | {rate:.2f}x | >= 0.8x |"
    )
    print(f"| pages read per second | | {median(args.scrapers, 'pages') / args.seconds:,.0f} | | |")
    if failed:
        print(f"FAILING: {failed:.0f} calls or pages failed")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", choices=("bus", "pubsub"), default="bus")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=100_000, help="pubsub: messages per run")
    parser.add_argument("--seconds", type=float, default=10.0, help="bus: seconds of calls per run")
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--consumers", type=int, default=2_000)
    parser.add_argument("--scrapers", type=int, default=10)
    parser.add_argument("--every", type=float, default=0.1, help="bus: seconds between a scraper's polls")
    args = parser.parse_args()
    if args.table == "bus":
        return bus_table(args)
    port = free_port()
    with BrokerProcess("--http", f"127.0.0.1:{port}", insecure=True) as broker:
        base = f"http://127.0.0.1:{port}"
        rates: dict[bool, list[float]] = {False: [], True: []}
        for run in range(args.runs):
            for scrape in (False, True):
                rate, scrapes = one_run(broker.endpoint, base, args.count, scrape)
                rates[scrape].append(rate)
                print(f"run {run + 1} scraper {'on ' if scrape else 'off'}: {rate:,.0f} msg/s ({scrapes} pages read)")
        for scrape in (False, True):
            values = rates[scrape]
            print(
                f"scraper {'on ' if scrape else 'off'}: median {statistics.median(values):,.0f} msg/s"
                f" (min {min(values):,.0f}, max {max(values):,.0f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
