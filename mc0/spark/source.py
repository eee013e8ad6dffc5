"""The ``mc0`` source: ``spark.read.format("mc0")`` and ``spark.readStream.format("mc0")``.

Contract: a partition is a journal range ``[start, end)`` fetched by an
executor over its own connection, page by page as Arrow RecordBatches, so a
replayed (micro-)batch reads the same records; offsets are ``{"seq": n}``.
:class:`Mc0DataSource` is what ``format("mc0")`` names (the sink's writers
live in :mod:`mc0.spark.sink`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from ..errors import ConfigError, Gone
from .options import SCHEMA, SOURCE_NAME, ReadSettings
from .sink import Mc0StreamWriter, Mc0Writer


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
