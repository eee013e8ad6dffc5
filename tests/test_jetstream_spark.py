"""The ``mc0`` Spark source against a cluster of brokers whose journal JetStream keeps: partitions spread
over the brokers (each range read at its own broker of the endpoint list), and a broker killed mid-read
costs nothing (the range goes on at the next broker from the first record not yet read: each record
once).  Runs the source's executor code in this process (no JVM); the whole pipeline on a Spark
standalone cluster is tests/test_spark_cluster.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0.natsproc import NatsCluster
from mc0.spark.options import ReadSettings

from .clusterbus import ClusterBus
from .conftest import require
from .test_jetstream_live import confirmed, journal, until

pyarrow = require("pyarrow")  # (never a skip: a missing one fails naming its install)
source = require("mc0.spark.source")
pytestmark = pytest.mark.timeout(180)

RECORDS = 12_000


def fetches(bus: ClusterBus, i: int) -> int:
    with bus.client(i) as client:
        return int(
            json.loads(client.request("mc0.broker", b"stats", timeout=5).body)["counters"].get("journal_fetches", 0)
        )


def test_partitions_spread_over_the_brokers_and_one_killed_mid_read_loses_and_repeats_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nats = NatsCluster(tmp_path / "nats")
    nats.start()
    nats.wait_ready()
    try:
        with ClusterBus(tmp_path, nats, 3, extra=journal("scan", '["scan.>"]')) as bus:
            bus.wait_joined()
            with bus.client(0) as publisher:
                confirmed(publisher, "scan.x", b"0" * 1000)
                body = b"x" * 1000
                for _ in range(RECORDS - 2):
                    publisher.publish("scan.x", body)
                last = confirmed(publisher, "scan.x", body, within=60).seq
            assert last == RECORDS
            for i in range(3):  # every broker's local copy holds the stream
                with bus.client(i) as client:
                    until(lambda c=client: c.journal_info()["scan"]["copy_next_seq"] > last, 30, f"b{i + 1}'s copy")
            options = {"endpoint": bus.endpoints(), "journal": "scan", "maxRecordsPerPartition": str(RECORDS // 3)}
            settings = ReadSettings.from_options(options)
            ranges = source.Mc0Reader(settings).partitions()
            assert [(r.start, r.end, r.broker) for r in ranges] == [(1, 4001, 0), (4001, 8001, 1), (8001, 12001, 2)]
            before = [fetches(bus, i) for i in range(3)]
            seqs: dict[int, list[int]] = {}
            for k in (0, 2):
                seqs[k] = [s for b in source.read_range(settings, ranges[k]) for s in b.column(0).to_pylist()]
            assert [fetches(bus, i) - before[i] for i in (0, 2)] == [1, 1]  # each range at its own broker
            monkeypatch.setattr(source, "PAGE_RECORDS", 100)  # many pages: the kill lands mid-read
            reading = source.read_range(settings, ranges[1])
            seqs[1] = next(reading).column(0).to_pylist()
            bus.kill(1)  # kill -9 of the broker the range was read at
            killed = time.monotonic()
            for batch in reading:
                seqs[1] += batch.column(0).to_pylist()
            print(f"range read on at another broker; done {time.monotonic() - killed:.2f} s after the kill")
            for k, r in enumerate(ranges):
                assert seqs[k] == list(range(r.start, r.end))  # each record once, in order
    finally:
        nats.stop()


def test_a_lost_broker_fails_the_range_of_a_journal_only_one_broker_has() -> None:
    """A file journal in a cluster is each broker's own: its ranges are not spread, and a read never
    goes on at another broker (whose journal holds other records): the task fails (Spark retries it)."""
    ranges = source.split_range(1, 11, 5)
    assert [r.broker for r in ranges] == [-1, -1]
    assert [r.broker for r in source.split_range(1, 11, 5, spread=True)] == [0, 1]


def test_a_connection_turned_to_its_kth_broker() -> None:
    settings: Any = ReadSettings.from_options({"endpoint": "tcp://a:1,tcp://b:2,tcp://c:3"})
    assert settings.connection.rotated(4).endpoint == "tcp://b:2,tcp://c:3,tcp://a:1"
    assert ReadSettings.from_options({}).connection.rotated(3).endpoint is None


def test_connection_options_error_is_the_sources() -> None:
    with pytest.raises(mc0.ConfigError):
        ReadSettings.from_options({"endpoint": "tcp://a:1,tcp://a:1"})
