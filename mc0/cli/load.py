"""``mc0 bench --endpoint URL [SCENARIO]``: load an existing broker the way ``nats bench`` does.

Contract: ``run(args)`` parses its own options: the connection's
(``--endpoint``, ``--key``, ``--broker-key``, ``--config``; keys also from
``MC0_KEY`` / ``MC0_BROKER_KEY`` and the config's ``[client]``, as every
client) and then one scenario's, each with its own ``--help``:

* ``pubsub`` (the default): ``--sub`` subscribers, then ``--pub`` publishers
  sharing ``--msgs`` messages; publish and delivery rates;
* ``pub``: publishers only (what the broker takes); ``sub``: subscribers
  only, until each got ``--msgs`` (another process publishes);
* ``request``: ``--clients`` clients, each keeping ``--inflight`` requests
  in flight to ``--service`` until ``--msgs`` calls in all; calls/s, p50/p99;
* ``reply``: ``--workers`` echo workers serving ``--service`` for ``--seconds``
  (0: until interrupted), for ``request`` runs elsewhere;
* ``rpc``: ``reply`` and ``request`` together.

A progress bar shows what moved; every wait is bounded: the run gives up
(an mc0 error, one line) when nothing moves for ``--timeout`` seconds.
Everything runs in this process on the sync API (one background loop).
Returns the exit status.
"""

from __future__ import annotations

import argparse
import functools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..client import Client, Worker
from ..config import ENV_CONFIG
from ..errors import Error, Timeout
from ..message import Reply, Request
from .base import Connection

PROG = "mc0 bench --endpoint URL"
SCENARIOS = ("pubsub", "pub", "sub", "request", "reply", "rpc")
DEFAULT_SCENARIO = "pubsub"


def _connection_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Accepted before the scenario (``top``) and after it (where an absent one leaves the top's value)."""
    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--endpoint", required=top, default=default, help="The broker to load (e.g. tcp://127.0.0.1:61616)."
    )
    parser.add_argument(
        "--key", default=default, help="This client's secret key (NAME.key_secret; default $MC0_KEY) for CURVE."
    )
    parser.add_argument("--broker-key", default=default, help="The broker's public key (default $MC0_BROKER_KEY).")
    parser.add_argument(
        "--config", default=default, help=f"TOML config whose [client] applies (default ${ENV_CONFIG})."
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog=PROG,
        description="Load a running broker, as `nats bench` does: "
        + ", ".join(SCENARIOS)
        + f" (default {DEFAULT_SCENARIO}); `{PROG} SCENARIO --help` shows a scenario's options.",
    )
    _connection_options(top, top=True)
    common = argparse.ArgumentParser(add_help=False)
    _connection_options(common, top=False)
    common.add_argument("--timeout", type=float, default=10.0, help="Give up after this long with nothing moving.")
    sizes = argparse.ArgumentParser(add_help=False)
    sizes.add_argument("--size", type=int, default=128, help="Body bytes (default 128).")
    topic = argparse.ArgumentParser(add_help=False)
    topic.add_argument("--topic", default="bench.load", help="Topic (default bench.load).")
    service = argparse.ArgumentParser(add_help=False)
    service.add_argument("--service", default="bench.echo", help="Service name (default bench.echo).")
    calls = argparse.ArgumentParser(add_help=False)
    calls.add_argument("--clients", type=int, default=1, help="Requesting clients (default 1).")
    calls.add_argument("--inflight", type=int, default=100, help="Requests in flight per client (default 100).")
    serving = argparse.ArgumentParser(add_help=False)
    serving.add_argument("--workers", type=int, default=1, help="Echo workers (default 1).")
    serving.add_argument("--capacity", type=int, default=100, help="Requests each worker takes at once (100).")
    scenarios = top.add_subparsers(dest="scenario", metavar="SCENARIO")

    def scenario(name: str, text: str, *parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
        return scenarios.add_parser(name, help=text, description=text, parents=[common, *parents])

    pubsub = scenario("pubsub", "Subscribers, then publishers sharing --msgs: both rates.", sizes, topic)
    pubsub.add_argument("--pub", type=int, default=1, help="Publishers (default 1).")
    pubsub.add_argument("--sub", type=int, default=1, help="Subscribers (default 1; 0 = publish only).")
    pubsub.add_argument("--msgs", type=int, default=100_000, help="Messages in all (default 100,000).")
    pub = scenario("pub", "Publishers only: --msgs messages shared among them; the publish rate.", sizes, topic)
    pub.add_argument("--pub", type=int, default=1, help="Publishers (default 1).")
    pub.add_argument("--msgs", type=int, default=100_000, help="Messages in all (default 100,000).")
    sub = scenario("sub", "Subscribers only, until each got --msgs (publish from elsewhere).", topic)
    sub.add_argument("--sub", type=int, default=1, help="Subscribers (default 1).")
    sub.add_argument("--msgs", type=int, default=100_000, help="Messages each subscriber waits for (100,000).")
    request = scenario("request", "Clients calling --service, --inflight calls each in flight.", sizes, service, calls)
    request.add_argument("--msgs", type=int, default=100_000, help="Calls in all (default 100,000).")
    reply = scenario("reply", "Echo workers serving --service (for request runs elsewhere).", service, serving)
    reply.add_argument("--seconds", type=float, default=0.0, help="Serve this long (default 0: until Ctrl-C).")
    rpc = scenario("rpc", "Echo workers and requesting clients together.", sizes, service, calls, serving)
    rpc.add_argument("--msgs", type=int, default=100_000, help="Calls in all (default 100,000).")
    return top


def parse(args: list[str]) -> argparse.Namespace:
    if not any(a in SCENARIOS for a in args) and not any(a in ("-h", "--help") for a in args):
        args = [*_leading_connection(args), DEFAULT_SCENARIO, *_rest(args)]  # the scenario may be left out
    top = parser()
    options = top.parse_args(args)
    if options.scenario is None:
        top.error(f"name a scenario: {', '.join(SCENARIOS)}")
    for name in ("pub", "msgs", "clients", "inflight", "workers", "capacity"):
        if getattr(options, name, 1) < 1:
            top.error(f"--{name} must be at least 1")
    if getattr(options, "sub", 0) < 0 or getattr(options, "size", 0) < 0 or options.timeout <= 0:
        top.error("--sub and --size must be >= 0, --timeout > 0")
    if options.scenario == "sub" and options.sub < 1:
        top.error("--sub must be at least 1")
    return options


_CONNECTION = ("--endpoint", "--key", "--broker-key", "--config")


def _leading_connection(args: list[str]) -> list[str]:
    """The connection options (which the top parser takes) out of ``args``."""
    out: list[str] = []
    i = 0
    while i < len(args):
        name = args[i].split("=", 1)[0]
        if name in _CONNECTION:
            out.append(args[i])
            if "=" not in args[i] and i + 1 < len(args):
                out.append(args[i + 1])
                i += 1
        i += 1
    return out


def _rest(args: list[str]) -> list[str]:
    leading = _leading_connection(args)
    rest = list(args)
    for item in leading:
        rest.remove(item)
    return rest


def run(args: list[str]) -> int:
    options = parse(args)
    conn = Connection(options.endpoint, options.config, None, options.key, options.broker_key)
    body = b"x" * getattr(options, "size", 0)
    return RUNNERS[options.scenario](options, conn, body)


# ---------------------------------------------------------------- the watch every scenario runs under


class Watch:
    """Counters the load threads bump, a progress bar over them, and the stall rule."""

    def __init__(self, bars: dict[str, int], timeout: float) -> None:
        self.counts = dict.fromkeys(bars, 0)
        self.bars = bars
        self.timeout = timeout
        self.failures: list[BaseException] = []

    def run(self, threads: list[threading.Thread], *, forever: bool = False) -> float:
        """Start ``threads``, show progress until they end (or fail, or stall); seconds elapsed."""
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        start = time.perf_counter()
        with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
            tasks = {name: progress.add_task(name, total=total or None) for name, total in self.bars.items()}
            for thread in threads:
                thread.start()
            last_change, last_seen = time.monotonic(), -1
            while any(t.is_alive() for t in threads) and not self.failures:
                time.sleep(0.1)  # the bar's refresh rate; the loop ends by the stall rule below
                for name, task in tasks.items():
                    progress.update(task, completed=self.counts[name])
                seen = sum(self.counts.values())
                if seen != last_seen or forever:
                    last_change, last_seen = time.monotonic(), seen
                elif time.monotonic() - last_change > self.timeout + 1:
                    raise Timeout("mc0 bench: progress", self.timeout)
            for name, task in tasks.items():
                progress.update(task, completed=self.counts[name])
        if self.failures:
            first = self.failures[0]
            raise first if isinstance(first, Error) else Error(f"mc0 bench: {first}")
        return time.perf_counter() - start

    def thread(self, body: Callable[[], None]) -> threading.Thread:
        def guarded() -> None:
            try:
                body()
            except BaseException as exc:  # reported by the main thread
                self.failures.append(exc)

        return threading.Thread(target=guarded, daemon=True)


def _share(total: int, parts: int, i: int) -> int:
    return total // parts + (1 if i < total % parts else 0)


def _clients(conn: Connection, count: int) -> list[Client]:
    return [conn.client().connect() for _ in range(count)]


def _close(clients: list[Client]) -> None:
    for client in clients:
        client.close()


# ---------------------------------------------------------------- pub/sub


def run_pubsub(options: argparse.Namespace, conn: Connection, body: bytes) -> int:
    pubs = options.pub if options.scenario != "sub" else 0
    subs = options.sub if options.scenario != "pub" else 0
    total = options.msgs
    expected = total * subs  # (sub: each subscriber waits for --msgs)
    bars = {"published": total} if pubs else {}
    if subs:
        bars["delivered"] = expected
    watch = Watch(bars, options.timeout)
    subscribers = _clients(conn, subs)
    publishers: list[Client] = []
    try:
        subscriptions = [client.subscribe(options.topic) for client in subscribers]
        for client in subscribers:
            client.ping()  # the SUB is in place before anything is published
        publishers = _clients(conn, pubs)
        received = [0] * subs
        first: list[float] = []  # when the first message arrived (sub: the clock starts there)

        def consume(i: int) -> None:
            while received[i] < total:
                got = len(subscriptions[i].next_batch(10_000, timeout=options.timeout))
                if not first:
                    first.append(time.perf_counter())
                received[i] += got
                watch.counts["delivered"] += got

        def produce(i: int) -> None:
            client = publishers[i]
            for _ in range(_share(total, pubs, i)):
                client.publish(options.topic, body)
                watch.counts["published"] += 1
            client.ping()  # everything before it reached the broker

        threads = [watch.thread(functools.partial(consume, i)) for i in range(subs)]
        threads += [watch.thread(functools.partial(produce, i)) for i in range(pubs)]
        elapsed = watch.run(threads)
        if not pubs and first:  # subscribers only: from the first delivery (the publisher is elsewhere)
            elapsed = max(1e-9, time.perf_counter() - first[0])
        size = len(body)
        if pubs:
            sent = watch.counts["published"]
            print(
                f"pub: {pubs} publisher(s), {sent:,} msgs of {size} B in {elapsed:.2f}s: "
                f"{sent / elapsed:,.0f} msg/s, {sent * size / elapsed / 1e6:,.1f} MB/s"
            )
        if subs:
            got = watch.counts["delivered"]
            print(f"sub: {subs} subscriber(s), {got:,} msgs delivered: {got / elapsed:,.0f} msg/s in all")
        return 0
    finally:
        _close(publishers + subscribers)


# ---------------------------------------------------------------- RPC


def _echo(request: Request) -> bytes:
    return request.body


def _workers(options: argparse.Namespace, conn: Connection) -> list[Worker]:
    workers = []
    try:
        for _ in range(options.workers):
            worker = Worker(
                conn.endpoint,
                capacity=options.capacity,
                config=conn.config().client,
                key=conn.key,
                broker_key=conn.broker_key,
            )
            worker.service(options.service)(_echo)
            workers.append(worker.connect())  # returns once the broker confirmed the service
    except BaseException:
        _close(list(workers))
        raise
    return workers


def _callers(
    options: argparse.Namespace, clients: list[Client], body: bytes, watch: Watch, latencies: list[int]
) -> list[threading.Thread]:
    """One thread per client keeping ``--inflight`` requests in flight; each answer's latency (ns) is kept."""

    def call(i: int) -> None:
        client = clients[i]
        done: queue.SimpleQueue[Future[Reply]] = queue.SimpleQueue()
        began: dict[Future[Reply], int] = {}
        left = _share(options.msgs, options.clients, i)

        def submit() -> None:
            future = client.submit(options.service, body, timeout=options.timeout)
            began[future] = time.perf_counter_ns()
            future.add_done_callback(done.put)  # runs on mc0's loop thread: hands the future over

        for _ in range(min(left, options.inflight)):
            submit()
        left -= len(began)
        while began:
            try:
                future = done.get(timeout=options.timeout + 1)
            except queue.Empty:
                raise Timeout("mc0 bench: answers", options.timeout) from None
            now = time.perf_counter_ns()
            future.result()  # an ERROR raises here, and ends the run
            latencies.append(now - began.pop(future))
            watch.counts["calls"] += 1
            if left:
                left -= 1
                submit()

    return [watch.thread(functools.partial(call, i)) for i in range(options.clients)]


def run_request(options: argparse.Namespace, conn: Connection, body: bytes) -> int:
    workers = _workers(options, conn) if options.scenario == "rpc" else []
    watch = Watch({"calls": options.msgs}, options.timeout)
    clients: list[Client] = []
    try:
        clients = _clients(conn, options.clients)
        latencies: list[int] = []
        elapsed = watch.run(_callers(options, clients, body, watch, latencies))
        latencies.sort()
        p50, p99 = (latencies[min(len(latencies) - 1, int(len(latencies) * q))] / 1e6 for q in (0.5, 0.99))
        print(
            f"request: {options.clients} client(s) x {options.inflight} in flight, {len(latencies):,} calls of "
            f"{len(body)} B in {elapsed:.2f}s: {len(latencies) / elapsed:,.0f} calls/s, p50 {p50:.2f} ms, "
            f"p99 {p99:.2f} ms"
        )
        return 0
    finally:
        _close(clients)
        _close(list(workers))


def run_reply(options: argparse.Namespace, conn: Connection, body: bytes) -> int:
    workers = _workers(options, conn)
    watch = Watch({"served": 0}, options.timeout)
    stop = threading.Event()

    def serve() -> None:
        started = time.monotonic()
        while not stop.wait(0.1):
            watch.counts["served"] = sum(w.handled for w in workers)
            if options.seconds and time.monotonic() - started >= options.seconds:
                return

    try:
        print(f"reply: {options.workers} worker(s) serving {options.service}; Ctrl-C ends", flush=True)
        try:
            elapsed = watch.run([watch.thread(serve)], forever=True)
        except KeyboardInterrupt:
            elapsed = 0.0
        stop.set()
        served = sum(w.handled for w in workers)
        rate = f" in {elapsed:.2f}s: {served / elapsed:,.0f} calls/s" if elapsed else ""
        print(f"reply: {options.workers} worker(s) served {served:,} calls{rate}")
        return 0
    finally:
        stop.set()
        _close(list(workers))


RUNNERS: dict[str, Callable[[argparse.Namespace, Connection, bytes], int]] = {
    "pubsub": run_pubsub,
    "pub": run_pubsub,
    "sub": run_pubsub,
    "request": run_request,
    "reply": run_reply,
    "rpc": run_request,
}
