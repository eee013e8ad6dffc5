"""What another broker sends, taken record by record (mc0.broker.core.routeinput), on real nats-server nodes: a
route message is published on the cluster's NATS subjects by a made-up broker (tests/clusterbus.py
FakeBroker, with the brokers' credentials) and handled by a real broker process."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import mc0
from mc0.natsproc import NatsCluster
from mc0.protocol import batch

from .clusterbus import ClusterBus, FakeBroker, nats_cluster, until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    yield from nats_cluster(tmp_path_factory.mktemp("nats"), nodes=1)


def counters(bus: ClusterBus, i: int) -> dict[str, int]:
    with bus.client(i) as client:
        stats = json.loads(client.request("mc0.broker", b"stats", timeout=5).body)
    return dict(stats["counters"])


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(batch.put_record(b"rt.bad", b"a client's PUT"), id="PUT"),
        pytest.param(batch.call_record(b"echo", b"c1", 5000, b"a client's REQUEST"), id="CALL-without-CALLER"),
        pytest.param(batch.ok_record(b"o1"), id="OK"),
        pytest.param(batch.frames_record([b"PUT", b"TOPIC", b"rt.bad", b"", b"x"]), id="FRAMES-PUT"),
        pytest.param(batch.frames_record([b"REQUEST", b"SERVICE", b"echo", b"ID", b"r9", b"", b"x"]), id="FRAMES-REQ"),
    ],
)
def test_a_record_the_route_grammar_has_no_place_for_costs_itself_only(
    tmp_path: Path, nats: NatsCluster, bad: bytes
) -> None:
    """Four MESSAGEs and a WORK around a record no broker sends another: every good record's effect
    arrives (the messages at the subscriber, the job at the worker and its FINAL back at the route),
    the bad one is counted, and the worker's only slot is free again at once."""
    jobs: list[bytes] = []

    def echo(request: mc0.Request) -> bytes:
        jobs.append(request.body)
        return b"done " + request.body

    with ClusterBus(tmp_path, nats, size=1) as bus, FakeBroker(nats.url(0)) as fake:
        until(lambda: "fake" in bus.cluster_report(0)["brokers"], 10, "b1 has a route to the fake broker")
        worker = mc0.Worker(bus.endpoint(0), capacity=1)
        worker.service("echo")(echo)
        worker.connect()
        threading.Thread(target=worker.run, daemon=True).start()
        try:
            with bus.client(0) as client:
                sub = client.subscribe("rt.>")
                message = [batch.message_record(f"rt.{i}".encode(), b"alice", f"m{i}".encode()) for i in range(4)]
                work = batch.work_record(b"echo", b"w1", b"alice", 5000, b"job 1")
                before = counters(bus, 0)
                fake.send("b1", b"".join([message[0], message[1], work, bad, message[2], bad, message[3]]))
                got = [sub.next(timeout=5) for _ in range(4)]
                want = [(f"rt.{i}", f"m{i}".encode(), "alice") for i in range(4)]
                assert [(m.topic, m.body, m.sender) for m in got] == want
                until(lambda: jobs == [b"job 1"], 5, "the job at the worker")
                until(
                    lambda: [b"FINAL", b"ID", b"w1", b"", b"done job 1"] in fake.records(), 5, "the FINAL at the route"
                )
                after = counters(bus, 0)
                assert after.get("route_records_refused", 0) - before.get("route_records_refused", 0) == 2
                assert after.get("internal_errors", 0) == before.get("internal_errors", 0)
                # The worker's one slot is free: the next job is served at once, not after the first one's timeout.
                fake.send("b1", batch.work_record(b"echo", b"w2", b"alice", 5000, b"job 2"))
                until(lambda: [b"FINAL", b"ID", b"w2", b"", b"done job 2"] in fake.records(), 5, "the second FINAL")
        finally:
            worker.close()
