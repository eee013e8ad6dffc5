"""The analytics job: Structured Streaming over a journal -> per-minute rollups.

Contract: ``run(spark, options)`` reads the journal with ``format("mc0")``
and, per micro-batch (``foreachBatch``):

1. writes the batch's events (minute, topic, sender, bytes, and for
   ``mc0.sys.rpc`` records service, status, latency) to
   ``OUTPUT/events/batch_id=N``, overwriting that folder, so a replayed
   batch replaces itself;
2. recomputes, from all events of the minutes the batch touched, the tables
   ``topics`` (minute, topic, messages, bytes), ``senders`` (the top senders
   per minute) and ``rpc`` (minute, service, requests, errors, error_rate,
   latency p50/p95/p99 in ms: exact, linearly interpolated percentiles), and
   overwrites those minutes' partitions (``minute_key=...``) of each table;
3. publishes each recomputed minute of each table on ``mc0.rollup.TABLE``
   (JSON rows) with a deterministic MSGID.

With the source's checkpoint this is exactly-once: a batch that ran halfway
is replayed with the same records and overwrites what it wrote.  Minutes are
UTC.  Records on ``mc0.rollup.*`` are not counted (the job would otherwise
feed itself).  Runs under ``mc0 pipeline``, or ``spark-submit`` of :mod:`mc0.cli.submit`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..protocol import SYS_RPC_TOPIC

ROLLUP_PREFIX = "mc0.rollup."
RPC_TOPIC = SYS_RPC_TOPIC
TABLES = ("topics", "senders", "rpc")
PERCENTILES = (0.5, 0.95, 0.99)
RPC_SCHEMA = (
    "service string, caller string, worker string, latency_ms double, status int, bytes_in long, bytes_out long"
)


@dataclass(frozen=True)
class PipelineOptions:
    endpoint: str | None = None
    journal: str = "main"
    key: str | None = None
    broker_key: str | None = None
    output: str = os.path.join("var", "pipeline")
    checkpoint: str | None = None  # default OUTPUT/_checkpoint
    once: bool = False
    trigger_seconds: int = 10
    max_records_per_trigger: int | None = None
    top_senders: int = 10
    publish: bool = True
    timeout: float | None = None  # seconds per broker call (the source's default: 30)
    extra_source_options: dict[str, str] = field(default_factory=dict)

    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint or os.path.join(self.output, "_checkpoint")

    def source_options(self) -> dict[str, str]:
        options = {"journal": self.journal, **self.extra_source_options}
        if self.endpoint:
            options["endpoint"] = self.endpoint
        if self.key:
            options["key"] = self.key
        if self.broker_key:
            options["brokerKey"] = self.broker_key
        if self.max_records_per_trigger:
            options["maxRecordsPerTrigger"] = str(self.max_records_per_trigger)
        if self.timeout is not None:
            options["timeout"] = str(max(1, round(self.timeout)))
        return options


def check_source(options: PipelineOptions) -> None:
    """Fail here, in one line, rather than as a stack trace from inside the query:
    a bad option, an unreachable broker, a refused key or an unknown journal."""
    from .options import ReadSettings

    ReadSettings.from_options(options.source_options()).head()


def events_of(batch: Any) -> Any:
    """Journal rows -> one compact event per record (rollups are not events)."""
    from pyspark.sql import functions as F

    rpc = F.from_json(F.col("body").cast("string"), RPC_SCHEMA)
    is_rpc = F.col("topic") == RPC_TOPIC
    return batch.where(~F.col("topic").startswith(ROLLUP_PREFIX)).select(
        F.date_trunc("minute", "ts").alias("minute"),
        "topic",
        "sender",
        F.length("body").cast("long").alias("bytes"),
        F.when(is_rpc, rpc.getField("service")).alias("service"),
        F.when(is_rpc, rpc.getField("status")).alias("status"),
        F.when(is_rpc, rpc.getField("latency_ms")).alias("latency_ms"),
    )


def rollups(events: Any, top_senders: int) -> dict[str, Any]:
    """The three tables from a set of events (all events of the minutes concerned)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    minute_key = F.date_format("minute", "yyyy-MM-dd'T'HH:mm").alias("minute_key")
    topics = events.groupBy("minute", "topic").agg(F.count(F.lit(1)).alias("messages"), F.sum("bytes").alias("bytes"))
    ranked = Window.partitionBy("minute").orderBy(F.desc("messages"), F.asc("sender"))
    senders = (
        events.groupBy("minute", "sender")
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("bytes").alias("bytes"))
        .withColumn("rank", F.row_number().over(ranked))
        .where(F.col("rank") <= top_senders)
    )
    calls = events.where(F.col("service").isNotNull())
    quantiles = F.expr(f"percentile(latency_ms, array({', '.join(map(str, PERCENTILES))}))")
    rpc = (
        calls.groupBy("minute", "service")
        .agg(
            F.count(F.lit(1)).alias("requests"),
            F.sum(F.when(F.col("status") != 200, 1).otherwise(0)).alias("errors"),
            quantiles.alias("q"),
            F.avg("latency_ms").alias("latency_avg_ms"),
        )
        .select(
            "minute",
            "service",
            "requests",
            "errors",
            (F.col("errors") / F.col("requests")).alias("error_rate"),
            F.col("q")[0].alias("latency_p50_ms"),
            F.col("q")[1].alias("latency_p95_ms"),
            F.col("q")[2].alias("latency_p99_ms"),
            "latency_avg_ms",
        )
    )
    return {
        name: table.select("*", minute_key) for name, table in (("topics", topics), ("senders", senders), ("rpc", rpc))
    }


class Publisher:
    """Rollups back onto the bus (one connection for the job's life, opened on first use)."""

    def __init__(self, options: PipelineOptions) -> None:
        self.options = options
        self._client: Any = None

    def publish(self, table: str, minute_key: str, batch_id: int, rows: list[dict[str, Any]]) -> None:
        if self._client is None:
            from ..client import Client

            extra: dict[str, Any] = {}
            if self.options.key:
                extra["key"] = self.options.key
            if self.options.broker_key:
                extra["broker_key"] = self.options.broker_key
            self._client = Client(self.options.endpoint, **extra).connect()
        body = json.dumps({"table": table, "minute": minute_key, "rows": rows}, default=str).encode()
        msgid = f"rollup:{table}:{minute_key}:{batch_id}"
        self._client.publish(ROLLUP_PREFIX + table, body, confirm=True, msgid=msgid)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def process_batch(spark: Any, batch: Any, batch_id: int, options: PipelineOptions, publisher: Publisher | None) -> int:
    """One micro-batch (see the module docstring); returns how many events it held."""
    from pyspark.sql import functions as F

    events_dir = os.path.join(options.output, "events")
    events = events_of(batch).cache()
    try:
        count = int(events.count())
        if not count:
            return 0
        events.write.mode("overwrite").parquet(os.path.join(events_dir, f"batch_id={batch_id}"))
        touched = [row.minute for row in events.select("minute").distinct().collect()]
    finally:
        events.unpersist()
    history = spark.read.parquet(events_dir).where(F.col("minute").isin(touched)).drop("batch_id")
    for name, table in rollups(history, options.top_senders).items():
        table = table.cache()
        try:
            table.write.mode("overwrite").partitionBy("minute_key").parquet(os.path.join(options.output, name))
            if publisher is not None:
                by_minute: dict[str, list[dict[str, Any]]] = {}
                for row in table.drop("minute").collect():
                    fields = row.asDict()
                    by_minute.setdefault(fields.pop("minute_key"), []).append(fields)
                for minute_key, rows in sorted(by_minute.items()):
                    publisher.publish(name, minute_key, batch_id, rows)
        finally:
            table.unpersist()
    return count


def run(
    spark: Any, options: PipelineOptions, on_progress: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, int]:
    """Run the streaming job until it ends (``once``) or is interrupted; returns totals."""
    from ..errors import Error
    from .probe import cause_of, check_workers

    check_source(options)
    check_workers(spark)  # a handed-in session may run a python3 without mc0: say so now, in one line
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    publisher = Publisher(options) if options.publish else None
    totals = {"batches": 0, "events": 0}

    def each(batch: Any, batch_id: int) -> None:
        totals["events"] += process_batch(spark, batch, batch_id, options, publisher)
        totals["batches"] += 1

    reader = spark.readStream.format("mc0")
    for key, value in options.source_options().items():
        reader = reader.option(key, value)
    writer = reader.load().writeStream.foreachBatch(each).option("checkpointLocation", options.checkpoint_dir)
    if options.once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{options.trigger_seconds} seconds")
    query = writer.start()
    try:
        while query.isActive:
            query.awaitTermination(0.5)
            if on_progress is not None and query.lastProgress:
                on_progress(dict(query.lastProgress))
        error = query.exception()
        if error is not None:
            raise Error(f"the pipeline query failed: {cause_of(str(error))}")
    except KeyboardInterrupt:
        query.stop()
    finally:
        if publisher is not None:
            publisher.close()
    return totals


def _seq_of(offset: object) -> int | None:
    """The ``seq`` of a source offset as Spark reports it (a JSON string or a dict)."""
    if isinstance(offset, str):
        try:
            offset = json.loads(offset)
        except ValueError:
            return None
    if isinstance(offset, dict) and isinstance(offset.get("seq"), int):
        return int(offset["seq"])
    return None


def progress_line(event: dict[str, Any]) -> str:
    """One line per micro-batch: batch id, records, rate, the seq reached and how far behind the
    journal's head it is (from the source's endOffset / latestOffset)."""
    rate = float(event.get("processedRowsPerSecond") or 0.0)
    line = f"batch {event.get('batchId')}: {int(event.get('numInputRows') or 0):,} records ({rate:,.0f}/s)"
    sources = event.get("sources") or []
    source = sources[0] if sources and isinstance(sources[0], dict) else {}
    reached, head = _seq_of(source.get("endOffset")), _seq_of(source.get("latestOffset"))
    if reached is not None:
        line += f", journal seq {reached:,}"
        if head is not None:
            line += f", {max(0, head - reached):,} behind the head"
    return line
