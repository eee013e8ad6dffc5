"""The operator's actions in a cluster of real nats-server nodes and mc0 broker processes (CURVE,
real keys): each action given at one broker acts where the thing lives.  A JetStream journal's
consumer removed and its stream purged once, every broker's view and local copy following; a file
journal's consumer and records at every broker that keeps one; a session closed at the broker it
is on, asked at another."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0.natsproc import NatsCluster
from mc0.protocol.peernames import parse_peer_name

from .clusterbus import ClusterBus, nats_cluster, until
from .test_jetstream_live import confirmed, journal

pytestmark = pytest.mark.timeout(180)

POLICY = """
[journals.local]
topics = ["local.>"]

[permissions.identity.root]
call = ["mc0.admin", ">"]

[permissions.identity.alice]
call = [">"]
"""


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    yield from nats_cluster(tmp_path_factory.mktemp("nats"))


def admin(client: mc0.Client, op: str, **args: str) -> Any:
    return json.loads(client.request("mc0.admin", json.dumps({"op": op, **args}).encode(), timeout=15).body)


def test_consumer_rm_and_journal_purge_take_effect_at_every_broker(tmp_path: Path, nats: NatsCluster) -> None:
    extra = journal("orders", '["orders.>"]') + POLICY
    with ClusterBus(tmp_path, nats, curve=True, identities=("root", "alice", "bob"), extra=extra) as bus:
        bus.wait_joined()
        clients = [bus.client(i, "bob") for i in range(3)]
        try:
            root, alice = bus.client(2, "root"), bus.client(2, "alice")
            clients += [root, alice]
            seqs = [confirmed(clients[0], "orders.eu", str(i).encode()).seq for i in range(6)]
            for i, client in enumerate(clients[:3]):  # a file journal at every broker, with a consumer of its own
                for n in range(2):
                    client.publish("local.x", f"{i}-{n}".encode(), confirm=True)
                client.consume("local", "tally", topics=["local.>"])
            made = clients[0].consume("orders", "invoicing", topics=["orders.>"])
            at_b2 = clients[1].consume("orders", "invoicing", topics=["orders.>"])
            assert [m.seq for m in at_b2.fetch(2, wait=2)] == seqs[:2]
            # Listed at b3: JetStream's consumer once, each broker's file consumer where it lives.
            rows = admin(root, "consumer.ls")["consumers"]
            where = sorted((r["journal"], r["name"], r["store"], r["broker"]) for r in rows)
            assert where == [
                ("local", "tally", "file", "b1"),
                ("local", "tally", "file", "b2"),
                ("local", "tally", "file", "b3"),
                ("orders", "invoicing", "jetstream", ""),
            ]
            (store_row,) = [r for r in rows if r["store"] == "jetstream"]
            assert (store_row["owner"], store_row["num_ack_pending"], store_row["num_pending"]) == ("bob", 2, 4)
            with pytest.raises(mc0.Forbidden):
                admin(alice, "consumer.rm", journal="orders", name="invoicing")
            # JetStream's consumer, removed at b3: gone at every broker.
            done = admin(root, "consumer.rm", journal="orders", name="invoicing")
            assert done["jetstream"] == {"status": 200, "removed": True}
            assert set(done["brokers"]) == {"b1", "b2", "b3"}
            assert all(part["status"] == 200 for part in done["brokers"].values())
            for consumer in (made, at_b2):
                with pytest.raises(mc0.NotFound):
                    consumer.info()
            # A file journal's consumers: removed at every broker that keeps one.
            done = admin(root, "consumer.rm", journal="local", name="tally")
            assert {n: p["status"] for n, p in done["brokers"].items()} == {"b1": 200, "b2": 200, "b3": 200}
            assert admin(root, "consumer.ls")["consumers"] == []
            # JetStream's stream purged at b2 (asked at b3): every broker's local copy follows.
            done = admin(root, "journal.purge", journal="orders")
            first = done["jetstream"]["first_seq"]
            assert done["purged"] == 6 and first == seqs[-1] + 1
            assert {n: p["first_seq"] for n, p in done["brokers"].items()} == {"b1": first, "b2": first, "b3": first}
            for client in clients[:3]:
                info = client.journal_info()["orders"]
                assert (info["first_seq"], info["records"]) == (first, 0)
                with pytest.raises(mc0.Gone):
                    client.fetch("orders", from_seq=seqs[0])
            after = confirmed(clients[1], "orders.eu", b"after")
            assert after.seq == first
            for client in clients[:3]:
                until(lambda c=client: [r.body for r in c.fetch("orders", from_seq=first).records] == [b"after"])
            # A file journal purged at every broker that keeps one (each its own records).
            done = admin(root, "journal.purge", journal="local")
            assert {n: p["purged"] for n, p in done["brokers"].items()} == {"b1": 2, "b2": 2, "b3": 2}
            assert done["purged"] == 6
            for client in clients[:3]:
                assert client.journal_info()["local"]["records"] == 0
            with pytest.raises(mc0.NotFound, match="no journal 'nope'"):
                admin(root, "journal.purge", journal="nope")
        finally:
            for client in clients:
                client.close()


def test_conn_close_asked_at_one_broker_ends_the_session_at_another(tmp_path: Path, nats: NatsCluster) -> None:
    with ClusterBus(tmp_path, nats, 2, curve=True, identities=("root", "alice", "bob"), extra=POLICY) as bus:
        bus.wait_joined()
        with bus.client(1, "bob") as first, bus.client(1, "bob") as second, bus.client(0, "root") as root:
            with bus.client(1, "root") as there:
                rows = json.loads(there.request("mc0.broker", b"peers").body)
            names = sorted((r["name"] for r in rows if r["identity"] == "bob"), key=lambda n: serial_of(n))
            assert len(names) == 2
            local = names[0].partition("@")[0]
            victim = f"{local}@b2"
            assert admin(root, "conn.close", id=victim) == {"closed": names[0], "broker": "b2"}
            until(lambda: any(isinstance(f, mc0.NotConnected) for f in first.faults), what="the session told why")
            (told,) = [f for f in first.faults if isinstance(f, mc0.NotConnected)]
            assert told.reason == f"session {names[0]} closed by root (at broker b1)"
            assert second.faults == []
            second.ping()
            with pytest.raises(mc0.NotFound, match=f"no session '{victim}' at broker b2"):
                admin(root, "conn.close", id=victim)
            with pytest.raises(mc0.NotFound, match="no broker b9 in this cluster"):
                admin(root, "conn.close", id=f"{local}@b9")


def serial_of(name: str) -> int:
    parsed = parse_peer_name(name)
    assert parsed is not None, name
    return parsed.serial
