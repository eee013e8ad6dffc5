"""Mailboxes (PUT TO identity): the core as a table (no sockets, time passed in), then real
clients under CURVE with real keys on the sync and asyncio APIs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.core.mailboxes import MAILBOX_OVERHEAD
from mc0.permissions import Permissions
from mc0.protocol import batch

from .conftest import CurveSetup


def f(*parts: str | bytes) -> list[bytes]:
    return [p.encode() if isinstance(p, str) else p for p in parts]


def connect(core: BrokerCore, rid: bytes, who: str, now: float = 0.0, version: str = "1.0", *extra: str) -> list:
    return core.handle(rid, f("CONNECT", "VERSION", version, "TTL", "60000", *extra, "ID", "c"), now, who)


WHO = {b"a": "alice", b"b": "bob", b"b1": "bob", b"b2": "bob", b"e": "eve", b"c": "carol"}


def h(core: BrokerCore, rid: bytes, frames: list[bytes], now: float = 0.0) -> list:
    """A message from ``rid`` under its CURVE identity (the shell stamps each message with it)."""
    return core.handle(rid, frames, now, WHO[rid])


def frames_of(item: object) -> list[bytes]:
    if isinstance(item, bytes):
        ((code, start, end),) = batch.records(item)
        return batch.frames_of(item, code, start, end)
    assert isinstance(item, list)
    return item


def small_core(**settings: int) -> BrokerCore:
    policy = Permissions.from_table({"identity": {"eve": {"send_to": ["node.>"]}}})
    return BrokerCore(CoreSettings(**settings), policy)


# (sender's protocol, the PUT after CONNECT, the answer's first frames)
PUT_TO_CASES = [
    ("1.0", f("PUT", "TOPIC", "cmd.run", "TO", "bob", "ID", "1", "", "x"), f("OK", "ID", "1", "MAILBOX", "stored")),
    ("1.0", f("PUT", "TOPIC", "cmd.run", "TO", "bob b", "ID", "1", "", "x"), f("ERROR", "ID", "1", "CODE", "400")),
    ("1.0", f("PUT", "TOPIC", "cmd.run", "TO", "", "ID", "1", "", "x"), f("ERROR", "ID", "1", "CODE", "400")),
    ("1.0", f("PUT", "TOPIC", "cmd.run", "TO", "b" * 256, "ID", "1", "", "x"), f("ERROR", "ID", "1", "CODE", "400")),
    (  # a letter's MSGID: as a journaled PUT's (it was a 400)
        "1.0",
        f("PUT", "TOPIC", "cmd.run", "TO", "bob", "MSGID", "m", "ID", "1", "", "x"),
        f("OK", "ID", "1", "MAILBOX", "stored"),
    ),
    ("1.0", f("PUT", "TOPIC", "bad..topic", "TO", "bob", "ID", "1", "", "x"), f("ERROR", "ID", "1", "CODE", "400")),
    ("1.0", f("PUT", "TOPIC", "mc0.sys.x", "TO", "bob", "ID", "1", "", "x"), f("ERROR", "ID", "1", "CODE", "403")),
    ("0.3", f("PUT", "TOPIC", "cmd.run", "TO", "bob", "ID", "1", "", "x"), f("ERROR", "ID", "1", "CODE", "400")),
]


@pytest.mark.parametrize(("version", "put", "answer"), PUT_TO_CASES)
def test_put_to_table(version: str, put: list[bytes], answer: list[bytes]) -> None:
    core = small_core()
    connect(core, b"a", "alice", version=version)
    ((rid, frames),) = h(core, b"a", put, 0.0)
    assert rid == b"a" and frames[: len(answer)] == answer
    if answer[0] == b"ERROR":
        assert core.mailboxes.report() == {}  # refused: nothing kept


def letter(msgid: str, rid: str, body: str = "x") -> list[bytes]:
    return f("PUT", "TOPIC", "cmd.run", "TO", "bob", "MSGID", msgid, "ID", rid, "", body)


def test_a_letter_sent_again_with_its_msgid_is_taken_once_within_the_window() -> None:
    """Per sender and MSGID, as a journaled PUT: the repeat is answered as the first was, DUPLICATE 1,
    and nothing is kept or delivered again; another sender's MSGID is its own; past the window (a
    journal's default dedup_window_s without a mailbox journal) it is a new letter."""
    core = small_core()
    connect(core, b"a", "alice")
    connect(core, b"c", "carol")
    assert h(core, b"a", letter("m1", "1"), 0.0) == [(b"a", f("OK", "ID", "1", "MAILBOX", "stored"))]
    again = h(core, b"a", letter("m1", "2"), 1.0)
    assert again == [(b"a", f("OK", "ID", "2", "MAILBOX", "stored", "DUPLICATE", "1"))]
    assert core.mailboxes.report()["bob"]["messages"] == 1 and core.counters["letter_duplicates"] == 1
    connect(core, b"b", "bob", 2.0)  # (its kept letter goes to it)
    delivered = h(core, b"a", letter("m2", "3", "now"), 3.0)
    assert [frames[0] for rid, frames in delivered] == [b"MESSAGE", b"OK"]
    assert h(core, b"a", letter("m2", "4", "now"), 4.0) == [
        (b"a", f("OK", "ID", "4", "MAILBOX", "delivered", "DUPLICATE", "1"))
    ]
    carols = h(core, b"c", letter("m2", "5", "hers"), 5.0)
    assert [frames[0] for rid, frames in carols] == [b"MESSAGE", b"OK"]  # carol's own MSGID space
    window = core.mailboxes.letter_ids.window_s
    later = h(core, b"a", letter("m2", "6", "later"), 3.0 + window + 1)
    assert [frames[0] for rid, frames in later] == [b"MESSAGE", b"OK"]  # past the window: a new letter
    assert core.counters["letter_duplicates"] == 2


def test_the_letter_ids_remembered_are_bounded() -> None:
    from mc0.broker.core.letterids import LetterIds

    ids = LetterIds(window_s=60, max_ids=3)
    for i in range(10):
        ids.remember("alice", f"m{i}", "stored", float(i))
    assert len(ids) == 3 and ids.outcome_of("alice", "m0", 10.0) is None
    assert ids.outcome_of("alice", "m9", 10.0) == "stored" and ids.outcome_of("bob", "m9", 10.0) is None
    assert ids.outcome_of("alice", "m9", 70.0) is None  # past the window
    none = LetterIds(window_s=0, max_ids=3)
    none.remember("alice", "m", "stored", 0.0)
    assert len(none) == 0


def test_online_identity_gets_it_now_and_nobody_else_does() -> None:
    core = small_core()
    connect(core, b"a", "alice")
    connect(core, b"b1", "bob")
    connect(core, b"b2", "bob")  # bob's newest session
    h(core, b"b1", f("SUB", "", ">"), 0.0)  # a wildcard subscriber never sees direct messages
    out = h(core, b"a", f("PUT", "TOPIC", "cmd.run", "TO", "bob", "ID", "1", "X-K", "v", "", "x"), 0.0)
    assert out == [
        (b"b2", f("MESSAGE", "TOPIC", "cmd.run", "SENDER", "alice", "TO", "bob", "X-K", "v", "", "x")),
        (b"a", P.ok_mailbox("1", "delivered")),
    ]
    h(core, b"b2", f("DISCONNECT"), 0.0)
    ((rid, _), _) = h(core, b"a", f("PUT", "TOPIC", "cmd.run", "TO", "bob", "ID", "2", "", "y"), 0.0)
    assert rid == b"b1"  # the other session still is bob


def test_kept_while_offline_then_delivered_after_the_connect_ok_in_order() -> None:
    core = small_core()
    connect(core, b"a", "alice")
    for i in range(3):
        assert h(core, b"a", f("PUT", "TOPIC", "t", "TO", "bob", "ID", str(i), "", str(i)), 0.0) == [
            (b"a", P.ok_mailbox(str(i), "stored"))
        ]
    assert core.mailboxes.report() == {"bob": {"messages": 3, "bytes": core.mailboxes.total_bytes - MAILBOX_OVERHEAD}}
    out = connect(core, b"b", "bob", 1.0, "1.0", "BATCH", "1")
    assert [frames_of(item)[0] for _, item in out] == [b"OK", b"MESSAGE", b"MESSAGE", b"MESSAGE"]
    assert [frames_of(item)[-1] for _, item in out[1:]] == [b"0", b"1", b"2"]
    assert core.mailboxes.report() == {} and core.mailboxes.total_bytes == 0


@pytest.mark.parametrize(
    ("settings", "sizes", "refused_at", "needle"),
    [
        ({"mailbox_max_messages": 2}, [1, 1, 1], 2, "mailbox of bob is full (2 messages"),
        # a letter counts its bytes (~570 for a 500-byte body) and LETTER_OVERHEAD (150)
        ({"mailbox_max_bytes": 1600}, [500, 500, 500], 2, "the limits are 1000 messages, 1600 bytes"),
        # and a mailbox MAILBOX_OVERHEAD (300): 300 + 2 x 1120 fit in 3000, a third does not
        ({"mailboxes_max_bytes": 3000}, [900, 900, 900], 2, "mailboxes hold"),
    ],
)
def test_bounds_are_a_clear_429_and_keep_nothing(
    settings: dict[str, int], sizes: list[int], refused_at: int, needle: str
) -> None:
    core = small_core(**settings)
    connect(core, b"a", "alice")
    for i, size in enumerate(sizes):
        ((_, frames),) = h(core, b"a", f("PUT", "TOPIC", "t", "TO", "bob", "ID", str(i), "", "x" * size), 0.0)
        if i < refused_at:
            assert frames[:5] == f("OK", "ID", str(i), "MAILBOX", "stored")
        else:
            assert frames[:5] == f("ERROR", "ID", str(i), "CODE", "429") and needle in frames[-1].decode()
    assert core.mailboxes.report()["bob"]["messages"] == refused_at


def test_letters_expire_after_the_ttl() -> None:
    core = small_core(mailbox_ttl_ms=1000)
    connect(core, b"a", "alice")
    h(core, b"a", f("PUT", "TOPIC", "t", "TO", "bob", "", "old"), 0.0)
    h(core, b"a", f("PUT", "TOPIC", "t", "TO", "bob", "", "new"), 0.8)
    assert core.next_deadline() <= 1.0
    core.tick(1.0)
    assert core.mailboxes.report()["bob"]["messages"] == 1
    out = connect(core, b"b", "bob", 1.5)
    assert [item[-1] for _, item in out[1:]] == [b"new"]
    assert core.counters["mailbox_expired"] == 1


# (letters, identities they go to, body bytes): every letter to its own identity costs the most
MEMORY_SHAPES = [(20_000, 20_000, 1), (20_000, 20, 1), (5_000, 5_000, 1_000), (5_000, 1, 1_000)]


@pytest.mark.parametrize(("letters", "identities", "size"), MEMORY_SHAPES)
def test_the_bounds_count_what_kept_letters_cost(letters: int, identities: int, size: int) -> None:
    """tracemalloc: the Python memory the kept letters hold is at most what the bounds count
    (1-byte letters used to count ~47 bytes each and cost ~1.3 KB)."""
    import gc
    import tracemalloc

    core = small_core(mailbox_max_messages=letters, mailbox_max_bytes=1 << 40, mailboxes_max_bytes=1 << 40)
    connect(core, b"a", "alice")
    puts = [f("PUT", "TOPIC", "t.x", "TO", f"node{i % identities}", "", b"x" * size) for i in range(letters)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for put in puts:
            assert core.handle(b"a", put, 0.0, "alice") == []
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = core.mailboxes.total_bytes
    assert core.mailboxes.summary()["messages"] == letters
    assert held <= counted, f"{held / letters:.0f} bytes held per letter, {counted / letters:.0f} counted"
    assert counted <= 2 * held + letters * size  # and not wildly more


@pytest.mark.timeout(150)
def test_kept_letters_cost_what_the_bounds_count_in_a_real_broker(broker: Any) -> None:
    """200,000 one-byte letters to as many offline identities: the broker's RSS grows by at most
    max(128 MiB, twice what the bounds count)."""
    import asyncio

    import psutil

    process = psutil.Process(broker.proc.pid)
    letters = 200_000

    async def send() -> int:
        async with mc0.aio.Client(broker.endpoint) as client:
            for i in range(letters - 1):
                await client.send_to(f"node{i}", "t.x", b"x")
            # all before it are kept once this one is
            assert await client.send_to("last", "t.x", b"x", confirm=True, timeout=60) == "stored"
            stats = json.loads((await client.request("mc0.broker", b"stats")).body)
            return int(stats["mailboxes"]["bytes"]) if stats["mailboxes"]["messages"] == letters else -1

    before = process.memory_info().rss
    counted = asyncio.run(asyncio.wait_for(send(), 120))
    grown = process.memory_info().rss - before
    assert counted > 0
    assert grown <= max(128 << 20, 2 * counted), f"RSS +{grown >> 20} MiB, counted {counted >> 20} MiB"


def test_send_to_needs_the_grant() -> None:
    core = small_core()
    connect(core, b"e", "eve")
    ((_, frames),) = h(core, b"e", f("PUT", "TOPIC", "t", "TO", "bob", "ID", "1", "", "x"), 0.0)
    assert frames[:5] == f("ERROR", "ID", "1", "CODE", "403") and b"eve may not send to bob" in frames[-1]
    ((_, frames),) = h(core, b"e", f("PUT", "TOPIC", "t", "TO", "node.7", "ID", "2", "", "x"), 0.0)
    assert frames == P.ok_mailbox("2", "stored")


# ------------------------------------------------------------------ live, CURVE with real keys


@pytest.mark.asyncio
async def test_to_an_offline_identity_then_delivered_when_it_connects(api: Any, tmp_path: Path) -> None:
    setup = CurveSetup(tmp_path, extra='mailbox_max_messages = 3\n[permissions.identity.carol]\nsend_to = ["alice"]\n')
    with setup.start() as broker:
        alice = await api(api.Client(broker.endpoint, **setup.client_options("alice")).connect())
        assert await api(alice.send_to("bob", "cmd.restart", b"now", confirm=True)) == "stored"
        await api(alice.send_to("bob", "cmd.status", b"please", headers={"X-Req": "7"}))
        await api(alice.flush(timeout=5))
        bob = await api(api.Client(broker.endpoint, **setup.client_options("bob")).connect())
        first = await api(bob.mailbox.next(timeout=5))
        second = await api(bob.mailbox.next(timeout=5))
        assert (first.topic, first.body, first.sender) == ("cmd.restart", b"now", "alice")
        assert (second.body, second.headers) == (b"please", {"X-Req": "7"})
        assert await api(alice.send_to("bob", "cmd.x", b"live", confirm=True)) == "delivered"
        assert (await api(bob.mailbox.next(timeout=5))).body == b"live"
        await api(bob.close())
        for i in range(3):
            await api(alice.send_to("bob", "t", str(i).encode(), confirm=True))
        with pytest.raises(mc0.OverLimit, match="mailbox of bob is full"):
            await api(alice.send_to("bob", "t", b"one too many", confirm=True))
        carol = await api(api.Client(broker.endpoint, **setup.client_options("carol")).connect())
        with pytest.raises(mc0.Forbidden, match="carol may not send to bob"):
            await api(carol.send_to("bob", "t", b"x", confirm=True))
        report = json.loads((await api(alice.request("mc0.broker", "mailboxes", timeout=5))).body)
        assert report["bob"]["messages"] == 3
        await api(carol.close())
        await api(alice.close())


def test_cli_pub_to_says_whether_it_was_delivered_or_stored(broker: Any) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "mc0", "pub", "cmd.run", "x", "--to", "bob", "--confirm", "--endpoint", broker.endpoint],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "bob: stored"


@pytest.mark.timeout(60)
def test_a_confirmed_letter_gets_an_automatic_msgid_and_a_broker_from_before_gets_it_without() -> None:
    """The library gives a confirmed letter without a MSGID one of its own (its prefix and the request's
    id), as a confirmed publish; a broker from before letters took MSGIDs answered 400 naming that: the
    letter is sent again without one.  A bare ROUTER plays that broker."""
    import threading

    import zmq

    from mc0 import ports

    context: zmq.Context[Any] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = ports.free_port()
    router.bind(f"tcp://127.0.0.1:{port}")
    puts: list[dict[str, str]] = []

    def old_broker() -> None:
        for _ in range(200):  # bounded: a CONNECT, two PUTs, heartbeats
            if not router.poll(10_000):
                return
            rid, *frames = router.recv_multipart()
            command = P.decode(frames, sender=P.Side.PEER)
            if command.verb is P.Verb.CONNECT:
                router.send_multipart([rid, *f("OK", "ID", command.headers["ID"], "TTL", "60000")])
            elif command.verb is P.Verb.PUT:
                puts.append(dict(command.headers))
                rid_ = command.headers["ID"]
                if "MSGID" in command.headers:
                    old = f("ERROR", "ID", rid_, "CODE", "400", "MESSAGE", "MSGID is for journaled topics, not for TO")
                    router.send_multipart([rid, *old])
                else:
                    router.send_multipart([rid, *f("OK", "ID", rid_, "MAILBOX", "stored")])
                    return

    serving = threading.Thread(target=old_broker, daemon=True)
    serving.start()
    try:
        with mc0.Client(f"tcp://127.0.0.1:{port}", timeout=10) as client:
            assert client.send_to("bob", "cmd.run", b"x", confirm=True) == "stored"
            prefix = client._inner.auto_msgid_prefix
        serving.join(10)
        first, second = puts
        assert first["MSGID"] == prefix + first["ID"] and first["TO"] == "bob"
        assert "MSGID" not in second and second["TO"] == "bob"
    finally:
        router.close(0)
        context.term()


def test_the_letter_ids_are_bounded_in_bytes_too() -> None:
    """A MSGID has no length bound of its own: the memory counts what it keeps."""
    from mc0.broker.core.letterids import LetterIds

    ids = LetterIds(window_s=60, max_ids=1000, max_bytes=10_000)
    for i in range(50):
        ids.remember("alice", f"{i:04d}" + "x" * 996, "stored", float(i))
    assert ids.bytes <= 10_000 and len(ids) == 9
    ids.forget("alice", "0049" + "x" * 996)
    assert len(ids) == 8 and ids.outcome_of("alice", "0049" + "x" * 996, 50.0) is None
