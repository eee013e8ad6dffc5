"""The mc0 data source and sink in real local Spark, against a real broker with a journal.

One Spark session for the whole run (UI off, 127.0.0.1, scratch in a temp
folder); every test has its own broker, journal folder and checkpoints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0 import protocol as P
from mc0.process import BrokerProcess

from .conftest import CurveSetup, require, write_config
from .sparkretry import again_if_worker_late, run_spark_job

require("pyspark")
# One Spark session per run: under pytest-xdist the whole module goes to one worker (conftest.ONE_WORKER).
pytestmark = [pytest.mark.timeout(300), pytest.mark.long]

ROOT = Path(__file__).resolve().parent.parent
JOURNALS = '[journals.main]\ntopics = ["orders.>", "out.>"]\nsegment_bytes = 65536\n'


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from mc0.spark import make_session

    session = make_session("local[2]", app="mc0-tests", scratch=str(tmp_path_factory.mktemp("spark")))
    yield session
    session.stop()


@pytest.fixture
def journaled(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(config=write_config(tmp_path, JOURNALS), insecure=True) as broker:
        yield broker


def publish(endpoint: str, n: int, start: int = 0, **options: Any) -> list[int]:
    """n confirmed orders (orders.0 / orders.1 alternating); returns their seqs."""
    seqs = []
    with mc0.Client(endpoint, **options) as client:
        for i in range(start, start + n):
            ack = client.publish(f"orders.{i % 2}", f"order {i}".encode(), confirm=True, headers={"X-n": str(i)})
            assert ack is not None and ack.seq is not None
            seqs.append(ack.seq)
    return seqs


def run_available_now(spark: Any, endpoint: str, checkpoint: Path, output: Path, **options: str) -> None:
    def run() -> None:
        reader = spark.readStream.format("mc0").option("endpoint", endpoint).option("topics", "orders.>")
        for key, value in options.items():
            reader = reader.option(key, value)
        query = (
            reader.load()
            .select("seq", "body")
            .writeStream.format("parquet")
            .option("checkpointLocation", str(checkpoint))
            .option("path", str(output))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120), "the query did not finish"
        assert query.exception() is None

    again_if_worker_late(run)


def seqs_in(spark: Any, output: Path) -> list[int]:
    return sorted(r.seq for r in spark.read.parquet(str(output)).select("seq").collect())


def test_batch_read_returns_exactly_the_requested_range(spark: Any, journaled: BrokerProcess) -> None:
    seqs = publish(journaled.endpoint, 60)
    df = (
        spark.read.format("mc0")
        .option("endpoint", journaled.endpoint)
        .option("topics", "orders.1")
        .option("startingOffsets", str(seqs[10]))
        .option("endingOffsets", f'{{"seq": {seqs[40]}}}')
        .option("maxRecordsPerPartition", "7")
        .load()
    )
    assert df.schema.simpleString() == (
        "struct<seq:bigint,ts:timestamp,topic:string,sender:string,headers:map<string,string>,body:binary,"
        "trace_id:string>"
    )
    rows = sorted(df.collect(), key=lambda r: r.seq)
    expected = [(s, f"order {i}".encode()) for i, s in enumerate(seqs) if 10 <= i < 40 and i % 2 == 1]
    assert [(r.seq, bytes(r.body)) for r in rows] == expected
    assert all(r.topic == "orders.1" and r.sender == "anonymous" and r.headers["X-n"] for r in rows)
    assert df.rdd.getNumPartitions() == 5  # 30 seqs / 7 per partition
    everything = spark.read.format("mc0").option("endpoint", journaled.endpoint).option("topics", "orders.>").load()
    assert everything.count() == 60
    empty = spark.read.format("mc0").option("endpoint", journaled.endpoint).option("startingOffsets", "latest").load()
    assert empty.count() == 0


def test_a_read_returns_every_record_exactly_once_with_its_content(spark: Any, journaled: BrokerProcess) -> None:
    """Through columns pages and Arrow batches made from their buffers: every field of every record,
    across partitions, pages and segments, equals what the client's own fetch returns."""
    with mc0.Client(journaled.endpoint) as client:
        for i in range(2500):
            parts = [b"o%d" % i, b"-" * (i % 5)] if i % 3 == 0 else [b"" if i % 7 == 0 else f"order {i}".encode()]
            headers = {"X-n": str(i), "X-text": "ü €"} if i % 4 == 0 else None
            if i % 5 == 0:  # a trace context (every tenth a malformed one): the trace_id column
                headers = {**(headers or {}), "traceparent": f"00-{i + 1:032x}-{'b' * 16}-01"[: 55 - (i % 10 == 0)]}
            client.publish(f"orders.{i % 3}", parts, headers=headers, confirm=i == 2499)
        want = []
        seq = 0
        for _ in range(100):  # bounded: a page per call
            page = client.fetch("main", from_seq=seq, topics=["orders.>"])
            want += page.records
            if page.next_seq >= page.end_seq:
                break
            seq = page.next_seq
    assert len(want) == 2500
    df = (
        spark.read.format("mc0")
        .option("endpoint", journaled.endpoint)
        .option("topics", "orders.>")
        .option("maxRecordsPerPartition", "700")
        .load()
    )
    assert df.rdd.getNumPartitions() == 4
    rows = df.selectExpr("seq", "unix_micros(ts) AS us", "topic", "sender", "headers", "body", "trace_id").collect()
    got = sorted((r.seq, r.us, r.topic, r.sender, dict(r.headers), bytes(r.body), r.trace_id) for r in rows)
    assert got == [
        (r.seq, round(r.ts * 1_000_000), r.topic, r.sender, r.headers, r.body, P.trace_id(r.headers)) for r in want
    ]
    assert sum(r.trace_id is not None for r in rows) == 250  # (the other 250 traceparents are malformed)


# The `topics` option as users write it, against what a Python filter over the whole journal keeps.
FILTER_TOPICS = ["orders.new", "orders.eu.new", "orders.eu.paid", "payments.card", "audit", "orders", "legacy.topic"]
FILTERS = [
    "*",  # one token: audit, orders
    ">",  # everything (but mc0.sys.*)
    "orders.*",
    "orders.>",
    "orders.*.new",
    "orders.new,payments.>",  # several patterns
    "audit, orders.eu.paid ,legacy.topic",  # spaces around them; a 0.x peer's 1.0-shaped topic
    "nothing.matches",
]


def test_a_filtered_read_returns_what_a_python_filter_over_the_journal_keeps(spark: Any, tmp_path: Path) -> None:
    """Each `topics` option of FILTERS gives exactly the records a Python filter over every journaled
    record keeps, field by field over several ranges and segments, and the read as users write it
    (count, summed body lengths) in one range agrees.  A 0.x peer's opaque topic is never
    journaled; its 1.0-shaped one is, and filters like any (an opaque topic as a filter: a ConfigError,
    test_bad_options_fail_with_the_option_named)."""
    import zmq

    from mc0.topics import pattern_matches, split_pattern, split_topic

    from .conftest import RawPeer

    config = write_config(tmp_path, '[journals.main]\ntopics = [">"]\nsegment_bytes = 8192\n')
    with BrokerProcess(config=config, insecure=True) as broker:
        context: zmq.Context[Any] = zmq.Context()
        old = RawPeer(broker.endpoint, context)
        try:
            old.send("CONNECT", "VERSION", "0.1", "TTL", "5000", "ID", "c")
            assert old.recv()[0] == b"OK"
            old.send("PUT", "TOPIC", "mcollective discovery", "ID", "o", "", "opaque")  # not journaled
            assert old.recv()[0] == b"OK"
            old.send("PUT", "TOPIC", "legacy.topic", "ID", "l", "", "from 0.1")  # a 1.0 topic: journaled
            assert old.recv()[0] == b"OK"
        finally:
            old.close()
            context.term()
        with mc0.Client(broker.endpoint) as client:
            for i in range(600):
                topic = FILTER_TOPICS[i % 6]
                headers = {"X-n": str(i)} if i % 5 == 0 else None
                client.publish(topic, [f"{topic} {i}".encode() * (i % 4)], headers=headers, confirm=i == 599)
            journaled = []
            for _ in range(100):  # bounded: a page per call
                page = client.fetch("main", from_seq=journaled[-1].seq + 1 if journaled else 0)
                journaled += page.records
                if page.next_seq >= page.end_seq:
                    break
        assert len(journaled) == 601 and {r.topic for r in journaled} == set(FILTER_TOPICS)
        for topics in FILTERS:
            patterns = [split_pattern(p.strip()) for p in topics.split(",")]
            want = [
                (r.seq, r.topic, r.headers, r.body)
                for r in journaled
                if any(pattern_matches(p, split_topic(r.topic)) for p in patterns)
            ]
            assert want or topics == "nothing.matches"
            reader = spark.read.format("mc0").option("endpoint", broker.endpoint).option("journal", "main")
            reader = reader.option("topics", topics)
            n, size = reader.load().selectExpr("count(*)", "sum(length(body))").collect()[0]  # one range
            assert (n, size or 0) == (len(want), sum(len(w[3]) for w in want)), topics
            rows = reader.option("maxRecordsPerPartition", "150").load().collect()  # ranges across segments
            got = sorted((r.seq, r.topic, dict(r.headers), bytes(r.body)) for r in rows)
            assert got == want, topics


@pytest.mark.parametrize(
    ("start", "end", "per", "at_least", "ranges"),
    [
        (1, 31, 7, 1, [(1, 7), (7, 13), (13, 19), (19, 25), (25, 31)]),
        (1, 200_001, 100_000, 1, [(1, 100_001), (100_001, 200_001)]),
        (1, 150_001, 100_000, 1, [(1, 75_001), (75_001, 150_001)]),  # equal halves, not 100,000 + 50,000
        (1, 101, 100_000, 4, [(1, 26), (26, 51), (51, 76), (76, 101)]),  # minPartitions
        (1, 4, 10, 8, [(1, 2), (2, 3), (3, 4)]),  # never an empty range
        (5, 5, 3, 1, []),
    ],
)
def test_ranges_tile_the_read_in_equal_parts(
    start: int, end: int, per: int, at_least: int, ranges: list[tuple[int, int]]
) -> None:
    from mc0.spark.source import split_range

    assert [(r.start, r.end) for r in split_range(start, end, per, at_least)] == ranges


class _Stream:
    """A fetch_pages stream of canned pages, then Gone (retention overtook the reader) or the FINAL."""

    def __init__(self, pages: list[Any], gone: bool, next_seq: int) -> None:
        self.pages, self.gone, self.next_seq = pages, gone, next_seq
        self.records = 0

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __iter__(self) -> Iterator[Any]:
        yield from self.pages
        if self.gone:
            raise mc0.Gone(410, "trimmed")


class _Client:
    def __init__(self, streams: dict[int, _Stream], first_seq: int) -> None:
        self.streams, self.first_seq, self.asked = streams, first_seq, []

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def fetch_pages(self, journal: str, *, from_seq: int, **options: Any) -> _Stream:
        self.asked.append(from_seq)
        return self.streams[from_seq]

    def journal_info(self) -> dict[str, dict[str, int]]:
        return {"main": {"first_seq": self.first_seq}}


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_gone_in_the_middle_of_a_range_resumes_at_the_oldest_kept_or_fails(fail_on_data_loss: bool) -> None:
    """Pages already yielded stay yielded; with failOnDataLoss=false the read goes on from the oldest
    kept seq (never before where it was), otherwise Gone fails the task, as before columns pages."""
    from dataclasses import replace

    from mc0 import protocol as P
    from mc0.message import Record
    from mc0.spark.options import Connection, ReadSettings
    from mc0.spark.source import SeqRange, read_range

    def page(first: int, last: int) -> Any:
        records = [Record(s, 1.0, "orders.x", "a", {}, (b"%d" % s,)) for s in range(first, last + 1)]
        return P.parse_columns_page(P.columns_page(P.page_columns(records), last + 1))

    client = _Client({1: _Stream([page(1, 3)], gone=True, next_seq=0), 7: _Stream([page(7, 9)], False, 10)}, 7)

    class Fake(Connection):
        def client(self) -> Any:
            return client

    settings = ReadSettings.from_options({"failOnDataLoss": str(fail_on_data_loss).lower()})
    settings = replace(settings, connection=Fake(None, None, None, 1.0))
    read = read_range(settings, SeqRange(1, 10))
    assert next(read).column("seq").to_pylist() == [1, 2, 3]
    if fail_on_data_loss:
        with pytest.raises(mc0.Gone):
            next(read)
    else:
        assert [s for batch in read for s in batch.column("seq").to_pylist()] == [7, 8, 9]
        assert client.asked == [1, 7]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("startingOffsets", "soon", "option startingOffsets"),
        ("maxRecordsPerPartition", "0", "option maxRecordsPerPartition"),
        ("minPartitions", "x", "option minPartitions"),
        ("failOnDataLoss", "maybe", "option failOnDataLoss"),
        ("journal", "nope", "no journal 'nope'"),
        ("topics", "orders..new", "option topics: 'orders..new' is not a topic pattern: empty token"),
        ("topics", "orders.>,a.>.b", "option topics: 'a.>.b' is not a topic pattern"),
        ("topics", "mcollective discovery", "option topics: .* contains whitespace"),  # a 0.x opaque topic
    ],
)
def test_bad_options_fail_with_the_option_named(
    spark: Any, journaled: BrokerProcess, option: str, value: str, message: str
) -> None:
    df = spark.read.format("mc0").option("endpoint", journaled.endpoint).option(option, value).load()
    with pytest.raises(Exception, match=message):
        df.count()


def test_stream_available_now_with_checkpoint_resumes_exactly_after_more_data(
    spark: Any, journaled: BrokerProcess, tmp_path: Path
) -> None:
    first = publish(journaled.endpoint, 70)
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    run_available_now(spark, journaled.endpoint, checkpoint, output, maxRecordsPerTrigger="25")
    assert seqs_in(spark, output) == first
    assert len(list((checkpoint / "commits").iterdir())) >= 3  # 70+ seqs at 25 per trigger
    second = publish(journaled.endpoint, 40, start=70)
    run_available_now(spark, journaled.endpoint, checkpoint, output, maxRecordsPerTrigger="25")
    assert seqs_in(spark, output) == first + second


def test_latest_start_is_fixed_by_the_first_batch_even_when_it_is_replayed(
    spark: Any, journaled: BrokerProcess, tmp_path: Path
) -> None:
    publish(journaled.endpoint, 20)
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    run_available_now(spark, journaled.endpoint, checkpoint, output, startingOffsets="latest")
    later = publish(journaled.endpoint, 10, start=20)
    # Forget that batch 0 finished: Spark replays it, calling initialOffset again.
    for name in os.listdir(checkpoint / "commits"):
        (checkpoint / "commits" / name).unlink()
    run_available_now(spark, journaled.endpoint, checkpoint, output, startingOffsets="latest")
    assert seqs_in(spark, output) == later


@pytest.mark.timeout(900)  # two jobs, each its own JVM and Spark start: minutes on a loaded box
def test_a_query_killed_mid_batch_then_restarted_yields_every_record_exactly_once(
    spark: Any, journaled: BrokerProcess, tmp_path: Path
) -> None:
    seqs = publish(journaled.endpoint, 200)  # 5 micro-batches of 40: killed in the third or later
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    command = [sys.executable, "-m", "tests.spark_stream_job", journaled.endpoint, str(checkpoint), str(output), "40"]
    log = (tmp_path / "job.log").open("w")
    job = subprocess.Popen(command, cwd=ROOT, start_new_session=True, stdout=log, stderr=log)
    killed_in = None
    began = time.monotonic()
    try:
        # The JVM's start and the first batches: 20-30 s quiet, over 120 s in a CI run beside the suite.
        deadline = began + 420
        while time.monotonic() < deadline and job.poll() is None:
            started = batches(checkpoint / "offsets") - batches(checkpoint / "commits")
            if started and max(started) >= 2:  # a batch planned and running, not committed
                killed_in = max(started)
                os.killpg(job.pid, signal.SIGKILL)  # the driver and its JVM, no shutdown
                break
            time.sleep(0.01)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
        log.close()
    assert killed_in is not None, (
        f"the job was not killed mid-batch (exit status {job.returncode} after {time.monotonic() - began:.0f} s; "
        f"batches planned {sorted(batches(checkpoint / 'offsets'))}, committed "
        f"{sorted(batches(checkpoint / 'commits'))}): " + (tmp_path / "job.log").read_text()[-2000:]
    )
    assert not (checkpoint / "commits" / str(killed_in)).exists()
    restarted = run_spark_job(command, within=240, cwd=ROOT)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert seqs_in(spark, output) == seqs  # each record once: none lost, none twice


def batches(folder: Path) -> set[int]:
    """Batch ids a checkpoint log folder (offsets/ or commits/) holds so far."""
    try:
        return {int(name) for name in os.listdir(folder) if name.isdigit()}
    except FileNotFoundError:
        return set()


def journal_bodies(endpoint: str, topic: str, **options: Any) -> list[bytes]:
    with mc0.Client(endpoint, **options) as client:
        return [r.body for r in client.fetch("main", topics=[topic]).records]


def test_sink_batch_write_replayed_publishes_once(spark: Any, journaled: BrokerProcess) -> None:
    rows = [(f"out.{i % 3}", f"row {i}".encode(), {"X-row": str(i)}) for i in range(120)]
    df = spark.createDataFrame(rows, "topic string, body binary, headers map<string,string>").repartition(3)
    df.write.format("mc0").option("endpoint", journaled.endpoint).mode("append").save()
    df.write.format("mc0").option("endpoint", journaled.endpoint).mode("append").save()  # the same job again
    stored = journal_bodies(journaled.endpoint, "out.>")
    assert sorted(stored) == sorted(body for _, body, _ in rows)


def test_sink_stream_replayed_batch_publishes_once(spark: Any, journaled: BrokerProcess, tmp_path: Path) -> None:
    publish(journaled.endpoint, 50)
    checkpoint = tmp_path / "checkpoint"

    def run() -> None:
        query = (
            spark.readStream.format("mc0")
            .option("endpoint", journaled.endpoint)
            .option("topics", "orders.>")
            .load()
            .selectExpr("concat('out.', topic) AS topic", "body")
            .writeStream.format("mc0")
            .option("endpoint", journaled.endpoint)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None

    again_if_worker_late(run)
    for name in os.listdir(checkpoint / "commits"):  # as if the query died after publishing
        (checkpoint / "commits" / name).unlink()
    again_if_worker_late(run)
    stored = journal_bodies(journaled.endpoint, "out.>")
    assert sorted(stored) == sorted(f"order {i}".encode() for i in range(50))


def test_source_and_sink_over_curve(spark: Any, tmp_path: Path) -> None:
    setup = CurveSetup(tmp_path, extra=JOURNALS)
    with setup.start() as broker:
        options = setup.client_options("alice")
        publish(broker.endpoint, 10, **options)
        df = (
            spark.read.format("mc0")
            .option("endpoint", broker.endpoint)
            .option("key", options["key"])
            .option("brokerKey", options["broker_key"])
            .option("topics", "orders.>")
            .load()
        )
        rows = df.collect()
        assert len(rows) == 10 and {r.sender for r in rows} == {"alice"}
        df.selectExpr("'out.copy' AS topic", "body").write.format("mc0").option("endpoint", broker.endpoint).option(
            "key", str(setup.secret("bob"))
        ).option("brokerKey", options["broker_key"]).mode("append").save()
        with mc0.Client(broker.endpoint, **options) as client:
            copies = client.fetch("main", topics=["out.copy"]).records
        assert len(copies) == 10 and {r.sender for r in copies} == {"bob"}
        stranger = (
            spark.read.format("mc0")
            .option("endpoint", broker.endpoint)
            .option("key", str(setup.secret("mallory")))
            .option("brokerKey", options["broker_key"])
            .option("timeout", "3")
            .load()
        )
        with pytest.raises(Exception, match="AuthFailed|refused|handshake"):
            stranger.count()


def test_fail_on_data_loss_decides_what_a_trimmed_start_does(spark: Any, tmp_path: Path) -> None:
    text = '[journals.main]\ntopics = ["orders.>"]\nsegment_bytes = 4096\nmax_bytes = 8192\n'
    with BrokerProcess(config=write_config(tmp_path, text), insecure=True) as broker:
        seqs = publish(broker.endpoint, 300)
        with mc0.Client(broker.endpoint) as client:
            first = client.journal_info()["main"]["first_seq"]
        assert first > seqs[0]
        reader = spark.read.format("mc0").option("endpoint", broker.endpoint).option("startingOffsets", "1")
        with pytest.raises(Exception, match="trimmed"):
            reader.load().count()
        kept = sorted(r.seq for r in reader.option("failOnDataLoss", "false").load().select("seq").collect())
        # Retention also runs every second, so the oldest kept may have moved on since `first`.
        assert kept[0] >= first and kept == [s for s in seqs if s >= kept[0]]


def test_check_workers_accepts_a_session_whose_workers_run_mc0(spark: Any) -> None:
    from mc0.spark import check_workers

    check_workers(spark)  # make_session's workers run this interpreter: no error


HANDED_SESSION = """
from pyspark.sql import SparkSession
import mc0, mc0.spark
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
try:
    mc0.spark.check_workers(spark)
except mc0.ConfigError as exc:
    print("REFUSED", exc)
else:
    print("ACCEPTED")
spark.stop()
"""


@pytest.mark.timeout(180)
def test_a_handed_session_whose_workers_cannot_import_mc0_is_refused_in_one_line(tmp_path: Path) -> None:
    """A session built with plain SparkSession.builder whose PYSPARK_PYTHON lacks mc0 (here a bare venv):
    Spark fixed that interpreter at start, so mc0 cannot default it, only say so clearly."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    env = {**os.environ, "PYSPARK_PYTHON": str(bare / "bin" / "python"), "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    env.pop("PYTHONPATH", None)
    result = subprocess.run([sys.executable, "-c", HANDED_SESSION], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=170)  # fmt: skip
    lines = [line for line in result.stdout.splitlines() if line.startswith(("REFUSED", "ACCEPTED"))]
    assert len(lines) == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert lines[0].startswith("REFUSED spark: Spark's Python workers cannot run the mc0 source ("), lines[0]
    assert f"set PYSPARK_PYTHON={sys.executable} before building it" in lines[0]
