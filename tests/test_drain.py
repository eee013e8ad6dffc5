"""drain(): stop receiving, let what is outstanding finish, close — on the sync and asyncio APIs."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

import mc0
from mc0.process import BrokerProcess

from .test_rpc_live import start_worker

pytestmark = pytest.mark.asyncio


async def take_all(api: Any, sub: Any, limit: int) -> list[bytes]:
    """Everything a drained subscription still holds; it must then end (iteration stops)."""
    got: list[bytes] = []
    if api.name == "sync":
        for message in sub:
            got.append(message.body)
            assert len(got) <= limit
    else:
        async for message in sub:
            got.append(message.body)
            assert len(got) <= limit
    return got


async def result(api: Any, future: Any) -> Any:
    return future.result(10) if api.name == "sync" else await future


async def test_drain_delivers_what_was_queued_to_publish(api: Any, bus: Any) -> None:
    sub_client = await api(api.Client(bus.endpoint, **bus.options).connect())
    sub = await api(sub_client.subscribe("d.>", max_pending=10_000))
    pub = await api(api.Client(bus.endpoint, **bus.options).connect())
    n = 2000
    for i in range(n):
        await api(pub.publish("d.x", str(i).encode()))  # fire and forget: sits in the outgoing buffer
    await api(pub.drain(timeout=10))
    assert pub.closed
    got: list[bytes] = []
    for _ in range(100):
        try:
            got += [m.body for m in await api(sub.next_batch(1000, timeout=1))]
        except mc0.Timeout:
            break
        if len(got) >= n:
            break
    assert got == [str(i).encode() for i in range(n)]
    await api(sub_client.close())


async def test_a_drained_subscription_keeps_what_arrived_then_ends(api: Any, broker: BrokerProcess) -> None:
    client = await api(api.Client(broker.endpoint).connect())
    pub = await api(api.Client(broker.endpoint).connect())
    plain = await api(client.subscribe("d.>", max_pending=10_000))
    grouped = await api(client.subscribe("d.>", group="g", max_pending=10_000))
    for i in range(500):
        await api(pub.publish("d.x", str(i).encode()))
    await api(pub.flush(timeout=10))
    await api(client.drain(timeout=10))
    assert client.closed and plain.closed and grouped.closed
    expected = [str(i).encode() for i in range(500)]
    assert await take_all(api, plain, 500) == expected  # nothing received is thrown away
    assert await take_all(api, grouped, 500) == expected
    with pytest.raises(mc0.ClosedError):
        await api(client.subscribe("more"))
    report = json.loads((await api(pub.request("mc0.broker", "groups", timeout=5))).body)
    assert report == {}  # the broker forgot the subscriptions
    assert json.loads((await api(pub.request("mc0.broker", "topics", timeout=5))).body) == {}
    await api(pub.close())


async def test_drain_waits_for_requests_already_sent(api: Any, broker: BrokerProcess) -> None:
    def slow(request: mc0.Request) -> bytes:
        time.sleep(0.3)
        return b"done " + request.body

    worker = await start_worker(api, broker.endpoint, {"slow": slow}, capacity=2)
    client = await api(api.Client(broker.endpoint).connect())
    futures = [client.submit("slow", str(i), timeout=10) for i in range(2)]
    await api(client.drain(timeout=10))
    assert client.closed
    assert [(await result(api, f)).body for f in futures] == [b"done 0", b"done 1"]  # answered, not failed
    await api(worker.close())


async def test_drain_past_its_deadline_closes_and_says_what_was_left(api: Any, broker: BrokerProcess) -> None:
    def stuck(request: mc0.Request) -> bytes:
        time.sleep(2)
        return b"late"

    worker = await start_worker(api, broker.endpoint, {"stuck": stuck})
    client = await api(api.Client(broker.endpoint).connect())
    future = client.submit("stuck", timeout=10)
    started = time.monotonic()
    with pytest.raises(mc0.Timeout, match="1 requests unanswered"):
        await api(client.drain(timeout=0.3))
    assert time.monotonic() - started < 3 and client.closed
    with pytest.raises(mc0.ClosedError):
        await result(api, future)
    await api(worker.close())
