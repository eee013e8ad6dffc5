"""The original mc0d peers (seed 004, protocol 0.1-0.3) against a real broker, with raw frames.

The five points of issue 19, each written as the original programs send it (the C++ mc0d's
load tester mc0torture, the MCollective connector): the empty envelope frame, CONNECT without
VERSION or TTL, topics that are exact strings with spaces and an X-REPLY-TO header, heartbeats
clearly under the peer's TTL, and routing ids the peers choose.  Each exchange runs in both
framings, enveloped (``"" VERB ...``) and bare (``VERB ...``), on the same topics.  One broker
serves the module; the CURVE side (a chosen routing id bound to its key, a squatter with another
key) is in tests/test_security.py and tests/test_dialects_curve.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

import mc0
from mc0.process import BrokerProcess

from .conftest import RawPeer

pytestmark = pytest.mark.timeout(60)

REPLY_TO = "mcollective reply client-0 4242"  # the connector's reply topic, in its X-REPLY-TO header
FRAMINGS = {"bare": [], "enveloped": [b""]}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    config = tmp_path_factory.mktemp("seed004") / "mc0.toml"
    config.write_text("[broker]\nmin_ttl_ms = 50\n")
    with BrokerProcess(config=str(config), insecure=True) as process:
        yield process


@pytest.fixture
def peers(broker: BrokerProcess, zctx: zmq.Context[Any]) -> Iterator[Any]:
    made: list[RawPeer] = []

    def make(routing_id: bytes | None = None) -> RawPeer:
        peer = RawPeer(broker.endpoint, zctx, routing_id)
        made.append(peer)
        return peer

    yield make
    for peer in made:
        peer.close()


def b(*parts: str | bytes) -> list[bytes]:
    return [p.encode() if isinstance(p, str) else p for p in parts]


CONNECT = b("CONNECT", "VERSION", "0.3", "TTL", "5000", "ID", "c")
CONNECTED = b("OK", "ID", "c", "TTL", "5000")

# Each exchange: a fresh peer (its routing id chosen, as both original clients do) sends each
# message and must receive exactly the listed answers, in order; an answer ending in "..." is
# compared up to that point (an ERROR's text).  The test body adds the envelope to both sides.
EXCHANGES: dict[str, list[tuple[list[bytes], list[list[bytes]]]]] = {
    "1 envelope: every answer in the peer's framing": [
        (CONNECT, [CONNECTED]),
        (b("NOOP", "ID", "n"), [b("OK", "ID", "n")]),
        (b("BOGUS", "ID", "x"), [b("ERROR", "ID", "x", "CODE", "400", "...")]),
        (b("DISCONNECT", "ID", "bye"), [b("OK", "ID", "bye")]),
        (b("NOOP", "ID", "late"), [b("ERROR", "ID", "late", "CODE", "401", "...")]),
    ],
    "2 CONNECT without VERSION or TTL (mc0torture), then its NOOP rounds": [
        (b("CONNECT", "ID", "chattyClient 7"), [b("OK", "ID", "chattyClient 7", "TTL", "5000")]),
        (b("NOOP", "ID", "chattyClient 7 0"), [b("OK", "ID", "chattyClient 7 0")]),
        (b("NOOP", "ID", "chattyClient 7 1"), [b("OK", "ID", "chattyClient 7 1")]),
    ],
    "2 CONNECT with VERSION only (the connector), and a bad version": [
        (b("CONNECT", "VERSION", "0.2", "ID", "c"), [b("OK", "ID", "c", "TTL", "5000")]),
        (b("CONNECT", "VERSION", "0.4", "ID", "v"), [b("ERROR", "ID", "v", "CODE", "505", "...")]),
    ],
    "3 topics with spaces are exact strings; X-REPLY-TO passes untouched": [
        (CONNECT, [CONNECTED]),
        (b("SUB", "ID", "s", "", "mcollective discovery"), [b("OK", "ID", "s")]),
        (
            b("PUT", "TOPIC", "mcollective discovery", "X-REPLY-TO", REPLY_TO, "ID", "p", "", "ping"),
            [b("MESSAGE", "TOPIC", "mcollective discovery", "X-REPLY-TO", REPLY_TO, "", "ping"), b("OK", "ID", "p")],
        ),
        (b("PUT", "TOPIC", "mcollective  discovery", "ID", "q", "", "x"), [b("OK", "ID", "q")]),  # 2 spaces: other
        (b("UNSUB", "ID", "u", "", "mcollective discovery"), [b("OK", "ID", "u")]),
        (b("PUT", "TOPIC", "mcollective discovery", "ID", "r", "", "x"), [b("OK", "ID", "r")]),
    ],
    "3 a 0.x SUB has no wildcards: 'a.*' is that string": [
        (CONNECT, [CONNECTED]),
        (b("SUB", "ID", "s", "", "w.*"), [b("OK", "ID", "s")]),
        (b("PUT", "TOPIC", "w.x", "ID", "p", "", "x"), [b("OK", "ID", "p")]),
        (b("PUT", "TOPIC", "w.*", "ID", "q", "", "y"), [b("MESSAGE", "TOPIC", "w.*", "", "y"), b("OK", "ID", "q")]),
        (b("PUT", "TOPIC", "", "ID", "e", "", "y"), [b("ERROR", "ID", "e", "CODE", "400", "...")]),
        (b("PUT", "TOPIC", "x" * 1025, "ID", "l", "", "y"), [b("ERROR", "ID", "l", "CODE", "413", "...")]),
    ],
    "5 a routing id the peer chose (spaces and all) is a session like any": [
        (
            b("CONNECT", "ID", "node1 4242 #<Thread:0x0 run>"),
            [b("OK", "ID", "node1 4242 #<Thread:0x0 run>", "TTL", "5000")],
        ),
        (b("SUB", "ID", "s", "", "mcollective nodes node1"), [b("OK", "ID", "s")]),
        (
            b("PUT", "TOPIC", "mcollective nodes node1", "ID", "p", "", "x"),
            [b("MESSAGE", "TOPIC", "mcollective nodes node1", "", "x"), b("OK", "ID", "p")],
        ),
    ],
    "4 the broker answers NOOP with ID, heartbeats itself, and 1.0 verbs stay out of 0.x": [
        (CONNECT, [CONNECTED]),
        (b("NOOP"), []),
        (b("PING", "ID", "p"), [b("ERROR", "ID", "p", "CODE", "400", "...")]),
    ],
}


def _matches(got: list[bytes], want: list[bytes]) -> bool:
    if want and want[-1] == b"...":
        return got[: len(want) - 1] == want[:-1]
    return got == want


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("name", EXCHANGES)
def test_each_point_in_both_framings(peers: Any, name: str, framing: str) -> None:
    prefix = FRAMINGS[framing]
    peer = peers(f"{framing} {name[:20]}".encode())  # a chosen routing id, as both original clients set (5)
    for sent, answers in EXCHANGES[name]:
        peer.send(*prefix, *sent)
        for want in answers:
            got = peer.recv_skipping_noop()
            assert _matches(got, [*prefix, *want]), (sent[:3], got, want)
    assert peer.nothing(0.1)


def test_a_session_keeps_its_framing(peers: Any) -> None:
    enveloped, bare = peers(), peers()
    enveloped.send("", *CONNECT)
    assert enveloped.recv() == [b"", *CONNECTED]
    bare.send(*CONNECT)
    assert bare.recv() == CONNECTED
    enveloped.send("NOOP", "ID", "n")  # the other framing: refused, answered in the session's own
    assert enveloped.recv()[:6] == [b"", b"ERROR", b"ID", b"n", b"CODE", b"400"]
    bare.send("", "NOOP", "ID", "n")
    assert bare.recv()[:5] == [b"ERROR", b"ID", b"n", b"CODE", b"400"]


# (publisher, topic) -> what each subscriber receives; the 0.x peers subscribe exact topics,
# the 1.0 ones wildcards.  Everyone publishes and everyone receives: both ways, both framings.
SUBSCRIPTIONS = {
    "old-enveloped": ["mcollective discovery", "mc.nodes.web1"],
    "old-bare": ["mcollective discovery", "mc.nodes.web1"],
    "new-raw": ["mc.>"],
}
DELIVERIES = [
    ("old-enveloped", "mcollective discovery", {"old-enveloped", "old-bare"}),
    ("old-bare", "mcollective discovery", {"old-enveloped", "old-bare"}),
    ("old-enveloped", "mc.nodes.web1", {"old-enveloped", "old-bare", "new-raw", "library"}),
    ("new-raw", "mc.nodes.web1", {"old-enveloped", "old-bare", "new-raw", "library"}),
    ("library", "mc.nodes.web1", {"old-enveloped", "old-bare", "new-raw", "library"}),
    ("old-bare", "mc.nodes.web2", {"new-raw", "library"}),  # 1.0 wildcards reach a 0.x topic
    ("library", "mc.nodes.web2", {"new-raw", "library"}),
]


def test_0x_and_1_0_peers_exchange_messages_both_ways(broker: BrokerProcess, peers: Any) -> None:
    raw: dict[str, RawPeer] = {}
    for name, patterns in SUBSCRIPTIONS.items():
        peer = raw[name] = peers(name.encode())
        prefix = FRAMINGS["enveloped" if name == "old-enveloped" else "bare"]
        version = "1.0" if name.startswith("new") else "0.1"
        peer.send(*prefix, "CONNECT", "VERSION", version, "TTL", "5000", "ID", "c")
        assert peer.recv()[len(prefix)] == b"OK"
        peer.send(*prefix, "SUB", "ID", "s", "", *patterns)
        assert peer.recv() == [*prefix, b"OK", b"ID", b"s"]
    with mc0.Client(broker.endpoint) as library:
        stream = library.subscribe("mc.>")
        for i, (publisher, topic, receivers) in enumerate(DELIVERIES):
            body = f"{i} from {publisher}".encode()
            if publisher == "library":
                library.publish(topic, body, headers={"X-REPLY-TO": REPLY_TO}, confirm=True)
            else:
                prefix = FRAMINGS["enveloped" if publisher == "old-enveloped" else "bare"]
                raw[publisher].send(*prefix, "PUT", "TOPIC", topic, "X-REPLY-TO", REPLY_TO, "ID", "p", "", body)
            for name, peer in raw.items():
                prefix = FRAMINGS["enveloped" if name == "old-enveloped" else "bare"]
                if name in receivers:
                    sender = [b"SENDER", b"anonymous"] if name.startswith("new") else []
                    message = [*prefix, b"MESSAGE", b"TOPIC", topic.encode(), *sender, b"X-REPLY-TO", REPLY_TO.encode()]
                    assert peer.recv_skipping_noop() == [*message, b"", body], (publisher, topic, name)
                if name == publisher:
                    assert peer.recv_skipping_noop() == [*prefix, b"OK", b"ID", b"p"]
                assert peer.nothing(0.05), (publisher, topic, name)
            if "library" in receivers:
                message = stream.next(timeout=5)
                assert (message.topic, message.body, message.headers) == (topic, body, {"X-REPLY-TO": REPLY_TO})


@pytest.mark.parametrize("framing", FRAMINGS)
def test_broker_noop_gaps_stay_under_0_95_ttl_over_several_ttls(peers: Any, framing: str) -> None:
    """The connector gives up when it has heard nothing for exactly its TTL: the broker's silence
    toward an idle peer must stay clearly under it (it beats at HEARTBEAT_FRACTION x TTL).  A TTL of a
    second keeps the margin (0.45 s) well above what a loaded 2-core box delays a loop turn by."""
    ttl = 1.0
    prefix = FRAMINGS[framing]
    peer = peers()
    peer.send(*prefix, "CONNECT", "VERSION", "0.3", "TTL", str(int(ttl * 1000)), "ID", "c")
    assert peer.recv()[len(prefix)] == b"OK"
    last_heard = time.monotonic()
    gaps: list[float] = []
    own_beat = time.monotonic()
    deadline = last_heard + 5 * ttl
    while (now := time.monotonic()) < deadline:
        if now - own_beat >= ttl / 3:  # the peer keeps its own side alive (no answer expected)
            peer.send(*prefix, "NOOP")
            own_beat = now
        if peer.socket.poll(20):
            assert peer.socket.recv_multipart() == [*prefix, b"NOOP"]
            heard = time.monotonic()
            gaps.append(heard - last_heard)
            last_heard = heard
    gaps.append(time.monotonic() - last_heard)  # the silence at the end counts too
    assert len(gaps) >= 8, gaps  # about two beats per TTL
    assert max(gaps) < 0.95 * ttl, gaps


def test_the_library_heartbeats_the_broker_under_0_95_ttl(zctx: zmq.Context[Any]) -> None:
    """The same rule on the client side: a broker that gives up at TTL (the Ruby mc0d at 1.05 x TTL)
    keeps an idle mc0 client.  A bare ROUTER plays the broker and records when it hears the client.
    (A TTL of a second: the margin to 0.95 x TTL is well above a loaded box's scheduling delays.)"""
    ttl = 1.0
    router = zctx.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    heard: list[float] = []
    stop = threading.Event()

    def broker() -> None:
        client, beat = None, 0.0
        while not stop.is_set():
            if client is not None and time.monotonic() - beat >= ttl / 3:  # keeps the client from healing
                router.send_multipart([client, b"NOOP"])
                beat = time.monotonic()
            if not router.poll(20):
                continue
            routing_id, verb, *rest = router.recv_multipart()
            heard.append(time.monotonic())
            if verb == b"CONNECT":
                client, request_id = routing_id, rest[rest.index(b"ID") + 1]
                router.send_multipart([routing_id, b"OK", b"ID", request_id, b"TTL", str(int(ttl * 1000)).encode()])

    thread = threading.Thread(target=broker)
    thread.start()
    try:
        with mc0.Client(f"tcp://127.0.0.1:{port}", ttl=ttl, timeout=5, batch=False):
            time.sleep(5 * ttl)  # the window observed
    finally:
        stop.set()
        thread.join(5)
        router.close()
    gaps = [later - earlier for earlier, later in zip(heard, heard[1:], strict=False)]
    assert len(gaps) >= 8, gaps
    assert max(gaps) < 0.95 * ttl, gaps


def test_mc0torture_rounds_with_chosen_routing_ids(peers: Any) -> None:
    """What mc0torture does, per client: CONNECT ID <identity> behind an envelope, expect
    ["", "OK", "ID", identity], then NOOP ID "<identity> <i>" rounds each answered OK with that
    id, then DISCONNECT.  Its clients set ZMQ_IDENTITY "chattyClient N"; here 20 at once."""
    clients = [(f"chattyClient {n}", peers(f"chattyClient {n}".encode())) for n in range(20)]
    for identity, socket in clients:
        socket.send("", "CONNECT", "ID", identity)
    for identity, socket in clients:
        ok = socket.recv()
        assert ok[1] == b"OK" and ok[3] == identity.encode()  # the frames mc0torture reads
    for i in range(100):
        for identity, socket in clients:
            socket.send("", "NOOP", "ID", f"{identity} {i}")
        for identity, socket in clients:
            ok = socket.recv()
            assert ok[1] == b"OK" and ok[3] == f"{identity} {i}".encode()
    for _, socket in clients:
        socket.send("", "DISCONNECT")
    for _, socket in clients:
        assert socket.nothing(0.05)
