"""No peer can kill the broker, and the bugs of the robustness issue, without sockets.

Each test here failed on the code before the fix it names."""

from __future__ import annotations

import json

import pytest

from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore
from mc0.protocol import Side
from mc0.session import Answer, ClientSession, Connected

from .test_core_rpc import Net, f, only

DEEP = '{"op":' + "[" * 5000


# (who sends, frames): each of these raised out of BrokerCore.handle (the broker exited 1).
CRASHERS = [
    ("worker", ("ERROR", "ID", "1", "CODE", "²", "MESSAGE", "m")),  # str.isdigit accepts it, int() does not
    ("worker", ("ERROR", "ID", "1", "CODE", "9" * 5000, "MESSAGE", "m")),  # int() refuses > 4,300 digits
    ("worker", ("ERROR", "ID", "1", "CODE", "١٢٣", "MESSAGE", "m")),  # Arabic-Indic digits
    ("client", ("REQUEST", "SERVICE", "mc0.broker", "ID", "r", "", DEEP)),  # RecursionError
    ("client", ("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", DEEP)),
    ("client", ("REQUEST", "SERVICE", "mc0.journal", "ID", "r", "", '{"op":"fetch","journal":' + "[" * 5000)),
    ("stranger", ("", "MDPC02", "\x02", "mc0.broker", DEEP)),  # an MDP client, no CONNECT at all
    ("stranger", ("MDPC02", "\x02", "mc0.journal", DEEP)),
    ("stranger", ("MDPXC01", "\x01", "mc0.broker", "r", DEEP)),  # a seed-000 client
    ("stranger", ("MDPXC01", "\x01", "mc0.journal", "r", DEEP)),
    ("stranger", ("", "eMQP/1.0", "REQUEST", "m", "mc0.broker", "reply-requested", DEEP)),  # an eMQP client
    ("stranger", ("", "eMQP/1.0", "REQUEST", "m", "mc0.journal", "reply-requested", DEEP)),
    ("stranger", ("", "DGBX\x01", "\x04", "mc0.broker", "", "", DEEP)),  # a DCP client
    ("stranger", ("", "DGBX\x01", "\x04", "mc0.journal", "", "", DEEP)),
]


@pytest.mark.parametrize(("who", "frames"), CRASHERS)
def test_a_single_message_that_killed_the_broker_is_an_answer(who: str, frames: tuple[str, ...]) -> None:
    net = Net()
    net.worker("worker", "svc")
    net.connect("client")
    net.send("client", "REQUEST", "SERVICE", "svc", "ID", "1")  # the worker now holds bid 1
    out = net.core.handle(who.encode(), f(*frames), 0.0, who)  # must not raise
    # Answered: an ERROR to the sender, a FINAL with the error to the MDP client, or the
    # worker's ERROR passed to its caller as a 500.
    assert [rid for rid, _ in out] == [b"client" if who == "worker" else who.encode()]
    assert net.send("client", "PING", "ID", "p")[b"client"][0].verb is P.Verb.PONG


def test_an_unknown_or_connection_code_from_a_worker_reaches_its_caller_as_500_naming_it() -> None:
    net = Net()
    net.worker("w", "svc")
    net.connect("c")
    for rid, code, expected in [("a", "401", "500"), ("b", "²", "500"), ("c", "503", "500"), ("d", "404", "404")]:
        out = net.send("c", "REQUEST", "SERVICE", "svc", "ID", rid)
        bid = only(out, "w").headers["ID"]
        answer = only(net.send("w", "ERROR", "ID", bid, "CODE", code, "MESSAGE", "nope"), "c")
        assert (answer.id, answer.headers["CODE"]) == (rid, expected)
        if expected == "500":
            assert code[:8] in answer.headers["MESSAGE"] and "nope" in answer.headers["MESSAGE"]


def test_a_401_answering_a_request_does_not_reset_the_client_session() -> None:
    session = ClientSession(ttl_ms=1000)
    connect = session.connect(0.0)
    events, _ = session.receive(P.ok(P.decode(connect, sender=Side.PEER).id or "", ttl_ms=1000), 0.0)
    assert isinstance(events[0], Connected)
    session.request("svc", b"x", "r1", 1000)
    session.request("svc", b"y", "r2", 1000)
    events, frames = session.receive(P.error(401, "from a worker, say", "r1"), 0.1)
    assert events == [Answer("r1", P.decode(P.error(401, "from a worker, say", "r1"), sender=Side.BROKER))]
    assert session.connected  # no reconnect: r2 is still pending
    assert [P.decode(fr, sender=Side.PEER).verb for fr in frames] == [P.Verb.PING]  # a probe instead
    # A 401 to anything else (here the probe) is the broker forgetting us: heal.
    probe = P.decode(frames[0], sender=Side.PEER).id
    events, frames = session.receive(P.error(401, "not connected", probe), 0.2)
    assert not session.connected and P.decode(frames[0], sender=Side.PEER).verb is P.Verb.CONNECT


def test_lowering_capacity_with_a_repeated_ready_is_obeyed() -> None:
    net = Net()
    net.worker("w", "svc", capacity=3)
    net.connect("c")
    assert b"w" in net.send("c", "REQUEST", "SERVICE", "svc", "ID", "1")
    net.send("w", "READY", "CAPACITY", "1", "", "svc")  # holds one: now full
    assert b"w" not in net.send("c", "REQUEST", "SERVICE", "svc", "ID", "2")  # queued, not dispatched
    report = json.loads(
        only(net.send("c", "REQUEST", "SERVICE", "mc0.broker", "ID", "s", "", "services"), "c").payload[0]
    )
    assert report["svc"]["queued"] == 1 and report["svc"]["idle"] == 0


def test_requests_that_died_in_the_queue_stop_counting_toward_its_limit() -> None:
    net = Net(max_queue=5)
    net.worker("w", "svc")
    net.connect("c")
    net.send("c", "REQUEST", "SERVICE", "svc", "ID", "busy")  # occupies the only worker
    for i in range(5):
        assert b"c" not in net.send("c", "REQUEST", "SERVICE", "svc", "ID", f"q{i}", "TIMEOUT", "200")
    over = only(net.send("c", "REQUEST", "SERVICE", "svc", "ID", "over", "TIMEOUT", "200"), "c")
    assert over.headers["CODE"] == "429"  # the limit itself still holds
    expired = net.tick(0.3)[b"c"]
    assert sorted(c.id for c in expired if c.headers.get("CODE") == "504") == [f"q{i}" for i in range(5)]
    assert b"c" not in net.send("c", "REQUEST", "SERVICE", "svc", "ID", "next", "TIMEOUT", "200")  # queued
    stats = json.loads(only(net.send("c", "REQUEST", "SERVICE", "mc0.broker", "ID", "s", "", "stats"), "c").payload[0])
    assert stats["queued"] == 1


def test_the_queue_of_a_service_nobody_takes_from_is_swept_of_dead_requests() -> None:
    net = Net(max_queue=10)
    net.worker("w", "svc")
    net.connect("c")
    net.send("c", "REQUEST", "SERVICE", "svc", "ID", "busy")
    for round_ in range(30):
        for i in range(10):
            net.send("c", "REQUEST", "SERVICE", "svc", "ID", f"{round_}.{i}", "TIMEOUT", "100")
        net.send("w", "NOOP")  # both stay alive
        net.tick(round_ + 0.5)
    service = net.core.services["svc"]
    assert service.queued == 0 and len(service.queue) <= 64 + 10  # bounded, not 300 dead jobs


@pytest.mark.parametrize(
    "frames",
    [
        ("PUT", "TOPIC", "x.a", "SENDER", "evil", "ID", "p6", "", "b"),  # a reserved header PUT does not take
        ("PUT", "TOPIC", "x.a", "BOGUS", "1", "ID", "p6", "", "b"),  # an unknown header
        ("PUT", "TOPIC", "x.a", "X-é", "1", "ID", "p6", "", "b"),  # a non-ASCII user header
        ("SUB", "TOPIC", "x", "ID", "p6", "", "a"),
        ("PUT", "TOPIC", "x.a", "TOPIC", "x.b", "ID", "p6", "", "b"),  # repeated
    ],
)
def test_an_error_carries_the_id_wherever_it_stands_in_the_frame(frames: tuple[str, ...]) -> None:
    core = BrokerCore()
    core.handle(b"a", f("CONNECT", "VERSION", "1.0", "TTL", "1000"), 0.0)
    ((_, answer),) = core.handle(b"a", f(*frames), 0.0)
    assert list(answer[:5]) == f("ERROR", "ID", "p6", "CODE", "400")


def test_the_shells_guard_answers_500_with_the_id_and_counts_it() -> None:
    core = BrokerCore()
    core.handle(b"a", f("CONNECT", "VERSION", "1.0", "TTL", "1000"), 0.0)
    ((rid, answer),) = core.internal_error(b"a", f("PUT", "TOPIC", "t", "ID", "7", "", "x"), ValueError("bug"))
    assert rid == b"a" and list(answer[:5]) == f("ERROR", "ID", "7", "CODE", "500")
    assert core.counters["internal_errors"] == 1


@pytest.mark.parametrize("text", ["", "²", "١٢", "9" * 19, "12a", "-1", " 1", "1" * 5000])
def test_decimal_refuses_what_int_would_choke_on(text: str) -> None:
    assert P.decimal(text) is None


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("[" * 100, 400),
        ('{"a":' + "[" * 17 + "]" * 17 + "}", 400),
        ('{"s": "' + "[" * 100 + '"}', None),  # brackets inside a string are text
        ("x" * (P.MAX_JSON_BYTES + 1), 413),
        ("{", 400),
        ('{"op": "info"}', None),
    ],
)
def test_json_bodies_are_bounded_in_size_and_depth(body: str, code: int | None) -> None:
    if code is None:
        assert isinstance(P.json_body(body, "r"), dict)
        return
    with pytest.raises(P.ProtocolError) as caught:
        P.json_body(body, "r")
    assert caught.value.code == code and caught.value.request_id == "r"
