"""The client library against a real broker; every test runs on the sync and the asyncio API."""

from __future__ import annotations

import pickle
import re
from typing import Any

import pytest

import mc0
from mc0.process import BrokerProcess

from .conftest import Bus

pytestmark = pytest.mark.asyncio


async def test_publish_subscribe_with_wildcards_headers_and_sender(api: Any, bus: Bus) -> None:
    sub = await api(api.Client(bus.endpoint, **bus.options).connect())
    pub = await api(api.Client(bus.endpoint, **bus.options).connect())
    stream = await api(sub.subscribe("metrics.*.cpu", "metrics.>"))
    await api(pub.publish("metrics.web1.cpu", b"0.93", headers={"X-Unit": "ratio"}))
    await api(pub.publish("metrics.web1.mem", [b"part1", b"part2"], confirm=True))
    first = await api(stream.next(timeout=5))
    second = await api(stream.next(timeout=5))
    assert first == mc0.Message("metrics.web1.cpu", (b"0.93",), bus.sender, {"X-Unit": "ratio"})
    assert second.body == b"part1part2" and second.parts == (b"part1", b"part2")
    with pytest.raises(mc0.Timeout):
        await api(stream.next(timeout=0.3))  # matched by two patterns, delivered once
    assert pickle.loads(pickle.dumps(first)) == first
    await api(pub.close())
    await api(sub.close())
    await api(sub.close())  # idempotent


async def test_two_subscriptions_of_one_client_each_get_the_message(api: Any, bus: Bus) -> None:
    client = await api(api.Client(bus.endpoint, **bus.options).connect())
    a = await api(client.subscribe("x.*"))
    b = await api(client.subscribe("x.y"))
    await api(client.publish("x.y", b"1", confirm=True))
    assert (await api(a.next(timeout=5))).body == b"1"
    assert (await api(b.next(timeout=5))).body == b"1"
    await api(a.close())
    await api(client.publish("x.y", b"2", confirm=True))
    assert (await api(b.next(timeout=5))).body == b"2"
    with pytest.raises(mc0.ClosedError):
        await api(a.next(timeout=1))
    await api(client.close())


async def test_unsubscribe_by_pattern_ends_iteration(api: Any, bus: Bus) -> None:
    client = await api(api.Client(bus.endpoint, **bus.options).connect())
    sub = await api(client.subscribe("t"))
    await api(client.publish("t", b"last", confirm=True))
    await api(client.unsubscribe("t"))
    await api(client.publish("t", b"unseen", confirm=True))
    assert sub.closed
    received = []
    if api.name == "sync":
        received = [m.body for m in sub]
    else:
        received = [m.body async for m in sub]
    assert received == [b"last"]
    await api(client.close())


async def test_batches_hand_over_what_waits_in_order_up_to_max_and_end_with_the_subscription(
    api: Any, bus: Bus
) -> None:
    client = await api(api.Client(bus.endpoint, **bus.options).connect())
    sub = await api(client.subscribe("b.*"))
    for i in range(7):
        await api(client.publish("b.x", b"%d" % i, confirm=i == 6))
    await api(client.unsubscribe("b.*"))  # what it held is still handed over, then the iteration ends
    with pytest.raises(ValueError):
        if api.name == "sync":
            next(sub.batches(max=0))
        else:
            await sub.batches(max=0).__anext__()
    if api.name == "sync":
        batches = [[m.body for m in batch] for batch in sub.batches(max=3)]
    else:
        batches = [[m.body for m in batch] async for batch in sub.batches(max=3)]
    assert batches == [[b"0", b"1", b"2"], [b"3", b"4", b"5"], [b"6"]]
    await api(client.close())


async def test_confirmed_publish_raises_the_broker_error(api: Any, bus: Bus) -> None:
    client = await api(api.Client(bus.endpoint, **bus.options).connect())
    with pytest.raises(mc0.Forbidden) as info:
        await api(client.publish("mc0.sys.x", b"no", confirm=True))
    assert info.value.code == 403
    with pytest.raises(mc0.InvalidTopic):
        await api(client.publish("bad..topic", b"local misuse raises before sending"))
    await api(client.close())


async def test_ping_measures_a_round_trip(api: Any, bus: Bus) -> None:
    client = await api(api.Client(bus.endpoint, **bus.options).connect())
    assert 0 < await api(client.ping()) < 1
    await api(client.close())


async def test_connect_without_a_broker_says_refused(api: Any) -> None:
    client = api.Client("tcp://127.0.0.1:1", timeout=0.3)
    with pytest.raises(mc0.Unreachable) as info:
        await api(client.connect())
    assert isinstance(info.value, ConnectionError) and "127.0.0.1:1: connection refused" in str(info.value)
    with pytest.raises(mc0.ClosedError):
        await api(client.publish("t", b"x"))


async def test_context_managers_close(api: Any, bus: Bus) -> None:
    if api.name == "sync":
        with api.Client(bus.endpoint, **bus.options) as client, client.subscribe("cm") as sub:
            client.publish("cm", b"x", confirm=True)
            assert sub.next(timeout=5).body == b"x"
        assert sub.closed and not client.connected
    else:
        async with api.Client(bus.endpoint, **bus.options) as client, await client.subscribe("cm") as sub:
            await client.publish("cm", b"x", confirm=True)
            assert (await sub.next(timeout=5)).body == b"x"
        assert sub.closed and not client.connected


async def test_broker_restart_heals_subscriptions_without_user_code(api: Any) -> None:
    first = BrokerProcess(insecure=True).start()
    endpoint = first.endpoint
    assert re.match(r"tcp://127\.0\.0\.1:\d+$", endpoint)
    try:
        sub = await api(api.Client(endpoint, ttl=0.2, timeout=3).connect())
        stream = await api(sub.subscribe("heal.>"))
        first.kill()  # a crash: no DISCONNECT
        with BrokerProcess(bind=(endpoint,), insecure=True) as second:
            pub = await api(api.Client(second.endpoint, timeout=3).connect())
            message = None
            for attempt in range(50):  # bounded: 50 x 0.1 s
                await api(pub.publish("heal.check", str(attempt).encode(), confirm=True))
                try:
                    message = await api(stream.next(timeout=0.1))
                    break
                except mc0.Timeout:
                    continue
            assert message is not None, "the subscriber did not heal"
            assert message.topic == "heal.check"
            assert sub.reconnects == 1
            await api(pub.close())
            await api(sub.close())
    finally:
        first.kill()


async def test_broker_shutdown_disconnect_then_return_heals(api: Any) -> None:
    first = BrokerProcess(insecure=True).start()
    endpoint = first.endpoint
    sub = await api(api.Client(endpoint, ttl=0.2, timeout=3).connect())
    stream = await api(sub.subscribe("again"))
    assert first.stop() == 0  # clean: the broker sends DISCONNECT
    with BrokerProcess(bind=(endpoint,), insecure=True) as second:
        pub = await api(api.Client(second.endpoint, timeout=3).connect())
        got = None
        for _ in range(50):
            await api(pub.publish("again", b"x", confirm=True))
            try:
                got = await api(stream.next(timeout=0.1))
                break
            except mc0.Timeout:
                continue
        assert got is not None and got.body == b"x"
        await api(pub.close())
        await api(sub.close())
