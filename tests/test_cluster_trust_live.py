"""The cluster's trust boundary on NATS (docs/SECURITY.md): a NATS login without the brokers' credentials that
does request/reply (the tests' ``outsider``: ``_INBOX.>`` and ``other.>``, mc0.natsproc) reads nothing of what
the brokers exchange, JetStream's replies to them included (every reply subject of a broker is under its own
``mc0.cl.reply.NAME``: nats-py's inbox_prefix, mc0.broker.cluster.link.nats_options), and nothing it
publishes where it may changes anything."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0.natsproc import NatsCluster

from .clusterbus import ClusterBus, nats_cluster, until

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    yield from nats_cluster(tmp_path_factory.mktemp("nats"))


def journal(name: str, topics: str = "", **keys: Any) -> str:
    """A ``[journals.NAME]`` table kept by JetStream (R3)."""
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    return f'[journals.{name}]\n{topics}store = "jetstream"\nreplicas = 3\nfsync = "always"\n{extra}'


class Outsider:
    """A NATS client with the outsider's login, on its own thread: it listens wherever it may and, while
    it runs, publishes forgeries on every subject it may (and on every reply subject it saw)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: list[tuple[str, bytes]] = []
        self.errors: list[str] = []
        self.injected = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self.run()), daemon=True)
        self.ready = threading.Event()

    async def run(self) -> None:
        import nats as nats_py

        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))

        nc = await nats_py.connect(self.url, error_cb=on_error, allow_reconnect=False, no_echo=True)

        async def heard(msg: Any) -> None:
            self.seen.append((msg.subject, msg.data))

        for subject in ("_INBOX.>", "other.>", ">", "mc0.>", "$JS.>"):  # (the last three are refused)
            await nc.subscribe(subject, cb=heard)
        await nc.flush()
        self.ready.set()
        forged = json.dumps({"stream": "MC0_J_orders", "seq": 1}).encode()
        for _ in range(10_000):
            if self.stop.is_set():
                break
            subjects = ["_INBOX.x", "_INBOX.x.y", "other.x", *{s for s, _ in self.seen}]
            for subject in subjects:
                await nc.publish(subject, forged)
                self.injected += 1
            await asyncio.sleep(0.02)
        await nc.flush()
        await nc.close()

    def __enter__(self) -> Outsider:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def confirmed(client: mc0.Client, topic: str, body: bytes) -> mc0.Ack:
    for _ in range(100):  # (the stream is new: sent again while it is not there yet)
        try:
            ack = client.publish(topic, body, confirm=True, timeout=10)
            assert ack is not None
            return ack
        except (mc0.DeadlineExceeded, mc0.StorageFailed, mc0.Timeout, mc0.NoResponders):
            time.sleep(0.2)
    raise AssertionError("never stored")


def test_an_outsider_doing_request_reply_reads_nothing_the_brokers_exchange_and_injects_nothing(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """While the brokers journal to JetStream (PubAcks), deliver the stream to their copies, pull from a
    durable consumer and keep and read letters, the outsider listening on _INBOX.> (and trying >, mc0.>,
    $JS.>) hears nothing, and forgeries on every subject it may publish to change nothing."""
    extra = journal("orders", 'topics = ["orders.>"]\n') + journal("box", mailboxes=True)
    identities = ("alice", "bob", "carol", "dave")
    with ClusterBus(tmp_path, nats, curve=True, extra=extra, identities=identities) as bus:
        bus.wait_joined()
        with Outsider(nats.url(0, user="outsider")) as outsider:
            with bus.client(0, "alice") as alice, bus.client(1, "bob") as bob, bus.client(2, "carol") as carol:
                live = bob.subscribe("orders.>")
                acks = [confirmed(alice, "orders.eu", f"order {i}".encode()) for i in range(20)]
                seqs = [a.seq for a in acks]
                assert seqs == list(range(seqs[0], seqs[0] + 20))
                got = []
                for _ in range(50):
                    got += live.next_batch(100, timeout=1)
                    if len(got) >= 20:
                        break
                assert [(m.seq, m.body) for m in got] == [(s, f"order {i}".encode()) for i, s in enumerate(seqs)]
                jobs = carol.consume("orders", "jobs", topics=["orders.>"], ack_wait=5.0)
                pulled = jobs.fetch(100, wait=2)
                for _ in range(10):
                    if len(pulled) >= 20:
                        break
                    pulled += jobs.fetch(100, wait=1)
                assert [(m.seq, m.body) for m in pulled] == [(s, f"order {i}".encode()) for i, s in enumerate(seqs)]
                assert jobs.ack(*pulled) == 20
                outcomes = [alice.send_to("dave", "note", f"letter {i}".encode(), confirm=True) for i in range(5)]
                assert set(outcomes) == {"stored"}
            with bus.client(2, "dave") as dave:
                letters = []
                for _ in range(20):
                    letters += dave.mailbox.next_batch(10, timeout=1)
                    if len(letters) >= 5:
                        break
                assert [m.body for m in letters] == [f"letter {i}".encode() for i in range(5)]
            until(lambda: outsider.injected > 200, 20, "the outsider's forgeries")
        kinds = {
            "PubAcks": sum(b'"seq"' in d and b'"stream"' in d and b"type" not in d for _, d in outsider.seen),
            "records": sum(b"order " in d or b"letter " in d for _, d in outsider.seen),
            "API answers": sum(b"io.nats.jetstream.api" in d for _, d in outsider.seen),
        }
        print(f"the outsider heard {len(outsider.seen)} messages: {kinds}")
        assert outsider.seen == []  # nothing the brokers exchanged, JetStream's replies included
        assert sum("permissions violation" in e.lower() for e in outsider.errors) >= 3  # >, mc0.>, $JS.> refused
        with bus.client(1, "bob") as bob:  # and nothing changed: the journal holds what alice stored, once
            info = bob.journal_info()["orders"]
            assert info["records"] == 20 and info["next_seq"] == seqs[-1] + 1, info
