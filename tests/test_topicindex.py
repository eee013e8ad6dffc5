"""The journal's topic index (mc0.broker.storage.topicindex) and the filtered reads of the file journal
that use it: a table of literal cases (known, unknown and unreadable topics, more topics than ids,
withdrawn appends), a property that ``select`` keeps exactly what a filter over every record keeps,
and the file journal's filtered reads checked against a filter over all its records after appends,
a reopen, a failed write and a JetStream copy's ``append_at``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mc0.broker.storage.filestore import Journal, JournalSettings
from mc0.broker.storage.memstore import MemoryStore
from mc0.broker.storage.topicindex import MAX_TOPICS, UNKNOWN, TopicIndex, select
from mc0.protocol.journalrecords import HEAD, encode_payload, encode_record


def payload(topic: str) -> bytes:
    return encode_payload(topic, "alice", {}, [b"body"])


@pytest.mark.parametrize(
    ("payloads", "ids"),
    [
        ([payload("a.b"), payload("a.c"), payload("a.b")], [0, 1, 0]),
        ([b""], [UNKNOWN]),  # no payload head: a hole
        ([payload("a.b")[:9]], [UNKNOWN]),  # the head says more topic bytes than the payload holds
        ([b"\x02\x00\0\0\0\0\0\0\xff\xfe"], [UNKNOWN]),  # a topic that is not UTF-8
        ([payload("a.b"), b"\x03\x00", payload("a.b")], [0, UNKNOWN, 0]),
    ],
)
def test_a_payloads_topic_gets_its_id_or_unknown(payloads: list[bytes], ids: list[int]) -> None:
    index = TopicIndex()
    for data in payloads:
        index.add_payload(data, 0, len(data))
    assert list(index.ids) == ids


def test_topics_beyond_the_ids_are_unknown_and_a_known_topic_keeps_its_id() -> None:
    index = TopicIndex()
    for n in range(MAX_TOPICS + 3):
        index.add(f"t.{n}")
    index.add("t.0")
    data = payload(f"t.{MAX_TOPICS + 1}")
    index.add_payload(data, 0, len(data))
    assert list(index.ids) == [*range(MAX_TOPICS), UNKNOWN, UNKNOWN, UNKNOWN, 0, UNKNOWN]
    assert index.flags(0, len(index.ids), "t.1".__eq__)[MAX_TOPICS - 2 :] == bytes([0, 0, 2, 2, 2, 0, 2])


def test_flags_follow_the_filter_and_topics_added_after_they_were_judged() -> None:
    index = TopicIndex()
    for topic in ("a", "b", "a"):
        index.add(topic)
    wants_b = "b".__eq__
    assert index.flags(0, 3, wants_b) == b"\0\1\0"
    index.add("c")  # a topic the filter has not judged yet
    assert index.flags(1, 4, wants_b) == b"\1\0\0"
    assert index.flags(0, 4, "c".__eq__) == b"\0\0\0\1"  # another filter
    index.truncate(2)
    assert list(index.ids) == [0, 1]


def block(topics: list[str | None]) -> tuple[bytes, list[int]]:
    """Records of these topics (None: a hole, an empty payload) as a segment's bytes and their offsets."""
    data = b""
    offsets = []
    for seq, topic in enumerate(topics, 1):
        offsets.append(len(data))
        if topic is None:
            data += HEAD.pack(0, 0, seq, 1.0)
        else:
            data += encode_record(seq, 1.0, topic, "alice", {}, [str(seq).encode()])
    return data, offsets


@given(
    st.lists(st.one_of(st.none(), st.sampled_from(["a.b", "a.c", "x", "y.z"])), min_size=1, max_size=60),
    st.sets(st.sampled_from(["a.b", "a.c", "x", "y.z"])),
    st.integers(0, 4),
)
def test_select_keeps_exactly_the_records_that_may_pass(
    topics: list[str | None], wanted: set[str], unknown_from: int
) -> None:
    """``select`` keeps every record whose topic passes and every unknown one (checked afterwards),
    drops the rest, in order, whatever the filter; the filter it hands back is None only when every
    record kept is known to pass."""
    data, offsets = block(topics)
    index = TopicIndex()
    named: set[str] = set()
    for i, topic in enumerate(topics):  # topics first seen from unknown_from on are not named: UNKNOWN
        if topic is None or i >= unknown_from and topic not in named:
            index.ids.append(UNKNOWN)
        else:
            index.add(topic)
            named.add(topic)
    match = wanted.__contains__
    flags = index.flags(0, len(topics), match)
    kept, check = select(data, offsets, flags, match)
    expected = [i for i, flag in enumerate(flags) if flag]
    ends = [*offsets[1:], len(data)]
    assert kept == b"".join(data[offsets[i] : ends[i]] for i in expected)
    assert all(topics[i] in wanted or index.ids[i] == UNKNOWN for i in expected)
    assert [i for i, topic in enumerate(topics) if topic in wanted and index.ids[i] != UNKNOWN] == [
        i for i in expected if index.ids[i] != UNKNOWN
    ]
    assert (check is None) == all(index.ids[i] != UNKNOWN for i in expected)


# ------------------------------------------------------------------ the file journal's filtered reads


def journal(folder: Path, **settings: object) -> Journal:
    options: dict[str, object] = {"folder": str(folder), "segment_bytes": 2048, "max_bytes": 0, **settings}
    return Journal("main", JournalSettings(**options)).open()  # type: ignore[arg-type]


def check_filtered_reads(j: Journal) -> None:
    """Every filtered columns read equals a filter over every record, for each filter and page size."""
    everything, _ = j.read(j.first_seq, None, None, max_records=100_000, max_bytes=1 << 30)
    for wanted in ({"a.b"}, {"a.c", "q.0"}, {"nothing"}, {f"q.{n}" for n in range(0, 300, 7)}):
        match = wanted.__contains__
        for most in (1, 7, 1000):
            seqs: list[int] = []
            seq = j.first_seq
            for _ in range(10_000):  # bounded: every read advances
                if seq >= j.next_seq:
                    break
                columns, seq = j.read_columns(seq, None, match, max_records=most, max_bytes=1 << 20)
                seqs += columns.seqs
            assert seqs == [r.seq for r in everything if r.topic in wanted], (wanted, most)


def test_filtered_reads_skip_by_the_index_and_return_what_a_filter_over_all_records_does(tmp_path: Path) -> None:
    j = journal(tmp_path / "j")
    for i in range(400):  # many segments; one of them with more topics than the index names
        j.append("a.b" if i % 3 == 0 else "a.c" if i % 3 == 1 else f"q.{i}", "alice", {}, [b"x" * (i % 9)])
    j.commit()
    assert all(len(s.topics.ids) == len(s.offsets) for s in j._segments)
    check_filtered_reads(j)
    j.close()
    reopened = journal(tmp_path / "j")  # the index is rebuilt from the segments
    assert [list(s.topics.ids) for s in reopened._segments] == [list(s.topics.ids) for s in j._segments]
    check_filtered_reads(reopened)


def test_a_segment_with_more_topics_than_ids_is_still_read_right(tmp_path: Path) -> None:
    j = journal(tmp_path / "j", segment_bytes=1 << 20)
    for i in range(MAX_TOPICS + 60):
        j.append(f"q.{i}", "alice", {}, [b"x"])
    j.append("a.b", "alice", {}, [b"x"])
    j.commit()
    assert list(j._segments[0].topics.ids).count(UNKNOWN) == 61
    check_filtered_reads(j)


def test_withdrawn_appends_leave_the_index_as_long_as_the_records(tmp_path: Path) -> None:
    j = journal(tmp_path / "j", segment_bytes=1 << 20)
    j.append("a.b", "alice", {}, [b"kept"])
    j.commit()
    j.append("a.c", "alice", {}, [b"lost"])
    os.close(j._segments[-1].fd)  # the disk goes away under the journal
    with pytest.raises(OSError):
        j.commit()
    j._segments[-1].fd = os.open(j._segments[-1].path, os.O_WRONLY | os.O_APPEND)
    j.append("a.b", "alice", {}, [b"again"])
    j.commit()
    assert list(j._segments[-1].topics.ids) == [0, 0]
    check_filtered_reads(j)


def test_a_copys_records_appended_at_their_seqs_are_indexed(tmp_path: Path) -> None:
    j = journal(tmp_path / "j")
    for seq in range(5, 200):
        j.append_at(seq, 1.0, encode_payload("a.b" if seq % 2 else "a.c", "alice", {}, [b"x" * 30]))
    j.append_at(400, 1.0, encode_payload("a.c", "alice", {}, [b"after a gap"]))
    j.commit()
    assert all(len(s.topics.ids) == len(s.offsets) for s in j._segments)
    check_filtered_reads(j)


# ------------------------------------------------------------------ counting what a filter takes (/consumerz)


def test_count_matching_equals_a_filter_over_every_record_in_both_stores(tmp_path: Path) -> None:
    j = journal(tmp_path / "j", segment_bytes=1 << 15)
    memory = MemoryStore("main")
    for i in range(900):  # segments, the first naming more topics than ids: records read one by one
        topic = "a.b" if i % 5 == 0 else "a.c" if i % 5 == 1 else f"q.{i}"
        for store in (j, memory):
            store.append(topic, "alice", {}, [b"x" * (i % 9)])
    j.commit()
    memory.commit()
    assert len(j._segments) > 1 and UNKNOWN in j._segments[0].topics.ids
    everything, _ = j.read(j.first_seq, None, None, max_records=100_000, max_bytes=1 << 30)
    for wanted in ({"a.b"}, {"a.c", "q.2"}, {"nothing"}, {f"q.{n}" for n in range(2, 900, 3)}):
        for from_seq in (0, 1, 2, 150, 399, 400, 699, 700, 899, 900, 901, 1200):
            for to_seq in (None, 0, 151, 400, 899, 5000):
                top = to_seq if to_seq is not None else 1 << 30
                expected = sum(1 for r in everything if from_seq <= r.seq < top and r.topic in wanted)
                for store in (j, memory):
                    got = store.count_matching(from_seq, wanted.__contains__, to_seq=to_seq)
                    assert got == expected, (wanted, from_seq, to_seq, store)


def test_count_matching_says_none_rather_than_read_past_its_budget(tmp_path: Path) -> None:
    j = journal(tmp_path / "j", segment_bytes=1 << 20)
    memory = MemoryStore("main")
    for i in range(MAX_TOPICS + 60):  # one segment: its last 60 records are beyond the index's ids
        for store in (j, memory):
            store.append(f"q.{i}", "alice", {}, [b"x"])
    j.commit()
    memory.commit()
    wanted = {"q.0", f"q.{MAX_TOPICS + 10}"}.__contains__
    assert j.count_matching(1, wanted, max_checked=60) == 2  # the 60 records it cannot name are read
    assert j.count_matching(1, wanted, max_checked=59) is None  # the index alone cannot tell
    assert j.count_matching(1, wanted, to_seq=MAX_TOPICS + 1, max_checked=0) == 1  # (a range the index names)
    assert j.count_matching(1, {"q.0"}.__contains__, max_checked=0) is None  # nor for a name it knows, here
    assert memory.count_matching(1, wanted, max_checked=MAX_TOPICS + 60) == 2
    assert memory.count_matching(1, wanted, max_checked=100) is None
    assert memory.count_matching(MAX_TOPICS, wanted, max_checked=100) == 1
