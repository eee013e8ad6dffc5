"""`mc0 pipeline` on a generated workload equals an independent computation over the same journal;
`mc0 report` draws it.  Real broker with CURVE (three identities), real Spark (its own process)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0.cli import main as cli_main

from .conftest import CurveSetup, require
from .sparkretry import run_spark_job

require("pyspark")
# Spark's job: ~45 s on a quiet box, 110 s beside a CPU hog per core, 240 s beside the whole suite and
# the hogs (several JVMs start together at the suite's start): room for that, and a hang still ends.
pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (what Spark's exact percentile does)."""
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def minute_key(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M")


def read_table(folder: Path) -> list[dict[str, Any]]:
    import pyarrow.dataset as ds

    rows: list[dict[str, Any]] = ds.dataset(str(folder), format="parquet", partitioning="hive").to_table().to_pylist()
    return rows


def generate(endpoint: str, setup: CurveSetup) -> None:
    def flaky(request: mc0.Request) -> bytes:
        if request.body == b"fail":
            raise ValueError("asked to fail")
        return request.body * 2

    worker = mc0.Worker(endpoint, **setup.client_options("carol"))
    worker.service("svc")(flaky)
    worker.connect()
    try:
        plan = {"alice": [("orders.new", 30, 10)], "bob": [("orders.new", 20, 100), ("audit.x", 10, 1)]}
        for who, batches in plan.items():
            with mc0.Client(endpoint, **setup.client_options(who)) as client:
                for topic, count, size in batches:
                    for i in range(count):
                        client.publish(topic, b"z" * size, confirm=i == count - 1)
        with mc0.Client(endpoint, **setup.client_options("alice")) as client:
            for i in range(40):
                if i % 4 == 0:
                    with pytest.raises(mc0.HandlerFailed):
                        client.request("svc", b"fail")
                else:
                    client.request("svc", str(i).encode())
            for _ in range(5):
                with pytest.raises(mc0.NoResponders):
                    client.request("missing", b"")
    finally:
        worker.close()


def journal_records(client: mc0.Client) -> list[mc0.Record]:
    """Every record journal ``main`` holds now, page by page (a bounded walk)."""
    records: list[mc0.Record] = []
    seq = 0
    for _ in range(50):
        page = client.fetch("main", from_seq=seq)
        records += page.records
        if page.next_seq >= page.end_seq:
            return records
        seq = page.next_seq
    raise AssertionError(f"journal main: more than 50 pages ({len(records)} records so far)")


def assert_tables_equal_an_independent_computation(output: Path, records: list[mc0.Record]) -> None:
    """The pipeline's tables under ``output`` hold, for ``generate``'s topics, senders and services, what a
    plain Python computation over ``records`` (the journal the job read, its own rollups left out) gives."""
    workload = [r for r in records if not r.topic.startswith("mc0.rollup.")]
    topics: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    senders: dict[tuple[str, str], int] = defaultdict(int)
    calls: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in workload:
        key = minute_key(record.ts)
        topics[key, record.topic][0] += 1
        topics[key, record.topic][1] += len(record.body)
        senders[key, record.sender] += 1
        if record.topic == "mc0.sys.rpc":
            calls[key, json.loads(record.body)["service"]].append(json.loads(record.body))

    got_topics = {(r["minute_key"], r["topic"]): [r["messages"], r["bytes"]] for r in read_table(output / "topics")}
    for name in ("orders.new", "audit.x", "mc0.sys.rpc"):
        expected = {k: v for k, v in topics.items() if k[1] == name}
        assert {k: v for k, v in got_topics.items() if k[1] == name} == expected
    assert sum(v[0] for k, v in got_topics.items() if k[1] == "orders.new") == 50

    got_senders = {(r["minute_key"], r["sender"]): r["messages"] for r in read_table(output / "senders")}
    for who in ("alice", "bob"):
        assert {k: v for k, v in got_senders.items() if k[1] == who} == {
            k: v for k, v in senders.items() if k[1] == who
        }

    got_rpc = {(r["minute_key"], r["service"]): r for r in read_table(output / "rpc")}
    assert set(got_rpc) == set(calls)
    for minute_and_service, events in calls.items():
        row = got_rpc[minute_and_service]
        latencies = [e["latency_ms"] for e in events]
        errors = sum(1 for e in events if e["status"] != 200)
        assert (row["requests"], row["errors"]) == (len(events), errors)
        assert row["error_rate"] == pytest.approx(errors / len(events))
        for q, column in ((0.5, "latency_p50_ms"), (0.95, "latency_p95_ms"), (0.99, "latency_p99_ms")):
            assert row[column] == pytest.approx(percentile(latencies, q)), column
    assert sum(r["requests"] for k, r in got_rpc.items() if k[1] == "svc") == 40
    assert sum(r["errors"] for k, r in got_rpc.items() if k[1] == "svc") == 10
    assert sum(r["errors"] for k, r in got_rpc.items() if k[1] == "missing") == 5


@pytest.mark.long
def test_pipeline_rollups_equal_an_independent_computation_and_report_draws_them(tmp_path: Path) -> None:
    setup = CurveSetup(tmp_path, extra='[journals.main]\ntopics = [">", "mc0.sys.rpc"]\n')
    with setup.start() as broker:
        generate(broker.endpoint, setup)
        with mc0.Client(broker.endpoint, **setup.client_options("alice")) as client:
            records = journal_records(client)
        output = tmp_path / "pipeline"
        options = setup.client_options("alice")
        command = [sys.executable, "-m", "mc0", "pipeline", "--once", "--master", "local[2]", "--output", str(output)]
        command += ["--endpoint", broker.endpoint, "--key", options["key"], "--broker-key", options["broker_key"]]
        command += ["--max-records-per-trigger", "100"]  # several micro-batches, minutes recomputed across them
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        done = run_spark_job(command, within=480, cwd=ROOT, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "pipeline:" in done.stdout

        assert_tables_equal_an_independent_computation(output, records)

        # The rollups went back onto the bus.
        with mc0.Client(broker.endpoint, **setup.client_options("bob")) as client:
            published = client.fetch("main", topics=["mc0.rollup.>"]).records
        tables = {r.topic for r in published}
        assert tables == {"mc0.rollup.topics", "mc0.rollup.senders", "mc0.rollup.rpc"}
        last_rpc = [json.loads(r.body) for r in published if r.topic == "mc0.rollup.rpc"][-1]
        assert {row["service"] for row in last_rpc["rows"]} <= {"svc", "missing"}

    with pytest.raises(SystemExit) as exit_info:
        cli_main(["report", "--input", str(output)])
    assert exit_info.value.code == 0
    report = output / "report"
    assert (report / "traffic.png").stat().st_size > 10_000 and (report / "rpc.png").stat().st_size > 10_000
    page = (report / "report.html").read_text()
    assert "data:image/png;base64," in page and "svc" in page and "alice" in page


def test_report_without_tables_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["report", "--input", str(tmp_path / "nothing")])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no pipeline tables" in err[0]


def test_pipeline_with_an_unknown_journal_is_one_line_before_spark_starts(tmp_path: Path) -> None:
    from mc0.process import BrokerProcess

    from .conftest import write_config

    config = write_config(tmp_path, '[journals.main]\ntopics = [">"]\n')
    with BrokerProcess(config=config, insecure=True) as broker:
        result = subprocess.run(
            [sys.executable, "-m", "mc0", "pipeline", "--once", "--journal", "nope", "--endpoint", broker.endpoint],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert result.stderr.strip() == "mc0: error: option journal: the broker has no journal 'nope' (journals: main)"


def _write_table(folder: Path, rows: list[dict[str, Any]]) -> None:
    pa = require("pyarrow")
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "part-0.parquet")


def test_report_leaves_minutes_without_data_as_gaps_and_no_errors_on_an_axis_from_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.figure import Figure

    from mc0.spark.report import build_report

    numpy = require("numpy")
    at = [datetime(2026, 1, 1, 12, m, tzinfo=UTC) for m in range(5)]  # data at minutes 0, 1 and 4 only
    _write_table(
        tmp_path / "topics",
        [{"minute": at[m], "topic": "orders.new", "messages": 10 + m, "bytes": 100} for m in (0, 1, 4)]
        + [{"minute": at[1], "topic": "audit.x", "messages": 3, "bytes": 30}],  # silent at 0 and 4: zeros there
    )
    rpc_row = {"service": "svc", "requests": 5, "errors": 0, "error_rate": 0.0}
    latencies = {"latency_p50_ms": 1.0, "latency_p95_ms": 2.0, "latency_p99_ms": 3.0}
    _write_table(tmp_path / "rpc", [{"minute": at[m], **rpc_row, **latencies} for m in (0, 4)])
    drawn: list[Any] = []
    save = Figure.savefig

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:
        drawn.append(self)
        save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    build_report(tmp_path, tmp_path / "report")
    traffic, rpc = drawn
    lines = {line.get_label(): line for line in traffic.axes[0].get_lines()}
    gaps = [bool(v) for v in numpy.isnan(numpy.asarray(lines["orders.new"].get_ydata(), dtype=float))]
    assert gaps == [False, False, True, True, False]  # minutes 2 and 3 had no data: no line across them
    assert list(lines["audit.x"].get_ydata())[:2] == [0, 3]  # a minute with data, silent for a topic: 0
    latency, errors = rpc.axes
    p50 = numpy.asarray(latency.get_lines()[0].get_ydata(), dtype=float)
    assert [bool(v) for v in numpy.isnan(p50)] == [False, True, True, True, False]
    assert errors.get_ylim() == (0.0, 1.0) and "no errors" in errors.get_title()
