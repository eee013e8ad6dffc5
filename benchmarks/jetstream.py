"""Confirmed publishes into an R3 JetStream journal through an mc0 broker, beside nats-py straight into
an R3 stream, in the same run (benchmarks/journal.py ``--jetstream``).

Three nats-server nodes on loopback (``mc0.natsproc.NatsCluster``) run JetStream with
``sync_interval: always``: every node syncs each write before it counts, on both sides.  mc0: one
broker process with ``[journals.bench] store = "jetstream"``, ``replicas = 3``, ``fsync = "always"``,
and the async client's confirmed ``publish`` (the OK comes once JetStream acknowledged).  Baseline:
nats-py's ``js.publish`` / ``js.publish_async`` into a stream of the same config (R3, file storage).
Both publish ``--size``-byte bodies without a dedup id (an mc0 PUT without MSGID carries none to
JetStream either), one at a time and ``--window`` in flight (each window awaited, as journal.py's PUT
rows do).  A row whose
stream did not gain exactly what it acknowledged is failing.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from mc0.natsproc import NatsCluster
from mc0.process import BrokerProcess
from mc0.protocol.routes import REPLY_PREFIX

SYNC = "nodes sync_interval=always"
JOURNAL = "bench"


def names(window: int) -> dict[str, str]:
    return {
        "js1": f"JetStream R3 via nats-py, 1 in flight ({SYNC})",
        "mc01": f"mc0 R3 journal via broker, 1 in flight (fsync=always; {SYNC})",
        "jsw": f"JetStream R3 via nats-py, {window} in flight ({SYNC})",
        "mc0w": f"mc0 R3 journal via broker, {window} in flight (fsync=always; {SYNC})",
    }


async def stream_messages(urls: list[str], stream: str) -> int:
    """What the stream holds (its ``state.messages``)."""
    import nats

    nc = await nats.connect(servers=urls, inbox_prefix=REPLY_PREFIX)  # (the brokers' user: no _INBOX.>)
    try:
        msg = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=10)
        return int(json.loads(msg.data)["state"]["messages"])
    finally:
        await nc.close()


async def nats_py_rate(urls: list[str], config: dict[str, Any], count: int, size: int, window: int) -> float:
    """nats-py straight into the stream (its first subject, ``>`` made a token): messages per second."""
    import nats

    nc = await nats.connect(servers=urls, inbox_prefix=REPLY_PREFIX)  # (the brokers' user: no _INBOX.>)
    try:
        js = nc.jetstream(timeout=30, publish_async_max_pending=max(window, 1))
        subject = config["subjects"][0].replace(">", "x")
        body = b"x" * size
        started = time.perf_counter()
        if window == 1:
            for _ in range(count):
                await js.publish(subject, body)
        else:
            for start in range(0, count, window):
                futures = [await js.publish_async(subject, body) for _ in range(min(window, count - start))]
                await asyncio.gather(*futures)
        return count / (time.perf_counter() - started)
    finally:
        await nc.close()


async def mc0_rate(endpoint: str, count: int, size: int, window: int, topic: str = "bench.put") -> float:
    """Confirmed PUTs to ``topic`` through the broker: messages per second."""
    from mc0.aio import Client

    body = b"x" * size
    async with Client(endpoint, timeout=30) as client:
        started = time.perf_counter()
        if window == 1:
            for _ in range(count):
                await client.publish(topic, body, confirm=True)
        else:
            for start in range(0, count, window):
                batch = (client.publish(topic, body, confirm=True) for _ in range(min(window, count - start)))
                await asyncio.gather(*batch)
        return count / (time.perf_counter() - started)


async def ready(endpoint: str, timeout: float = 60.0) -> None:
    """A confirmed publish got its OK: the stream is there (the broker creates it once NATS is ready)."""
    from mc0.aio import Client
    from mc0.errors import Error

    deadline = time.monotonic() + timeout
    async with Client(endpoint, timeout=10) as client:
        while True:
            try:
                await client.publish("bench.warm", b"", confirm=True)
                return
            except Error:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)


async def create_stream(urls: list[str], config: dict[str, Any]) -> None:
    """Create the stream (retried while JetStream is not ready yet: 200 tries, 0.2 s apart)."""
    import nats

    nc = await nats.connect(servers=urls, inbox_prefix=REPLY_PREFIX)  # (the brokers' user: no _INBOX.>)
    try:
        for _ in range(200):
            msg = await nc.request(f"$JS.API.STREAM.CREATE.{config['name']}", json.dumps(config).encode(), timeout=10)
            if "error" not in json.loads(msg.data):
                return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"stream {config['name']} not created: {msg.data[:200]!r}")
    finally:
        await nc.close()


def jetstream_rates(
    count: int, size: int, window: int, runs: int, say: Any
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Rates per row (keys of ``names``) and lost messages per row."""
    from mc0.broker.jetstream.streams import StreamSpec

    rows = names(window)
    rates: dict[str, list[float]] = {name: [] for name in rows.values()}
    failed: dict[str, int] = {name: 0 for name in rows.values()}
    single = max(1, count // 10)  # one at a time is ~10x slower: fewer of them
    with tempfile.TemporaryDirectory(prefix="mc0-bench-js-") as tmp:
        root = Path(tmp)
        nats = NatsCluster(root / "nats", 3)  # sync_interval: always on every node
        nats.start()
        try:
            nats.wait_ready(60)
            urls = nats.urls()
            config = root / "mc0.toml"
            config.write_text(
                f'data_dir = "{root / "broker"}"\n[broker]\nmin_ttl_ms = 50\n'
                f'[cluster]\nnats = {json.dumps(urls)}\nname = "bench"\n'
                f'[journals.{JOURNAL}]\ntopics = ["bench.>"]\nstore = "jetstream"\nreplicas = 3\nfsync = "always"\n'
                "max_bytes = 0\n"
            )
            baseline = StreamSpec("nats_py_bench", 3, 0, 0, 0, 120).config()  # the journal's stream config
            baseline.update(name="NATS_PY_BENCH", subjects=["mc0.natspy.bench.>"])  # (the brokers' NATS user: mc0.>)
            asyncio.run(create_stream(urls, baseline))
            with BrokerProcess(config=str(config), insecure=True) as broker:
                asyncio.run(ready(broker.endpoint))
                for run in range(runs):
                    for key, how in (("js1", 1), ("mc01", 1), ("jsw", window), ("mc0w", window)):
                        n = single if how == 1 else count
                        stream = "NATS_PY_BENCH" if key.startswith("js") else f"MC0_J_{JOURNAL}"
                        before = asyncio.run(stream_messages(urls, stream))
                        if key.startswith("js"):
                            rate = asyncio.run(nats_py_rate(urls, baseline, n, size, how))
                        else:
                            rate = asyncio.run(mc0_rate(broker.endpoint, n, size, how))
                        stored = asyncio.run(stream_messages(urls, stream)) - before
                        name = rows[key]
                        rates[name].append(rate)
                        failed[name] += abs(n - stored)
                        say(f"run {run + 1}: {name}: {rate:,.0f} msg/s ({stored} of {n} stored)")
        finally:
            nats.stop()
    return rates, failed
