"""The ``mc0`` source: ``spark.read.format("mc0")`` and ``spark.readStream.format("mc0")``.

Contract: a partition is a journal range ``[start, end)`` fetched by an
executor over its own connection as a stream of columns pages, each made an
Arrow RecordBatch from its buffers as it arrives, so a replayed
(micro-)batch reads the same records; offsets are ``{"seq": n}``.
:class:`Mc0DataSource` is what ``format("mc0")`` names (the sink's writers
live in :mod:`mc0.spark.sink`).
"""

from __future__ import annotations

import sys
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

from ..errors import ConfigError, Gone, NotConnected, Timeout
from ..message import Record
from ..protocol import TRACEPARENT, ColumnsPage, trace_id
from ..protocol.tracecontext import INVALID_TRACE_ID, INVALID_VERSION, TRACEPARENT_PATTERN
from .options import SCHEMA, SOURCE_NAME, ReadSettings, every_broker_serves
from .sink import Mc0StreamWriter, Mc0Writer


class SeqRange(InputPartition):
    """Records ``start <= seq < end`` of one journal (``start`` 0 = the oldest kept).  ``broker``: the
    entry of the endpoint list to read at first (a journal every broker serves: partitions spread over
    the cluster), or -1 (the list as given)."""

    def __init__(self, start: int, end: int, broker: int = -1) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end
        self.broker = broker


def split_range(start: int, end: int, per_partition: int, at_least: int = 1, *, spread: bool = False) -> list[SeqRange]:
    """``[start, end)`` in equal ranges (within one seq) of at most ``per_partition`` seqs, at least
    ``at_least`` of them when there are that many seqs; the same arguments give the same ranges.
    ``spread``: range k is read at broker k of the endpoint list (round the list)."""
    size = end - start
    if size <= 0:
        return []
    count = min(size, max(-(-size // per_partition), at_least))
    bounds = [start + size * k // count for k in range(count + 1)]
    return [SeqRange(a, b, k if spread else -1) for k, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))]


COLUMNS = ["seq", "ts", "topic", "sender", "headers", "body", "trace_id"]
# Pages as large as the broker builds (a RecordBatch each): per page the reader pays a hand-over
# between the client's thread and Spark's and a batch to serialize, so fewer, larger pages are cheaper.
PAGE_RECORDS = 4000
PAGE_BYTES = 4 << 20
TP_00 = "00-" + "0" * 32 + "-" + "0" * 16 + "-00"  # a version 00 traceparent's length is this one's
MAX_BROKERS_LOST = 4  # brokers one range may lose mid-read before its task fails (Spark may retry it)


def arrow_schema() -> Any:
    """SCHEMA as Arrow types (what Spark checks each RecordBatch against)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("seq", pa.int64()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("topic", pa.string()),
            ("sender", pa.string()),
            ("headers", pa.map_(pa.string(), pa.string())),
            ("body", pa.binary()),
            ("trace_id", pa.string()),
        ]
    )


def record_batch(page: ColumnsPage) -> Any:
    """One columns page as an Arrow RecordBatch in SCHEMA's order, made from the page's buffers.

    No per-record Python work: the page's offsets and data are Arrow's own
    string/binary layout (``parse_columns_page`` checked them; the text
    columns are checked as UTF-8 here), a record's body parts are adjacent
    so its body is one slice, ``ts`` becomes microseconds in Arrow
    (rounded half to even, as Python's ``round``), and ``trace_id`` is read
    from the headers with Arrow's kernels (``trace_ids``).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if sys.byteorder != "little":  # pragma: no cover - the page is little endian; Arrow buffers are native
        return _record_batch_of(page.records())
    n = page.count
    buffer = pa.py_buffer

    def text(count: int, offsets: memoryview, data: memoryview) -> Any:
        column = pa.Array.from_buffers(pa.string(), count, [None, buffer(offsets), buffer(data)])
        column.validate(full=True)  # UTF-8 (ArrowInvalid, a ValueError, if not)
        return column

    seconds = pa.Array.from_buffers(pa.float64(), n, [None, buffer(page.tss)])
    micros = pc.cast(pc.round(pc.multiply(seconds, 1_000_000.0)), pa.int64())
    index = pa.Array.from_buffers(pa.int32(), n + 1, [None, buffer(page.header_index)])
    headers = pa.MapArray.from_arrays(
        index,
        text(page.header_count, page.key_offsets, page.keys),
        text(page.header_count, page.value_offsets, page.values),
    )
    body_offsets = buffer(page.part_offsets)
    if not page.one_part_each:  # a record's body spans its parts: its offsets are its first part's
        parts = pa.Array.from_buffers(pa.int32(), page.part_count + 1, [None, body_offsets])
        firsts = pa.Array.from_buffers(pa.int32(), n + 1, [None, buffer(page.part_index)])
        body_offsets = pc.take(parts, firsts).buffers()[1]
    return pa.RecordBatch.from_arrays(
        [
            pa.Array.from_buffers(pa.int64(), n, [None, buffer(page.seqs)]),
            micros.cast(pa.timestamp("us", tz="UTC")),
            text(n, page.topic_offsets, page.topics),
            text(n, page.sender_offsets, page.senders),
            headers,
            pa.Array.from_buffers(pa.binary(), n, [None, body_offsets, buffer(page.bodies)]),
            trace_ids(headers),
        ],
        names=COLUMNS,
    )


def trace_ids(headers: Any) -> Any:
    """Each record's trace id (of its W3C ``traceparent``), null when it has none or a malformed one:
    ``mc0.protocol.trace_id``'s rule as Arrow kernels over the headers column, no Python per record."""
    import pyarrow as pa
    import pyarrow.compute as pc

    value = pc.map_lookup(headers, pa.scalar(TRACEPARENT), "first")
    version = pc.utf8_slice_codeunits(value, 0, 2)
    found = pc.utf8_slice_codeunits(value, 3, 35)
    ok = pc.and_(pc.match_substring_regex(value, TRACEPARENT_PATTERN), pc.not_equal(version, INVALID_VERSION))
    ok = pc.and_(ok, pc.or_(pc.not_equal(version, "00"), pc.equal(pc.utf8_length(value), len(TP_00))))
    ok = pc.and_(ok, pc.not_equal(found, INVALID_TRACE_ID))
    return pc.if_else(ok, found, pa.scalar(None, pa.string()))


def _record_batch_of(records: list[Record]) -> Any:  # pragma: no cover - big-endian hosts
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.seq for r in records], pa.int64()),
            pa.array([round(r.ts * 1_000_000) for r in records], pa.timestamp("us", tz="UTC")),
            pa.array([r.topic for r in records], pa.string()),
            pa.array([r.sender for r in records], pa.string()),
            pa.array([list(r.headers.items()) for r in records], pa.map_(pa.string(), pa.string())),
            pa.array([r.body for r in records], pa.binary()),
            pa.array([trace_id(r.headers) for r in records], pa.string()),
        ],
        names=COLUMNS,
    )


def read_range(settings: ReadSettings, partition: SeqRange) -> Iterator[Any]:
    """Fetch ``[start, end)`` as Arrow batches, one per columns page as it arrives; runs on an executor.

    A range of a journal every broker serves (``partition.broker`` >= 0) is read at that broker of the
    endpoint list; when the broker dies mid-read the client fails over to the next and the read goes
    on from the first record not yet yielded (the same seqs everywhere): each record once."""
    seq = partition.start
    if seq >= partition.end:
        return  # an empty range (a batch read of an empty journal): no connection needed
    spread = partition.broker >= 0
    connection = settings.connection.rotated(partition.broker) if spread else settings.connection
    lost = 0
    with connection.client() as client:
        while seq < partition.end:
            begin = seq
            try:
                with client.fetch_pages(
                    settings.journal,
                    from_seq=seq,
                    to_seq=partition.end,
                    topics=settings.topics,
                    page_records=PAGE_RECORDS,
                    page_bytes=PAGE_BYTES,
                    timeout=settings.connection.timeout,
                ) as pages:
                    for page in pages:
                        if page.count:
                            yield record_batch(page)
                        seq = page.next_seq  # a later Gone resumes after what was yielded
                    next_seq = pages.next_seq
            except (NotConnected, Timeout) as exc:
                lost += 1
                if not spread or lost > MAX_BROKERS_LOST:
                    raise  # (a journal only one broker has: Spark's own task retry reads the range again)
                print(f"mc0 source: {type(exc).__name__} at seq {seq}; going on at another broker", file=sys.stderr)
                continue
            except Gone:
                if settings.fail_on_data_loss:
                    raise
                first = int(client.journal_info()[settings.journal]["first_seq"])
                if first <= seq:  # pragma: no cover - trimmed and then not: cannot happen
                    raise
                seq = first
                continue
            if next_seq is None or next_seq <= begin:  # pragma: no cover - the broker always advances
                raise RuntimeError(f"journal {settings.journal}: fetch did not advance past {begin}")
            seq = next_seq


class Mc0Reader(DataSourceReader):
    def __init__(self, settings: ReadSettings) -> None:
        self.settings = settings

    def partitions(self) -> list[SeqRange]:
        settings = self.settings
        info = settings.journal_info()
        first, next_seq = int(info["first_seq"]), int(info["next_seq"])
        start = first if settings.starting <= 0 else settings.starting
        if settings.starting < 0:
            start = next_seq  # latest: nothing yet
        end = next_seq if settings.ending < 0 else min(settings.ending, next_seq)
        if 0 < start < first and settings.fail_on_data_loss:
            raise Gone(410, f"journal {settings.journal}: seq {start} was trimmed; the first kept is {first}")
        spread = every_broker_serves(info)
        ranges = split_range(max(start, first), end, settings.max_per_partition, settings.min_partitions, spread=spread)
        return ranges or [SeqRange(0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SeqRange)
        return read_range(self.settings, partition)


class Mc0StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, settings: ReadSettings) -> None:
        self.settings = settings
        self.available_now: int | None = None
        self.spread = False  # the journal is one every broker serves (learnt with the latest offset)

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
        info = self.settings.journal_info()
        first, head = int(info["first_seq"]), int(info["next_seq"])
        self.spread = every_broker_serves(info)
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
        settings = self.settings
        return split_range(begin, stop, settings.max_per_partition, settings.min_partitions, spread=self.spread)

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
