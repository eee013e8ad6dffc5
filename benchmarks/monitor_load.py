"""What scrapers cost the bus: RPC round trips through a broker with many sessions and durable consumers,
with and without scrapers polling its biggest pages, alternating in one invocation.

Contract: ``Setup`` starts a broker (``--http``, a journal, ``sessions`` idle sessions held by a child
process, each with one subscription, and ``consumers`` durable consumers on the journal) and an echo
worker; ``setup.calls(seconds, scrapers)`` runs one caller (its own process: sequential requests, one
at a time) for ``seconds`` while ``scrapers`` scrapers (one process, a thread each) each read
``SCRAPED`` every ``every`` seconds, and returns calls/s, p50 and p99 ms, failed calls, pages read,
pages failed and pages answered 503 (the loop did not take a capture within a second).  A scrape
that failed or a call that failed is counted, never hidden.
"""

from __future__ import annotations

import contextlib
import http.client
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mc0
from mc0 import ports
from mc0.process import BrokerProcess

from .common import CTX
from .scale import held

SCRAPED = ("/connz?subs=1", "/consumerz", "/journalz", "/metrics")
JOURNAL = "orders"
TOPICS = 50  # the consumers' topics (orders.0 .. orders.49), and the journal's records spread over them


def echo_worker(endpoint: str, ready: Any, stop: Any) -> None:
    worker = mc0.Worker(endpoint)
    worker.add_service("echo", lambda request: request.body)
    threading.Thread(target=lambda: (stop.wait(3600), worker.stop()), daemon=True).start()
    with worker:
        worker.run(ready=ready.set)


def caller(endpoint: str, seconds: float, results: Any) -> None:
    """Sequential calls for ``seconds``: (calls, failed, latencies in seconds)."""
    times: list[float] = []
    failed = 0
    with mc0.Client(endpoint) as client:
        for _ in range(20):
            client.request("echo", b"warm", timeout=10)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sent = time.perf_counter()
            try:
                client.request("echo", b"x" * 16, timeout=10)
            except mc0.Error:
                failed += 1
                continue
            times.append(time.perf_counter() - sent)
    results.put((len(times), failed, times))


def scrape(host: str, port: int, every: float, count: int, stop: threading.Event, tally: list[int]) -> None:
    """One scraper: ``SCRAPED`` read one after another, then a wait to the next ``every``."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    next_at = time.monotonic()
    while not stop.is_set():
        for page in SCRAPED:
            try:
                conn.request("GET", page)
                response = conn.getresponse()
                body = response.read()
                tally[0 if response.status == 200 else 2 if response.status == 503 else 1] += 1
                if response.status not in (200, 503):
                    print(f"scraper: {page}: {response.status} {body[:200]!r}", file=sys.stderr, flush=True)
            except (OSError, http.client.HTTPException) as exc:
                print(f"scraper: {page}: {exc!r}", file=sys.stderr, flush=True)
                tally[1] += 1
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=10)
        next_at += every
        stop.wait(max(0.0, next_at - time.monotonic()))
    conn.close()


def scrapers_main(host: str, port: int, count: int, every: float, go: Any, stop: Any, results: Any) -> None:
    halt = threading.Event()
    tallies = [[0, 0, 0] for _ in range(count)]  # pages read, failed, answered 503 (the loop late > 1 s)
    threads = [
        threading.Thread(target=scrape, args=(host, port, every, count, halt, tallies[i]), daemon=True)
        for i in range(count)
    ]
    go.wait(60)
    for thread in threads:
        thread.start()
        time.sleep(every / count)  # spread over the interval, as independent scrapers are
    stop.wait(3600)
    halt.set()
    for thread in threads:
        thread.join(15)
    results.put(tuple(sum(t[i] for t in tallies) for i in range(3)))


class Setup:
    def __init__(self, *, sessions: int = 1_000, consumers: int = 2_000, every: float = 0.1) -> None:
        self.sessions = sessions
        self.consumers = consumers
        self.every = every
        self._stack = contextlib.ExitStack()
        self.port = 0
        self.endpoint = ""

    def __enter__(self) -> Setup:
        stack = self._stack
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        self.port = ports.free_port()
        config = folder / "broker.toml"
        config.write_text(
            f"[broker]\nmax_consumers = {self.consumers + 100}\nmax_consumers_per_identity = {self.consumers + 100}\n"
            f'[journals.{JOURNAL}]\nfolder = "{folder / "journal"}"\ntopics = ["{JOURNAL}.>"]\n'
        )
        broker = stack.enter_context(
            BrokerProcess("--http", f"127.0.0.1:{self.port}", config=str(config), insecure=True, cwd=str(folder))
        )
        self.endpoint = broker.endpoint
        assert broker.proc is not None
        self.pid = broker.proc.pid
        stack.enter_context(held("mc0", broker.endpoint, self.sessions, {}, 60_000, subscribe=True))
        with mc0.Client(broker.endpoint) as client:
            for i in range(2_000):
                client.publish(f"{JOURNAL}.{i % TOPICS}", b"r%d" % i, confirm=i % 500 == 499)
            for i in range(self.consumers):
                client.consume(JOURNAL, f"c{i}", topics=[f"{JOURNAL}.{i % TOPICS}"])
        ready, stop = CTX.Event(), CTX.Event()
        worker = CTX.Process(target=echo_worker, args=(broker.endpoint, ready, stop), daemon=True)
        worker.start()
        stack.callback(_ended, worker, stop)
        if not ready.wait(60):
            raise RuntimeError("the echo worker did not get ready")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def calls(self, seconds: float, scrapers: int) -> dict[str, float]:
        """One run: calls/s, p50 and p99 (ms), failed calls, pages read and failed."""
        go, stop, scraped = CTX.Event(), CTX.Event(), CTX.Queue()
        scraping = None
        if scrapers:
            args = ("127.0.0.1", self.port, scrapers, self.every, go, stop, scraped)
            scraping = CTX.Process(target=scrapers_main, args=args, daemon=True)
            scraping.start()
            go.set()
            time.sleep(1.0)  # every scraper polling
        results = CTX.Queue()
        call = CTX.Process(target=caller, args=(self.endpoint, seconds, results), daemon=True)
        call.start()
        try:
            count, failed, times = results.get(timeout=seconds + 120)
        finally:
            call.join(10)
            stop.set()
        pages, page_failures, stalled = (0, 0, 0)
        if scraping is not None:
            pages, page_failures, stalled = scraped.get(timeout=60)
            scraping.join(10)
        times.sort()
        return {
            "calls_per_s": count / seconds,
            "p50_ms": statistics.median(times) * 1000 if times else 0.0,
            "p99_ms": times[int(len(times) * 0.99)] * 1000 if times else 0.0,
            "failed": float(failed),
            "pages": float(pages),
            "page_failures": float(page_failures),
            "pages_stalled": float(stalled),
        }


def _ended(process: Any, stop: Any) -> None:
    stop.set()
    process.join(15)
    if process.is_alive():
        process.kill()
        process.join(5)


@contextlib.contextmanager
def setup(**options: Any) -> Iterator[Setup]:
    with Setup(**options) as s:
        yield s
