"""Child-process side of the library scenarios: what every load process shares, whatever the library.

Contract: each load process (publisher, subscriber, worker, RPC client) is
started by :class:`benchmarks.library.Crew` with a :class:`Link` and runs
its body under :func:`guarded`: it says ``ready`` once connected, waits for
``go`` when it generates load, and puts exactly one ``(role, pid, result)``
on ``results``, a dict that carries ``"error"`` when the body raised (with
whatever it had counted so far).  Clocks: ``time.monotonic_ns`` (one
CLOCK_MONOTONIC shared by every process on Linux), so first/last delivery
times and one-way latencies compare across processes.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TOPIC = "bench.lib"
SERVICE = "bench"
SCATTER_SUBJECT = "bench.all"  # NATS: every responder (no queue group) answers
MARKER = b"mc0-bench-end"  # the publisher's last message: everything before it was sent
QUIET = 2.0  # after the publisher finished: a subscriber that hears nothing this long stops
DRAIN_LIMIT = 60.0  # after the publisher finished: a subscriber stops by then even if messages still trickle
MAX_CALLS = 2_000_000  # an RPC client stops after this many calls whatever the time
WORKER_CAPACITY = 100  # mc0 workers: requests a worker takes at once (the in-flight window)


@dataclass
class Link:
    """The multiprocessing objects one run's processes share with the harness."""

    ready: Any  # Queue: each process puts its pid once connected (or failed)
    go: Any  # Event: the load starts
    done: Any  # Event: the publisher has sent everything (the marker confirmed / flushed)
    results: Any  # Queue: (role, pid, dict) from each process that generates or counts load


class Child:
    """Handed to a load body: ``ready()`` once, ``wait_go()`` before the load, ``out`` for results.

    ``cpu_s`` (put in every result): the process's CPU time (user + system, every thread) from
    ``ready()`` to the result, i.e. what the load cost the library in this process (connecting
    is before it; idle waiting for ``go`` costs next to nothing)."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.out: dict[str, Any] = {}
        self.said_ready = False
        self.cpu_at_ready = time.process_time()

    def ready(self) -> None:
        if not self.said_ready:
            self.said_ready = True
            self.cpu_at_ready = time.process_time()
            self.link.ready.put(os.getpid())

    def wait_go(self, timeout: float = 120.0) -> None:
        if not self.link.go.wait(timeout):
            raise TimeoutError("no go from the harness")


def guarded(role: str, link: Link, body: Callable[[Child], None], report: bool = True) -> None:
    """Run a load body; always answer ready and (if ``report``) put one result, errors included."""
    child = Child(link)
    try:
        body(child)
    except BaseException as exc:
        child.out["error"] = f"{type(exc).__name__}: {exc}"[:300]
        child.out["traceback"] = traceback.format_exc()[-3000:]
        report = True
    finally:
        child.ready()  # a body that failed before connecting must not keep the harness waiting
        if report:
            child.out["cpu_s"] = time.process_time() - child.cpu_at_ready
            mc0 = sys.modules.get("mc0")  # which checkout's mc0 this process ran (--client-tree)
            if mc0 is not None and getattr(mc0, "__file__", None):
                child.out["mc0_path"] = os.path.dirname(os.path.abspath(str(mc0.__file__)))
            link.results.put((role, os.getpid(), child.out))


class Tally:
    """A subscriber's count: deliveries, first and last arrival, one-way latencies if asked."""

    def __init__(self, expected: int, latency: bool) -> None:
        self.expected = expected
        self.count = 0
        self.first = 0
        self.last = 0
        self.latencies: list[int] | None = [] if latency else None

    def add(self, body: bytes) -> bool:
        """Count one message; True once everything expected arrived."""
        now = time.monotonic_ns()
        if not self.count:
            self.first = now
        self.last = now
        self.count += 1
        if self.latencies is not None:
            self.latencies.append(now - int.from_bytes(body[:8], "little"))
        return self.count >= self.expected

    def report(self, out: dict[str, Any]) -> None:
        out.update(delivered=self.count, first_ns=self.first, last_ns=self.last)
        if self.latencies is not None:
            out["latencies_ns"] = self.latencies


class Quiet:
    """When a subscriber gives up waiting: the publisher finished and nothing arrived for ``QUIET`` s,
    or ``DRAIN_LIMIT`` s went by since it finished, or the subscriber's own hard limit passed."""

    def __init__(self, done: Any, limit_s: float, quiet_s: float = QUIET) -> None:
        self.done = done
        self.hard = time.monotonic() + limit_s
        self.quiet_s = quiet_s
        self.done_at: float | None = None
        self.seen = -1
        self.since = 0.0
        self.reason = ""

    def expired(self, count: int) -> bool:
        now = time.monotonic()
        if now > self.hard:
            self.reason = "hard limit"
            return True
        if self.done_at is None:
            if not self.done.is_set():
                return False
            self.done_at = self.since = now
        if count != self.seen:
            self.seen, self.since = count, now
        if now - self.since > self.quiet_s:
            self.reason = f"quiet {self.quiet_s:g} s after the publisher finished"
            return True
        if now - self.done_at > DRAIN_LIMIT:
            self.reason = f"still draining {DRAIN_LIMIT:g} s after the publisher finished"
            return True
        return False


def stamped(body: bytes) -> bytes:
    """A latency probe: the send time (monotonic ns) in the first 8 bytes of the body."""
    return time.monotonic_ns().to_bytes(8, "little") + body[8:]


def schedule(rate: int, seconds: float) -> tuple[int, int]:
    """(messages, interval ns) for a paced run of ``seconds`` at ``rate`` messages/s."""
    return max(1, int(rate * seconds)), int(1e9 / max(1, rate))


def percentile(sorted_values: list[Any], share: float) -> Any:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * share))] if sorted_values else 0


# What one open web console asks of the broker (mc0/broker/monitoring/console/console.js, on its busiest
# view, Connections): every two seconds /varz and /connz (open, then closed), asked at once.
CONSOLE_POLLS = ((2.0, ("/varz", "/connz?limit=10000", "/connz?state=closed&limit=256")),)


def console_pollers(base: str, consoles: int, limit_s: float, link: Link) -> None:
    """``consoles`` pollers, each doing what one console does at its rate, until the publisher is done
    (or ``limit_s``); says ready once the pages answer.  Reports no result (the harness waits for none)."""
    import threading
    import urllib.request

    def body(child: Child) -> None:
        urllib.request.urlopen(base + "/varz", timeout=10).read()
        child.ready()
        stop = time.monotonic() + limit_s

        def fetch(page: str) -> None:
            urllib.request.urlopen(base + page, timeout=10).read()

        def console(offset: float) -> None:
            due = {every: time.monotonic() + offset for every, _ in CONSOLE_POLLS}
            while time.monotonic() < stop and not link.done.is_set():
                now = time.monotonic()
                for every, pages in CONSOLE_POLLS:
                    if now >= due[every]:
                        due[every] = now + every
                        fetches = [threading.Thread(target=fetch, args=(page,)) for page in pages]  # at once
                        for fetch_thread in fetches:
                            fetch_thread.start()
                        for fetch_thread in fetches:
                            fetch_thread.join(15)
                time.sleep(max(0.0, min(due.values()) - time.monotonic()))

        threads = [threading.Thread(target=console, args=(i / consoles,), daemon=True) for i in range(consoles)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(limit_s + 10)

    guarded("console", link, body, report=False)
