"""Columns pages (a fetch's ``"page": "columns/1"``): the encoding's round trip, a table of malformed
pages and mutated ones (refused with a clear ValueError, never a crash, also through Arrow), the
journal store's columns read, the broker core serving both encodings, and fetch_pages against a real
broker with both client APIs."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mc0
from mc0 import protocol as P
from mc0.aio.pages import page_of
from mc0.broker.storage.filestore import Journal, JournalSettings
from mc0.broker.storage.memstore import MemoryStore
from mc0.message import Record
from mc0.process import BrokerProcess

from .conftest import payload_of, require, write_config
from .test_journal import core_with, handle
from .test_protocol import f

pa = require("pyarrow")

from mc0.spark.source import _record_batch_of, record_batch  # noqa: E402 - needs pyarrow

RECORDS = [
    Record(5, 1.5, "a.b", "alice", {"X-k": "v"}, (b"xy", b"z")),
    Record(7, 2.0, "a.c", "bob", {}, (b"w",)),
]


def page(records: list[Record] = RECORDS, next_seq: int = 9) -> bytes:
    return P.columns_page(P.page_columns(records), next_seq)


GOOD = page()


def test_the_literal_page_has_the_documented_layout() -> None:
    """The offsets the malformed table below writes at (a change of layout must show up here first)."""
    assert len(GOOD) == 200
    assert GOOD[:32] == struct.pack("<4sHHIIIIQ", b"mc0c", 1, 0, 2, 1, 3, 0, 9)
    assert struct.unpack_from("<qq", GOOD, 32) == (5, 7) and struct.unpack_from("<dd", GOOD, 48) == (1.5, 2.0)
    assert struct.unpack_from("<3i", GOOD, 64) == (0, 3, 6) and GOOD[80:88] == b"a.ba.c\0\0"
    assert GOOD[104:112] == b"alicebob" and struct.unpack_from("<3i", GOOD, 112) == (0, 1, 1)
    assert GOOD[136:139] == b"X-k" and GOOD[152:153] == b"v"
    assert struct.unpack_from("<3i", GOOD, 160) == (0, 2, 3) and struct.unpack_from("<4i", GOOD, 176) == (0, 2, 3, 4)
    assert GOOD[192:196] == b"xyzw"


def patched(at: int, fmt: str, *values: Any, data: bytes = GOOD) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, *values)
    return bytes(out)


MALFORMED = [
    ("empty", b"", "shorter than its 32-byte head"),
    ("a head cut short", GOOD[:31], "shorter than its 32-byte head"),
    ("another magic", patched(0, "4s", b"mc0d"), "not b'mc0c'"),
    ("a JSON page", b'[{"seq":1}]', "not b'mc0c'"),
    ("a later version", patched(4, "H", 2), "version 2: this client reads version 1"),
    ("reserved field set", patched(6, "H", 1), "reserved head fields"),
    ("second reserved field set", patched(20, "I", 1), "reserved head fields"),
    ("cut in the last section", GOOD[:199], "body bytes needs 4 bytes"),
    ("bytes after the end", GOOD + b"\0" * 8, "8 bytes after the last section"),
    ("more records than sent", patched(8, "I", 3), "malformed columns page"),
    ("a count beyond the frame", patched(8, "I", 0xFFFFFFFF), "seqs needs"),
    ("padding not zero", patched(86, "B", 1), "padding after topic bytes is not zero"),
    ("offsets not from 0", patched(64, "i", 1), "topic offsets must start at 0"),
    ("offsets decreasing", patched(68, "i", 7), "topic offsets must start at 0 and never decrease"),
    ("negative offset", patched(68, "i", -1), "never decrease"),
    ("offsets past the frame", patched(72, "i", 1000), "topic bytes needs 1000 bytes"),
    ("header index not ending at h", patched(120, "i", 2), "header index ends at 2, not 1"),
    ("part index not ending at p", patched(168, "i", 2), "part index ends at 2, not 3"),
    ("part offsets past their data", patched(188, "i", 9), "body bytes needs 9 bytes"),
    ("seqs decreasing", patched(40, "q", 4), "seqs must increase"),
    ("a seq twice", patched(40, "q", 5), "seqs must increase"),
    ("a negative seq", patched(32, "q", -1), "seqs must increase"),
    ("a seq at next_seq", patched(24, "Q", 7), "stay below next_seq"),
]


@pytest.mark.parametrize(("frame", "message"), [pytest.param(d, m, id=n) for n, d, m in MALFORMED])
def test_a_malformed_page_is_refused_saying_what_is_wrong(frame: bytes, message: str) -> None:
    with pytest.raises(ValueError, match="columns page") as error:
        P.parse_columns_page(frame)
    assert message in str(error.value)


def test_text_that_is_not_utf8_is_refused_by_both_readers() -> None:
    bad = patched(80, "B", 0xFF)  # the topic's first byte
    parsed = P.parse_columns_page(bad)  # the layout is sound: text is checked where it is decoded
    with pytest.raises(ValueError, match="malformed columns page"):
        parsed.records()
    with pytest.raises(ValueError, match="(?i)utf-?8"):  # pyarrow.ArrowInvalid is a ValueError
        record_batch(parsed)


def test_an_empty_page_is_well_formed() -> None:
    empty = P.parse_columns_page(page([], 12))
    assert (empty.count, empty.next_seq, empty.records()) == (0, 12, [])
    assert record_batch(empty).num_rows == 0


texts = st.text(max_size=12)
records_strategy = st.lists(
    st.tuples(
        st.integers(1, 50),  # gap to the previous seq
        st.floats(0, 4e9, allow_nan=False),  # ts: seconds until 2096
        texts,
        texts,
        st.dictionaries(texts, texts, max_size=3),
        st.lists(st.binary(max_size=40), max_size=3),
    ),
    max_size=30,
)


def build(raw: list[tuple[int, float, str, str, dict[str, str], list[bytes]]]) -> list[Record]:
    seq = 0
    out = []
    for gap, ts, topic, sender, headers, parts in raw:
        seq += gap
        out.append(Record(seq, ts, topic, sender, headers, tuple(parts)))
    return out


@settings(max_examples=300, deadline=None)
@given(records_strategy, st.integers(1, 100))
def test_round_trip_through_the_page_gives_the_same_records_and_arrow_batch(
    raw: list[tuple[int, float, str, str, dict[str, str], list[bytes]]], beyond: int
) -> None:
    records = build(raw)
    next_seq = (records[-1].seq if records else 0) + beyond
    parsed = P.parse_columns_page(page(records, next_seq))
    assert (parsed.count, parsed.next_seq) == (len(records), next_seq)
    assert parsed.records() == records
    assert record_batch(parsed).equals(_record_batch_of(records))  # Arrow from buffers = Arrow from objects
    assert page_of((page(records, next_seq),)).records() == records


@settings(max_examples=200, deadline=None)
@given(records_strategy)
def test_an_old_brokers_json_page_reads_as_the_same_columns_page(
    raw: list[tuple[int, float, str, str, dict[str, str], list[bytes]]],
) -> None:
    records = build(raw)
    if records:
        assert page_of(tuple(P.journal_page(records))).records() == records


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)), min_size=1, max_size=6), st.data())
def test_a_mutated_page_is_refused_or_reads_consistently_never_crashes(
    flips: list[tuple[int, int]], data: st.DataObject
) -> None:
    frame = bytearray(GOOD)
    for at, value in flips:
        frame[at] = value
    cut = data.draw(st.integers(0, len(frame)))
    candidate = bytes(frame[: cut or len(frame)])
    try:
        parsed = P.parse_columns_page(candidate)
    except ValueError:
        return
    try:
        records = parsed.records()
    except ValueError:
        records = None
    try:
        batch = record_batch(parsed)
    except ValueError:
        # Arrow also refuses a time Spark cannot hold (microseconds beyond int64, NaN): Records take any float.
        assert records is None or not all(abs(r.ts) < 9e12 for r in records), "Arrow refused what Records accepted"
        return
    batch.validate(full=True)
    assert records is not None and batch.num_rows == len(records)
    assert batch.column("seq").to_pylist() == [r.seq for r in records]
    assert batch.column("body").to_pylist() == [r.body for r in records]


# ------------------------------------------------------------------ the store's columns read


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Journal, MemoryStore]:
    folder = tmp_path_factory.mktemp("journal")
    j = Journal("main", JournalSettings(folder=str(folder), segment_bytes=4096, max_bytes=0)).open()
    memory = MemoryStore("main")
    for i in range(400):
        headers = {"X-i": str(i), "MSGID": f"m{i}"} if i % 5 == 0 else {}
        parts = [b"p" * (i % 7), b"q"] if i % 3 == 0 else [str(i).encode() * (i % 11)]
        for store in (j, memory):
            store.append(f"t.{i % 4}", "alice" if i % 2 else "bob", headers, parts)
    j.commit()
    memory.commit()
    return j, memory


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.integers(1, 420),
    st.one_of(st.none(), st.integers(1, 420)),
    st.sampled_from([None, "t.1", "t.3"]),
    st.integers(1, 300),
    st.integers(1, 20_000),
)
def test_read_columns_is_read_column_by_column(
    filled: tuple[Journal, MemoryStore], start: int, stop: int | None, topic: str | None, most: int, size: int
) -> None:
    match = None if topic is None else topic.__eq__
    for store in filled:
        records, next_seq = store.read(start, stop, match, max_records=most, max_bytes=size)
        assert store.read_columns(start, stop, match, max_records=most, max_bytes=size) == (
            P.page_columns(records),
            next_seq,
        )


# ------------------------------------------------------------------ the broker serves both encodings


def fetch_both(core: Any, query: dict[str, object]) -> tuple[list[list[Record]], list[list[Record]], list[bytes]]:
    """The same fetch as JSON pages and as columns pages (loop turns until each FINAL, bounded)."""
    results: list[Any] = []
    for rid, extra in (("j", {}), ("c", {"page": "columns/1"})):
        body = json.dumps({**query, **extra})
        assert handle(core, b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", rid, "", body), 0.0) == []
        pages: list[list[Record]] = []
        for _ in range(1000):
            outs = core.pages(0.0)
            if outs and outs[-1].frames[0] == b"FINAL":
                pages += [read_page(o.frames, extra) for o in outs[:-1]]
                results.append((pages, payload_of(list(outs[-1].frames))))
                break
            pages += [read_page(o.frames, extra) for o in outs]
        else:
            raise AssertionError("no FINAL")
    (json_pages, json_final), (columns_pages, columns_final) = results
    assert json_final == columns_final
    return json_pages, columns_pages, columns_final


def read_page(frames: Any, extra: dict[str, str]) -> list[Record]:
    assert frames[0] == b"PARTIAL"
    body = payload_of(list(frames))
    if extra:
        assert len(body) == 1 and P.is_columns_page(body[0])
        return P.parse_columns_page(body[0]).records()
    assert not P.is_columns_page(body[0])  # no page option: the JSON page, as every client before
    return P.parse_journal_page(body)


@pytest.mark.parametrize("files", [False, True], ids=["memory", "files"])
@pytest.mark.parametrize(
    "query",
    [
        {"from_seq": 1},
        {"from_seq": 10, "to_seq": 1500, "topics": ["orders.1"]},
        {"from_seq": 1, "max_records": 7},
        {"from_seq": 1, "max_bytes": 5000},
    ],
)
def test_a_columns_fetch_pages_the_same_records_as_a_json_fetch(
    tmp_path: Path, files: bool, query: dict[str, object]
) -> None:
    core, _ = core_with(tmp_path, files=files, segment_bytes=65536)
    for i in range(2500):
        handle(core, b"pub", f("PUT", "TOPIC", f"orders.{i % 3}", "X-i", str(i), "", str(i), "b"), 0.0)
    core.commit()
    json_pages, columns_pages, final = fetch_both(core, {"op": "fetch", "journal": "main", **query})
    assert (
        sum(columns_pages, []) == sum(json_pages, [])
        and sum(map(len, columns_pages)) == json.loads(final[0])["records"]
    )
    if "topics" not in query:  # (a filtered columns page reads on until it is fuller: fewer pages)
        assert columns_pages == json_pages
    assert all(len(p) <= 1000 for p in columns_pages)  # still a bounded page per loop turn


@pytest.mark.parametrize("files", [False, True], ids=["memory", "files"])
@pytest.mark.parametrize(
    ("topics", "page"),
    [
        # every second record: 1,000 scanned (500 kept), then the room left, 500 (250): 3/4 full
        (2, (750, 1501)),
        # every tenth: four reads of the room left, 1,000 + 900 + 810 + 729 scanned
        (10, (344, 3440)),
        # not filtered: one read of the page's budget
        (1, (1000, 1001)),
        # matching nothing: four reads, then nothing to send this turn
        (0, None),
    ],
)
def test_a_filtered_columns_page_reads_on_until_three_quarters_full(
    tmp_path: Path, files: bool, topics: int, page: tuple[int, int] | None
) -> None:
    core, _ = core_with(tmp_path, files=files, segment_bytes=1 << 20)
    for i in range(5000):
        handle(core, b"pub", f("PUT", "TOPIC", f"orders.{i % max(topics, 1)}", "", f"{i:04d}"), 0.0)
    core.commit()
    wanted = {"topics": ["orders.0"]} if topics > 1 else {"topics": ["nothing"]} if topics == 0 else {}
    query = json.dumps({"op": "fetch", "journal": "main", "page": "columns/1", **wanted})
    handle(core, b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", query), 0.0)
    pages = [P.parse_columns_page(payload_of(list(o.frames))[0]) for o in core.pages(0.0)]
    assert [(p.count, p.next_seq) for p in pages] == ([page] if page else [])
    if topics > 1:
        assert pages[0].seq_list() == list(range(1, page[1], topics))  # every match below next_seq


def test_a_columns_fetch_may_ask_for_larger_pages_within_a_bound(tmp_path: Path) -> None:
    core, _ = core_with(tmp_path)
    for i in range(9000):
        handle(core, b"pub", f("PUT", "TOPIC", "orders.x", "", str(i)), 0.0)
    query = '{"op":"fetch","journal":"main","page":"columns/1","page_records":4000,"page_bytes":4194304}'
    handle(core, b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", query), 0.0)
    counts = []
    for _ in range(10):  # one page per loop turn, then the FINAL
        for out in core.pages(0.0):
            if out.frames[0] == b"PARTIAL":
                counts.append(P.parse_columns_page(payload_of(list(out.frames))[0]).count)
    assert counts == [4000, 4000, 1000]
    query = '{"op":"fetch","journal":"main","page":"columns/1","page_bytes":1000}'  # the byte bound holds too
    handle(core, b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "s", "", query), 0.0)
    assert P.parse_columns_page(payload_of(list(core.pages(0.0)[0].frames))[0]).count < 1000


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"page_records": 4001, "page": "columns/1"}, b"page_records must be an integer in [1, 4000]"),
        ({"page_bytes": (4 << 20) + 1, "page": "columns/1"}, b"page_bytes must be an integer in [1, 4194304]"),
        ({"page_records": 1001}, b"page_records must be an integer in [1, 1000]"),  # JSON pages stay as they were
        ({"page_records": 0, "page": "columns/1"}, b"page_records must be"),
        ({"page_bytes": "big", "page": "columns/1"}, b"page_bytes must be"),
    ],
)
def test_a_page_larger_than_its_bound_is_400(tmp_path: Path, extra: dict[str, object], reason: bytes) -> None:
    core, _ = core_with(tmp_path)
    body = json.dumps({"op": "fetch", "journal": "main", **extra})
    out = handle(core, b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", body), 0.0)
    assert out[0][1][:5] == f("ERROR", "ID", "r", "CODE", "400") and reason in out[0][1][-1]


@pytest.mark.parametrize("value", ["columns", "columns/2", "JSON", 1, None])
def test_an_unknown_page_encoding_is_400(tmp_path: Path, value: object) -> None:
    core, _ = core_with(tmp_path)
    body = json.dumps({"op": "fetch", "journal": "main", "page": value})
    out = handle(core, b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", body), 0.0)
    assert out[0][1][:5] == f("ERROR", "ID", "r", "CODE", "400")
    assert b"page must be one of json, columns/1" in out[0][1][-1]


# ------------------------------------------------------------------ a real broker, both client APIs


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_fetch_pages_streams_what_fetch_returns(api: Any, tmp_path: Path) -> None:
    config = write_config(tmp_path, '[journals.main]\ntopics = ["orders.>"]\nsegment_bytes = 65536\n')
    with BrokerProcess(config=config, insecure=True) as broker:
        client = await api(api.Client(broker.endpoint).connect())
        for i in range(2600):
            headers = {"X-i": str(i)} if i % 3 else None
            await api(client.publish(f"orders.{i % 2}", [b"%d" % i, b"-"], headers=headers, confirm=i == 2599))
        want = await api(client.fetch("main", from_seq=2, to_seq=2500, topics=["orders.1"]))
        stream = await api(client.fetch_pages("main", from_seq=2, to_seq=2500, topics=["orders.1"]))
        if api.name == "sync":
            pages = list(stream)
        else:
            pages = [p async for p in stream]
        assert [r for p in pages for r in p.records()] == want.records and len(pages) >= 2
        assert (stream.next_seq, stream.first_seq, stream.end_seq) == (want.next_seq, 1, 2601)
        assert stream.records == len(want.records)
        unknown = await api(client.fetch_pages("nope"))
        with pytest.raises(mc0.BadRequest, match="unknown journal 'nope'"):
            if api.name == "sync":
                next(unknown)
            else:
                await unknown.__anext__()
        await api(client.close())
