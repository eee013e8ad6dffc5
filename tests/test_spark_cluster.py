"""``mc0 pipeline --master spark://...`` on a real Spark standalone cluster (a master and a worker started
with pyspark's own spark-class on loopback) against a cluster of mc0 brokers whose journal JetStream
keeps (R3 over three nats-server nodes, CURVE): its tables equal an independent computation over the
same journal (the one tests/test_pipeline.py holds local mode to), its partitions are read at both
brokers, and its rollups go back onto the bus once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0.natsproc import NatsCluster

from .clusterbus import ClusterBus
from .conftest import require
from .sparkcluster import SparkStandalone
from .sparkretry import run_spark_job
from .test_jetstream_live import confirmed, journal, until
from .test_pipeline import assert_tables_equal_an_independent_computation, generate, journal_records

require("pyspark")  # (never a skip: a missing pyspark fails naming its install)
# A pipeline on a standalone cluster: ~100 s on a quiet box with the cluster's start, several times that
# beside the whole suite and a CPU hog per core: room for that, and a hang still ends.
pytestmark = [pytest.mark.timeout(1200), pytest.mark.long]

ROOT = Path(__file__).resolve().parent.parent


class Keys:
    """What test_pipeline.generate asks of its setup: each identity's client options."""

    def __init__(self, bus: ClusterBus) -> None:
        self.bus = bus

    def client_options(self, who: str) -> dict[str, Any]:
        return self.bus.options(who)


def pipeline(bus: ClusterBus, master: str, output: Path, *more: str) -> subprocess.CompletedProcess[str]:
    options = bus.options("alice")
    command = [sys.executable, "-m", "mc0", "pipeline", "--once", "--master", master, "--output", str(output)]
    command += ["--endpoint", bus.endpoints(), "--key", options["key"], "--broker-key", options["broker_key"]]
    command += ["--source-option", "minPartitions=2", *more]  # two ranges: one at each broker
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    # ~100 s on a quiet box; over 480 s once in a CI run beside the suite: what the test's 1200 s leave
    # after the setup (the cluster's start, the workload, both copies caught up).
    return run_spark_job(command, within=840, cwd=ROOT, env=env)


def fetches(bus: ClusterBus, i: int) -> int:
    with bus.client(i) as client:
        return int(
            json.loads(client.request("mc0.broker", b"stats", timeout=5).body)["counters"].get("journal_fetches", 0)
        )


def test_the_pipeline_on_a_spark_standalone_cluster_against_an_mc0_cluster_equals_an_independent_computation(
    tmp_path: Path,
) -> None:
    spark = SparkStandalone(tmp_path / "spark").start()  # (the JVMs start while the rest is set up)
    nats = NatsCluster(tmp_path / "nats")
    try:
        nats.start()
        nats.wait_ready()
        extra = journal("main", '[">", "mc0.sys.rpc"]')
        with ClusterBus(tmp_path, nats, 2, curve=True, extra=extra) as bus:
            bus.wait_joined()
            with bus.client(0, "alice") as alice:
                confirmed(alice, "warm.up", b"")  # the stream is there before the workload
            generate(bus.endpoints(), Keys(bus))  # through b1: publications, RPC telemetry (mc0.sys.rpc)
            with bus.client(0, "alice") as alice:
                last = confirmed(alice, "end.mark", b"").seq
                records = journal_records(alice)  # what the pipeline will read
            for i in range(2):
                with bus.client(i, "alice") as client:
                    until(lambda c=client: c.journal_info()["main"]["copy_next_seq"] > last, 30, f"b{i + 1}'s copy")
            print(f"spark standalone ready {spark.wait_ready():.1f} s after its start")
            before = [fetches(bus, i) for i in range(2)]
            began = time.monotonic()
            on_cluster = pipeline(bus, spark.master, tmp_path / "cluster")
            assert on_cluster.returncode == 0, on_cluster.stderr[-3000:]
            print(f"pipeline on {spark.master}: {time.monotonic() - began:.1f} s: {on_cluster.stdout.strip()}")
            assert all(fetches(bus, i) > before[i] for i in range(2))  # ranges read at both brokers
            assert_tables_equal_an_independent_computation(tmp_path / "cluster", records)
            # The sink against the cluster: the rollups back on the bus, each stored once (deterministic MSGIDs).
            with bus.client(1, "bob") as bob:
                published = bob.fetch("main", topics=["mc0.rollup.>"]).records
            assert {r.topic for r in published} == {"mc0.rollup.topics", "mc0.rollup.senders", "mc0.rollup.rpc"}
            ids = [r.headers.get("MSGID") for r in published]
            assert len(ids) == len(set(ids))
    finally:
        spark.stop()
        nats.stop()


def test_a_bad_source_option_is_one_line_before_spark_starts() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mc0", "pipeline", "--once", "--source-option", "minPartitions"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == "mc0: error: --source-option: KEY=VALUE, got 'minPartitions'"


def test_the_spark_helper_finds_spark_class_in_the_pyspark_installation(tmp_path: Path) -> None:
    helper = SparkStandalone(tmp_path)
    assert helper.spark_class.exists() and helper.master.startswith("spark://127.0.0.1:")
    assert len({helper.port, helper.master_ui, helper.worker_ui}) == 3
    assert mc0.__name__ == "mc0"
