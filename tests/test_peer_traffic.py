"""What monitoring reads of the core, without sockets: each peer's traffic (a batch counts as its records),
its address and connected time, the ring of closed connections with their reasons, topic traffic, and
/connz's sort, paging and states (mc0.broker.core.peers, .traffic, mc0.broker.monitoring.snapshot)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.core.peers import CLOSED_KEPT, close_reason
from mc0.broker.core.traffic import OTHER, TopicTraffic
from mc0.broker.monitoring.queries import BadQuery, parse_query
from mc0.broker.monitoring.snapshot import connz, snapshot
from mc0.broker.outbox import Outbox
from mc0.protocol import batch

from .test_core import connect, f


def connect_batched(core: BrokerCore, rid: bytes, who: str = "anonymous", now: float = 0.0) -> None:
    core.handle(rid, f("CONNECT", "VERSION", "1.0", "TTL", "1000", "BATCH", "1", "ID", "c"), now, who)


def test_a_peer_counts_what_it_sends_a_batch_as_its_records() -> None:
    core = BrokerCore()
    connect_batched(core, b"pub", "alice")
    connect(core, b"plain", who="bob")
    pub, plain = core.peers.by_id[b"pub"], core.peers.by_id[b"plain"]
    blob = b"".join(batch.put_record(b"t.x", b"0123456789") for _ in range(100))
    core.handle(b"pub", batch.batch_frames(blob), 1.0, "alice")
    assert (pub.msgs_in, pub.bytes_in) == (100, len(blob))
    core.handle(b"plain", f("PUT", "TOPIC", "t.y", "", "abc"), 1.0, "bob")
    assert (plain.msgs_in, plain.bytes_in) == (1, 3)
    assert [(t["topic"], t["msgs"], t["bytes"]) for t in core.traffic.report()] == [("t.x", 100, 1000), ("t.y", 1, 3)]


def test_what_is_queued_to_a_peer_counts_a_joined_fan_out_as_its_records() -> None:
    core = BrokerCore()
    outbox = Outbox(max_bytes=1 << 20, max_messages=10_000, batch_bytes=1 << 16)
    connect_batched(core, b"sub", "carol")
    connect_batched(core, b"pub", "alice")
    core.handle(b"sub", batch.batch_frames(batch.record_of(f("SUB", "", "t.>"))), 0.0, "carol")
    sub = core.peers.by_id[b"sub"]
    blob = b"".join(batch.put_record(b"t.x", b"x") for _ in range(50))
    before = sub.msgs_out
    out = core.handle(b"pub", batch.batch_frames(blob), 1.0, "alice")
    for routing_id, payload in out:  # what the shell's Delivery does
        peer = core.peers.by_id.get(routing_id)
        assert outbox.put(routing_id, payload, batched=True, known=True, now=1.0, tally=peer)
    assert sub.msgs_out - before == 50 == sub.delivered
    assert sub.bytes_out == outbox.backlog(b"sub")


@pytest.mark.parametrize(
    ("why", "expected"),
    [
        ("too_slow", "evicted: slow consumer"),
        ("revoked", "revoked"),
        ("expired", "heartbeat expired"),
        ("closed", "disconnected"),
        ("disconnected", "disconnected"),
        ("answered", None),  # a MemoDB request's session: not a connection
        ("route_link_down", "route link down"),  # any other code: its words
    ],
)
def test_close_reason(why: str, expected: str | None) -> None:
    assert close_reason(why) == expected


def test_closed_connections_keep_their_reason_and_traffic_and_are_bounded() -> None:
    core = BrokerCore(CoreSettings(liveness=2))
    core.peers.opened(7, "127.0.0.1:5555")
    core.handle(b"a", f("CONNECT", "VERSION", "1.0", "TTL", "1000", "ID", "c"), 0.0, "alice", 7)
    alice = core.peers.by_id[b"a"]
    assert alice.address == "127.0.0.1:5555" and alice.connected == 0.0
    core.handle(b"a", f("PUT", "TOPIC", "t", "", "hello"), 0.5, "alice", 7)
    connect(core, b"b", who="bob")
    core.handle(b"b", f("DISCONNECT"), 1.0, "bob")
    core.forget(alice, "closed_by_admin", 2.0, reason="closed by root")
    connect(core, b"c", now=3.0, who="carol")
    core.revoke({"carol"}, 4.0)
    connect(core, b"d", now=5.0, who="dave")
    core.tick(100.0)  # dave was silent past liveness x TTL
    reasons = [(c.name.split("#")[0], c.reason) for c in core.peers.closed]
    assert reasons == [
        ("bob", "disconnected"),
        ("alice", "closed by root"),
        ("carol", "revoked"),
        ("dave", "heartbeat expired"),
    ]
    gone = core.peers.closed[1]
    assert (gone.address, gone.msgs_in, gone.bytes_in) == ("127.0.0.1:5555", 1, 5)
    assert (gone.connected, gone.closed) == (0.0, 2.0)
    assert core.counters["forgotten_closed_by_admin"] == 1
    for i in range(CLOSED_KEPT + 10):
        connect(core, b"x%d" % i, now=200.0, who="x")
        core.handle(b"x%d" % i, f("DISCONNECT"), 200.0, "x")
    assert len(core.peers.closed) == CLOSED_KEPT


def test_a_slow_consumer_is_closed_as_evicted() -> None:
    core = BrokerCore(CoreSettings(slow_consumer_ms=100))
    connect(core, b"s", who="slow")
    core.send_failed(b"s", 0.0, unreachable=False)
    core.send_failed(b"s", 0.5, unreachable=False)
    assert [c.reason for c in core.peers.closed] == ["evicted: slow consumer"]


def test_topic_traffic_is_bounded_and_prunes_idle_topics() -> None:
    traffic = TopicTraffic(max_topics=2)
    traffic.add("a", 1)
    traffic.add("b", 2)
    traffic.add("c", 3)  # over the bound: counted as the others
    assert [r["topic"] for r in traffic.report()] == ["a", "b", OTHER]
    traffic.prune(0.0)  # first prune: nothing was idle "since the previous" yet... a and b are marked
    traffic.add("a", 1)
    traffic.prune(61.0)  # b saw nothing since: dropped, and caches of tallies start afresh
    assert [r["topic"] for r in traffic.report() if not r.get("other")] == ["a"]
    assert traffic.generation >= 1
    traffic.add("c", 3)
    assert [r["topic"] for r in traffic.report() if not r.get("other")] == ["a", "c"]


def _snap(core: BrokerCore) -> object:
    outbox = Outbox(max_bytes=1 << 20, max_messages=1000, batch_bytes=1 << 16)
    return snapshot(core, outbox, now=10.0, started=0.0, wall=1_700_000_010.0, in_bytes=0)


def test_connz_sorts_pages_and_shows_closed_connections() -> None:
    core = BrokerCore()
    for i, who in enumerate(("carol", "alice", "bob")):
        connect(core, who.encode(), now=float(i), who=who)
    core.handle(b"bob", f("SUB", "", "x.>"), 3.0, "bob")
    for _ in range(3):
        core.handle(b"alice", f("PUT", "TOPIC", "y", "", "12345"), 3.0, "alice")
    connect(core, b"gone", who="dan")
    core.handle(b"gone", f("DISCONNECT"), 4.0, "dan")
    snap = _snap(core)
    names = lambda page: [c["name"].split("#")[0] for c in page["connections"]]  # noqa: E731
    ask = lambda query: connz(snap, parse_query("/connz", query))  # noqa: E731
    assert names(ask("")) == ["alice", "bob", "carol"]
    assert names(ask("sort=msgs_in"))[0] == "alice"
    assert names(ask("sort=connected_at")) == ["carol", "alice", "bob"]
    page = ask("sort=name&limit=1&offset=1")
    assert (names(page), page["count"], page["num_connections"]) == (["bob"], 3, 1)
    subs = {c["name"].split("#")[0]: c["subscriptions"] for c in ask("subs=1")["connections"]}  # type: ignore[attr-defined]
    assert subs == {"alice": [], "bob": ["x.>"], "carol": []}
    closed = ask("state=closed")
    (row,) = closed["connections"]  # type: ignore[misc]
    assert (row["reason"], row["closed_at"], row["connected_at"]) == (
        "disconnected", "2023-11-14T22:13:24.000Z", "2023-11-14T22:13:20.000Z"
    )  # fmt: skip
    assert ask("state=all")["count"] == 4


@pytest.mark.parametrize(
    ("query", "complaint"),
    [
        ("sort=routing_id", "sort must be one of"),
        ("state=gone", "state must be one of"),
        ("limit=-1", "limit must be a whole number"),
        ("limit=99999999", "limit must be a whole number"),
        ("offset=x", "offset must be a whole number"),
    ],
)
def test_connz_refuses_a_query_it_cannot_answer(query: str, complaint: str) -> None:
    with pytest.raises(BadQuery, match=complaint):
        parse_query("/connz", query)


def test_jetstream_consumers_figures_are_asked_now_and_then_and_shown_as_answered() -> None:
    from collections import Counter

    from mc0.broker.jetstream.storecalls import StoreCalls
    from mc0.broker.jetstream.storeconsumers import REPORT_INTERVAL, StoreConsumers

    counters: Counter[str] = Counter()
    calls = StoreCalls(counters)
    store = StoreConsumers(
        calls, counters, journals=(), tokens_of=lambda t: tuple(t.split(".")), max_wait_ms=1000,
        max_consumers=10, max_per_identity=10,
    )  # fmt: skip
    store.monitor(["orders"], 0.0)
    store.monitor(["orders"], 0.1)  # one call in flight at a time
    ((token, request),) = calls.drain()
    assert request == {"op": "consumer_report", "journals": ["orders"]}
    store.dead_lettered["orders", "billing"] += 2
    row = {"journal": "orders", "name": "billing", "owner": "alice", "num_pending": 7, "num_ack_pending": 3}
    calls.answer(token, {"consumers": [row]}, [], 0.2)
    assert store.reported == [{**row, "dead_lettered": 2}]
    store.monitor(["orders"], 0.3)
    assert calls.drain() == []  # not again before REPORT_INTERVAL
    store.monitor(["orders"], REPORT_INTERVAL + 0.1)
    ((token, _),) = calls.drain()
    calls.answer(token, {"error": {"code": 503, "description": "no answer"}}, [], REPORT_INTERVAL + 0.2)
    assert store.reported == [{**row, "dead_lettered": 2}]  # a failed call keeps the last figures


@pytest.mark.parametrize(
    ("path", "query", "complaint"),
    [
        ("/connz", "limit=١٢", "limit must be a whole number"),  # Arabic-Indic digits: not ASCII
        ("/connz", "limit=²", "limit must be a whole number"),
        ("/connz", "limit=1e3", "limit must be a whole number"),
        ("/connz", "limit=%2010", "limit must be a whole number"),
        ("/connz", "offset=" + "9" * 13, "offset must be a whole number"),
        ("/connz", "order=up", "order must be one of asc, desc"),
        ("/connz", "filter=" + "x" * 201, "filter must be at most 200 printable"),
        ("/connz", "filter=a%0Ab", "filter must be at most 200 printable"),
        ("/connz", "limit=5000&subs=1", "limit must be a whole number 0-1000 with subs=1"),
        ("/subsz", "sort=topic", "sort must be one of pattern, subscribers"),
        ("/subsz", "limit=10001", "limit must be a whole number 0-10000"),
        ("/consumerz", "sort=lag", "sort must be one of"),
        ("/consumerz", "offset=-1", "offset must be a whole number"),
        ("/varz", "max_age_ms=10001", "max_age_ms must be a whole number 0-10000"),
    ],
)
def test_every_paged_parameter_is_checked_by_the_one_table(path: str, query: str, complaint: str) -> None:
    with pytest.raises(BadQuery, match=complaint) as caught:
        parse_query(path, query)
    assert "\n" not in str(caught.value) and str(caught.value).startswith(query.split("=")[0])  # one line, naming it


@pytest.mark.parametrize(
    ("path", "query", "settled"),
    [
        ("/connz", "", {"limit": 1024, "offset": 0, "order": "", "filter": "", "subs": False, "max_age_ms": 0}),
        ("/connz", "subs=1", {"limit": 1000, "subs": True}),  # (each row with every pattern: fewer)
        ("/connz", "subs=1&limit=7", {"limit": 7}),
        ("/connz", "limit=0&offset=000012", {"limit": 0, "offset": 12}),
        ("/subsz", "", {"sort": "pattern", "limit": 1024, "filter": ""}),
        ("/consumerz", "sort=owner&order=desc", {"sort": "owner", "order": "desc", "limit": 1024}),
        ("/varz", "max_age_ms=250", {"max_age_ms": 250}),
    ],
)
def test_a_paged_query_comes_back_settled(path: str, query: str, settled: dict[str, object]) -> None:
    parsed = parse_query(path, query)
    assert {k: parsed[k] for k in settled} == settled
    assert None not in parsed.values()


def test_subsz_and_consumerz_are_paged_sorted_and_filtered() -> None:
    from mc0.broker.monitoring.snapshot import consumerz, subsz

    ask_subsz = lambda snap, query: subsz(snap, parse_query("/subsz", query))  # noqa: E731
    ask_consumerz = lambda snap, query: consumerz(snap, parse_query("/consumerz", query))  # noqa: E731
    core = BrokerCore()
    connect(core, b"a", who="alice")
    connect(core, b"b", who="bob")
    core.handle(b"a", f("SUB", "", "orders.>", "prices.eu", "prices.us"), 1.0, "alice")
    core.handle(b"b", f("SUB", "", "orders.>", "prices.eu"), 1.0, "bob")
    snap = _snap(core)
    page = ask_subsz(snap, "")
    assert page["patterns"] == {"orders.>": 2, "prices.eu": 2, "prices.us": 1} and page["num_patterns"] == 3
    page = ask_subsz(snap, "filter=PRICES&sort=subscribers&limit=1&offset=1")
    assert page["patterns"] == {"prices.us": 1} and page["num_patterns"] == 2
    assert list(ask_subsz(snap, "order=desc")["patterns"]) == ["prices.us", "prices.eu", "orders.>"]  # type: ignore[call-overload]
    rows = [
        {"journal": "j", "name": n, "owner": o, "num_pending": p}
        for n, o, p in (("billing", "alice", 5), ("shipping", "bob", 9), ("audit", "alice", 1))
    ]
    snap = type(snap)(**{**{k: getattr(snap, k) for k in snap.__slots__}, "consumerz": {"consumers": rows}})  # type: ignore[attr-defined]
    page = ask_consumerz(snap, "sort=num_pending")
    assert [r["name"] for r in page["consumers"]] == ["shipping", "billing", "audit"]  # type: ignore[index]
    page = ask_consumerz(snap, "filter=alice&sort=name&order=desc&limit=1")
    assert [r["name"] for r in page["consumers"]] == ["billing"] and page["count"] == 2  # type: ignore[index]


def test_connz_filters_and_orders_on_the_server() -> None:
    core = BrokerCore()
    for i, who in enumerate(("carol", "alice", "bob", "alex")):
        connect(core, who.encode(), now=float(i), who=who)
    snap = _snap(core)
    page = connz(snap, parse_query("/connz", "filter=AL&sort=name&order=desc"))
    assert [c["identity"] for c in page["connections"]] == ["alice", "alex"]  # type: ignore[index]
    assert (page["count"], page["total"]) == (2, 4)


PATTERNS = ["a.b", "a.*", "a.>", "b", "*.b"]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["sub", "unsub", "drop", "group"]), st.integers(0, 2), st.sampled_from(PATTERNS))
    )
)
def test_subscribers_per_pattern_kept_as_they_change_equal_a_walk_over_the_trie(
    steps: list[tuple[str, int, str]],
) -> None:
    core = BrokerCore()
    for i in range(3):
        connect(core, b"p%d" % i)
    for what, who, pattern in steps:
        rid = b"p%d" % who
        if rid not in core.sessions:
            connect(core, rid)
        if what == "sub":
            core.handle(rid, f("SUB", "", pattern), 1.0)
        elif what == "unsub":
            core.handle(rid, f("UNSUB", "", pattern), 1.0)
        elif what == "group":
            core.handle(rid, f("SUB", "GROUP", "g", "", pattern), 1.0)
        else:
            core.handle(rid, f("DISCONNECT"), 1.0)
        assert core.pubsub.report() == core.pubsub.walked_report()
