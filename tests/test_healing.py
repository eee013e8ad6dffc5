"""Healing after a broker crash: clients CONNECT again when the socket reconnects (not after
liveness x TTL of silence), restore subscriptions and services, and send what was published
while the broker was down. Sync and asyncio APIs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0.process import BrokerProcess

from .conftest import write_config
from .test_rpc_live import start_worker

JOURNAL = '[broker]\nmin_ttl_ms = 50\n[journals.main]\ntopics = ["heal.>"]\n'
TTL = 5.0  # liveness x TTL = 15 s: healing well before that is the socket events' doing


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_subscriber_worker_and_publisher_heal_on_reconnect(api: Any, tmp_path: Path) -> None:
    config = write_config(tmp_path, JOURNAL)
    first = BrokerProcess(config=config, insecure=True).start()
    endpoint = first.endpoint
    try:
        sub = await api(api.Client(endpoint, ttl=TTL).connect())
        stream = await api(sub.subscribe("heal.>"))
        worker = await start_worker(api, endpoint, {"echo": lambda r: r.body}, ttl=TTL)
        pub = await api(api.Client(endpoint, ttl=TTL).connect())
        first.kill()  # a crash: no DISCONNECT
        for _ in range(500):  # bounded: 5 s; the socket monitor reports the lost connection at once
            if not pub.connected:
                break
            await asyncio.sleep(0.01)
        assert not pub.connected, "the publisher did not notice the broker's crash"
        # Published once the client knows no broker runs: kept by the client, not lost. (A message handed
        # to libzmq before the loss was reported goes down with the dead connection: at most once.)
        for i in range(200):
            await api(pub.publish("heal.buffered", str(i).encode()))
        with BrokerProcess(config=config, insecure=True, bind=(endpoint,)):
            restarted = time.monotonic()
            message = None
            for attempt in range(100):  # bounded: 100 x 0.1 s, under the 15 s liveness
                await api(pub.publish("heal.check", str(attempt).encode()))
                try:
                    message = await api(stream.next(timeout=0.1))
                    break
                except mc0.Timeout:
                    continue
            assert message is not None, "the subscriber did not heal before liveness x TTL"
            healed_after = time.monotonic() - restarted
            reply, last_error = None, None
            deadline = restarted + 12  # the worker's READY is restored too, well before the 15 s liveness
            for _ in range(400):  # bounded in count and (below) in time: a 503 comes back at once
                try:
                    reply = await api(pub.request("echo", b"hi", timeout=0.5))
                    break
                except (mc0.NoResponders, mc0.DeadlineExceeded) as exc:
                    last_error = exc
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)  # poll: the worker's CONNECT + READY may still be on the way
            assert reply is not None and reply.body == b"hi", f"the worker did not heal: {last_error!r}"
            await api(pub.flush(timeout=5))
            stored = (await api(pub.fetch("main", topics=["heal.buffered"]))).records
            assert [r.body for r in stored] == [str(i).encode() for i in range(200)]
            assert sub.reconnects == pub.reconnects == 1
            print(f"healed {healed_after:.3f} s after the broker came back")
            for client in (pub, sub, worker):
                await api(client.close())
    finally:
        first.kill()
