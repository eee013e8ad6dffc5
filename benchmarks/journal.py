"""Journal benchmark: confirmed PUT rate into a journal (per fsync policy) relative to a plain
confirmed PUT, and rows/s read into Spark relative to fetching the same records with the client.

Every broker is a real process on 127.0.0.1 with its own journal folder; each
figure is the median of ``--runs`` runs, and every ratio compares numbers
measured in this invocation (the box is shared: absolute rates drift, ratios hold).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from mc0.process import BrokerProcess

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


def spark_rates(count: int, size: int, runs: int, say: Any) -> dict[str, list[float]]:
    """Rows/s of spark.read.format('mc0') over ``count`` records vs the client's own fetch loop."""
    from mc0.client import Client
    from mc0.spark import make_session

    rates: dict[str, list[float]] = {"client fetch": [], "spark read": []}
    with tempfile.TemporaryDirectory(prefix="mc0-bench-") as tmp:
        with BrokerProcess(config=_config(Path(tmp), "never"), insecure=True) as broker:
            asyncio.run(_publish(broker.endpoint, count, size, 500))
            spark = make_session("local[2]", app="mc0-bench", scratch=str(Path(tmp) / "spark"))
            try:
                reader = spark.read.format("mc0").option("endpoint", broker.endpoint)
                reader.load().count()  # warm up: Python workers, the data source lookup
                for run in range(runs):
                    started = time.perf_counter()
                    with Client(broker.endpoint) as client:
                        seq, seen = 0, 0
                        for _ in range(count):  # bounded: at least one record per page
                            page = client.fetch("main", from_seq=seq)
                            seen += len(page.records)
                            if page.next_seq >= page.end_seq:
                                break
                            seq = page.next_seq
                    rates["client fetch"].append(seen / (time.perf_counter() - started))
                    started = time.perf_counter()
                    rows = reader.load().count()
                    rates["spark read"].append(rows / (time.perf_counter() - started))
                    client_rate, spark_rate = rates["client fetch"][-1], rates["spark read"][-1]
                    say(f"run {run + 1}: client {client_rate:,.0f} rows/s, spark {spark_rate:,.0f} rows/s")
                    if rows != count or seen != count:
                        raise RuntimeError(f"read {rows} rows in Spark, {seen} by fetch; published {count}")
            finally:
                spark.stop()
    return rates


def summarize(rates: dict[str, list[float]], baseline: str, unit: str) -> list[dict[str, Any]]:
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
        }
        for name, values in rates.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000, help="messages per PUT run")
    parser.add_argument("--size", type=int, default=256, help="body bytes")
    parser.add_argument("--window", type=int, default=256, help="confirmed PUTs in flight")
    parser.add_argument("--spark-count", type=int, default=100_000, help="records read into Spark")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark read (no JVM)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    for name in ("count", "size", "window", "spark_count", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    rows = summarize(put_rates(args.count, args.size, args.window, args.runs, console.log), "plain PUT", "msg/s")
    if not args.no_spark:
        rows += summarize(spark_rates(args.spark_count, args.size, args.runs, console.log), "client fetch", "rows/s")
    table = Table(title=f"journal benchmark (median of {args.runs}; ratios within this run)")
    for column in ("", "median", "min", "max", "ratio"):
        table.add_column(column, justify="right" if column else "left")
    for row in rows:
        table.add_row(
            row["name"],
            f"{row['median']:,.0f} {row['unit']}",
            f"{row['min']:,.0f}",
            f"{row['max']:,.0f}",
            f"{row['ratio']:.2f}x {row['baseline']}",
        )
    Console().print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 0
