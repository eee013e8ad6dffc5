"""Durable consumers in the broker core: the delivery state table, pulls, acks, redelivery, dead
letters and persistence, over an in-memory journal (no sockets, no disk, time passed in)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mc0 import protocol as P
from mc0.broker.core.consumerstate import Event, HeldState, held_transition
from mc0.broker.core.dispatch import BrokerCore
from mc0.broker.storage.memstore import MemoryStore
from mc0.permissions import Permissions
from mc0.settings import JournalSettings

# Every (state, event) pair, literally: the next state, or None (ignored, nothing changes).
TABLE = [
    (HeldState.DUE, Event.DELIVER, HeldState.PENDING),
    (HeldState.DUE, Event.ACK, HeldState.SETTLED),
    (HeldState.DUE, Event.NAK, None),
    (HeldState.DUE, Event.TERM, HeldState.SETTLED),
    (HeldState.DUE, Event.ACK_WAIT, None),
    (HeldState.DUE, Event.EXHAUSTED, HeldState.SETTLED),
    (HeldState.PENDING, Event.DELIVER, None),
    (HeldState.PENDING, Event.ACK, HeldState.SETTLED),
    (HeldState.PENDING, Event.NAK, HeldState.DUE),
    (HeldState.PENDING, Event.TERM, HeldState.SETTLED),
    (HeldState.PENDING, Event.ACK_WAIT, HeldState.DUE),
    (HeldState.PENDING, Event.EXHAUSTED, None),
    *[(HeldState.SETTLED, event, None) for event in Event],
]


def test_the_table_covers_every_pair() -> None:
    assert {(s, e) for s, e, _ in TABLE} == {(s, e) for s in HeldState for e in Event}


@pytest.mark.parametrize(("state", "event", "expected"), TABLE)
def test_delivery_transition_table(state: HeldState, event: Event, expected: HeldState | None) -> None:
    assert held_transition(state, event) is expected


def f(*parts: str | bytes) -> list[bytes]:
    return [p.encode() if isinstance(p, str) else p for p in parts]


class Bus:
    """A core with one in-memory journal keeping jobs.>, and named peers."""

    def __init__(self, store: MemoryStore | None = None, permissions: Permissions | None = None) -> None:
        self.store = store or MemoryStore("main", JournalSettings(topics=("jobs.>", "mc0.sys.dead.>")))
        self.core = BrokerCore(journals=[self.store], permissions=permissions)
        self.ids = 0
        self.who: dict[bytes, str] = {}

    def connect(self, rid: bytes, who: str = "anonymous") -> None:
        self.who[rid] = who
        self.core.handle(rid, f("CONNECT", "VERSION", "1.0", "TTL", "60000", "ID", "c"), 0.0, who)

    def publish(self, n: int, now: float = 0.0, start: int = 0) -> None:
        for i in range(start, start + n):
            self.core.handle(b"pub", f("PUT", "TOPIC", "jobs.x", "X-N", str(i), "", str(i)), now, self.who[b"pub"])
        self.core.commit()

    def ask(self, rid: bytes, query: dict[str, Any], now: float = 0.0) -> list[tuple[bytes, Any]]:
        """One request, then a commit (held answers are released there), as the shell does."""
        self.ids += 1
        body = json.dumps({"journal": "main", "name": "c", **query})
        req = f("REQUEST", "SERVICE", P.CONSUMER_SERVICE, "ID", f"r{self.ids}", "", body)
        out = self.core.handle(rid, req, now, self.who[rid])
        return out + self.core.commit()

    def answer(self, rid: bytes, query: dict[str, Any], now: float = 0.0) -> list[bytes]:
        ((to, frames),) = self.ask(rid, query, now)
        assert to == rid
        return frames


def body_of(frames: list[bytes]) -> Any:
    assert frames[0] == b"FINAL", frames
    return json.loads(frames[frames.index(b"") + 1])


def page(frames: list[bytes]) -> list[tuple[int, bytes, int]]:
    """A pull's FINAL -> [(seq, body, deliveries)]."""
    assert frames[0] == b"FINAL", frames
    parts = frames[frames.index(b"") + 1 :]
    records = P.parse_journal_page(parts[:2])
    return [(r.seq, r.body, d) for r, d in zip(records, json.loads(parts[2]), strict=True)]


def error_code(frames: list[bytes]) -> int:
    assert frames[0] == b"ERROR", frames
    return int(frames[frames.index(b"CODE") + 1])


@pytest.fixture
def bus() -> Bus:
    bus = Bus()
    for rid in (b"pub", b"a", b"b"):
        bus.connect(rid)
    return bus


def test_pull_ack_and_the_info_counts(bus: Bus) -> None:
    bus.publish(10)
    assert body_of(bus.answer(b"a", {"op": "create", "ack_wait_ms": 1000}))["cursor"] == 1
    got = page(bus.answer(b"a", {"op": "pull", "max": 4}))
    assert got == [(i + 1, str(i).encode(), 1) for i in range(4)]
    assert body_of(bus.answer(b"a", {"op": "ack", "seqs": [1, 2, 4, 99]})) == {"ack": 3, "ignored": 1}
    info = body_of(bus.answer(b"a", {"op": "info"}))
    assert (info["ack_floor"], info["pending"], info["acked"], info["delivered"], info["lag"]) == (2, 1, 3, 4, 6)
    assert page(bus.answer(b"b", {"op": "pull", "max": 100}))[0][0] == 5  # a competing client: the rest


def test_unsettled_messages_come_back_after_ack_wait_then_dead_letter(bus: Bus) -> None:
    bus.core.handle(b"b", f("SUB", "", "mc0.sys.dead.>"), 0.0)
    bus.publish(2)
    bus.answer(b"a", {"op": "create", "ack_wait_ms": 1000, "max_deliver": 2})
    assert [s for s, _, d in page(bus.answer(b"a", {"op": "pull", "max": 10}, 0.0))] == [1, 2]
    bus.answer(b"a", {"op": "ack", "seqs": [2]}, 0.5)
    assert page(bus.answer(b"a", {"op": "pull", "max": 10}, 0.9)) == []  # not yet due
    assert page(bus.answer(b"b", {"op": "pull", "max": 10}, 1.0)) == [(1, b"0", 2)]  # redelivered, to anyone
    assert bus.core.next_deadline() <= 2.0
    out = bus.core.tick(2.0)  # its second ack_wait passes: max_deliver reached
    (dead,) = [frames for rid, frames in out if rid == b"b"]
    assert dead[:6] == f("MESSAGE", "TOPIC", "mc0.sys.dead.main.c", "SENDER", "mc0.broker", "JOURNAL")
    headers = dict(zip(dead[9:-2:2], dead[10:-2:2], strict=True))
    assert headers[b"X-Dead-Seq"] == b"1" and headers[b"X-Dead-Deliveries"] == b"2" and headers[b"X-N"] == b"0"
    assert b"max_deliver 2" in headers[b"X-Dead-Reason"] and dead[-1] == b"0"
    info = body_of(bus.answer(b"a", {"op": "info"}, 2.0))
    assert (info["dead_lettered"], info["pending"], info["ack_floor"]) == (1, 0, 2)


def test_nak_with_a_delay_and_term(bus: Bus) -> None:
    bus.publish(3)
    bus.answer(b"a", {"op": "create", "ack_wait_ms": 60_000})
    page(bus.answer(b"a", {"op": "pull", "max": 3}, 0.0))
    assert body_of(bus.answer(b"a", {"op": "nak", "seqs": [1], "delay_ms": 500}, 0.0)) == {"nak": 1, "ignored": 0}
    assert body_of(bus.answer(b"a", {"op": "nak", "seqs": [2]}, 0.0)) == {"nak": 1, "ignored": 0}
    assert body_of(bus.answer(b"a", {"op": "term", "seqs": [3]}, 0.0)) == {"term": 1, "ignored": 0}
    assert page(bus.answer(b"a", {"op": "pull", "max": 10}, 0.1)) == [(2, b"1", 2)]
    assert page(bus.answer(b"a", {"op": "pull", "max": 10}, 0.5)) == [(1, b"0", 2)]
    bus.answer(b"a", {"op": "ack", "seqs": [1, 2]}, 0.6)
    assert page(bus.answer(b"a", {"op": "pull", "max": 10}, 100.0)) == []  # 3 was termed: never again
    assert body_of(bus.answer(b"a", {"op": "info"}, 100.0))["termed"] == 1


def test_a_waiting_pull_is_answered_when_records_arrive_or_when_its_wait_ends(bus: Bus) -> None:
    bus.answer(b"a", {"op": "create"})
    assert bus.ask(b"a", {"op": "pull", "max": 5, "wait_ms": 2000}, 0.0) == []  # held
    assert bus.ask(b"b", {"op": "pull", "max": 5, "wait_ms": 500}, 0.0) == []
    bus.core.tick(0.0)  # the first heartbeat sweep
    assert bus.core.next_deadline() == 0.5
    bus.publish(1, 0.1)
    assert bus.core.next_deadline() == 0.0  # a held pull can be answered
    ((rid, frames),) = bus.core.tick(0.1)
    assert rid == b"a" and page(frames) == [(1, b"0", 1)]
    ((rid, frames),) = bus.core.tick(0.5)
    assert rid == b"b" and page(frames) == []  # its wait ended with nothing


def test_max_ack_pending_stops_new_deliveries(bus: Bus) -> None:
    bus.publish(5)
    bus.answer(b"a", {"op": "create", "max_ack_pending": 2})
    assert len(page(bus.answer(b"a", {"op": "pull", "max": 5}))) == 2
    assert page(bus.answer(b"a", {"op": "pull", "max": 5})) == []
    bus.answer(b"a", {"op": "ack", "seqs": [1]})
    assert [s for s, _, _ in page(bus.answer(b"a", {"op": "pull", "max": 5}))] == [3]


def test_state_survives_a_new_core_on_the_same_store(bus: Bus) -> None:
    bus.publish(6)
    bus.answer(b"a", {"op": "create", "ack_wait_ms": 60_000})
    page(bus.answer(b"a", {"op": "pull", "max": 4}))
    bus.answer(b"a", {"op": "ack", "seqs": [1, 3]})
    again = Bus(bus.store)  # a restart: the broker forgot who held 2 and 4
    again.connect(b"a")
    got = page(again.answer(b"a", {"op": "pull", "max": 10}))
    assert got == [(2, b"1", 2), (4, b"3", 2), (5, b"4", 1), (6, b"5", 1)]  # no acked one, no unacked one lost


# (query, expected code) for requests that must change nothing
BAD = [
    ({"op": "fly"}, 400),
    ({"op": "pull", "name": "nope"}, 404),
    ({"op": "create", "journal": "nope"}, 404),
    ({"op": "create", "name": "bad name"}, 400),
    ({"op": "create", "topics": []}, 400),
    ({"op": "create", "topics": ["a..b"]}, 400),
    ({"op": "create", "max_deliver": 0}, 400),
    ({"op": "create", "deliver": "sometimes"}, 400),
    ({"op": "create", "ack_wait_ms": 5}, 409),  # exists with another config
    ({"op": "pull", "max": 0}, 400),
    ({"op": "pull", "max": 5, "wait_ms": -1}, 400),
    ({"op": "ack", "seqs": "1"}, 400),
    ({"op": "ack", "seqs": [0]}, 400),
    ({"op": "ack", "seqs": [True]}, 400),
    ({"op": "nak", "seqs": [1], "delay_ms": "soon"}, 400),
]


@pytest.mark.parametrize(("query", "code"), BAD)
def test_bad_requests_are_answered_and_change_nothing(bus: Bus, query: dict[str, Any], code: int) -> None:
    bus.publish(2)
    bus.answer(b"a", {"op": "create"})
    page(bus.answer(b"a", {"op": "pull", "max": 1}))
    before = body_of(bus.answer(b"a", {"op": "info"}))
    assert error_code(bus.answer(b"a", query)) == code
    assert body_of(bus.answer(b"a", {"op": "info"})) == before


def test_a_consumer_is_only_for_identities_that_may_subscribe_to_its_topics() -> None:
    policy = Permissions.from_table({"identity": {"eve": {"subscribe": ["other.>"]}}})
    bus = Bus(permissions=policy)
    bus.connect(b"pub")
    bus.connect(b"a")
    bus.connect(b"e", "eve")
    bus.answer(b"a", {"op": "create"})
    assert error_code(bus.answer(b"e", {"op": "pull"})) == 403
    assert error_code(bus.answer(b"e", {"op": "create", "name": "mine"})) == 403


def test_an_unreadable_saved_state_refuses_to_start_with_a_clear_error() -> None:
    from mc0.broker.storage.port import StateUnreadable

    store = MemoryStore("main", JournalSettings(topics=("jobs.>",)))
    store.consumers["c"] = b'{"config": {"journal": "main"'
    with pytest.raises(StateUnreadable, match="journal main: consumer c: unreadable saved state"):
        BrokerCore(journals=[store])


def test_a_state_that_cannot_be_saved_answers_507_with_the_request_id(bus: Bus) -> None:
    bus.publish(2)
    bus.answer(b"a", {"op": "create"})
    page(bus.answer(b"a", {"op": "pull", "max": 2}))
    bus.store.fail_writes = True
    frames = bus.answer(b"a", {"op": "ack", "seqs": [1]})
    assert error_code(frames) == 507 and frames[:3] == f("ERROR", "ID", f"r{bus.ids}")
    assert b"consumer state could not be saved" in frames[-1]


# (op, done, ignored): the settle answer is built by hand; its bytes are json.dumps(..., sort_keys=True)'s
SETTLED = [("nak", 0, 0), ("ack", 1, 0), ("ack", 0, 3), ("nak", 2, 1), ("term", 10_000, 0), ("ack", 123, 45)]


@pytest.mark.parametrize(("op", "done", "ignored"), SETTLED)
def test_a_settle_answer_is_the_sorted_json_of_its_counts(op: str, done: int, ignored: int) -> None:
    from mc0.broker.core.consumerstate import settled_body

    assert settled_body(op, done, ignored) == json.dumps({op: done, "ignored": ignored}, sort_keys=True).encode()


# (owner, topics, {seq: deliveries}): the saved state is built by hand; its bytes are the json.dumps form's
STATES = [
    ("", (">",), {}),
    ("alice", ("jobs.>",), {1: 1}),
    ('quo"te\\s', ("jobs.>", "a.*"), {5: 2, 3: 1, 900: 7}),
    ("\u00e9l\u00e8ve", ("\u00e9t\u00e9.>",), {i: i % 5 + 1 for i in range(1, 101)}),
]


@pytest.mark.parametrize(("owner", "topics", "held"), STATES)
def test_the_saved_state_is_the_compact_json_of_the_consumer(
    owner: str, topics: tuple[str, ...], held: dict[int, int]
) -> None:
    from dataclasses import asdict

    from mc0.broker.core.consumerstate import Consumer, ConsumerConfig, Held, consumer_of
    from mc0.topics import split_pattern

    store = MemoryStore("main", JournalSettings(topics=(">",)))
    config = ConsumerConfig("main", "c", topics, ack_wait_ms=1234)
    consumer = Consumer(config, store, tuple(split_pattern(t) for t in topics), 1000, owner)
    for seq, deliveries in held.items():
        consumer.held[seq] = Held(HeldState.PENDING, deliveries, 1.0)
    for new_owner in (owner, "claimed"):  # the cached head follows a claim
        consumer.owner = new_owner
        expected = {
            "config": asdict(config),
            "owner": new_owner,
            "cursor": 1000,
            "held": {str(s): d for s, d in held.items()},
        }
        assert consumer.state() == json.dumps(expected, separators=(",", ":")).encode()
        back = consumer_of(store, consumer.state())
        assert (back.config, back.owner, back.cursor) == (config, new_owner, 1000)
        assert {s: h.deliveries for s, h in back.held.items()} == held


def test_an_answered_ack_saves_a_change_not_the_whole_state_and_a_restart_applies_it(bus: Bus) -> None:
    from mc0.broker.core.consumerstate import MAX_CHANGES

    bus.publish(MAX_CHANGES + 10)
    bus.answer(b"a", {"op": "create", "ack_wait_ms": 60_000})
    page(bus.answer(b"a", {"op": "pull", "max": MAX_CHANGES + 10}))
    whole = bus.store.consumers["c"]  # the pull saved the whole state (cursor, every held seq)
    assert bus.store.consumer_changes.get("c", []) == []
    bus.answer(b"a", {"op": "ack", "seqs": [2]})
    bus.answer(b"a", {"op": "term", "seqs": [3, 4, 999]})
    bus.answer(b"a", {"op": "nak", "seqs": [5]})  # changes nothing saved: no record
    bus.answer(b"a", {"op": "ack", "seqs": [2]})  # already settled: ignored, no record
    assert bus.store.consumers["c"] == whole
    assert bus.store.consumer_changes["c"] == [b'{"settled":[2]}', b'{"settled":[3,4]}']
    again = Bus(bus.store)  # a restart: the whole state, then the changes in order
    again.connect(b"a")
    restored = again.core.consumers.consumers["main", "c"]
    assert restored.changes_saved == 2  # the changes on disk count toward the next whole save
    got = [seq for seq, _, _ in page(again.answer(b"a", {"op": "pull", "max": 1000}))]
    assert got == [1, *range(5, MAX_CHANGES + 11)]
    for seq in range(6, MAX_CHANGES + 6):  # MAX_CHANGES changes in a row (the pull saved it whole) ...
        again.answer(b"a", {"op": "ack", "seqs": [seq]})
    assert len(again.store.consumer_changes["c"]) == MAX_CHANGES
    again.answer(b"a", {"op": "ack", "seqs": [MAX_CHANGES + 6]})  # ... then the whole state again
    assert again.store.consumer_changes.get("c", []) == []
    held = {str(s): 2 for s in (1, 5, *range(MAX_CHANGES + 7, MAX_CHANGES + 11))}  # redelivered after the restart
    assert json.loads(again.store.consumers["c"])["held"] == held


def test_after_a_failed_save_the_next_save_is_whole(bus: Bus) -> None:
    bus.publish(3)
    bus.answer(b"a", {"op": "create"})
    page(bus.answer(b"a", {"op": "pull", "max": 3}))
    bus.store.fail_writes = True
    assert error_code(bus.answer(b"a", {"op": "ack", "seqs": [1]})) == 507
    bus.store.fail_writes = False
    assert body_of(bus.answer(b"a", {"op": "ack", "seqs": [2]})) == {"ack": 1, "ignored": 0}
    assert bus.store.consumer_changes.get("c", []) == []  # whole: the failed change is in it
    assert json.loads(bus.store.consumers["c"])["held"] == {"3": 1}


# change records a restart cannot apply: the broker refuses to start, naming the consumer
BAD_CHANGES = [b"{", b"[]", b'{"settled": 3}', b'{"settled": ["1"]}', b'{"settled": [1.5]}', b'{"acked": [1]}']


@pytest.mark.parametrize("change", BAD_CHANGES)
def test_an_unreadable_change_refuses_to_start_with_a_clear_error(bus: Bus, change: bytes) -> None:
    from mc0.broker.storage.port import StateUnreadable

    bus.answer(b"a", {"op": "create"})
    bus.store.consumer_changes["c"] = [b'{"settled":[1]}', change]
    with pytest.raises(StateUnreadable, match="journal main: consumer c: unreadable saved state"):
        BrokerCore(journals=[bus.store])


def test_a_filtered_consumers_pending_count_is_exact_and_what_its_pulls_then_get(bus: Bus) -> None:
    for i in range(30):
        topic = "jobs.y" if i % 3 == 0 else "jobs.x"
        bus.core.handle(b"pub", f("PUT", "TOPIC", topic, "", str(i)), 0.0, bus.who[b"pub"])
    bus.core.commit()
    body_of(bus.answer(b"a", {"op": "create", "topics": ["jobs.y"], "ack_wait_ms": 1000}))
    (row,) = bus.core.consumers.monitor_rows()
    assert (row["num_pending"], row["num_pending_exact"]) == (10, True)
    assert body_of(bus.answer(b"a", {"op": "info"}))["lag"] == 10
    assert len(page(bus.answer(b"a", {"op": "pull", "max": 4}))) == 4
    (row,) = bus.core.consumers.monitor_rows()
    assert (row["num_pending"], row["num_pending_exact"], row["num_ack_pending"]) == (6, True, 4)
    assert len(page(bus.answer(b"a", {"op": "pull", "max": 100}))) == 6  # what it said was pending


def test_a_pull_past_its_scan_budget_goes_on_at_the_next_turns_and_is_never_an_empty_page_too_soon(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mc0.broker.core import localconsumers as consumers

    monkeypatch.setattr(consumers, "PULL_SCAN_RECORDS", 100)  # (20,000 in the broker: the same rule, smaller)
    monkeypatch.setattr(consumers, "PULL_SCAN_STEP", 10)
    for i in range(350):
        topic = "jobs.y" if i in (340, 345) else "jobs.x"
        bus.core.handle(b"pub", f("PUT", "TOPIC", topic, "", str(i)), 0.0, bus.who[b"pub"])
    bus.core.commit()
    body_of(bus.answer(b"a", {"op": "create", "topics": ["jobs.y"], "ack_wait_ms": 60_000}))
    # Two pulls that do not wait, from two clients: neither is answered [] while 350 records are unread.
    assert bus.ask(b"a", {"op": "pull", "max": 1}) == []
    assert bus.ask(b"b", {"op": "pull", "max": 5}) == []
    assert bus.core.next_deadline() == 0.0  # more to look at: the loop comes back at once
    answered: list[tuple[bytes, list[bytes]]] = []
    turns = 0
    while len(answered) < 2 and turns < 10:  # bounded: 100 records a turn, for both pulls together
        answered += bus.core.tick(0.0) + bus.core.commit()
        turns += 1
    # The pulls looked at 100 records each when they came (201 looked at); turn 1: a looks at 100 more and
    # spends the turn's budget, so b waits; turn 2: a takes 341, b 346 (with a budget per pull, b would
    # have taken both at turn 1 and a been answered empty).
    assert turns == 2
    pages = {rid: page(frames) for rid, frames in answered}
    assert pages == {b"a": [(341, b"340", 1)], b"b": [(346, b"345", 1)]}
    # At the end of the journal, a pull that does not wait is answered at once, empty.
    assert page(bus.answer(b"a", {"op": "pull", "max": 5})) == []


def test_the_pending_count_kept_between_pages_equals_a_count_from_scratch(bus: Bus) -> None:
    body_of(bus.answer(b"a", {"op": "create", "topics": ["jobs.y", "jobs.z.>"], "ack_wait_ms": 60_000}))
    consumers = bus.core.consumers
    (consumer,) = consumers.consumers.values()
    counted = 0
    for step in range(40):  # publishes, pulls, acks and a purge, each followed by a page's count
        for i in range(step % 7):
            topic = ("jobs.y", "jobs.x", "jobs.z.q", "jobs.zz")[(step + i) % 4]
            bus.core.handle(b"pub", f("PUT", "TOPIC", topic, "", "b"), 0.0, bus.who[b"pub"])
        bus.core.commit()
        if step % 3 == 0:
            got = page(bus.answer(b"a", {"op": "pull", "max": 2}))
            if got:
                body_of(bus.answer(b"a", {"op": "ack", "seqs": [s for s, _, _ in got]}))
        if step == 25:
            bus.store.purge(bus.store.next_seq - 3)
        (row,) = consumers.monitor_rows()
        kept = consumer.pending_counted
        consumer.pending_counted = None
        (fresh,) = consumers.monitor_rows()
        assert (row["num_pending"], row["num_pending_exact"]) == (fresh["num_pending"], True), step
        assert kept is not None or row["num_pending"] == 0
        counted += 1
    assert counted == 40


def test_idle_consumers_cost_the_loops_turns_nothing(bus: Bus) -> None:
    """The per-turn questions (has_work, next_deadline, tick) walk only consumers an op reached and
    that still hold timers or waiting pulls, never every consumer."""
    bus.core.consumers.local.max_consumers = bus.core.consumers.local.max_per_identity = 3_000
    bus.publish(5)
    for i in range(2_000):
        bus.answer(b"a", {"op": "create", "name": f"c{i}", "ack_wait_ms": 1000})
    consumers = bus.core.consumers
    assert len(consumers.consumers) == 2_000 and consumers.watched == 0
    assert page(bus.answer(b"a", {"op": "pull", "name": "c7", "max": 2}, 0.0))[0][0] == 1
    assert consumers.watched == 1 and consumers.next_deadline(99.0) == 1.0  # c7's ack_wait
    bus.answer(b"a", {"op": "pull", "name": "c8", "max": 1, "wait_ms": 0}, 0.1)
    bus.answer(b"a", {"op": "ack", "name": "c7", "seqs": [1, 2]}, 0.2)
    assert consumers.watched == 2
    bus.core.tick(1.5)  # the timers' time passed: c7 holds nothing, c8's message is due again
    bus.core.tick(1.55)  # (a consumer found idle leaves at the next walk)
    assert consumers.watched == 0  # c8's message is due again, but nothing waits on a clock: the next pull has it
    assert page(bus.answer(b"b", {"op": "pull", "name": "c8", "max": 1}, 1.6)) == [(1, b"0", 2)]
    bus.answer(b"b", {"op": "ack", "name": "c8", "seqs": [1]}, 1.7)
    bus.core.tick(3.0)
    bus.core.tick(3.05)
    assert consumers.watched == 0


# ------------------------------------------------------------------ the front: each journal's backend
@pytest.mark.parametrize(
    ("journal", "kept_by", "op", "code"),
    [
        ("files", "local", "create", None),  # held until the commit saves it: answered FINAL there
        ("kept", "store", "create", None),  # a store call (consumer_lookup) is queued; nothing answered yet
        ("letters", "local", "create", 403),  # JetStream keeps it, but its letters: no consumer of it anywhere
        ("nosuch", "local", "create", 404),  # no such journal (the local consumers name the ones there are)
        ("kept", "store", "pull", None),  # a store call (consumer_info first: nothing learnt of it yet)
        ("kept", "local", "bogus", 404),  # an op no backend knows: the local consumers' (no such consumer here)
        ("files", "local", "bogus", 404),
        ("kept", "store", "nak", 400),  # the store's own check of the arguments (seqs missing)
    ],
)
def test_each_journal_has_one_consumer_backend_chosen_once_and_its_requests_go_there(
    journal: str, kept_by: str, op: str, code: int | None
) -> None:
    from mc0.broker.core.dispatch import CoreSettings
    from mc0.broker.storage.memstore import MemoryReplicatedStore

    files = MemoryStore("files", JournalSettings(topics=("jobs.>",)))
    kept = MemoryReplicatedStore("kept", JournalSettings(topics=("orders.>",), store="jetstream"))
    letters = MemoryReplicatedStore("letters", JournalSettings(topics=(), store="jetstream", mailboxes=True))
    core = BrokerCore(CoreSettings(), journals=[files, kept, letters])
    core.handle(b"a", f("CONNECT", "VERSION", "1.0", "TTL", "60000", "ID", "c"), 0.0, "alice")
    core.rooms.calls.drain()  # (its mailbox's letters asked of JetStream)
    store, local = core.rooms.store_consumers, core.consumers.local
    assert sorted(store.journals) == ["kept"]
    backend = core.consumers.backend_of(journal)
    assert backend is (store if journal == "kept" else local)  # who keeps a journal's consumers
    body = json.dumps({"op": op, "journal": journal, "name": "c", "topics": [">"]})
    out = core.handle(b"a", f("REQUEST", "SERVICE", P.CONSUMER_SERVICE, "ID", "r1", "", body), 0.0, "alice")
    asked = [call["op"] for _, call in core.rooms.calls.drain()]
    if code is not None:
        ((to, frames),) = out
        assert to == b"a" and error_code(frames) == code and asked == []
    elif kept_by == "store":
        assert out == [] and asked == ["consumer_lookup" if op == "create" else "consumer_info"]
    else:
        assert out == [] and asked == []
        ((_, frames),) = core.commit()
        assert body_of(frames)["config"]["journal"] == journal and local.consumers.keys() == {(journal, "c")}
