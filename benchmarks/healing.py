"""How long clients take to heal after a broker crash, over repeated kill -9 + restart.

Run: ``python -m benchmarks.healing [--restarts 20] [--ttl 5]`` from the repository root.
A subscriber, a worker (an ``echo`` service) and a publisher, each ``mc0.Client``/``mc0.Worker``
with the given TTL, stay up while the broker on one endpoint is killed (SIGKILL) and started
again ``--restarts`` times.  For each restart it measures, from the moment the new broker accepts
connections: the subscriber's subscription restored (a probe message reaches it) and the
worker's READY restored (a request to ``echo`` is answered).  Prints the distribution (min, p50,
p90, max) of both.  Bounded: each wait gives up after 3 x TTL + 5 s and is then reported as a
failure.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

import mc0
from mc0.process import BrokerProcess


def _until(probe: Callable[[], bool], since: float, limit: float) -> float | None:
    """Seconds from ``since`` until ``probe()`` is true, or None after ``limit``."""
    while time.monotonic() - since < limit:
        if probe():
            return time.monotonic() - since
    return None


def run(restarts: int, ttl: float) -> dict[str, list[float]]:
    first = BrokerProcess(insecure=True).start()
    endpoint = first.endpoint
    brokers = [first]
    results: dict[str, list[float]] = {"subscription": [], "worker": [], "failed": []}
    worker = mc0.Worker(endpoint, ttl=ttl)
    worker.service("echo")(lambda request: request.body)
    try:
        with mc0.Client(endpoint, ttl=ttl) as sub, mc0.Client(endpoint, ttl=ttl) as pub:
            worker.connect()
            thread = threading.Thread(target=worker.run, daemon=True)
            thread.start()
            stream = sub.subscribe("heal.probe", max_pending=1_000_000)
            limit = 3 * ttl + 5
            for restart in range(restarts):
                brokers[-1].kill()
                broker = BrokerProcess(insecure=True, bind=(endpoint,)).start()
                back = time.monotonic()  # start() returns once the broker accepts connections
                brokers.append(broker)

                def subscribed(restart: int = restart) -> bool:
                    pub.publish("heal.probe", str(restart).encode())
                    try:
                        while True:
                            if stream.next(timeout=0.02).body == str(restart).encode():
                                return True
                    except mc0.Timeout:
                        return False

                def served() -> bool:
                    try:
                        return pub.request("echo", b"x", timeout=0.2).body == b"x"
                    except (mc0.NoResponders, mc0.DeadlineExceeded, mc0.NotConnected):
                        return False

                for name, probe in (("subscription", subscribed), ("worker", served)):
                    took = _until(probe, back, limit)
                    if took is None:
                        results["failed"].append(float(restart))
                    else:
                        results[name].append(took)
                print(
                    f"restart {restart + 1}/{restarts}: subscription {results['subscription'][-1:]}, "
                    f"worker {results['worker'][-1:]}",
                    flush=True,
                )
            worker.stop()
    finally:
        for broker in brokers:
            broker.kill()
    return results


def summary(samples: list[float]) -> str:
    if not samples:
        return "none"
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (
        f"min {ordered[0] * 1000:.0f} ms, p50 {statistics.median(ordered) * 1000:.0f} ms, "
        f"p90 {p90 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms (n={len(ordered)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=20)
    parser.add_argument("--ttl", type=float, default=5.0, help="the clients' TTL (liveness = 3 x TTL)")
    options = parser.parse_args()
    results = run(options.restarts, options.ttl)
    print(f"subscription restored after the broker came back: {summary(results['subscription'])}")
    print(f"worker READY restored after the broker came back:  {summary(results['worker'])}")
    print(f"waits that gave up: {len(results['failed'])}")


if __name__ == "__main__":
    main()
