"""Journals, durable consumers and mailboxes on JetStream (``store = "jetstream"``, R3), with real
nats-server nodes and mc0 broker processes: what one broker acknowledges every broker serves, at the
same seqs; a consumer made at one broker is pulled and acked at another; a letter kept at one is
delivered at another.  The faults of issue 22 are in tests/test_jetstream_faults.py."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0.natsproc import NatsCluster
from mc0.protocol.routes import REPLY_PREFIX  # (the brokers' NATS user has no _INBOX.>: its replies are there)

from .clusterbus import ClusterBus, nats_cluster
from .clusterbus import until as poll_until

pytestmark = pytest.mark.timeout(120)


def journal(name: str, topics: str = '[">"]', **keys: Any) -> str:
    """A ``[journals.NAME]`` table kept by JetStream (R3, fsync as the NATS nodes: every write synced)."""
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    return f'[journals.{name}]\ntopics = {topics}\nstore = "jetstream"\nreplicas = 3\nfsync = "always"\n{extra}'


def confirmed(
    client: mc0.Client, topic: str, body: bytes, *, msgid: str | None = None, within: float = 30.0
) -> mc0.Ack:
    """A confirmed publish, sent again (same MSGID) while the stream is not there yet (504/507/503)."""
    deadline = time.monotonic() + within
    for _ in range(1000):
        try:
            ack = client.publish(topic, body, confirm=True, msgid=msgid, timeout=10)
            assert ack is not None
            return ack
        except (mc0.DeadlineExceeded, mc0.StorageFailed, mc0.Timeout, mc0.NoResponders):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


def fetch_all(client: mc0.Client, name: str, *, from_seq: int = 1) -> list[mc0.Record]:
    records: list[mc0.Record] = []
    seq = from_seq
    for _ in range(1000):
        page = client.fetch(name, from_seq=seq, timeout=10)
        records += page.records
        if page.next_seq >= page.end_seq or not page.records:
            return records
        seq = page.next_seq
    raise AssertionError("fetch did not end")


def received(subscription: mc0.Subscription, count: int, within: float = 15.0) -> list[tuple[int, bytes]]:
    """(seq, body) of the first ``count`` messages of ``subscription`` (fewer if they do not come in time)."""
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + within
    while len(got) < count and time.monotonic() < deadline:
        try:
            got += [(m.seq, m.body) for m in subscription.next_batch(count - len(got), timeout=0.2)]
        except mc0.Timeout:
            pass
    return got


def until(condition: Any, timeout: float = 15.0, what: str = "condition") -> float:
    return poll_until(condition, timeout, what)  # (the JetStream tests wait longer by default)


async def stored(nc: Any, subject: str, payload: bytes) -> dict[str, Any]:
    """Publish into a stream just made and wait for its PubAck.  Right after STREAM.CREATE the stream's
    subjects may not have reached, over the NATS routes, the server this client talks to: no
    responders (nothing stored), so try again, bounded (the broker's own proposals do too).  Never
    again after a timeout: that one may have been stored."""
    import asyncio

    from nats.errors import NoRespondersError

    for _ in range(200):
        try:
            return dict(json.loads((await nc.request(subject, payload, timeout=5)).data))
        except NoRespondersError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"no stream stored {subject} within the bound")


def js(nats: NatsCluster, subject: str, request: dict[str, Any] | None = None) -> dict[str, Any]:
    """One JetStream API request with the brokers' login, as an operator's `nats` CLI would make it."""

    import asyncio

    async def ask() -> dict[str, Any]:
        from nats.aio.client import Client as Nats

        nc = Nats()
        await nc.connect(servers=nats.urls(), connect_timeout=5, inbox_prefix="mc0.cl.reply.operator")
        try:
            payload = json.dumps(request).encode() if request is not None else b""
            return dict(json.loads((await nc.request(f"$JS.API.{subject}", payload, timeout=5)).data))
        finally:
            await nc.close()

    return asyncio.run(ask())


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    yield from nats_cluster(tmp_path_factory.mktemp("nats"))


def test_what_one_broker_acknowledges_every_broker_serves_at_the_same_seqs_once(
    tmp_path: Path, nats: NatsCluster
) -> None:
    with ClusterBus(tmp_path, nats, extra=journal("orders", '["orders.>"]')) as bus:
        bus.wait_joined()
        with contextlib.ExitStack() as stack:
            pub, second, third = (stack.enter_context(bus.client(i, echo=i > 0)) for i in range(3))
            # Live subscribers on every broker but the publisher's own (ECHO 0 holds for JetStream journals too).
            own = pub.subscribe("orders.>")
            live = [second.subscribe("orders.>"), third.subscribe("orders.*")]
            first = confirmed(pub, "orders.eu", b"first", msgid="o-1")
            assert (first.journal, first.duplicate) == ("orders", False)
            acks = [pub.publish("orders.eu", str(i).encode(), confirm=True, msgid=f"o{i}") for i in range(200)]
            seqs = [a.seq for a in acks if a is not None]
            assert seqs == list(range(first.seq + 1, first.seq + 201))  # the stream's own numbers
            again = pub.publish("orders.eu", b"first", confirm=True, msgid="o-1")  # a repeat: stored once
            assert again is not None and (again.seq, again.duplicate) == (first.seq, True)
            for sub in live:
                got = sub.next_batch(1000, timeout=10)
                for _ in range(50):
                    if len(got) >= 201:
                        break
                    got += sub.next_batch(1000, timeout=2)
                expected = [(first.seq, b"first"), *((s, str(i).encode()) for i, s in enumerate(seqs))]
                assert [(m.seq, m.body) for m in got] == expected
                assert {m.journal for m in got} == {"orders"}
            with pytest.raises(mc0.Timeout):
                own.next_batch(1, timeout=0.3)
            # Replays and fetches at any broker: the same records at the same seqs.
            replays = {}
            for i in range(3):
                client = stack.enter_context(bus.client(i))
                replay = client.subscribe("orders.>", from_seq=first.seq, journal="orders")
                got = []
                for _ in range(50):
                    got += replay.next_batch(1000, timeout=2)
                    if len(got) >= 201:
                        break
                replays[i] = [(m.seq, m.body) for m in got]
                fetched = fetch_all(client, "orders", from_seq=first.seq)
                assert [(r.seq, r.body) for r in fetched] == replays[i]
                assert fetched[0].headers.get("MSGID") == "o-1" and fetched[0].sender == "anonymous"
            assert len(set(map(tuple, replays.values()))) == 1 and len(replays[0]) == 201
            info = second.journal_info()["orders"]
            assert (info["store"], info["replicas"], info["next_seq"]) == ("jetstream", 3, first.seq + 201)


def test_a_consumer_made_at_one_broker_is_pulled_and_acked_at_another_under_its_owners_rules(
    tmp_path: Path, nats: NatsCluster
) -> None:
    policy = (
        '[permissions.identity.alice]\npublish = [">"]\nsubscribe = [">"]\ncall = [">"]\n'
        '[permissions.identity.alice.deny]\nsubscribe = ["work.secret.>"]\n'
        '[permissions.identity.bob]\npublish = [">"]\nsubscribe = [">"]\ncall = [">"]\n'
    )
    extra = journal("work", '["work.>", "mc0.sys.dead.>"]') + policy
    with ClusterBus(tmp_path, nats, curve=True, extra=extra, broker="max_consumers_per_identity = 1\n") as bus:
        bus.wait_joined()
        with bus.client(0, "bob") as publisher, bus.client(0, "alice") as at_a, bus.client(1, "alice") as at_b:
            topics = ["work.a", "work.secret.x", "work.a", "work.a", "work.a"]
            seqs = [confirmed(publisher, t, f"{i}".encode()).seq for i, t in enumerate(topics)]
            made = at_a.consume("work", "jobs", topics=["work.>"], ack_wait=1.0, max_deliver=2)
            assert made.info()["store"] == "jetstream"
            same = at_b.consume("work", "jobs", topics=["work.>"], ack_wait=1.0, max_deliver=2)  # it exists: found
            got = same.fetch(10, wait=2)
            # The deny list: the secret record is never handed to alice (terminated unsent).
            assert [(m.seq, m.deliveries) for m in got] == [(seqs[i], 1) for i in (0, 2, 3, 4)]
            assert same.ack(got[0]) == 1  # acked at b ...
            assert made.nak(got[1].seq) == 1  # ... naked and terminated at a
            assert made.term(got[2].seq) == 1
            again = made.fetch(10, wait=2)
            assert [(m.seq, m.deliveries) for m in again] == [(seqs[2], 2)]  # the nak: redelivered at once
            dead = at_a.subscribe("mc0.sys.dead.>")
            late = []
            for _ in range(20):  # ack_wait passes: what was not settled comes again, until max_deliver
                late += [(m.seq, m.deliveries) for m in same.fetch(10, wait=1.5)]
                if (seqs[4], 2) in late:
                    break
            assert (seqs[4], 2) in late and all(seq not in (seqs[0], seqs[3]) for seq, _ in late)
            letters = []
            for _ in range(20):  # a third delivery is past max_deliver 2: a dead letter, not a delivery
                assert all(d <= 2 for _, d in [(m.seq, m.deliveries) for m in made.fetch(10, wait=1.5)])
                try:
                    letters += dead.next_batch(10, timeout=0.2)
                except mc0.Timeout:
                    pass
                if {m.headers.get("X-Dead-Seq") for m in letters} >= {str(seqs[2]), str(seqs[4])}:
                    break
            assert {m.headers.get("X-Dead-Seq") for m in letters} >= {str(seqs[2]), str(seqs[4])}
            assert {m.topic for m in letters} == {"mc0.sys.dead.work.jobs"}
            info = same.info()
            assert (info["owner"], info["pending"], info["lag"]) == ("alice", 0, 0)
            # The owner's: bob may not use it; and alice's quota counts cluster-wide (one per identity).
            with bus.client(2, "bob") as bob:
                with pytest.raises(mc0.Forbidden):
                    bob.consume("work", "jobs", topics=["work.>"], ack_wait=1.0, max_deliver=2).fetch(1, wait=0)
            with bus.client(2, "alice") as at_c, pytest.raises(mc0.OverLimit):
                at_c.consume("work", "more", topics=["work.>"])
            made.delete()
            with pytest.raises(mc0.NotFound):
                same.info()


def test_letters_kept_in_jetstream_at_one_broker_are_delivered_at_another_in_order_and_once(
    tmp_path: Path, nats: NatsCluster
) -> None:
    with ClusterBus(
        tmp_path, nats, curve=True, extra=journal("box", mailboxes=True).replace('topics = [">"]\n', "")
    ) as bus:
        bus.wait_joined()
        with bus.client(0, "alice") as alice:
            outcomes = [alice.send_to("carol", "note.x", f"letter {i}".encode(), confirm=True) for i in range(20)]
        # A letter sent again after a failover, with its MSGID, at another broker: the stream takes it once.
        with bus.client(0, "alice") as alice, bus.client(1, "alice") as alice_elsewhere:
            outcomes.append(alice.send_to("carol", "note.x", b"once", confirm=True, msgid="note-once"))
            outcomes.append(alice_elsewhere.send_to("carol", "note.x", b"once", confirm=True, msgid="note-once"))
        assert set(outcomes) == {"stored"}
        with bus.client(2, "carol") as carol:
            got = []
            for _ in range(50):
                got += carol.mailbox.next_batch(100, timeout=2)
                if len(got) >= 21:
                    break
            assert [m.body for m in got] == [f"letter {i}".encode() for i in range(20)] + [b"once"]
            assert {(m.sender, m.topic) for m in got} == {("alice", "note.x")}
            until(lambda: not bus.cluster_report(2).get("pending"), 5, "delivered")  # (queues emptied)
            time.sleep(0.3)
        with bus.client(1, "carol") as carol_again:
            with pytest.raises(mc0.Timeout):  # delivered once: they left the stream
                carol_again.mailbox.next_batch(1, timeout=1.5)


def test_letters_kept_in_jetstream_reach_an_identity_with_sessions_at_two_brokers_once(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """carol has no session when alice keeps 10 letters for her; then she connects at b2 and at b3 (two
    devices).  Each broker read her mailbox at her first session there and handed every letter to its own
    session: 20 letters for 10.  One broker reads them (the one where she was first); each comes once."""
    box = journal("twobox", mailboxes=True).replace('topics = [">"]\n', "")
    with ClusterBus(tmp_path, nats, curve=True, extra=box) as bus:
        bus.wait_joined()
        with bus.client(0, "alice") as alice:
            outcomes = [alice.send_to("carol", "note.x", f"letter {i}".encode(), confirm=True) for i in range(10)]
        assert set(outcomes) == {"stored"}
        with bus.client(1, "carol") as first, bus.client(2, "carol") as second:
            got: list[bytes] = []
            quiet_since = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until 3 s after the 10th letter (past the second read)
                for session in (first, second):
                    with contextlib.suppress(mc0.Timeout):
                        got += [m.body for m in session.mailbox.next_batch(100, timeout=0.25)]
                if len(got) < 10:
                    continue
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 3:
                    break
        assert sorted(got) == sorted(f"letter {i}".encode() for i in range(10)), f"{len(got)} letters for 10"


def test_a_file_journal_copied_into_jetstream_keeps_its_seqs_and_every_broker_serves_it(
    tmp_path: Path, nats: NatsCluster
) -> None:
    import subprocess
    import sys

    from mc0.broker.storage.filestore import Journal
    from mc0.settings import JournalSettings

    folder = tmp_path / "old"
    old = Journal("old", JournalSettings(folder=str(folder))).open()
    old.reset(101)  # retention had trimmed it: it begins at 101
    for i in range(300):
        old.append(f"audit.{i % 3}", "alice", {"MSGID": f"a{i}", "X-n": str(i)}, [f"record {i}".encode(), b"part"])
    old.commit()
    originals = old.read(101, max_records=1000)[0]
    old.close()
    config = tmp_path / "copy.toml"
    config.write_text(f"[cluster]\nnats = {json.dumps(nats.urls())}\n" + journal("moved", '["audit.>"]'))

    def copy(*more: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "mc0", "journal", "copy", *more]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    done = copy("moved", "--from", str(folder), "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"copied 300 records (seq 101..400) of {folder} into stream MC0_J_moved"
    again = copy("moved", "--from", str(folder), "--config", str(config))  # run again: nothing twice
    assert again.stdout.strip() == f"nothing to copy: stream MC0_J_moved already holds the 300 records of {folder}"
    wrong = copy("nope", "--from", str(folder), "--config", str(config))
    assert wrong.returncode == 1 and wrong.stderr.startswith("mc0: error: journals.nope: no such journal")
    with ClusterBus(tmp_path, nats, 2, extra=journal("moved", '["audit.>"]')) as bus:
        bus.wait_joined()
        for i in range(2):
            with bus.client(i) as client:
                until(lambda c=client: c.journal_info()["moved"]["copy_next_seq"] == 401, 15, "the copy")
                got = fetch_all(client, "moved", from_seq=0)
                assert [(r.seq, r.topic, r.sender, r.headers, r.parts) for r in got] == [
                    (r.seq, r.topic, r.sender, r.headers, r.parts) for r in originals
                ]
        with bus.client(0) as client:  # and it goes on from there
            assert confirmed(client, "audit.0", b"new", msgid="a0").duplicate is False  # (the copy's ids are its own)
            assert confirmed(client, "audit.0", b"newer").seq == 402


def test_a_settle_of_many_seqs_runs_with_a_bounded_pool_and_asks_nothing_of_seqs_that_cannot_be_pending(
    nats: NatsCluster,
) -> None:
    """StoreOps on the link's nats-py connection: an ack of 300 pulled seqs runs at most SETTLE_WORKERS
    acks (tasks) at once, every settle together at most ``max_requests``; seqs past the last delivered
    are ignored without a request (each would wait a second for nothing)."""
    import asyncio

    from nats.aio.client import Client as Nats

    from mc0.broker.jetstream import storeops
    from mc0.broker.jetstream.streams import StreamSpec, api

    async def run() -> None:
        nc = Nats()
        await nc.connect(servers=nats.urls(), connect_timeout=5, inbox_prefix=REPLY_PREFIX)
        try:
            spec = StreamSpec("settle", 1, 0.0, 0, 0, 60.0)
            await api(nc, "STREAM.CREATE.MC0_J_settle", spec.config(), timeout=10)
            await stored(nc, "mc0.j.settle.orders.0", b"x")  # (the stream takes its subjects from here on)
            for i in range(1, 600):
                await nc.publish(f"mc0.j.settle.orders.{i}", b"x")
            await nc.flush()
            for _ in range(500):  # (bounded: until the stream holds all 600)
                if (await api(nc, "STREAM.INFO.MC0_J_settle"))["state"]["messages"] == 600:
                    break
                await asyncio.sleep(0.02)
            assert (await api(nc, "STREAM.INFO.MC0_J_settle"))["state"]["messages"] == 600
            ops = storeops.StoreOps(nc, {"settle": spec}, max_requests=16)
            config = {"topics": [">"], "ack_wait_ms": 60_000, "max_ack_pending": 10_000, "deliver": "all"}
            for name in ("c1", "c2"):
                made = {"journal": "settle", "name": name, "owner": "alice", "config": config, "replicas": 1}
                await ops.op_consumer_create(made)
            pulled = {}
            for name in ("c1", "c2"):
                data, _ = await ops.op_consumer_pull({"journal": "settle", "name": name, "batch": 300})
                pulled[name] = [seq for seq, _ in data["records"]]
                assert len(pulled[name]) == 300
            in_flight = peak_requests = peak_tasks = 0
            request = nc.request

            async def counted(*args: Any, **kwargs: Any) -> Any:  # the real request, counted
                nonlocal in_flight, peak_requests
                in_flight += 1
                peak_requests = max(peak_requests, in_flight)
                try:
                    return await request(*args, **kwargs)
                finally:
                    in_flight -= 1

            nc.request = counted
            settling = True

            async def watch() -> None:
                nonlocal peak_tasks
                for _ in range(1_000_000):
                    peak_tasks = max(peak_tasks, len(asyncio.all_tasks()))
                    if not settling:
                        return
                    await asyncio.sleep(0)

            watcher = asyncio.get_running_loop().create_task(watch())
            settles = [
                ops.op_consumer_settle({"journal": "settle", "name": n, "how": "ack", "seqs": pulled[n]})
                for n in ("c1", "c2")
            ]
            answers = await asyncio.wait_for(asyncio.gather(*settles), 60)
            settling = False
            await watcher
            assert [data for data, _ in answers] == [{"done": 300, "ignored": 0}] * 2
            assert peak_requests <= 16  # every settle together
            assert peak_tasks <= 2 * storeops.SETTLE_WORKERS + 16  # (not one task per seq; nats-py has its own)
            info, _ = await ops.op_consumer_info({"journal": "settle", "name": "c1"})
            assert info["info"]["num_ack_pending"] == 0 and info["info"]["ack_floor"] == pulled["c1"][-1]
            # Another broker's StoreOps (no ack subjects of its own): seqs acked already or never
            # delivered cannot be pending, and are ignored with no request each.
            elsewhere = storeops.StoreOps(nc, {"settle": spec})
            peak_requests = 0
            seqs = [*pulled["c1"][:5], 10_000, 10_001]
            acks = {"journal": "settle", "name": "c1", "how": "ack", "seqs": seqs}
            data, _ = await elsewhere.op_consumer_settle(acks)
            assert data == {"done": 0, "ignored": 7}
            assert peak_requests == 1  # only the consumer's info was asked
        finally:
            await nc.close()

    asyncio.run(run())


def test_a_mailbox_read_after_a_seq_gets_only_the_letters_past_it_in_order(nats: NatsCluster) -> None:
    """``letters_read`` with ``after`` (a second read of a session still draining): a direct get
    from past that seq, so the letters already handed are not read again."""
    import asyncio

    from nats.aio.client import Client as Nats

    from mc0.broker.jetstream import storeops
    from mc0.broker.jetstream.streams import StreamSpec, api
    from mc0.protocol import jetstream as jsw

    async def run() -> None:
        nc = Nats()
        await nc.connect(servers=nats.urls(), connect_timeout=5, inbox_prefix=REPLY_PREFIX)
        try:
            spec = StreamSpec("letters", 1, 3600.0, 0, 0, 60.0, True, 100)
            await api(nc, "STREAM.CREATE.MC0_J_letters", spec.config(), timeout=10)
            seqs = []
            for i in range(5):  # carol's letters between someone else's
                for who in ("carol", "dave"):
                    ack = await stored(nc, jsw.letter_subject("letters", who), f"{who} {i}".encode())
                    if who == "carol":
                        seqs.append(ack["seq"])
            ops = storeops.StoreOps(nc, {"letters": spec})
            read = {"journal": "letters", "identity": "carol"}
            data, payloads = await ops.op_letters_read({**read, "after": 0})
            assert [seq for seq, _ in data["records"]] == seqs
            assert payloads == [f"carol {i}".encode() for i in range(5)]
            data, payloads = await ops.op_letters_read({**read, "after": seqs[2]})
            assert [seq for seq, _ in data["records"]] == seqs[3:]
            assert payloads == [b"carol 3", b"carol 4"]
            data, payloads = await ops.op_letters_read({**read, "after": seqs[-1]})
            assert data["records"] == [] and payloads == []
        finally:
            await nc.close()

    asyncio.run(run())


def test_a_stream_feeds_the_broker_loop_no_faster_than_it_takes_records_and_then_hands_every_one_once(
    tmp_path: Path,
) -> None:
    """The cluster link on a real NATS node: while the broker loop takes nothing, what the feed posts
    to it stops near the budget (JetStream's flow control is held); once the loop takes the records,
    every one arrives, once, in order, and nothing is counted as waiting any more."""
    import asyncio

    import zmq
    from nats.aio.client import Client as Nats

    from mc0.broker.cluster.link import ClusterLink
    from mc0.broker.jetstream import feed as feeds
    from mc0.broker.jetstream.streams import Records, StreamSpec, api
    from mc0.settings import ClusterConfig

    budget, size, count = 256 * 1024, 32 * 1024, 512  # 16 MiB in the stream, 64 times the budget
    with NatsCluster(tmp_path / "nats", 1, sync_always=False) as node:
        node.wait_ready()
        spec = StreamSpec("feedc", 1, 0.0, 0, 0, 60.0)
        link = ClusterLink(ClusterConfig(nats=(node.url(0),), hello_ms=1000), streams={"feedc": spec})
        context = zmq.Context()
        try:
            link.start(context, "b1", {"feedc": (1, "")})
            until(lambda: link.poster is not None, what="the link thread's poster")
            assert link.poster is not None
            link.poster.budget = budget

            async def publish() -> None:
                nc = Nats()
                await nc.connect(servers=[node.url(0)], connect_timeout=5, inbox_prefix=REPLY_PREFIX)
                try:
                    for _ in range(500):  # (bounded) until the link made the stream
                        try:
                            await api(nc, "STREAM.INFO.MC0_J_feedc")
                            break
                        except Exception:
                            await asyncio.sleep(0.05)
                    for i in range(count):
                        await nc.publish("mc0.j.feedc.t", i.to_bytes(4, "big") * (size // 4))
                    await nc.flush()
                finally:
                    await nc.close()

            asyncio.run(publish())
            feed = link.jetstream.feeds["feedc"] if link.jetstream is not None else None
            assert feed is not None
            until(lambda: feed.held > 0, what="flow control held")
            poster = link.poster
            seen = [-1]

            def settled() -> bool:  # (what JetStream had sent before the held reply still comes)
                backlog, seen[0] = poster.backlog, poster.backlog
                time.sleep(feeds.HEARTBEAT_S)
                return poster.backlog == backlog

            until(settled, timeout=20.0, what="the feed to stop")
            time.sleep(2 * feeds.HEARTBEAT_S)  # the loop still takes nothing: JetStream sends no more
            assert poster.backlog == seen[0]
            assert budget <= seen[0] < 32 * budget  # the budget, then at most JetStream's window (not 16 MiB)
            seqs: list[int] = []
            payloads: list[bytes] = []

            def take() -> bool:
                for item in link.receive():
                    if isinstance(item, Records):
                        seqs.extend(seq for seq, *_ in item.records)
                        payloads.extend(payload for *_, payload in item.records)
                return len(seqs) >= count

            until(take, timeout=30.0, what="every record")
            assert seqs == list(range(1, count + 1))  # once each, in order
            assert [p[:4] for p in payloads] == [i.to_bytes(4, "big") for i in range(count)]
            assert link.poster.backlog == 0 and link.receive() == []
            assert feed.starts == 1  # (held, its consumer stayed: heartbeats went on)
        finally:
            link.close()
            context.term()


def test_a_message_in_a_stream_that_mc0_did_not_write_is_skipped_counted_and_logged_once(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """A NATS user allowed the stream's subjects publishes what is no mc0 record between two records.
    Every broker goes on: a live subscriber, a replay, a JSON fetch and a columns fetch get the two
    records at their seqs (the foreign ones skipped), confirmed PUTs on every journal are answered,
    the journal's info counts them ``unreadable``, and the broker's log says so once."""
    import asyncio

    from nats.aio.client import Client as Nats

    foreign = [b"not an mc0 record", b"", b"\x00" * 7, b"\xff" * 40, b"\x05\x00\x00\x00\x00\x00\x01\x00ab"]
    extra = journal("mixed", '["mixed.>"]') + '[journals.local]\ntopics = ["local.>"]\n'

    async def publish_foreign() -> list[int]:
        nc = Nats()
        await nc.connect(servers=nats.urls("open"), connect_timeout=5)
        try:
            return [int((await stored(nc, "mc0.j.mixed.x", body))["seq"]) for body in foreign]
        finally:
            await nc.close()

    with ClusterBus(tmp_path, nats, 2, extra=extra) as bus:
        bus.wait_joined()
        with bus.client(0) as writer, bus.client(1) as reader:
            live = reader.subscribe("mixed.>")
            first = confirmed(writer, "mixed.x", b"first")
            skipped = asyncio.run(publish_foreign())
            last = confirmed(writer, "mixed.x", b"last")
            assert skipped == list(range(first.seq + 1, last.seq))
            wanted = [(first.seq, b"first"), (last.seq, b"last")]
            assert received(live, 2) == wanted
            assert received(reader.subscribe("mixed.>", from_seq=first.seq, journal="mixed"), 2) == wanted
            # The loop is not wedged: confirmed PUTs on a file journal and on the stream are answered.
            kept = reader.publish("local.x", b"kept", confirm=True, timeout=10)
            assert kept is not None and kept.journal == "local"
            more = confirmed(reader, "mixed.y", b"more")
            assert [(r.seq, r.body) for r in fetch_all(reader, "mixed", from_seq=first.seq)] == [
                *wanted,
                (more.seq, b"more"),
            ]
            pages = list(reader.fetch_pages("mixed", from_seq=first.seq, timeout=10))
            assert [(r.seq, r.body) for p in pages for r in p.records()] == [*wanted, (more.seq, b"more")]
            assert reader.journal_info()["mixed"]["unreadable"] == len(foreign)
            # b1's copy is filled by its own feed, in its own time (the PubAcks it got do not wait for it).
            until(lambda: writer.journal_info()["mixed"]["copy_next_seq"] > more.seq, 30, "b1's copy")
            assert writer.journal_info()["mixed"]["unreadable"] == len(foreign)
        broker = bus.brokers[1]
        assert broker is not None and broker.proc is not None
        broker.signal(signal.SIGTERM)
        broker.proc.wait(30)
        log = broker.stderr_text()
        assert log.count("is not an mc0 record") == 1 and "Traceback" not in log, log[-2000:]


def test_a_record_jetstream_can_never_store_gets_413_at_once_naming_the_limit(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """The NATS servers' max_payload (1 MiB here) bounds a JetStream journal's record, its headers
    counted: a 2 MiB confirmed PUT (under max_message_bytes, and a file journal takes it) gets 413 at
    once, naming the limit, never "504 send it again"; so does one whose payload fits but not with
    its NATS headers (sent, the server would drop the broker's connection); one of exactly the limit
    is stored and served by the other broker."""
    from mc0.protocol import jetstream as jsw
    from mc0.protocol.journalrecords import encode_payload

    limit = 1024 * 1024
    extra = "jetstream_timeout_ms = 30000\n" + journal("big", '["big.>"]') + '[journals.files]\ntopics = ["files.>"]\n'

    def body_for(size: int, msgid: str | None) -> bytes:
        """A body that makes the record ``size`` bytes as a NATS message (with ``msgid``'s header)."""
        headers = {"MSGID": msgid} if msgid else {}
        # The header block NATS counts: "NATS/1.0", a "Key: Value" line, an empty line.
        block = f"NATS/1.0\r\n{jsw.MSG_ID}: {jsw.msg_id('anonymous', msgid)}\r\n\r\n".encode() if msgid else b""
        return b"x" * (size - len(block) - len(encode_payload("big.x", "anonymous", headers, [b""])))

    with ClusterBus(tmp_path, nats, 2, extra=extra) as bus:
        bus.wait_joined()
        with bus.client(0) as writer, bus.client(1) as reader:
            confirmed(writer, "big.x", b"warm-up")
            kept = writer.publish("files.x", b"x" * (2 << 20), confirm=True, timeout=10)
            assert kept is not None and kept.journal == "files"  # a file journal takes 2 MiB
            cases = [(b"x" * (2 << 20), None), (body_for(limit + 1, None), None), (body_for(limit + 1, "m-1"), "m-1")]
            for body, msgid in cases:
                began = time.monotonic()
                with pytest.raises(mc0.TooLarge, match=f"max_payload \\({limit} bytes\\)"):
                    writer.publish("big.x", body, confirm=True, msgid=msgid, timeout=20)
                assert time.monotonic() - began < 5.0  # at once (a 504 would take jetstream_timeout_ms: 30 s)
                with pytest.raises(mc0.TooLarge):  # and again: the same definite answer
                    writer.publish("big.x", body, confirm=True, msgid=msgid, timeout=20)
            fits = body_for(limit, "m-2")
            ack = writer.publish("big.x", fits, confirm=True, msgid="m-2", timeout=20)
            assert ack is not None and ack.seq is not None
            until(lambda: reader.journal_info()["big"]["copy_next_seq"] > ack.seq, what="the copy")
            assert [r.body for r in fetch_all(reader, "big", from_seq=ack.seq)] == [fits]


def test_a_consumer_deleted_and_made_again_by_another_identity_is_checked_against_jetstream_not_a_stale_view(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """alice's consumer "billing", known at broker A, is deleted through B and bob makes his own
    "billing" there (another filter).  A must not act on what it learnt: alice's pull, ack and delete
    at A are refused (403) and touch nothing of bob's, and bob gets every record, none terminated."""
    policy = "".join(
        f'[permissions.identity.{who}]\npublish = [">"]\nsubscribe = [">"]\ncall = [">"]\n' for who in ("alice", "bob")
    )
    extra = journal("ledger", '["bill.>"]') + policy
    with ClusterBus(tmp_path, nats, 2, curve=True, extra=extra) as bus:
        bus.wait_joined()
        with bus.client(0, "alice") as alice_a, bus.client(1, "alice") as alice_b, bus.client(1, "bob") as bob:
            mine = alice_a.consume("ledger", "billing", topics=["bill.eu.>"], ack_wait=30.0)
            assert mine.fetch(10, wait=0) == []
            assert mine.info()["owner"] == "alice"  # A knows it as alice's, with her filter
            alice_b.consume("ledger", "billing", topics=["bill.eu.>"], ack_wait=30.0).delete()
            theirs = bob.consume("ledger", "billing", topics=["bill.>"], ack_wait=30.0)
            seqs = [confirmed(bob, f"bill.{where}.x", b"due").seq for where in ("us", "eu", "us", "eu", "us")]
            with pytest.raises(mc0.Forbidden):
                mine.fetch(10, wait=0)  # bob's now: not alice's to pull, with or without her filter
            with pytest.raises(mc0.Forbidden):
                mine.ack(*seqs)
            with pytest.raises(mc0.Forbidden):
                mine.delete()
            got: list[tuple[int, int]] = []
            for _ in range(20):
                got += [(m.seq, m.deliveries) for m in theirs.fetch(10, wait=1)]
                if len(got) >= len(seqs):
                    break
            # Every record, once, a first delivery each: none terminated by A's stale filter, none
            # pulled by alice (which would have counted a delivery).
            assert sorted(got) == [(seq, 1) for seq in seqs]
            assert theirs.info()["owner"] == "bob"


def test_a_consumer_just_made_is_known_by_its_nonce_and_its_first_pull_asks_jetstream_once(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """A consumer just made was learnt without JetStream's creation nonce: its first pull expected made=""
    and found "another consumer" (counted consumer_changed) and asked JetStream a second time."""
    with ClusterBus(tmp_path, nats, 1, extra=journal("nonce", '["nonce.>"]')) as bus, bus.client(0) as client:
        confirmed(client, "nonce.eu", b"one")
        consumer = client.consume("nonce", "billing", topics=["nonce.>"])

        def counters() -> dict[str, int]:
            return dict(json.loads(client.request("mc0.broker", b"stats", timeout=5).body)["counters"])

        before = counters()
        assert [m.body for m in consumer.fetch(10, wait=2)] == [b"one"]
        after = counters()
    assert after.get("consumer_changed", 0) == before.get("consumer_changed", 0)
    assert after["store_calls"] - before["store_calls"] == 1


def test_an_ack_of_a_record_acked_already_counts_nothing(tmp_path: Path, nats: NatsCluster) -> None:
    """ack returns how many were still unsettled.  JetStream answers an ack of a seq it no longer holds
    pending as any other: above the ack floor (an earlier record still pending), acking the same records
    again counted them all again; so did a seq given twice in one ack."""
    with ClusterBus(tmp_path, nats, 1, extra=journal("twice", '["twice.>"]')) as bus, bus.client(0) as client:
        for i in range(4):
            confirmed(client, "twice.x", f"r{i}".encode())
        consumer = client.consume("twice", "c", topics=["twice.>"])
        pulled = consumer.fetch(10, wait=2)
        assert len(pulled) == 4 and consumer.ack(*pulled[1:3]) == 2  # (the first stays pending: the floor)
        assert consumer.ack(*pulled[1:3]) == 0
        assert consumer.ack(pulled[3], pulled[3]) == 1
        assert consumer.term(*pulled[1:]) == 0
        assert consumer.ack(*pulled) == 1  # the first only
        assert consumer.info()["pending"] == 0


def test_a_feed_consumer_that_heartbeats_but_delivers_nothing_is_made_again_and_every_copy_catches_up(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """What NATS did after losing its quorum (tests/test_jetstream_faults.py), made certain: every
    broker's feed consumer is paused, so it goes on heartbeating and delivers nothing.  The records the
    stream holds past it still reach every broker's copy, and a replay there delivers them."""
    import asyncio
    import datetime

    from nats.aio.client import Client as Nats

    async def pause_feeds() -> int:
        nc = Nats()
        await nc.connect(servers=nats.urls("open"), connect_timeout=5)
        try:
            listed = json.loads((await nc.request("$JS.API.CONSUMER.LIST.MC0_J_stall", b"", timeout=5)).data)
            until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
            for consumer in listed["consumers"]:
                request = json.dumps({"pause_until": until.isoformat()}).encode()
                paused = await nc.request(f"$JS.API.CONSUMER.PAUSE.MC0_J_stall.{consumer['name']}", request, timeout=5)
                assert json.loads(paused.data).get("paused") is True
            for consumer in listed["consumers"]:  # (bounded) until the node that runs it says it is paused
                subject = f"$JS.API.CONSUMER.INFO.MC0_J_stall.{consumer['name']}"
                for _ in range(250):
                    if json.loads((await nc.request(subject, b"", timeout=5)).data).get("paused"):
                        break
                    await asyncio.sleep(0.02)
            return len(listed["consumers"])
        finally:
            await nc.close()

    with ClusterBus(tmp_path, nats, 2, extra=journal("stall", '["stall.>"]')) as bus:
        bus.wait_joined()
        with bus.client(0) as writer, bus.client(1) as reader:
            first = confirmed(writer, "stall.x", b"first")
            for client in (writer, reader):
                until(lambda c=client: c.journal_info()["stall"]["copy_next_seq"] > first.seq, what="the copies")
            assert asyncio.run(pause_feeds()) == 2  # one feed per broker
            last = confirmed(writer, "stall.x", b"last")
            for client in (writer, reader):
                took = until(
                    lambda c=client: c.journal_info()["stall"]["copy_next_seq"] > last.seq, 30, "a copy past the stall"
                )
                print(f"a copy caught up {took:.2f} s after the record that a paused feed never delivered")
            assert received(reader.subscribe("stall.>", from_seq=first.seq, journal="stall"), 2) == [
                (first.seq, b"first"),
                (last.seq, b"last"),
            ]


@pytest.mark.parametrize("over", ["body", "headers"])
def test_a_file_journal_record_over_max_payload_stops_its_copy_in_one_line_naming_the_limit(
    tmp_path: Path, nats: NatsCluster, over: str
) -> None:
    """``mc0 journal copy`` of a file journal whose second record is over the NATS servers' max_payload
    (by its body, or only with the headers the copy adds): the first is copied, then one line naming
    the limit, exit 1; never a hang or a dropped connection."""
    import subprocess
    import sys

    from mc0.broker.storage.filestore import Journal
    from mc0.settings import JournalSettings

    folder = tmp_path / "old"
    old = Journal("old", JournalSettings(folder=str(folder))).open()
    old.append("big.x", "alice", {}, [b"small"])
    old.append("big.x", "alice", {}, [b"x" * ((2 << 20) if over == "body" else (1 << 20) - 40)])
    old.commit()
    old.close()
    name = f"big{over}"
    config = tmp_path / "copy.toml"
    config.write_text(f"[cluster]\nnats = {json.dumps(nats.urls())}\n" + journal(name, '["big.>"]'))
    command = [sys.executable, "-m", "mc0", "journal", "copy", name, "--from", str(folder), "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    *progress, error = done.stderr.strip().splitlines()  # (progress lines, then the error in one line)
    assert all(line.startswith("journal copy: ") for line in progress) and "Traceback" not in done.stderr
    assert error.startswith("mc0: error: seq 2: the record is ") and error.endswith("copied up to 1")
    assert "over the connected NATS server's max_payload (1048576 bytes)" in error

    async def last_seq() -> int:
        from nats.aio.client import Client as Nats

        nc = Nats()
        await nc.connect(servers=nats.urls("open"), connect_timeout=5)
        try:
            info = await nc.request(f"$JS.API.STREAM.INFO.MC0_J_{name}", b"", timeout=5)
            return int(json.loads(info.data)["state"]["last_seq"])
        finally:
            await nc.close()

    import asyncio

    assert asyncio.run(last_seq()) == 1  # the record before it is in the stream


def test_a_stream_deleted_under_the_brokers_is_made_again_and_a_put_is_stored(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """An operator deletes the journal's stream (`nats stream rm`) with the brokers' login: a confirmed PUT
    then met no stream (no responders, retried) and failed 504 "stored or not is unknown, send it again"
    for ever.  The stream is made again and the PUT stored; the other broker's copy follows (a stream made
    anew is another one: its copy starts again)."""
    with ClusterBus(tmp_path, nats, 2, extra=journal("gone", '["gone.>"]')) as bus:
        bus.wait_joined()
        with bus.client(0) as writer, bus.client(1) as reader:
            confirmed(writer, "gone.x", b"before")
            assert js(nats, "STREAM.DELETE.MC0_J_gone").get("success") is True
            began = time.monotonic()
            stored = writer.publish("gone.x", b"after", confirm=True, msgid="after-1", timeout=10)
            print(f"the PUT stored after {time.monotonic() - began:.2f} s: {stored}")
            assert stored is not None and stored.seq == 1
            # (b2's copy of the deleted stream held seq 1 already: it starts again once its feed finds the
            # stream made anew, ~3 s of its consumer's silence; until then a fetch there reads the old one,
            # and one at its end while its feed does not follow waits for it, or is 504 after 10 s)

            def fetched_anew() -> bool:
                try:
                    return [r.body for r in fetch_all(reader, "gone")] == [b"after"]
                except mc0.DeadlineExceeded:
                    return False

            until(fetched_anew, 60, "b2's copy starts again")


def test_a_stream_whose_subjects_were_changed_under_the_brokers_answers_507_naming_it_at_once(
    tmp_path: Path, nats: NatsCluster
) -> None:
    """An operator sets the journal's stream's subjects elsewhere: a confirmed PUT then met no stream and
    failed 504 "stored or not is unknown, send it again" after the timeout, every time.  It fails 507 naming
    the stream at once (the operator's change is not undone); with the subjects put back, PUTs are stored."""
    with ClusterBus(tmp_path, nats, 1, extra=journal("rehomed", '["rehomed.>"]')) as bus, bus.client(0) as writer:
        before = confirmed(writer, "rehomed.x", b"before")
        config = js(nats, "STREAM.INFO.MC0_J_rehomed")["config"]
        updated = js(nats, "STREAM.UPDATE.MC0_J_rehomed", {**config, "subjects": ["elsewhere.>"]})
        assert "error" not in updated, updated
        for attempt in range(3):
            began = time.monotonic()
            with pytest.raises(
                mc0.StorageFailed, match="not stored: JetStream stream MC0_J_rehomed no longer takes mc0.j.rehomed.>"
            ) as caught:
                writer.publish("rehomed.x", b"after", confirm=True, msgid="after-1", timeout=10)
            print(f"PUT {attempt}: {time.monotonic() - began:.2f} s: {caught.value}")
        assert "error" not in js(nats, "STREAM.UPDATE.MC0_J_rehomed", config)
        stored = writer.publish("rehomed.x", b"after", confirm=True, msgid="after-1", timeout=10)
        assert stored is not None and stored.seq == before.seq + 1
