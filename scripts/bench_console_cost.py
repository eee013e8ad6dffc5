#!/usr/bin/env python3
"""What open web consoles cost the broker, in CPU: a broker with ``--http`` and ``--peers`` idle clients,
measured ``--seconds`` at a time without pollers and with ``--consoles`` pollers doing what an open console
does (benchmarks.library_load.CONSOLE_POLLS: /varz and /connz, open and closed, asked at once every 2 s),
alternating, ``--rounds`` times.  Prints the broker's CPU milliseconds per second in each state: the
difference is the consoles' cost, against the ~1,000 ms per second a broker saturated by pub/sub spends
(the "lib pub/sub 1->1, consoles" row of scripts/bench.py measures the same as throughput).

python scripts/bench_console_cost.py --consoles 5 --seconds 20 --rounds 2
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ (the checkout's)

import mc0  # noqa: E402
from benchmarks.library_load import CONSOLE_POLLS  # noqa: E402
from mc0 import ports  # noqa: E402
from mc0.process import BrokerProcess  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--consoles", type=int, default=5)
    parser.add_argument("--peers", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    port = ports.free_port()
    ((every, pages),) = CONSOLE_POLLS
    with BrokerProcess("--http", f"127.0.0.1:{port}", insecure=True) as broker:
        assert broker.proc is not None
        process = psutil.Process(broker.proc.pid)
        clients = [mc0.Client(broker.endpoint).__enter__() for _ in range(args.peers)]
        base = f"http://127.0.0.1:{port}"
        stop = threading.Event()

        def fetch(page: str) -> None:
            urllib.request.urlopen(base + page, timeout=10).read()

        def console(offset: float) -> None:
            stop.wait(offset)
            while not stop.is_set():
                asked = [threading.Thread(target=fetch, args=(page,)) for page in pages]  # at once, as the page
                for thread in asked:
                    thread.start()
                for thread in asked:
                    thread.join(15)
                stop.wait(every)

        try:
            for _ in range(args.rounds):
                for consoles in (0, args.consoles):
                    stop.clear()
                    threads = [
                        threading.Thread(target=console, args=(i * every / max(1, consoles),), daemon=True)
                        for i in range(consoles)
                    ]
                    for thread in threads:
                        thread.start()
                    time.sleep(every)
                    before, started = sum(process.cpu_times()[:2]), time.monotonic()
                    time.sleep(args.seconds)
                    spent = sum(process.cpu_times()[:2]) - before
                    rate = spent / (time.monotonic() - started) * 1000
                    stop.set()
                    for thread in threads:
                        thread.join(30)
                    print(f"{consoles} consoles: broker CPU {rate:.1f} ms per second")
        finally:
            for client in clients:
                client.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
