"""Confirmed publishes into a file journal through an mc0 broker, beside nats-py into a one-node
JetStream file stream, at equal durability, in the same run (benchmarks/journal.py ``--file-vs-jetstream``).

Pairs (both sides R1: one broker with a file journal per fsync policy; one nats-server node per
sync setting, a file stream on each):

- mc0 ``fsync = "always"`` (each record written and fsynced as it is appended, before its OK) vs
  JetStream ``sync_interval: always`` (each write synced before its ack);
- mc0 ``fsync = "batch"`` (group commit: one write and one fsync for the records of a receive turn,
  then their OKs) vs the same ``sync_interval: always`` node;
- mc0 ``fsync = "never"`` (written to the OS before the OK, never fsynced by the broker) vs JetStream
  at its default ``sync_interval`` (2 minutes: not synced before the ack).

Each side publishes ``--size``-byte bodies one at a time and ``--window`` in flight (each window
awaited), with the helpers of benchmarks/jetstream.py: nats-py's ``js.publish`` /
``js.publish_async`` and the mc0 async client's confirmed ``publish``.  The stored count is what
the stream's ``state.messages`` / the journal's ``next_seq`` gained; a row whose store did not gain
exactly what was acknowledged is failing.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.jetstream import create_stream, mc0_rate, nats_py_rate, ready, stream_messages
from mc0.natsproc import NatsCluster
from mc0.process import BrokerProcess

POLICIES = ("always", "batch", "never")
# The JetStream node each mc0 policy is compared with: True = sync_interval: always.
SYNCED_PEER = {"always": True, "batch": True, "never": False}
JS_SYNC = {True: "sync_interval=always", False: "sync_interval=default 2m, ack before sync"}
MC0_SYNC = {"always": "fsync=always", "batch": "fsync=batch, group commit", "never": "fsync=never"}
STREAM = "NATS_PY_FILE_BENCH"


def _in_flight(how: int) -> str:
    return f"{how} in flight"


def names(window: int) -> dict[tuple[str, int], str]:
    """Row names keyed by (``js-sync`` / ``js-default`` / an mc0 policy, publishes in flight)."""
    rows: dict[tuple[str, int], str] = {}
    for how in (1, window):
        rows[("js-sync", how)] = f"JetStream R1 file, nats-py, {_in_flight(how)} ({JS_SYNC[True]})"
        for policy in POLICIES:
            if SYNCED_PEER[policy]:
                rows[(policy, how)] = f"mc0 file journal, broker, {_in_flight(how)} ({MC0_SYNC[policy]})"
        rows[("js-default", how)] = f"JetStream R1 file, nats-py, {_in_flight(how)} ({JS_SYNC[False]})"
        rows[("never", how)] = f"mc0 file journal, broker, {_in_flight(how)} ({MC0_SYNC['never']})"
    return rows


def groups(window: int) -> list[tuple[str, list[str]]]:
    """(baseline row, the mc0 rows compared with it), in table order."""
    rows = names(window)
    return [
        group
        for how in (1, window)
        for group in (
            (rows[("js-sync", how)], [rows[(p, how)] for p in POLICIES if SYNCED_PEER[p]]),
            (rows[("js-default", how)], [rows[(p, how)] for p in POLICIES if not SYNCED_PEER[p]]),
        )
    ]


def _broker_config(root: Path) -> Path:
    """One broker, a file journal per policy (``bench.<policy>.>``), each in its own folder."""
    text = "[broker]\nmin_ttl_ms = 50\n"
    for policy in POLICIES:
        text += (
            f'[journals.{policy}]\ntopics = ["bench.{policy}.>"]\nfsync = "{policy}"\n'
            f'folder = "{root / "journals" / policy}"\nmax_bytes = 0\n'
        )
    path = root / "mc0.toml"
    path.write_text(text)
    return path


async def _journal_next_seq(endpoint: str, journal: str) -> int:
    """The journal's next seq, once it reports the fsync policy it is named after (the broker runs it)."""
    from mc0.aio import Client

    async with Client(endpoint, timeout=10) as client:
        info = (await client.journal_info())[journal]
    if info["fsync"] != journal:
        raise RuntimeError(f"journal {journal} runs fsync={info['fsync']}")
    return int(info["next_seq"])


def _check_sync(node: NatsCluster, synced: bool) -> None:
    """The node runs the sync setting its rows are named after (``/varz``: sync_always)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_ports[0]}/varz", timeout=10) as answer:
        config = json.loads(answer.read())["jetstream"]["config"]
    if bool(config.get("sync_always")) != synced:
        raise RuntimeError(f"nats-server runs sync_always={config.get('sync_always')}, expected {synced}")


def file_vs_jetstream_rates(
    count: int, size: int, window: int, runs: int, say: Any
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Rates per row (``names``) and, per row, how many acknowledged publishes the store lacks (or has extra)."""
    from mc0.broker.jetstream.streams import StreamSpec

    rows = names(window)
    rates: dict[str, list[float]] = {name: [] for name in rows.values()}
    failed: dict[str, int] = {name: 0 for name in rows.values()}
    single = max(1, count // 10)  # one at a time is ~10x slower: fewer of them
    order = ("js-sync", "always", "batch", "js-default", "never")  # each baseline before the rows it is beside
    with tempfile.TemporaryDirectory(prefix="mc0-bench-file-js-") as tmp:
        root = Path(tmp)
        nodes = {
            "js-sync": NatsCluster(root / "nats-sync", 1, sync_always=True),
            "js-default": NatsCluster(root / "nats-default", 1, sync_always=False),
        }
        config = StreamSpec("nats_py_file_bench", 1, 0, 0, 0, 120).config()  # a journal's stream config, R1
        config.update(name=STREAM, subjects=["mc0.natspy.file.>"])  # (the NATS user: mc0.>)
        try:
            for node in nodes.values():
                node.start()
            for key, node in nodes.items():
                node.wait_ready(60)
                _check_sync(node, key == "js-sync")
                asyncio.run(create_stream(node.urls(), config))
            with BrokerProcess(config=str(_broker_config(root)), insecure=True) as broker:
                asyncio.run(ready(broker.endpoint))
                for run in range(runs):
                    for how in (1, window):
                        n = single if how == 1 else count
                        for key in order:
                            name = rows[(key, how)]
                            if key in nodes:
                                urls = nodes[key].urls()
                                before = asyncio.run(stream_messages(urls, STREAM))
                                rate = asyncio.run(nats_py_rate(urls, config, n, size, how))
                                stored = asyncio.run(stream_messages(urls, STREAM)) - before
                            else:
                                before = asyncio.run(_journal_next_seq(broker.endpoint, key))
                                rate = asyncio.run(mc0_rate(broker.endpoint, n, size, how, f"bench.{key}.put"))
                                stored = asyncio.run(_journal_next_seq(broker.endpoint, key)) - before
                            rates[name].append(rate)
                            failed[name] += abs(n - stored)
                            say(f"run {run + 1}: {name}: {rate:,.0f} msg/s ({stored} of {n} stored)")
        finally:
            for node in nodes.values():
                node.stop()
    return rates, failed
