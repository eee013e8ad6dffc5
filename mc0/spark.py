"""The ``mc0`` PySpark data source and sink (Python Data Source API, pyspark >= 4.2).

Contract: ``spark.read.format("mc0")`` / ``spark.readStream.format("mc0")``
read one journal of a broker through the built-in ``mc0.journal`` service;
``df.write.format("mc0")`` / ``df.writeStream.format("mc0")`` publish rows.
Registered as ``mc0`` without user code through the top-level module
``pyspark_mc0``; ``register(spark)`` does it explicitly.

Offsets are journal sequence numbers (``{"seq": n}``, the next seq to
read); a partition is a range ``[start, end)`` fetched by an executor over
its own connection (CURVE when ``key``/``brokerKey`` are given), so a batch
or micro-batch reads the same records however often it is replayed, which is
what makes a checkpointed query exactly-once end to end with an idempotent
sink.  ``startingOffsets``: ``earliest`` (the oldest record kept, the
default), ``latest`` (what is published after the query starts; resolved by
the first micro-batch and recorded in its checkpoint, so a replay of batch 0
is the same) or a number / ``{"seq": n}``.

Options (read): endpoint, journal (default ``main``), topics (comma-separated
patterns), key, brokerKey, startingOffsets, endingOffsets (batch, default
``latest``), maxRecordsPerTrigger, maxRecordsPerPartition (default 10000),
failOnDataLoss (default true: a range trimmed by retention fails the query;
false skips to the oldest record kept), timeout (seconds).
Options (write): endpoint, key, brokerKey, msgidPrefix, timeout, window
(confirmations in flight).  Rows need ``topic`` and ``body``; ``headers``
(map of ``X-`` headers) and ``msgid`` are optional.  Without ``msgid`` each
row gets a deterministic one (prefix, batch, partition, row index and a digest
of the row), so a replayed batch is acknowledged as duplicates on a
journaled topic instead of being published twice.

Executors import this module: they need mc0 installed and ``PYSPARK_PYTHON``
pointing at that interpreter (``mc0 pipeline`` sets it for local runs).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from .errors import ConfigError, Gone

SOURCE_NAME = "mc0"
SCHEMA = "seq long, ts timestamp, topic string, sender string, headers map<string,string>, body binary"
DEFAULT_JOURNAL = "main"
DEFAULT_PARTITION_RECORDS = 10_000
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by Spark's micro-batch engine on every task


def _int_option(options: Mapping[str, str], name: str, default: int | None, minimum: int = 1) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw))
    except ValueError:
        raise ConfigError(f"option {name}", f"must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"option {name}", f"must be at least {minimum}, got {value}")
    return value


def _bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = str(options.get(name, default)).lower()
    if raw not in ("true", "false"):
        raise ConfigError(f"option {name}", f"must be true or false, got {raw!r}")
    return raw == "true"


def parse_offset(raw: str, name: str) -> int:
    """``earliest`` -> 0, ``latest`` -> -1, ``n`` or ``{"seq": n}`` -> n (>= 1)."""
    text = raw.strip()
    if text == "earliest":
        return 0
    if text == "latest":
        return -1
    try:
        value = json.loads(text)
    except ValueError:
        raise ConfigError(f"option {name}", f'must be earliest, latest, a seq or {{"seq": n}}, got {raw!r}') from None
    if isinstance(value, dict):
        value = value.get("seq")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"option {name}", f"a seq must be an integer >= 1, got {raw!r}")
    return value


@dataclass(frozen=True)
class Connection:
    """What an executor needs to reach the broker (picklable; no sockets)."""

    endpoint: str | None
    key: str | None
    broker_key: str | None
    timeout: float

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Connection:
        timeout = _int_option(options, "timeout", 30) or 30
        return cls(options.get("endpoint"), options.get("key"), options.get("brokerKey"), float(timeout))

    def client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"timeout": self.timeout}
        if self.key:
            options["key"] = self.key
        if self.broker_key:
            options["broker_key"] = self.broker_key
        return options

    def client(self) -> Any:
        from .client import Client

        return Client(self.endpoint, **self.client_options()).connect()


@dataclass(frozen=True)
class ReadSettings:
    connection: Connection
    journal: str
    topics: tuple[str, ...]
    starting: int
    ending: int
    max_per_trigger: int | None
    max_per_partition: int
    fail_on_data_loss: bool

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ReadSettings:
        topics = tuple(t.strip() for t in str(options.get("topics", "")).split(",") if t.strip())
        return cls(
            Connection.from_options(options),
            str(options.get("journal", DEFAULT_JOURNAL)),
            topics,
            parse_offset(str(options.get("startingOffsets", "earliest")), "startingOffsets"),
            parse_offset(str(options.get("endingOffsets", "latest")), "endingOffsets"),
            _int_option(options, "maxRecordsPerTrigger", None),
            _int_option(options, "maxRecordsPerPartition", DEFAULT_PARTITION_RECORDS) or DEFAULT_PARTITION_RECORDS,
            _bool_option(options, "failOnDataLoss", True),
        )

    def head(self) -> tuple[int, int]:
        """``(first_seq, next_seq)`` of the journal now (ConfigError if there is no such journal)."""
        with self.connection.client() as client:
            info = client.journal_info(timeout=self.connection.timeout)
        if self.journal not in info:
            known = ", ".join(sorted(info)) or "none"
            raise ConfigError("option journal", f"the broker has no journal {self.journal!r} (journals: {known})")
        journal = info[self.journal]
        return int(journal["first_seq"]), int(journal["next_seq"])


class SeqRange(InputPartition):
    """Records ``start <= seq < end`` of one journal (``start`` 0 = the oldest kept)."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


def split_range(start: int, end: int, per_partition: int) -> list[SeqRange]:
    return [SeqRange(s, min(end, s + per_partition)) for s in range(start, end, per_partition)]


def _record_batch(records: list[Any]) -> Any:
    """One fetched page as an Arrow RecordBatch in SCHEMA's order (Spark takes it without per-row conversion)."""
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.seq for r in records], pa.int64()),
            pa.array([round(r.ts * 1_000_000) for r in records], pa.timestamp("us", tz="UTC")),
            pa.array([r.topic for r in records], pa.string()),
            pa.array([r.sender for r in records], pa.string()),
            pa.array([list(r.headers.items()) for r in records], pa.map_(pa.string(), pa.string())),
            pa.array([r.body for r in records], pa.binary()),
        ],
        names=["seq", "ts", "topic", "sender", "headers", "body"],
    )


def read_range(settings: ReadSettings, partition: SeqRange) -> Iterator[Any]:
    """Fetch ``[start, end)`` page by page as Arrow batches; runs on an executor."""
    seq = partition.start
    if seq >= partition.end:
        return  # an empty range (a batch read of an empty journal): no connection needed
    with settings.connection.client() as client:
        while seq < partition.end:
            try:
                page = client.fetch(
                    settings.journal,
                    from_seq=seq,
                    to_seq=partition.end,
                    topics=settings.topics,
                    timeout=settings.connection.timeout,
                )
            except Gone:
                if settings.fail_on_data_loss:
                    raise
                first = int(client.journal_info()[settings.journal]["first_seq"])
                if first <= seq:  # pragma: no cover - trimmed and then not: cannot happen
                    raise
                seq = first
                continue
            if page.records:
                yield _record_batch(page.records)
            if page.next_seq <= seq:  # pragma: no cover - the broker always advances
                raise RuntimeError(f"journal {settings.journal}: fetch did not advance past {seq}")
            seq = page.next_seq


class Mc0Reader(DataSourceReader):
    def __init__(self, settings: ReadSettings) -> None:
        self.settings = settings

    def partitions(self) -> list[SeqRange]:
        settings = self.settings
        first, next_seq = settings.head()
        start = first if settings.starting <= 0 else settings.starting
        if settings.starting < 0:
            start = next_seq  # latest: nothing yet
        end = next_seq if settings.ending < 0 else min(settings.ending, next_seq)
        if 0 < start < first and settings.fail_on_data_loss:
            raise Gone(410, f"journal {settings.journal}: seq {start} was trimmed; the first kept is {first}")
        return split_range(max(start, first), end, settings.max_per_partition) or [SeqRange(0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SeqRange)
        return read_range(self.settings, partition)


class Mc0StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, settings: ReadSettings) -> None:
        self.settings = settings
        self.available_now: int | None = None

    def initialOffset(self) -> dict[str, int]:
        # Never resolved here: Spark calls this again when it replays batch 0.
        return {"seq": self.settings.starting}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.settings.max_per_trigger:
            return ReadMaxRows(self.settings.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now = self.settings.head()[1]

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        first, head = self.settings.head()
        if self.available_now is not None:
            head = min(head, self.available_now)
        begin = int(start["seq"])
        if begin < 0:
            return {"seq": head}  # "latest": batch 0 is empty and fixes where reading starts
        begin = max(begin, first)
        if isinstance(limit, ReadMaxRows):
            return {"seq": max(int(start["seq"]), min(head, begin + limit.max_rows))}
        return {"seq": max(int(start["seq"]), head)}

    def reportLatestOffset(self) -> dict[str, int]:
        return {"seq": self.settings.head()[1]}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[SeqRange]:
        begin, stop = int(start["seq"]), int(end["seq"])
        if begin < 0:
            return []
        return split_range(begin, stop, self.settings.max_per_partition)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SeqRange)
        return read_range(self.settings, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the journal's retention, not the reader, decides what is kept."""


# ---------------------------------------------------------------- sink


@dataclass(frozen=True)
class Published(WriterCommitMessage):
    partition: int
    rows: int
    duplicates: int


def row_msgid(prefix: str, batch: str, partition: int, index: int, topic: str, body: bytes) -> str:
    digest = hashlib.blake2b(f"{topic}\0".encode() + body, digest_size=8).hexdigest()
    return f"{prefix}:{batch}:{partition}:{index}:{digest}"


def _body_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise ConfigError("column body", f"must be binary or string, got {type(value).__name__}")


async def _publish_rows(
    connection: Connection, rows: Iterator[Any], prefix: str, batch: str, partition: int, window: int
) -> Published:
    from .aio import Client

    published = duplicates = 0
    pending: list[asyncio.Task[Any]] = []

    async def drain() -> None:
        nonlocal published, duplicates
        acks = await asyncio.gather(*pending)
        pending.clear()
        published += len(acks)
        duplicates += sum(1 for ack in acks if ack is not None and ack.duplicate)

    async with Client(connection.endpoint, **connection.client_options()) as client:
        for index, row in enumerate(rows):
            fields = row.asDict() if hasattr(row, "asDict") else dict(row)
            topic = fields.get("topic")
            if not isinstance(topic, str):
                raise ConfigError("column topic", f"row {index}: must be a string, got {topic!r}")
            body = _body_bytes(fields.get("body"))
            headers = fields.get("headers") or None
            msgid = fields.get("msgid") or row_msgid(prefix, batch, partition, index, topic, body)
            pending.append(
                asyncio.ensure_future(client.publish(topic, body, headers=headers, confirm=True, msgid=msgid))
            )
            if len(pending) >= window:
                await drain()
        await drain()
    return Published(partition, published, duplicates)


def _task_identity() -> tuple[int, str | None]:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # pragma: no cover - write() always runs in a task
        return 0, None
    return context.partitionId(), context.getLocalProperty(BATCH_ID_PROPERTY)


class _RowPublisher:
    """What the batch and the streaming sink share: options, and publishing one task's rows."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.connection = Connection.from_options(options)
        self.prefix = str(options.get("msgidPrefix", "spark"))
        self.window = _int_option(options, "window", 256) or 256

    def _publish(self, iterator: Iterator[Any], batch: str, partition: int) -> Published:
        return asyncio.run(_publish_rows(self.connection, iterator, self.prefix, batch, partition, self.window))


class Mc0Writer(_RowPublisher, DataSourceWriter):
    def write(self, iterator: Iterator[Any]) -> Published:
        partition, batch = _task_identity()
        return self._publish(iterator, batch or "batch", partition)


class Mc0StreamWriter(_RowPublisher, DataSourceStreamWriter):
    def write(self, iterator: Iterator[Any]) -> Published:
        partition, batch = _task_identity()
        if batch is None:  # without it, rows of different micro-batches would share MSGIDs
            raise RuntimeError(f"Spark did not set {BATCH_ID_PROPERTY} on this streaming task")
        return self._publish(iterator, batch, partition)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every row was acknowledged by the broker before its task ended; nothing left to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Rows already acknowledged stay published; a retry's MSGIDs make them duplicates."""


class Mc0DataSource(DataSource):
    """``format("mc0")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> Mc0Reader:
        return Mc0Reader(ReadSettings.from_options(self.options))

    def streamReader(self, schema: StructType) -> Mc0StreamReader:
        return Mc0StreamReader(ReadSettings.from_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> Mc0Writer:
        _check_sink_schema(schema)
        return Mc0Writer(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Mc0StreamWriter:
        _check_sink_schema(schema)
        return Mc0StreamWriter(self.options)


def _check_sink_schema(schema: StructType) -> None:
    names = set(schema.fieldNames())
    missing = {"topic", "body"} - names
    if missing:
        raise ConfigError("sink schema", f"needs columns topic and body; missing {', '.join(sorted(missing))}")
    extra = names - {"topic", "body", "headers", "msgid"}
    if extra:
        raise ConfigError("sink schema", f"unknown columns {', '.join(sorted(extra))} (topic, body, headers, msgid)")


def register(spark: Any) -> None:
    """Register ``mc0`` on a session explicitly (auto-registration needs ``pyspark_mc0`` on the path)."""
    spark.dataSource.register(Mc0DataSource)


def make_session(
    master: str | None = "local[*]", *, app: str = "mc0", scratch: str | None = None, ui: bool = False
) -> Any:
    """A SparkSession for mc0 jobs.  Local masters bind to 127.0.0.1 with the UI
    off unless asked; executors run this interpreter (where mc0 is installed)
    unless ``PYSPARK_PYTHON`` says otherwise; ``scratch`` holds Spark's local files.
    ``master=None`` leaves it to ``spark-submit``."""
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app)
        .config("spark.ui.enabled", str(ui).lower())
        .config("spark.ui.showConsoleProgress", "false")  # progress is ours to show (mc0 pipeline)
    )
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", "4")
        )
    if scratch is not None:
        builder = builder.config("spark.local.dir", scratch).config(
            "spark.sql.warehouse.dir", os.path.join(scratch, "warehouse")
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
