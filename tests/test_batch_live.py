"""Batched framing against a real broker: peers of every framing share a topic; a burst at default
settings loses nothing; a consumer that falls behind learns it, at either end; short records are 400s
that do not grow the log; a big batch is walked in slices (others served between them, nobody
expired) and its refusals are answered once they are many."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import time
from typing import Any

import psutil
import pytest
import zmq

import mc0
import mc0.aio
from mc0.errors import OverLimit, SlowConsumer
from mc0.process import BrokerProcess
from mc0.protocol import batch

from .conftest import RawPeer, headers_of, payload_of, write_config

N = 2000


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_every_framing_shares_a_topic_each_message_once_in_order(zctx: zmq.Context[Any]) -> None:
    with BrokerProcess(insecure=True) as broker:
        seed = RawPeer(broker.endpoint, zctx)
        seed.send("CONNECT", "VERSION", "0.3", "TTL", "5000", "ID", "c")
        assert seed.recv()[0] == b"OK"
        plain = RawPeer(broker.endpoint, zctx)
        assert plain.connect()[0] == b"OK"
        seed.send("SUB", "ID", "s", "", "mix.lib", "mix.raw")  # 0.x: exact topics, no wildcards
        plain.send("SUB", "ID", "s", "", "mix.>")
        for peer in (seed, plain):
            assert peer.recv() == [b"OK", b"ID", b"s"]
        async with (
            mc0.aio.Client(broker.endpoint) as batched,
            mc0.aio.Client(broker.endpoint, batch=False) as unbatched,
        ):
            assert batched.session.batched and not unbatched.session.batched
            subs = [await batched.subscribe("mix.>"), await unbatched.subscribe("mix.>")]
            raw_pub = RawPeer(broker.endpoint, zctx)
            assert raw_pub.connect()[0] == b"OK"
            for i in range(N):  # two publishers interleaved: one batched, one raw frames
                await batched.publish("mix.lib", str(i).encode())
                raw_pub.send("PUT", "TOPIC", "mix.raw", "", str(i))
            await batched.flush()
            raw_pub.send("PING", "ID", "done")
            assert raw_pub.recv_skipping_noop() == [b"PONG", b"ID", b"done"]

            def check(messages: list[tuple[str, bytes]]) -> None:
                for topic in ("mix.lib", "mix.raw"):
                    bodies = [body for t, body in messages if t == topic]
                    assert bodies == [str(i).encode() for i in range(N)], topic

            for sub in subs:
                check([(m.topic, m.body) for m in [await sub.next(timeout=10) for _ in range(2 * N)]])
            for peer in (seed, plain):
                received = []
                for _ in range(2 * N):
                    frames = peer.recv_skipping_noop()
                    received.append((headers_of(frames)["TOPIC"], payload_of(frames)[0]))
                check(received)
                assert peer.nothing(0.2)
        for peer in (seed, plain, raw_pub):
            peer.close()


def _subscriber(endpoint: str, count: int, ready: Any, done: Any) -> None:
    async def run() -> None:
        async with mc0.aio.Client(endpoint) as client:
            sub = await client.subscribe("burst.>")
            ready.put(True)
            seen: set[int] = set()
            duplicates = 0
            deadline = time.monotonic() + 60
            while len(seen) < count and time.monotonic() < deadline:
                for message in await sub.next_batch(10_000, timeout=max(0.1, deadline - time.monotonic())):
                    number = int(message.body)
                    duplicates += number in seen
                    seen.add(number)
            done.put((len(seen), duplicates, sub.dropped, [str(f) for f in client.faults]))

    asyncio.run(run())


@pytest.mark.timeout(120)
def test_a_burst_of_100000_to_4_subscribers_at_default_settings_arrives_exactly_once() -> None:
    import multiprocessing

    count = 100_000
    ctx = multiprocessing.get_context("spawn")
    with BrokerProcess(insecure=True) as broker:
        ready, done = ctx.Queue(), ctx.Queue()
        subscribers = [ctx.Process(target=_subscriber, args=(broker.endpoint, count, ready, done)) for _ in range(4)]
        for process in subscribers:
            process.start()
        try:
            for _ in subscribers:
                ready.get(timeout=30)
            with mc0.Client(broker.endpoint) as publisher:
                for i in range(count):
                    publisher.publish("burst.x", str(i).encode())
                publisher.ping(timeout=30)
            results = [done.get(timeout=90) for _ in subscribers]
        finally:
            for process in subscribers:
                process.join(10)
                if process.is_alive():
                    process.kill()
    assert results == [(count, 0, 0, [])] * 4


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_subscription_the_application_does_not_read_reports_why_it_drops(api: Any) -> None:
    faults: list[Exception] = []
    with BrokerProcess(insecure=True) as broker:
        client = await api(api.Client(broker.endpoint, on_fault=faults.append).connect())
        sub = await api(client.subscribe("lazy", max_pending=100))
        for i in range(1000):
            await api(client.publish("lazy", str(i).encode()))
        await api(client.ping())
        deadline = time.monotonic() + 10
        while sub.dropped < 900 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert sub.dropped == 900
        (fault,) = [f for f in faults if isinstance(f, SlowConsumer)]
        assert fault.where == "client" and "lazy" in str(fault) and "max_pending 100" in str(fault)
        assert any(isinstance(f, SlowConsumer) for f in client.faults)
        first = await api(sub.next(timeout=1))
        assert first.body == b"0"  # the oldest are kept, the newest dropped
        await api(client.close())


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_client_whose_loop_stalls_is_evicted_and_learns_why_when_it_resumes(tmp_path: Any) -> None:
    config = write_config(tmp_path, "[broker]\nmax_queue_bytes = 200000\nslow_consumer_ms = 300\nsend_hwm = 4\n")
    with BrokerProcess(config=config, insecure=True) as broker:
        async with mc0.aio.Client(broker.endpoint, ttl=1) as slow:
            await slow.subscribe("flood")
            with mc0.Client(broker.endpoint) as publisher:  # its own I/O thread: it floods while we stall
                stop = time.monotonic() + 1.5

                def flood() -> None:
                    while time.monotonic() < stop:
                        publisher.publish("flood", b"x" * 10_000)

                flooder = threading.Thread(target=flood)
                flooder.start()
                while time.monotonic() < stop:  # this loop (the slow client's) does nothing meanwhile
                    time.sleep(0.01)
                flooder.join(10)
                deadline = time.monotonic() + 10
                while not any(isinstance(f, OverLimit) for f in slow.faults) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                (evicted,) = [f for f in slow.faults if isinstance(f, OverLimit)]
                assert evicted.code == 429 and "too slow" in evicted.reason
                while slow.reconnects < 1 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert slow.reconnects >= 1  # told why, then healed
                stats = publisher.request("mc0.broker", "stats")
                assert '"forgotten_too_slow": 1' in stats.body.decode()


# ---------------------------------------------------------------- the batch walk
CONNECT_BATCHED = ("CONNECT", "VERSION", "1.0", "TTL", "5000", "BATCH", "1", "ID", "c")


def commands(message: list[bytes]) -> list[list[bytes]]:
    """What a peer reads from one message: a BATCH's records as commands, else the frames."""
    if batch.is_batch(message):
        blob = message[2]
        return [batch.frames_of(blob, code, start, end) for code, start, end in batch.records(blob)]
    return [message]


def read_commands(peer: RawPeer, count: int, timeout: float = 5.0) -> list[list[bytes]]:
    got: list[list[bytes]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:  # bounded by the deadline (recv raises past it)
        got += [c for c in commands(peer.recv(max(0.01, deadline - time.monotonic()))) if c != [b"NOOP"]]
    return got


def batched_peer(broker: BrokerProcess, context: zmq.Context[Any]) -> RawPeer:
    peer = RawPeer(broker.endpoint, context)
    peer.send(*CONNECT_BATCHED)
    assert commands(peer.recv())[0][0] == b"OK"
    return peer


@pytest.mark.timeout(60)
def test_two_thousand_short_shortcut_records_are_400s_and_do_not_grow_the_log(zctx: zmq.Context[Any]) -> None:
    with BrokerProcess(insecure=True) as broker:
        peer = batched_peer(broker, zctx)
        codes = (batch.PUT, batch.CALL, batch.PARTIAL, batch.FINAL)
        for i in range(2000):  # six-byte messages: a record header and one byte
            peer.send("BATCH", "", struct.pack("<IB", 2, codes[i % 4]) + b"x")
        got = read_commands(peer, 2000, timeout=30)
        assert {tuple(c[:3]) for c in got} == {(b"ERROR", b"CODE", b"400")}
        assert broker.stop() == 0
        log = broker.stderr_text()
        assert len(log) < 4096, log[-2000:]  # (it was 1.2 MB of tracebacks)
        peer.close()


def pongs_while_working(
    broker: BrokerProcess, context: zmq.Context[Any], worker: RawPeer, last: bytes
) -> tuple[int, list[list[bytes]]]:
    """A bystander PINGs (one at a time) until ``worker`` reads the PONG that ends its batch;
    returns how many bystander PINGs were answered meanwhile and what the worker read (bounded
    in count and time)."""
    bystander = RawPeer(broker.endpoint, context)
    assert bystander.connect()[0] == b"OK"
    answered = 0
    read: list[list[bytes]] = []
    deadline = time.monotonic() + 60
    for i in range(100_000):
        assert time.monotonic() < deadline, "the batch was never done"
        while worker.socket.poll(0):
            read += [c for c in commands(worker.socket.recv_multipart()) if c != [b"NOOP"]]
        if [b"PONG", b"ID", last] in read:
            break
        bystander.send("PING", "ID", str(i))
        if bystander.recv_skipping_noop(timeout=30) == [b"PONG", b"ID", str(i).encode()]:
            answered += 1
    bystander.close()
    return answered, read


@pytest.mark.timeout(120)
def test_a_15_mb_batch_of_noops_does_not_stall_others_nor_expire_a_peer_heartbeating_at_ttl_1s(
    zctx: zmq.Context[Any],
) -> None:
    """Item 5: a bystander's PING waited 3 s behind one batch; two batches made the broker forget a
    well-behaved client heartbeating at TTL 1 s."""
    big = batch.record_of([b"NOOP"]) * 1_000_000
    with BrokerProcess(insecure=True) as broker:
        steady = mc0.Client(broker.endpoint, ttl=1.0).connect()
        try:
            worker = batched_peer(broker, zctx)
            for n in (1, 2):
                end = f"end{n}".encode()
                worker.send("BATCH", "", big + batch.record_of([b"PING", b"ID", end]))
                answered, _ = pongs_while_working(broker, zctx, worker, end)
                assert answered >= 5  # served between slices
            assert steady.reconnects == 0 and steady.ping() < 5.0
            counters = json.loads(steady.request("mc0.broker", "stats").body)["counters"]
            assert "forgotten_expired" not in counters, counters
        finally:
            steady.close()
        worker.close()


@pytest.mark.timeout(120)
def test_600000_refused_records_in_one_batch_are_answered_17_times_in_bounded_memory(zctx: zmq.Context[Any]) -> None:
    """Item 6: one 3 MB batch of refused five-byte records cost +210 MiB and 6.5 s of loop time."""
    with BrokerProcess(insecure=True) as broker:
        assert broker.proc is not None
        process = psutil.Process(broker.proc.pid)
        worker = batched_peer(broker, zctx)
        before = process.memory_info().rss
        worker.send("BATCH", "", b"\x01\x00\x00\x00\x00" * 600_000 + batch.record_of([b"PING", b"ID", b"end"]))
        answered, read = pongs_while_working(broker, zctx, worker, b"end")
        assert answered >= 5
        grown = process.memory_info().rss - before
        assert grown < 64 * 1024 * 1024, f"grew {grown / 2**20:.0f} MiB"
        worker.send("PING", "ID", "after")
        for _ in range(3):  # (the summary may come just before it)
            if [b"PONG", b"ID", b"after"] in read:
                break
            read += read_commands(worker, 1)
        refusals = [c for c in read if c[0] == b"ERROR"]
        assert len(refusals) == 17 and read[-1] == [b"PONG", b"ID", b"after"], read[-3:]
        assert b"599984 more records of this batch refused" in refusals[-1][4]
        with mc0.Client(broker.endpoint) as client:
            counters = json.loads(client.request("mc0.broker", "stats").body)["counters"]
        assert counters["rejected_400"] == 600_000
        worker.close()
