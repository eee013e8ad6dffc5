"""Spark scan benchmark: rows/s of ``spark.read.format("mc0")`` beside a plain Python source over the
same rows and the client's own fetch loop, all in one invocation.

- **client fetch**: one process paging the journal through ``mc0.Client.fetch``
  (the library's own loop: JSON pages, Record objects, no Spark).
- **client fetch_pages**: the same through ``mc0.Client.fetch_pages`` (columns
  pages of 4,000 records, no Record objects: what each Spark partition runs).
- **plain Python source**: a Python data source (no broker) whose partitions
  read the same rows from an Arrow IPC file on local disk and yield them as
  Arrow record batches of 1,000 rows: the ceiling of what Spark's Python data
  source path ingests here.
- **spark read**: ``spark.read.format("mc0")`` over the broker's journal.
- **spark read, topic filter**: the read as users write it, ``option("topics", FILTER)``
  (one topic of the four, ``--spark-topics``: a quarter of the records) then ``count(*)`` and
  ``sum(length(body))``; its rate is rows *returned* per second (the journal
  records it covers, four times as many, go by in the same time).
- **plain Python source, the filter's rows**: the plain source over an Arrow file
  of just the rows the filter returns, the same query and partition count: what
  Spark's Python data source path costs for those rows, the ceiling of the
  filtered read.
- **spark read, topic filter, broker NAME** (``--filter-broker NAME=PATH``): the
  filtered read against another broker process started with ``PYTHONPATH=PATH``
  (say an archive of another commit's ``mc0/``), filled alike: the broker side's
  before/after, interleaved in the same runs.

The first two Spark rows run the same query in ``local[2]`` with the same partitioning,
an aggregation over every column (count, sum of seqs, an xxhash64 of each
row's seq, ts, topic, sender and body, the headers' sizes and body bytes), so
Spark cannot prune a column, and the scan is what is timed.  The aggregate of
each run must equal the aggregate of the published records (computed from the
client fetch): a run that lost, duplicated or changed a record is FAILING; so is a
filtered run whose count or bytes differ from a Python filter over the records.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mc0.process import BrokerProcess
from mc0.spark.options import DEFAULT_PARTITION_RECORDS

ROWS_PER_BATCH = 1000
FILTER = "bench.t1"  # the filtered read's topics option: one topic of the TOPICS _fill publishes on
TOPICS = 4
FILTER_AGGREGATE = ["count(*) AS n", "sum(length(body)) AS bytes"]
AGGREGATE = [
    "count(*) AS n",
    "sum(seq) AS seqs",
    "sum(xxhash64(seq, ts, topic, sender, body) & 4294967295) AS digest",
    "sum(size(headers)) AS headers",
    "sum(length(body)) AS bytes",
]


def arrow_schema() -> Any:
    """The source's schema in Arrow (written out here, so this bench also runs against older checkouts;
    ``trace_id`` where this checkout's source has that column)."""
    import pyarrow as pa

    from mc0.spark.options import SCHEMA

    fields = [
        ("seq", pa.int64()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("topic", pa.string()),
        ("sender", pa.string()),
        ("headers", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()),
    ]
    if "trace_id" in SCHEMA:
        fields.append(("trace_id", pa.string()))
    return pa.schema(fields)


def _config(folder: Path) -> str:
    path = folder / "mc0.toml"
    path.write_text(
        f'[journals.main]\ntopics = ["bench.>"]\nfsync = "never"\nfolder = "{folder / "journal"}"\nmax_bytes = 0\n'
    )
    return str(path)


async def _fill(endpoint: str, count: int, size: int, topics: int = TOPICS) -> None:
    """``count`` journaled PUTs of ``size`` bytes on ``topics`` topics in turn (every tenth with an X- header),
    then wait until all are kept."""
    from mc0.aio import Client

    async with Client(endpoint, timeout=60) as client:
        for i in range(count):
            headers = {"X-i": str(i)} if i % 10 == 0 else None
            await client.publish(f"bench.t{i % topics}", (b"%08d" % i).ljust(size, b"x"), headers=headers)
        await client.flush()
        for _ in range(6000):  # bounded: 60 s
            if int((await client.journal_info())["main"]["next_seq"]) > count:
                return
            await asyncio.sleep(0.01)
    raise RuntimeError(f"the journal did not keep {count} records")


def fetch_all(endpoint: str, count: int) -> tuple[float, list[Any]]:
    """The client's own fetch loop over the journal: (rows/s, the records)."""
    from mc0.client import Client

    records: list[Any] = []
    started = time.perf_counter()
    with Client(endpoint, timeout=60) as client:
        seq = 0
        for _ in range(count + 1):  # bounded: at least one record per call
            page = client.fetch("main", from_seq=seq)
            records += page.records
            if page.next_seq >= page.end_seq:
                break
            seq = page.next_seq
    return len(records) / (time.perf_counter() - started), records


def fetch_pages_all(endpoint: str, count: int) -> tuple[float, dict[str, int]]:
    """``Client.fetch_pages`` over the journal (columns pages, no Record objects): (rows/s, the
    aggregate of what it read, computed after the clock stopped)."""
    from mc0.client import Client

    pages: list[Any] = []
    started = time.perf_counter()
    with Client(endpoint, timeout=60) as client:
        seq = 0
        for _ in range(count + 1):  # bounded: every call advances
            stream = client.fetch_pages("main", from_seq=seq, page_records=4000, page_bytes=4 << 20)
            pages += stream
            if stream.next_seq is None or stream.end_seq is None or stream.next_seq >= stream.end_seq:
                break
            seq = stream.next_seq
    rate = sum(p.count for p in pages) / (time.perf_counter() - started)
    records = [r for p in pages for r in p.records()]
    return rate, expected_aggregate(records)


def write_arrow_file(records: list[Any], path: Path) -> None:
    """The records in SCHEMA's Arrow layout, one IPC file (the plain source's input)."""
    import pyarrow as pa

    from mc0.protocol import trace_id

    schema = arrow_schema()
    rows = [
        {
            "seq": r.seq,
            "ts": round(r.ts * 1_000_000),
            "topic": r.topic,
            "sender": r.sender,
            "headers": list(r.headers.items()),
            "body": r.body,
        }
        for r in records
    ]
    if "trace_id" in schema.names:
        for row, r in zip(rows, records, strict=True):
            row["trace_id"] = trace_id(r.headers)
    table = pa.Table.from_pylist(rows, schema=schema)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=ROWS_PER_BATCH)


def plain_source(path: Path, per_partition: int, name: str = "mc0bench_plain", partitions: int = 0) -> type:
    """A Python data source ``name`` reading ``path`` (an Arrow IPC file) in partitions of ``per_partition``
    rows (or in ``partitions`` equal ones)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from mc0.spark.options import SCHEMA

    class Slice(InputPartition):
        def __init__(self, start: int, end: int) -> None:
            super().__init__((start, end))
            self.start, self.end = start, end

    class Reader(DataSourceReader):
        def __init__(self, rows: int) -> None:
            self.rows = rows

        def partitions(self) -> list[InputPartition]:
            count = partitions or max(1, -(-self.rows // per_partition))  # equal slices, as the mc0 source plans
            bounds = [self.rows * k // count for k in range(count + 1)]
            return [Slice(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            import pyarrow as pa

            assert isinstance(partition, Slice)
            with pa.memory_map(str(path)) as source:
                reader = pa.ipc.open_file(source)
                row = 0
                for i in range(reader.num_record_batches):
                    batch = reader.get_batch(i)
                    lo, hi = max(partition.start, row), min(partition.end, row + batch.num_rows)
                    if lo < hi:
                        yield batch.slice(lo - row, hi - lo)
                    row += batch.num_rows

    class PlainSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return SCHEMA

        def reader(self, schema: Any) -> Reader:
            return Reader(int(self.options["rows"]))

    return PlainSource


def expected_aggregate(records: list[Any]) -> dict[str, int]:
    """What AGGREGATE must give over ``records`` (Spark computes the digest; this the rest)."""
    return {
        "n": len(records),
        "seqs": sum(r.seq for r in records),
        "headers": sum(len(r.headers) for r in records),
        "bytes": sum(len(r.body) for r in records),
    }


def matching(records: list[Any], patterns: str) -> list[Any]:
    """The records a ``topics`` option of comma-separated patterns selects, by a Python filter."""
    from mc0.topics import pattern_matches, split_pattern, split_topic

    wanted = [split_pattern(p.strip()) for p in patterns.split(",") if p.strip()]
    return [r for r in records if not wanted or any(pattern_matches(p, split_topic(r.topic)) for p in wanted)]


def _scan(frame: Any, aggregate: list[str] = AGGREGATE) -> dict[str, int]:
    row = frame.selectExpr(*aggregate).collect()[0]
    return {k: int(v or 0) for k, v in row.asDict().items()}


def scan_rates(
    count: int,
    size: int,
    runs: int,
    say: Callable[[str], None],
    *,
    options: dict[str, str] | None = None,
    topics: str = FILTER,
    brokers: dict[str, str] | None = None,
    topic_count: int = TOPICS,
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Rows/s per system over ``runs`` interleaved runs, and the failed-run count per system."""
    import pyspark.cloudpickle as cloudpickle

    import benchmarks.spark_scan as this
    from mc0.client import Client
    from mc0.spark import make_session

    cloudpickle.register_pickle_by_value(this)  # the executors cannot import benchmarks/
    has_pages = hasattr(Client, "fetch_pages")  # not in a checkout from before columns pages
    rates: dict[str, list[float]] = {
        "client fetch": [],
        "client fetch_pages": [],
        "plain Python source": [],
        "spark read": [],
        "plain Python source, the filter's rows": [],
        "spark read, topic filter": [],
        **{f"spark read, topic filter, broker {name}": [] for name in brokers or {}},
    }
    failed = {name: 0 for name in rates}
    with tempfile.TemporaryDirectory(prefix="mc0-bench-") as tmp, contextlib.ExitStack() as others:
        with BrokerProcess(config=_config(Path(tmp)), insecure=True) as broker:
            say(f"publishing {count:,} records of {size} B")
            asyncio.run(_fill(broker.endpoint, count, size, topic_count))
            endpoints: dict[str, str] = {}
            for name, path in (brokers or {}).items():  # the same records, kept by another mc0
                folder = Path(tmp) / f"broker-{len(endpoints)}"
                folder.mkdir()
                env = {**os.environ, "PYTHONPATH": path}
                other = others.enter_context(BrokerProcess(config=_config(folder), insecure=True, env=env, cwd=tmp))
                say(f"publishing them again to broker {name} (PYTHONPATH={path})")
                asyncio.run(_fill(other.endpoint, count, size, topic_count))
                endpoints[name] = other.endpoint
            _, records = fetch_all(broker.endpoint, count)
            want = expected_aggregate(records)
            arrow_file = Path(tmp) / "rows.arrow"
            write_arrow_file(records, arrow_file)
            selected = matching(records, topics)
            want_filtered = {"n": len(selected), "bytes": sum(len(r.body) for r in selected)}
            filtered_file = Path(tmp) / "filtered.arrow"
            write_arrow_file(selected, filtered_file)
            say(f"the filtered read's topics option {topics!r} selects {want_filtered['n']:,} of the {count:,} records")
            del records, selected
            spark = make_session("local[2]", app="mc0-bench", scratch=str(Path(tmp) / "spark"))
            try:
                per_partition = int((options or {}).get("maxRecordsPerPartition", DEFAULT_PARTITION_RECORDS))
                spark.dataSource.register(plain_source(arrow_file, per_partition))
                ranges = max(1, -(-count // per_partition))  # the mc0 read's partitions (seq ranges)
                spark.dataSource.register(plain_source(filtered_file, per_partition, "mc0bench_filtered", ranges))
                plain = spark.read.format("mc0bench_plain").option("rows", str(count))
                plain_filtered = spark.read.format("mc0bench_filtered").option("rows", str(want_filtered["n"]))
                reader = spark.read.format("mc0").option("endpoint", broker.endpoint)
                filtered = spark.read.format("mc0").option("endpoint", broker.endpoint).option("topics", topics)
                for key, value in (options or {}).items():
                    reader = reader.option(key, value)
                    filtered = filtered.option(key, value)
                digest = _scan(plain.load())["digest"]  # warm up: Python workers, the lookups
                _scan(reader.load())
                _scan(filtered.load(), FILTER_AGGREGATE)
                want["digest"] = digest
                scans = [
                    ("plain Python source", plain, AGGREGATE, want),
                    ("spark read", reader, AGGREGATE, want),
                    ("plain Python source, the filter's rows", plain_filtered, FILTER_AGGREGATE, want_filtered),
                    ("spark read, topic filter", filtered, FILTER_AGGREGATE, want_filtered),
                ]
                for name, endpoint in endpoints.items():
                    other_filtered = spark.read.format("mc0").option("endpoint", endpoint).option("topics", topics)
                    for key, value in (options or {}).items():
                        other_filtered = other_filtered.option(key, value)
                    _scan(other_filtered.load(), FILTER_AGGREGATE)
                    scans.append(
                        (f"spark read, topic filter, broker {name}", other_filtered, FILTER_AGGREGATE, want_filtered)
                    )
                for run in range(runs):
                    rate, fetched = fetch_all(broker.endpoint, count)
                    rates["client fetch"].append(rate)
                    got = expected_aggregate(fetched)
                    del fetched
                    if {k: v for k, v in want.items() if k != "digest"} != got:
                        failed["client fetch"] += 1
                    if has_pages:
                        rate, got = fetch_pages_all(broker.endpoint, count)
                        rates["client fetch_pages"].append(rate)
                        if {k: v for k, v in want.items() if k != "digest"} != got:
                            failed["client fetch_pages"] += 1
                    for name, frame, aggregate, wanted in scans:
                        started = time.perf_counter()
                        result = _scan(frame.load(), aggregate)
                        rates[name].append(wanted["n"] / (time.perf_counter() - started))  # rows returned
                        if result != wanted:
                            failed[name] += 1
                            say(f"run {run + 1}: {name} FAILING: {result} != {wanted}")
                    say(
                        f"run {run + 1}: "
                        + ", ".join(f"{name} {values[-1]:,.0f} rows/s" for name, values in rates.items() if values)
                    )
            finally:
                spark.stop()
    return {name: values for name, values in rates.items() if values}, failed


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
