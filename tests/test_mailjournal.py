"""Mailboxes kept by a journal: the core over an in-memory store (no sockets, no disk, time
passed in), as tables of literal cases, bad ones included.  A "restart" is a new core on the
same store, restored as the broker does after opening its journals.  The live test with real
broker processes, CURVE keys and kill -9 is tests/test_mailjournal_live.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mc0 import config as cfg
from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.core.mailboxes import Letter, LetterUnreadable, letter_of, settled_of
from mc0.broker.storage.filestore import Journal
from mc0.broker.storage.memstore import MemoryStore
from mc0.errors import ConfigError
from mc0.message import Record
from mc0.permissions import Permissions
from mc0.protocol import batch
from mc0.settings import JournalSettings

WHO = {b"a": "alice", b"b": "bob", b"b2": "bob", b"c": "carol"}
TTL = 60.0  # seconds: the letters' mailbox_ttl_ms in these tests


def f(*parts: str | bytes) -> list[bytes]:
    return [p.encode() if isinstance(p, str) else p for p in parts]


class Bus:
    """A core whose mailboxes are kept by the in-memory journal ``letters`` (beside ``main``).
    ``queued`` stands for the shell's outbox: the bytes still waiting for a routing id."""

    def __init__(self, store: MemoryStore | None = None, now: float = 0.0, **settings: int) -> None:
        self.queued: dict[bytes, int] = {}
        self.store = store or MemoryStore("letters", JournalSettings(topics=(P.SYS_MAILBOX_PATTERN,), mailboxes=True))
        self.main = MemoryStore("main", JournalSettings(topics=("jobs.>",)))
        policy = Permissions.from_table({"identity": {"carol": {"send_to": ["nobody"]}}})
        core_settings = CoreSettings(mailbox_ttl_ms=int(TTL * 1000), **settings)
        self.core = BrokerCore(core_settings, policy, journals=[self.store, self.main], backlog=self.backlog)
        self.core.restore(now)

    def backlog(self, rid: bytes) -> int:
        return self.queued.get(rid, 0)

    def h(self, rid: bytes, frames: list[bytes], now: float = 0.0) -> list[Any]:
        return self.core.handle(rid, frames, now, WHO[rid])

    def connect(self, rid: bytes, now: float = 0.0) -> list[Any]:
        return self.h(rid, f("CONNECT", "VERSION", "1.0", "TTL", "60000", "ID", "c"), now)[1:]

    def send(self, body: str, now: float = 0.0, to: str = "bob", rid: bytes = b"a", **headers: str) -> list[Any]:
        extra = [x for k, v in headers.items() for x in (f"X-{k}", v)]
        return self.h(rid, f("PUT", "TOPIC", "cmd.run", "TO", to, "ID", body, *extra, "", body), now)

    def commit(self) -> list[Any]:
        return self.core.commit() if self.core.uncommitted else []


def bodies(out: list[Any]) -> list[bytes]:
    return [frames[-1] for _, frames in out if frames[0] == b"MESSAGE"]


# ------------------------------------------------------------------ configuration

CONFIG_CASES = [
    ("[journals.letters]\nmailboxes = true\n", None),
    ('[journals.letters]\nmailboxes = true\ntopics = ["mc0.sys.mailbox.>"]\n', None),
    ("[journals.main]\n[journals.letters]\nmailboxes = true\n", None),
    ('[journals.letters]\nmailboxes = true\ntopics = [">"]\n', "keeps nothing else"),
    ('[journals.letters]\nmailboxes = true\ntopics = ["jobs.>"]\n', "keeps nothing else"),
    ("[journals.a]\nmailboxes = true\n[journals.b]\nmailboxes = true\n", "at most one journal keeps mailboxes"),
    ('[journals.letters]\nmailboxes = "yes"\n', "must be true or false"),
    ("[journals.letters]\nmailboxes = 1\n", "must be true or false"),
]


@pytest.mark.parametrize(("text", "error"), CONFIG_CASES)
def test_config_table(text: str, error: str | None) -> None:
    if error is None:
        journals = cfg.parse(text).journals
        assert journals["letters"].mailboxes and journals["letters"].topics == (P.SYS_MAILBOX_PATTERN,)
        assert all(not j.mailboxes for name, j in journals.items() if name != "letters")
        return
    with pytest.raises(ConfigError, match=error):
        cfg.parse(text)


# ------------------------------------------------------------------ storing, and the OK at commit


def test_stored_ok_waits_for_the_commit_and_the_record_keeps_the_letter_whole() -> None:
    bus = Bus()
    bus.connect(b"a")
    assert bus.send("1", 0.0, Req="7") == []  # held: not yet committed
    (record,) = bus.store.records
    assert (record.topic, record.sender, record.parts) == (P.SYS_MAILBOX_LETTER, "alice", (b"1",))
    assert record.headers == {"X-Req": "7", "TO": "bob", "TOPIC": "cmd.run", P.MAILBOX_EXPIRES: "60000"}
    assert bus.commit() == [(b"a", P.ok_mailbox("1", "stored"))]
    assert bus.store.commits == 1
    bus.connect(b"b")  # delivered: the answer to a live letter is never held
    assert bus.send("2", 1.0) == [
        (b"b", f("MESSAGE", "TOPIC", "cmd.run", "SENDER", "alice", "TO", "bob", "", "2")),
        (b"a", P.ok_mailbox("2", "delivered")),
    ]


def test_a_failed_commit_never_settles_a_reused_seq() -> None:
    bus = Bus()
    bus.connect(b"a")
    bus.connect(b"b")
    bus.h(b"b", f("DISCONNECT"))
    bus.send("lost")  # stored, then handed to bob and recorded delivered in the same turn ...
    assert bodies(bus.connect(b"b2", 1.0)) == [b"lost"]
    bus.store.fail_writes = True
    bus.commit()  # ... and the write fails: letter and settlement are withdrawn
    bus.store.fail_writes = False
    bus.h(b"b2", f("DISCONNECT"), 2.0)
    bus.send("new", 2.0)  # gets the withdrawn letter's seq
    bus.commit()
    assert [(r.topic, r.parts) for r in bus.store.records] == [(P.SYS_MAILBOX_LETTER, (b"new",))]
    assert bodies(Bus(bus.store, now=3.0).connect(b"b", 4.0)) == [b"new"]


def test_a_settlement_whose_write_failed_is_written_at_the_next_commit() -> None:
    bus = Bus()
    bus.connect(b"a")
    bus.send("1")
    bus.commit()
    assert bodies(bus.connect(b"b", 1.0)) == [b"1"]
    bus.store.fail_writes = True
    bus.commit()
    assert bus.core.uncommitted and [r.seq for r in bus.store.records] == [1]
    bus.store.fail_writes = False
    bus.commit()
    assert json.loads(bus.store.records[-1].parts[0]) == {"delivered": [1]} and not bus.core.uncommitted


def test_a_failed_commit_is_507_and_keeps_nothing() -> None:
    bus = Bus()
    bus.connect(b"a")
    bus.send("1")
    bus.store.fail_writes = True
    ((rid, frames),) = bus.commit()
    assert rid == b"a" and frames[:5] == f("ERROR", "ID", "1", "CODE", "507")
    assert bus.core.mailboxes.report() == {} and bus.core.counters["mailbox_withdrawn"] == 1
    bus.store.fail_writes = False
    bus.send("2")
    assert bus.commit() == [(b"a", P.ok_mailbox("2", "stored"))]
    assert [r.seq for r in bus.store.records] == [1]  # the failed record's seq was reused


def test_a_letter_whose_commit_failed_is_taken_when_sent_again_with_its_msgid() -> None:
    """Its MSGID is forgotten with its record (a 507: nothing kept), so the re-send is kept, not
    answered DUPLICATE for a letter that does not exist; once committed, a repeat is a duplicate, also
    for a new core on the same journal (a restart: the journal's own dedup memory)."""
    bus = Bus()
    bus.connect(b"a")
    letter = f("PUT", "TOPIC", "cmd.run", "TO", "bob", "MSGID", "m-1", "ID", "1", "", "pay")
    bus.h(b"a", letter)
    bus.store.fail_writes = True
    ((_, frames),) = bus.commit()
    assert frames[:5] == f("ERROR", "ID", "1", "CODE", "507")
    bus.store.fail_writes = False
    bus.h(b"a", letter)
    assert bus.commit() == [(b"a", P.ok_mailbox("1", "stored"))]
    bus.h(b"a", letter)
    assert bus.commit() == [(b"a", P.ok_mailbox("1", "stored", duplicate=True))]
    restarted = Bus(store=bus.store)
    restarted.connect(b"a")
    restarted.h(b"a", letter)
    assert restarted.commit() == [(b"a", P.ok_mailbox("1", "stored", duplicate=True))]
    assert restarted.core.mailboxes.report()["bob"]["messages"] == 1


# ------------------------------------------------------------------ restart


def test_restart_brings_back_undelivered_letters_in_order_once() -> None:
    first = Bus()
    first.connect(b"a")
    for i in range(3):
        first.send(str(i), 0.5, K=str(i))
    first.send("carol's", 0.5, to="carol")
    first.commit()
    second = Bus(first.store, now=10.0)  # the broker restarted: the letters are back, nothing delivered yet
    assert second.core.mailboxes.report() == {
        "bob": {"messages": 3, "bytes": first.core.mailboxes.report()["bob"]["bytes"]},
        "carol": first.core.mailboxes.report()["carol"],
    }
    assert second.core.counters["mailbox_restored"] == 4
    out = second.connect(b"b", 11.0)
    assert out == [
        (b"b", f("MESSAGE", "TOPIC", "cmd.run", "SENDER", "alice", "TO", "bob", "X-K", str(i), "", str(i)))
        for i in range(3)
    ]
    second.commit()  # records bob's letters delivered
    assert json.loads(second.store.records[-1].parts[0]) == {"delivered": [1, 2, 3]}
    third = Bus(second.store, now=20.0)
    assert third.core.mailboxes.report() == {"carol": first.core.mailboxes.report()["carol"]}
    assert bodies(third.connect(b"b", 21.0)) == []  # delivered ones never come back
    assert bodies(third.connect(b"c", 21.0)) == [b"carol's"]


def test_the_ttl_holds_across_a_restart() -> None:
    first = Bus()
    first.connect(b"a")
    first.send("old", 0.0)
    first.send("new", 30.0)
    first.commit()
    second = Bus(first.store, now=TTL + 1)  # the old one's time passed while the broker was down
    assert second.core.counters["mailbox_expired"] == 1 and second.core.counters["mailbox_restored"] == 1
    second.commit()
    assert json.loads(second.store.records[-1].parts[0]) == {"expired": [1]}
    assert second.core.next_deadline() <= 30.0 + TTL
    second.core.tick(30.0 + TTL)  # and the new one's passes while it runs
    assert second.core.mailboxes.report() == {}
    second.commit()
    assert json.loads(second.store.records[-1].parts[0]) == {"expired": [2]}
    assert Bus(second.store, now=0.0).core.mailboxes.report() == {}  # nothing comes back, whatever the clock


@pytest.mark.parametrize(
    ("settings", "restored", "dropped"),
    [
        ({}, 3, 0),
        ({"mailbox_max_messages": 2}, 2, 1),
        ({"mailbox_max_bytes": 500}, 2, 1),
        ({"mailboxes_max_bytes": 600}, 1, 2),  # a mailbox counts MAILBOX_OVERHEAD (300) besides its letters
    ],
)
def test_the_bounds_hold_across_a_restart(settings: dict[str, int], restored: int, dropped: int) -> None:
    first = Bus()
    first.connect(b"a")
    for i in range(3):
        first.send(str(i))
    first.commit()
    size = first.core.mailboxes.report()["bob"]["bytes"] // 3
    assert 200 < size < 250  # the cases above are sized for this (LETTER_OVERHEAD included)
    second = Bus(first.store, **settings)
    assert second.core.mailboxes.report()["bob"]["messages"] == restored
    assert second.core.counters["mailbox_restore_dropped"] == dropped
    if restored < 3:  # full: the next letter is refused as before the restart
        second.connect(b"a")
        ((_, frames),) = second.send("more")
        assert frames[:5] == f("ERROR", "ID", "more", "CODE", "429")
    assert bodies(second.connect(b"b")) == [str(i).encode() for i in range(restored)]  # the oldest kept


# ------------------------------------------------------------------ unreadable records


def record(seq: int, topic: str, headers: dict[str, str], *parts: bytes, sender: str = "alice") -> Record:
    return Record(seq, 0.0, topic, sender, headers, parts)


GOOD = {"TO": "bob", "TOPIC": "cmd.run", P.MAILBOX_EXPIRES: "60000"}
UNREADABLE = [
    record(1, P.SYS_MAILBOX_LETTER, {"TOPIC": "cmd.run", P.MAILBOX_EXPIRES: "60000"}),
    record(1, P.SYS_MAILBOX_LETTER, {**GOOD, P.MAILBOX_EXPIRES: "soon"}),
    record(1, P.SYS_MAILBOX_LETTER, {**GOOD, "TO": "bob b"}),
    record(1, P.SYS_MAILBOX_LETTER, {**GOOD, "TOPIC": "bad..topic"}),
    record(1, P.SYS_MAILBOX_SETTLED, {}, b"not json"),
    record(1, P.SYS_MAILBOX_SETTLED, {}, b'{"eaten": [1]}'),
    record(1, P.SYS_MAILBOX_SETTLED, {}, b'{"delivered": ["x"]}'),
    record(1, P.SYS_MAILBOX_SETTLED, {}, b"[1, 2]"),
    record(1, "jobs.x", {}, b"a stray record"),
]


def test_record_readers_accept_the_good_ones() -> None:
    to, letter = letter_of(record(4, P.SYS_MAILBOX_LETTER, {**GOOD, "X-K": "v"}, b"x"), 0.0)
    frames = f("MESSAGE", "TOPIC", "cmd.run", "SENDER", "alice", "TO", "bob", "X-K", "v", "", "x")
    assert (to, letter) == ("bob", Letter(60.0, batch.frames_record(frames), 4)) and letter.frames == frames
    assert settled_of(record(5, P.SYS_MAILBOX_SETTLED, {}, b'{"delivered":[1],"expired":[2,3]}')) == {
        "delivered": [1],
        "expired": [2, 3],
    }


@pytest.mark.parametrize("bad", UNREADABLE, ids=lambda r: f"{r.topic}:{r.headers}:{r.parts}")
def test_an_unreadable_record_is_counted_and_stops_nothing_else(bad: Record, caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore("letters", JournalSettings(topics=(P.SYS_MAILBOX_PATTERN,), mailboxes=True))
    store.append(P.SYS_MAILBOX_LETTER, "alice", GOOD, [b"before"])
    store.append(bad.topic, bad.sender, bad.headers, list(bad.parts))
    store.append(P.SYS_MAILBOX_LETTER, "alice", GOOD, [b"after"])
    store.commit()
    if bad.topic == P.SYS_MAILBOX_SETTLED:
        with pytest.raises(LetterUnreadable):
            settled_of(bad)
    elif bad.topic == P.SYS_MAILBOX_LETTER:
        with pytest.raises(LetterUnreadable):
            letter_of(bad, 0.0)
    bus = Bus(store)
    assert bus.core.counters["mailbox_record_unreadable"] == 1
    assert "journal letters: mailboxes: record 2 unreadable, skipped" in caplog.text
    assert bodies(bus.connect(b"b", 1.0)) == [b"before", b"after"]


# ------------------------------------------------------------------ delivered: recorded once it left


def test_delivery_is_recorded_only_once_the_session_queue_is_empty() -> None:
    bus = Bus()
    bus.connect(b"a")
    bus.send("1")
    bus.send("2")
    bus.commit()
    bus.queued[b"b"] = 100
    assert bodies(bus.connect(b"b", 1.0)) == [b"1", b"2"]
    before = len(bus.store.records)
    bus.commit()
    assert len(bus.store.records) == before and bus.core.uncommitted  # still in the shell's queue
    bus.queued[b"b"] = 0
    bus.commit()
    assert json.loads(bus.store.records[-1].parts[0]) == {"delivered": [1, 2]}
    assert not bus.core.uncommitted


def test_a_session_that_goes_before_its_letters_left_gets_them_kept_again() -> None:
    bus = Bus()
    bus.connect(b"a")
    bus.send("1")
    bus.commit()
    bus.queued[b"b"] = 100  # nothing ever leaves (a peer that stopped reading)
    assert bodies(bus.connect(b"b", 1.0)) == [b"1"]
    bus.h(b"b", f("DISCONNECT"), 2.0)
    assert bus.core.mailboxes.report()["bob"]["messages"] == 1
    assert bus.core.counters["mailbox_kept_again"] == 1
    assert bodies(bus.connect(b"b2", 3.0)) == [b"1"]  # at least once
    bus.commit()
    assert json.loads(bus.store.records[-1].parts[0]) == {"delivered": [1]}


def test_without_a_mailbox_journal_letters_stay_in_memory_and_the_ok_is_at_once() -> None:
    store = MemoryStore("main", JournalSettings(topics=(">",)))
    core = BrokerCore(CoreSettings(), journals=[store])
    core.restore(0.0)
    core.handle(b"a", f("CONNECT", "VERSION", "1.0", "TTL", "60000", "ID", "c"), 0.0, "alice")
    out = core.handle(b"a", f("PUT", "TOPIC", "t", "TO", "bob", "ID", "1", "", "x"), 0.0, "alice")
    assert out == [(b"a", P.ok_mailbox("1", "stored"))]
    assert store.records == [] and not core.uncommitted
    assert core.mailboxes.summary() == {
        "identities": 1,
        "messages": 1,
        "bytes": core.mailboxes.total_bytes,
        "journal": None,
    }


# ------------------------------------------------------------------ retention, privacy, stats


def test_retention_keeps_the_oldest_kept_letter_then_lets_go() -> None:
    bus = Bus()
    bus.store.settings = JournalSettings(topics=(P.SYS_MAILBOX_PATTERN,), mailboxes=True, max_bytes=1)
    bus.connect(b"a")
    bus.send("1")
    bus.send("2")
    bus.commit()
    bus.core.tick(1.0)
    assert bus.store.enforce_retention(10.0) == 0 and bus.store.first_seq == 1  # pinned by letter 1
    bus.connect(b"b", 2.0)
    bus.commit()  # delivered: recorded
    bus.core.tick(3.0)
    assert bus.store.floor is None
    assert bus.store.enforce_retention(10.0) == 2  # all but the newest record (the settlement)


PRIVATE_CASES = [
    f("SUB", "JOURNAL", "letters", "FROM", "0", "ID", "s", "", "mc0.sys.mailbox.>"),
    f("SUB", "FROM", "0", "ID", "s", "", "mc0.sys.mailbox.>"),
    f("REQUEST", "SERVICE", "mc0.journal", "ID", "s", "", '{"op": "fetch", "journal": "letters"}'),
    f("REQUEST", "SERVICE", "mc0.consumer", "ID", "s", "", '{"op": "create", "journal": "letters", "name": "x"}'),
]


@pytest.mark.parametrize("ask", PRIVATE_CASES, ids=lambda frames: frames[0].decode() + " " + frames[-1].decode())
def test_the_mailbox_journal_cannot_be_read(ask: list[bytes]) -> None:
    bus = Bus()
    bus.connect(b"a")
    bus.send("secret")
    bus.commit()
    bus.connect(b"c")
    ((_, frames),) = bus.h(b"c", ask)
    text = b" ".join(frames)
    assert frames[0] == b"ERROR"
    assert b"403" in text and b"keeps mailboxes" in text


def test_stats_report_the_kept_letters() -> None:
    bus = Bus()
    bus.connect(b"a")
    bus.send("1")
    bus.commit()
    stats = bus.core.report("stats")
    assert isinstance(stats, dict)
    assert stats["mailboxes"] == {
        "identities": 1,
        "messages": 1,
        "bytes": bus.core.mailboxes.total_bytes,
        "journal": "letters",
    }
    assert stats["journals"]["letters"]["records"] == 1


def test_the_file_journal_keeps_every_segment_from_the_floor_on(tmp_path: Path) -> None:
    settings = JournalSettings(
        topics=(P.SYS_MAILBOX_PATTERN,), mailboxes=True, folder=str(tmp_path / "j"), segment_bytes=4096, max_bytes=4096
    )
    journal = Journal("letters", settings).open()
    try:
        journal.append(P.SYS_MAILBOX_LETTER, "alice", GOOD, [b"kept"])
        journal.retain_from(1)
        for _ in range(40):  # ~20 KiB: rolls a segment every ~4 KiB, and each roll runs retention
            journal.append(P.SYS_MAILBOX_SETTLED, "", {}, [b"x" * 500])
        journal.commit()
        assert journal.first_seq == 1 and journal.info()["segments"] == 6
        journal.retain_from(None)  # delivered: retention may go back to its limits
        assert journal.enforce_retention(journal.clock()) == 5 and journal.first_seq > 1
    finally:
        journal.close()


def test_a_crash_before_the_delivered_record_delivers_again_at_least_once() -> None:
    first = Bus()
    first.connect(b"a")
    first.send("1")
    first.commit()
    first.queued[b"b"] = 100  # handed over, still in the shell's queue ...
    assert bodies(first.connect(b"b", 1.0)) == [b"1"]
    first.commit()
    second = Bus(first.store, now=2.0)  # ... when the broker is killed: no delivered record
    assert bodies(second.connect(b"b", 3.0)) == [b"1"]
    second.commit()
    assert bodies(Bus(second.store, now=4.0).connect(b"b", 5.0)) == []
