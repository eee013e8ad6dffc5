"""Journal benchmark: confirmed PUT rate into a journal (per fsync policy) relative to a plain
confirmed PUT, and the Spark scan of a journal (benchmarks/spark_scan.py) beside a plain Python
source over the same rows and the client's own fetch loops, and a Spark read with a topic filter
(``--topics``) beside the plain scan and a plain source over the rows it returns; with ``--jetstream``, confirmed
publishes into an R3 JetStream journal through a broker beside nats-py straight into an R3 stream
(benchmarks/jetstream.py: three nats-server nodes, sync_interval always on both sides); with
``--file-vs-jetstream``, confirmed publishes into a file journal per fsync policy through a broker
beside nats-py into a one-node JetStream file stream at the matching sync setting
(benchmarks/file_vs_jetstream.py).

Every broker is a real process on 127.0.0.1 with its own journal folder; each
figure is the median of ``--runs`` runs, and every ratio compares numbers
measured in this invocation (the box is shared: absolute rates drift, ratios hold).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from mc0.process import BrokerProcess

from .common import build

POLICIES = ("always", "batch", "never")


def _config(folder: Path, fsync: str | None) -> str:
    text = "[broker]\nmin_ttl_ms = 50\n"
    if fsync is not None:
        text += f'[journals.main]\ntopics = ["bench.>"]\nfsync = "{fsync}"\nfolder = "{folder / "journal"}"\n'
        text += "max_bytes = 0\n"
    path = folder / "mc0.toml"
    path.write_text(text)
    return str(path)


async def _publish(endpoint: str, count: int, size: int, window: int) -> float:
    """Confirmed PUTs with ``window`` in flight; returns messages per second."""
    from mc0.aio import Client

    body = b"x" * size
    async with Client(endpoint, timeout=30) as client:
        started = time.perf_counter()
        for start in range(0, count, window):
            await asyncio.gather(
                *(client.publish("bench.put", body, confirm=True) for _ in range(min(window, count - start)))
            )
        return count / (time.perf_counter() - started)


def put_rates(count: int, size: int, window: int, runs: int, say: Any) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {"plain PUT": [], **{f"journal fsync={p}": [] for p in POLICIES}}
    for run in range(runs):
        for name, policy in [("plain PUT", None), *((f"journal fsync={p}", p) for p in POLICIES)]:
            with tempfile.TemporaryDirectory(prefix="mc0-bench-") as tmp:
                with BrokerProcess(config=_config(Path(tmp), policy), insecure=True) as broker:
                    rate = asyncio.run(_publish(broker.endpoint, count, size, window))
            rates[name].append(rate)
            say(f"run {run + 1}: {name}: {rate:,.0f} msg/s")
    return rates


def summarize(
    rates: dict[str, list[float]], baseline: str, unit: str, failed: dict[str, int] | None = None
) -> list[dict[str, Any]]:
    base = statistics.median(rates[baseline])
    return [
        {
            "name": name,
            "unit": unit,
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "runs": len(values),
            "ratio": statistics.median(values) / base,
            "baseline": baseline,
            "failed": (failed or {}).get(name, 0),
        }
        for name, values in rates.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000, help="messages per PUT run")
    parser.add_argument("--size", type=int, default=256, help="body bytes")
    parser.add_argument("--window", type=int, default=256, help="confirmed PUTs in flight")
    parser.add_argument("--spark-count", type=int, default=200_000, help="records scanned by Spark")
    parser.add_argument("--spark-size", type=int, default=100, help="body bytes of the scanned records")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark scan (no JVM)")
    parser.add_argument("--spark-only", action="store_true", help="only the Spark scan (no PUT rates)")
    parser.add_argument(
        "--jetstream",
        action="store_true",
        help="also: confirmed publishes into an R3 JetStream journal via a broker beside nats-py into an R3 stream",
    )
    parser.add_argument("--jetstream-only", action="store_true", help="only the JetStream rows (no JVM)")
    parser.add_argument(
        "--file-vs-jetstream",
        action="store_true",
        help="only (with --jetstream: also the R3 rows): a file journal via a broker at fsync=always/batch/never"
        " beside nats-py into one JetStream node, sync_interval=always (always, batch) or its default (never)",
    )
    parser.add_argument("--option", action="append", default=[], help="a mc0 source option KEY=VALUE (Spark scan)")
    parser.add_argument(
        "--topics",
        default=None,
        help="the filtered Spark read's topics option (default: bench.t1, one of --spark-topics)",
    )
    parser.add_argument(
        "--spark-topics", type=int, default=4, help="topics the scanned records go to in turn (bench.t0, bench.t1, ...)"
    )
    parser.add_argument(
        "--filter-broker",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also the filtered Spark read against a broker run with PYTHONPATH=PATH (another commit's mc0/)",
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    for name in ("count", "size", "window", "spark_count", "spark_size", "spark_topics", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    options = dict(o.split("=", 1) for o in args.option if "=" in o)
    rows = []
    only = args.spark_only or args.jetstream_only or args.file_vs_jetstream
    if not only:
        puts = put_rates(args.count, args.size, args.window, args.runs, console.log)
        rows += summarize(puts, "plain PUT", "msg/s")
    if args.jetstream or args.jetstream_only:
        from benchmarks.jetstream import jetstream_rates, names

        js, lost = jetstream_rates(args.count, args.size, args.window, args.runs, console.log)
        row = names(args.window)
        for ours, theirs in (("mc01", "js1"), ("mc0w", "jsw")):
            pair = {row[theirs]: js[row[theirs]], row[ours]: js[row[ours]]}
            rows += summarize(pair, row[theirs], "msg/s", {n: lost[n] for n in pair})
    if args.file_vs_jetstream:
        from benchmarks.file_vs_jetstream import file_vs_jetstream_rates, groups

        rates, missing = file_vs_jetstream_rates(args.count, args.size, args.window, args.runs, console.log)
        for baseline, compared in groups(args.window):
            pair = {name: rates[name] for name in (baseline, *compared)}
            rows += summarize(pair, baseline, "msg/s", {name: missing[name] for name in pair})
    if not args.no_spark and not args.jetstream_only and not args.file_vs_jetstream:
        from benchmarks.spark_scan import FILTER, scan_rates

        topics = args.topics or FILTER
        brokers = dict(b.split("=", 1) for b in args.filter_broker if "=" in b)
        scans, failed = scan_rates(
            args.spark_count,
            args.spark_size,
            args.runs,
            console.log,
            options=options,
            topics=topics,
            brokers=brokers,
            topic_count=args.spark_topics,
        )
        # The scans beside the plain source; the filtered read (rows it returns per second) and its
        # ceiling (the plain source over just those rows) beside the plain scan, as issue 30 compares them.
        filtered = [k for k in scans if k.startswith(("plain Python source, the filter's rows", "spark read, topic"))]
        whole = {k: v for k, v in scans.items() if k not in filtered}
        rows += summarize(whole, "plain Python source", "rows/s", failed)
        pair = {"spark read": scans["spark read"], **{k: scans[k] for k in filtered}}
        rows += summarize(pair, "spark read", "rows/s", failed)[1:]
    load = os.getloadavg()[0]
    table = Table(
        title=f"journal benchmark (median of {args.runs}; ratios within this run; mc0 build: {build()};"
        f" load average {load:.1f})"
    )
    for column in ("", "median", "min", "max", "ratio", "failed runs"):
        table.add_column(column, justify="right" if column else "left")
    for row in rows:
        table.add_row(
            row["name"],
            f"{row['median']:,.0f} {row['unit']}",
            f"{row['min']:,.0f}",
            f"{row['max']:,.0f}",
            f"{row['ratio']:.2f}x {row['baseline']}",
            f"{row['failed']} FAILING" if row["failed"] else "0",
        )
    Console(width=160).print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 1 if any(row["failed"] for row in rows) else 0
