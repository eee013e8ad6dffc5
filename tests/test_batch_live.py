"""Batched framing against a real broker: peers of every framing share a topic; a burst at default
settings loses nothing; a consumer that falls behind learns it, at either end."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import zmq

import mc0
import mc0.aio
from mc0.errors import OverLimit, SlowConsumer
from mc0.process import BrokerProcess

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
