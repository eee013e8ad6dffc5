"""mc0.admin in the broker core and its wire: who may call it (by name only), closing exactly one
session, removing a durable consumer, purging a journal, and each action done at every broker of a
cluster of cores (back to back, no sockets); the request parser as a table of literal cases."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mc0 import protocol as P
from mc0.broker.core import admin
from mc0.broker.core.dispatch import BrokerCore
from mc0.broker.storage.memstore import MemoryStore
from mc0.errors import ProtocolError
from mc0.permissions import Permissions
from mc0.protocol import admin as A
from mc0.settings import JournalSettings

from .test_cluster_core import Net


def f(*parts: str | bytes) -> list[bytes]:
    return [p.encode() if isinstance(p, str) else p for p in parts]


def policy(**identities: dict[str, list[str]]) -> Permissions:
    return Permissions.from_table({"identity": identities})


OPERATOR = policy(root={"call": ["mc0.admin"]}, everyone={"call": [">"]}, cousin={"call": ["mc0.>"]})


# ---------------------------------------------------------------- the grant: by name only
@pytest.mark.parametrize(
    ("table", "identity", "granted"),
    [
        (None, "anyone", False),  # no [permissions] at all: nobody is an operator
        ({}, "anyone", False),
        ({"identity": {"root": {"call": ["mc0.admin"]}}}, "root", True),
        ({"identity": {"root": {"call": ["mc0.admin"]}}}, "other", False),
        ({"identity": {"root": {"call": [">"]}}}, "root", False),
        ({"identity": {"root": {"call": ["mc0.>"]}}}, "root", False),
        ({"identity": {"root": {"call": ["mc0.*"]}}}, "root", False),
        ({"identity": {"root": {"call": ["mc0.admin.>"]}}}, "root", False),
        ({"identity": {"root": {"call": ["mc0.admin", ">"]}}}, "root", True),
        ({"default": {"call": ["mc0.admin"]}}, "anyone", True),  # a default grants everyone (said so)
        ({"identity": {"root": {"call": ["mc0.admin"], "deny": {"call": ["mc0.admin"]}}}}, "root", False),
        ({"identity": {"root": {"call": ["mc0.admin"], "deny": {"call": ["mc0.>"]}}}}, "root", False),
        ({"identity": {"root": {"call": ["mc0.admin"], "deny": {"call": ["other.>"]}}}}, "root", True),
    ],
)
def test_the_admin_grant_is_by_name_only(table: dict[str, Any] | None, identity: str, granted: bool) -> None:
    permissions = Permissions() if table is None else Permissions.from_table(table)
    grants = permissions.grants(identity)
    assert grants.may_call(("mc0", "admin")) is granted
    assert grants.admin is granted


# ---------------------------------------------------------------- the request's wire
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"op": "conn.close", "id": "bob#2"}, ("conn.close", {"id": "bob#2"})),
        ({"op": "conn.close", "id": "bob#2@b-1"}, ("conn.close", {"id": "bob#2@b-1"})),
        ({"op": "conn.close", "id": "a#b@c#12"}, ("conn.close", {"id": "a#b@c#12"})),  # an identity with # and @
        ({"op": "consumer.rm", "journal": "main", "name": "inv"}, ("consumer.rm", {"journal": "main", "name": "inv"})),
        ({"op": "journal.purge", "journal": "main"}, ("journal.purge", {"journal": "main"})),
        ({"op": "consumer.ls"}, ("consumer.ls", {})),
        ({"op": "consumer.ls", "journal": "main"}, ("consumer.ls", {"journal": "main"})),
        ([], "body must be a JSON object"),
        ({}, "unknown op 'None'"),
        ({"op": "conn.kill", "id": "x#1"}, "unknown op 'conn.kill'"),
        ({"op": "conn.close"}, "id must be a non-empty string"),
        ({"op": "conn.close", "id": ""}, "id must be a non-empty string"),
        ({"op": "conn.close", "id": 7}, "id must be a non-empty string"),
        ({"op": "conn.close", "id": "bob"}, "not a session's name"),
        ({"op": "conn.close", "id": "#3"}, "not a session's name"),
        ({"op": "conn.close", "id": "bob#x"}, "not a session's name"),
        ({"op": "conn.close", "id": "bob#3@"}, "not a session's name"),
        ({"op": "conn.close", "id": "bob#3@b.1"}, "not a session's name"),
        ({"op": "conn.close", "id": "bob#3", "why": "x"}, "unknown argument 'why'"),
        ({"op": "consumer.rm", "journal": "main"}, "name must be a non-empty string"),
        ({"op": "journal.purge", "journal": "x" * 2000}, "at most 1024 bytes"),
        ({"op": "consumer.ls", "journal": None}, ("consumer.ls", {})),
    ],
)
def test_parse_request(query: object, expected: tuple[str, dict[str, str]] | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(ProtocolError, match=expected) as caught:
            A.parse_request(query, "r")
        assert caught.value.code == 400
    else:
        assert A.parse_request(query, "r") == expected


# ---------------------------------------------------------------- one broker
class Desk:
    """A core with an in-memory journal, sessions named by routing id, and mc0.admin requests."""

    def __init__(self, permissions: Permissions = OPERATOR, **settings: Any) -> None:
        self.store = MemoryStore("main", JournalSettings(topics=("jobs.>",), **settings))
        self.core = BrokerCore(journals=[self.store], permissions=permissions)
        self.who: dict[bytes, str] = {}
        self.ids = 0

    def connect(self, rid: bytes, who: str) -> str:
        self.who[rid] = who
        (answer,) = self.core.handle(rid, f("CONNECT", "VERSION", "1.0", "TTL", "60000", "ID", "c"), 0.0, who)
        assert answer[1][0] == b"OK"
        return self.core.peers.by_id[rid].name

    def request(self, rid: bytes, service: str, query: object, now: float = 0.0) -> list[tuple[bytes, Any]]:
        self.ids += 1
        frames = f("REQUEST", "SERVICE", service, "ID", f"q{self.ids}", "TIMEOUT", "5000", "", json.dumps(query))
        out = self.core.handle(rid, frames, now, self.who[rid])
        return out + self.core.commit()

    def admin(self, rid: bytes, query: object, now: float = 0.0) -> list[tuple[bytes, Any]]:
        return self.request(rid, P.ADMIN_SERVICE, query, now)

    def answer(self, rid: bytes, out: list[tuple[bytes, Any]]) -> tuple[int, Any]:
        """The status and JSON (or reason) of the one answer to ``rid`` in ``out``."""
        (frames,) = [list(frames) for r, frames in out if r == rid]
        headers = dict(zip(frames[1:-1:2], frames[2::2], strict=False))
        if frames[0] == b"ERROR":
            return int(headers[b"CODE"]), headers[b"MESSAGE"].decode()
        assert frames[0] == b"FINAL"
        return 200, json.loads(frames[-1])


def test_only_an_identity_granted_mc0_admin_by_name_may_call_it() -> None:
    desk = Desk()
    for rid, who in ((b"r", "root"), (b"e", "everyone"), (b"c", "cousin"), (b"n", "nobody")):
        desk.connect(rid, who)
    victim = desk.connect(b"v", "victim")
    for rid in (b"e", b"c", b"n"):
        status, reason = desk.answer(rid, desk.admin(rid, {"op": "conn.close", "id": victim}))
        assert (status, reason) == (403, f"{desk.who[rid]} may not call mc0.admin")
    assert b"v" in desk.core.sessions  # nothing was done
    # No worker may serve it either (it is the broker's own).
    answer = desk.core.handle(b"e", f("READY", "ID", "w", "", "mc0.admin"), 0.0, "everyone")
    assert answer[0][1][:5] == f("ERROR", "ID", "w", "CODE", "403")
    # Without any [permissions] table, nobody.
    open_desk = Desk(Permissions())
    open_desk.connect(b"a", "anonymous")
    status, _ = open_desk.answer(b"a", open_desk.admin(b"a", {"op": "consumer.ls"}))
    assert status == 403


def test_conn_close_ends_exactly_that_session_and_tells_it_why() -> None:
    desk = Desk()
    desk.connect(b"r", "root")
    first = desk.connect(b"b1", "bob")
    second = desk.connect(b"b2", "bob")  # the same identity, another session: it stays
    desk.core.handle(b"b1", f("SUB", "", "jobs.>"), 0.0, "bob")
    out = desk.admin(b"r", {"op": "conn.close", "id": first})
    assert desk.answer(b"r", out) == (200, {"closed": first, "broker": ""})
    told = [list(frames) for rid, frames in out if rid == b"b1"]
    assert told == [
        P.error(401, f"session {first} closed by root"),
        list(P.DISCONNECT_FRAMES),
    ]
    assert b"b1" not in desk.core.sessions and desk.core.peers.by_id[b"b2"].name == second
    assert len(desk.core.subscriptions) == 0  # what it held went with it
    assert desk.core.counters["forgotten_closed_by_admin"] == 1
    assert b"b1" in desk.core.take_forgotten()  # the shell frees its queue
    # The same name again: it is gone.
    status, reason = desk.answer(b"r", desk.admin(b"r", {"op": "conn.close", "id": first}))
    assert (status, reason) == (404, f"no session {first!r}")
    # A name of another broker, on a standalone one.
    status, reason = desk.answer(b"r", desk.admin(b"r", {"op": "conn.close", "id": f"{second}@b9"}))
    assert (status, reason) == (404, "no broker b9 in this cluster (brokers: none: this broker is alone)")
    # Closing its own session: done, and the answer goes nowhere.
    root = desk.core.peers.by_id[b"r"].name
    out = desk.admin(b"r", {"op": "conn.close", "id": root})
    assert [frames[0] for rid, frames in out if rid == b"r"] == [b"ERROR", b"DISCONNECT"]


def test_bad_requests_are_400_and_change_nothing() -> None:
    desk = Desk()
    desk.connect(b"r", "root")
    desk.connect(b"b", "bob")
    for body in ("not json", {"op": "conn.close", "id": "bob"}, {"op": "journal.purge"}, {"op": "x"}):
        status, _ = desk.answer(b"r", desk.request(b"r", P.ADMIN_SERVICE, body))
        assert status == 400
    assert b"b" in desk.core.sessions


def test_consumer_rm_removes_anyones_consumer_and_its_pulls_hear_why() -> None:
    desk = Desk()
    desk.connect(b"r", "root")
    desk.connect(b"o", "owner")
    desk.connect(b"p", "owner")
    create = {"op": "create", "journal": "main", "name": "inv", "topics": ["jobs.>"]}
    assert desk.answer(b"o", desk.request(b"o", P.CONSUMER_SERVICE, create))[0] == 200
    pull = {"op": "pull", "journal": "main", "name": "inv", "max": 1, "wait_ms": 4000}
    assert desk.request(b"p", P.CONSUMER_SERVICE, pull) == []  # waits
    listed = desk.answer(b"r", desk.admin(b"r", {"op": "consumer.ls"}))
    assert listed[1]["consumers"] == [
        {
            "journal": "main",
            "name": "inv",
            "owner": "owner",
            "store": "file",
            "broker": "",
            "num_pending": 0,
            "num_ack_pending": 0,
            "ack_floor": 0,
            "redelivered": 0,
            "dead_lettered": 0,
        }
    ]
    out = desk.admin(b"r", {"op": "consumer.rm", "journal": "main", "name": "inv"})
    assert desk.answer(b"r", out) == (
        200,
        {"journal": "main", "name": "inv", "removed": True, "brokers": {"": {"status": 200, "removed": True}}},
    )
    assert desk.answer(b"p", out) == (404, "consumer inv on journal main removed by root")
    assert desk.store.consumers == {}  # its saved state went at the commit
    status, reason = desk.answer(b"o", desk.request(b"o", P.CONSUMER_SERVICE, {**pull, "wait_ms": 0}))
    assert status == 404
    for query, expected in (
        ({"op": "consumer.rm", "journal": "main", "name": "inv"}, (404, "here: no consumer 'inv' on journal 'main'")),
        ({"op": "consumer.rm", "journal": "nope", "name": "inv"}, (404, "here: no journal 'nope'")),
    ):
        assert desk.answer(b"r", desk.admin(b"r", query)) == expected


def test_journal_purge_drops_every_record_and_readers_see_410() -> None:
    desk = Desk()
    desk.connect(b"r", "root")
    desk.connect(b"w", "writer")
    for i in range(5):
        desk.core.handle(b"w", f("PUT", "TOPIC", "jobs.x", "ID", f"p{i}", "", str(i)), 0.0, "writer")
    desk.core.handle(b"w", f("PUT", "TOPIC", "jobs.x", "ID", "last", "", "held"), 0.0, "writer")  # not committed yet
    out = desk.admin(b"r", {"op": "journal.purge", "journal": "main"})
    assert desk.answer(b"r", out) == (
        200,
        {"journal": "main", "purged": 6, "brokers": {"": {"status": 200, "purged": 6, "first_seq": 7}}},
    )
    assert (desk.store.first_seq, desk.store.next_seq) == (7, 7)
    assert (b"w", P.ok_journaled("last", "main", 6)) in out  # its OK was due: it was stored (then purged)
    fetch = {"op": "fetch", "journal": "main", "from_seq": 1}
    status, reason = desk.answer(b"w", desk.request(b"w", P.JOURNAL_SERVICE, fetch))
    assert status == 410 and "first kept is 7" in reason
    desk.core.handle(b"w", f("PUT", "TOPIC", "jobs.x", "ID", "after", "", "new"), 0.0, "writer")
    assert (b"w", P.ok_journaled("after", "main", 7)) in desk.core.commit()  # numbering goes on


def test_a_journal_that_keeps_mailboxes_is_not_purged() -> None:
    store = MemoryStore("letters", JournalSettings(topics=(), mailboxes=True))
    core = BrokerCore(journals=[store], permissions=OPERATOR)
    core.handle(b"r", f("CONNECT", "VERSION", "1.0", "TTL", "60000", "ID", "c"), 0.0, "root")
    core.handle(b"r", f("PUT", "TOPIC", "t", "TO", "away", "ID", "1", "", "hi"), 0.0, "root")
    core.commit()
    kept = store.next_seq
    query = json.dumps({"op": "journal.purge", "journal": "letters"})
    out = core.handle(b"r", f("REQUEST", "SERVICE", "mc0.admin", "ID", "q", "", query), 0.0, "root")
    assert out[0][1][:5] == f("ERROR", "ID", "q", "CODE", "409")
    assert b"keeps mailboxes" in out[0][1][-1]
    assert store.next_seq == kept and store.first_seq == 1


# ---------------------------------------------------------------- a cluster of cores
class Cluster(Net):
    """Net's brokers a, b, c, each with a file journal "main" and the operator policy."""

    def __init__(self) -> None:
        super().__init__()
        self.stores: dict[str, MemoryStore] = {}
        for name, core in self.cores.items():
            store = MemoryStore("main", JournalSettings(topics=("jobs.>",)))
            fresh = BrokerCore(core.settings, OPERATOR, journals=[store])
            self.cores[name] = fresh
            self.stores[name] = store
        from mc0.broker.core import routeinput

        for name, core in self.cores.items():
            routeinput.join(core.rooms, name, route_ttl=1.0)
        self.join()
        self.ids = 0

    def admin(self, at: str, rid: bytes, query: dict[str, Any]) -> tuple[int, Any]:
        self.ids += 1
        head = ("REQUEST", "SERVICE", "mc0.admin", "ID", f"a{self.ids}", "TIMEOUT", "5000")
        self.send(at, rid, *head, "", json.dumps(query), who="root")
        (frames,) = [x for x in self.take(at, rid) if x[0] in (b"FINAL", b"ERROR")]
        if frames[0] == b"ERROR":
            return int(frames[frames.index(b"CODE") + 1]), frames[frames.index(b"MESSAGE") + 1].decode()
        return 200, json.loads(frames[-1])


def test_conn_close_is_carried_to_the_broker_the_session_is_on() -> None:
    net = Cluster()
    net.connect("a", b"r", "root")
    net.connect("c", b"v1", "victim")
    net.connect("c", b"v2", "victim")
    name = net.cores["c"].peers.by_id[b"v1"].name  # (identity#n, or identity#n@c where brokers name it so)
    victim = f"{name.partition('@')[0]}@c"
    status, data = net.admin("a", b"r", {"op": "conn.close", "id": victim})
    assert (status, data) == (200, {"closed": name, "broker": "c"})
    told = net.take("c", b"v1")
    assert told[0] == P.error(401, f"session {name} closed by root (at broker a)") and told[1] == [b"DISCONNECT"]
    assert b"v1" not in net.cores["c"].sessions and b"v2" in net.cores["c"].sessions
    status, reason = net.admin("a", b"r", {"op": "conn.close", "id": victim})
    assert (status, reason) == (404, f"no session '{victim}' at broker c")
    status, reason = net.admin("a", b"r", {"op": "conn.close", "id": f"{name.partition('@')[0]}@zz"})
    assert (status, reason) == (404, "no broker zz in this cluster (brokers: a, b, c)")


def test_consumer_rm_and_journal_purge_act_at_every_broker_holding_the_journal() -> None:
    net = Cluster()
    net.connect("a", b"r", "root")
    for name in ("b", "c"):
        net.connect(name, b"o", "owner")
        net.connect(name, b"w", "writer")
        create = json.dumps({"op": "create", "journal": "main", "name": "inv", "topics": ["jobs.>"]})
        net.send(name, b"o", "REQUEST", "SERVICE", "mc0.consumer", "ID", "k", "", create, who="owner")
        net.deliver(name, net.cores[name].commit())
        for i in range(3):
            net.send(name, b"w", "PUT", "TOPIC", "jobs.x", "ID", f"p{i}", "", "x", who="writer")
        net.deliver(name, net.cores[name].commit())
    status, data = net.admin("a", b"r", {"op": "consumer.ls"})
    assert status == 200 and sorted(r["broker"] for r in data["consumers"]) == ["b", "c"]
    assert data["brokers"] == {n: {"status": 200} for n in "abc"}
    status, data = net.admin("a", b"r", {"op": "consumer.rm", "journal": "main", "name": "inv"})
    assert status == 200 and data["removed"] is True
    assert data["brokers"]["a"] == {"status": 404, "error": "no consumer 'inv' on journal 'main'"}
    assert data["brokers"]["b"] == data["brokers"]["c"] == {"status": 200, "removed": True}
    assert all(not net.cores[n].consumers.consumers for n in "abc")
    status, data = net.admin("a", b"r", {"op": "journal.purge", "journal": "main"})
    assert status == 200 and data["purged"] == 6
    assert {n: p["purged"] for n, p in data["brokers"].items()} == {"a": 0, "b": 3, "c": 3}
    assert all(net.stores[n].first_seq == net.stores[n].next_seq for n in "abc")
    status, reason = net.admin("a", b"r", {"op": "consumer.rm", "journal": "main", "name": "inv"})
    assert status == 404 and reason.count("no consumer 'inv'") == 3


def test_a_broker_that_does_not_answer_counts_as_504_when_the_deadline_passes() -> None:
    net = Cluster()
    net.connect("a", b"r", "root")
    core = net.cores["a"]
    query = json.dumps({"op": "journal.purge", "journal": "main"})
    out = core.handle(b"r", f("REQUEST", "SERVICE", "mc0.admin", "ID", "q", "TIMEOUT", "1000", "", query), 0.0, "root")
    assert [rid for rid, _ in out if rid == b"r"] == []  # waits for b and c (their parts are never delivered)
    assert core.builtins.admin.gathering == 1
    assert all(rid != b"r" for rid, _ in core.tick(0.5))  # before the deadline: still waiting
    answered = [frames for rid, frames in core.tick(0.9) if rid == b"r"]
    assert len(answered) == 1 and answered[0][0] == b"FINAL"
    data = json.loads(answered[0][-1])
    assert data["brokers"]["b"] == {"status": 504, "error": "broker b did not answer in time"}
    assert core.builtins.admin.carried == {}
    # Their late answers are dropped, counted.
    late = admin.route_answer(core.rooms, core.routes.by_name["b"], "admin.1", 200, b'{"status": 200}', 1.0)
    assert late == [] and core.counters["admin_answers_dropped"] == 1


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"op": "conn.close", "id": "nobody#9"}', 404),
        (b"not json", 400),
        (b"[1]", 400),
        (b"{}", 400),
        (b'{"op": "conn.kill"}', 400),
        (b'{"op": "journal.purge", "journal": 7}', 400),
        (b'{"op": "journal.purge", "journal": "main", "first_seq": -1}', 400),
        (b"[" * 100_000 + b"]" * 100_000, 400),  # nested past any parser's stack: refused (by its size) first
        (b'{"a":' * 20 + b"1" + b"}" * 20, 400),  # too deep
    ],
)
def test_a_part_another_broker_carries_here_is_checked_and_always_answered(body: bytes, status: int) -> None:
    net = Cluster()
    net.connect("a", b"r", "root")
    core = net.cores["a"]
    route = core.routes.by_name["b"]
    out = admin.from_route(core.rooms, route, "admin.7", "root", body, 0.0)
    ((rid, record),) = out
    assert rid == route.routing_id and isinstance(record, bytes)
    (frames,) = [P.batch.frames_of(record, code, start, end) for code, start, end in P.batch.records(record)]
    assert frames[:3] == [b"FINAL", b"ID", b"admin.7"]
    assert json.loads(frames[-1])["status"] == status
    assert b"r" in core.sessions and net.stores["a"].first_seq == 1  # nothing else was done


@pytest.mark.parametrize(
    ("status", "data", "expected"),
    [
        (200, b'{"status": 200, "purged": 3, "first_seq": 4}', {"status": 200, "purged": 3, "first_seq": 4}),
        (200, b"garbage", {"status": 502, "error": "broker b answered something that is not a part"}),
        (200, b'{"no": "status"}', {"status": 502, "error": "broker b answered something that is not a part"}),
        (200, b"[" * 5000 + b"]" * 5000, {"status": 502, "error": "broker b answered something that is not a part"}),
        (503, b"busy", {"status": 503, "error": "busy"}),
    ],
)
def test_another_brokers_answer_becomes_its_part(status: int, data: bytes, expected: dict[str, Any]) -> None:
    net = Cluster()
    net.connect("a", b"r", "root")
    core = net.cores["a"]
    query = json.dumps({"op": "journal.purge", "journal": "main"})
    core.handle(b"r", f("REQUEST", "SERVICE", "mc0.admin", "ID", "q", "TIMEOUT", "5000", "", query), 0.0, "root")
    ids = {broker: pid for pid, broker in next(iter(core.builtins.admin.carried.values())).waiting.items()}
    missing = b'{"status": 404, "error": "x"}'
    assert admin.route_answer(core.rooms, core.routes.by_name["c"], ids["c"], 200, missing, 0.1) == []  # b still owes
    (answer,) = admin.route_answer(core.rooms, core.routes.by_name["b"], ids["b"], status, data, 0.1)
    data_out = json.loads(answer[1][-1]) if answer[1][0] == b"FINAL" else None
    assert data_out is not None and data_out["brokers"]["b"] == expected
    assert core.builtins.admin.carried == {}
