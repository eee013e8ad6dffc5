"""The cluster link (mc0.broker.cluster.link) on real nats-server nodes with mc0 broker processes: what crosses
between brokers is not held to NATS's max_payload (big messages, requests, replies and a broker's whole state
cross, split at record boundaries or chunked), and what waits to cross while NATS stalls is bounded."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import mc0
from mc0.natsproc import NatsCluster

from .clusterbus import ClusterBus, FakeBroker, nats_cluster, until

pytestmark = pytest.mark.timeout(180)

MIB = 1 << 20


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    yield from nats_cluster(tmp_path_factory.mktemp("nats"))


@pytest.fixture
def bus(tmp_path: Path, nats: NatsCluster) -> Iterator[ClusterBus]:
    with ClusterBus(tmp_path, nats, size=2, http=True) as joined:
        joined.wait_joined()
        yield joined


def test_a_2_mib_put_answered_ok_reaches_the_subscriber_at_another_broker(bus: ClusterBus) -> None:
    body = os.urandom(2 * MIB)
    with bus.client(0) as pub, bus.client(1) as sub_client:
        sub = sub_client.subscribe("big.>")
        until(lambda: bus.interest(0, "big.x") >= 1, 5, "b2's interest known at b1")
        pub.publish("big.x", body, confirm=True)
        pub.publish("big.y", b"small, behind it", confirm=True)
        first, second = sub.next(timeout=10), sub.next(timeout=10)
        assert (first.topic, len(first.body), first.body == body) == ("big.x", len(body), True)
        assert (second.topic, second.body) == ("big.y", b"small, behind it")  # in order
    link = bus.varz(0)["cluster"]["link"]
    assert link.get("route_chunks", 0) >= 3 and link.get("route_send_failed", 0) == 0


def test_a_1_5_mib_request_and_its_1_5_mib_final_cross_brokers(bus: ClusterBus) -> None:
    worker = mc0.Worker(bus.endpoint(1), capacity=1)
    worker.service("mirror")(lambda request: request.body[::-1])
    worker.connect()
    threading.Thread(target=worker.run, daemon=True).start()
    try:
        until(lambda: "mirror" in json.loads(_services(bus, 0)), 10, "the worker at b2 known at b1")
        body = os.urandom(3 * MIB // 2)
        with bus.client(0) as client:
            reply = client.request("mirror", body, timeout=15)
        assert reply.body == body[::-1]
    finally:
        worker.close()


def _services(bus: ClusterBus, i: int) -> bytes:
    with bus.client(i) as client:
        return client.request("mc0.broker", b"services", timeout=5).body


def test_a_broker_whose_whole_state_is_over_1_mib_is_heard_by_a_broker_that_joins(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """b1's CONNECT and its whole state (2,000 patterns of 700 bytes: 1.4 MB) go to b2 when b2 joins; b2's
    CONNECT makes b1 send it all again: each is split at record boundaries below max_payload, so a
    publication at b2 on any of the patterns reaches b1's subscriber."""
    patterns = [f"state.{i:05d}.{'p' * 680}" for i in range(2000)]
    with ClusterBus(tmp_path, nats, size=2, http=True) as bus:  # (both started; b2 is stopped and started again below)
        bus.wait_joined()
        bus.kill(1)
        until(lambda: bus.cluster_report(0)["brokers"] == [], 10, "b2 gone at b1")
        with bus.client(0) as client:
            sub = client.subscribe(*patterns)
            bus.start(1)
            bus.wait_joined()
            with bus.client(1) as pub:
                for pattern in (patterns[-1], patterns[0], patterns[1000]):
                    for _ in range(100):  # (interest is eventual: until it is there)
                        pub.publish(pattern, pattern.encode()[:12])
                        try:
                            if sub.next(timeout=0.2).topic == pattern:
                                break
                        except mc0.Timeout:
                            continue
                    else:
                        raise AssertionError(f"{pattern[:12]} never crossed")
            assert bus.varz(0)["cluster"]["link"]["route_send_failed"] == 0
            assert bus.varz(0)["cluster"]["link"]["route_messages_out"] > bus.varz(0)["cluster"]["link"]["sent"]


def test_hostile_chunks_cost_only_themselves_and_what_is_put_together_stays_bounded(
    bus: ClusterBus, nats: NatsCluster
) -> None:
    """Made-up senders (the brokers' NATS login) send b1 first chunks announcing records of the largest size:
    eight of 20 bytes announcing 64 MiB between them (which reserved the whole reassembly budget for 30 s:
    adversary D7), then 300 of 64 KiB.  None has a route at b1: each is refused, counted, and costs
    nothing.  A made-up broker b1 has a route to (FakeBroker) sends what no broker would: a total past
    the largest record, chunks of nothing under way, chunks that do not continue, and garbage: each costs
    only itself (counted).  b1's memory stays bounded, and a 2 MiB message from b2 to b1 crosses at once
    (it needs b1's reassembly)."""
    from mc0.broker.cluster.link import REASSEMBLY_BUDGET_BYTES, RECORD_SLACK_BYTES
    from mc0.protocol import routes as wire

    b1 = psutil.Process(bus.brokers[0].proc.pid)  # type: ignore[union-attr]
    largest = 8 * MIB + RECORD_SLACK_BYTES  # b1's max_message_bytes (the default) and the slack
    with FakeBroker(nats.url(0)) as fake:
        until(lambda: "fake" in bus.cluster_report(0)["brokers"], 10, "b1 has a route to the fake broker")
        baseline = b1.memory_info().rss
        starts = [largest] * 7 + [7_900_000]  # (7 x 8 MiB + 64 KiB + 7.9 MB: the 64 MiB budget, reserved)
        ghosts = [wire.chunk_message(f"ghost{n}", 1, total, 0, b"x" * 20) for n, total in enumerate(starts)]
        ghosts += [wire.chunk_message(f"s{i}", 1, largest, 0, os.urandom(64 * 1024)) for i in range(300)]
        hostile = [wire.chunk_message("fake", fake.epoch, wire.MAX_CHUNKED_BYTES, 0, b"x" * 1000)]  # past the largest
        hostile += [wire.chunk_message("fake", fake.epoch, 5000, 1000, b"y" * 1000) for _ in range(50)]
        hostile += [
            wire.chunk_message("fake", fake.epoch, 5000, 0, b"z" * 1000),
            wire.chunk_message("fake", fake.epoch, 5000, 3000, b"z"),  # (skips: lost, and itself stray)
        ]
        hostile += [os.urandom(n) for n in (1, 9, 80, 4096)] + [bytes([0x85]) + b"s!*>." + os.urandom(40)]
        fake.publish("b1", ghosts + hostile)
        peak = b1.memory_info().rss
        link = until_link(bus, lambda link: link["route_chunks_in"] >= 361)
        assert link["route_chunks_refused"] >= 308  # no route at b1: refused, nothing reserved
        assert link["route_records_lost"] >= 2 and link["route_chunks_stray"] >= 51 and link["malformed"] >= 2
        print(f"b1 grew by {(peak - baseline) / MIB:.0f} MiB taking the hostile chunks; link {link}")
        assert peak - baseline <= REASSEMBLY_BUDGET_BYTES + 64 * MIB
        body = os.urandom(2 * MIB)
        with bus.client(1) as pub, bus.client(0) as sub_client:
            sub = sub_client.subscribe("after.>")
            until(lambda: bus.interest(1, "after.x") >= 1, 5, "b1's interest known at b2")
            pub.publish("after.x", body, confirm=True)
            assert sub.next(timeout=10).body == body


def until_link(bus: ClusterBus, condition: Any, i: int = 0) -> dict[str, int]:
    """Broker ``i``'s link counters once ``condition`` holds of them (polled)."""
    found: dict[str, int] = {}

    def check() -> bool:
        found.update(bus.varz(i)["cluster"]["link"])
        return bool(condition(found))

    until(check, 15, "the link's counters")
    return found


def test_route_traffic_waiting_while_nats_stalls_is_bounded_then_counted_and_the_routes_heal(tmp_path: Path) -> None:
    """b1's NATS node frozen (SIGSTOP) for 6 s while 256 KiB PUTs for a subscriber at b2 keep coming to b1:
    b1's memory stays within the route's queue budget plus what the link may hold (stated below), what
    went past the budget is counted (/varz) and the route resynced, and after SIGCONT interest is right
    again and messages cross.  The link stays up and b2 a route of b1's all along (NATS pings every 3 s,
    100 beacons may be missed): the heal is the resync's, not a reconnection's."""
    from mc0.broker.cluster import outbound

    queue_budget = 16 * MIB
    # What b1 may grow by: the route's queue, what the link's thread may hold (handed over, and in nats-py's
    # buffer and its transport's), and room for libzmq's receive queue and the heap's slack on a loaded box.
    allowed = queue_budget + outbound.SEND_BUDGET_BYTES + 2 * outbound.PENDING_BYTES + 64 * MIB
    own = NatsCluster(tmp_path / "nats", 3, jetstream=False)
    with own:
        own.wait_ready()
        broker = f"max_queue_bytes = {queue_budget}\n"
        nodes = ((0,), (1,))  # b1 on node 1 only, b2 on node 2 only
        slow = {"route_liveness": 100, "extra": "ping_ms = 3000\n"}
        with ClusterBus(tmp_path, own, size=2, broker=broker, nodes_of=nodes, http=True, **slow) as bus:
            bus.wait_joined()
            b1 = psutil.Process(bus.brokers[0].proc.pid)  # type: ignore[union-attr]
            body = os.urandom(256 * 1024)
            stop = threading.Event()
            received = [0]
            with bus.client(0) as pub, bus.client(1) as sub_client:
                sub = sub_client.subscribe("stall.>")
                until(lambda: bus.interest(0, "stall.x") >= 1, 5, "b2's interest known at b1")

                def consume() -> None:
                    while not stop.is_set():
                        try:
                            received[0] += len(sub.next_batch(100, timeout=0.2))
                        except mc0.Timeout:
                            pass

                def publish() -> None:
                    for _ in range(100_000):
                        if stop.is_set():
                            return
                        try:
                            pub.publish("stall.x", body)
                        except mc0.Error:
                            time.sleep(0.01)

                threads = [threading.Thread(target=consume), threading.Thread(target=publish)]
                for thread in threads:
                    thread.start()
                try:
                    until(lambda: received[0] >= 20, 10, "traffic crossing before the stall")
                    baseline = b1.memory_info().rss
                    own.pause(0)
                    peak = baseline
                    try:
                        frozen = time.monotonic()
                        while time.monotonic() - frozen < 6.0:
                            peak = max(peak, b1.memory_info().rss)
                            time.sleep(0.02)
                    finally:
                        own.resume(0)
                    stop.set()
                finally:
                    stop.set()
                    for thread in threads:
                        thread.join(30)
                grown = (peak - baseline) / MIB
                print(f"b1 grew by {grown:.0f} MiB with its NATS node frozen for 6 s (allowed {allowed / MIB:.0f})")
                assert peak - baseline <= allowed
                varz = bus.varz(0)
                dropped = varz["counters"].get("route_queue_dropped", 0)
                print(f"route_queue_dropped {dropped}, link {varz['cluster']['link']}")  # (for the record)
                assert dropped > 0 and varz["counters"].get("route_resynced", 0) > 0  # counted, and resynced
                assert varz["cluster"]["link"]["reconnects"] == 0  # (the link never went down)
                # Healed: b2's interest is known at b1 again, and a message crosses.
                bus.wait_joined(20)
                until(lambda: bus.interest(0, "stall.x") >= 1, 20, "b2's interest known at b1 again")
                for _ in range(50):
                    pub.publish("stall.x", b"after")
                    try:
                        if any(m.body == b"after" for m in sub.next_batch(1000, timeout=0.2)):
                            break
                    except mc0.Timeout:
                        continue
                else:
                    raise AssertionError("nothing crossed after the stall")
