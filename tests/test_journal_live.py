"""Journals in a real broker process: acknowledged means stored (even across kill -9), dedup,
retention, replay, telemetry; sync and asyncio clients, CURVE on and off."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0.process import BrokerProcess

from .conftest import CurveSetup, write_config

JOURNAL = """
[journals.main]
topics = ["orders.>", "mc0.sys.>"]
fsync = "{fsync}"
segment_bytes = {segment}
max_bytes = {max_bytes}
"""


def journal_config(tmp_path: Path, fsync: str = "batch", segment: int = 1 << 20, max_bytes: int = 0) -> str:
    text = "[broker]\nmin_ttl_ms = 50\n" + JOURNAL.format(fsync=fsync, segment=segment, max_bytes=max_bytes)
    return write_config(tmp_path, text)


class JournalBus:
    def __init__(self, broker: BrokerProcess, options: dict[str, Any], sender: str) -> None:
        self.broker = broker
        self.endpoint = broker.endpoint
        self.options = options
        self.sender = sender


@pytest.fixture(params=["plain", "curve"])
def jbus(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "plain":
        with BrokerProcess(config=journal_config(tmp_path), insecure=True) as broker:
            yield JournalBus(broker, {}, "anonymous")
        return
    setup = CurveSetup(tmp_path, extra=JOURNAL.format(fsync="batch", segment=1 << 20, max_bytes=0))
    with setup.start() as broker:
        yield JournalBus(broker, setup.client_options("alice"), "alice")


@pytest.mark.parametrize("fsync", ["always", "batch", "never"])
def test_every_acknowledged_message_survives_kill_9_and_restart(tmp_path: Path, fsync: str) -> None:
    config = journal_config(tmp_path, fsync)
    first = BrokerProcess(config=config, insecure=True).start()
    endpoint = first.endpoint
    acked: dict[int, bytes] = {}
    try:
        with mc0.Client(endpoint) as client:
            for i in range(300):
                ack = client.publish("orders.new", f"order {i}".encode(), confirm=True, msgid=f"o{i}")
                assert ack is not None and ack.journal == "main" and not ack.duplicate and ack.seq is not None
                acked[ack.seq] = f"order {i}".encode()
            for i in range(50):  # and some never acknowledged, in flight when the broker dies
                client.publish("orders.new", b"unacked", msgid=f"u{i}")
        first.kill()
    finally:
        first.kill()
    with BrokerProcess(config=config, insecure=True, bind=(endpoint,)) as second, mc0.Client(second.endpoint) as client:
        kept = {}
        seq = 0
        for _ in range(20):  # bounded paging
            page = client.fetch("main", from_seq=seq, topics=["orders.>"])
            kept.update({r.seq: r.body for r in page.records})
            if page.next_seq >= page.end_seq:
                break
            seq = page.next_seq
        assert {s: kept[s] for s in acked} == acked
        # The dedup memory came back too: a retry of an acknowledged message is not stored twice.
        retry = client.publish("orders.new", b"order 7", confirm=True, msgid="o7")
        assert retry is not None and retry.duplicate and acked[retry.seq or 0] == b"order 7"


@pytest.mark.asyncio
async def test_msgid_retry_is_stored_and_delivered_once(api: Any, jbus: JournalBus) -> None:
    client = await api(api.Client(jbus.endpoint, **jbus.options).connect())
    sub = await api(client.subscribe("orders.>"))
    first = await api(client.publish("orders.1", b"pay", confirm=True, msgid="pay-1"))
    again = await api(client.publish("orders.1", b"pay", confirm=True, msgid="pay-1"))
    assert first == mc0.Ack("main", first.seq, False) and again == mc0.Ack("main", first.seq, True)
    message = await api(sub.next(timeout=5))
    assert (message.seq, message.journal, message.sender) == (first.seq, "main", jbus.sender)
    with pytest.raises(mc0.Timeout):
        await api(sub.next(timeout=0.3))
    await api(client.close())


@pytest.mark.asyncio
async def test_subscribe_from_replays_history_then_live_in_order(api: Any, jbus: JournalBus) -> None:
    client = await api(api.Client(jbus.endpoint, **jbus.options).connect())
    seqs = []
    for i in range(1200):  # more than one replay page
        ack = await api(client.publish(f"orders.{i % 2}", str(i).encode(), confirm=i % 100 == 99))
        if ack is not None:
            seqs.append(ack.seq)
    start = seqs[0] - 99  # the seq of message 0
    sub = await api(client.subscribe("orders.1", from_seq=start, max_pending=100_000))
    await api(client.publish("orders.1", b"live", confirm=True))
    bodies = [(await api(sub.next(timeout=5))).body for _ in range(601)]
    assert bodies == [str(i).encode() for i in range(1, 1200, 2)] + [b"live"]
    with pytest.raises(mc0.Timeout):
        await api(sub.next(timeout=0.3))
    await api(client.close())


@pytest.mark.asyncio
async def test_fetch_and_subscribe_before_retention_are_gone(api: Any, tmp_path: Path) -> None:
    config = journal_config(tmp_path, segment=4096, max_bytes=8192)
    with BrokerProcess(config=config, insecure=True) as broker:
        client = await api(api.Client(broker.endpoint).connect())
        for i in range(300):
            await api(client.publish("orders.x", b"y" * 60, confirm=i == 299))
        info = (await api(client.journal_info()))["main"]
        assert info["first_seq"] > 1 and info["bytes"] <= 8192 + 4096
        with pytest.raises(mc0.Gone):
            await api(client.fetch("main", from_seq=1))
        with pytest.raises(mc0.Gone):
            await api(client.subscribe("orders.>", from_seq=1))
        page = await api(client.fetch("main", from_seq=info["first_seq"], max_records=5))
        assert [r.seq for r in page.records] == list(range(info["first_seq"], info["first_seq"] + 5))
        await api(client.close())


def test_rpc_telemetry_reaches_subscribers_and_the_journal(tmp_path: Path) -> None:
    from .test_rpc_live import WorkerProcess

    with BrokerProcess(config=journal_config(tmp_path), insecure=True) as broker:
        worker = WorkerProcess(broker.endpoint, "answer", "svc")
        try:
            with mc0.Client(broker.endpoint) as client:
                sub = client.subscribe("mc0.sys.rpc")
                reply = client.request("svc", b"hello")
                with pytest.raises(mc0.NoResponders):
                    client.request("missing", b"")
                events = [json.loads(sub.next(timeout=5).body) for _ in range(2)]
                assert [(e["service"], e["status"], e["caller"]) for e in events] == [
                    ("svc", 200, "anonymous"),
                    ("missing", 503, "anonymous"),
                ]
                assert events[0]["bytes_in"] == 5 and events[0]["bytes_out"] == len(reply.body)
                assert events[0]["worker"].startswith("anonymous#") and events[0]["latency_ms"] >= 0
                assert abs(events[0]["ts"] - time.time()) < 60
                stored = client.fetch("main", topics=["mc0.sys.rpc"]).records
                assert [json.loads(r.body)["status"] for r in stored] == [200, 503]
                assert all(r.sender == "mc0.broker" for r in stored)
        finally:
            worker.close()


def test_cli_sub_from_replays_the_journal_as_json_lines(tmp_path: Path) -> None:
    import subprocess
    import sys

    with BrokerProcess(config=journal_config(tmp_path), insecure=True) as broker, mc0.Client(broker.endpoint) as client:
        acks = [client.publish("orders.cli", f"o{i}".encode(), confirm=True) for i in range(3)]
        result = subprocess.run(
            [sys.executable, "-m", "mc0", "sub", "orders.>", "--from", str(acks[1].seq), "--json", "--count", "2",
             "--wait", "10", "--endpoint", broker.endpoint],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        assert [(m["seq"], m["journal"], m["body"]) for m in lines] == [
            (acks[1].seq, "main", "o1"),
            (acks[2].seq, "main", "o2"),
        ]
        stored = subprocess.run(
            [sys.executable, "-m", "mc0", "pub", "orders.cli", "again", "--confirm", "--msgid", "m1", "--count", "2",
             "--endpoint", broker.endpoint],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert stored.returncode == 0, stored.stderr
        first, again = stored.stdout.splitlines()
        assert first.startswith("main seq ") and again == f"{first} (duplicate: stored before)"
        assert int(first.split()[-1]) > acks[2].seq
        bad = subprocess.run(
            [sys.executable, "-m", "mc0", "sub", "elsewhere", "--from", "1", "--endpoint", broker.endpoint],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "no journal keeps" in bad.stderr


@pytest.mark.asyncio
async def test_a_replaying_subscriber_resumes_where_it_stopped_after_a_broker_crash(api: Any, tmp_path: Path) -> None:
    config = journal_config(tmp_path)
    first = BrokerProcess(config=config, insecure=True).start()
    endpoint = first.endpoint
    try:
        reader = await api(api.Client(endpoint, ttl=0.2, timeout=3).connect())
        writer = await api(api.Client(endpoint).connect())
        for i in range(5):
            await api(writer.publish("orders.r", str(i).encode(), confirm=True))
        await api(writer.close())
        sub = await api(reader.subscribe("orders.>", from_seq=0))
        bodies = [(await api(sub.next(timeout=5))).body for _ in range(5)]
        first.kill()  # no DISCONNECT; the journal has what was acknowledged
        with BrokerProcess(config=config, insecure=True, bind=(endpoint,)) as second:
            writer = await api(api.Client(second.endpoint).connect())
            for i in range(5, 15):  # mostly before the reader has noticed the restart
                await api(writer.publish("orders.r", str(i).encode(), confirm=True))
            bodies += [(await api(sub.next(timeout=10))).body for _ in range(10)]
            assert bodies == [str(i).encode() for i in range(15)]  # no gap, no repeat
            with pytest.raises(mc0.Timeout):
                await api(sub.next(timeout=0.3))
            assert reader.reconnects == 1
            await api(writer.close())
            await api(reader.close())
    finally:
        first.kill()


def test_a_replay_larger_than_the_send_queue_pauses_instead_of_dropping(tmp_path: Path) -> None:
    text = "[broker]\nsend_hwm = 20\nmax_queue_bytes = 4096\nslow_consumer_ms = 500\n" + JOURNAL.format(
        fsync="never", segment=1 << 20, max_bytes=0
    )
    with BrokerProcess(config=write_config(tmp_path, text), insecure=True) as broker:
        with mc0.Client(broker.endpoint) as client:
            for i in range(3000):
                client.publish("orders.bulk", str(i).encode() * 20, confirm=i == 2999)
            sub = client.subscribe("orders.>", from_seq=0, max_pending=10_000)
            bodies = [sub.next(timeout=10).body for _ in range(3000)]
            assert bodies == [str(i).encode() * 20 for i in range(3000)]
            page = client.fetch("main", topics=["orders.bulk"])  # 3000 records, three pages, same queue
            assert len(page.records) == 3000 and client.ping() < 1.0
            stats = json.loads(client.request("mc0.broker", b"stats").body)
        assert stats["counters"].get("forgotten_too_slow", 0) == 0
        assert stats["counters"]["stream_paused"] > 0  # the queue did fill: pausing was exercised


def test_history_reads_obey_permissions(tmp_path: Path) -> None:
    policy = (
        JOURNAL.format(fsync="batch", segment=1 << 20, max_bytes=0)
        + '[permissions.identity.bob.deny]\nsubscribe = ["orders.secret.>"]\n'
        + '[permissions.identity.carol]\ncall = ["svc.>"]\n'
    )
    setup = CurveSetup(tmp_path, extra=policy)
    with setup.start() as broker:
        with mc0.Client(broker.endpoint, **setup.client_options("alice")) as alice:
            alice.publish("orders.open.1", b"open", confirm=True)
            alice.publish("orders.secret.1", b"secret", confirm=True)
        with mc0.Client(broker.endpoint, **setup.client_options("bob")) as bob:
            seen = [r.topic for r in bob.fetch("main", topics=["orders.>"]).records]
            assert seen == ["orders.open.1"]  # the denied topic is filtered out of history
            with pytest.raises(mc0.Forbidden):
                bob.subscribe("orders.secret.>", from_seq=0)
            replay = bob.subscribe("orders.>", from_seq=0)
            assert replay.next(timeout=5).topic == "orders.open.1"
            with pytest.raises(mc0.Timeout):
                replay.next(timeout=0.3)
        with mc0.Client(broker.endpoint, **setup.client_options("carol")) as carol:
            with pytest.raises(mc0.Forbidden):
                carol.fetch("main")  # no call permission on mc0.journal


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_replay_the_broker_ends_ends_that_subscription_alone_with_its_reason(api: Any, tmp_path: Path) -> None:
    """The journal's segment files are gone (a read fails: 507), so a ``SUB FROM`` replay ends at once.
    That subscription ends with the broker's reason; the client's live subscription of the same pattern
    goes on hearing, and the broker keeps that pattern's SUB.  A replay of a pattern nothing else holds
    ends with its UNSUB: the broker and the client agree on what is subscribed."""
    with BrokerProcess(config=journal_config(tmp_path), insecure=True) as broker:
        client = await api(api.Client(broker.endpoint).connect())
        live = await api(client.subscribe("orders.>"))
        for i in range(3):
            await api(client.publish("orders.x", b"old %d" % i, confirm=True))
        assert [(await api(live.next(timeout=5))).body for _ in range(3)] == [b"old 0", b"old 1", b"old 2"]
        segments = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix.startswith(".seg")]
        assert segments, sorted(str(p) for p in tmp_path.rglob("*"))
        for segment in segments:
            segment.unlink()

        async def topics() -> dict[str, Any]:
            return dict(json.loads((await api(client.request("mc0.broker", "topics", timeout=5))).body))

        for pattern in ("orders.>", "orders.y.>"):
            replay = await api(client.subscribe(pattern, from_seq=1))
            with pytest.raises(mc0.ClosedError, match="507 ") as ended:
                await api(replay.next(timeout=5))
            assert isinstance(replay.error, mc0.StorageFailed) and ended.value.__cause__ is replay.error
            assert replay.closed and not live.closed
        assert "orders.>" in await topics()
        for _ in range(200):  # (the UNSUB is on its way)
            if "orders.y.>" not in await topics():
                break
            await asyncio.sleep(0.01)
        assert sorted(await topics()) == ["orders.>"] and inner(client).session.patterns == ["orders.>"]
        for i in range(2):
            await api(client.publish("orders.x", b"new %d" % i, confirm=True))
        assert [(await api(live.next(timeout=5))).body for _ in range(2)] == [b"new 0", b"new 1"]
        assert [type(f) for f in client.faults] == [mc0.StorageFailed] * 2
        await api(client.close())


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_replays_history_goes_to_its_subscription_alone(api: Any, jbus: JournalBus) -> None:
    """A client hears orders live, then subscribes the same pattern FROM 1: the replayed history is that
    subscription's alone (the live one had it already), and what is new reaches both, once each."""
    client = await api(api.Client(jbus.endpoint, **jbus.options).connect())
    live = await api(client.subscribe("orders.>"))
    for i in range(3):
        await api(client.publish("orders.x", b"old %d" % i, confirm=True))
    assert [(await api(live.next(timeout=5))).body for _ in range(3)] == [b"old 0", b"old 1", b"old 2"]
    replay = await api(client.subscribe("orders.>", from_seq=1))
    assert [(await api(replay.next(timeout=5))).body for _ in range(3)] == [b"old 0", b"old 1", b"old 2"]
    for i in range(2):
        await api(client.publish("orders.x", b"new %d" % i, confirm=True))
    for sub in (replay, live):
        assert [(await api(sub.next(timeout=5))).body for _ in range(2)] == [b"new 0", b"new 1"]
        with pytest.raises(mc0.Timeout):
            await api(sub.next(timeout=0.3))
    await api(client.close())


def inner(client: Any) -> Any:
    return getattr(client, "_inner", client)


@pytest.mark.timeout(60)
def test_a_507_names_the_journal_never_a_file(tmp_path: Path) -> None:
    """A segment that cannot be read: the fetch and the replay are answered 507 naming the journal and
    what the OS said, never the segment's path (it was on the wire: the broker's folders for any
    reader); the path goes to the broker's log."""
    import zmq

    from .conftest import RawPeer, headers_of

    with BrokerProcess(config=journal_config(tmp_path, segment=4096), insecure=True) as broker:
        with mc0.Client(broker.endpoint) as client:
            for i in range(60):
                client.publish("orders.x", str(i).encode() * 100, confirm=i % 10 == 9)
            folder = tmp_path / "var" / "journal" / "main"
            segments = sorted(folder.glob("*.seg"))
            assert len(segments) >= 3, segments
            segments[0].unlink()  # (the file journal opens a segment for each read)
            with pytest.raises(mc0.StorageFailed) as fetched:
                client.fetch("main", from_seq=1)
        context: zmq.Context[Any] = zmq.Context()
        peer = RawPeer(broker.endpoint, context)
        try:
            assert peer.connect()[0] == b"OK"
            peer.send("SUB", "FROM", "1", "ID", "s", "", "orders.>")
            ended = None
            for _ in range(10):  # the OK, then the replay's end (NOOPs aside)
                frames = peer.recv_skipping_noop(10)
                if frames[0] == b"ERROR":
                    ended = headers_of(frames)
                    break
            assert ended is not None and ended["CODE"] == "507" and ended["JOURNAL"] == "main", ended
        finally:
            peer.close()
            context.term()
        for reason in (str(fetched.value), ended["MESSAGE"]):
            assert str(tmp_path) not in reason and ".seg" not in reason and "/" not in reason, reason
            assert "journal main could not be read" in reason, reason
        deadline = time.monotonic() + 10
        while segments[0].name not in broker.stderr_text():  # the log names the file (bounded wait)
            assert time.monotonic() < deadline, broker.stderr_text()[-2000:]
            time.sleep(0.05)


@pytest.mark.timeout(90)
def test_a_resumed_replay_has_its_own_id_and_its_history_reaches_that_subscription_alone(tmp_path: Path) -> None:
    """After a reconnect, the library re-sent ``SUB FROM n`` without an ID: no OK said where that
    replay's history ended, so the records published while it was away reached every subscription of
    its pattern, a plain one too (which never asked for history).  Now the resumed SUB FROM has an ID
    of its own; its history goes to the replaying subscription alone, and what is new after it to both."""
    from mc0.broker.storage.filestore import Journal, JournalSettings

    config = journal_config(tmp_path)
    first = BrokerProcess(config=config, insecure=True).start()
    endpoint = first.endpoint
    try:
        with mc0.Client(endpoint) as client:
            replaying = client.subscribe("orders.>", from_seq=1)
            plain = client.subscribe("orders.>")
            before = [f"before {i}".encode() for i in range(3)]
            for body in before:
                client.publish("orders.x", body, confirm=True)
            assert [replaying.next(timeout=10).body for _ in range(3)] == before
            assert [plain.next(timeout=10).body for _ in range(3)] == before
            first.stop()
            # While the broker is down, two records are kept (written to its journal as it would):
            # the replaying subscription's history when it resumes FROM 4.
            settings = JournalSettings(
                topics=("orders.>", "mc0.sys.>"), folder=str(tmp_path / "var" / "journal" / "main")
            )
            journal = Journal("main", settings).open()
            away = [journal.append("orders.x", "anonymous", {}, [f"while away {i}".encode()]) for i in range(2)]
            journal.commit()
            journal.close()
            with BrokerProcess(config=config, insecure=True, bind=(endpoint,)):
                history = [replaying.next(timeout=30) for _ in range(2)]  # (the client heals by itself)
                assert [(m.seq, m.body) for m in history] == [(away[0], b"while away 0"), (away[1], b"while away 1")]
                after = client.publish("orders.x", b"after", confirm=True)
                assert after is not None and after.seq is not None and after.seq > away[1]
                assert replaying.next(timeout=10).body == b"after"
                got = plain.next(timeout=10)
                assert (got.seq, got.body) == (after.seq, b"after"), "the plain subscription got the replay's history"
    finally:
        first.kill()
