"""Across brokers: pub/sub and RPC through a cluster of mc0 brokers, beside one broker and a NATS cluster.

Contract: ``run_cluster(options, say)`` returns one :class:`Row` per scenario and
system (``suite="cluster"``), each the median of ``options.runs`` runs, with the
same load processes as the library suite (:mod:`benchmarks.library_mc0`,
:mod:`benchmarks.library_nats`).  One NATS cluster of three nodes (routes,
JetStream with ``sync_interval: always``: :class:`mc0.natsproc.NatsCluster`)
serves the whole invocation.  Systems:

- ``mc0 cluster``: three fresh brokers per run joined over that NATS cluster;
  the publisher (or RPC client) at b1, the subscribers at b2 (1->4: two at b2,
  two at b3), the worker at b3: every message and request crosses a broker.
- ``mc0 single``: one fresh broker per run, every process on it (the baseline
  the cluster is held to: >= 0.8x).
- ``nats cluster``: nats-py on the same three nodes, publisher on n1,
  subscribers on n2 (and n3), responder on n3, requester on n1 (the baseline:
  >= 1.0x).
- ``mc0 cluster NAME`` and ``mc0 single NAME`` (``--compare NAME=PATH``): the
  same with brokers whose ``mc0`` comes from ``PATH`` (another checkout, or a
  folder holding a copy of ``mc0/``), for before/after in one invocation.

Runs are interleaved: every system's first run, then every system's second,
the order rotated each time (this box's speed drifts between minutes).

The load starts only once the publisher's broker knows the subscribers'
interest (cross-broker interest is eventual: docs/ARCHITECTURE.md "The
cluster").  A row that lost a message or had an RPC error is failing.  CPU per
delivered message (per call) is summed over every broker (every nats-server
node) of the system.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mc0.natsproc import NatsCluster
from mc0.process import BrokerProcess

from .common import BODY, WINDOW, Options, Row, build, cpu_seconds
from .library import MAINS, Crew, errors_of
from .library_load import QUIET, TOPIC, percentile

SYSTEMS = ("mc0 cluster", "mc0 single", "nats cluster")
COMPARED: dict[str, str] = {}  # NAME -> PATH of --compare: "mc0 cluster NAME" / "mc0 single NAME" run its mc0
PROBLEMS: dict[int, list[str]] = {}  # id(row) -> what went wrong in its runs so far
HELLO_MS = 100


@dataclass(frozen=True)
class Layout:
    """Where each role connects, and the processes whose CPU the row counts."""

    publisher: str
    subscribers: tuple[str, ...]  # one per subscriber, round the brokers
    worker: str
    client: str
    pids: tuple[int, ...]


def scenarios(options: Options) -> list[dict[str, Any]]:
    count = 300 if options.quick else options.count
    seconds = 0.3 if options.quick else options.seconds
    return [
        {"name": "cluster pub/sub 1->1", "kind": "pubsub", "subs": 1, "count": count, "unit": "deliveries/s"},
        {"name": "cluster pub/sub 1->4", "kind": "pubsub", "subs": 4, "count": count, "unit": "deliveries/s"},
        {"name": "cluster RPC sequential", "kind": "rpc", "window": 1, "seconds": seconds, "unit": "calls/s"},
        {"name": "cluster RPC 100 in flight", "kind": "rpc", "window": WINDOW, "seconds": seconds, "unit": "calls/s"},
    ]


def _broker_config(root: Path, name: str, urls: list[str]) -> Path:
    path = root / f"{name}.toml"
    path.write_text(f"[cluster]\nnats = {json.dumps(urls)}\nname = {json.dumps(name)}\nhello_ms = {HELLO_MS}\n")
    return path


def _joined(endpoint: str, others: int, timeout: float = 20.0) -> None:
    import mc0

    with mc0.Client(endpoint) as client:
        for _ in range(int(timeout / 0.05)):
            stats = json.loads(client.request("mc0.broker", b"stats", timeout=5).body)
            if len(stats["cluster"]["brokers"]) >= others:
                return
            time.sleep(0.05)
    raise RuntimeError(f"brokers not joined within {timeout:g} s")


def _knows(endpoint: str, what: str, count: int, timeout: float = 20.0) -> None:
    """Poll the broker at ``endpoint`` until ``count`` routes announced something that names ``what``."""
    import mc0

    with mc0.Client(endpoint) as client:
        for _ in range(int(timeout / 0.05)):
            stats = json.loads(client.request("mc0.broker", b"stats", timeout=5).body)
            routes = stats["cluster"]["routes"].values()
            if sum(1 for route in routes if what in json.dumps(route)) >= count:
                return
            time.sleep(0.05)
    raise RuntimeError(f"{what} not announced by {count} brokers within {timeout:g} s")


def _broker_env(system: str) -> dict[str, str] | None:
    """The environment of a compared system's brokers (PYTHONPATH first names its mc0); None: this one's."""
    name = system.split(" ", 2)[2] if system.count(" ") >= 2 else ""
    if not name:
        return None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (COMPARED[name], env.get("PYTHONPATH", "")) if p)
    return env


@contextlib.contextmanager
def layout(system: str, nats: NatsCluster, subs: int) -> Iterator[Layout]:
    env = _broker_env(system)
    if system == "nats cluster":
        urls = nats.urls(user="open")
        pids = tuple(p.pid for p in nats.procs if p is not None)
        spread = tuple(urls[1 + i % 2] for i in range(subs))
        yield Layout(urls[0], spread, urls[2], urls[0], pids)
        return
    with tempfile.TemporaryDirectory() as folder:  # cwd: `python -m mc0` must not import ./mc0
        root = Path(folder)
        if system.startswith("mc0 single"):
            with BrokerProcess(insecure=True, cwd=folder, env=env) as broker:
                assert broker.proc is not None
                e = broker.endpoint
                yield Layout(e, (e,) * subs, e, e, (broker.proc.pid,))
            return
        urls = nats.urls()
        brokers = [
            BrokerProcess(
                config=str(_broker_config(root, f"b{i + 1}", urls[i:] + urls[:i])), insecure=True, cwd=folder, env=env
            )
            for i in range(3)
        ]
        with contextlib.ExitStack() as stack:
            for broker in brokers:
                stack.enter_context(broker)
            e = [b.endpoint for b in brokers]
            _joined(e[0], 2)
            pids = tuple(b.proc.pid for b in brokers if b.proc is not None)
            yield Layout(e[0], tuple(e[1 + i % 2] for i in range(subs)), e[2], e[0], pids)


def _cpu(pids: tuple[int, ...]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


THREAD_KINDS = ("main", "link", "io")


Threads = dict[tuple[int, int], tuple[str, float]]  # (pid, tid) -> (kind, CPU seconds so far)


def _threads_cpu(pids: tuple[int, ...]) -> Threads:
    """Each thread's (kind, CPU seconds so far) by (pid, tid): ``main`` (the broker loop), ``io`` (libzmq's
    I/O threads, named ZMQbg/...), ``link`` (the rest: the cluster link's thread)."""
    import psutil  # type: ignore[import-untyped]

    out: Threads = {}
    for pid in pids:
        try:
            threads = psutil.Process(pid).threads()
        except psutil.Error:
            continue
        for thread in threads:
            try:
                name = Path(f"/proc/{pid}/task/{thread.id}/comm").read_text().strip()
            except OSError:
                name = ""
            kind = "main" if thread.id == pid else "io" if name.startswith("ZMQbg") else "link"
            out[(pid, thread.id)] = (kind, thread.user_time + thread.system_time)
    return out


def _by_kind(before: Threads, after: Threads) -> dict[str, float]:
    spent = dict.fromkeys(THREAD_KINDS, 0.0)
    for key, (kind, cpu) in after.items():
        spent[kind] += cpu - before.get(key, (kind, 0.0))[1]
    return spent


def pubsub_once(system: str, where: Layout, spec: dict[str, Any], options: Options) -> dict[str, Any]:
    mains = MAINS["nats" if system == "nats cluster" else "mc0-aio"]
    assert mains.subscriber is not None and mains.publisher is not None
    subs, count = spec["subs"], spec["count"]
    limit_s = 60 + count / 2000
    quiet_s = 1.0 if options.quick else QUIET
    with Crew() as crew:
        for endpoint in where.subscribers:
            crew.start(mains.subscriber, endpoint, {}, count, False, limit_s, quiet_s)
        crew.start(mains.publisher, where.publisher, {}, count, BODY, 0)
        crew.wait_ready(subs + 1, 90)
        if system.startswith("mc0 cluster"):
            _knows(where.publisher, TOPIC.rpartition(".")[0], len(set(where.subscribers)))
        cpu, threads = _cpu(where.pids), _threads_cpu(where.pids)
        crew.link.go.set()
        results = crew.collect({"pub": 1, "sub": subs}, limit_s + 60)
        cpu, threads = _cpu(where.pids) - cpu, _by_kind(threads, _threads_cpu(where.pids))
    pub = next((r for role, r in results if role == "pub"), {})
    received = [r for role, r in results if role == "sub"]
    published = int(pub.get("published", 0))
    delivered = sum(int(r.get("delivered", 0)) for r in received)
    times = [r for r in received if r.get("delivered")]
    span = (max(r["last_ns"] for r in times) - min(r["first_ns"] for r in times)) / 1e9 if times else 0.0
    return {
        "rate": delivered / span if span > 0 else 0.0,
        "published": published,
        "expected": published * subs,
        "delivered": delivered,
        "lost": max(0, published * subs - delivered),
        "cpu_us_per_msg": cpu * 1e6 / delivered if delivered else 0.0,
        **{f"{kind}_us_per_msg": spent * 1e6 / max(1, delivered) for kind, spent in threads.items()},
        "crashes": errors_of(results),
    }


def rpc_once(system: str, where: Layout, spec: dict[str, Any]) -> dict[str, Any]:
    mains = MAINS["nats" if system == "nats cluster" else "mc0-aio"]
    with Crew() as crew:
        crew.start(mains.worker, where.worker, {}, 0)
        crew.wait_ready(1, 90)
        if system.startswith("mc0 cluster"):
            _knows(where.client, '"bench"', 1)
        crew.start(mains.client, where.client, {}, spec["window"], spec["seconds"], 0)
        crew.wait_ready(1, 90)
        cpu, threads = _cpu(where.pids), _threads_cpu(where.pids)
        crew.link.go.set()
        results = crew.collect({"client": 1}, spec["seconds"] + 120)
        cpu, threads = _cpu(where.pids) - cpu, _by_kind(threads, _threads_cpu(where.pids))
    client = next((r for role, r in results if role == "client"), {})
    latencies = sorted(client.get("latencies_ns", ()))
    calls = len(latencies)
    return {
        "rate": calls / client["seconds"] if client.get("seconds") else 0.0,
        "calls": calls,
        "errors": int(client.get("errors", 0)),
        "p50_ms": percentile(latencies, 0.50) / 1e6,
        "cpu_us_per_msg": cpu * 1e6 / calls if calls else 0.0,
        **{f"{kind}_us_per_msg": spent * 1e6 / max(1, calls) for kind, spent in threads.items()},
        "crashes": errors_of(results) + ([f"client: {client['first_error']}"] if "first_error" in client else []),
    }


# py-spy stages of the client's broker (b1) on the RPC path, per thread. A sample whose leaf is the poll (the
# loop) or the selector (the link's asyncio loop) is waiting; any other goes to the stage of its innermost frame
# that is not asyncio's, selectors' or threading's own (those only when nothing else is on the stack).
SPY_WAITING = ("Poller.poll", "EpollSelector.select")
SPY_GENERIC = ("asyncio/", "selectors.py", "threading.py", "<frozen", "runpy", "click/", "mc0/cli/")
SPY_STAGES = (
    (
        "hand-over between loop and link thread",
        ("cluster/link.py", "zmq/", "Poster.", "call_soon_threadsafe", "_write_to_self"),
    ),
    ("nats-py: read, parse, subscription task", ("_read_loop", "Parser.", "_process_msg", "_wait_for_msgs")),
    ("nats-py: publish, flusher, socket write", ("nats/",)),
    ("route codec, route inbox/outbox (link thread)", ("protocol/routes.py", "cluster/inbound.py", "outbound.py")),
    ("cluster listener, routed (loop)", ("listeners.py", "routed.py")),
    ("zmq ROUTER send / receive (loop)", ("send_frames", "_recv_rest")),
    ("core, delivery, outbox, loop (loop)", ("mc0/",)),
)


def _spy_stage(frames: list[str]) -> str:
    if any(needle in frames[-1] for needle in SPY_WAITING):
        return "waiting (poll / epoll)"
    for frame in reversed(frames):
        if any(generic in frame for generic in SPY_GENERIC):
            continue
        for stage, needles in SPY_STAGES:
            if any(needle in frame for needle in needles):
                return stage
    return "asyncio loop itself, other"


def spy_once(system: str, nats: NatsCluster, spec: dict[str, Any]) -> dict[str, dict[str, float]]:
    """One run of ``spec`` with py-spy (``--threads``, 250 Hz) on the client's broker: per thread ("loop",
    "link"), each stage's share of that thread's samples."""
    import shutil
    import signal
    import subprocess
    import sys

    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    counts: dict[str, dict[str, int]] = {"loop": {}, "link": {}}
    with tempfile.TemporaryDirectory() as folder, layout(system, nats, 1) as where:
        out = Path(folder) / "spy.txt"
        command = [spy, "record", "-p", str(where.pids[0]), "-o", str(out), "-f", "raw", "-r", "250", "--threads"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            rpc_once(system, where, spec)
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(60)
        for line in out.read_text().splitlines() if out.exists() else []:
            stack, _, n = line.rpartition(" ")
            frames = stack.split(";")
            if not n.isdigit() or len(frames) < 2:
                continue
            thread = "loop" if "MainThread" in frames[0] else "link" if "ClusterLink" in stack else ""
            if thread:
                stage = _spy_stage(frames[1:])
                counts[thread][stage] = counts[thread].get(stage, 0) + int(n)
    return {t: {s: n / max(1, sum(c.values())) for s, n in c.items()} for t, c in counts.items()}


def measure_row(spec: dict[str, Any], system: str, nats: NatsCluster, options: Options, row: Row | None = None) -> Row:
    """``options.runs`` runs of one system (or one more into ``row``), as a failing row if one broke."""
    row = row or Row(spec["name"], system, spec["unit"], suite="cluster")
    problems = PROBLEMS.setdefault(id(row), [])  # (every run's, for the row's note)
    try:
        for _ in range(1 if options.quick else options.runs):
            with layout(system, nats, spec.get("subs", 1)) as where:
                if spec["kind"] == "rpc":
                    got = rpc_once(system, where, spec)
                    row.add_counts(calls=got["calls"], errors=got["errors"] + len(got["crashes"]))
                    row.add_extra("p50_ms", got["p50_ms"])
                else:
                    got = pubsub_once(system, where, spec, options)
                    row.add_counts(
                        published=got["published"],
                        expected=got["expected"],
                        delivered=got["delivered"],
                        lost=got["lost"],
                        errors=len(got["crashes"]),
                    )
                problems += got["crashes"]
                row.values.append(got["rate"])
                for name in ("cpu_us_per_msg", *(f"{kind}_us_per_msg" for kind in THREAD_KINDS)):
                    row.add_extra(name, got[name])
    except Exception as exc:  # a broken run is reported, not fatal (and the row fails)
        problems.append(f"failed: {type(exc).__name__}: {exc}")
        row.add_counts(errors=1)
    notes = [f"LOSS {row.counts['lost']}"] if row.counts.get("lost") else []
    if row.counts.get("errors"):
        notes.append(f"ERRORS {row.counts['errors']}")
    row.note = "; ".join(notes + list(dict.fromkeys(problems))[:2])[:300]
    return row


def systems() -> list[str]:
    compared = [f"mc0 {kind} {name}" for name in COMPARED for kind in ("cluster", "single")]
    return [*SYSTEMS, *compared]


def run_cluster(options: Options, say: Callable[[str], None] = print) -> list[Row]:
    rows: list[Row] = []
    once = dataclasses.replace(options, runs=1)
    with tempfile.TemporaryDirectory() as folder, NatsCluster(Path(folder) / "nats") as nats:
        nats.wait_ready()
        for spec in scenarios(options):
            if not options.wants(spec["name"]):
                continue
            wanted = [s for s in systems() if options.wants_system(s)]
            measured = {s: Row(spec["name"], s, spec["unit"], suite="cluster") for s in wanted}
            for run in range(1 if options.quick else options.runs):
                for system in wanted[run % len(wanted) :] + wanted[: run % len(wanted)]:
                    started = time.monotonic()
                    row = measure_row(spec, system, nats, once, measured[system])
                    figure = f"{row.values[-1]:>12,.1f}" if row.values else f"{'-':>12}"
                    say(f"  {spec['name']:<28} {system:<20} {figure} {spec['unit']}"
                        f" ({time.monotonic() - started:.0f} s) {row.note}")  # fmt: skip
            rows += measured.values()
    return rows


def ratios(rows: list[Row]) -> list[tuple[str, float, float, bool]]:
    """Per scenario (and compared mc0): mc0 cluster / mc0 single and mc0 cluster / nats cluster, and
    whether any row failed."""
    found = []
    for name in dict.fromkeys(r.scenario for r in rows):
        by = {r.system: r for r in rows if r.scenario == name}
        nats = by.get("nats cluster")
        for suffix in ["", *(f" {n}" for n in COMPARED)]:
            cluster, single = by.get(f"mc0 cluster{suffix}"), by.get(f"mc0 single{suffix}")
            if cluster is None or single is None or nats is None:
                continue
            failing = any(r.failing for r in (cluster, single, nats))
            vs_single = cluster.median / max(single.median, 1e-9)
            found.append((name + suffix, vs_single, cluster.median / max(nats.median, 1e-9), failing))
    return found


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="mc0 across brokers vs one broker vs a NATS cluster (nats-py)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=20_000, help="pub/sub: messages per run")
    parser.add_argument("--seconds", type=float, default=1.5, help="RPC: length of each run")
    parser.add_argument("--only", default="", help="comma-separated scenario name substrings")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny loads, one run")
    parser.add_argument("--json", default="", help="write the rows here")
    parser.add_argument(
        "--spy", action="store_true", help="instead: one RPC sequential run of each mc0 cluster under py-spy (b1)"
    )
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also run brokers whose mc0 comes from PATH (rows 'mc0 cluster NAME', 'mc0 single NAME')",
    )
    args = parser.parse_args(argv)
    COMPARED.update(item.partition("=")[::2] for item in args.compare)
    if args.spy:
        wanted = Options(seconds=max(3.0, args.seconds))
        spec = next(s for s in scenarios(wanted) if s["name"] == "cluster RPC sequential")
        named = ["mc0 cluster", *(f"mc0 cluster {name}" for name in COMPARED)]
        with tempfile.TemporaryDirectory() as folder, NatsCluster(Path(folder) / "nats") as nats:
            nats.wait_ready()
            shares = {system: spy_once(system, nats, spec) for system in named}
        for thread in ("loop", "link"):
            print(f"\npy-spy, cluster RPC sequential, the client's broker, {thread} thread: share of its samples")
            print("| stage | " + " | ".join(shares) + " |\n|---|" + "---:|" * len(shares))
            for stage in ["waiting (poll / epoll)", *(s for s, _ in SPY_STAGES), "asyncio loop itself, other"]:
                cells = " | ".join(f"{got[thread].get(stage, 0.0):.1%}" for got in shares.values())
                print(f"| {stage} | {cells} |")
        return 0
    options = Options(
        runs=args.runs,
        count=args.count,
        seconds=args.seconds,
        quick=args.quick,
        only=tuple(o for o in args.only.split(",") if o),
    )
    started = time.monotonic()
    load = os.getloadavg()[0]
    rows = run_cluster(options)
    took = time.monotonic() - started
    print(f"\nacross brokers (3 brokers over 3 NATS nodes), median of {options.runs} runs, {took:.0f} s")
    print(f"(mc0 build: {build()}; load average {load:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"{'scenario':<36} {'vs one broker':>14} {'vs NATS cluster':>16}")
    failed = False
    for name, vs_single, vs_nats, failing in ratios(rows):
        failed |= failing
        print(f"{name:<36} {vs_single:>13.2f}x {vs_nats:>15.2f}x{'  FAILING' if failing else ''}")
    print(f"\n{'scenario':<28} {'system':<20} {'median':>12} {'min-max':>22} {'CPU us/msg':>11}  "
          "(mc0: main loops + link threads + zmq I/O, summed over brokers)")  # fmt: skip
    for row in rows:

        def cpu(name: str, row: Row = row) -> float:
            return statistics.median(row.extra.get(name) or [0.0])

        spread = f"{min(row.values):,.0f}-{max(row.values):,.0f}" if row.values else ""
        split = " + ".join(f"{cpu(f'{kind}_us_per_msg'):.1f}" for kind in THREAD_KINDS)
        split = f"({split})" if row.system.startswith("mc0") else ""
        print(f"{row.scenario:<28} {row.system:<20} {row.median:>12,.0f} {spread:>22} "
              f"{cpu('cpu_us_per_msg'):>11.1f}  {split} {row.note}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in rows], indent=1, default=str))
    return 1 if failed or any(r.failing for r in rows) else 0
