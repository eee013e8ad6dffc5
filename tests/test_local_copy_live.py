"""A JetStream journal's local copy (mc0/broker/jetstream/replicated.py, feed.py) against the stream it copies,
on real nats-server nodes and broker processes: a purge the copy was not told of, a copy rebuilt from the
stream, a replaying subscriber failing over to a broker whose copy is behind.  (The same rules in the core,
without NATS: tests/test_replicated.py and tests/test_feed.py.)"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import mc0
from mc0.natsproc import NatsCluster

from .clusterbus import ClusterBus, nats_cluster
from .test_jetstream_live import confirmed, journal, js, received, until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    yield from nats_cluster(tmp_path_factory.mktemp("nats"))


def drain(subscription: mc0.Subscription, within: float) -> list[mc0.Message]:
    """Whatever ``subscription`` receives for ``within`` seconds."""
    got: list[mc0.Message] = []
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            got += subscription.next_batch(1000, timeout=0.2)
        except mc0.Timeout:
            pass
    return got


def replayed_and_fetched(client: mc0.Client, name: str, topics: str, from_seq: int) -> tuple[list[bytes], list[bytes]]:
    """What a SUB FROM and a fetch from ``from_seq`` get ([] each when refused 410: trimmed)."""
    try:
        replay = client.subscribe(topics, from_seq=from_seq, journal=name)
        replayed = [m.body for m in drain(replay, 1.0)]
    except mc0.Gone:
        replayed = []
    try:
        fetched = [r.body for r in client.fetch(name, from_seq=from_seq, timeout=10).records]
    except mc0.Gone:
        fetched = []
    return replayed, fetched


# ---------------------------------------------------------------- purges the copy was not told of
def test_a_broker_down_during_a_purge_serves_none_of_the_purged_records_when_it_is_back(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """journal.purge is carried to the brokers that are up; b2 was down and kept its copy on disk.  Back,
    its feed learns the stream's new first seq: the copy follows it, and neither a SUB FROM nor a fetch
    there serves what the operator purged."""
    extra = journal("purged", '["orders.>"]') + '[permissions.identity.anonymous]\ncall = ["mc0.admin", ">"]\n'
    with ClusterBus(tmp_path, nats, 2, extra=extra) as bus:
        bus.wait_joined()
        with bus.client(0) as writer, bus.client(1) as reader:
            seqs = [confirmed(writer, "orders.eu", f"secret {i}".encode()).seq for i in range(5)]
            until(lambda: reader.journal_info()["purged"]["copy_next_seq"] > seqs[-1], 15, "b2's copy")
        bus.brokers[1].stop()  # type: ignore[union-attr]
        bus.brokers[1] = None
        until(lambda: "b2" not in bus.cluster_report(0)["brokers"], 10, "b1 forgets b2")
        with bus.client(0) as root:
            done = json.loads(root.request("mc0.admin", b'{"op": "journal.purge", "journal": "purged"}').body)
        first = done["jetstream"]["first_seq"]
        assert first == seqs[-1] + 1 and set(done["brokers"]) == {"b1"}
        bus.start(1)
        with bus.client(1) as reader:
            until(lambda: reader.journal_info()["purged"]["first_seq"] == first, 15, "b2 learns the new first seq")
            assert replayed_and_fetched(reader, "purged", "orders.>", seqs[0]) == ([], [])
            assert [r.seq for r in reader.fetch("purged", from_seq=0, timeout=10).records] == []


def test_a_purge_made_outside_mc0_is_followed_by_every_local_copy(tmp_path: Path, nats: NatsCluster) -> None:
    """The stream purged with NATS's own API (or by a broker killed between JetStream's purge and carrying it
    to the others: the same for them): no broker is told, and every copy follows it within its feed's look
    at the stream."""
    extra = journal("opurge", '["orders.>"]')
    with ClusterBus(tmp_path, nats, 2, extra=extra) as bus:
        bus.wait_joined()
        with bus.client(0) as writer, bus.client(1) as reader:
            seqs = [confirmed(writer, "orders.eu", f"secret {i}".encode()).seq for i in range(5)]
            until(lambda: reader.journal_info()["opurge"]["copy_next_seq"] > seqs[-1], 15, "b2's copy")
            purged = js(nats, "STREAM.PURGE.MC0_J_opurge", {})
            assert purged.get("success") is True and purged.get("purged") == 5
            after = confirmed(writer, "orders.eu", b"after")
            for client in (writer, reader):
                until(lambda c=client: c.journal_info()["opurge"]["first_seq"] == after.seq, 20, "the copy follows")
                assert replayed_and_fetched(client, "opurge", "orders.>", seqs[0]) == ([], [])
                until(lambda c=client: c.journal_info()["opurge"]["copy_next_seq"] > after.seq, 15, "the copy")
                assert [r.body for r in client.fetch("opurge", from_seq=0, timeout=10).records] == [b"after"]


# ---------------------------------------------------------------- a local copy made again
def test_a_copy_rebuilt_from_scratch_hands_neither_live_subscribers_nor_queue_groups_the_streams_history(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """ "Losing the copy loses nothing: it is rebuilt from the stream" (a new broker, a container without a
    volume).  b1's data folder is lost: while its copy is made again, a plain SUB made at b1 after it
    started gets none of the stream's old records, and the queue group whose work was published through b1
    (b1 hands a record published through it to its groups) is not handed that work again."""
    extra = journal("hist", '["hist.>", "jobs.>"]')
    with ClusterBus(tmp_path, nats, 2, extra=extra) as bus:
        bus.wait_joined()
        with bus.client(1) as member_client:
            member = member_client.subscribe("jobs.>", group="workers")
            until(lambda: bus.interest(0, "jobs.x", "workers") >= 1, 10, "the group's member known at b1")
            with bus.client(0) as writer:
                for i in range(20):
                    confirmed(writer, "jobs.x", f"job {i}".encode())
                for i in range(3000):  # (history enough for the copy to take a moment)
                    writer.publish("hist.x", f"old bulk {i}".encode() * 20)
                last = confirmed(writer, "hist.x", b"old last").seq
            assert sorted(body for _, body in received(member, 20)) == sorted(f"job {i}".encode() for i in range(20))
            bus.brokers[0].stop()  # type: ignore[union-attr]
            bus.brokers[0] = None
            shutil.rmtree(tmp_path / "b1")  # its data folder lost: the copy is made again from the stream
            bus.start(0)
            with bus.client(0) as reader:
                live = reader.subscribe("hist.>")
                until(lambda: reader.journal_info()["hist"]["copy_next_seq"] == last + 1, 30, "b1's copy rebuilt")
                got = [m.body for m in drain(live, 1.0)]
                again = [m.body for m in drain(member, 0.5)]
                assert got == [] and again == [], f"{len(got)} old records live, {len(again)} jobs handed again"
                with bus.client(1) as writer:
                    new = confirmed(writer, "hist.x", b"new").seq
                assert received(live, 1) == [(new, b"new")]  # (live from the end on)


# ---------------------------------------------------------------- a replaying subscriber failing over
def test_a_replaying_subscriber_that_fails_over_to_a_broker_whose_copy_is_behind_gets_nothing_twice(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """A SUB FROM subscriber (endpoints b1,b2) took seqs 1..N at b1.  b2's copy is behind (its one NATS node
    frozen while the records came: the stream kept its quorum), b1 is killed, and the client asks b2 FROM
    N+1.  b2 knows the stream only as far as its copy: its replay ends at once, and the records its feed
    brings when its node thaws are not handed to the subscriber again (the floor its FROM left)."""
    extra = journal("resume", '["resume.>"]')
    with ClusterBus(tmp_path, nats, 2, extra=extra, nodes_of=((0,), (1,))) as bus:
        bus.wait_joined()
        with bus.client(0) as writer, mc0.Client(bus.endpoints(0, 1)).connect() as reader:
            first = confirmed(writer, "resume.x", b"warm").seq
            sub = reader.subscribe("resume.>", from_seq=first, journal="resume")
            seen = [seq for seq, _ in received(sub, 1)]
            nats.pause(1)
            try:
                confirmed(writer, "resume.x", b"the stream has a leader without node 2")
                for i in range(100):
                    writer.publish("resume.x", f"r{i}".encode())
                last = confirmed(writer, "resume.x", b"last").seq
                seen += [seq for seq, _ in received(sub, last - first, 30)]
                bus.kill(0)
                until(lambda: reader.connected and reader.endpoint == bus.endpoint(1), 10, "failed over to b2")
                with bus.client(1) as look:  # (b2's own answers: its loop runs, its NATS node is frozen)
                    counters = lambda: json.loads(look.request("mc0.broker", b"stats").body)["counters"]  # noqa: E731
                    until(lambda: counters().get("replays", 0) >= 1, 10, "the SUB FROM taken at b2")
            finally:
                nats.resume(1)
            with bus.client(1) as look:
                until(lambda: look.journal_info()["resume"]["copy_next_seq"] > last, 30, "b2's copy caught up")
                after = [m.seq for m in drain(sub, 0.5)]
                more = confirmed(look, "resume.x", b"after the failover").seq
            after += [seq for seq, _ in received(sub, 1)]
        assert seen == list(range(first, last + 1))
        assert after == [more], f"after the failover: {len(after)} messages, seqs {after[:3]}..{after[-3:]}"
