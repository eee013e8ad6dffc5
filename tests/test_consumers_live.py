"""Durable consumers in a real broker process with a file journal: competing clients (one
SIGKILLed mid-batch), the broker killed -9 and restarted mid-stream, and the same body on the
sync and asyncio APIs with CURVE on and off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0.process import BrokerProcess

from .conftest import CurveSetup, write_config

JOURNAL = """
[journals.main]
topics = ["jobs.>", "mc0.sys.dead.>"]
segment_bytes = 1048576
"""


def config(tmp_path: Path) -> str:
    return write_config(tmp_path, "[broker]\nmin_ttl_ms = 50\n" + JOURNAL)


def publish(endpoint: str, n: int, **options: Any) -> None:
    with mc0.Client(endpoint, **options) as client:
        for i in range(n):
            client.publish("jobs.work", str(i).encode())
        assert client.publish("jobs.work", b"last", confirm=True) is not None  # all before it are stored


@pytest.fixture(params=["plain", "curve"])
def jbus(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "plain":
        with BrokerProcess(config=config(tmp_path), insecure=True) as broker:
            yield broker, {}
        return
    setup = CurveSetup(tmp_path, extra=JOURNAL)
    with setup.start() as broker:
        yield broker, setup.client_options("alice")


@pytest.mark.asyncio
async def test_fetch_ack_nak_term_and_dead_letters(api: Any, jbus: Any) -> None:
    broker, options = jbus
    publish(broker.endpoint, 5, **options)
    client = await api(api.Client(broker.endpoint, **options).connect())
    dead = await api(client.subscribe("mc0.sys.dead.>"))
    consumer = await api(client.consume("main", "work", topics=["jobs.>"], ack_wait=0.5, max_deliver=2))
    again = await api(client.consume("main", "work", topics=["jobs.>"], ack_wait=0.5, max_deliver=2))
    assert again.name == "work"  # the same config: the same consumer
    with pytest.raises(mc0.Conflict):
        await api(client.consume("main", "work", topics=["jobs.>"], ack_wait=9))
    batch = await api(consumer.fetch(10, wait=1))
    assert [m.body for m in batch] == [b"0", b"1", b"2", b"3", b"4", b"last"]
    assert [m.deliveries for m in batch] == [1] * 6 and batch[0].message.journal == "main"
    await api(batch[0].ack())
    await api(batch[1].nak())
    await api(batch[2].term())
    assert await api(consumer.ack(*batch[3:])) == 3  # one ack for the rest of the batch
    (redelivered,) = await api(consumer.fetch(10, wait=1))
    assert (redelivered.seq, redelivered.deliveries) == (batch[1].seq, 2)
    letter = await api(dead.next(timeout=5))  # its ack_wait passes with max_deliver reached
    assert letter.topic == "mc0.sys.dead.main.work" and letter.body == b"1"
    assert letter.headers["X-Dead-Seq"] == str(batch[1].seq)
    info = await api(consumer.info())
    assert (info["acked"], info["termed"], info["dead_lettered"], info["pending"]) == (4, 1, 1, 0)
    assert await api(consumer.fetch(10, wait=0.2)) == []
    await api(consumer.delete())
    with pytest.raises(mc0.NotFound):
        await api(consumer.info())
    await api(client.close())


CONSUMER = """
import os, signal, sys, mc0
endpoint, out, die_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
with mc0.Client(endpoint) as client, open(out, "w") as log:
    consumer = client.consume("main", "shared", topics=["jobs.>"], ack_wait=2.0)
    print("ready", flush=True)
    batches = idle = 0
    while idle < 20:  # bounded: stops after 20 empty pulls in a row (about 5 s)
        messages = consumer.fetch(50, wait=0.25)
        if not messages:
            idle += 1
            continue
        idle = 0
        batches += 1
        if batches == die_after:  # killed mid-batch: fetched, never acknowledged
            log.write("fetched " + " ".join(str(m.seq) for m in messages) + "\\n")
            log.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        consumer.ack(*messages)
        log.write("acked " + " ".join(str(m.seq) for m in messages) + "\\n")
        log.flush()
"""


def lines_of(path: Path, kind: str) -> list[int]:
    return [int(x) for line in path.read_text().splitlines() if line.startswith(kind) for x in line.split()[1:]]


@pytest.mark.asyncio
async def test_ack_nowait_coalesces_a_turns_acks_into_one_request_and_counts_failures(api: Any, jbus: Any) -> None:
    broker, options = jbus
    publish(broker.endpoint, 299, **options)
    client = await api(api.Client(broker.endpoint, **options).connect())
    consumer = await api(client.consume("main", "quick", topics=["jobs.>"], ack_wait=30))
    inner = consumer if api.name == "async" else consumer._inner
    requests = 0
    original = inner.client.request

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal requests
        requests += 1
        return await original(*args, **kwargs)

    inner.client.request = counted
    got = 0
    for _ in range(10):  # bounded: 300 messages in batches of 100
        batch = await api(consumer.fetch(100, wait=1))
        for message in batch:
            message.ack_nowait()  # returns at once: nothing awaited per message
        got += len(batch)
        if got >= 300:
            break
    await api(consumer.flush_acks())
    assert got == 300 and consumer.ack_errors == 0
    if api.name == "async":
        assert requests == 3 + 3  # a pull and one coalesced ack request per batch of 100
    else:  # handed to the loop thread one by one: how many share a turn depends on the threads' timing
        assert 3 + 3 <= requests <= 3 + 300
    info = await api(consumer.info())
    assert (info["acked"], info["pending"]) == (300, 0)
    await api(consumer.delete())
    consumer.ack_nowait(1)  # the consumer is gone: 404, counted and logged, not raised
    await api(consumer.flush_acks())
    assert consumer.ack_errors == 1
    await api(client.close())


@pytest.mark.timeout(120)
def test_10000_messages_shared_by_3_clients_one_killed_mid_batch(tmp_path: Path) -> None:
    n = 10_000
    with BrokerProcess(config=config(tmp_path), insecure=True) as broker:
        with mc0.Client(broker.endpoint) as client:
            client.consume("main", "shared", topics=["jobs.>"], ack_wait=2.0)  # before publishing
        procs = []
        for i, die_after in enumerate((0, 0, 5)):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", CONSUMER, broker.endpoint, str(tmp_path / f"c{i}.txt"), str(die_after)],
                    stdout=subprocess.PIPE,
                    text=True,
                    env=os.environ.copy(),
                )
            )
        try:
            for proc in procs:
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            publish(broker.endpoint, n - 1)  # n records: 0..n-2 and "last"
            assert procs[2].wait(60) == -9
            for proc in procs[:2]:
                assert proc.wait(90) == 0
            with mc0.Client(broker.endpoint) as client:
                info = client.consume("main", "shared", topics=["jobs.>"], ack_wait=2.0).info()
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
    acked = [s for i in range(3) for s in lines_of(tmp_path / f"c{i}.txt", "acked")]
    killed_fetched = lines_of(tmp_path / "c2.txt", "fetched")
    assert killed_fetched and sorted(set(acked)) == list(range(1, n + 1))  # every message acked in the end
    assert (info["acked"], info["pending"], info["due"], info["ack_floor"]) == (n, 0, 0, n)  # each exactly once
    assert info["redelivered"] >= len(killed_fetched)  # the killed client's batch came back after ack_wait
    survivors = set(lines_of(tmp_path / "c0.txt", "acked")) | set(lines_of(tmp_path / "c1.txt", "acked"))
    assert set(killed_fetched) <= survivors


@pytest.mark.timeout(120)
def test_broker_kill_9_mid_stream_resumes_from_the_last_acked_position(tmp_path: Path) -> None:
    n = 2_000
    cfg = config(tmp_path)
    first = BrokerProcess(config=cfg, insecure=True).start()
    endpoint = first.endpoint
    acked: list[int] = []
    unacked: list[int] = []
    try:
        publish(endpoint, n - 1)
        with mc0.Client(endpoint) as client:
            consumer = client.consume("main", "c", topics=["jobs.>"], ack_wait=60.0)
            while len(acked) < n // 2:
                batch = consumer.fetch(100, wait=1)
                consumer.ack(*batch)  # returned: the consumer's new state is on disk
                acked += [m.seq for m in batch]
            unacked = [m.seq for m in consumer.fetch(100, wait=1)]  # delivered, never acked
            first.kill()
    finally:
        first.kill()
    assert unacked
    with BrokerProcess(config=cfg, insecure=True, bind=(endpoint,)) as second, mc0.Client(second.endpoint) as client:
        consumer = client.consume("main", "c", topics=["jobs.>"], ack_wait=60.0)
        after: list[mc0.ConsumedMessage] = []
        for _ in range(100):  # bounded
            batch = consumer.fetch(500, wait=0.5)
            if not batch:
                break
            consumer.ack(*batch)
            after += batch
    seen_after = [m.seq for m in after]
    assert not set(seen_after) & set(acked)  # no acked message redelivered
    assert sorted(acked + seen_after) == list(range(1, n + 1))  # no unacked message lost
    assert {m.seq: m.deliveries for m in after if m.seq in unacked} == dict.fromkeys(unacked, 2)


def mc0_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}  # rich tables: wide enough not to elide names
    return subprocess.run([sys.executable, "-m", "mc0", *args], capture_output=True, text=True, timeout=60, env=env)


def test_cli_consume_continues_where_the_last_run_stopped_and_stats_show_it(tmp_path: Path) -> None:
    with BrokerProcess(config=config(tmp_path), insecure=True) as broker:
        publish(broker.endpoint, 4)  # 5 records: 0..3 and "last"
        args = ("main", "c", "--topic", "jobs.>", "--json", "--endpoint", broker.endpoint)
        first = mc0_cli("consume", *args, "--count", "3")
        assert first.returncode == 0, first.stderr
        assert [json.loads(line)["body"] for line in first.stdout.splitlines()] == ["0", "1", "2"]
        second = mc0_cli("consume", *args, "--wait", "1")
        assert second.returncode == 0, second.stderr
        assert [json.loads(line)["body"] for line in second.stdout.splitlines()] == ["3", "last"]
        stats = mc0_cli("stats", "--json", "--endpoint", broker.endpoint)
        assert stats.returncode == 0, stats.stderr
        row = json.loads(stats.stdout)["consumers"]["main/c"]
        assert (row["acked"], row["pending"], row["ack_floor"]) == (5, 0, 5)
        table = mc0_cli("stats", "--endpoint", broker.endpoint)
        assert "durable consumers" in table.stdout and "main/c" in table.stdout
        missing = mc0_cli("consume", "nope", "c", "--count", "1", "--endpoint", broker.endpoint)
        assert missing.returncode == 1 and missing.stderr.startswith("mc0: error: 404 unknown journal 'nope'")


def test_one_identity_cannot_take_every_consumer_slot_nor_the_brokers_descriptors(tmp_path: Path) -> None:
    """With the default quotas: alice creates consumers (each saved: a state log) until 429; the
    broker's open descriptors stay bounded, and bob still creates his."""
    import psutil

    quota = 100  # max_consumers_per_identity's default
    setup = CurveSetup(tmp_path, extra=JOURNAL)
    with setup.start() as broker, mc0.Client(broker.endpoint, **setup.client_options("alice")) as alice:
        assert broker.proc is not None
        process = psutil.Process(broker.proc.pid)
        alice.consume("main", "first", topics=["jobs.>"])
        before = process.num_fds()
        created = 1
        with pytest.raises(mc0.OverLimit, match="max_consumers_per_identity"):
            for i in range(1000):  # bounded: max_consumers' default
                alice.consume("main", f"a{i}", topics=["jobs.>"])
                created += 1
        assert created == quota
        assert process.num_fds() <= before + 40  # not one per consumer (consumerfiles.MAX_OPEN_LOGS = 32)
        with mc0.Client(broker.endpoint, **setup.client_options("bob")) as bob:
            mine = bob.consume("main", "bobs", topics=["jobs.>"])
            publish(broker.endpoint, 1, **setup.client_options("bob"))
            assert [m.body for m in mine.fetch(10, wait=5.0)] == [b"0", b"last"]
            with pytest.raises(mc0.Forbidden, match="belongs to another identity"):
                bob.consume("main", "first", topics=["jobs.>"]).fetch(1, wait=0)


def test_sighup_that_removes_the_grant_withdraws_a_waiting_pull(tmp_path: Path) -> None:
    """bob waits on his consumer; the reloaded policy no longer lets him subscribe to its topics:
    the pull is answered 403 at once, and a record published after is not delivered to it."""
    import asyncio
    import signal
    import time

    import mc0.aio

    setup = CurveSetup(tmp_path, extra=JOURNAL + '[permissions.identity.bob]\nsubscribe = ["jobs.>"]\n')

    async def run(broker: BrokerProcess) -> None:
        async with mc0.aio.Client(broker.endpoint, **setup.client_options("bob")) as bob:
            consumer = await bob.consume("main", "bobs", topics=["jobs.>"], deliver="new")
            waiting = asyncio.ensure_future(consumer.fetch(10, wait=20.0))
            for _ in range(100):  # bounded: until the broker holds the pull
                if (await consumer.info())["waiting_pulls"] == 1:
                    break
                await asyncio.sleep(0.02)
            setup.config.write_text(setup.config.read_text().replace('["jobs.>"]', '["other.>"]'))
            broker.signal(signal.SIGHUP)
            started = time.monotonic()
            with pytest.raises(mc0.Forbidden, match="withdrawn by policy"):
                await asyncio.wait_for(waiting, 10)
            assert time.monotonic() - started < 5  # answered by the reload, not by the pull's 20 s wait
            publish(broker.endpoint, 1, **setup.client_options("alice"))
            with pytest.raises(mc0.Forbidden):
                await consumer.fetch(10, wait=0.5)

    with setup.start() as broker:
        asyncio.run(run(broker))
