#!/usr/bin/env python3
"""Does the monitoring HTTP side slow the broker loop?  Pub/sub throughput through a broker
process with ``--http``, alternating runs with no scraper and with a scraper reading
/metrics, /connz and /varz back to back as fast as it can (far harsher than Prometheus).

python scripts/bench_monitor.py --runs 3 --count 100000
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import mc0
from mc0 import ports
from mc0.process import BrokerProcess


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=100_000)
    args = parser.parse_args()
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
