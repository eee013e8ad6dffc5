"""Queue groups and no-echo against a real broker process: library members (sync and asyncio,
CURVE on and off), member processes killed mid-stream, and a member that stops reading."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import zmq

import mc0
from mc0.process import BrokerProcess

from .conftest import Bus, RawPeer, payload_of


async def drain_into(api: Any, sub: Any, seen: list[bytes], quiet: float = 0.3) -> None:
    """Take what ``sub`` holds until it stays quiet for ``quiet`` seconds."""
    for _ in range(100_000):
        try:
            batch = await api(sub.next_batch(1000, timeout=quiet))
        except (mc0.Timeout, mc0.ClosedError):  # quiet, or a drained subscription now empty
            return
        seen += [m.body for m in batch]


@pytest.mark.asyncio
async def test_group_members_share_messages_and_plain_subscribers_get_all(api: Any, bus: Bus) -> None:
    clients = [await api(api.Client(bus.endpoint, **bus.options).connect()) for _ in range(5)]
    *members, plain, pub = clients
    subs = [await api(m.subscribe("work.>", group="billing")) for m in members]
    everything = await api(plain.subscribe("work.>"))
    n = 3000
    for i in range(n):
        await api(pub.publish("work.item", str(i).encode()))
    await api(pub.flush(timeout=10))
    got: list[list[bytes]] = [[] for _ in subs]
    all_seen: list[bytes] = []
    for _ in range(200):
        for sub, into in zip(subs, got, strict=True):
            await drain_into(api, sub, into, quiet=0.05)
        await drain_into(api, everything, all_seen, quiet=0.05)
        if sum(map(len, got)) >= n and len(all_seen) >= n:
            break
    expected = [str(i).encode() for i in range(n)]
    assert all_seen == expected  # the plain subscriber: every message, in order
    merged = sorted((b for into in got for b in into), key=int)
    assert merged == expected  # each message to exactly one member
    assert all(len(into) > n // 10 for into in got)  # and shared among them
    assert all(into == sorted(into, key=int) for into in got)  # each member's share in order
    first = await api(subs[0].next(timeout=0.2)) if subs[0].pending else None
    assert first is None
    for client in clients:
        await api(client.close())


@pytest.mark.asyncio
async def test_a_group_message_carries_its_group_and_a_plain_subscription_in_the_same_client_its_own_copy(
    api: Any, bus: Bus
) -> None:
    client = await api(api.Client(bus.endpoint, **bus.options).connect())
    grouped = await api(client.subscribe("t.>", group="g"))
    plain = await api(client.subscribe("t.>"))
    assert grouped.group == "g" and plain.group is None
    await api(client.publish("t.x", b"1", confirm=True))
    a = await api(grouped.next(timeout=5))
    b = await api(plain.next(timeout=5))
    assert (a.group, a.body, b.group, b.body) == ("g", b"1", None, b"1")
    await api(client.unsubscribe(grouped))
    await api(client.publish("t.x", b"2", confirm=True))
    assert (await api(plain.next(timeout=5))).body == b"2"
    assert grouped.closed
    with pytest.raises(mc0.ClosedError):
        await api(grouped.next(timeout=0.2))
    with pytest.raises(ValueError, match="group"):
        await api(client.subscribe("t.>", group="has space"))
    with pytest.raises(ValueError, match="from_seq"):
        await api(client.subscribe("t.>", group="g", from_seq=0))
    await api(client.close())


@pytest.mark.asyncio
async def test_echo_false_never_receives_its_own_publishes(api: Any, bus: Bus) -> None:
    quiet = await api(api.Client(bus.endpoint, echo=False, **bus.options).connect())
    other = await api(api.Client(bus.endpoint, **bus.options).connect())
    mine = await api(quiet.subscribe("chat.>"))
    theirs = await api(other.subscribe("chat.>"))
    await api(quiet.publish("chat.room", b"from quiet", confirm=True))
    await api(other.publish("chat.room", b"from other", confirm=True))
    assert (await api(mine.next(timeout=5))).body == b"from other"  # not its own
    assert [(await api(theirs.next(timeout=5))).body for _ in range(2)] == [b"from quiet", b"from other"]
    with pytest.raises(mc0.Timeout):
        await api(mine.next(timeout=0.3))
    await api(quiet.close())
    await api(other.close())


@pytest.mark.asyncio
async def test_group_subscriptions_heal_after_a_broker_restart(api: Any) -> None:
    first = BrokerProcess(insecure=True).start()
    endpoint = first.endpoint
    try:
        member = await api(api.Client(endpoint, ttl=0.2, timeout=3).connect())
        sub = await api(member.subscribe("t", group="g"))
        first.kill()  # a crash: no DISCONNECT
        with BrokerProcess(bind=(endpoint,), insecure=True) as second:
            pub = await api(api.Client(second.endpoint, timeout=3).connect())
            got = None
            for attempt in range(50):  # bounded: 50 x 0.1 s
                await api(pub.publish("t", str(attempt).encode(), confirm=True))
                try:
                    got = await api(sub.next(timeout=0.1))
                    break
                except mc0.Timeout:
                    continue
            assert got is not None and got.group == "g", "the group member did not heal"
            await api(pub.close())
            await api(member.close())
    finally:
        first.kill()


MEMBER = """
import sys, mc0
endpoint, out = sys.argv[1], sys.argv[2]
with mc0.Client(endpoint) as client, open(out, "w") as log:
    sub = client.subscribe("jobs.>", group="workers", max_pending=100_000)
    print("ready", flush=True)
    while True:
        for m in sub.next_batch(1000, timeout=60):
            if m.body == b"stop":
                sys.exit(0)
            log.write(m.body.decode() + "\\n")
        log.flush()
"""


def start_member(endpoint: str, out: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", MEMBER, endpoint, str(out)], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def lines(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


@pytest.mark.timeout(120)
def test_30000_messages_3_member_processes_one_killed_mid_stream(tmp_path: Path) -> None:
    """Every message to the plain subscriber; to at most one member; and once the broker has
    forgotten the killed member, every message to exactly one live member."""
    n, kill_at = 30_000, 10_000
    with BrokerProcess(insecure=True) as broker, mc0.Client(broker.endpoint) as pub:
        plain = pub.subscribe("jobs.>", max_pending=100_000)
        members = [start_member(broker.endpoint, tmp_path / f"m{i}.txt") for i in range(3)]
        try:
            for i in range(kill_at):
                pub.publish("jobs.x", str(i).encode())
            pub.flush(timeout=30)
            members[0].send_signal(signal.SIGKILL)
            members[0].wait(10)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the broker notices the closed connection
                report = json.loads(pub.request("mc0.broker", "groups", timeout=5).body)
                if sum(report.get("workers", {}).values()) == 2:
                    break
                time.sleep(0.05)
            else:
                pytest.fail(f"the broker still lists the killed member: {report}")
            for i in range(kill_at, n):
                pub.publish("jobs.x", str(i).encode())
            pub.publish("jobs.x", b"stop")  # one live member stops at it: send one per member
            pub.publish("jobs.x", b"stop")
            pub.flush(timeout=30)
            for proc in members[1:]:
                assert proc.wait(60) == 0
            seen: list[bytes] = []
            for _ in range(1000):
                seen += [m.body for m in plain.next_batch(10_000, timeout=1)]
                if len(seen) >= n + 2:
                    break
        finally:
            for proc in members:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
    assert seen[:n] == [str(i).encode() for i in range(n)]
    live = Counter(lines(tmp_path / "m1.txt") + lines(tmp_path / "m2.txt"))
    killed = Counter(lines(tmp_path / "m0.txt"))
    assert max((live + killed).values()) == 1  # never to two members
    assert all(live[i] == 1 for i in range(kill_at, n))  # after the kill: nothing lost to live members
    assert 0 < sum(killed.values()) < kill_at and sum(live.values()) > kill_at


def test_a_member_that_stops_reading_is_skipped_and_keeps_what_was_routed_to_it(
    broker: BrokerProcess, zctx: zmq.Context[Any]
) -> None:
    stalled = RawPeer(broker.endpoint, zctx)
    stalled.socket.setsockopt(zmq.RCVHWM, 1)
    assert stalled.connect(ttl=30_000)[0] == b"OK"
    stalled.send("SUB", "GROUP", "g", "ID", "s", "", "big.>")
    assert stalled.recv()[0] == b"OK"
    n, body = 600, b"x" * 65_536
    with mc0.Client(broker.endpoint) as member, mc0.Client(broker.endpoint) as pub:
        sub = member.subscribe("big.>", group="g", max_pending=n, max_pending_bytes=1 << 30)
        for i in range(n):
            pub.publish("big.data", str(i).encode() + b":" + body)
        pub.flush(timeout=30)
        taken: list[bytes] = []
        for _ in range(1000):
            try:
                taken += [m.body.split(b":")[0] for m in sub.next_batch(1000, timeout=1)]
            except mc0.Timeout:
                break
        held: list[bytes] = []
        for _ in range(n):
            try:
                frames = stalled.recv_skipping_noop(timeout=1)
            except AssertionError:  # nothing more within a second
                break
            held.append(payload_of(frames)[0].split(b":")[0])
    assert len(held) < n // 3  # passed over once its queue backed up
    assert sorted(taken + held, key=int) == [str(i).encode() for i in range(n)]  # and nothing lost
    stalled.close()


@pytest.mark.asyncio
async def test_members_joining_and_draining_mid_stream_lose_nothing(api: Any, broker: BrokerProcess) -> None:
    """A member that joins late gets a share from then on; one that leaves with drain() keeps
    what was routed to it before the broker confirmed: every message to exactly one member."""
    pub = await api(api.Client(broker.endpoint).connect())
    members = [await api(api.Client(broker.endpoint).connect()) for _ in range(3)]
    subs = [await api(m.subscribe("flow.>", group="g", max_pending=100_000)) for m in members[:2]]
    n = 6000
    got: list[list[bytes]] = [[], [], []]
    for i in range(n):
        await api(pub.publish("flow.x", str(i).encode()))
        if i == 1000:
            await api(pub.flush(timeout=10))
            subs.append(await api(members[2].subscribe("flow.>", group="g", max_pending=100_000)))
        if i == 3000:
            await api(pub.flush(timeout=10))
            await api(members[0].drain(timeout=10))  # leaves mid-stream
    await api(pub.flush(timeout=10))
    for _ in range(200):  # bounded
        for sub, into in zip(subs, got, strict=True):
            if not sub.closed or sub.pending:
                await drain_into(api, sub, into, quiet=0.05)
        if sum(map(len, got)) >= n:
            break
    merged = sorted((b for into in got for b in into), key=int)
    assert merged == [str(i).encode() for i in range(n)]  # exactly once, nothing lost
    assert got[2] and all(int(b) > 1000 for b in got[2])  # the late joiner got a share from then on
    assert got[0] and all(int(b) <= 3000 for b in got[0])  # the drained member nothing after it left
    for client in (pub, *members[1:]):
        await api(client.close())
