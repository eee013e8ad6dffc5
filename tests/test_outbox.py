"""The outbox (mc0.broker.outbox): each peer's queue follows its framing, orphan queues (what is owed to a
routing id the core no longer knows) are bounded and kept for a stalled reader within that bound, a
queue that refuses and never moves is stuck, and the input is held for a reading peer over its mark.
No sockets: the shell's sends are played by taking the queues by hand."""

from __future__ import annotations

import pytest

from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.outbox import MAX_ORPHANS, ORPHAN_BYTES, ORPHAN_TTL, Outbox
from mc0.protocol import batch

from .test_batch import as_frames, connect_batched
from .test_core import f

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


def batched_core(**settings: object) -> BrokerCore:
    core = BrokerCore(CoreSettings(**settings))  # type: ignore[arg-type]
    assert connect_batched(core, b"p")[0] == b"OK"
    return core


def answers(out: list[tuple[bytes, object]], to: bytes = b"p") -> list[list[bytes]]:
    return [as_frames(item) for rid, item in out if rid == to]


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


def test_the_ok_that_grants_batches_leaves_alone_before_any_batch_and_what_follows_is_batched() -> None:
    """A batched peer reads the OK to its CONNECT ... BATCH 1 as a message of its own (docs/PROTOCOL.md,
    "Batched framing"); frames queued behind it become records of one BATCH, in order."""
    outbox = Outbox(max_bytes=1 << 20, max_messages=100, batch_bytes=1 << 16)
    ok = P.Unbatched(f("OK", "ID", "c", "TTL", "1000", "BATCH", "1"))
    for payload in (ok, OK_FRAMES, RECORDS):
        assert outbox.put(b"p", payload, batched=True, known=True, now=0.0)
    sent = drain(outbox, b"p")
    assert sent[0] == list(ok) and not batch.is_batch(sent[0])
    assert len(sent) == 2 and batch.is_batch(sent[1])
    assert expand(sent[1]) == [OK_FRAMES, *PUT_FRAMES]


def test_an_orphan_queue_adopted_by_a_connected_peer_no_longer_expires() -> None:
    outbox = Outbox(max_bytes=1 << 20, max_messages=100, batch_bytes=1 << 16, orphan_ttl=1.0)
    outbox.put(b"p", ERROR_401, batched=False, known=False, now=0.0)
    outbox.put(b"p", OK_FRAMES, batched=True, known=True, now=0.1)
    assert list(outbox.ready(5.0)) == [b"p"]  # an orphan's queue would have expired at 1.0
    assert drain(outbox, b"p") == [ERROR_401, [*batch.BATCH_MARK, batch.record_of(OK_FRAMES)]]
    outbox.put(b"p", RECORD, batched=True, known=True, now=6.0)
    assert list(outbox.ready(9.0)) == [b"p"]


# ---------------------------------------------------------------- the evicted peer's last words (orphan queues)
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


# ---------------------------------------------------------------- what the hold must not hide
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
