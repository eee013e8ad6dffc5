"""The journal on real files (a fake wall clock), and the broker core with journals (no sockets).

The core's tests use the in-memory store (the core only sees the JournalStore
port); those about disk failures under the core use the real files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.core.journaling import holds_dead_letters
from mc0.broker.storage.filestore import Journal, JournalSettings, Trimmed
from mc0.broker.storage.memstore import MemoryStore
from mc0.broker.storage.port import JournalError, JournalStore
from mc0.config import parse
from mc0.errors import ConfigError
from mc0.permissions import Permissions
from mc0.topics import pattern_matches, split_pattern, split_topic

from .conftest import headers_of, payload_of
from .test_core import connect, f


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def journal(tmp_path: Path, clock: Clock | None = None, **settings: object) -> Journal:
    options = {"folder": str(tmp_path / "j"), **settings}
    return Journal("main", JournalSettings(**options), clock=clock or Clock()).open()  # type: ignore[arg-type]


def fill(j: Journal, n: int, topic: str = "a.b", size: int = 10) -> list[int]:
    seqs = [j.append(topic, "alice", {"X-i": str(i)}, [str(i).encode().ljust(size, b".")]) for i in range(n)]
    j.commit()
    return seqs


# ------------------------------------------------------------------ the journal itself


def test_append_assigns_consecutive_seqs_and_read_returns_exact_ranges(tmp_path: Path) -> None:
    j = journal(tmp_path)
    assert (j.first_seq, j.next_seq) == (1, 1)
    assert fill(j, 10) == list(range(1, 11))
    records, next_seq = j.read(3, 7)
    assert [r.seq for r in records] == [3, 4, 5, 6] and next_seq == 7
    assert records[0].topic == "a.b" and records[0].sender == "alice" and records[0].headers == {"X-i": "2"}
    assert records[0].body.startswith(b"2.")
    assert j.read(3, 7) == (records, next_seq)  # deterministic
    assert j.read(11) == ([], 11)  # at the end
    assert j.read(50) == ([], 50)  # beyond the end: nothing, continue there


def test_read_filters_topics_and_bounds_each_page(tmp_path: Path) -> None:
    j = journal(tmp_path)
    for i in range(20):
        j.append("even" if i % 2 == 0 else "odd", "a", {}, [b"x" * 100])
    records, next_seq = j.read(1, None, lambda t: t == "odd")
    assert [r.seq for r in records] == list(range(2, 21, 2)) and next_seq == 21
    records, next_seq = j.read(1, max_records=5)
    assert [r.seq for r in records] == [1, 2, 3, 4, 5] and next_seq == 6
    records, next_seq = j.read(1, max_bytes=300)  # ~124 bytes a record
    assert 1 <= len(records) <= 3 and next_seq == 1 + len(records)
    records, _ = j.read(1, max_bytes=1)
    assert len(records) == 1  # always at least one record


def test_a_segment_at_seq_0_is_refused_naming_it(tmp_path: Path) -> None:
    """Seqs start at 1 (the port's contract, which a seq-or-token answer relies on): a folder with a segment
    numbered 0 (made by hand, or copied wrong) is refused at open, naming the file, and left as it was."""
    folder = tmp_path / "j"
    folder.mkdir()
    (folder / f"{0:020d}.seg").write_bytes(b"")
    with pytest.raises(JournalError, match=r"journal j: .*00000000000000000000\.seg starts at seq 0; seqs start at 1"):
        Journal("j", JournalSettings(folder=str(folder))).open()
    assert sorted(p.name for p in folder.iterdir()) == [f"{0:020d}.seg"]


def test_segments_roll_and_reads_cross_them(tmp_path: Path) -> None:
    j = journal(tmp_path, segment_bytes=4096, max_bytes=0)
    fill(j, 300, size=50)
    assert j.info()["segments"] > 3
    records, next_seq = j.read(1, max_records=1000, max_bytes=1 << 30)
    assert [r.seq for r in records] == list(range(1, 301)) and next_seq == 301
    j.close()
    again = journal(tmp_path, segment_bytes=4096, max_bytes=0)
    assert (again.first_seq, again.next_seq) == (1, 301)
    assert [r.seq for r in again.read(120, 130)[0]] == list(range(120, 130))


def test_purge_drops_whole_and_partial_segments_and_the_journal_goes_on(tmp_path: Path) -> None:
    j = journal(tmp_path, segment_bytes=4096, max_bytes=0, dedup_window_s=60)
    fill(j, 200, size=50)
    j.append("a.b", "alice", {"MSGID": "m1"}, [b"x"])  # seq 201, not committed yet
    assert j.info()["segments"] > 3
    assert j.purge(150) == 149  # whole segments, then the one holding 150 written anew from 150
    assert (j.first_seq, j.next_seq) == (150, 202)
    with pytest.raises(Trimmed):
        j.read(149)
    assert [r.seq for r in j.read(150, max_records=1000, max_bytes=1 << 30)[0]] == list(range(150, 202))
    assert j.purge(100) == 0  # nothing before 150 is left
    j.close()
    again = journal(tmp_path, segment_bytes=4096, max_bytes=0, dedup_window_s=60)
    assert (again.first_seq, again.next_seq) == (150, 202)
    assert [r.headers["X-i"] for r in again.read(150, 152)[0]] == ["149", "150"]
    assert again.purge() == 52  # every record: the journal goes on at its next seq
    assert (again.first_seq, again.next_seq) == (202, 202) and again.info()["records"] == 0
    assert again.duplicate_of("alice", "m1") == 201  # a retry of a purged message is still its duplicate
    assert again.append("a.b", "alice", {}, [b"new"]) == 202
    again.commit()
    again.close()
    third = journal(tmp_path, segment_bytes=4096, max_bytes=0)
    assert (third.first_seq, third.next_seq) == (202, 203)
    assert [p.name for p in (tmp_path / "j").iterdir() if p.suffix == ".seg"] == [f"{202:020d}.seg"]


def test_purge_within_the_active_segment_keeps_appending_there(tmp_path: Path) -> None:
    j = journal(tmp_path)
    fill(j, 10)
    assert j.purge(4) == 3
    assert (j.first_seq, j.next_seq) == (4, 11)
    assert j.append("a.b", "alice", {}, [b"more"]) == 11
    j.commit()
    assert [r.seq for r in j.read(4)[0]] == list(range(4, 12))
    assert j.purge(20) == 8  # beyond the end: empty, and it goes on at 20
    assert (j.first_seq, j.next_seq) == (20, 20)


def test_a_local_copy_purged_to_the_streams_first_seq_skips_what_arrives_before_it(tmp_path: Path) -> None:
    from mc0.broker.jetstream.replicated import ReplicatedJournal
    from mc0.protocol.journalrecords import encode_payload

    settings = JournalSettings(folder=str(tmp_path / "copy"), store="jetstream")
    copy = ReplicatedJournal("main", settings).open()
    copy.stream_state(1, 0, "made", 1)
    payload = encode_payload("a.b", "alice", {}, [b"x"])
    for seq in range(1, 6):
        assert copy.arrived(seq, 1.0, payload)
    copy.flush()
    assert copy.purge(9) == 5  # the stream was purged before 9: the copy lagged (it had up to 5)
    assert (copy.first_seq, copy.next_seq, copy.stored_next_seq) == (9, 9, 9)
    assert not copy.arrived(7, 1.0, payload)  # delivered late, purged meanwhile: skipped
    assert copy.arrived(9, 1.0, payload)
    assert copy.info()["first_seq"] == 9 and copy.info()["records"] == 1
    # The other way round: records after the purge reached the copy before the purge did.
    for seq in range(10, 13):
        copy.arrived(seq, 1.0, payload)
    copy.flush()
    assert copy.purge(11) == 2
    assert [r.seq for r in copy.read(11)[0]] == [11, 12]
    with pytest.raises(Trimmed):
        copy.read(10)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data + b"\x07" * 11, id="torn-head"),
        pytest.param(lambda data: data[:-5], id="torn-payload"),
        pytest.param(lambda data: data[:-20] + bytes([data[-20] ^ 0xFF]) + data[-19:], id="flipped-bit"),
    ],
)
def test_reopen_truncates_a_torn_or_corrupt_tail_and_continues(tmp_path: Path, damage: object) -> None:
    j = journal(tmp_path)
    fill(j, 5)
    j.close()
    segment = next((tmp_path / "j").iterdir())
    segment.write_bytes(damage(segment.read_bytes()))  # type: ignore[operator]
    again = journal(tmp_path)
    kept = again.next_seq - 1
    assert kept in (4, 5)  # the damaged last record goes; nothing before it
    assert [r.seq for r in again.read(1)[0]] == list(range(1, kept + 1))
    assert again.append("a.b", "alice", {}, [b"new"]) == kept + 1
    again.commit()
    assert again.read(kept + 1)[0][0].body == b"new"


def test_retention_by_bytes_and_age_trims_whole_segments_and_reads_before_raise_trimmed(tmp_path: Path) -> None:
    clock = Clock()
    j = journal(tmp_path, clock, segment_bytes=4096, max_bytes=3 * 4096, max_age_s=0)
    fill(j, 400, size=50)
    assert j.first_seq > 1
    assert sum(p.stat().st_size for p in (tmp_path / "j").iterdir()) <= 3 * 4096 + 4096
    with pytest.raises(Trimmed) as info:
        j.read(1)
    assert info.value.first == j.first_seq and isinstance(info.value, LookupError)
    assert j.read(j.first_seq)[0][0].seq == j.first_seq

    aged = journal(tmp_path / "aged", clock, segment_bytes=4096, max_bytes=0, max_age_s=60)
    fill(aged, 100, size=50)
    clock.now += 120
    fill(aged, 1)
    assert aged.enforce_retention(clock.now) >= 1
    assert aged.first_seq > 1 and aged.next_seq == 102


def test_dedup_is_per_sender_and_window_and_survives_reopen(tmp_path: Path) -> None:
    clock = Clock()
    j = journal(tmp_path, clock, dedup_window_s=60)
    seq = j.append("t", "alice", {"MSGID": "m1"}, [b"x"])
    j.commit()
    assert j.duplicate_of("alice", "m1") == seq
    assert j.duplicate_of("bob", "m1") is None  # another identity cannot suppress alice's ids
    j.close()
    clock.now += 30
    again = journal(tmp_path, clock, dedup_window_s=60)
    assert again.duplicate_of("alice", "m1") == seq
    clock.now += 31
    assert again.duplicate_of("alice", "m1") is None


def test_dedup_memory_is_bounded(tmp_path: Path) -> None:
    j = journal(tmp_path, dedup_max_ids=10)
    for i in range(50):
        j.append("t", "a", {"MSGID": str(i)}, [b"x"])
    assert j.info()["dedup_ids"] == 10
    assert j.duplicate_of("a", "49") is not None and j.duplicate_of("a", "0") is None


@pytest.mark.parametrize(("policy", "fsyncs"), [("always", 10), ("batch", 1), ("never", 0)])
def test_fsync_policy(tmp_path: Path, policy: str, fsyncs: int) -> None:
    j = journal(tmp_path, fsync=policy)
    for _ in range(10):
        j.append("t", "a", {}, [b"x"])
    j.commit()
    assert j.counters["fsyncs"] == fsyncs
    assert not j.pending


def test_a_write_failure_withdraws_the_unwritten_records(tmp_path: Path) -> None:
    j = journal(tmp_path)
    fill(j, 3)
    j.append("t", "a", {"MSGID": "lost"}, [b"x"])
    os.close(j._segments[-1].fd)  # the disk goes away under the journal
    with pytest.raises(OSError):
        j.commit()
    assert j.next_seq == 4 and j.duplicate_of("a", "lost") is None
    j._segments[-1].fd = os.open(j._segments[-1].path, os.O_WRONLY | os.O_APPEND)
    assert j.append("t", "a", {}, [b"y"]) == 4


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('[journals.main]\nfsync = "sometimes"', "journals.main.fsync"),
        ("[journals.main]\nsegment_bytes = 10", "journals.main.segment_bytes"),
        ("[journals.main]\nmax_bytes = -1", "journals.main.max_bytes"),
        ('[journals.main]\ntopics = ["a..b"]', "journals.main.topics"),
        ("[journals.main]\ntopics = []", "journals.main.topics"),
        ("[journals.main]\ncolour = 1", "journals.main.colour"),
        ('[journals."a/b"]\n', "journals.a/b"),
        ("journals = 3", "journals"),
    ],
)
def test_bad_journal_config_names_the_key(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(text, "mc0.toml")
    assert info.value.where == f"mc0.toml: {where}"


def test_journal_config_loads() -> None:
    config = parse('[journals.audit]\ntopics = ["orders.>"]\nfsync = "always"\nmax_age_s = 0', "x")
    assert config.journals["audit"].topics == ("orders.>",) and config.journals["audit"].fsync == "always"
    assert config.journals["audit"].path("audit") == Path("var/journal/audit")


# ------------------------------------------------------------------ the core with journals


def core_with(
    tmp_path: Path, topics: tuple[str, ...] = ("orders.>",), *, files: bool = False, **settings: object
) -> tuple[BrokerCore, JournalStore]:
    """A core with one journal: in memory, or (``files``) the real store on disk."""
    j: JournalStore
    if files:
        j = journal(tmp_path, topics=topics, **settings)
    else:
        j = MemoryStore("main", JournalSettings(topics=topics, **settings))  # type: ignore[arg-type]
    core = BrokerCore(CoreSettings(), journals=[j], wall_offset=1000.0)
    for rid in (b"pub", b"sub"):
        connect(core, rid, who=rid.decode())
    return core, j


def test_ok_for_a_journaled_put_waits_for_commit_and_names_the_seq(tmp_path: Path) -> None:
    core, j = core_with(tmp_path)
    handle(core, b"sub", f("SUB", "", "orders.>"), 0.0)
    out = handle(core, b"pub", f("PUT", "TOPIC", "orders.1", "ID", "p1", "X-k", "v", "", "body"), 0.0)
    assert [rid for rid, _ in out] == [b"sub"]  # delivered, not yet acknowledged
    assert headers_of(list(out[0][1]))["SEQ"] == "1" and headers_of(list(out[0][1]))["JOURNAL"] == "main"
    assert core.uncommitted
    assert core.commit() == [(b"pub", P.ok_journaled("p1", "main", 1))]
    assert not core.uncommitted
    record = j.read(1)[0][0]
    assert (record.topic, record.sender, record.headers, record.body) == ("orders.1", "pub", {"X-k": "v"}, b"body")
    # A topic no journal keeps is answered at once, without SEQ.
    assert handle(core, b"pub", f("PUT", "TOPIC", "other", "ID", "p2", "", "b"), 0.0) == [(b"pub", P.ok("p2"))]


def test_a_repeated_msgid_is_acknowledged_duplicate_and_not_delivered_again(tmp_path: Path) -> None:
    core, _ = core_with(tmp_path)
    handle(core, b"sub", f("SUB", "", "orders.>"), 0.0)
    first = handle(core, b"pub", f("PUT", "TOPIC", "orders.1", "ID", "a", "MSGID", "m", "", "x"), 0.0)
    assert len(first) == 1
    assert core.commit() == [(b"pub", P.ok_journaled("a", "main", 1))]
    assert handle(core, b"pub", f("PUT", "TOPIC", "orders.1", "ID", "b", "MSGID", "m", "", "x"), 0.1) == []
    assert core.commit() == [(b"pub", P.ok_journaled("b", "main", 1, duplicate=True))]
    # Another publisher's message with the same MSGID is its own message.
    connect(core, b"other", who="other")
    assert len(handle(core, b"other", f("PUT", "TOPIC", "orders.1", "ID", "c", "MSGID", "m", "", "x"), 0.2)) == 1


def test_a_failed_write_answers_507_not_ok(tmp_path: Path) -> None:
    core, j = core_with(tmp_path, files=True)
    assert isinstance(j, Journal)
    handle(core, b"pub", f("PUT", "TOPIC", "orders.1", "ID", "a", "", "x"), 0.0)
    os.close(j._segments[-1].fd)
    out = core.commit()
    assert out[0][0] == b"pub" and out[0][1][:5] == f("ERROR", "ID", "a", "CODE", "507")


def test_sub_from_replays_history_then_goes_live_without_repeats(tmp_path: Path) -> None:
    core, _ = core_with(tmp_path)
    for i in range(5):
        handle(core, b"pub", f("PUT", "TOPIC", f"orders.{i}", "", str(i)), 0.0)
    core.commit()
    # The OK names the journal replayed and where its history ends (the records before it went out live).
    expected = [(b"sub", P.ok_journaled("s", "main", 6))]
    assert handle(core, b"sub", f("SUB", "ID", "s", "FROM", "3", "", "orders.>"), 0.0) == expected
    # A live message while the replay runs is held back: the replay delivers it in order.
    assert handle(core, b"pub", f("PUT", "TOPIC", "orders.9", "", "9"), 0.0) == []
    replayed = core.pages(0.0)
    assert [(o.routing_id, payload_of(list(o.frames))[0], o.seq) for o in replayed] == [
        (b"sub", b"2", 3),
        (b"sub", b"3", 4),
        (b"sub", b"4", 5),
        (b"sub", b"9", 6),
    ]
    assert core.pages(0.0) == [] and not core.paging  # caught up
    live = handle(core, b"pub", f("PUT", "TOPIC", "orders.10", "", "10"), 0.0)
    assert [headers_of(list(fr))["SEQ"] for _, fr in live] == ["7"]


def test_a_blocked_replay_resumes_from_the_record_that_did_not_fit(tmp_path: Path) -> None:
    core, _ = core_with(tmp_path)
    for i in range(3):
        handle(core, b"pub", f("PUT", "TOPIC", "orders.x", "", str(i)), 0.0)
    handle(core, b"sub", f("SUB", "FROM", "1", "", "orders.>"), 0.0)
    first = core.pages(0.0)
    for unsent in first[1:]:  # the second record did not fit; the shell hands back it and the rest
        core.page_blocked(unsent, 0.0)
    assert core.pages(0.0) == []  # paused
    assert [o.seq for o in core.pages(1.0)] == [2, 3]


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        (("SUB", "ID", "s", "FROM", "x", "", "orders.>"), "400"),
        (("SUB", "ID", "s", "FROM", "1", "", "elsewhere.>"), "400"),  # no journal keeps it
        (("SUB", "ID", "s", "FROM", "1", "JOURNAL", "nope", "", "orders.>"), "400"),
        (("SUB", "ID", "s", "FROM", "1", "", ">"), "400"),  # wider than any journal
    ],
)
def test_bad_sub_from_is_refused_and_changes_nothing(tmp_path: Path, frames: tuple[str, ...], code: str) -> None:
    core, _ = core_with(tmp_path)
    out = handle(core, b"sub", f(*frames), 0.0)
    assert out[0][1][:5] == f("ERROR", "ID", "s", "CODE", code)
    assert len(core.subscriptions) == 0 and not core.paging


def test_sub_from_a_trimmed_seq_is_410(tmp_path: Path) -> None:
    core, j = core_with(tmp_path, segment_bytes=4096, max_bytes=4096)
    for _ in range(200):
        handle(core, b"pub", f("PUT", "TOPIC", "orders.x", "", "y" * 50), 0.0)
    core.commit()
    assert j.first_seq > 1
    out = handle(core, b"sub", f("SUB", "ID", "s", "FROM", "1", "", "orders.>"), 0.0)
    assert out[0][1][:5] == f("ERROR", "ID", "s", "CODE", "410")
    ok = [(b"sub", P.ok_journaled("t", "main", 201))]
    assert handle(core, b"sub", f("SUB", "ID", "t", "FROM", "0", "", "orders.>"), 0.0) == ok
    assert core.pages(0.0)[0].seq == j.first_seq  # 0 = from the oldest kept


def handle(core: BrokerCore, rid: bytes, frames: list[bytes], now: float) -> list:  # type: ignore[type-arg]
    """A message from a peer whose authenticated identity is its routing id's text."""
    return core.handle(rid, frames, now, rid.decode())


def fetch(core: BrokerCore, query: dict[str, object], rid: str = "r") -> tuple[list[P.Record], list[bytes]]:
    """A fetch, then loop turns until its FINAL (bounded): one page per turn."""
    assert handle(core, b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", rid, "", json.dumps(query)), 0.0) == []
    records = []
    for _ in range(1000):
        for out in core.pages(0.0):
            if out.frames[0] == b"FINAL":
                return records, list(out.frames)
            assert out.frames[0] == b"PARTIAL"
            records += P.parse_journal_page(payload_of(list(out.frames)))
    raise AssertionError("no FINAL")


def test_journal_service_fetch_pages_filters_and_reports_where_to_continue(tmp_path: Path) -> None:
    core, _ = core_with(tmp_path)
    for i in range(2500):
        handle(core, b"pub", f("PUT", "TOPIC", f"orders.{i % 3}", "", str(i)), 0.0)
    core.commit()
    records, final = fetch(core, {"op": "fetch", "journal": "main", "from_seq": 1})
    assert final[0] == b"FINAL" and [r.seq for r in records] == list(range(1, 2501))
    assert json.loads(payload_of(final)[0]) == {"next_seq": 2501, "records": 2500, "first_seq": 1, "end_seq": 2501}
    records, final = fetch(
        core, {"op": "fetch", "journal": "main", "from_seq": 10, "to_seq": 20, "topics": ["orders.1"]}
    )
    assert [r.body for r in records] == [str(s - 1).encode() for s in range(10, 20) if (s - 1) % 3 == 1]
    records, final = fetch(core, {"op": "fetch", "journal": "main", "from_seq": 1, "max_records": 7})
    assert len(records) == 7 and json.loads(payload_of(final)[0])["next_seq"] == 8
    info = handle(core, b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "i", "", "info"), 0.0)
    assert json.loads(payload_of(list(info[0][1]))[0])["main"]["next_seq"] == 2501


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({"op": "fetch", "journal": "nope"}, "400"),
        ({"op": "fetch", "journal": "main", "from_seq": -1}, "400"),
        ({"op": "fetch", "journal": "main", "from_seq": "1"}, "400"),
        ({"op": "fetch", "journal": "main", "max_records": 0}, "400"),
        ({"op": "fetch", "journal": "main", "topics": ["a..b"]}, "400"),
        ({"op": "fetch", "journal": "main", "topics": 5}, "400"),
        ({"op": "drop"}, "400"),
        ([1, 2], "400"),
    ],
)
def test_bad_fetch_is_400(tmp_path: Path, query: object, code: str) -> None:
    core, _ = core_with(tmp_path)
    out = handle(core, b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", json.dumps(query)), 0.0)
    assert out[0][1][:5] == f("ERROR", "ID", "r", "CODE", code)


# ------------------------------------------------------------------ the fetch's topic filter, in the core

FETCHED_TOPICS = ["orders.new", "orders.eu.new", "orders.eu.paid", "payments.card", "audit", "orders"]


def fetch_all(core: BrokerCore, query: dict[str, object], rid: bytes = b"sub") -> list[P.Record]:
    """A fetch to its FINAL (loop turns, bounded), its pages read whatever their encoding."""
    body = json.dumps({"op": "fetch", "journal": "main", **query})
    assert handle(core, rid, f("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", body), 0.0) == []
    records: list[P.Record] = []
    for _ in range(1000):
        for out in core.pages(0.0):
            if out.frames[0] == b"FINAL":
                return records
            parts = payload_of(list(out.frames))
            records += (
                P.parse_columns_page(parts[0]).records() if P.is_columns_page(parts[0]) else P.parse_journal_page(parts)
            )
    raise AssertionError("no FINAL")


@pytest.mark.parametrize("files", [False, True], ids=["memory", "files"])
@pytest.mark.parametrize("page", ["json", "columns/1"])
@pytest.mark.parametrize(
    "patterns",
    [
        [],  # no filter
        ["*"],  # one token
        [">"],
        ["orders.*"],
        ["orders.>"],
        ["orders.*.new"],
        ["orders.new", "payments.>"],
        ["orders.>", "orders.eu.new"],  # overlapping: each record once
        ["nothing.here"],
        ["mc0.>"],  # mc0.sys.* is matched only by a pattern naming mc0.sys: nothing here either way
    ],
)
def test_a_fetch_returns_exactly_the_records_its_patterns_match(
    tmp_path: Path, files: bool, page: str, patterns: list[str]
) -> None:
    core, j = core_with(tmp_path, (">",), files=files, segment_bytes=4096)
    for i in range(1500):
        handle(core, b"pub", f("PUT", "TOPIC", FETCHED_TOPICS[i % 6], "", str(i)), 0.0)
    core.commit()
    everything, _ = j.read(1, None, None, max_records=10_000, max_bytes=1 << 30)
    wanted = [split_pattern(p) for p in patterns]
    expected = [r for r in everything if not wanted or any(pattern_matches(p, split_topic(r.topic)) for p in wanted)]
    query: dict[str, object] = {"topics": patterns, "page": page, "page_records": 1000}
    assert fetch_all(core, query) == expected


def test_a_fetch_returns_only_topics_its_reader_may_subscribe_to(tmp_path: Path) -> None:
    store = MemoryStore("main", JournalSettings(topics=(">",)))
    permissions = Permissions.from_table({"identity": {"carol": {"subscribe": ["orders.eu.>"], "publish": [">"]}}})
    core = BrokerCore(CoreSettings(), permissions, journals=[store])
    for rid in (b"pub", b"carol"):
        connect(core, rid, who=rid.decode())
    for i in range(60):
        handle(core, b"pub", f("PUT", "TOPIC", FETCHED_TOPICS[i % 6], "", str(i)), 0.0)
    core.commit()
    for patterns in ([], [">"], ["orders.>"], ["payments.>"]):
        for page in ("json", "columns/1"):
            topics = {r.topic for r in fetch_all(core, {"topics": patterns, "page": page}, b"carol")}
            assert topics == ({"orders.eu.new", "orders.eu.paid"} if patterns != ["payments.>"] else set())


@pytest.mark.parametrize(
    ("topics", "code", "reason"),
    [
        (["a..b"], "400", "invalid topic 'a..b': empty token"),
        (["orders.>", "a.>.b"], "400", "'>' may only be the last token"),
        ([""], "400", "invalid topic '': empty"),
        (["mcollective discovery"], "400", "contains whitespace"),  # a 0.x opaque topic is no pattern
        ([5], "400", "topics must be a list of patterns"),
        ([["orders.>"]], "400", "topics must be a list of patterns"),
        ({"orders": ">"}, "400", "topics must be a list of patterns"),
        (["a." * 40 + "b"], "413", "more than 32 tokens"),
        (["x" * 2000], "413", "longer than 1024 UTF-8 bytes"),
    ],
)
def test_a_fetch_with_a_bad_pattern_is_refused_and_changes_nothing(
    tmp_path: Path, topics: object, code: str, reason: str
) -> None:
    core, _ = core_with(tmp_path, (">",))
    handle(core, b"pub", f("PUT", "TOPIC", "orders.new", "", "x"), 0.0)
    core.commit()
    fetches = core.counters["journal_fetches"]
    body = json.dumps({"op": "fetch", "journal": "main", "topics": topics, "page": "columns/1"})
    out = handle(core, b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", body), 0.0)
    assert out[0][1][:5] == f("ERROR", "ID", "r", "CODE", code) and reason in headers_of(list(out[0][1]))["MESSAGE"]
    assert not core.paging and core.counters["journal_fetches"] == fetches  # no fetch started
    assert [r.topic for r in fetch_all(core, {"topics": ["orders.>"]})] == ["orders.new"]  # and the next one runs


@pytest.mark.parametrize(
    ("topics", "expected"),
    [
        ([], False),
        ([b"orders.new"], False),
        ([b"mc0.sys.dead.orders.new"], True),
        ([b"orders.new", b"a", b"mc0.sys.dead.x"], True),
        ([b"orders.mc0.sys.dead.x"], False),  # the prefix inside a topic is no dead letter
        ([b"mc0.sys.deadline"], False),
        ([b"mc0.sys.dead"], False),
    ],
)
def test_a_columns_page_holds_dead_letters_only_when_a_topic_starts_with_the_prefix(
    topics: list[bytes], expected: bool
) -> None:
    assert holds_dead_letters(topics) is expected


def test_a_large_fetch_goes_out_one_page_per_turn_and_a_blocked_page_is_resent(tmp_path: Path) -> None:
    core, _ = core_with(tmp_path)
    for i in range(3500):
        handle(core, b"pub", f("PUT", "TOPIC", "orders.x", "", str(i)), 0.0)
    core.commit()
    query = '{"op":"fetch","journal":"main","from_seq":1}'
    assert handle(core, b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", query), 0.0) == []
    first = core.pages(0.0)
    assert [o.frames[0] for o in first] == [b"PARTIAL"]  # one page, not the whole fetch
    core.page_blocked(first[0], 0.0)  # it did not fit
    assert core.pages(0.0) == []
    seqs: list[int] = []
    final: list[bytes] = []
    for turn in range(10):
        for out in core.pages(1.0 + turn):
            if out.frames[0] == b"FINAL":
                final = list(out.frames)
            else:
                seqs += [r.seq for r in P.parse_journal_page(payload_of(list(out.frames)))]
    assert seqs == list(range(1, 3501))
    assert json.loads(payload_of(final)[0])["records"] == 3500
    assert not core.paging


def test_fetches_under_way_per_peer_are_bounded(tmp_path: Path) -> None:
    core, _ = core_with(tmp_path)
    for i in range(10):
        handle(core, b"pub", f("PUT", "TOPIC", "orders.x", "", str(i)), 0.0)
    query = '{"op":"fetch","journal":"main"}'
    answers = [
        handle(core, b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", str(i), "", query), 0.0) for i in range(9)
    ]
    assert answers[:8] == [[]] * 8
    assert answers[8][0][1][:5] == f("ERROR", "ID", "8", "CODE", "429")
    handle(core, b"sub", f("CANCEL", "ID", "0"), 0.0)  # a cancelled fetch frees its place
    assert handle(core, b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "9", "", query), 0.0) == []


def test_fetch_from_trimmed_is_410(tmp_path: Path) -> None:
    core, j = core_with(tmp_path, segment_bytes=4096, max_bytes=4096)
    for _ in range(200):
        handle(core, b"pub", f("PUT", "TOPIC", "orders.x", "", "y" * 50), 0.0)
    core.commit()
    out = handle(
        core,
        b"sub",
        f("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", '{"op":"fetch","journal":"main","from_seq":1}'),
        0.0,
    )
    assert out[0][1][:5] == f("ERROR", "ID", "r", "CODE", "410")


def test_rpc_and_peer_telemetry_are_published_and_journaled(tmp_path: Path) -> None:
    core, j = core_with(tmp_path, topics=("mc0.sys.>",))
    handle(core, b"sub", f("SUB", "", "mc0.sys.rpc"), 0.0)
    connect(core, b"w", who="w")
    handle(core, b"w", f("READY", "", "echo"), 0.0)
    out = handle(core, b"pub", f("REQUEST", "SERVICE", "echo", "ID", "q", "", "abc"), 1.0)
    bid = headers_of(list(out[0][1]))["ID"]
    out = handle(core, b"w", f("FINAL", "ID", bid, "", "abcdef"), 1.25)
    telemetry = [fr for rid, fr in out if rid == b"sub"]
    event = json.loads(payload_of(list(telemetry[0]))[0])
    assert event == {
        "service": "echo",
        "caller": "pub",
        "worker": event["worker"],
        "latency_ms": 250.0,
        "status": 200,
        "bytes_in": 3,
        "bytes_out": 6,
        "ts": 1001.25,
    }
    assert event["worker"].startswith("w#")
    handle(core, b"pub", f("REQUEST", "SERVICE", "nobody", "ID", "q2"), 2.0)
    core.commit()
    kept = [json.loads(r.body) for r in j.read(1)[0] if r.topic == "mc0.sys.rpc"]
    assert [e["status"] for e in kept] == [200, 503]
    peers = [json.loads(r.body)["event"] for r in j.read(1)[0] if r.topic == "mc0.sys.peer"]
    assert peers == ["connect", "connect", "connect"]


def test_sample_configs_document_the_journal_defaults() -> None:
    from mc0 import config

    etc = Path(__file__).parent.parent / "etc"
    text = (etc / "mc0.toml").read_text()
    start = text.index("# [journals.main]")
    example = "\n".join(line[2:].split("  #")[0] for line in text[start:].splitlines() if line.startswith("# "))
    assert parse(example, "example").journals == {"main": JournalSettings()}
    # ">" no longer reaches the broker's own mc0.sys.* space, so the pipeline's sample
    # journal names the RPC telemetry topic literally.
    assert config.load(etc / "journal.toml").journals["main"].topics == (">", "mc0.sys.rpc")


def test_a_disk_error_while_appending_with_fsync_always_is_507_and_the_core_carries_on(tmp_path: Path) -> None:
    core, j = core_with(tmp_path, files=True, fsync="always")
    assert isinstance(j, Journal)
    os.close(j._segments[-1].fd)  # the disk goes away under the journal
    out = handle(core, b"pub", f("PUT", "TOPIC", "orders.1", "ID", "a", "", "x"), 0.0)
    assert out[0][1][:5] == f("ERROR", "ID", "a", "CODE", "507")
    assert j.next_seq == 1  # nothing half-written is kept
    assert handle(core, b"pub", f("PING", "ID", "p"), 0.0) == [(b"pub", f("PONG", "ID", "p"))]


def test_a_segment_that_vanished_under_a_replay_ends_it_with_507(tmp_path: Path) -> None:
    core, j = core_with(tmp_path, files=True)
    for i in range(3):
        handle(core, b"pub", f("PUT", "TOPIC", "orders.x", "", str(i)), 0.0)
    core.commit()
    handle(core, b"sub", f("SUB", "FROM", "1", "", "orders.>"), 0.0)
    for segment in (tmp_path / "j").iterdir():
        segment.write_bytes(b"")  # someone truncated the files behind the broker's back
    (out,) = core.pages(0.0)
    assert out.frames[:3] == f("ERROR", "CODE", "507") and not core.paging
    # The replay's end, not a withdrawal: JOURNAL names it, and the SUB stays (live from here).
    assert out.frames[-4:] == f("JOURNAL", "main", "TOPIC", "orders.>")
    delivered = handle(core, b"pub", f("PUT", "TOPIC", "orders.x", "", "live"), 0.0) + core.commit()
    assert [frames[-1] for to, frames in delivered if to == b"sub"] == [b"live"]


def test_disconnect_records_at_shutdown_carry_the_shutdown_time(tmp_path: Path) -> None:
    core, j = core_with(tmp_path, topics=("mc0.sys.>",))
    core.shutdown(5.0)
    core.commit()
    events = [json.loads(r.body) for r in j.read(1)[0] if json.loads(r.body)["event"] == "disconnect"]
    assert len(events) == 2 and all(e["ts"] == 1005.0 and e["reason"] == "broker_shutdown" for e in events)


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        (
            FileNotFoundError(2, "No such file or directory", "/var/lib/mc0/journal/main/01.seg"),
            "No such file or directory",
        ),
        (OSError(28, "No space left on device"), "No space left on device"),
        (PermissionError(13, "Permission denied", "/etc/mc0/x", None, "/etc/mc0/y"), "Permission denied"),
        (OSError("journal main: 01.seg is shorter than its index"), "an I/O error (the broker's log has the details)"),
        (OSError(), "an I/O error (the broker's log has the details)"),
    ],
)
def test_a_storage_fault_on_the_wire_is_the_oss_words_never_a_file(fault: OSError, said: str) -> None:
    from mc0.broker.storage.port import storage_fault

    assert storage_fault(fault) == said
