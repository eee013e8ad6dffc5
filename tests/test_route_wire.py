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
    reassembly = Reassembly(Counter(), max_record=max_record, budget=1 << 31, route_epoch={"b1": 7}.get)
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
ROUTES = {A: 7, B: 7, "c": 7}  # the brokers with a route here, and their epochs
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
    # (a chunk of its new run is refused until the loop has a route to that run: ROUTES below)
    ("a new epoch (it restarted)", [chunk(A, 6, 0, b"abc"), chunk(A, 6, 3, b"def", epoch=8)], [], 1, 0, [A]),
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
    reassembly = Reassembly(counters, max_record=100, budget=1 << 20, route_epoch=ROUTES.get)
    got = [blob for c in chunks if (blob := reassembly.take(c, 0.0)) is not None]
    assert got == posted
    assert (counters["route_records_lost"], counters["route_chunks_stray"]) == (lost, stray)
    assert reassembly.losses == losses
    assert reassembly.used == 0


def test_a_whole_message_after_a_records_first_chunk_means_that_record_was_lost() -> None:
    counters: Counter[str] = Counter()
    reassembly = Reassembly(counters, max_record=100, budget=1 << 20, route_epoch=ROUTES.get)
    assert reassembly.take(chunk(A, 6, 0, b"abc"), 0.0) is None
    reassembly.whole(B)  # another sender's: nothing lost
    assert reassembly.losses == []
    reassembly.whole(A)
    assert (counters["route_records_lost"], reassembly.losses, reassembly.used) == (1, [A], 0)


def test_reassembly_counts_the_bytes_that_came_and_makes_room_from_the_record_silent_the_longest() -> None:
    counters: Counter[str] = Counter()
    budget = 2 * PARTIAL_OVERHEAD + 60
    reassembly = Reassembly(counters, max_record=100, budget=budget, route_epoch=ROUTES.get)
    for at, sender in enumerate(("a", "b")):
        assert reassembly.take(chunk(sender, 100, 0, b"x" * 20), float(at)) is None
    assert reassembly.used == 2 * (PARTIAL_OVERHEAD + 20)  # what came, not the 100 each announced
    assert reassembly.take(chunk("a", 100, 20, b"y" * 10), 2.0) is None  # a goes on; b is silent since 1.0
    assert reassembly.take(chunk("c", 100, 0, b"z" * 20), 3.0) is None  # no room: b, the most silent, is lost
    assert (counters["route_records_lost"], reassembly.losses) == (1, ["b"])
    assert reassembly.used == 2 * PARTIAL_OVERHEAD + 30 + 20
    assert reassembly.take(chunk("c", 100, 20, b"z" * 30), 4.0) is None  # a, silent since 2.0, makes room
    assert reassembly.losses == ["b", "a"] and reassembly.used == PARTIAL_OVERHEAD + 50
    reassembly.expire(20.0, ttl=10.0)  # c stopped coming
    assert reassembly.losses == ["b", "a", "c"] and reassembly.used == 0
    assert reassembly.take(chunk("a", 100, 0, b"x"), 21.0) is None
    reassembly.clear()  # the link went down: what was under way is gone, with nobody to resync
    assert (reassembly.used, reassembly.losses, counters["route_records_lost"]) == (0, [], 4)


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(chunk("ghost", 50, 0, b"x"), id="a broker with no route here"),
        pytest.param(chunk("a", 50, 0, b"x", epoch=6), id="a run of it the route is not to"),
        pytest.param(chunk("ghost", 50, 10, b"x"), id="no route, not even a first chunk"),
    ],
)
def test_a_chunk_from_a_broker_without_a_route_here_is_refused_and_costs_nothing(first: wire.Chunk) -> None:
    counters: Counter[str] = Counter()
    reassembly = Reassembly(counters, max_record=100, budget=1 << 20, route_epoch=ROUTES.get)
    assert reassembly.take(first, 0.0) is None
    assert (reassembly.used, reassembly.losses, counters["route_chunks_refused"]) == (0, [], 1)
    assert counters["route_records_lost"] == counters["route_chunks_stray"] == 0


def test_first_chunks_that_announce_the_largest_records_cannot_starve_a_record_that_comes_whole() -> None:
    """(adversary D7) Eight 20-byte first chunks announcing records of the largest size held the whole
    64 MiB budget (each reserved what it announced) for 30 s: a real 2 MiB record was lost meanwhile."""
    counters: Counter[str] = Counter()
    largest = 8 * 1024 * 1024 + 64 * 1024
    routes = {f"r{i}": 7 for i in range(9)}
    reassembly = Reassembly(counters, max_record=largest, budget=64 * 1024 * 1024, route_epoch=routes.get)
    for i, total in enumerate([largest] * 7 + [7_900_000]):
        assert reassembly.take(chunk(f"r{i}", total, 0, b"x" * 20), 0.0) is None
    record = b"r" * (2 * 1024 * 1024)
    step = 1024 * 1024 - 100
    pieces = [chunk("r8", len(record), at, record[at : at + step]) for at in range(0, len(record), step)]
    assert [reassembly.take(piece, 1.0) for piece in pieces][-1] == record
    assert counters["route_records_lost"] == 0 and reassembly.losses == []


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
