"""The route wire below NATS's max_payload (mc0.protocol.routes: route_messages, chunks) and the receiving
side's reassembly (mc0.broker.cluster.inbound.Reassembly): what a blob of records becomes on NATS, and what
comes of it again, including when chunks go missing.  The live tests are tests/test_link_live.py."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mc0.broker.cluster.inbound import PARTIAL_OVERHEAD, Reassembly
from mc0.protocol import batch
from mc0.protocol import routes as wire


def record(size: int, tag: int = 0) -> bytes:
    """A MESSAGE record of ``size`` bytes (at least its fields')."""
    topic = f"t.{tag}".encode()
    made = batch.message_record(topic, b"alice", bytes([tag % 256]) * max(0, size - 14 - len(topic)))
    assert len(made) == max(size, 14 + len(topic))
    return made


def carried(messages: list[bytes], max_record: int = 1 << 30) -> tuple[bytes, list[bytes]]:
    """What a receiver makes of ``messages``: the blobs it posts, joined, and each of them."""
    reassembly = Reassembly(Counter(), max_record=max_record, budget=1 << 31)
    blobs = []
    for message in messages:
        if wire.is_chunk(message):
            chunk = wire.parse_chunk(message)
            assert chunk is not None and (chunk.sender, chunk.epoch) == ("b1", 7)
            got = reassembly.take(chunk, 0.0)
            if got is not None:
                blobs.append(got)
        else:
            parsed = wire.parse_route_message(message)
            assert parsed is not None and parsed[:2] == ("b1", 7)
            reassembly.whole("b1")
            blobs.append(parsed[2])
    assert reassembly.losses == [] and reassembly.used == 0
    return b"".join(blobs), blobs


@pytest.mark.parametrize(
    ("sizes", "max_payload", "whole", "chunks"),
    [
        pytest.param([100, 200], 1 << 20, 1, 0, id="small: one message as it is"),
        pytest.param([400] * 10, 1000, 5, 0, id="split at record boundaries"),
        pytest.param([3000], 1000, 0, 4, id="one record chunked"),
        pytest.param([100, 3000, 100, 100], 1000, 2, 4, id="records around a chunked one"),
        pytest.param([900, 900], 1000, 2, 0, id="each fills a message"),
        pytest.param([1000 - wire.head_bytes("b1")], 1000, 1, 0, id="a record that just fits a whole message"),
        pytest.param([1001 - wire.head_bytes("b1")], 1000, 0, 2, id="a record just over the room of one"),
    ],
)
def test_a_blob_crosses_in_messages_below_max_payload_and_comes_out_byte_for_byte(
    sizes: list[int], max_payload: int, whole: int, chunks: int
) -> None:
    blob = b"".join(record(size, i) for i, size in enumerate(sizes))
    messages = list(wire.route_messages("b1", 7, blob, max_payload))
    assert all(len(m) <= max_payload for m in messages)
    assert (sum(not wire.is_chunk(m) for m in messages), sum(map(wire.is_chunk, messages))) == (whole, chunks)
    joined, blobs = carried(messages)
    assert joined == blob
    for part in blobs:  # each whole message and each chunked record splits into whole records
        assert [end for _, _, end in batch.records(part)][-1] == len(part)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=20, max_value=6000), min_size=1, max_size=30),
    max_payload=st.integers(min_value=120, max_value=4000),
    torn=st.integers(min_value=0, max_value=40),
)
def test_any_blob_crosses_whole_and_in_order_whatever_max_payload(
    sizes: list[int], max_payload: int, torn: int
) -> None:
    blob = b"".join(record(size, i) for i, size in enumerate(sizes))
    blob = blob[: len(blob) - torn]  # (possibly torn: the rest is carried as it is all the same)
    messages = list(wire.route_messages("b1", 7, blob, max_payload))
    assert all(len(m) <= max_payload for m in messages)
    assert carried(messages)[0] == blob


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(bytes([0x80]), id="no name"),
        pytest.param(bytes([0x82]) + b"b1" + bytes(10), id="short head"),
        pytest.param(bytes([0x82]) + b"b!" + bytes(16) + b"x", id="bad name"),
        pytest.param(bytes([0x80 | 65]) + b"b" * 65 + bytes(16) + b"x", id="name too long"),
        pytest.param(bytes([0x82]) + b"b1" + bytes(16), id="no data"),
        pytest.param(wire.chunk_message("b1", 7, 4, 2, b"xyz"), id="past its total"),
        pytest.param(wire.route_message("b1", 7, b"whole"), id="a whole message"),
    ],
)
def test_a_malformed_chunk_is_refused(data: bytes) -> None:
    assert wire.parse_chunk(data) is None


def chunk(sender: str, total: int, offset: int, data: bytes, epoch: int = 7) -> wire.Chunk:
    parsed = wire.parse_chunk(wire.chunk_message(sender, epoch, total, offset, data))
    assert parsed is not None
    return parsed


def test_the_old_parser_takes_a_chunk_for_a_malformed_message() -> None:
    assert wire.parse_route_message(wire.chunk_message("b1", 7, 4, 0, b"abcd")) is None


# What a receiver makes of a sender's chunks when some go missing: (chunks, posted, lost, stray, losses).
A, B = "a", "b"
CASES = [
    ("in order", [chunk(A, 6, 0, b"abc"), chunk(A, 6, 3, b"def")], [b"abcdef"], 0, 0, []),
    ("a middle chunk lost", [chunk(A, 9, 0, b"abc"), chunk(A, 9, 6, b"ghi")], [], 1, 1, [A, A]),
    (
        "a record's end lost, the next one whole",
        [chunk(A, 6, 0, b"abc"), chunk(A, 4, 0, b"wxyz")],
        [b"wxyz"],
        1,
        0,
        [A],
    ),
    ("a first chunk lost", [chunk(A, 6, 3, b"def"), chunk(A, 4, 0, b"wxyz")], [b"wxyz"], 0, 1, [A]),
    ("another total", [chunk(A, 6, 0, b"abc"), chunk(A, 7, 3, b"defg")], [], 1, 1, [A, A]),
    ("a new epoch (it restarted)", [chunk(A, 6, 0, b"abc"), chunk(A, 6, 3, b"def", epoch=8)], [], 1, 1, [A, A]),
    (
        "two senders at once",
        [chunk(A, 4, 0, b"ab"), chunk(B, 4, 0, b"wx"), chunk(B, 4, 2, b"yz"), chunk(A, 4, 2, b"cd")],
        [b"wxyz", b"abcd"],
        0,
        0,
        [],
    ),
    ("over the largest record", [chunk(A, 101, 0, b"abc"), chunk(A, 101, 3, b"def")], [], 1, 1, [A, A]),
]


@pytest.mark.parametrize(
    ("chunks", "posted", "lost", "stray", "losses"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_lost_or_stray_chunk_costs_its_own_record_only_and_names_its_sender(
    chunks: list[wire.Chunk], posted: list[bytes], lost: int, stray: int, losses: list[str]
) -> None:
    counters: Counter[str] = Counter()
    reassembly = Reassembly(counters, max_record=100, budget=1 << 20)
    got = [blob for c in chunks if (blob := reassembly.take(c, 0.0)) is not None]
    assert got == posted
    assert (counters["route_records_lost"], counters["route_chunks_stray"]) == (lost, stray)
    assert reassembly.losses == losses
    assert reassembly.used == 0


def test_a_whole_message_after_a_records_first_chunk_means_that_record_was_lost() -> None:
    counters: Counter[str] = Counter()
    reassembly = Reassembly(counters, max_record=100, budget=1 << 20)
    assert reassembly.take(chunk(A, 6, 0, b"abc"), 0.0) is None
    reassembly.whole(B)  # another sender's: nothing lost
    assert reassembly.losses == []
    reassembly.whole(A)
    assert (counters["route_records_lost"], reassembly.losses, reassembly.used) == (1, [A], 0)


def test_reassembly_is_bounded_in_bytes_and_forgets_a_record_that_stopped_coming() -> None:
    counters: Counter[str] = Counter()
    budget = 2 * (50 + PARTIAL_OVERHEAD)
    reassembly = Reassembly(counters, max_record=100, budget=budget)
    for sender in ("a", "b"):
        assert reassembly.take(chunk(sender, 50, 0, b"x"), 0.0) is None
    assert reassembly.used == budget
    assert reassembly.take(chunk("c", 50, 0, b"x"), 1.0) is None  # no room: lost at once
    assert (counters["route_records_lost"], reassembly.losses) == (1, ["c"])
    assert reassembly.take(chunk("a", 50, 1, b"y"), 15.0) is None  # a goes on; b stopped
    reassembly.expire(20.0, ttl=10.0)
    assert reassembly.losses == ["c", "b"] and reassembly.used == 50 + PARTIAL_OVERHEAD
    reassembly.clear()  # the link went down: what was under way is gone, with nobody to resync
    assert (reassembly.used, reassembly.losses, counters["route_records_lost"]) == (0, [], 3)


def test_resync_notices_go_at_once_then_at_most_one_a_second_per_broker_never_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from mc0.broker.cluster import inbound, posts

    monkeypatch.setattr(inbound, "RESYNC_NOTICE_S", 0.2)
    posted: list[tuple[float, object]] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        resyncs = inbound.Resyncs(lambda frames: posted.append((loop.time() - started, posts.parse(frames))), Counter())
        resyncs.ask("a")
        resyncs.ask("a")  # within the second: held back to its end
        resyncs.ask("a")  # (already held: one notice for both)
        resyncs.ask("b")  # another broker: at once
        await asyncio.sleep(0.35)
        resyncs.ask("a")
        resyncs.cancel()  # the link went down: what is held is not posted
        await asyncio.sleep(0.3)

    asyncio.run(run())
    assert [item for _, item in posted] == [posts.RouteResync("a"), posts.RouteResync("b"), posts.RouteResync("a")]
    assert posted[2][0] >= 0.15  # (the held one: at the end of its second, not at once)
