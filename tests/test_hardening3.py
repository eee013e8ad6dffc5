"""Hardening, round 3 (issue 18, part A), without sockets: the outbox's framing follows its peer,
short shortcut records are 400s, a peer's faults are logged within a bound, broken configs are
ConfigErrors, a big batch is worked through in slices, and a batch's refusals are coalesced.

Each test here failed on the code before the fix it names."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from mc0 import protocol as P
from mc0.broker.core.batched import REFUSALS_ANSWERED
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.core.loglimit import PER_KEY, LogLimiter
from mc0.broker.outbox import MAX_ORPHANS, ORPHAN_BYTES, ORPHAN_TTL, Outbox
from mc0.config import load
from mc0.errors import ConfigError
from mc0.protocol import Limits, batch

from .test_batch import as_frames, connect_batched
from .test_core import connect, f

OK_FRAMES = f("OK", "ID", "c")
ERROR_401 = P.error(401, "not connected: send CONNECT first")
RECORD = batch.reply_record(True, b"r", b"answer")
RECORDS = batch.put_record(b"t", b"1") + batch.put_record(b"t", b"2")
FINAL_FRAMES = f("FINAL", "ID", "r", "", "answer")
PUT_FRAMES = [f("PUT", "TOPIC", "t", "", "1"), f("PUT", "TOPIC", "t", "", "2")]


def drain(outbox: Outbox, routing_id: bytes) -> list[list[bytes]]:
    sent = []
    for _ in range(100):
        message = outbox.next_message(routing_id)
        if message is None:
            return sent
        sent.append(list(message))
        outbox.sent(routing_id)
    raise AssertionError("the queue never ran dry")


def expand(message: list[bytes]) -> list[list[bytes]]:
    """What a peer reads from a message: a BATCH's records as commands, else the frames."""
    if batch.is_batch(message):
        blob = message[2]
        return [batch.frames_of(blob, code, start, end) for code, start, end in batch.records(blob)]
    return [message]


# (what is put, in order: payload, the peer is batched, the peer is known) -> what the peer reads.
# Item 1 (and 2): a 401 made the routing id's queue unbatched, then the peer connected batched.
MODE_CHANGES = [
    pytest.param(
        [(ERROR_401, False, False), (OK_FRAMES, True, True), (RECORD, True, True)],
        [ERROR_401, OK_FRAMES, FINAL_FRAMES],
        id="401-then-batched",
    ),
    pytest.param(
        [(OK_FRAMES, True, True), (RECORDS, True, True), (ERROR_401, False, True)],
        [OK_FRAMES, *PUT_FRAMES, ERROR_401],
        id="batched-then-unbatched",
    ),
    pytest.param(
        [(RECORDS, True, True), (OK_FRAMES, False, True), (RECORD, True, True)],
        [*PUT_FRAMES, OK_FRAMES, FINAL_FRAMES],
        id="batched-unbatched-batched",
    ),
]


@pytest.mark.parametrize(("puts", "expected"), MODE_CHANGES)
def test_an_outbox_queue_follows_its_peers_framing_whatever_order_the_modes_come_in(
    puts: list[tuple[object, bool, bool]], expected: list[list[bytes]]
) -> None:
    outbox = Outbox(max_bytes=1 << 20, max_messages=100, batch_bytes=1 << 16)
    for payload, batched, known in puts:
        assert outbox.put(b"p", payload, batched=batched, known=known, now=0.0)  # type: ignore[arg-type]
    last_batched = puts[-1][1]
    sent = drain(outbox, b"p")
    if not last_batched:
        assert not any(batch.is_batch(m) for m in sent)  # never a BATCH to a peer that is not batched
    assert [command for message in sent for command in expand(message)] == expected
    assert outbox.backlog(b"p") == 0 and outbox.queued_bytes == 0


def test_an_orphan_queue_adopted_by_a_connected_peer_no_longer_expires() -> None:
    outbox = Outbox(max_bytes=1 << 20, max_messages=100, batch_bytes=1 << 16, orphan_ttl=1.0)
    outbox.put(b"p", ERROR_401, batched=False, known=False, now=0.0)
    outbox.put(b"p", OK_FRAMES, batched=True, known=True, now=0.1)
    assert list(outbox.ready(5.0)) == [b"p"]  # an orphan's queue would have expired at 1.0
    assert drain(outbox, b"p") == [ERROR_401, [*batch.BATCH_MARK, batch.record_of(OK_FRAMES)]]
    outbox.put(b"p", RECORD, batched=True, known=True, now=6.0)
    assert list(outbox.ready(9.0)) == [b"p"]


# ---------------------------------------------------------------- item 3: the log's bound
def test_the_log_limiter_bounds_lines_per_peer_and_per_kind_and_counts_the_rest() -> None:
    limiter = LogLimiter(per_key=2, per_kind=3, window=10.0)
    assert [limiter.allow("mallory", "boom", 0.0) for _ in range(4)] == [True, True, False, False]
    assert limiter.allow("eve", "boom", 1.0) is True  # another peer, the same kind: within the kind's bound
    assert limiter.allow("trent", "boom", 1.0) is False  # the kind's bound holds over all peers
    assert limiter.allow("mallory", "other", 1.0) is True  # another kind
    assert limiter.summary(5.0) == []  # once per window
    (line,) = limiter.summary(10.0)
    assert "3 more log lines like 'boom'" in line and "mallory" in line and "trent" in line
    assert limiter.allow("mallory", "boom", 10.5) is True  # a new window
    assert limiter.suppressed_total == 3


def test_the_log_limiters_table_of_keys_is_bounded() -> None:
    limiter = LogLimiter(per_key=1, per_kind=10**9, window=10.0, max_keys=16)
    for i in range(1000):
        limiter.allow(f"peer{i}", "kind", 0.0)
    assert len(limiter._by_key) <= 16


# ---------------------------------------------------------------- item 3: short shortcut records
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


def test_internal_errors_a_peer_causes_are_logged_within_a_bound_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    core = batched_core()
    caplog.set_level(logging.ERROR, logger="mc0.broker")
    for i in range(1000):
        out = core.internal_error(b"p", f("PING", "ID", str(i)), ValueError("bug"), now=i * 0.001)
        assert answers(out)[0][:3] == f("ERROR", "ID", str(i))  # each still answered 500 with its ID
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == PER_KEY
    assert core.counters["internal_errors"] == 1000 and core.counters["log_lines_left_out"] == 1000 - PER_KEY
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="mc0.broker")
    core.tick(61.0)  # the window is over: one line says how many were left out
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"{1000 - PER_KEY} more log lines" in line


# ---------------------------------------------------------------- item 5: big batches in slices
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


# ---------------------------------------------------------------- item 6: refusals coalesced
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


# ---------------------------------------------------------------- item 4: configs that raised anything but ConfigError
# (name, config text, where the one-line error points); "loop" is a symlink to itself in the config's folder.
BROKEN_CONFIGS = [
    ("nested-arrays", "x = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("nested-inline-tables", "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n", "nested too deeply"),
    ("nested-known-key", "[broker]\nbind = " + "[" * 300 + "]" * 300 + "\n", "broker.bind"),
    ("data-dir-nul", 'data_dir = "a\\u0000b"\n', "data_dir: must not contain a NUL"),
    ("keys-dir-nul", '[security]\nkeys_dir = "k\\u0000"\n', "security.keys_dir: must not contain a NUL"),
    ("bind-nul", '[broker]\nbind = ["tcp://127.0.0.1:1\\u0000"]\n', "broker.bind: must not contain a NUL"),
    ("data-dir-symlink-loop", 'data_dir = "loop/x"\n', "data_dir: cannot resolve"),
]


@pytest.mark.parametrize(("name", "text", "where"), BROKEN_CONFIGS, ids=[c[0] for c in BROKEN_CONFIGS])
def test_a_config_that_raised_anything_but_config_error_is_a_config_error_naming_the_key(
    tmp_path: Path, name: str, text: str, where: str
) -> None:
    (tmp_path / "loop").symlink_to("loop")
    path = tmp_path / "mc0.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load(path)
    message = str(caught.value)
    assert where in message and "\n" not in message and len(message) < 400


# ---------------------------------------------------------------- item 15: the evicted peer's last words
def test_an_evicted_peers_last_words_wait_for_it_however_long_it_stalls_within_a_bound() -> None:
    outbox = Outbox(max_bytes=1 << 20, max_messages=100, batch_bytes=1 << 16)
    last_words = [P.error(429, "consumer too slow"), list(P.DISCONNECT_FRAMES)]
    for frames in last_words:  # (the peer is forgotten: an orphan's queue)
        assert outbox.put(b"slow", frames, batched=False, known=False, now=0.0)
    for now in (0.0, 1.0, 11.0, 60.0, 300.0):  # the peer stalls: the socket will not take them
        assert list(outbox.ready(now)) == [b"slow"]
        assert outbox.next_message(b"slow") == last_words[0]
        outbox.blocked(b"slow", now)
    assert outbox.next_retry() is not None and outbox.next_retry() - 300.0 <= 0.5  # retried, slowly
    assert drain(outbox, b"slow") == last_words  # it reads again: told why, then the DISCONNECT
    assert b"slow" not in outbox.queues
    outbox.put(b"gone", last_words[0], batched=False, known=False, now=0.0)
    assert list(outbox.ready(ORPHAN_TTL + 1)) == [] and b"gone" not in outbox.queues  # but not forever


def test_orphan_queues_are_bounded_in_bytes_and_in_number() -> None:
    outbox = Outbox(max_bytes=1 << 30, max_messages=10**6, batch_bytes=1 << 16)
    answer = P.error(401, "not connected: send CONNECT first")
    accepted = sum(outbox.put(b"stranger", answer, batched=False, known=False, now=0.0) for _ in range(10_000))
    assert accepted * sum(map(len, answer)) <= ORPHAN_BYTES + sum(map(len, answer))
    for i in range(MAX_ORPHANS + 100):
        outbox.put(b"s%d" % i, answer, batched=False, known=False, now=0.0)
    assert len(outbox.queues) == MAX_ORPHANS and b"s0" not in outbox.queues  # the oldest went first


# ---------------------------------------------------------------- item 14: what the hold must not hide
def test_a_peer_whose_queue_refuses_and_never_moves_is_stuck_after_slow_consumer_ms_even_with_no_drops() -> None:
    """While the input is held for a reader nothing is dropped for a stalled peer, so the drop rule
    alone would never evict it: a queue that refused a message and has not moved since is stuck."""
    outbox = Outbox(max_bytes=4096, max_messages=100, batch_bytes=1 << 16)
    frames = f("MESSAGE", "TOPIC", "t", "SENDER", "s", "", "x" * 1000)
    while outbox.put(b"stalled", frames, batched=False, known=True, now=0.0):
        pass  # (bounded: the budget is 4 KiB)
    assert outbox.stuck(2.9, 3.0) == [] and outbox.stuck(3.0, 3.0) == [b"stalled"]
    assert outbox.next_message(b"stalled") is not None
    outbox.sent(b"stalled", 3.1)  # it moved: not stuck
    assert outbox.stuck(10.0, 3.0) == []
    core = batched_core(slow_consumer_ms=3000)
    (why, bye) = answers(core.evict_stalled(b"p", 3.0))
    assert why[:3] == f("ERROR", "CODE", "429") and bye == [b"DISCONNECT"] and b"p" not in core.sessions
    assert core.counters["forgotten_too_slow"] == 1


def test_the_input_is_held_for_a_reading_peer_over_its_mark_until_it_is_under_half_or_it_stops_reading() -> None:
    frames = f("MESSAGE", "TOPIC", "t", "SENDER", "s", "", "x" * 980)  # 1,000 bytes each

    def filled(hold_limit: float, now: float) -> Outbox:
        outbox = Outbox(max_bytes=40_000, max_messages=1000, batch_bytes=1 << 16, hold_limit=hold_limit)
        for _ in range(9):  # the hold mark is a quarter of the budget: 10,000
            outbox.put(b"r", frames, batched=False, known=True, now=now)
        assert not outbox.holding_input(now)  # under the mark
        outbox.put(b"r", frames, batched=False, known=True, now=now)
        outbox.put(b"r", frames, batched=False, known=True, now=now)
        return outbox

    outbox = filled(100.0, 0.0)
    assert outbox.holding_input(0.5)  # over it, and nothing says it does not read (yet)
    assert not outbox.holding_input(1.1)  # the socket took nothing for it in READING_WINDOW: not reading
    outbox.next_message(b"r")
    outbox.blocked(b"r", 1.0)  # libzmq's pipe is full ...
    outbox.sent(b"r", 2.5)  # ... and it took again 1.5 s later: a reader that stalls that long
    assert outbox.holding_input(6.4) and not outbox.holding_input(7.1)  # about 3 x its stall (slowly forgotten)
    for now in (7.2, 7.3, 7.4, 7.5, 7.6):  # it reads again: under half the mark
        outbox.next_message(b"r")
        outbox.sent(b"r", now)
    assert outbox.backlog(b"r") == 5_000 and not outbox.holding_input(7.6)  # released

    outbox = filled(5.0, 8.0)
    for now in (8.5, 9.0, 9.5, 10.0, 10.5, 11.0, 11.5, 12.0, 12.5):  # it reads, one message at a time ...
        outbox.next_message(b"r")
        outbox.sent(b"r", now)
        outbox.put(b"r", frames, batched=False, known=True, now=now)  # ... and as much comes in
    assert outbox.holding_input(12.9) and not outbox.holding_input(13.0)  # hold_limit (5 s) in a row, no more
