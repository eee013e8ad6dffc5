"""Seed 000 (MDP with request ids, frame 0 MDPXC01 / MDPXW01): the core's table, then live peers
written from the seed text (raw DEALERs) against a real broker, with mc0 and MDP/0.2 peers."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import zmq

import mc0
from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.dialects import mdpx as S
from mc0.broker.dialects import recognise
from mc0.process import BrokerProcess

from .conftest import RawPeer

C, W = S.CLIENT, S.WORKER
DISC = [b"MDPW02", b"\x06"]


class Core:
    """A core and a clock; ``send`` returns what it answered as a list of (routing id, frames)."""

    def __init__(self, **settings: Any) -> None:
        self.core = BrokerCore(CoreSettings(**settings), dialects=recognise)
        self.now = 0.0

    def send(self, who: bytes, *frames: bytes) -> list[tuple[bytes, list[bytes]]]:
        return [(rid, list(fr)) for rid, fr in self.core.handle(who, list(frames), self.now)]  # type: ignore[arg-type]

    def mc0(self, who: bytes, *frames: str) -> list[tuple[bytes, list[bytes]]]:
        return self.send(who, *(x.encode() for x in frames))


def worker_request(out: list[tuple[bytes, list[bytes]]], worker: bytes) -> bytes:
    """The token of the one REQUEST ``out`` gives ``worker`` (asserting its shape)."""
    ((rid, frames),) = out
    assert rid == worker and frames[:2] == [W, S.W_REQUEST] and frames[3] == b"" and frames[2] == frames[4]
    return frames[2]


def test_requests_in_flight_each_get_partials_then_one_final_with_their_id() -> None:
    net = Core()
    assert net.send(b"w1", W, S.READY, b"echo") == []
    token_a = worker_request(net.send(b"c", C, S.REQUEST, b"echo", b"id-a", b"A"), b"w1")
    # The worker is busy (capacity 1): the second request waits in the queue, the client does not.
    assert net.send(b"c", C, S.REQUEST, b"echo", b"id-b", b"B") == []
    assert net.send(b"w1", W, S.W_PARTIAL, token_a, b"", token_a, b"a1") == [
        (b"c", [C, S.C_PARTIAL, b"echo", b"id-a", b"a1"])
    ]
    out = net.send(b"w1", W, S.W_FINAL, token_a, b"", token_a, b"a2", b"more")
    assert out[0] == (b"c", [C, S.C_FINAL, b"echo", b"id-a", b"a2", b"more"])
    token_b = worker_request(out[1:], b"w1")  # freed, it gets the queued request
    assert net.send(b"w1", W, S.W_FINAL, token_b, b"", token_b, b"b") == [
        (b"c", [C, S.C_FINAL, b"echo", b"id-b", b"b"])
    ]
    # PING -> PONG; DISCONNECT (the seed's MDPW02 header) forgets the worker.
    assert net.send(b"w1", W, S.PING) == [(b"w1", [W, S.PONG])]
    net.send(b"w1", *DISC)
    assert b"w1" not in net.core.sessions
    assert net.send(b"c", C, S.REQUEST, b"echo", b"id-c", b"C") == [
        (b"c", [C, S.C_FINAL, b"echo", b"id-c", b"ERROR", b"503", b"no worker for echo"])
    ]


def test_an_outstanding_request_id_is_refused_with_409_and_ids_are_per_client() -> None:
    net = Core()
    net.send(b"w", W, S.READY, b"svc")
    net.send(b"c1", C, S.REQUEST, b"svc", b"1", b"x")
    ((rid, frames),) = net.send(b"c1", C, S.REQUEST, b"svc", b"1", b"y")
    assert rid == b"c1" and frames[:5] == [C, S.C_FINAL, b"svc", b"1", b"ERROR"] and frames[5] == b"409"
    assert net.send(b"c2", C, S.REQUEST, b"svc", b"1", b"z") == []  # another client's "1": queued


def test_valid_but_unexpected_worker_commands_get_disconnect() -> None:
    net = Core()
    assert net.send(b"ghost", W, S.PING) == [(b"ghost", DISC)]  # PING before READY
    assert net.send(b"ghost", W, S.W_FINAL, b"t", b"", b"t", b"x") == [(b"ghost", DISC)]
    assert b"ghost" not in net.core.sessions
    net.send(b"w", W, S.READY, b"svc")
    assert net.send(b"w", W, S.READY, b"other") == [(b"w", DISC)]  # a second READY
    assert b"w" not in net.core.sessions
    assert net.send(b"w2", W, S.READY, b"mc0.broker") == [(b"w2", DISC)]  # the broker's own service
    assert net.core.counters["seed000_unexpected"] == 3


def test_mc0_and_mdp_clients_call_a_seed000_worker_and_a_seed000_client_calls_mc0_and_mdp_workers() -> None:
    net = Core()
    net.send(b"sw", W, S.READY, b"s0")
    net.mc0(b"mc", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    token = worker_request(net.mc0(b"mc", "REQUEST", "SERVICE", "s0", "ID", "r1", "", "hi"), b"sw")
    ((rid, frames),) = net.send(b"sw", W, S.W_FINAL, token, b"", token, b"HI")
    assert rid == b"mc" and frames[:1] == [b"FINAL"] and frames[-1] == b"HI"
    # An MDP/0.2 client (majortomo framing) on the same service.
    token = worker_request(net.send(b"mdpc", b"", b"MDPC02", b"\x02", b"s0", b"q"), b"sw")
    assert net.send(b"sw", W, S.W_FINAL, token, b"", token, b"Q") == [(b"mdpc", [b"", b"MDPC02", b"\x04", b"s0", b"Q"])]
    # A seed-000 client calls an mc0 worker.
    net.mc0(b"mw", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    net.mc0(b"mw", "READY", "CAPACITY", "4", "", "m0")
    ((rid, frames),) = net.send(b"sc", C, S.REQUEST, b"m0", b"u-1", b"body")
    assert rid == b"mw" and frames[0] == b"REQUEST"
    bid = frames[frames.index(b"ID") + 1].decode()
    assert net.mc0(b"mw", "FINAL", "ID", bid, "", "done") == [(b"sc", [C, S.C_FINAL, b"m0", b"u-1", b"done"])]
    # and the broker's own service answers it in its dialect.
    ((rid, frames),) = net.send(b"sc", C, S.REQUEST, b"mmi.service", b"u-2", b"s0")
    assert frames == [C, S.C_FINAL, b"mmi.service", b"u-2", b"200"]


def test_a_deadline_reaches_the_client_as_an_error_final_and_a_silent_worker_is_forgotten() -> None:
    net = Core(request_timeout_ms=1000, foreign_ttl_ms=500)
    net.send(b"w", W, S.READY, b"slow")
    net.send(b"c", C, S.REQUEST, b"slow", b"r", b"x")
    net.now = 1.01
    out = [(rid, list(fr)) for rid, fr in net.core.tick(net.now)]
    assert (b"c", [C, S.C_FINAL, b"slow", b"r", b"ERROR", b"504"]) in [(r, fr[:6]) for r, fr in out]
    net.now = 10.0
    net.core.tick(net.now)
    assert b"w" not in net.core.sessions  # no PING for liveness x TTL


# Each malformed message: what the broker does (drop: nothing; the known worker is disconnected).
MALFORMED: list[tuple[str, bytes, tuple[bytes, ...], str]] = [
    ("client no command", b"c", (C,), "drop"),
    ("client unknown command", b"c", (C, b"\x09", b"svc", b"1"), "drop"),
    ("client PARTIAL (broker's)", b"c", (C, S.C_PARTIAL, b"svc", b"1", b"x"), "drop"),
    ("client no request id", b"c", (C, S.REQUEST, b"svc"), "drop"),
    ("client empty service", b"c", (C, S.REQUEST, b"", b"1", b"x"), "drop"),
    ("client empty request id", b"c", (C, S.REQUEST, b"svc", b"", b"x"), "drop"),
    ("client non-UTF-8 service", b"c", (C, S.REQUEST, b"\xff\xfe", b"1", b"x"), "drop"),
    ("client request id too long", b"c", (C, S.REQUEST, b"svc", b"i" * 256, b"x"), "drop"),
    ("client service too long", b"c", (C, S.REQUEST, b"s" * 300, b"1", b"x"), "drop"),
    ("client bad service tokens", b"c", (C, S.REQUEST, b"a..b", b"1", b"x"), "error"),
    ("worker READY no service", b"nw", (W, S.READY), "drop"),
    ("worker READY two services", b"nw", (W, S.READY, b"a", b"b"), "drop"),
    ("worker unknown command", b"w", (W, b"\x07"), "disconnect"),
    ("worker PING with body", b"w", (W, S.PING, b"x"), "disconnect"),
    ("worker reply no delimiter", b"w", (W, S.W_FINAL, b"t", b"x", b"t"), "disconnect"),
    ("worker reply short", b"w", (W, S.W_FINAL, b"t", b""), "disconnect"),
    ("worker reply id mismatch", b"w", (W, S.W_FINAL, b"t", b"", b"u", b"x"), "disconnect"),
    ("worker MDPW02 non-DISCONNECT", b"w", (b"MDPW02", b"\x05"), "disconnect"),
    ("worker sends client REQUEST", b"w", (C, S.REQUEST, b"svc", b"1"), "drop"),
    ("client sends worker READY", b"c", (W, S.READY, b"svc"), "drop"),
    ("worker reply for unknown token", b"w", (W, S.W_FINAL, b"zz", b"", b"zz", b"x"), "drop"),
]


@pytest.mark.parametrize(("case", "who", "frames", "reaction"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_seed000_is_refused_the_seeds_way_and_everyone_is_still_answered(
    case: str, who: bytes, frames: tuple[bytes, ...], reaction: str
) -> None:
    net = Core()
    net.mc0(b"m", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    net.send(b"w", W, S.READY, b"svc")
    net.send(b"c", C, S.REQUEST, b"svc", b"0", b"first")  # the worker holds it
    out = net.send(who, *frames)  # must not raise
    if reaction == "drop":
        assert out == []
    elif reaction == "disconnect":
        assert out[0] == (b"w", DISC) and b"w" not in net.core.sessions
    else:
        ((rid, answer),) = out
        assert rid == who and answer[4:6] == [b"ERROR", b"400"]
    # Everyone is still answered: an mc0 peer, a seed-000 client, and (re)registered worker.
    assert net.mc0(b"m", "PING", "ID", "p")[0][1][0] == b"PONG"
    net.send(b"w9", W, S.READY, b"other")
    token = worker_request(net.send(b"c9", C, S.REQUEST, b"other", b"9", b"x"), b"w9")
    assert net.send(b"w9", W, S.W_FINAL, token, b"", token, b"ok") == [(b"c9", [C, S.C_FINAL, b"other", b"9", b"ok"])]


# ------------------------------------------------------------------ live: raw peers from the seed text


def _serve_seed000(endpoint: str, context: zmq.Context[Any], service: bytes, requests: int) -> None:
    """A seed-000 worker as the seed describes it: READY, then PARTIAL + FINAL per REQUEST, PING."""
    peer = RawPeer(endpoint, context)
    try:
        peer.send(W, S.READY, service)
        peer.send(W, S.PING)
        assert peer.recv() == [W, S.PONG]
        for _ in range(requests):
            frames = peer.recv(10)
            assert frames[:2] == [W, S.W_REQUEST] and frames[3] == b""
            address, request_id, body = frames[2], frames[4], frames[5:]
            peer.send(W, S.W_PARTIAL, address, b"", request_id, b"working")
            peer.send(W, S.W_FINAL, address, b"", request_id, body[0][::-1])
        peer.send(*DISC)
    finally:
        peer.close()


def _wait_served(client: mc0.Client, service: str) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # bounded: poll the broker's MMI until the worker is READY
        if client.request(P.MMI_SERVICE, service.encode(), timeout=2).body == b"200":
            return
        time.sleep(0.02)
    raise AssertionError(f"{service} never served")


def test_live_mc0_client_calls_a_raw_seed000_worker_and_a_seed000_client_calls_it_too(
    broker: BrokerProcess, zctx: zmq.Context[Any]
) -> None:
    thread = threading.Thread(target=_serve_seed000, args=(broker.endpoint, zctx, b"rev", 3), daemon=True)
    thread.start()
    with mc0.Client(broker.endpoint) as client:
        _wait_served(client, "rev")
        replies = list(client.stream("rev", b"olleh", timeout=5))
        assert [(r.body, r.final) for r in replies] == [(b"working", False), (b"hello", True)]
        # A seed-000 client: two requests in flight, each answered with its own id.
        sc = RawPeer(broker.endpoint, zctx)
        try:
            sc.send(C, S.REQUEST, b"rev", b"id-1", b"abc")
            sc.send(C, S.REQUEST, b"rev", b"id-2", b"xyz")
            got = [sc.recv() for _ in range(4)]
            finals = {fr[3]: fr[4] for fr in got if fr[1] == S.C_FINAL}
            assert finals == {b"id-1": b"cba", b"id-2": b"zyx"}
            assert sorted(fr[1] for fr in got) == [S.C_PARTIAL, S.C_PARTIAL, S.C_FINAL, S.C_FINAL]
        finally:
            sc.close()
    thread.join(5)
    assert not thread.is_alive()


def test_live_seed000_client_calls_an_mc0_worker_and_a_majortomo_worker(
    broker: BrokerProcess, zctx: zmq.Context[Any]
) -> None:
    from majortomo import Worker as MdpWorker

    def serve_mdp() -> None:
        with MdpWorker(broker.endpoint, b"mdp-upper") as worker:
            token, frames = worker.wait_for_request()
            worker.send_reply_final(token, [frames[0].upper()])

    thread = threading.Thread(target=serve_mdp, daemon=True)
    thread.start()
    worker = mc0.Worker(broker.endpoint)
    worker.service("mc0-upper")(lambda r: r.body.upper())
    sc = RawPeer(broker.endpoint, zctx)
    try:
        with worker, mc0.Client(broker.endpoint) as client:
            _wait_served(client, "mc0-upper")
            _wait_served(client, "mdp-upper")
            sc.send(C, S.REQUEST, b"mc0-upper", b"u1", b"hello")
            assert sc.recv() == [C, S.C_FINAL, b"mc0-upper", b"u1", b"HELLO"]
            sc.send(C, S.REQUEST, b"mdp-upper", b"u2", b"mdp")
            assert sc.recv() == [C, S.C_FINAL, b"mdp-upper", b"u2", b"MDP"]
            sc.send(C, S.REQUEST, b"nobody", b"u3", b"x")
            assert sc.recv() == [C, S.C_FINAL, b"nobody", b"u3", b"ERROR", b"503", b"no worker for nobody"]
            # The broker's report lists it with its dialect.
            peers = json.loads(client.request(P.BROKER_SERVICE, b'{"op":"peers"}', timeout=5).body)
            assert "seed000-client" in {p["kind"] for p in peers}
    finally:
        sc.close()
    thread.join(5)
    assert not thread.is_alive()


def test_live_unexpected_worker_command_gets_disconnect(broker: BrokerProcess, zctx: zmq.Context[Any]) -> None:
    peer = RawPeer(broker.endpoint, zctx)
    try:
        peer.send(W, S.PING)  # before READY
        assert peer.recv() == DISC
    finally:
        peer.close()
