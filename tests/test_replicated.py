"""Journals kept by JetStream, in the core (no sockets, no NATS: the in-memory replicated store stands for
the stream, and the test plays the cluster link), the local copy on real files, and the config keys.

The same rules with real nats-server nodes: tests/test_jetstream_live.py and tests/test_jetstream_faults.py."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mc0 import protocol as P
from mc0.broker.core import routeinput
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.core.journaling import CATCH_UP_S
from mc0.broker.jetstream import fromstore
from mc0.broker.jetstream.replicated import ReplicatedJournal
from mc0.broker.jetstream.storeconsumers import known_of
from mc0.broker.storage.memstore import MemoryReplicatedStore, MemoryStore
from mc0.config import check_stores, parse
from mc0.errors import ConfigError
from mc0.message import Record
from mc0.protocol import jetstream as jsw
from mc0.protocol.journalrecords import encode_payload
from mc0.settings import JournalSettings

from .conftest import headers_of, payload_of
from .test_core import connect, f

CLUSTER = '[cluster]\nnats = ["nats://127.0.0.1:4222"]\n'


# ------------------------------------------------------------------ configuration
@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('[journals.main]\nstore = "jetstream"', "journals.main.store"),  # no [cluster] nats
        ('[journals.main]\nstore = "s3"', "journals.main.store"),
        ("[journals.main]\nreplicas = 3", "journals.main.replicas"),  # a file journal has none
        ("[journals.main]\nmax_messages = 10", "journals.main.max_messages"),
        (CLUSTER + '[journals.main]\nstore = "jetstream"\nreplicas = 0', "journals.main.replicas"),
        (CLUSTER + '[journals.main]\nstore = "jetstream"\nreplicas = 6', "journals.main.replicas"),
        (CLUSTER + '[journals.main]\nstore = "jetstream"\ndedup_max_ids = 10', "journals.main.dedup_max_ids"),
        (CLUSTER + '[journals.main]\nstore = "jetstream"\nmax_messages = -1', "journals.main.max_messages"),
    ],
)
def test_a_jetstream_key_it_cannot_honour_or_a_missing_cluster_is_a_config_error_naming_it(
    text: str, where: str
) -> None:
    with pytest.raises(ConfigError) as info:
        check_stores(parse(text, "mc0.toml"))  # (the store's check is the broker's: --cluster may name NATS)
    assert info.value.where in (f"mc0.toml: {where}", where)


def test_a_jetstream_journal_loads_with_what_jetstream_honours() -> None:
    text = CLUSTER + (
        '[journals.events]\nstore = "jetstream"\nreplicas = 5\nmax_messages = 1000\nmax_bytes = 4096\n'
        'max_age_s = 60\ndedup_window_s = 30\nfsync = "always"\ntopics = ["orders.>"]\n'
    )
    journal = parse(text, "x").journals["events"]
    assert journal.replicated and (journal.replicas, journal.max_messages, journal.dedup_window_s) == (5, 1000, 30)
    from mc0.broker.jetstream.streams import specs_of

    config = specs_of(parse(text, "x"))["events"].config()
    assert config["name"] == "MC0_J_events" and config["subjects"] == ["mc0.j.events.>"]
    assert (config["num_replicas"], config["max_msgs"], config["max_bytes"]) == (5, 1000, 4096)
    assert (config["max_age"], config["duplicate_window"]) == (60 * 10**9, 30 * 10**9)
    assert parse("[journals.plain]\n", "x").journals["plain"].store == "file"


# ------------------------------------------------------------------ the core
def core_with(*journals: MemoryStore, backlog: Callable[[bytes], int] | None = None) -> BrokerCore:
    core = BrokerCore(CoreSettings(), journals=list(journals), wall_offset=1000.0, backlog=backlog)
    routeinput.join(core.rooms, "b1", route_ttl=1.0)
    for rid in (b"pub", b"sub", b"other"):
        connect(core, rid, who=rid.decode())
    return core


def store(topics: tuple[str, ...] = ("orders.>",), name: str = "main", **settings: Any) -> MemoryReplicatedStore:
    return MemoryReplicatedStore(name, JournalSettings(topics=topics, store="jetstream", **settings))


def put(core: BrokerCore, rid: bytes, *frames: str) -> list[Any]:
    return core.handle(rid, f("PUT", *frames), 0.0, rid.decode())


def deliver(core: BrokerCore, j: MemoryReplicatedStore, token: int, now: float = 0.0) -> tuple[list[Any], list[Any]]:
    """The stream stores ``token``: (its OK, what the broker then delivers), as the link reports them."""
    seq, duplicate, record, origin = j.store(token)
    ok = fromstore.stored(core.rooms, j.name, token, seq, duplicate, now)
    if record is None:
        return ok, []
    j.arrived(record)
    return ok, fromstore.arrived(core.rooms, j.name, [(record, origin)], now)


def test_the_ok_waits_for_the_stream_and_names_its_seq_and_every_broker_delivers_from_the_stream() -> None:
    j = store()
    core = core_with(j)
    core.handle(b"sub", f("SUB", "", "orders.>"), 0.0, "sub")
    assert put(core, b"pub", "TOPIC", "orders.1", "ID", "p1", "MSGID", "m1", "X-k", "v", "", "body") == []
    assert core.uncommitted and core.commit() == []  # proposed to the stream: no OK, no delivery yet
    (token,) = j.sent
    topic, sender, headers, parts, msgid, origin = j.sent[token]
    assert (topic, sender, headers, parts) == ("orders.1", "pub", {"MSGID": "m1", "X-k": "v"}, (b"body",))
    assert msgid == jsw.msg_id("pub", "m1") and origin == ""  # (no ECHO 0, no queue group: nobody needs it)
    ok, out = deliver(core, j, token)
    assert ok == [(b"pub", P.ok_journaled("p1", "main", 1))]
    assert [rid for rid, _ in out] == [b"sub"]
    frames = list(out[0][1])
    assert headers_of(frames)["JOURNAL"] == "main" and headers_of(frames)["SEQ"] == "1"
    assert headers_of(frames)["X-k"] == "v" and payload_of(frames) == [b"body"]
    # The same MSGID again: JetStream's duplicate window answers with the first seq; nothing delivered.
    put(core, b"pub", "TOPIC", "orders.1", "ID", "p2", "MSGID", "m1", "", "body")
    core.commit()
    ok, out = deliver(core, j, max(j.sent))
    assert ok == [(b"pub", P.ok_journaled("p2", "main", 1, duplicate=True))] and out == []


def test_a_store_failure_is_an_error_naming_the_journal_and_nothing_is_delivered() -> None:
    j = store()
    core = core_with(j)
    for rid, code in ((b"a", 504), (b"b", 429), (b"c", 507), (b"d", 500)):
        put(core, b"pub", "TOPIC", "orders.1", "ID", rid.decode(), "", "x")
        core.commit()
        out = fromstore.failed(core.rooms, "main", max(j.sent), code, "why", 0.0)
        expected = code if code != 500 else 507  # the store speaks in 504/429/507 only
        assert out == [(b"pub", P.error(expected, "journal main: why", rid.decode()))]
    assert fromstore.stored(core.rooms, "main", 999, 5, False, 0.0) == []  # an answer nobody waits for


def test_echo_0_and_queue_groups_are_the_origin_brokers_and_a_record_from_elsewhere_reaches_own_plain_subscribers() -> (
    None
):
    j = store()
    core = core_with(j)
    connect(core, b"quiet", who="quiet")
    core.handle(b"quiet", f("CONNECT", "VERSION", "1.0", "ECHO", "0", "ID", "c"), 0.0, "quiet")
    for rid in (b"quiet", b"sub"):
        core.handle(rid, f("SUB", "", "orders.>"), 0.0, rid.decode())
    core.handle(b"other", f("SUB", "GROUP", "g", "", "orders.>"), 0.0, "other")
    put(core, b"quiet", "TOPIC", "orders.1", "", "mine")
    core.commit()
    _, out = deliver(core, j, max(j.sent))
    assert sorted(rid for rid, _ in out) == [b"other", b"sub"]  # not to its ECHO 0 publisher; the group's copy here
    # A record another broker published: this broker's plain subscribers only (the group is that broker's).
    record = Record(2, 0.0, "orders.2", "x", {}, (b"theirs",))
    j.arrived(record)
    out = fromstore.arrived(core.rooms, "main", [(record, jsw.origin("b2", b"someone"))], 0.0)
    assert sorted(rid for rid, _ in out) == [b"quiet", b"sub"]


def test_a_topic_two_journals_keep_is_delivered_once_by_the_first_by_name() -> None:
    a, b = store(name="a"), store(name="b")
    core = core_with(a, b)
    core.handle(b"sub", f("SUB", "", "orders.>"), 0.0, "sub")
    put(core, b"pub", "TOPIC", "orders.1", "ID", "p", "", "x")
    core.commit()
    ok, out_a = deliver(core, a, max(a.sent))
    assert ok == [(b"pub", P.ok_journaled("p", "a", 1))] and [rid for rid, _ in out_a] == [b"sub"]
    assert deliver(core, b, max(b.sent)) == ([], [])  # b's copy: stored, not delivered twice


def test_a_replay_while_records_arrive_delivers_each_once_in_order() -> None:
    j = store()
    core = core_with(j)
    for i in range(3):
        put(core, b"pub", "TOPIC", "orders.x", "", str(i))
    core.commit()
    for token in sorted(j.sent):
        deliver(core, j, token)
    ok = [(b"sub", P.ok_journaled("s", "main", 4))]  # (SEQ: the copy's next seq, where the history ends)
    assert core.handle(b"sub", f("SUB", "ID", "s", "FROM", "2", "", "orders.>"), 0.0, "sub") == ok
    put(core, b"pub", "TOPIC", "orders.x", "", "3")
    core.commit()
    _, live = deliver(core, j, max(j.sent))
    assert live == []  # held back: the replay will reach it
    seqs = []
    for _ in range(5):
        seqs += [s.seq for s in core.pages(0.0) if s.kind == "replay"]
    assert seqs == [2, 3, 4] and not core.paging


def test_a_replay_from_past_a_copy_that_is_behind_gets_nothing_before_its_from_live_or_replayed() -> None:
    """A subscriber failing over to a broker whose copy is behind asks FROM the seq after the last it had:
    the records before it, which this copy's feed brings later, are not for it (it had them elsewhere)."""
    j = store()
    core = core_with(j)
    for i in range(8):
        put(core, b"pub", "TOPIC", "orders.x", "", str(i))
    core.commit()
    tokens = sorted(j.sent)
    deliver(core, j, tokens[0])  # this copy holds seq 1 only; the stream goes to 8 elsewhere
    core.handle(b"other", f("SUB", "", "orders.>"), 0.0, "other")
    assert core.handle(b"sub", f("SUB", "ID", "s", "FROM", "6", "", "orders.>"), 0.0, "sub") == [
        (b"sub", P.ok_journaled("s", "main", 2))
    ]
    assert [s for s in core.pages(0.0) if s.kind == "replay"] == [] and not core.paging  # (caught up, it thinks)
    assert core.counters["replay_floors"] == 1
    heard: dict[bytes, list[int]] = {b"sub": [], b"other": []}
    for token in tokens[1:]:
        _, out = deliver(core, j, token)
        for rid, frames in out:
            heard[rid].append(int(headers_of(list(frames))["SEQ"]))
    assert heard == {b"sub": [6, 7, 8], b"other": [2, 3, 4, 5, 6, 7, 8]}
    assert not core.journaling.floors  # (passed: ended)


@pytest.mark.parametrize("ends", ["unsubscribed", "made anew", "gone"])
def test_a_floor_ends_with_its_pattern_its_stream_or_its_subscriber(ends: str) -> None:
    j = store()
    core = core_with(j)
    core.handle(b"sub", f("SUB", "ID", "s", "FROM", "50", "", "orders.>"), 0.0, "sub")
    core.pages(0.0)
    assert core.journaling.floors
    if ends == "unsubscribed":
        core.handle(b"sub", f("UNSUB", "", "orders.>"), 0.0, "sub")
        core.handle(b"sub", f("SUB", "", "orders.>"), 0.0, "sub")  # (live again, no FROM)
    elif ends == "made anew":
        j.created = "made-2"  # the stream deleted and made again: its seqs start from 1 again
    else:
        core.handle(b"sub", f("DISCONNECT", "ID", "bye"), 0.0, "sub")
        connect(core, b"sub", who="sub")
        core.handle(b"sub", f("SUB", "", "orders.>"), 0.0, "sub")
    put(core, b"pub", "TOPIC", "orders.x", "", "new")
    core.commit()
    _, out = deliver(core, j, max(j.sent))
    assert [rid for rid, _ in out] == [b"sub"] and not core.journaling.floors


def fetch_turns(core: BrokerCore, now: float, turns: int = 5) -> list[Any]:
    out = []
    for _ in range(turns):
        out += core.pages(now)
    return out


def test_a_fetch_waits_for_the_local_copy_to_hold_what_the_stream_acknowledged() -> None:
    j = store()
    core = core_with(j)
    for i in range(4):
        put(core, b"pub", "TOPIC", "orders.x", "", str(i))
    core.commit()
    stored = [j.store(token) for token in sorted(j.sent)]  # acknowledged; the copy holds only the first two
    for _, _, record, _ in stored[:2]:
        assert record is not None
        j.arrived(record)
    assert (j.next_seq, j.stored_next_seq) == (3, 5)
    query = json.dumps({"op": "fetch", "journal": "main", "from_seq": 1})
    assert core.handle(b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", query), 0.0, "sub") == []
    first = fetch_turns(core, 0.0)
    assert [o.records for o in first if o.kind == "fetch"] == [2]  # what is here; the rest is awaited, no FINAL
    for _, _, record, _ in stored[2:]:
        assert record is not None
        j.arrived(record)
    rest = fetch_turns(core, 0.01)
    assert [o.records for o in rest if o.kind == "fetch"] == [2, 0]  # the page, then the FINAL
    final = json.loads(payload_of(list(rest[-1].frames))[-1])
    assert (final["records"], final["next_seq"], final["end_seq"]) == (4, 5, 5)


def acknowledged_not_copied() -> tuple[MemoryReplicatedStore, BrokerCore]:
    """A record JetStream acknowledged that never reached this broker's local copy."""
    j = store()
    core = core_with(j)
    put(core, b"pub", "TOPIC", "orders.x", "", "x")
    core.commit()
    j.store(max(j.sent))
    return j, core


def test_a_fetch_whose_copy_never_catches_up_ends_where_it_stopped() -> None:
    j, core = acknowledged_not_copied()
    query = json.dumps({"op": "fetch", "journal": "main", "from_seq": 1})
    core.handle(b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", query), 0.0, "sub")
    assert fetch_turns(core, 0.0) == []
    final = [o for o in fetch_turns(core, CATCH_UP_S + 1) if o.kind == "fetch"]
    assert json.loads(payload_of(list(final[-1].frames))[-1])["next_seq"] == 1
    assert core.counters["fetch_copy_behind"] == 1


# ------------------------------------------------------------------ consumers and letters through store calls
def answer(core: BrokerCore, data: dict[str, Any], records: list[Record] = ()) -> list[Any]:  # type: ignore[assignment]
    (token, _), *more = fromstore.calls(core.rooms)
    assert more == []
    return fromstore.answered(core.rooms, token, data, records, 0.0)


def consumer_request(core: BrokerCore, rid: str, **query: Any) -> list[Any]:
    body = json.dumps({"journal": "main", "name": "c", **query})
    return core.handle(b"sub", f("REQUEST", "SERVICE", "mc0.consumer", "ID", rid, "", body), 0.0, "sub")


def test_a_store_consumer_is_created_once_pulled_filtered_and_dead_lettered_by_the_core() -> None:
    j = store(topics=(">", "mc0.sys.dead.>"))
    core = core_with(j)
    assert consumer_request(core, "1", op="create", topics=["orders.>"], max_deliver=2) == []
    (_, lookup), *_ = core.calls._queued
    assert (lookup["op"], lookup["owner"]) == ("consumer_lookup", "sub")
    assert answer(core, {"owned": 0, "total": 0}) == []  # then the create
    (_, create), *_ = core.calls._queued
    assert create["op"] == "consumer_create" and create["config"]["max_deliver"] == 2
    metadata = {jsw.OWNER_KEY: "sub", jsw.CONFIG_KEY: json.dumps(create["config"])}
    created = answer(core, {"info": {"metadata": metadata, "num_pending": 3}})
    assert json.loads(payload_of(list(created[0][1]))[-1])["lag"] == 3
    assert consumer_request(core, "2", op="pull", max=10) == []
    records = [
        Record(1, 0.0, "orders.a", "pub", {}, (b"one",)),
        Record(2, 0.0, "orders.b", "pub", {}, (b"two",)),
        Record(3, 0.0, "mc0.sys.rpc", "pub", {}, (b"{}",)),  # JetStream's ">" takes it; mc0's topics do not
    ]
    page = answer(core, {"deliveries": [1, 3, 1], "records": [[1, 0], [2, 0], [3, 0]]}, records)
    given = P.parse_journal_page(payload_of(list(page[0][1]))[:-1])
    assert [r.seq for r in given] == [1] and json.loads(payload_of(list(page[0][1]))[-1]) == [1]
    (_, term), *_ = core.calls._queued  # the rest terminated: one past max_deliver, one not its topic
    assert (term["op"], term["how"], sorted(term["seqs"])) == ("consumer_settle", "term", [2, 3])
    assert core.counters["consumer_dead_lettered"] == 1 and core.counters["consumer_filtered"] == 1
    core.commit()  # the dead letter is proposed to the journal that keeps mc0.sys.dead.>
    (dead,) = [p for p in j.sent.values() if p[0].startswith("mc0.sys.dead.")]
    assert dead[0] == "mc0.sys.dead.main.c" and dead[2]["X-Dead-Seq"] == "2"


@pytest.mark.parametrize("op", [["pull"], {"op": "pull"}])
def test_an_op_that_is_no_string_on_a_jetstream_journal_is_answered_as_any_unknown_op(op: Any) -> None:
    """It was unhashable in the test of store ops (a TypeError out of the core: the request went unanswered)."""
    core = core_with(store())
    ((to, refused),) = consumer_request(core, "bad", op=op)
    ((_, fly),) = consumer_request(core, "bad", op="fly")
    assert to == b"sub" and refused[:5] == f("ERROR", "ID", "bad", "CODE", "404") and refused == fly
    assert not core.calls.queued  # nothing asked of the store


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=2),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["main", "loc"]),
    st.dictionaries(
        st.sampled_from(["op", "name", "max", "wait_ms", "seqs", "delay_ms", "topics"]),
        JSON | st.sampled_from(["create", "info", "pull", "ack", "nak", "term", "delete", "list"]),
    ),
)
def test_any_json_request_on_a_jetstream_or_a_local_journal_is_answered_or_asked_of_the_store(
    journal: str, query: dict[str, Any]
) -> None:
    """Never an exception out of the core: an answer now, or a store call that will answer it (or a
    local create's answer, held until the commit)."""
    core = core_with(store(), MemoryStore("loc", JournalSettings(topics=("jobs.>",))))
    body = json.dumps({"journal": journal, **query})
    out = core.handle(b"sub", f("REQUEST", "SERVICE", "mc0.consumer", "ID", "q", "", body), 0.0, "sub")
    out += core.commit()
    assert out or core.calls.queued


def test_a_pull_cancelled_or_whose_client_went_is_answered_by_nobody() -> None:
    j = store()
    core = core_with(j)
    config = {"journal": "main", "name": "c", "topics": [">"], "ack_wait_ms": 30000, "max_deliver": 5}
    config |= {"max_ack_pending": 1000, "deliver": "all"}
    known = known_of({"metadata": {jsw.OWNER_KEY: "sub", jsw.CONFIG_KEY: json.dumps(config)}})
    core.rooms.store_consumers._learn("main", "c", known, 0.0)
    consumer_request(core, "p", op="pull", max=1, wait_ms=1000)
    assert core.calls._queued[0][1]["op"] == "consumer_pull"  # (known here: no info asked first)
    assert core.handle(b"sub", f("CANCEL", "ID", "p"), 0.0, "sub")[0][1][:5] == f("ERROR", "ID", "p", "CODE", "499")
    assert answer(core, {"deliveries": [], "records": []}) == []


def test_a_clients_store_calls_in_flight_are_bounded_429_beyond_a_cancel_frees_none_an_answer_one() -> None:
    j = store()
    core = core_with(j)
    config = {"journal": "main", "name": "c", "topics": [">"], "ack_wait_ms": 30000, "max_deliver": 5}
    config |= {"max_ack_pending": 1000, "deliver": "all"}
    assert core.rooms.store_consumers.max_calls == jsw.MAX_STORE_CALLS
    known = known_of({"metadata": {jsw.OWNER_KEY: "sub", jsw.CONFIG_KEY: json.dumps(config)}})
    core.rooms.store_consumers._learn("main", "c", known, 0.0)
    seqs = list(range(1, 10_001))  # the most one ack may carry
    for i in range(jsw.MAX_STORE_CALLS - 1):
        assert consumer_request(core, f"a{i}", op="ack", seqs=seqs) == []
    assert consumer_request(core, "p", op="pull", max=1, wait_ms=1000) == []
    assert core.handle(b"sub", f("CANCEL", "ID", "p"), 0.0, "sub")[0][1][:5] == f("ERROR", "ID", "p", "CODE", "499")
    queued = len(fromstore.calls(core.rooms))
    assert queued == jsw.MAX_STORE_CALLS  # the cancelled pull still runs on the link: it still counts
    for rid in ("over", "p"):
        ((to, refused),) = consumer_request(core, rid, op="ack", seqs=seqs)
        assert to == b"sub" and refused[:5] == f("ERROR", "ID", rid, "CODE", "429")
    assert not core.calls.queued and core.counters["store_calls_refused"] == 2  # nothing was asked of the store
    # Another client is not held by it (its own count); one answer frees one slot.
    info = json.dumps({"journal": "main", "name": "theirs", "op": "info"})
    assert core.handle(b"other", f("REQUEST", "SERVICE", "mc0.consumer", "ID", "o", "", info), 0.0, "other") == []
    assert [call["op"] for _, call in core.calls._queued] == ["consumer_info"]
    core.calls.drain()
    assert fromstore.answered(core.rooms, 1, {"done": 10_000, "ignored": 0}, [], 0.0)[0][0] == b"sub"
    assert consumer_request(core, "again", op="ack", seqs=[1]) == []
    ((_, refused),) = consumer_request(core, "then", op="ack", seqs=[1])
    assert refused[:5] == f("ERROR", "ID", "then", "CODE", "429")
    core.handle(b"sub", f("DISCONNECT", "ID", "bye"), 0.0, "sub")  # gone: nothing of it counts any more
    assert core.calls.in_flight(b"sub") == 0


def test_a_clients_store_calls_are_bounded_by_max_requests_when_that_is_lower_than_max_store_calls() -> None:
    """``max_requests`` bounds one client's outstanding requests (docs/SECURITY.md); a request on a
    JetStream consumer is one, held as a store call: at most ``max_requests`` of them when that is
    lower than MAX_STORE_CALLS (the bound had lost its min() when a line was saved for a file's size)."""
    core = BrokerCore(CoreSettings(max_requests=2), journals=[store()], wall_offset=1000.0)
    routeinput.join(core.rooms, "b1", route_ttl=1.0)
    connect(core, b"sub", who="sub")
    assert core.rooms.store_consumers.max_calls == 2
    assert consumer_request(core, "1", op="info") == [] and consumer_request(core, "2", op="info") == []
    ((to, refused),) = consumer_request(core, "3", op="info")
    assert to == b"sub" and refused[:5] == f("ERROR", "ID", "3", "CODE", "429")
    assert b"the limit per client (2)" in refused[-1]
    assert len(fromstore.calls(core.rooms)) == 2 and core.counters["store_calls_refused"] == 1


def test_all_clients_store_calls_together_are_bounded_many_connections_cannot_multiply_theirs() -> None:
    core = core_with(store())
    consumers = core.rooms.store_consumers
    assert consumers.max_total == jsw.MAX_STORE_CALLS_TOTAL > jsw.MAX_STORE_CALLS
    consumers.max_total = 3

    def info(rid: bytes, request_id: str) -> list[Any]:
        body = json.dumps({"journal": "main", "name": f"of-{rid.decode()}", "op": "info"})
        frames = f("REQUEST", "SERVICE", "mc0.consumer", "ID", request_id, "", body)
        return core.handle(rid, frames, 0.0, rid.decode())

    for rid in (b"pub", b"sub", b"other"):  # one call each: under the per-client bound, at the total
        assert info(rid, "1") == []
    assert core.calls.in_flight_total == 3
    ((to, refused),) = info(b"pub", "2")
    assert to == b"pub" and refused[:5] == f("ERROR", "ID", "2", "CODE", "429")
    assert b"on this broker" in refused[-1]
    assert core.counters["store_calls_refused"] == 1 and len(core.calls.drain()) == 3  # nothing more asked
    assert fromstore.answered(core.rooms, 1, {"error": {"code": 404, "description": "no such consumer"}}, [], 0.0)
    assert core.calls.in_flight_total == 2 and info(b"pub", "3") == []  # an answer frees a slot
    # A client gone frees none: its call still runs on the link (else reconnecting would multiply them).
    core.handle(b"other", f("DISCONNECT", "ID", "bye"), 0.0, "other")
    assert core.calls.in_flight_total == 3 and core.calls.in_flight(b"other") == 0
    ((_, refused),) = info(b"sub", "4")
    assert refused[:5] == f("ERROR", "ID", "4", "CODE", "429")
    assert fromstore.answered(core.rooms, 3, {"error": {"code": 404, "description": "no such consumer"}}, [], 0.0) == []
    assert core.calls.in_flight_total == 2 and core.counters["store_answers_dropped"] == 1  # (to nobody)
    assert info(b"sub", "5") == [] and core.calls.in_flight_total == 3


def test_letters_kept_in_the_stream_are_read_when_their_identity_comes_and_removed_once_sent() -> None:
    box = MemoryReplicatedStore(
        "box", JournalSettings(store="jetstream", mailboxes=True, topics=("mc0.sys.mailbox.>",))
    )
    sent: dict[bytes, bool] = {}  # has carol's queue sent everything? (the shell's backlog)
    core = core_with(box, backlog=lambda rid: 0 if sent.get(rid, True) else 1)
    called = fromstore.calls(core.rooms)
    assert {call["identity"] for _, call in called} == {"pub", "sub", "other"}  # their mailboxes read
    out = core.handle(b"pub", f("PUT", "TOPIC", "note.x", "ID", "l1", "TO", "carol", "", "hello"), 0.0, "pub")
    assert out == [] and core.commit() == []
    (token,) = box.sent
    topic, sender, headers, parts, _, identity = box.sent[token]
    assert (topic, sender, identity, headers["TO"], parts) == (
        "mc0.sys.mailbox.letter",
        "pub",
        "carol",
        "carol",
        (b"hello",),
    )
    assert fromstore.stored(core.rooms, "box", token, 7, False, 0.0) == [(b"pub", P.ok_mailbox("l1", P.MAILBOX_STORED))]
    connect(core, b"carol", who="carol")
    (_, read), *_ = core.calls._queued
    assert read == {"op": "letters_read", "journal": "box", "identity": "carol", "after": 0}
    letter = Record(7, 0.0, topic, sender, headers, parts)
    delivered = answer(core, {"records": [[7, 0]]}, [letter])
    assert [rid for rid, _ in delivered] == [b"carol"] and payload_of(list(delivered[0][1])) == [b"hello"]
    sent[b"carol"] = False
    core.commit()
    assert not core.calls.queued  # still queued for carol: not removed from the stream
    sent[b"carol"] = True
    core.commit()
    (_, purge), *_ = core.calls._queued
    assert purge == {"op": "letters_purge", "journal": "box", "identity": "carol", "upto": 7}


def carols(core: BrokerCore) -> list[tuple[int, dict[str, Any]]]:
    """The store calls queued for carol's mailbox (the other identities' second reads left unanswered)."""
    return [(token, call) for token, call in fromstore.calls(core.rooms) if call.get("identity") == "carol"]


def test_a_session_still_draining_its_letters_at_the_second_read_gets_each_letter_once_in_order() -> None:
    from mc0.broker.jetstream.storedletters import REREAD_S

    box = MemoryReplicatedStore(
        "box", JournalSettings(store="jetstream", mailboxes=True, topics=("mc0.sys.mailbox.>",))
    )
    sent: dict[bytes, bool] = {}  # has carol's queue sent everything? (the shell's backlog)
    core = core_with(box, backlog=lambda rid: 0 if sent.get(rid, True) else 1)
    fromstore.calls(core.rooms)  # (the first three identities' mailboxes: their reads left unanswered)
    headers = {"TO": "carol", "TOPIC": "note.x", P.MAILBOX_EXPIRES: str(10**15)}

    def letters(*seqs: int) -> list[Record]:
        return [Record(s, 0.0, P.SYS_MAILBOX_LETTER, "pub", headers, (f"letter {s}".encode(),)) for s in seqs]

    def handed(out: list[Any]) -> list[bytes]:
        assert {rid for rid, _ in out} <= {b"carol"}
        return [payload_of(list(frames))[0] for _, frames in out]

    sent[b"carol"] = False  # carol drains slowly: its queue is not empty for a while
    connect(core, b"carol", who="carol")
    ((token, read),) = carols(core)
    assert read.get("after", 0) == 0
    got = handed(fromstore.answered(core.rooms, token, {"records": [[7, 0], [8, 0]]}, letters(7, 8), 0.0))
    core.commit()
    assert not core.calls.queued  # not sent yet: nothing purged
    core.tick(REREAD_S + 0.1)  # the second read comes while carol still drains
    ((token, reread),) = carols(core)
    # The stream still holds 7 and 8 (not purged: carol has not sent them), and 9 came since.
    got += handed(fromstore.answered(core.rooms, token, {"records": [[7, 0], [8, 0], [9, 0]]}, letters(7, 8, 9), 1.1))
    assert got == [b"letter 7", b"letter 8", b"letter 9"]
    assert reread.get("after") == 8  # (and the store is asked only for what follows what was handed)
    sent[b"carol"] = True
    core.commit()
    purges = carols(core)
    assert [(call["op"], call["upto"]) for _, call in purges] == [("letters_purge", 8), ("letters_purge", 9)]
    # A third look while the purges are under way starts after them too.
    core.tick(2 * REREAD_S + 0.2)
    assert not core.calls.queued  # (only two reads after a connect)
    for token, _ in purges:
        fromstore.answered(core.rooms, token, {}, [], 2.2)
    # Gone and back once the purges are done: its next session reads the mailbox from the start.
    core.handle(b"carol", f("DISCONNECT", "ID", "bye"), 3.0, "carol")
    connect(core, b"carol2", now=3.0, who="carol")
    ((_, read),) = carols(core)
    assert read["after"] == 0
    assert core.mailboxes.stored is not None and core.mailboxes.stored._after == {}


def test_letters_handed_to_a_session_that_went_before_they_left_are_read_again_for_the_next() -> None:
    box = MemoryReplicatedStore(
        "box", JournalSettings(store="jetstream", mailboxes=True, topics=("mc0.sys.mailbox.>",))
    )
    leaving = [True]  # whether what is queued leaves (the shell's backlog)
    core = core_with(box, backlog=lambda rid: 0 if leaving[0] else 1)
    fromstore.calls(core.rooms)
    headers = {"TO": "carol", "TOPIC": "note.x", P.MAILBOX_EXPIRES: str(10**15)}
    leaving[0] = False  # from here on nothing queued leaves
    connect(core, b"carol", who="carol")
    connect(core, b"carol2", who="carol")  # a second session: letters go to the newest
    ((token, _),) = carols(core)
    record = Record(7, 0.0, P.SYS_MAILBOX_LETTER, "pub", headers, (b"hello",))
    handed_to = fromstore.answered(core.rooms, token, {"records": [[7, 0]]}, [record], 0.0)
    assert [rid for rid, _ in handed_to] == [b"carol2"]
    core.handle(b"carol2", f("DISCONNECT", "ID", "bye"), 0.5, "carol")  # went before it left
    core.tick(1.5)  # the second read, for the session that stays: letter 7 again
    ((token, reread),) = carols(core)
    assert reread["after"] == 6
    assert [rid for rid, _ in fromstore.answered(core.rooms, token, {"records": [[7, 0]]}, [record], 1.5)] == [b"carol"]


def test_kept_letters_are_read_by_one_broker_of_an_identity_and_by_another_once_the_first_ones_sessions_went() -> None:
    box = MemoryReplicatedStore(
        "box", JournalSettings(store="jetstream", mailboxes=True, topics=("mc0.sys.mailbox.>",))
    )
    core = core_with(box)
    fromstore.calls(core.rooms)
    b2 = core.rooms.routes.make_peer("b2", 1, 0.0)
    core.rooms.mailboxes.online(b2, 0.0, "carol")  # b2 announced a session of carol: b2 reads her letters
    connect(core, b"carol", who="carol")
    core.tick(1.5)
    assert carols(core) == [] and core.counters["mailbox_read_elsewhere"] == 1
    core.rooms.mailboxes.route_offline(b2, ("carol",))  # b2's went: this broker reads them, at once
    assert core.next_deadline() <= 1.5
    core.tick(1.5)
    ((_, read),) = carols(core)
    assert read == {"op": "letters_read", "journal": "box", "identity": "carol", "after": 0}


# ------------------------------------------------------------------ the port's keep, store by store
def test_keep_answers_a_local_stores_seq_and_a_replicated_stores_token(tmp_path: Path, monkeypatch: Any) -> None:
    """``JournalStore.keep``: the file and memory stores append (``(seq, 0)``); the replicated stores (the
    JetStream journal and the core tests' one) propose (``(0, token)``), their dedup id made of MSGID
    when the journal has a dedup window, the origin carried; past the budget, ``NOT_KEPT``."""
    from mc0.broker.jetstream import replicated as replicated_module
    from mc0.broker.storage.filestore import Journal
    from mc0.broker.storage.port import NOT_KEPT

    msgid = {"MSGID": "m1", "X-a": "b"}
    files = Journal("files", JournalSettings(folder=str(tmp_path / "files"))).open()
    memory = MemoryStore("memory")
    for local in (files, memory):
        assert local.keep("orders.x", "alice", msgid, [b"a"], origin="b1/00") == (1, 0)
        assert local.keep("orders.x", "alice", {}, [b"b"]) == (2, 0)
        assert local.duplicate_of("alice", "m1") == 1  # (kept as an append keeps it)
        assert (local.backlog, local.following, local.copy_reason, local.created) == ("", True, "", "")
    files.close()

    sent: list[Any] = []

    def sink(name: str, proposals: list[Any]) -> None:
        sent.extend(proposals)

    copy = ReplicatedJournal("main", JournalSettings(folder=str(tmp_path / "copy"), store="jetstream"), sink=sink)
    plain = JournalSettings(folder=str(tmp_path / "plain"), store="jetstream", dedup_window_s=0)
    copy.open()
    undeduped = ReplicatedJournal("plain", plain, sink=sink).open()
    assert copy.keep("orders.x", "alice", msgid, [b"a"], origin="b1/00") == (0, 1)
    assert copy.keep("orders.x", "alice", {}, [b"b"]) == (0, 2)
    assert undeduped.keep("orders.x", "alice", msgid, [b"a"]) == (0, 1)
    copy.commit()
    undeduped.commit()
    assert [(p.token, p.subject, p.msgid, p.origin) for p in sent] == [
        (1, "mc0.j.main.orders.x", jsw.msg_id("alice", "m1"), "b1/00"),
        (2, "mc0.j.main.orders.x", "", ""),
        (1, "mc0.j.plain.orders.x", "", ""),  # (no dedup window: no Nats-Msg-Id)
    ]
    monkeypatch.setattr(replicated_module, "MAX_WAITING", 2)  # (two wait for JetStream's answer)
    assert copy.backlog and copy.keep("orders.x", "alice", {}, [b"c"]) == NOT_KEPT
    copy.close()
    undeduped.close()

    tested = store()
    assert tested.keep("orders.x", "alice", msgid, [b"a"], origin="b1/00") == (0, 1)
    assert tested.proposals[0][5:] == (jsw.msg_id("alice", "m1"), "b1/00")
    assert tested.duplicate_of("alice", "m1") is None  # (the stream dedups)
    tested.backlog = "full"
    assert tested.keep("orders.x", "alice", {}, [b"b"]) == NOT_KEPT and len(tested.proposals) == 1


# ------------------------------------------------------------------ the local copy on files
def test_the_local_copy_takes_the_streams_seqs_gaps_and_a_new_stream(tmp_path: Path) -> None:
    settings = JournalSettings(folder=str(tmp_path / "copy"), store="jetstream", segment_bytes=4096)
    copy = ReplicatedJournal("main", settings).open()
    copy.stream_state(1, 0, "made-1", 1)
    payload = encode_payload("orders.x", "alice", {"X-a": "b"}, [b"body"])
    now = time.time()  # (the copy's own age retention runs at a segment's roll)
    assert [copy.arrived(seq, now + seq, payload) is not None for seq in (1, 2, 2, 5)] == [True, True, False, True]
    copy.flush()
    records, next_seq = copy.read(1)
    assert [(r.seq, r.ts - now, r.topic, r.headers) for r in records] == [
        (1, 1.0, "orders.x", {"X-a": "b"}),
        (2, 2.0, "orders.x", {"X-a": "b"}),
        (5, 5.0, "orders.x", {"X-a": "b"}),  # after the gap the stream left (its records deleted)
    ]
    assert next_seq == 6 and copy.info()["next_seq"] == 6
    copy.close()
    again = ReplicatedJournal("main", settings).open()
    assert again.position() == (6, "made-1")  # where its delivery starts after a restart
    again.stream_state(1, 3, "made-2", 1)  # another stream of the same name: the copy starts again
    assert (again.first_seq, again.next_seq) == (1, 1)
    with pytest.raises(TypeError):
        again.append("t", "s", {}, [b""])


@pytest.mark.parametrize("first", [4, 9])  # within the copy; past its end (the copy was behind)
def test_a_copy_follows_a_first_seq_the_stream_moved_without_telling_it_and_reads_before_it_are_410(
    tmp_path: Path, first: int
) -> None:
    from mc0.broker.storage.port import Trimmed

    settings = JournalSettings(folder=str(tmp_path / "copy"), store="jetstream", segment_bytes=4096)
    copy = ReplicatedJournal("main", settings).open()
    copy.stream_state(1, 0, "made-1", 1)
    payload = encode_payload("orders.x", "alice", {}, [b"secret"])
    for seq in range(1, 7):
        copy.arrived(seq, float(seq), payload)
    copy.flush()
    copy.stream_state(first, 8, "made-1", 7)  # purged outside mc0 (or while this broker was away)
    assert (copy.cache.first_seq, copy.first_seq, copy.info()["first_seq"]) == (first, first, first)
    assert copy.info()["records"] == 9 - first
    with pytest.raises(Trimmed):
        copy.read(first - 1)
    with pytest.raises(Trimmed):
        copy.read_columns(1)
    assert [r.seq for r in copy.read(first)[0]] == list(range(first, 7))
    after = max(7, first)  # what the stream delivers next
    assert copy.arrived(after, float(after), payload) is not None and copy.next_seq == after + 1
    copy.close()
    again = ReplicatedJournal("main", settings).open()  # dropped from the files, not only hidden
    assert again.first_seq == first
    again.close()


def test_a_copy_filled_from_scratch_takes_the_history_without_handing_it_out_live_even_across_a_restart(
    tmp_path: Path,
) -> None:
    settings = JournalSettings(folder=str(tmp_path / "copy"), store="jetstream", segment_bytes=4096)
    payload = encode_payload("orders.x", "alice", {}, [b"old"])
    copy = ReplicatedJournal("main", settings).open()
    copy.stream_state(1, 5, "made-1", 1)  # no marker: a new broker, or its data folder lost
    assert [copy.arrived(seq, float(seq), payload) for seq in (1, 2, 3)] == [None, None, None]  # (history)
    copy.flush()
    assert (copy.next_seq, [r.seq for r in copy.read(1)[0]]) == (4, [1, 2, 3])  # (in the copy all the same)
    copy.close()  # (killed mid-way: the marker says where live delivery starts)
    again = ReplicatedJournal("main", settings).open()
    again.stream_state(1, 7, "made-1", 4)
    assert [again.arrived(seq, float(seq), payload) is not None for seq in (4, 5, 6, 7)] == [False, False, True, True]
    again.close()
    (tmp_path / "copy" / "stream.json").unlink()  # the marker lost too: from scratch again
    for segment in (tmp_path / "copy").glob("*.seg*"):
        segment.unlink()
    rebuilt = ReplicatedJournal("main", settings).open()
    rebuilt.stream_state(1, 7, "made-1", 1)
    assert [rebuilt.arrived(seq, float(seq), payload) is not None for seq in range(1, 9)] == [False] * 7 + [True]
    rebuilt.stream_state(1, 2, "made-2", 1)  # deleted and made again: its records are new here, delivered
    assert [rebuilt.arrived(seq, float(seq), payload) is not None for seq in (1, 2)] == [True, True]
    rebuilt.close()


def test_a_jetstream_journal_without_nats_is_refused_in_one_line_and_cluster_on_the_command_line_gives_it(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    config = tmp_path / "mc0.toml"
    config.write_text('[journals.main]\nstore = "jetstream"\n')
    command = [sys.executable, "-m", "mc0", "broker", "--insecure", "--config", str(config), "--check-config"]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and refused.stderr.startswith("mc0: error: journals.main.store: store = ")
    given = subprocess.run([*command, "--cluster", "nats://127.0.0.1:4222"], capture_output=True, text=True, timeout=30)
    assert given.returncode == 0, given.stderr
    assert "kept by JetStream, R3" in given.stdout
    assert "a record is at most the NATS servers' max_payload (1 MiB unless they set more)" in given.stdout


def test_a_put_while_too_much_waits_for_jetstream_is_refused_429_and_changes_nothing() -> None:
    j = store()
    core = core_with(j)
    j.backlog = "100000 records wait for JetStream's answer"
    out = put(core, b"pub", "TOPIC", "orders.1", "ID", "p", "", "x")
    assert out == [(b"pub", P.error(429, "journal main: 100000 records wait for JetStream's answer", "p"))]
    assert not j.proposals and core.counters["store_backlog_refused"] == 1


def test_a_put_a_file_journal_and_a_full_jetstream_journal_keep_is_refused_429_and_kept_by_neither() -> None:
    """The JetStream journal beside the primary (a file journal, named first) is over its budget: the PUT is
    refused, not answered OK and missing from that journal (what it did before the check covered all)."""
    files, j = MemoryStore("aaa", JournalSettings(topics=("orders.>",), dedup_window_s=60)), store()
    core = core_with(files, j)
    j.backlog = "100000 records wait for JetStream's answer"
    out = put(core, b"pub", "TOPIC", "orders.1", "ID", "p", "", "x")
    assert out == [(b"pub", P.error(429, "journal main: 100000 records wait for JetStream's answer", "p"))]
    assert files.next_seq == 1 and not j.proposals and core.counters["store_backlog_refused"] == 1
    j.backlog = ""
    assert put(core, b"pub", "TOPIC", "orders.1", "ID", "q", "MSGID", "m1", "", "x") == []  # (OK held to the commit)
    assert files.next_seq == 2 and len(j.proposals) == 1 and core.counters["store_backlog_dropped"] == 0
    j.backlog = "full again"  # a duplicate of it is answered as one (DUPLICATE 1), not refused: nothing to keep
    assert put(core, b"pub", "TOPIC", "orders.1", "ID", "r", "MSGID", "m1", "", "x") == []
    assert core.counters["duplicates"] == 1 and core.counters["store_backlog_refused"] == 1
    assert files.next_seq == 2 and len(j.proposals) == 1


def test_a_replay_whose_copy_never_catches_up_stops_with_504_where_it_stopped_and_waits_between_looks() -> None:
    j, core = acknowledged_not_copied()
    ok = [(b"sub", P.ok_journaled("s", "main", 1))]  # (the copy holds nothing yet)
    assert core.handle(b"sub", f("SUB", "ID", "s", "FROM", "1", "", "orders.>"), 0.0, "sub") == ok
    assert core.pages(0.0) == [] and core.paging
    (waiting,) = [r for replays in core.journaling._replays.values() for r in replays.values()]
    assert waiting.resume_at == pytest.approx(0.005)  # looks again in a moment, not every loop turn
    assert core.pages(0.001) == []  # (not due yet)
    (stopped,) = core.pages(CATCH_UP_S + 1)
    assert stopped.kind == "error" and list(stopped.frames[:3]) == [b"ERROR", b"CODE", b"504"] and not core.paging
    assert b"replay stopped at seq 1" in b" ".join(stopped.frames)
    assert list(stopped.frames[-4:]) == [b"JOURNAL", b"main", b"TOPIC", b"orders.>"]  # its end; the SUB stays
    assert core.counters["replay_copy_behind"] == 1


def test_a_copy_that_cannot_be_written_stops_there_and_live_records_go_on_once(tmp_path: Path) -> None:
    settings = JournalSettings(folder=str(tmp_path / "copy"), store="jetstream")
    copy = ReplicatedJournal("main", settings).open()
    copy.stream_state(1, 0, "made-1", 1)
    payload = encode_payload("orders.x", "alice", {}, [b"body"])
    assert copy.arrived(1, 1.0, payload)
    copy.flush()

    class DiskFull:
        """The copy's file journal whose appends fail (a stand-in around it: the compiled Journal's
        methods cannot be patched on an instance)."""

        def __init__(self, journal: Any) -> None:
            self.journal = journal

        def __getattr__(self, name: str) -> Any:
            return getattr(self.journal, name)

        def append_at(self, *_: Any) -> bool:
            raise OSError(28, "No space left on device")

    copy.cache = DiskFull(copy.cache)
    assert [copy.arrived(seq, float(seq), payload) is not None for seq in (2, 3, 3, 2, 4)] == [
        True,
        True,
        False,
        False,
        True,
    ]
    copy.flush()
    assert copy.broken.startswith("OSError") and copy.counters["copy_write_failed"] == 1
    assert (copy.next_seq, copy.stored_next_seq) == (2, 5)  # what it holds is served; no silent gap after it
    assert [r.seq for r in copy.read(1)[0]] == [1]


def test_a_stream_made_again_forgets_how_far_the_old_one_reached(tmp_path: Path) -> None:
    copy = ReplicatedJournal("main", JournalSettings(folder=str(tmp_path / "c"), store="jetstream")).open()
    copy.stream_state(1, 0, "made-1", 1)
    payload = encode_payload("orders.x", "alice", {}, [b"body"])
    for seq in range(1, 6):
        copy.arrived(seq, float(seq), payload)
    copy.acknowledged(9)
    assert copy.stored_next_seq == 10
    copy.stream_state(1, 2, "made-2", 1)  # deleted and made again: two records so far
    assert (copy.next_seq, copy.stored_next_seq) == (1, 3)


def test_what_the_link_posts_is_handled_item_by_item_and_one_that_raises_never_stops_the_rest() -> None:
    from mc0.broker.jetstream.streams import Acks, StreamState
    from mc0.broker.listeners import ClusterListener

    j = store()
    core = core_with(j)
    put(core, b"pub", "TOPIC", "orders.x", "ID", "p", "", "x")
    core.commit()
    (token,) = j.sent

    class BrokenCopy:
        def stream_state(self, *_: Any) -> None:
            raise RuntimeError("a bug in the copy")

        def acknowledged(self, seq: int) -> None:
            pass

        def answered(self, token: int) -> None:
            pass

    listener = ClusterListener(parse(CLUSTER, "x"))  # (constructors do no I/O: no NATS here)
    listener.replicated = {"main": BrokenCopy()}  # type: ignore[dict-item]
    news = [StreamState("main", 1, 0, "made", 1), Acks("main", [(token, 1, False)])]
    listener.link.receive = lambda limit=256, look=True: [news.pop(0) for _ in range(min(limit, len(news)))]  # type: ignore[method-assign]
    out = listener.receive(core, 0.0)
    for _ in range(10):  # (a slow box may spend a turn's ROUTE_WALK_BUDGET on the first item: more turns)
        if not news:
            break
        out += listener.receive(core, 0.0)
    assert [frames[:2] for _, frames in out] == [[b"OK", b"ID"]]  # the PUT's OK, after the item that raised
    assert core.counters["internal_errors"] == 1


@pytest.mark.timeout(60)
def test_a_confirmed_put_while_nats_never_answered_fails_507_not_stored_after_the_timeout(tmp_path: Path) -> None:
    import socket

    import mc0
    from mc0.process import BrokerProcess

    with socket.socket() as nobody:  # a port nothing listens on once closed
        nobody.bind(("127.0.0.1", 0))
        port = nobody.getsockname()[1]
    config = tmp_path / "mc0.toml"
    config.write_text(
        f'[cluster]\nnats = ["nats://127.0.0.1:{port}"]\nname = "b1"\njetstream_timeout_ms = 500\n'
        f'[journals.main]\nstore = "jetstream"\nreplicas = 1\ntopics = ["orders.>"]\nfolder = "{tmp_path / "copy"}"\n'
    )
    with BrokerProcess(config=str(config), insecure=True) as broker, mc0.Client(broker.endpoint) as client:
        started = time.monotonic()
        with pytest.raises(mc0.StorageFailed, match="not stored: no JetStream stream took"):  # (never sent)
            client.publish("orders.x", b"x", confirm=True, timeout=20)
        assert time.monotonic() - started < 10  # the journal's timeout and a sweep, not the client's 20 s


# ------------------------------------------------------------------ messages that are no mc0 record
FOREIGN = [b"", b"junk", b"\x00" * 7, b"\xff" * 40, b"\x05\x00\x00\x00\x00\x00\x01\x00ab"]  # none decodes


def test_a_message_that_is_no_mc0_record_is_a_hole_in_the_copy_that_every_read_skips(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = JournalSettings(folder=str(tmp_path / "copy"), store="jetstream")
    copy = ReplicatedJournal("main", settings).open()
    copy.stream_state(1, 0, "made-1", 1)
    good = encode_payload("orders.x", "alice", {"MSGID": "m"}, [b"a", b"b"])
    other = encode_payload("audit.y", "bob", {}, [b"c"])
    bodies = [good, *FOREIGN[:3], other, *FOREIGN[3:], good, b""]  # seqs 1..9, a hole last
    with caplog.at_level("WARNING", logger="mc0.journal"):
        arrived = [copy.arrived(seq, float(seq), body) for seq, body in enumerate(bodies, 1)]
        assert [r.seq if r is not None else None for r in arrived] == [1, None, None, None, 5, None, None, 8, None]
        assert copy.arrived(3, 3.0, b"junk") is None  # had it: not counted again
        copy.flush()
        assert (copy.next_seq, copy.stored_next_seq, copy.counters["unreadable"]) == (10, 10, 6)
        for _ in range(2):  # every read skips them, and counts nothing more
            assert [(r.seq, r.topic, r.parts) for r in copy.read(1)[0]] == [
                (1, "orders.x", (b"a", b"b")),
                (5, "audit.y", (b"c",)),
                (8, "orders.x", (b"a", b"b")),
            ]
            assert [r.seq for r in copy.read(2, 9, lambda topic: topic == "audit.y")[0]] == [5]
            columns, next_seq = copy.read_columns(1)
            assert (columns.seqs, columns.topics, columns.part_counts, next_seq) == (
                [1, 5, 8],
                [b"orders.x", b"audit.y", b"orders.x"],
                [2, 1, 2],
                10,
            )
    assert copy.info()["unreadable"] == 6
    assert len([r for r in caplog.records if "is not an mc0 record" in r.getMessage()]) == 1  # logged once
    copy.close()
    again = ReplicatedJournal("main", settings).open()  # the holes survive a restart (a valid CRC each)
    assert (again.next_seq, [r.seq for r in again.read(1)[0]]) == (10, [1, 5, 8])
    again.close()


@pytest.mark.parametrize("columns", [False, True])
def test_a_copy_holding_bytes_that_are_no_record_skips_them_counts_and_logs_them_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, columns: bool
) -> None:
    """A copy written before holes existed holds a foreign message's bytes as they came: a read skips
    each (counted, logged once), never fails on it."""
    from mc0.broker.storage.filestore import Journal

    copy = Journal("old", JournalSettings(folder=str(tmp_path / "old"), dedup_window_s=0)).open()
    good = encode_payload("orders.x", "alice", {}, [b"body"])
    for seq, body in enumerate([good, *FOREIGN[1:], good], 1):
        copy.append_at(seq, float(seq), body)
    copy.commit()
    with caplog.at_level("WARNING", logger="mc0.journal"):
        for _ in range(3):
            if columns:
                page, next_seq = copy.read_columns(1)
                assert (page.seqs, page.parts, next_seq) == ([1, 6], [b"body", b"body"], 7)
            else:
                records, next_seq = copy.read(1)
                assert ([(r.seq, r.parts) for r in records], next_seq) == ([(1, (b"body",)), (6, (b"body",))], 7)
    assert copy.counters["unreadable"] == 4
    assert len([r for r in caplog.records if "is not an mc0 record" in r.getMessage()]) == 1
    copy.close()


def test_an_op_on_a_store_consumer_names_the_one_it_means_and_one_made_again_is_decided_again() -> None:
    """What the core learnt of a consumer is only a cache: each op carries ``expect`` (owner, creation
    nonce); a ``changed`` answer (the store did nothing) is decided again on the consumer there now,
    once; a 404 forgets what was learnt."""
    core = core_with(store())
    consumers = core.rooms.store_consumers
    config = {"journal": "main", "name": "c", "topics": ["orders.>"], "ack_wait_ms": 30000, "max_deliver": 5}
    config |= {"max_ack_pending": 1000, "deliver": "all"}

    def info(owner: str, made: str, topics: list[str] = ["orders.>"]) -> dict[str, Any]:  # noqa: B006
        saved = json.dumps({**config, "topics": topics})
        return {"metadata": {jsw.OWNER_KEY: owner, jsw.CONFIG_KEY: saved}, "made": made}

    consumers._learn("main", "c", known_of(info("sub", "n1")), 0.0)
    assert consumer_request(core, "1", op="pull", max=10) == []
    ((token, pull),) = fromstore.calls(core.rooms)
    assert (pull["op"], pull["expect"]) == ("consumer_pull", {"owner": "sub", "made": "n1"})
    # Deleted and made again by another identity: refused, nothing more asked of the store.
    ((to, refused),) = fromstore.answered(core.rooms, token, {"changed": info("pub", "n2")}, [], 0.0)
    assert to == b"sub" and refused[:5] == f("ERROR", "ID", "1", "CODE", "403")
    assert not core.calls.queued and consumers.known["main", "c"].made == "n2"
    assert core.counters["consumer_changed"] == 1
    # Made again by its owner with another filter: asked again at once, for that one.
    consumers._learn("main", "c", known_of(info("sub", "n1")), 0.0)
    assert consumer_request(core, "2", op="ack", seqs=[4]) == []
    ((token, ack),) = fromstore.calls(core.rooms)
    assert fromstore.answered(core.rooms, token, {"changed": info("sub", "n3", ["audit.>"])}, [], 0.0) == []
    ((token, again),) = fromstore.calls(core.rooms)
    assert (again["op"], again["seqs"], again["expect"]) == ("consumer_settle", [4], {"owner": "sub", "made": "n3"})
    # Made again once more while asked: the caller is told to ask again (never a loop).
    ((_, gave_up),) = fromstore.answered(core.rooms, token, {"changed": info("sub", "n4")}, [], 0.0)
    assert gave_up[:5] == f("ERROR", "ID", "2", "CODE", "503")
    # Gone: 404, and what was learnt is forgotten (the next op asks for its info first).
    assert consumer_request(core, "3", op="info") == []
    ((token, _),) = fromstore.calls(core.rooms)
    ((_, gone),) = fromstore.answered(
        core.rooms, token, {"error": {"code": 404, "description": "consumer not found"}}, [], 0.0
    )
    assert gone[:5] == f("ERROR", "ID", "3", "CODE", "404") and ("main", "c") not in consumers.known
    assert consumer_request(core, "4", op="info") == []
    assert [call["op"] for _, call in fromstore.calls(core.rooms)] == ["consumer_info"]


# ------------------------------------------------------------------ a copy whose feed does not follow (issue 40)
def not_following(reason: str = "stream MC0_J_main has no leader now") -> tuple[MemoryReplicatedStore, BrokerCore]:
    """Two records stored and in the copy; then its feed stops following the stream (NATS lost its quorum)."""
    j = store()
    core = core_with(j)
    for body in ("warm", "more"):
        put(core, b"pub", "TOPIC", "orders.q", "", body)
        core.commit()
        deliver(core, j, max(j.sent))
    j.following, j.copy_reason = False, reason
    return j, core


def replayed(out: list[Any]) -> list[bytes]:
    return [payload_of(list(o.frames))[-1] for o in out if o.kind == "replay"]


def test_a_replay_at_the_end_of_a_copy_whose_feed_does_not_follow_waits_for_it_and_serves_what_it_brings() -> None:
    """At the copy's end the replay cannot tell the stream holds no more (a record acknowledged at another
    broker while this feed is down): it waits, and what the feed brings when it follows again is replayed,
    in order, before the replay ends."""
    j, core = not_following()
    core.handle(b"sub", f("SUB", "ID", "s", "FROM", "0", "", "orders.>"), 0.0, "sub")
    assert replayed(core.pages(0.0)) == [b"warm", b"more"]
    assert core.pages(0.01) == [] and core.paging  # at the copy's end: waiting, not ended
    assert core.pages(CATCH_UP_S - 1) == [] and core.paging
    put(core, b"pub", "TOPIC", "orders.q", "", "mq")  # (stored through another broker while this feed was down)
    core.commit()
    seq, _, record, _ = j.store(max(j.sent))
    assert record is not None
    j.arrived(record)
    j.following, j.copy_reason = True, ""
    assert replayed(fetch_turns(core, CATCH_UP_S - 0.5)) == [b"mq"] and not core.paging  # then it ended
    assert core.counters["replay_copy_not_following"] == 0


def test_a_replay_whose_copys_feed_does_not_follow_within_the_bound_ends_with_504_naming_why() -> None:
    j, core = not_following()
    core.handle(b"sub", f("SUB", "ID", "s", "FROM", "0", "", "orders.>"), 0.0, "sub")
    assert replayed(core.pages(0.0)) == [b"warm", b"more"]
    assert core.pages(0.01) == [] and core.paging  # at the copy's end from here
    assert core.pages(CATCH_UP_S) == [] and core.paging
    (stopped,) = core.pages(CATCH_UP_S + 0.02)
    text = b" ".join(stopped.frames).decode()
    assert stopped.kind == "error" and list(stopped.frames[:3]) == [b"ERROR", b"CODE", b"504"] and not core.paging
    assert "did not follow stream MC0_J_main within 10 s (its feed: stream MC0_J_main has no leader now)" in text
    assert "replay stopped at seq 3 (subscribe again FROM 3)" in text
    assert core.counters["replay_copy_not_following"] == 1


def test_a_replay_from_0_whose_copy_learns_that_its_stream_begins_later_starts_there_not_410() -> None:
    """FROM 0 is the oldest record kept: a copy that learns, after the SUB, that the stream was purged past
    where the replay was to start (a new broker's copy, told the stream's state late) is followed, not 410."""
    j, core = not_following()
    j.records.clear()
    core.handle(b"sub", f("SUB", "ID", "s", "FROM", "0", "", "orders.>"), 0.0, "sub")
    j._first = 3  # (the stream was purged before seq 3, as the copy now learns)
    assert [o.kind for o in fetch_turns(core, 0.01)] == []  # no 410: the replay goes on from seq 3
    put(core, b"pub", "TOPIC", "orders.q", "", "mq")
    core.commit()
    _, _, record, _ = j.store(max(j.sent))
    assert record is not None and record.seq == 3
    j.arrived(record)
    j.following = True
    assert replayed(fetch_turns(core, 0.02)) == [b"mq"] and not core.paging


def test_a_fetch_at_the_end_of_a_copy_whose_feed_does_not_follow_waits_then_says_why_not_an_empty_final() -> None:
    j, core = not_following()
    query = json.dumps({"op": "fetch", "journal": "main", "from_seq": 1})
    core.handle(b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", query), 0.0, "sub")
    first = fetch_turns(core, 0.0)
    assert [o.records for o in first if o.kind == "fetch"] == [2]  # what the copy holds; no FINAL yet
    assert fetch_turns(core, CATCH_UP_S - 0.01) == []
    (failed,) = fetch_turns(core, CATCH_UP_S + 0.01)
    text = b" ".join(failed.frames).decode()
    assert failed.kind == "error" and "504" in text and "its feed: stream MC0_J_main has no leader now" in text
    assert "fetched up to seq 3: ask again from there" in text and core.counters["fetch_copy_not_following"] == 1
    # Its feed back, a fetch goes on to the end the stream is known to have (and a FINAL).
    j.following = True
    core.handle(b"sub", f("REQUEST", "SERVICE", "mc0.journal", "ID", "r2", "", query), 1.0, "sub")
    done = fetch_turns(core, 1.0)
    assert [o.records for o in done if o.kind == "fetch"] == [2, 0]
