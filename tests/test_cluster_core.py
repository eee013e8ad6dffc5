"""The cluster in the broker core: several BrokerCores joined as routes, back to back, no sockets, no NATS.

A route message is what the shell would publish to another broker's inbox; ``Net`` carries it at once
(in order, per sender) and collects what each core hands its own peers.  The live tests with real
nats-server nodes are tests/test_cluster_live.py."""

from __future__ import annotations

from collections import defaultdict

import pytest

from mc0 import protocol as P
from mc0.broker.core import routeinput
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.core.routes import ROUTE_PREFIX, is_route_id, route_id
from mc0.permissions import Permissions
from mc0.protocol import batch


def f(*parts: str | bytes) -> list[bytes]:
    return [p.encode() if isinstance(p, str) else p for p in parts]


def commands(item: object) -> list[list[bytes]]:
    if isinstance(item, bytes):
        return [batch.frames_of(item, code, start, end) for code, start, end in batch.records(item)]
    assert isinstance(item, (list, tuple))
    return [list(item)]


class Net:
    """Brokers a, b, c (or as named) joined to each other; ``inbox[(broker, peer)]`` holds what a
    peer was handed (as frames, in order)."""

    def __init__(
        self, names: tuple[str, ...] = ("a", "b", "c"), permissions: Permissions | None = None, **settings: object
    ) -> None:
        self.cores = {
            n: BrokerCore(CoreSettings(min_ttl_ms=10, **settings), permissions)  # type: ignore[arg-type]
            for n in names
        }
        self.epochs = {n: 1000 + i for i, n in enumerate(names)}
        self.inbox: dict[tuple[str, bytes], list[list[bytes]]] = defaultdict(list)
        self.route_messages = 0
        self.now = 0.0
        for name, core in self.cores.items():
            routeinput.join(core.rooms, name, route_ttl=1.0)
        self.join()

    def join(self) -> None:
        """Two beacons of each broker reach every other: a broker heard twice gets a route."""
        self.beacons()
        self.beacons()

    def beacons(self) -> None:
        for sender in self.cores:
            for receiver, core in self.cores.items():
                if receiver != sender:
                    self.deliver(receiver, routeinput.hello(core.rooms, sender, self.epochs[sender], self.now))

    def deliver(self, at: str, out: list[tuple[bytes, object]]) -> None:
        """What core ``at`` returned: route messages travel on (grouped per route, as one blob), the rest
        lands in the inboxes."""
        core = self.cores[at]
        out = out + routeinput.news(core.rooms)
        blobs: dict[str, list[bytes]] = defaultdict(list)
        for rid, payload in out:
            if is_route_id(rid):
                blobs[rid[len(ROUTE_PREFIX) :].decode()].append(
                    payload if isinstance(payload, bytes) else batch.frames_record(payload)
                )
            else:
                self.inbox[(at, rid)] += commands(payload)
        for target, records in blobs.items():
            self.route_messages += 1
            blob = b"".join(records)
            self.deliver(target, routeinput.received(self.cores[target].rooms, at, self.epochs[at], blob, self.now))

    def send(self, at: str, rid: bytes, *frames: str | bytes, who: str = "anonymous") -> None:
        self.deliver(at, self.cores[at].handle(rid, f(*frames), self.now, who))

    def connect(self, at: str, rid: bytes, who: str = "anonymous", *extra: str) -> None:
        self.send(at, rid, "CONNECT", "VERSION", "1.0", "TTL", "60000", *extra, "ID", "c", who=who)
        assert self.inbox[(at, rid)].pop(0)[0] == b"OK"  # what follows it (kept letters) stays

    def take(self, at: str, rid: bytes) -> list[list[bytes]]:
        got = self.inbox.pop((at, rid), [])
        return [frames for frames in got if frames[0] != b"NOOP"]

    def messages(self, at: str, rid: bytes) -> list[bytes]:
        return [frames[-1] for frames in self.take(at, rid) if frames[0] == b"MESSAGE"]

    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.beacons()  # the brokers stay alive to each other
        for name, core in self.cores.items():
            self.deliver(name, core.tick(self.now))


def header(frames: list[bytes], name: str) -> str | None:
    for i in range(1, len(frames) - 1, 2):
        if not frames[i]:
            return None
        if frames[i] == name.encode():
            return frames[i + 1].decode()
    return None


def test_every_verb_a_route_may_send_has_one_handler() -> None:
    """routeinput's verb table has a row for each verb of the route grammar and no other (a verb that
    crosses between brokers needs both: docs/ARCHITECTURE.md, "Extending")."""
    assert set(routeinput._VERBS) == set(P.GRAMMAR[P.Side.ROUTE])


def test_each_broker_has_a_route_to_every_other_and_routes_are_not_peers_of_the_router() -> None:
    net = Net()
    for name, core in net.cores.items():
        assert sorted(core.routes.by_name) == sorted(n for n in net.cores if n != name)
    # A ROUTER peer that picks a route's routing id is dropped unanswered (an answer would go over NATS).
    out = net.cores["a"].handle(route_id("b"), f("CONNECT", "VERSION", "1.0", "TTL", "1000"), 0.0)
    assert out == [] and net.cores["a"].counters["route_id_refused"] == 1


def test_a_put_reaches_every_matching_subscriber_on_every_broker_exactly_once_in_order() -> None:
    net = Net()
    for at, rid in (("a", b"sa"), ("b", b"sb"), ("c", b"sc")):
        net.connect(at, rid)
    net.send("b", b"sb", "SUB", "", "orders.>", "orders.*", "orders.eu")  # overlapping: still once
    net.send("c", b"sc", "SUB", "", "orders.eu")
    net.send("a", b"sa", "SUB", "", "orders.*")
    net.connect("a", b"pub", "alice", "ECHO", "0")
    net.send("a", b"pub", "SUB", "", "orders.>", who="alice")  # its own publications never come back (ECHO 0)
    before = net.route_messages
    for i in range(5):
        net.send("a", b"pub", "PUT", "TOPIC", "orders.eu", "X-Trace", f"t{i}", "", f"m{i}", who="alice")
    want = [f"m{i}".encode() for i in range(5)]
    for at, rid in (("a", b"sa"), ("b", b"sb"), ("c", b"sc")):
        got = net.take(at, rid)
        assert [g[-1] for g in got] == want, (at, got)
        assert [header(g, "SENDER") for g in got] == ["alice"] * 5
        assert [header(g, "X-Trace") for g in got] == [f"t{i}" for i in range(5)]
    assert net.messages("a", b"pub") == []
    assert net.route_messages - before == 10  # one per PUT per broker with interest: b and c


def test_0x_exact_topics_cross_brokers_as_they_are_and_only_to_their_own_string() -> None:
    net = Net()
    net.send("b", b"old1", "CONNECT", "VERSION", "0.3", "TTL", "60000", "ID", "c")
    net.send("b", b"old1", "SUB", "ID", "s", "", "mcollective discovery")
    net.send("c", b"old2", "CONNECT", "VERSION", "0.3", "TTL", "60000", "ID", "c")
    net.send("c", b"old2", "SUB", "ID", "s", "", "mcollective_discovery")
    for at, rid in (("b", b"old1"), ("c", b"old2")):
        net.take(at, rid)
    net.send("a", b"pub", "CONNECT", "VERSION", "0.3", "TTL", "60000", "ID", "c")
    for topic in ("mcollective discovery", "mcollective_discovery", "mcollective.discovery"):
        net.send("a", b"pub", "PUT", "TOPIC", topic, "X-REPLY-TO", "mcollective reply c 1", "", topic)
    (got,) = net.take("b", b"old1")
    assert got[-1] == b"mcollective discovery" and header(got, "X-REPLY-TO") == "mcollective reply c 1"
    assert header(got, "SENDER") is None  # the seed's MESSAGE shape for a 0.x peer, as on one broker
    assert [g[-1] for g in net.take("c", b"old2")] == [b"mcollective_discovery"]


def test_interest_is_driven_by_subscriptions_and_withdrawn_with_them() -> None:
    net = Net()
    net.connect("b", b"sb")
    net.connect("a", b"pub")
    before = net.route_messages
    net.send("a", b"pub", "PUT", "TOPIC", "quiet.x", "", "nobody")
    assert net.route_messages == before  # no broker wants it: nothing crosses
    net.send("b", b"sb", "SUB", "", "quiet.>")
    net.send("a", b"pub", "PUT", "TOPIC", "quiet.x", "", "1")
    assert net.messages("b", b"sb") == [b"1"]
    net.send("b", b"sb", "UNSUB", "", "quiet.>")
    before = net.route_messages
    net.send("a", b"pub", "PUT", "TOPIC", "quiet.x", "", "2")
    assert net.route_messages == before and net.messages("b", b"sb") == []


def test_a_queue_group_gets_each_message_once_in_the_whole_cluster() -> None:
    net = Net()
    members = [("a", b"m1"), ("b", b"m2"), ("b", b"m3"), ("c", b"m4")]
    for at, rid in members:
        net.connect(at, rid)
        net.send(at, rid, "SUB", "GROUP", "billing", "", "work.>")
    net.connect("c", b"plain")
    net.send("c", b"plain", "SUB", "", "work.>")
    net.connect("a", b"pub")
    n = 60
    for i in range(n):
        net.send("a", b"pub", "PUT", "TOPIC", "work.item", "", str(i))
    got = {m: net.messages(*m) for m in members}
    merged = sorted(int(b) for bodies in got.values() for b in bodies)
    assert merged == list(range(n))  # each message to exactly one member
    assert all(got.values())  # and every broker's members got some
    assert net.messages("c", b"plain") == [str(i).encode() for i in range(n)]


SECRET_DENIED = Permissions.from_table(
    {
        "default": {"publish": [">"], "subscribe": [">"]},
        "identity": {n: {"deny": {"subscribe": ["orders.secret.>"]}} for n in ("carol", "erin")},
    }
)


def test_a_group_copy_no_member_there_may_take_goes_back_to_the_broker_that_chose_and_on_to_one_that_may() -> None:
    """dave at a, carol at b (denied orders.secret.>) in one group, the publisher at c: every secret
    message reaches dave, once; b hands back the copies c chose it for, and c chooses again."""
    net = Net(permissions=SECRET_DENIED)
    for at, rid, who in (("a", b"dave", "dave"), ("b", b"carol", "carol")):
        net.connect(at, rid, who)
        net.send(at, rid, "SUB", "GROUP", "billing", "", "orders.>", who=who)
    net.connect("c", b"pub", "alice")
    n = 20
    for i in range(n):
        net.send("c", b"pub", "PUT", "TOPIC", "orders.secret.plan", "X-N", str(i), "", f"s{i}", who="alice")
    dave = net.take("a", b"dave")
    assert sorted(g[-1] for g in dave) == sorted(f"s{i}".encode() for i in range(n))  # each once
    assert all(header(g, "GROUP") == "billing" and header(g, "SENDER") == "alice" for g in dave)
    assert sorted(header(g, "X-N") or "" for g in dave) == sorted(str(i) for i in range(n))  # X- headers kept
    assert all(header(g, "TRIED") is None and header(g, "REFUSED") is None for g in dave)  # routes' words only
    assert net.take("b", b"carol") == []
    # b hands back the first copy c chose it for; c then passes b over for the topic (b's members may not
    # take it) while dave may: one round trip, not one per message.
    assert net.cores["b"].counters["route_group_handed_back"] == 1
    assert net.cores["c"].counters["route_group_unplaced"] == 0
    for i in range(n):  # what both may take is still shared
        net.send("c", b"pub", "PUT", "TOPIC", "orders.eu", "", f"e{i}", who="alice")
    shared = {m: net.messages(at, m) for at, m in (("a", b"dave"), ("b", b"carol"))}
    assert sorted(b for got in shared.values() for b in got) == sorted(f"e{i}".encode() for i in range(n))
    assert all(shared.values())


def test_a_group_copy_nobody_in_the_cluster_may_take_visits_each_broker_once_and_is_counted() -> None:
    net = Net(("a", "b", "c", "d"), permissions=SECRET_DENIED)
    for at, rid, who in (("a", b"erin", "erin"), ("b", b"carol", "carol")):
        net.connect(at, rid, who)
        net.send(at, rid, "SUB", "GROUP", "billing", "", "orders.>", who=who)
    net.connect("c", b"pub", "alice")
    before = net.route_messages
    net.send("c", b"pub", "PUT", "TOPIC", "orders.secret.plan", "", "nobody", who="alice")
    assert net.route_messages - before == 4  # c -> one, back, c -> the other, back: then no one is left
    assert net.take("a", b"erin") == [] and net.take("b", b"carol") == []
    assert net.cores["c"].counters["route_group_unplaced"] == 1


def test_a_route_that_refused_a_topic_is_still_tried_when_no_one_else_may_take_it() -> None:
    """c passes b over for a topic b handed back while another member may take it; when grants change
    (a reload at a and at b, which c does not see) b is tried again, and nothing is lost."""
    net = Net(permissions=SECRET_DENIED)
    for at, rid, who in (("a", b"dave", "dave"), ("b", b"carol", "carol")):
        net.connect(at, rid, who)
        net.send(at, rid, "SUB", "GROUP", "billing", "", "orders.>", who=who)
    net.connect("c", b"pub", "alice")
    for i in range(4):
        net.send("c", b"pub", "PUT", "TOPIC", "orders.secret.plan", "", f"s{i}", who="alice")
    assert sorted(net.messages("a", b"dave")) == [b"s0", b"s1", b"s2", b"s3"]
    swapped = Permissions.from_table(
        {
            "default": {"publish": [">"], "subscribe": [">"]},
            "identity": {"dave": {"deny": {"subscribe": ["orders.secret.>"]}}},
        }
    )
    version = net.cores["c"].pubsub.version
    for at in ("a", "b"):
        assert net.cores[at].set_permissions(swapped, net.now) == []  # (nothing withdrawn: deny lists act per message)
    assert net.cores["c"].pubsub.version == version  # c sees no change: its hint about b is stale now
    for i in range(4):
        net.send("c", b"pub", "PUT", "TOPIC", "orders.secret.plan", "", f"t{i}", who="alice")
    assert sorted(net.messages("b", b"carol")) == [b"t0", b"t1", b"t2", b"t3"]
    assert net.messages("a", b"dave") == []


def test_a_handed_back_copy_never_reaches_the_publisher_that_said_echo_0() -> None:
    net = Net(permissions=SECRET_DENIED)
    net.connect("c", b"pub", "alice", "ECHO", "0")
    net.send("c", b"pub", "SUB", "GROUP", "billing", "", "orders.>", who="alice")
    net.connect("b", b"carol", "carol")
    net.send("b", b"carol", "SUB", "GROUP", "billing", "", "orders.>", who="carol")
    net.send("c", b"pub", "PUT", "TOPIC", "orders.secret.plan", "", "mine", who="alice")
    assert net.take("c", b"pub") == [] and net.take("b", b"carol") == []
    assert net.cores["c"].counters["route_group_unplaced"] == 1
    net.connect("c", b"other", "bob")  # another peer at c may take it
    net.send("c", b"other", "SUB", "GROUP", "billing", "", "orders.>", who="bob")
    for i in range(2):  # (one goes to bob at once, one to carol, handed back, then to bob)
        net.send("c", b"pub", "PUT", "TOPIC", "orders.secret.plan", "", f"m{i}", who="alice")
    assert sorted(net.messages("c", b"other")) == [b"m0", b"m1"] and net.take("c", b"pub") == []


def test_a_request_at_one_broker_is_served_by_a_worker_behind_another() -> None:
    net = Net()
    net.connect("c", b"w", "bob")
    net.send("c", b"w", "READY", "CAPACITY", "2", "", "echo", who="bob")
    net.connect("a", b"cl", "alice")
    net.send("a", b"cl", "REQUEST", "SERVICE", "echo", "ID", "r1", "TIMEOUT", "5000", "X-K", "v", "", "hi", who="alice")
    ((request,),) = [net.take("c", b"w")]
    assert request[0] == b"REQUEST" and header(request, "CALLER") == "alice" and header(request, "X-K") == "v"
    bid = header(request, "ID")
    assert bid is not None
    net.send("c", b"w", "PARTIAL", "ID", bid, "", "p1", who="bob")
    net.send("c", b"w", "PARTIAL", "ID", bid, "", "p2", who="bob")
    net.send("c", b"w", "FINAL", "ID", bid, "", "done", who="bob")
    got = net.take("a", b"cl")
    assert [(g[0], header(g, "ID"), g[-1]) for g in got] == [
        (b"PARTIAL", "r1", b"p1"),
        (b"PARTIAL", "r1", b"p2"),
        (b"FINAL", "r1", b"done"),
    ]


def test_no_worker_anywhere_is_503_at_once_and_a_worker_gone_is_withdrawn_from_the_others() -> None:
    net = Net()
    net.connect("a", b"cl")
    net.send("a", b"cl", "REQUEST", "SERVICE", "echo", "ID", "r1", "", "x")
    ((answer,),) = [net.take("a", b"cl")]
    assert answer[0] == b"ERROR" and header(answer, "CODE") == "503"
    net.connect("c", b"w")
    net.send("c", b"w", "READY", "", "echo")
    assert "echo" in net.cores["a"].rpc.services
    net.send("c", b"w", "DISCONNECT")
    assert "echo" not in net.cores["a"].rpc.services
    net.send("a", b"cl", "REQUEST", "SERVICE", "echo", "ID", "r2", "", "x")
    ((answer,),) = [net.take("a", b"cl")]
    assert header(answer, "CODE") == "503"


def test_capacity_holds_across_brokers_and_the_rest_waits_in_the_callers_broker() -> None:
    net = Net()
    net.connect("c", b"w")
    net.send("c", b"w", "READY", "CAPACITY", "2", "", "slow")
    net.connect("a", b"cl")
    for i in range(5):
        net.send("a", b"cl", "REQUEST", "SERVICE", "slow", "ID", f"r{i}", "TIMEOUT", "60000", "", str(i))
    first = net.take("c", b"w")
    assert [g[-1] for g in first] == [b"0", b"1"]  # never more than its capacity at the worker
    assert net.cores["a"].rpc.services["slow"].queued == 3  # the rest waits at a, for any worker
    net.send("c", b"w", "FINAL", "ID", header(first[0], "ID") or "", "", "ok")
    assert [g[-1] for g in net.take("c", b"w")] == [b"2"]


def test_the_deadline_gives_504_at_the_client_and_cancel_at_the_worker_and_cancel_reaches_it() -> None:
    net = Net()
    net.connect("c", b"w")
    net.send("c", b"w", "READY", "", "slow")
    net.connect("a", b"cl")
    net.send("a", b"cl", "REQUEST", "SERVICE", "slow", "ID", "r1", "TIMEOUT", "100", "", "x")
    (request,) = net.take("c", b"w")
    net.tick(0.2)
    ((answer,),) = [net.take("a", b"cl")]
    assert header(answer, "CODE") == "504"
    assert [(g[0], header(g, "ID")) for g in net.take("c", b"w")] == [(b"CANCEL", header(request, "ID"))]
    net.send("a", b"cl", "REQUEST", "SERVICE", "slow", "ID", "r2", "TIMEOUT", "60000", "", "y")
    (request,) = net.take("c", b"w")
    net.send("a", b"cl", "CANCEL", "ID", "r2")
    ((answer,),) = [net.take("a", b"cl")]
    assert header(answer, "CODE") == "499"
    assert [(g[0], header(g, "ID")) for g in net.take("c", b"w")] == [(b"CANCEL", header(request, "ID"))]


def test_scatter_counts_the_workers_of_the_whole_cluster() -> None:
    net = Net()
    for at, rid in (("a", b"w1"), ("b", b"w2"), ("c", b"w3"), ("c", b"w4")):
        net.connect(at, rid)
        net.send(at, rid, "READY", "", "census")
    net.connect("a", b"cl")
    net.send("a", b"cl", "REQUEST", "SERVICE", "census", "ID", "r1", "ALL", "1", "TIMEOUT", "60000", "", "?")
    for at, rid in (("a", b"w1"), ("b", b"w2"), ("c", b"w3")):  # w4 never answers
        (request,) = net.take(at, rid)
        net.send(at, rid, "FINAL", "ID", header(request, "ID") or "", "", rid)
    assert [g[-1] for g in net.take("a", b"cl")] == [b"w1", b"w2", b"w3"]
    net.tick(59.6)  # c's own deadline: a little earlier than a's, so its summary arrives in time
    net.tick(1.0)
    got = net.take("a", b"cl")
    assert [(g[0], header(g, "COUNT"), header(g, "MISSING")) for g in got] == [(b"FINAL", "3", "1")]


def test_a_broker_gone_requeues_what_it_held_and_the_client_gets_one_terminal() -> None:
    net = Net()
    net.connect("c", b"wc")
    net.send("c", b"wc", "READY", "", "job")
    net.connect("b", b"wb")
    net.send("b", b"wb", "READY", "", "job")
    net.connect("a", b"cl")
    net.send("a", b"cl", "REQUEST", "SERVICE", "job", "ID", "r1", "TIMEOUT", "60000", "", "x")
    holder = "c" if net.inbox.get(("c", b"wc")) else "b"
    other = "b" if holder == "c" else "c"
    net.take(holder, b"w" + holder.encode())
    # The holder's broker dies: no more beacons; the others forget it after its liveness.
    del net.cores[holder]
    for _ in range(40):
        net.now += 0.1
        for name, core in list(net.cores.items()):
            for sender in net.cores:
                if sender != name:
                    net.deliver(name, routeinput.hello(core.rooms, sender, net.epochs[sender], net.now))
            net.deliver(name, core.tick(net.now))
        if net.inbox.get((other, b"w" + other.encode())):
            break
    (request,) = net.take(other, b"w" + other.encode())
    net.send(other, b"w" + other.encode(), "FINAL", "ID", header(request, "ID") or "", "", "second")
    assert [(g[0], g[-1]) for g in net.take("a", b"cl")] == [(b"FINAL", b"second")]


def test_a_letter_reaches_its_identity_on_any_broker_and_waits_for_it_to_come() -> None:
    net = Net()
    net.connect("a", b"pub", "alice")
    net.connect("c", b"bob1", "bob")
    net.send("a", b"pub", "PUT", "TOPIC", "note", "TO", "bob", "ID", "p1", "", "hi", who="alice")
    assert [header(g, "MAILBOX") for g in net.take("a", b"pub")] == [P.MAILBOX_DELIVERED]
    (letter,) = net.take("c", b"bob1")
    assert letter[-1] == b"hi" and header(letter, "TO") == "bob" and header(letter, "SENDER") == "alice"
    net.send("c", b"bob1", "DISCONNECT")
    net.send("a", b"pub", "PUT", "TOPIC", "note", "TO", "bob", "ID", "p2", "", "later", who="alice")
    assert [header(g, "MAILBOX") for g in net.take("a", b"pub")] == [P.MAILBOX_STORED]
    net.connect("b", b"bob2", "bob")  # bob comes back at another broker: the kept letter follows him
    assert [g[-1] for g in net.take("b", b"bob2") if g[0] == b"MESSAGE"] == [b"later"]


def test_a_restarted_broker_gets_a_fresh_session_and_stale_interest_is_gone() -> None:
    net = Net(("a", "b"))
    net.connect("b", b"s")
    net.send("b", b"s", "SUB", "", "x.>")
    assert net.cores["a"].pubsub.subscriptions.match(("x", "y"))
    # b restarts: a new core, a new (larger) epoch; its old subscriber is gone.
    net.cores["b"] = BrokerCore(CoreSettings(min_ttl_ms=10))
    routeinput.join(net.cores["b"].rooms, "b", route_ttl=1.0)
    net.epochs["b"] += 1
    net.join()
    assert not net.cores["a"].pubsub.subscriptions.match(("x", "y"))
    assert sorted(net.cores["a"].routes.by_name) == ["b"]
    # A late message of b's first run is dropped, not taken for the new one.
    assert routeinput.received(net.cores["a"].rooms, "b", net.epochs["b"] - 1, b"", net.now) == []


@pytest.mark.parametrize(
    "records",
    [
        b"\xff\xff",  # not even a record
        batch.frames_record([b"BOGUS"]),
        batch.frames_record(f("SUB", "", "a..b")),
        batch.frames_record(f("READY", "CAPACITY", "x", "", "svc")),
        batch.frames_record(f("REQUEST", "SERVICE", "s", "ID", "1", "TIMEOUT", "5")),  # no CALLER
        batch.frames_record(f("MESSAGE", "TOPIC", "t", "", "body")),  # no SENDER
        batch.frames_record(f("ERROR", "ID", "1", "CODE", "2000", "MESSAGE", "m")),
        batch.frames_record(f("PUT", "TOPIC", "t", "", "x")),  # not something a route says
        batch.work_record(b"svc", b"1", b"alice", 100, b"x")[:-3],  # a WORK record cut short
        batch.work_record(b"bad..name", b"1", b"alice", 100, b"x"),
        b"\x05\x00\x00\x00\x02\x01\x00",  # a MESSAGE record too short for its fields
        batch.frames_record(f("MESSAGE", "TOPIC", "t", "SENDER", "s", "REFUSED", "a", "", "x")),  # no GROUP
        batch.frames_record(f("MESSAGE", "TOPIC", "t", "SENDER", "s", "TRIED", "a", "", "x")),  # no GROUP
        batch.frames_record(f("MESSAGE", "TOPIC", "t", "SENDER", "s", "GROUP", "g", "REFUSED", "", "", "x")),
        batch.frames_record(f("MESSAGE", "TOPIC", "t", "SENDER", "s", "GROUP", "g", "REFUSED", "a,b c", "", "x")),
        batch.frames_record(f("MESSAGE", "TOPIC", "t", "SENDER", "s", "GROUP", "g", "TRIED", "a,,b", "", "x")),
        batch.frames_record(f("MESSAGE", "TOPIC", "a b", "SENDER", "s", "GROUP", "g", "", "x")),  # an opaque topic
    ],
)
def test_a_route_record_that_cannot_be_taken_is_counted_and_dropped_unanswered(records: bytes) -> None:
    net = Net(("a", "b"))
    out = routeinput.received(net.cores["a"].rooms, "b", net.epochs["b"], records, net.now)
    assert [o for o in out if not is_route_id(o[0])] == []
    assert net.cores["a"].counters["route_records_refused"] >= 1
    net.connect("a", b"x")  # the broker carries on


@pytest.mark.parametrize(
    ("bad", "refused", "failed"),
    [
        pytest.param(batch.put_record(b"t.x", b"a client's PUT"), 1, 0, id="PUT"),  # the route grammar has no PUT
        pytest.param(batch.call_record(b"svc", b"c1", 100, b"x"), 1, 0, id="CALL"),  # a REQUEST without CALLER
        pytest.param(batch.ok_record(b"o1"), 1, 0, id="OK"),
        pytest.param(batch.frames_record(f("SUB", "", "t.>")), 0, 1, id="raises"),  # its handler raises: a bug
    ],
)
def test_a_bad_route_record_costs_itself_only_and_the_records_around_it_all_take_effect(
    bad: bytes, refused: int, failed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> list[object]:
        raise RuntimeError("a bug in a route verb")

    net = Net(("a", "b"))
    net.connect("a", b"sa")
    net.send("a", b"sa", "SUB", "", "t.>")
    monkeypatch.setitem(routeinput._VERBS, P.Verb.SUB, broken)  # (from here on: b's announcement reached it)
    blob = b"".join(
        [batch.message_record(b"t.1", b"alice", b"m1"), bad, batch.message_record(b"t.2", b"alice", b"m2"), bad]
    )
    a = net.cores["a"]
    blob += batch.message_record(b"t.3", b"bob", b"m3")
    net.deliver("a", routeinput.received(a.rooms, "b", net.epochs["b"], blob, 0))
    assert net.messages("a", b"sa") == [b"m1", b"m2", b"m3"]
    assert (a.counters["route_records_refused"], a.counters["route_records_failed"]) == (2 * refused, 2 * failed)
    assert a.counters["internal_errors"] == 2 * failed


def test_route_traffic_dropped_on_the_way_in_is_healed_by_reopening_every_route() -> None:
    """What the link reports as RoutesDropped: announcements lost while this broker fell behind are
    recovered by opening each route afresh (each side sends its whole state again), and nothing is
    delivered twice afterwards."""
    net = Net(("a", "b"))
    net.connect("b", b"sb")
    net.connect("a", b"sa")
    net.send("b", b"sb", "SUB", "", "x.>")
    net.send("a", b"sa", "SUB", "", "z.>")
    # b's next announcements never reach a (dropped on a's side of NATS): a still believes x, not y.
    b = net.cores["b"]
    for frames in (f("SUB", "", "y.>"), f("UNSUB", "", "x.>")):
        out = b.handle(b"sb", frames, net.now, "anonymous")
        assert all(is_route_id(rid) or rid == b"sb" for rid, _ in out)
        routeinput.news(b.rooms)  # (what would have crossed: lost)
    net.connect("a", b"pub")
    net.send("a", b"pub", "PUT", "TOPIC", "y.1", "", "lost")
    assert net.messages("b", b"sb") == []  # the loss is real
    net.deliver("a", routeinput.reopen(net.cores["a"].rooms, net.now))
    assert net.cores["a"].counters["route_reopened"] == 1
    before = net.route_messages
    net.send("a", b"pub", "PUT", "TOPIC", "x.1", "", "nobody")
    assert net.route_messages == before  # x's interest is gone at a
    net.send("a", b"pub", "PUT", "TOPIC", "y.2", "", "healed")
    assert net.messages("b", b"sb") == [b"healed"]
    net.connect("b", b"pub2")
    net.send("b", b"pub2", "PUT", "TOPIC", "z.1", "", "once")
    assert net.messages("a", b"sa") == [b"once"]  # a's own interest, announced again, counts once
    assert sorted(net.cores["a"].routes.by_name) == ["b"] and sorted(b.routes.by_name) == ["a"]


def test_a_route_whose_queue_overflows_is_counted_not_evicted_and_opened_afresh_on_the_next_turn() -> None:
    """What the shell reports when a route's queue is over its budget (NATS slow or stalled): each message
    that did not fit is counted, and the next turn opens the route afresh (once, however many were lost):
    forgotten, then CONNECT and this broker's whole state, which the other answers with its own, so
    interest, services and requests are right again; never the 429-and-disconnect of a slow consumer."""
    net = Net(("a", "b"))
    net.connect("b", b"sb")
    net.send("b", b"sb", "SUB", "", "x.>")
    a = net.cores["a"]
    assert a.send_failed(route_id("b"), net.now, unreachable=False) == []
    assert a.send_failed(route_id("b"), net.now, unreachable=False) == []
    assert a.evict_stalled(route_id("b"), net.now) == []  # (the shell freed its queue: resynced, not evicted)
    assert (a.counters["route_queue_dropped"], a.counters["route_queue_stalled"]) == (2, 1)
    assert "b" in a.routes.by_name and a.counters["forgotten_too_slow"] == 0
    out = routeinput.resync_overflowed(a.rooms, net.now)
    assert [commands(p)[0][0] for rid, p in out if rid == route_id("b")][:1] == [b"CONNECT"]
    assert a.counters["route_resynced"] == 1 and routeinput.resync_overflowed(a.rooms, net.now) == []
    net.deliver("a", out)  # b answers with its whole state: its subscriber's interest is known at a again
    net.connect("a", b"pub")
    net.send("a", b"pub", "PUT", "TOPIC", "x.1", "", "after")
    assert net.messages("b", b"sb") == [b"after"]


def test_a_route_message_walked_a_slice_at_a_time_does_what_it_does_walked_whole() -> None:
    """The shell walks a long route message within a time budget per turn (``received_slice``): each
    slice goes on where the last stopped, in order, and the message is counted once."""
    net = Net(("a", "b"))
    net.connect("a", b"sa")
    net.send("a", b"sa", "SUB", "", "t.>")
    a = net.cores["a"]
    blob = b"".join(batch.message_record(f"t.{i}".encode(), b"alice", b"m%d" % i) for i in range(10))
    blob += batch.frames_record(f("CONNECT", "VERSION", "1.0", "TTL", "1000"))  # (b opens afresh: a new route)
    blob += batch.message_record(b"t.last", b"alice", b"after")
    before = a.counters["route_messages_in"]
    pos: int | None = 0
    slices = 0
    while pos is not None:
        out, pos = routeinput.received_slice(a.rooms, "b", net.epochs["b"], blob, pos, 3, net.now)
        net.deliver("a", out)
        slices += 1
    assert slices == 4 and a.counters["route_messages_in"] == before + 1
    assert net.messages("a", b"sa") == [b"m%d" % i for i in range(10)] + [b"after"]


def test_no_route_is_taken_for_gone_while_route_traffic_waits_unread() -> None:
    """Beacons may wait in the link's pipe behind route traffic the shell has not walked yet: while it
    says so (``behind``), no route's silence is measured."""
    net = Net(("a", "b"))
    a = net.cores["a"]
    for _ in range(30):  # 3 s without b's beacons (its liveness: 1 s x the core's liveness), a behind all along
        net.now += 0.1
        routeinput.behind(a.rooms, net.now)
        net.deliver("a", a.tick(net.now))
    assert "b" in a.routes.by_name
    for _ in range(50):  # caught up, and b still silent: gone after its liveness
        net.now += 0.1
        net.deliver("a", a.tick(net.now))
    assert "b" not in a.routes.by_name


def test_beacons_from_many_made_up_names_open_routes_only_within_the_bounds_and_share_one_state_blob() -> None:
    """(adversary D6) Each beacon from a name not seen before opened a route and built the whole state for
    it: 3,000 in 3 s stalled a broker for seconds and grew it by 139 MiB.  A name heard once opens
    nothing (a bounded table remembers it); one heard twice opens a route within a burst and a rate and
    under a cap, and every route opened meanwhile is handed the same bytes (built once)."""
    from mc0.broker.core import routes as R

    net = Net(("a", "b"))
    net.connect("a", b"sa")
    net.send("a", b"sa", "SUB", "", *[f"some.long.topic.{i:05d}.>" for i in range(500)])
    a = net.cores["a"]
    opened = a.counters["routes_opened"]
    out = [o for n in range(3000) for o in routeinput.hello(a.rooms, f"ghost{n}", 1, net.now)]
    assert out == [] and a.counters["routes_opened"] == opened and sorted(a.routes.by_name) == ["b"]
    assert len(a.routes._heard_once) <= R.HEARD_ONCE_KEPT
    # Heard twice: at most a burst opens now, then a few a second; each is handed the very same bytes.
    for _ in range(2):
        out = [o for n in range(300) for o in routeinput.hello(a.rooms, f"twice{n}", 1, net.now)]
    burst = R.NEW_ROUTES_BURST - 1  # (one was spent on b)
    assert len(a.routes.by_name) == 1 + burst
    hellos = [payload for rid, payload in out if rid != route_id("b")]
    assert len(hellos) == burst and all(h is hellos[0] for h in hellos)
    assert a.counters["route_too_fast"] == 300 - burst
    net.now += 1.0
    for n in range(300):
        routeinput.hello(a.rooms, f"twice{n}", 1, net.now)
    assert len(a.routes.by_name) == 1 + burst + int(R.NEW_ROUTES_PER_S)
    # Never past the cap, however slowly they come.
    for n in range(300):
        net.now += 1.0
        routeinput.hello(a.rooms, f"twice{n}", 1, net.now)
        routeinput.hello(a.rooms, f"twice{n}", 1, net.now)
    assert len(a.routes.by_name) == R.MAX_ROUTES and a.counters["route_too_many"] > 0
    # A change of interest builds the state afresh: the next route opened gets it.
    a.handle(b"sa", f("SUB", "", "fresh.>"), net.now)  # (its news would go to the made-up brokers: not sent)
    assert b"fresh.>" in a.routes.hello() and a.routes.hello() is not hellos[0]


def test_a_beacon_under_this_brokers_own_name_is_a_namesake_said_and_shown_never_a_route(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """(adversary D1) Two brokers named alike: the others keep a route to one of them at a time and both
    get the route traffic for the name, so clients of both lose messages.  A beacon (or a route message)
    under this broker's own name, of another run, was dropped without a word; now it is counted, said at
    ERROR at once (then once a minute while it lasts, beacons or not), shown (/healthz) until it has been
    quiet for ``NAME_COLLISION_SHOWN_S``, and never opens a route to ourselves."""
    import logging

    from mc0.broker.core import routes as R

    net = Net(("a", "b"))
    a = net.cores["a"]
    with caplog.at_level(logging.ERROR, "mc0.broker"):
        for _ in range(200):  # 50 s of beacons, 4 a second
            assert routeinput.hello(a.rooms, "a", 99, net.now) == []
            net.now += 0.25
        assert routeinput.received(a.rooms, "a", 99, batch.message_record(b"x", b"s", b"m"), net.now) == []
        said = [r for r in caplog.records if "another broker is also named a" in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.ERROR and "unique" in said[0].getMessage()
        assert sorted(a.routes.by_name) == ["b"] and a.counters["route_name_collisions"] == 201
        assert a.routes.name_collision(net.now) == {"name": "a", "epoch": f"{99:016x}", "heard_s_ago": 0.0}
        net.now += 15.0  # (a minute since it was said)
        routeinput.hello(a.rooms, "a", 99, net.now)
        routeinput.hello(a.rooms, "a", 100, net.now)  # (another run of it: news)
        said = [r for r in caplog.records if "another broker is also named a" in r.getMessage()]
        assert len(said) == 3 and f"{100:016x}" in said[-1].getMessage()
    net.now += R.NAME_COLLISION_SHOWN_S + 0.1
    assert a.routes.name_collision(net.now) is None
    assert net.cores["b"].routes.name_collision(net.now) is None


def test_a_route_announcing_more_patterns_than_its_budget_is_taken_in_part_counted_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """(adversary #27) A route is trusted, so nothing it announces was held to a limit: 200,000 SUB patterns
    grew a broker by 380 MiB.  Now one route holds at most ``[cluster] max_route_patterns`` here: the first
    ones are taken, the rest refused, counted, said once while the route lasts; what it gives up makes room."""
    import logging

    net = Net(("a", "b"))
    a = net.cores["a"]
    routeinput.join(a.rooms, "a", route_ttl=1.0, max_patterns=100)
    net.connect("a", b"pub")
    net.connect("b", b"sub")
    with caplog.at_level(logging.ERROR, "mc0.broker"):
        net.send("b", b"sub", "SUB", "", *[f"t.{i:03d}" for i in range(150)])
        net.send("b", b"sub", "SUB", "", *[f"u.{i:03d}" for i in range(10)])
    route = a.routes.by_name["b"]
    assert a.pubsub.count(route) == 100 and a.counters["route_patterns_refused"] == 60
    said = [r.getMessage() for r in caplog.records if "max_route_patterns" in r.getMessage()]
    assert len(said) == 1 and "broker b announced more than 100 patterns" in said[0], said
    for topic in ("t.000", "t.099", "t.100"):
        net.send("a", b"pub", "PUT", "TOPIC", topic, "", topic)
    assert net.messages("b", b"sub") == [b"t.000", b"t.099"]  # (t.100 was refused at a)
    net.send("b", b"sub", "UNSUB", "", *[f"t.{i:03d}" for i in range(10)])
    net.send("b", b"sub", "SUB", "", "v.>")
    assert a.pubsub.count(route) == 91 and "v.>" in a.pubsub.held(route, None)
