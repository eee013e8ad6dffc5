"""The robustness issue's bugs against real broker processes: single messages that killed the broker,
a worker's 401, heartbeats after connect, a subscriber that stops reading under 1 MiB messages."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq

import mc0
from mc0.process import BrokerProcess

from .conftest import RawPeer, write_config
from .test_robustness import CRASHERS

MIB = 1024 * 1024


@pytest.mark.timeout(60)
def test_no_single_message_kills_the_broker_and_everyone_is_still_answered(zctx: zmq.Context[Any]) -> None:
    with BrokerProcess(insecure=True) as broker:
        bystander = RawPeer(broker.endpoint, zctx)
        assert bystander.connect()[0] == b"OK"
        worker = RawPeer(broker.endpoint, zctx)
        assert worker.connect()[0] == b"OK"
        worker.send("READY", "ID", "r", "", "svc")
        assert worker.recv_skipping_noop() == [b"OK", b"ID", b"r"]
        for who, frames in CRASHERS:
            sender = worker if who == "worker" else RawPeer(broker.endpoint, zctx)
            if who == "client":
                assert sender.connect()[0] == b"OK"
            sender.send(*frames)
            bystander.send("PING", "ID", who)
            assert bystander.recv_skipping_noop() == [b"PONG", b"ID", who.encode()], frames[:4]
            if sender is not worker:
                sender.close()
        assert broker.proc is not None and broker.proc.poll() is None  # still running
        for peer in (bystander, worker):
            peer.close()


@pytest.mark.timeout(60)
def test_a_workers_401_reaches_its_caller_as_500_and_resets_nothing() -> None:
    with BrokerProcess(insecure=True) as broker:
        with mc0.Client(broker.endpoint) as client, zmq.Context() as context:
            raw = RawPeer(broker.endpoint, context)
            assert raw.connect()[0] == b"OK"
            raw.send("READY", "CAPACITY", "10", "ID", "r", "", "evil")
            assert raw.recv_skipping_noop() == [b"OK", b"ID", b"r"]
            pending = client.submit("evil", b"a")
            other = client.submit("evil", b"b")
            bids = [raw.recv_skipping_noop()[4] for _ in range(2)]
            raw.send("ERROR", "ID", bids[0], "CODE", "401", "MESSAGE", "go away")
            with pytest.raises(mc0.HandlerFailed) as caught:
                pending.result(timeout=5)
            assert "401" in caught.value.reason and "go away" in caught.value.reason
            raw.send("FINAL", "ID", bids[1], "", "fine")
            assert other.result(timeout=5).body == b"fine"  # the other request was not failed
            assert client.reconnects == 0 and client.ping() < 1.0
            raw.close()


@pytest.mark.timeout(60)
def test_idle_clients_with_a_short_ttl_are_never_expired(tmp_path: Path) -> None:
    config = write_config(tmp_path, "[broker]\nmin_ttl_ms = 100\n")
    with BrokerProcess(config=config, insecure=True) as broker:
        clients = [mc0.Client(broker.endpoint, ttl=1.0).connect() for _ in range(20)]
        try:
            time.sleep(4.5)  # > 3 x TTL of idleness: only heartbeats keep them
            assert [c.reconnects for c in clients] == [0] * 20
            stats = clients[0].request("mc0.broker", "stats").body.decode()
            assert '"forgotten_expired"' not in stats
        finally:
            for client in clients:
                client.close()


@pytest.mark.timeout(120)
def test_a_subscriber_that_stops_reading_1_mib_messages_is_bounded_then_freed(
    tmp_path: Path, zctx: zmq.Context[Any]
) -> None:
    budget = 32 * MIB
    config = write_config(tmp_path, f"[broker]\nmax_queue_bytes = {budget}\nsend_hwm = 4\nslow_consumer_ms = 1000\n")
    with BrokerProcess(config=config, insecure=True) as broker:
        assert broker.proc is not None
        process = psutil.Process(broker.proc.pid)
        stuck = RawPeer(broker.endpoint, zctx)
        stuck.socket.setsockopt(zmq.RCVHWM, 1)
        assert stuck.connect()[0] == b"OK"
        stuck.send("SUB", "ID", "s", "", "big")
        assert stuck.recv() == [b"OK", b"ID", b"s"]  # and never reads again
        publisher = RawPeer(broker.endpoint, zctx)
        assert publisher.connect()[0] == b"OK"
        baseline = process.memory_info().rss
        peak = baseline
        body = b"x" * MIB
        stats = mc0.Client(broker.endpoint).connect()
        try:
            # Publish (confirmed: the broker sets the pace) until the stuck peer is evicted, which
            # takes slow_consumer_ms of drops: a bounded number of rounds, each checking the stats.
            evicted = False
            sent = 0
            deadline = time.monotonic() + 60
            while not evicted and sent < 20_000 and time.monotonic() < deadline:
                for _ in range(100):
                    publisher.send("PUT", "TOPIC", "big", "ID", str(sent), "", body)
                    assert publisher.recv_skipping_noop()[:3] == [b"OK", b"ID", str(sent).encode()]
                    sent += 1
                    if sent % 25 == 0:
                        peak = max(peak, process.memory_info().rss)
                report = stats.request("mc0.broker", "stats").body.decode()
                evicted = '"forgotten_too_slow": 1' in report
            assert evicted, f"not evicted after {sent} messages: {report}"
            # The broker's queue for the stuck peer held at most the budget, libzmq send_hwm more;
            # the allowance covers the publisher's in-flight message and the allocator's slack.
            allowance = 48 * MIB
            assert peak - baseline < budget + 4 * MIB + allowance, f"grew {(peak - baseline) / MIB:.0f} MiB"
            # The evicted queue's pages go back to the OS: the broker trims its heap after dropping it
            # (glibc keeps freed big blocks in its heaps otherwise, and the RSS could stay up).
            deadline = time.monotonic() + 10
            while process.memory_info().rss - baseline > 16 * MIB and time.monotonic() < deadline:
                time.sleep(0.2)
            report = stats.request("mc0.broker", "stats").body.decode()
            assert json.loads(report)["counters"].get("heap_trims", 0) >= 1, report
            assert process.memory_info().rss - baseline <= 16 * MIB, "memory not returned after eviction"
        finally:
            stats.close()
        for peer in (stuck, publisher):
            peer.close()
