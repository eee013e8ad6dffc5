"""Batched framing: the codec (protocol.batch) and the core's handling of BATCH messages (core/batched.py:
short records are 400s, a big batch is walked in slices with other peers served between them, what
waits behind it is bounded, a batch's refusals are coalesced), no sockets."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mc0 import protocol as P
from mc0.broker.core.batched import REFUSALS_ANSWERED
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.protocol import Limits, Side, batch

from .test_core import connect, f

# One sample of every command each side may send (frames), shortcut-shaped or not.
PEER_SAMPLES = [
    f("PUT", "TOPIC", "a.b", "", "body"),
    f("PUT", "TOPIC", "a.b", "ID", "1", "", "body"),
    f("PUT", "TOPIC", "a.b", "X-k", "v", "", "b1", "b2"),
    f("PUT", "TOPIC", "a.b", "MSGID", "m", "", ""),
    f("REQUEST", "SERVICE", "svc", "ID", "r", "TIMEOUT", "100", "", "x"),
    f("REQUEST", "SERVICE", "svc", "ID", "r", "", "x"),
    f("REQUEST", "SERVICE", "svc", "ID", "r", "TIMEOUT", "100", "ALL", "1", "X-t", "1", "", "x"),
    f("PARTIAL", "ID", "7", "", "p"),
    f("FINAL", "ID", "7", "", "f"),
    f("FINAL", "ID", "7"),
    f("ERROR", "ID", "7", "CODE", "500", "MESSAGE", "m"),
    f("SUB", "ID", "s", "", "a.>", "b"),
    f("SUB", "FROM", "0", "JOURNAL", "main", "", "a.>"),
    f("UNSUB", "", "a.>"),
    f("READY", "CAPACITY", "3", "", "svc"),
    f("CANCEL", "ID", "r"),
    f("NOOP"),
    f("PING", "ID", "p"),
    f("DISCONNECT", "ID", "d"),
]
BROKER_SAMPLES = [
    f("MESSAGE", "TOPIC", "a.b", "SENDER", "alice", "", "body"),
    f("MESSAGE", "TOPIC", "a.b", "SENDER", "alice", "JOURNAL", "main", "SEQ", "3", "", "body"),
    f("OK", "ID", "1"),
    f("OK", "ID", "1", "JOURNAL", "main", "SEQ", "4"),
    f("ERROR", "ID", "1", "CODE", "403", "MESSAGE", "no"),
    f("REQUEST", "SERVICE", "svc", "ID", "9", "CALLER", "bob", "TIMEOUT", "50", "", "x"),
    f("FINAL", "ID", "r", "COUNT", "2", "MISSING", "0"),
    f("PARTIAL", "ID", "r", "WORKER", "w#1", "", "p"),
    f("CANCEL", "ID", "9"),
    f("NOOP"),
    f("PONG", "ID", "p"),
]


def unpack(blob: bytes) -> list[list[bytes]]:
    return [batch.frames_of(blob, code, start, end) for code, start, end in batch.records(blob)]


def as_frames(item: object) -> list[bytes]:
    """What the core handed out for a peer: a batch record (a batched peer's fast path) or frames
    (the shell turns those into records for batched peers)."""
    if isinstance(item, bytes):
        (frames,) = unpack(item)
        return frames
    return list(item)  # type: ignore[call-overload]


@pytest.mark.parametrize("frames", PEER_SAMPLES + BROKER_SAMPLES, ids=lambda fr: b" ".join(fr[:3]).decode())
def test_every_command_round_trips_through_a_record(frames: list[bytes]) -> None:
    record = batch.record_of(frames)
    assert unpack(record) == [frames]
    assert unpack(batch.frames_record(frames)) == [frames]  # the generic form too


def test_common_shapes_use_the_shortcuts_and_the_rest_frames() -> None:
    def code(frames: list[bytes]) -> int:
        return next(batch.records(batch.record_of(frames)))[0]

    assert code(f("PUT", "TOPIC", "t", "", "x")) == batch.PUT
    assert code(f("MESSAGE", "TOPIC", "t", "SENDER", "s", "", "x")) == batch.MESSAGE
    assert code(f("FINAL", "ID", "1", "", "x")) == batch.FINAL
    assert code(f("PARTIAL", "ID", "1", "", "x")) == batch.PARTIAL
    assert code(f("OK", "ID", "1")) == batch.OK
    assert code(f("PUT", "TOPIC", "t", "ID", "1", "", "x")) == batch.FRAMES
    assert code(f("PUT", "TOPIC", "t", "", "x", "y")) == batch.FRAMES
    assert code(f("FINAL", "ID", "1")) == batch.FRAMES
    rec = batch.call_record(b"svc", b"r", 100, b"x")
    assert unpack(rec) == [f("REQUEST", "SERVICE", "svc", "ID", "r", "TIMEOUT", "100", "", "x")]
    rec = batch.work_record(b"svc", b"9", b"bob", 50, b"x")
    assert unpack(rec) == [f("REQUEST", "SERVICE", "svc", "ID", "9", "CALLER", "bob", "TIMEOUT", "50", "", "x")]


@pytest.mark.parametrize("frames", PEER_SAMPLES, ids=lambda fr: b" ".join(fr[:3]).decode())
def test_a_peers_record_becomes_the_command_decode_makes_of_its_frames(frames: list[bytes]) -> None:
    record = batch.record_of(frames)
    ((code, start, end),) = batch.records(record)
    got = batch.command_of(record, code, start, end, P.DEFAULT_LIMITS)
    expected = P.decode(frames, sender=Side.PEER)
    assert (got.verb, got.headers, list(got.payload)) == (expected.verb, expected.headers, list(expected.payload))


@pytest.mark.parametrize(
    ("blob", "where"),
    [
        (b"\x05\x00\x00", "inside a record header"),
        (struct.pack("<IB", 50, batch.PUT) + b"xx", "runs past the end"),
        (struct.pack("<IB", 1, 99), "unknown code"),
        (struct.pack("<IB", 0, batch.PUT), "runs past the end"),
    ],
)
def test_a_blob_that_stops_splitting_is_a_400_after_the_records_before_it(blob: bytes, where: str) -> None:
    good = batch.put_record(b"t", b"x")
    seen = []
    with pytest.raises(P.ProtocolError) as caught:
        for item in batch.records(good + blob):
            seen.append(item)
    assert len(seen) == 1 and caught.value.code == 400 and where in caught.value.reason


@pytest.mark.parametrize(
    "record",
    [
        struct.pack("<IBH", 3, batch.PUT, 50),  # topic length beyond the record
        struct.pack("<IBHH", 5, batch.MESSAGE, 9, 9),
        struct.pack("<IBHHI", 9, batch.CALL, 1, 1, 5) + b"",
        struct.pack("<IBH", 3 + 8, batch.FRAMES, 2) + struct.pack("<2I", 100, 100),
        struct.pack("<IB", 2, batch.FRAMES) + b"\x01",
    ],
)
def test_a_record_whose_fields_run_past_it_is_a_400(record: bytes) -> None:
    ((code, start, end),) = batch.records(record)
    with pytest.raises(P.ProtocolError) as caught:
        batch.frames_of(record, code, start, end)
    assert caught.value.code == 400


def connect_batched(core: BrokerCore, rid: bytes, who: str = "anonymous") -> list[bytes]:
    ((_, ok),) = core.handle(rid, f("CONNECT", "VERSION", "1.0", "TTL", "1000", "BATCH", "1", "ID", "c"), 0.0, who)
    return list(ok)  # type: ignore[arg-type]


def test_batch_is_granted_at_connect_only_for_1_0_and_refused_before() -> None:
    core = BrokerCore()
    assert connect_batched(core, b"a") == f("OK", "ID", "c", "TTL", "1000", "BATCH", "1")
    ((_, ok),) = core.handle(b"a", f("CONNECT", "VERSION", "1.0", "BATCH", "1", "ID", "again"), 0.0)
    assert isinstance(ok, P.Unbatched)  # the OK that grants batches is never one of their records
    ((_, answer),) = core.handle(b"old", f("CONNECT", "VERSION", "0.3", "TTL", "1000", "BATCH", "1", "ID", "c"), 0.0)
    assert answer[:5] == f("ERROR", "ID", "c", "CODE", "400")
    core.handle(b"plain", f("CONNECT", "VERSION", "1.0", "TTL", "1000"), 0.0)
    ((_, answer),) = core.handle(b"plain", batch.batch_frames(batch.put_record(b"t", b"x")), 0.0)
    assert answer[:3] == f("ERROR", "CODE", "400")  # not granted: refused, nothing delivered


def test_a_malformed_command_in_a_batch_gets_its_own_error_and_id_and_spoils_nothing() -> None:
    core = BrokerCore()
    connect_batched(core, b"pub")
    connect_batched(core, b"sub")
    core.handle(b"sub", batch.batch_frames(batch.record_of(f("SUB", "", "t.>"))), 0.0)
    blob = b"".join(
        [
            batch.put_record(b"t.1", b"first"),
            batch.record_of(f("PUT", "TOPIC", "t..bad", "ID", "b1", "", "x")),  # invalid topic
            batch.record_of(f("PUT", "TOPIC", "t.2", "BOGUS", "1", "ID", "b2", "", "x")),  # unknown header
            batch.record_of(f("REQUEST", "SERVICE", "nobody", "ID", "r1", "TIMEOUT", "100", "", "x")),  # 503
            batch.record_of(f("CONNECT", "VERSION", "1.0", "TTL", "1000", "ID", "b3")),  # not in a batch
            batch.put_record(b"t.3", b"last"),
            batch.record_of(f("PING", "ID", "p")),
        ]
    )
    out = core.handle(b"pub", batch.batch_frames(blob), 0.0)
    to_sub = [r for rid, r in out if rid == b"sub"]
    to_pub = [r for rid, r in out if rid == b"pub"]
    assert [as_frames(r)[-1] for r in to_sub] == [b"first", b"last"]

    def answer(item: object) -> tuple[bytes, str | None, str | None]:
        command = P.decode(as_frames(item), sender=Side.BROKER)
        return command.verb.value.encode(), command.id, command.headers.get("CODE")

    assert [answer(r) for r in to_pub] == [
        (b"ERROR", "b1", "400"),
        (b"ERROR", "b2", "400"),
        (b"ERROR", "r1", "503"),
        (b"ERROR", "b3", "400"),
        (b"PONG", "p", None),
    ]


def test_limits_hold_per_command_and_per_batch() -> None:
    core = BrokerCore(CoreSettings(limits=Limits(max_message_bytes=100, max_batch_bytes=1000)))
    connect_batched(core, b"p")
    big = batch.record_of(f("PUT", "TOPIC", "t", "ID", "big", "", "x" * 200))
    out = core.handle(b"p", batch.batch_frames(big + batch.record_of(f("PING", "ID", "ok"))), 0.0)
    assert [as_frames(item)[:5] for _, item in out] == [f("ERROR", "ID", "big", "CODE", "413"), f("PONG", "ID", "ok")]
    too_many = batch.put_record(b"t", b"x" * 50) * 30
    ((_, answer),) = core.handle(b"p", batch.batch_frames(too_many), 0.0)
    assert as_frames(answer)[:3] == f("ERROR", "CODE", "413")


def test_fan_out_gives_each_kind_of_subscriber_its_own_shape_of_one_message() -> None:
    core = BrokerCore()
    connect_batched(core, b"batched")
    core.handle(b"plain", f("CONNECT", "VERSION", "1.0", "TTL", "1000"), 0.0)
    core.handle(b"seed", f("CONNECT", "VERSION", "0.3", "TTL", "1000"), 0.0)
    core.handle(b"batched", batch.batch_frames(batch.record_of(f("SUB", "", "t"))), 0.0)
    core.handle(b"plain", f("SUB", "", "t"), 0.0)
    core.handle(b"seed", f("SUB", "", "t"), 0.0)
    out = dict(core.handle(b"plain", f("PUT", "TOPIC", "t", "", "x"), 0.0))
    assert isinstance(out[b"batched"], bytes)  # the record itself, built once for every batched subscriber
    assert as_frames(out[b"batched"]) == f("MESSAGE", "TOPIC", "t", "SENDER", "anonymous", "", "x")
    assert out[b"plain"] == f("MESSAGE", "TOPIC", "t", "SENDER", "anonymous", "", "x")
    assert out[b"seed"] == f("MESSAGE", "TOPIC", "t", "", "x")


@settings(max_examples=200, deadline=None)
@given(
    topic=st.binary(min_size=1, max_size=40),
    sender=st.binary(max_size=40),
    group=st.binary(min_size=1, max_size=20),
    data=st.binary(max_size=300),
)
def test_group_message_record_is_the_frames_record_of_the_group_message(
    topic: bytes, sender: bytes, group: bytes, data: bytes
) -> None:
    from mc0.protocol import builders

    expected = batch.frames_record(builders.message(topic, sender, (), [data], group=group))
    assert batch.group_message_record(topic, sender, group, data) == expected


@pytest.mark.parametrize(
    "frames",
    [
        [b"BATCH", b"", b"x", b"y"],  # four frames
        [b"BATCH", b"ID", b"1", b"", b"x"],  # headers
        [b"BATCH", b"", b""],  # three frames from a peer that never asked for batching
    ],
)
def test_a_misframed_batch_is_a_400_and_changes_nothing(frames: list[bytes]) -> None:
    """Found by the fuzzer: BATCH in any shape but its own reached the verb table, which had no entry."""
    from mc0.broker.core.dispatch import BrokerCore

    core = BrokerCore()
    core.handle(b"a", [b"CONNECT", b"VERSION", b"1.0", b"TTL", b"1000"], 0.0)
    ((rid, answer),) = core.handle(b"a", frames, 0.0)
    answer = list(answer)
    assert rid == b"a" and answer[0] == b"ERROR" and answer[answer.index(b"CODE") + 1] == b"400"
    assert core.counters["internal_errors"] == 0 and b"a" in core.sessions


# What a broker sends a client, one record of each shape (a queue-group copy among the FRAMES).
CLIENT_RECORDS = [
    batch.message_record(b"a.b", b"alice", b"body"),
    batch.message_record(b"a.b", b"", b""),
    batch.group_message_record(b"g.x", b"bob", b"workers", b"copy"),
    batch.record_of(P.message(b"a.b", b"alice", [b"X-Trace", b"t"], [b"1"])),
    batch.record_of(P.message(b"a.b", b"alice", [], [b"1", b"2"], group=b"workers")),
    *(batch.record_of(frames) for frames in BROKER_SAMPLES),
]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(CLIENT_RECORDS), max_size=12))
def test_a_clients_walk_reads_every_record_as_frames_of_does(chosen: list[bytes]) -> None:
    """``received`` (the client's one walk of a batch) splits a blob as ``records`` does and reads a
    MESSAGE shortcut and a queue-group copy into the fields their frames carry."""
    blob = b"".join(chosen)
    walked = list(batch.received(blob))
    assert [(code, start, end) for code, start, end, *_ in walked if code != batch.MESSAGE] == [
        (code, start, end)
        for code, start, end in batch.records(blob)
        if not (code == batch.MESSAGE or batch.group_message_fields(blob, start, end) is not None)
    ]
    assert [(s, e) for _, s, e, *_ in walked] == [(s, e) for _, s, e in batch.records(blob)]
    for code, start, end, sender, topic, group, data in walked:
        if code != batch.MESSAGE:
            assert (sender, topic, group, data) == (b"", b"", None, b"")
            continue
        command = P.decode(unpack(blob[start - 5 : end])[0], sender=Side.BROKER)
        assert command.verb is P.Verb.MESSAGE and list(command.payload) == [data]
        assert (topic.decode(), sender.decode()) == (command.headers[P.Header.TOPIC], command.headers[P.Header.SENDER])
        assert (group.decode() if group is not None else None) == command.headers.get(P.Header.GROUP)


@pytest.mark.parametrize(
    "record",
    [
        b"\x01\x00\x00\x00\x02",  # a MESSAGE record with no fields
        b"\x03\x00\x00\x00\x02\x05\x00",  # the sender's length runs past the record
        b"\x07\x00\x00\x00\x02\x01\x00a\x09\x00b",  # the topic's length runs past it
    ],
)
def test_a_clients_walk_refuses_a_message_record_whose_fields_run_past_it(record: bytes) -> None:
    good = batch.message_record(b"a", b"s", b"d")
    walk = batch.received(good + record + good)
    assert next(walk)[3:] == (b"s", b"a", None, b"d")  # the records before the damage come first
    with pytest.raises((P.ProtocolError, struct.error)):
        next(walk)


# ---------------------------------------------------------------- the batch walk (BatchedInput)
def batched_core(**settings: object) -> BrokerCore:
    core = BrokerCore(CoreSettings(**settings))  # type: ignore[arg-type]
    assert connect_batched(core, b"p")[0] == b"OK"
    return core


def answers(out: list[tuple[bytes, object]], to: bytes = b"p") -> list[list[bytes]]:
    return [as_frames(item) for rid, item in out if rid == to]


def record(code: int, body: bytes) -> bytes:
    return struct.pack("<IB", 1 + len(body), code) + body


# Each record is shorter than the fixed fields of its code (they raised struct.error: a 500 and a traceback).
SHORT_RECORDS = [
    pytest.param(record(batch.PUT, b""), id="PUT-empty"),
    pytest.param(record(batch.PUT, b"x"), id="PUT-1-byte"),
    pytest.param(record(batch.CALL, b""), id="CALL-empty"),
    pytest.param(record(batch.CALL, b"\x01\x00\x01\x00\x05"), id="CALL-5-bytes"),
    pytest.param(record(batch.PARTIAL, b""), id="PARTIAL-empty"),
    pytest.param(record(batch.PARTIAL, b"x"), id="PARTIAL-1-byte"),
    pytest.param(record(batch.FINAL, b""), id="FINAL-empty"),
    pytest.param(record(batch.FINAL, b"\x07"), id="FINAL-1-byte"),
]


@pytest.mark.parametrize("short", SHORT_RECORDS)
def test_a_shortcut_record_shorter_than_its_fixed_fields_is_a_400_not_an_internal_error(short: bytes) -> None:
    core = batched_core()
    out = core.handle(b"p", batch.batch_frames(short + batch.record_of(f("PING", "ID", "after"))), 1.0)
    refused, pong = answers(out)
    assert refused[:5] == f("ERROR", "CODE", "400", "MESSAGE", "batch record too short for its fields")
    assert pong == f("PONG", "ID", "after")  # and it spoiled nothing after it
    assert core.counters["internal_errors"] == 0 and core.counters["rejected_400"] == 1


# ---------------------------------------------------------------- big batches in slices
NOOP = batch.record_of(f("NOOP"))


def ping(rid: str) -> bytes:
    return batch.record_of(f("PING", "ID", rid))


def test_a_big_batch_is_walked_in_slices_and_other_peers_are_served_between_them() -> None:
    core = batched_core()
    connect(core, b"other")
    core.batched.batch_slice = 100
    out = core.handle(b"p", batch.batch_frames(ping("first") + NOOP * 1000 + ping("last")), 0.0)
    assert answers(out) == [f("PONG", "ID", "first")] and core.unfinished  # one slice, then a cursor
    assert answers(core.handle(b"other", f("PING", "ID", "bystander"), 0.0), b"other") == [
        f("PONG", "ID", "bystander")
    ]  # served at once, between slices
    assert core.handle(b"p", f("PING", "ID", "later"), 0.0) == []  # the batch's own peer waits its turn
    walked: list[list[bytes]] = []
    for _ in range(20):  # 1,002 records, 100 a slice (each resume is one slice)
        walked += answers(core.resume(0.0, 100))
        if not core.unfinished:
            break
    assert walked == [f("PONG", "ID", "last"), f("PONG", "ID", "later")]  # in order, once each
    assert not core.unfinished


def test_what_waits_behind_a_batch_is_bounded_and_the_rest_is_a_429_that_changes_nothing() -> None:
    core = batched_core(limits=Limits(max_batch_bytes=1000))
    core.batched.batch_slice = 10
    core.handle(b"p", batch.batch_frames(NOOP * 60), 0.0)
    assert core.handle(b"p", batch.batch_frames(NOOP * 60), 0.0) == []  # 900 bytes wait
    assert core.handle(b"p", batch.batch_frames(NOOP * 60), 0.0) == []  # 1,800: within twice the limit
    (refused,) = answers(core.handle(b"p", f("PING", "ID", "x", "", "y" * 300), 0.0))
    assert refused[:5] == f("ERROR", "ID", "x", "CODE", "429") and b"send slower" in refused[6]
    assert core.counters["refused_busy"] == 1


def test_a_batch_cut_short_by_its_peer_being_forgotten_goes_with_it_and_what_followed_is_still_handled() -> None:
    core = batched_core()
    core.batched.batch_slice = 10
    core.handle(b"p", batch.batch_frames(NOOP * 100 + ping("never")), 0.0)
    core.handle(b"p", f("CONNECT", "VERSION", "1.0", "TTL", "1000", "ID", "again"), 0.0)  # waits behind it
    core.revoke({"anonymous"}, 0.0)  # forgotten mid-batch
    core.allow({"anonymous"})
    out = core.resume(0.0, 10_000)
    assert [a[:3] for a in answers(out)] == [f("OK", "ID", "again")]  # the rest of the batch went with it
    assert not core.unfinished


def test_a_closed_connection_waits_for_its_batch_to_be_walked_before_its_peer_is_forgotten() -> None:
    core = BrokerCore()
    core.handle(b"p", f("CONNECT", "VERSION", "1.0", "TTL", "1000", "BATCH", "1", "ID", "c"), 0.0, fd=7)
    core.batched.batch_slice = 10
    core.handle(b"p", batch.batch_frames(NOOP * 100 + ping("last")), 0.0, fd=7)
    core.connection_closed(7, 0.0)
    assert core.forget_closed(0.0, drained=True) == [] and b"p" in core.sessions  # its messages are not all read
    assert answers(core.resume(0.0, 10_000)) == [f("PONG", "ID", "last")]
    core.forget_closed(0.1, drained=True)
    assert b"p" not in core.sessions


def test_silence_is_measured_up_to_when_the_broker_last_read_everything_not_into_its_busy_time() -> None:
    core = BrokerCore(CoreSettings(liveness=3))
    connect(core, b"a", now=0.0, ttl=1000)
    core.caught_up(0.5)  # the shell read its socket empty at 0.5, then was busy (not reading) until 10.0
    core.tick(10.0)
    assert b"a" in core.sessions  # 9.5 s of the broker's busy time is not a's silence
    core.caught_up(10.0)  # read everything: a had sent nothing
    core.tick(11.0)  # (the sweep after a kept peer comes a TTL later)
    assert b"a" not in core.sessions


def test_a_peer_whose_long_batch_is_still_being_walked_is_not_silent() -> None:
    """Its records are what it says: a batch the broker takes longer than liveness x TTL to walk (a
    loaded box, a 15 MB batch) must not expire the peer that sent it (a loaded run of the live test
    forgot the sender mid-walk); the silence counts from the walk's last slice."""
    core = batched_core(liveness=3)  # TTL 1 s: expired after 3 s of silence
    core.batched.batch_slice = 100
    core.handle(b"p", batch.batch_frames(NOOP * 1000 + ping("last")), 0.0)
    now = 0.0
    for _ in range(20):  # one slice every 2 s (while the shell reads everything between them)
        now += 2.0
        core.caught_up(now)
        core.tick(now)
        assert b"p" in core.sessions, f"forgotten at {now} s while its batch was being walked"
        core.resume(now, 100)
        if not core.unfinished:
            break
    assert not core.unfinished
    core.caught_up(now + 3.5)
    core.tick(now + 3.5)
    assert b"p" not in core.sessions  # silent for liveness x TTL after its batch: forgotten


# ---------------------------------------------------------------- refusals coalesced
def test_a_batchs_refusals_are_answered_one_by_one_only_at_first_then_counted_in_one_answer() -> None:
    core = batched_core()
    refused = [batch.record_of(f("PUT", "TOPIC", "bad..topic", "ID", f"r{i}", "", "x")) for i in range(1000)]
    out = core.handle(b"p", batch.batch_frames(b"".join(refused) + ping("after")), 0.0)
    got = answers(out)
    assert len(got) == REFUSALS_ANSWERED + 2
    assert [a[2] for a in got[:REFUSALS_ANSWERED]] == [f"r{i}".encode() for i in range(REFUSALS_ANSWERED)]
    assert got[REFUSALS_ANSWERED] == f("PONG", "ID", "after")  # nothing after them was spoiled
    summary = got[-1]  # when the batch is done
    assert summary[:3] == f("ERROR", "CODE", "400")
    text = summary[4].decode()
    assert f"{1000 - REFUSALS_ANSWERED} more records of this batch refused" in text and f"r{REFUSALS_ANSWERED}" in text
    assert core.counters["rejected_400"] == 1000


# ---------------------------------------------------------------- the broker's PUT-record reader
# (record body, what put_topic reads: (topic, where the data starts) or the 400's reason)
PUT_BODIES = [
    (b"\x01\x00tdata", (b"t", 3)),
    (b"\x03\x00a.bx", (b"a.b", 5)),
    (b"\x00\x00", (b"", 2)),  # (an empty topic is the grammar's to refuse, not the layout's)
    (b"\x02\x00ab", (b"ab", 4)),  # no data
    (b"", "batch record too short for its fields"),
    (b"\x05", "batch record too short for its fields"),
    (b"\x05\x00abc", "PUT record fields run past its end"),
]


@pytest.mark.parametrize(("body", "expected"), PUT_BODIES)
def test_put_topic_reads_a_put_records_topic_or_refuses_it_400(body: bytes, expected: object) -> None:
    blob = b"head" + body + b"tail"  # the record's body inside a larger blob
    start, end = 4, 4 + len(body)
    if isinstance(expected, str):
        with pytest.raises(P.ProtocolError) as refused:
            batch.put_topic(blob, start, end)
        assert (refused.value.code, refused.value.reason) == (400, expected)
    else:
        assert batch.put_topic(blob, start, end) == expected
        topic, data_at = batch.put_topic(blob, start, end)
        assert batch.put_record(topic, blob[start + data_at : end])[5:] == body  # the record it came from
