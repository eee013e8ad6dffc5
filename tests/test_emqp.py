"""eMQP/1.0 (seed 002, EventMQ): the core's table, a malformed table, then live peers: eventmq's
own JobManager and client (the real package) and peers written from the seed text (raw DEALERs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

import mc0
from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.dialects import emqp as E
from mc0.broker.dialects import mdpx as S
from mc0.broker.dialects import recognise
from mc0.process import BrokerProcess

from .conftest import RawPeer, require

V = E.VERSION
RR = b"reply-requested"  # the header that asks for the REPLY


class Core:
    def __init__(self, **settings: Any) -> None:
        self.core = BrokerCore(CoreSettings(**settings), dialects=recognise)
        self.now = 0.0

    def send(self, who: bytes, *frames: bytes) -> list[tuple[bytes, list[bytes]]]:
        return [(rid, list(fr)) for rid, fr in self.core.handle(who, list(frames), self.now)]  # type: ignore[arg-type]

    def emqp(self, who: bytes, command: bytes, msgid: bytes, *rest: bytes) -> list[tuple[bytes, list[bytes]]]:
        return self.send(who, b"", V, command, msgid, *rest)

    def mc0(self, who: bytes, *frames: str) -> list[tuple[bytes, list[bytes]]]:
        return self.send(who, *(x.encode() for x in frames))

    def worker(self, who: bytes, queues: bytes, readies: int = 1) -> None:
        ((rid, ack),) = self.emqp(who, E.INFORM, b"i-" + who, queues)
        assert rid == who and ack[:3] == [b"", V, E.ACK] and ack[4:] == [b"i-" + who]
        for n in range(readies):
            self.emqp(who, E.READY, b"r%d" % n)


def request_for(out: list[tuple[bytes, list[bytes]]], worker: bytes, queue: bytes, message: bytes) -> bytes:
    ((rid, frames),) = out
    assert rid == worker and frames[:3] == [b"", V, E.REQUEST] and frames[4] == queue and frames[6] == message
    assert frames[5].split(b",")[0] == b"reply-requested" and frames[5].split(b",")[1].startswith(b"timeout:")
    return frames[3]


def test_inform_ready_request_reply_in_the_seeds_form_and_eventmqs() -> None:
    net = Core()
    net.worker(b"w", b"jobs,other")  # the seed: csv queue names
    token = request_for(net.emqp(b"c", E.REQUEST, b"m1", b"jobs", RR, b"work"), b"w", b"jobs", b"work")
    # Its one READY is used: the next request waits for the next READY.
    assert net.emqp(b"c", E.REQUEST, b"m2", b"other", RR, b"more") == []
    # The seed's REPLY: msgid is the request's.
    out = net.emqp(b"w", E.REPLY, token, b"done")
    assert out == [(b"c", [b"", V, E.REPLY, b"m1", b"done"])]
    token = request_for(net.emqp(b"w", E.READY, b"r9"), b"w", b"other", b"more")
    # eventmq's REPLY: its own msgid, the reply, the request's msgid.
    assert net.emqp(b"w", E.REPLY, b"own-id", b"DONE", token) == [(b"c", [b"", V, E.REPLY, b"m2", b"DONE"])]
    # eventmq's INFORM (JSON [[weight, name]], type) and KBYE.
    net.worker(b"jm", b'[[10, "jm-q"], [5, "jobs"]]')
    assert net.core.report("services")["jm-q"]["workers"] == 1  # type: ignore[index]
    net.emqp(b"jm", E.KBYE, b"k")
    assert b"jm" not in net.core.sessions
    # HEARTBEAT is silent; an unknown queue is a 503 REPLY.
    assert net.emqp(b"w", E.HEARTBEAT, b"h", b"1700000000") == []
    assert net.emqp(b"c", E.REQUEST, b"m3", b"nobody", RR, b"x") == [
        (b"c", [b"", V, E.REPLY, b"m3", b"ERROR", b"503", b"no worker for nobody"])
    ]


def test_ready_is_credit_so_a_worker_gets_as_many_jobs_as_it_said_ready() -> None:
    net = Core()
    net.worker(b"w", b"q", readies=2)
    tokens = [request_for(net.emqp(b"c", E.REQUEST, b"m%d" % i, b"q", RR, b"x"), b"w", b"q", b"x") for i in range(2)]
    assert net.emqp(b"c", E.REQUEST, b"m2", b"q", RR, b"x") == []  # no third READY
    net.emqp(b"w", E.REPLY, tokens[0], b"a")
    assert net.core.report("services")["q"]["queued"] == 1  # type: ignore[index]
    request_for(net.emqp(b"w", E.READY, b"r"), b"w", b"q", b"x")


def test_timeout_header_sets_the_deadline_and_heartbeats_go_to_workers_only() -> None:
    net = Core(foreign_ttl_ms=1000)
    net.worker(b"w", b"q")
    net.emqp(b"c", E.REQUEST, b"m", b"q", b"reply-requested,timeout:2", b"x")
    net.now = 1.5
    beats = [(rid, fr[2]) for rid, fr in net.core.tick(net.now)]
    assert beats == [(b"w", E.HEARTBEAT)]
    net.emqp(b"w", E.HEARTBEAT, b"h")
    net.now = 2.01
    out = [(rid, list(fr)) for rid, fr in net.core.tick(net.now)]
    assert (b"c", [b"", V, E.REPLY, b"m", b"ERROR", b"504"]) in [(r, fr[:6]) for r, fr in out]


def test_cross_dialect_an_emqp_client_calls_mc0_and_seed000_workers_and_an_mc0_client_an_emqp_worker() -> None:
    net = Core()
    net.mc0(b"mw", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    net.mc0(b"mw", "READY", "CAPACITY", "2", "", "m0")
    ((rid, frames),) = net.emqp(b"c", E.REQUEST, b"e1", b"m0", RR, b"to mc0")
    assert rid == b"mw" and frames[-1] == b"to mc0"
    bid = frames[frames.index(b"ID") + 1].decode()
    assert net.mc0(b"mw", "PARTIAL", "ID", bid, "", "p") == []  # no partials in eMQP: not forwarded
    assert net.core.counters["partials_unsent"] == 1
    ((rid, frames),) = net.mc0(b"mw", "FINAL", "ID", bid, "", "fine")
    assert (rid, frames) == (b"c", [b"", V, E.REPLY, b"e1", b"fine"])
    net.send(b"sw", S.WORKER, S.READY, b"s0")
    ((rid, frames),) = net.emqp(b"c", E.REQUEST, b"e2", b"s0", RR, b"to seed000")
    assert rid == b"sw"
    assert net.send(b"sw", S.WORKER, S.W_FINAL, frames[2], b"", frames[2], b"ok") == [
        (b"c", [b"", V, E.REPLY, b"e2", b"ok"])
    ]
    net.worker(b"ew", b"eq")
    net.mc0(b"mc", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    token = request_for(net.mc0(b"mc", "REQUEST", "SERVICE", "eq", "ID", "r", "", "hi"), b"ew", b"eq", b"hi")
    ((rid, frames),) = net.emqp(b"ew", E.REPLY, token, b"HI")
    assert rid == b"mc" and frames[0] == b"FINAL" and frames[-1] == b"HI"


MALFORMED: list[tuple[str, bytes, tuple[bytes, ...]]] = [
    ("no msgid", b"c", (b"", V, E.REQUEST)),
    ("empty msgid", b"c", (b"", V, E.REQUEST, b"", b"q", RR, b"x")),
    ("msgid too long", b"c", (b"", V, E.REQUEST, b"m" * 256, b"q", b"", b"x")),
    ("msgid not UTF-8", b"c", (b"", V, E.REQUEST, b"\xff", b"q", RR, b"x")),
    ("REQUEST short", b"c", (b"", V, E.REQUEST, b"m", b"q", RR)),
    ("REQUEST long", b"c", (b"", V, E.REQUEST, b"m", b"q", RR, b"x", b"y")),
    ("REQUEST empty queue", b"c", (b"", V, E.REQUEST, b"m", b"", RR, b"x")),
    ("REQUEST bad timeout", b"c", (b"", V, E.REQUEST, b"m", b"q", b"timeout:soon", b"x")),
    ("REQUEST huge timeout", b"c", (b"", V, E.REQUEST, b"m", b"q", b"timeout:" + b"9" * 50, b"x")),
    ("unknown command", b"c", (b"", V, b"SCHEDULE", b"m", b"x")),
    ("lower-case command", b"c", (b"", V, b"request", b"m", b"q", b"", b"x")),
    ("INFORM no queues frame", b"n", (b"", V, E.INFORM, b"m")),
    ("INFORM scheduler type", b"n", (b"", V, E.INFORM, b"m", b"q", b"scheduler")),
    ("INFORM empty csv name", b"n", (b"", V, E.INFORM, b"m", b"a,,b")),
    ("INFORM bad JSON", b"n", (b"", V, E.INFORM, b"m", b"[[10, ")),
    ("INFORM deep JSON", b"n", (b"", V, E.INFORM, b"m", b"[" * 5000)),
    ("INFORM JSON not names", b"n", (b"", V, E.INFORM, b"m", b'[{"a": 1}]')),
    ("READY before INFORM", b"n", (b"", V, E.READY, b"m")),
    ("REPLY before INFORM", b"n", (b"", V, E.REPLY, b"m", b"x")),
    ("READY with a body", b"w", (b"", V, E.READY, b"m", b"x")),
    ("REPLY too long", b"w", (b"", V, E.REPLY, b"m", b"x", b"y", b"z")),
    ("HEARTBEAT too long", b"w", (b"", V, E.HEARTBEAT, b"m", b"1", b"2")),
    ("REPLY for nothing held", b"w", (b"", V, E.REPLY, b"nothing", b"x")),
]


@pytest.mark.parametrize(("case", "who", "frames"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_emqp_is_dropped_as_eventmqs_router_does_and_everyone_is_still_answered(
    case: str, who: bytes, frames: tuple[bytes, ...]
) -> None:
    net = Core()
    net.mc0(b"m", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    net.worker(b"w", b"q", readies=3)  # one held, one a stray REPLY may use up, one left
    request_for(net.emqp(b"c0", E.REQUEST, b"held", b"q", RR, b"x"), b"w", b"q", b"x")
    out = net.send(who, *frames)  # must not raise
    assert [rid for rid, fr in out if fr[2:3] != [E.HEARTBEAT]] == []
    assert net.mc0(b"m", "PING", "ID", "p")[0][1][0] == b"PONG"
    token = request_for(net.emqp(b"c9", E.REQUEST, b"m9", b"q", RR, b"y"), b"w", b"q", b"y")
    assert net.emqp(b"w", E.REPLY, token, b"ok") == [(b"c9", [b"", V, E.REPLY, b"m9", b"ok"])]


# ------------------------------------------------------------------ live


JOBMANAGER = Path(__file__).with_name("emqp_jobmanager.py")


class JobManagerProcess:
    """eventmq's JobManager in its own process group (it forks worker processes)."""

    def __init__(self, endpoint: str, queue: str, *keys: str) -> None:
        """``keys``: its secret key file and the broker's public key file, for a CURVE broker."""
        self.proc = subprocess.Popen(
            [sys.executable, str(JOBMANAGER), endpoint, queue, *keys],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def close(self) -> str:
        """SIGTERM (eventmq's graceful stop: KBYE), then SIGKILL the group if it lingers; its stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            _, err = self.proc.communicate(timeout=5)
        return err.decode(errors="replace")


def _wait_served(client: mc0.Client, service: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # bounded: poll the broker's MMI until the worker is READY
        if client.request(P.MMI_SERVICE, service.encode(), timeout=2).body == b"200":
            return
        time.sleep(0.05)
    raise AssertionError(f"{service} never served")


def _job(callable_: str, *args: object) -> bytes:
    return json.dumps(["run", {"path": "operator", "callable": callable_, "args": list(args)}]).encode()


def test_live_eventmq_jobmanager_serves_mc0_eventmq_and_seed000_clients(
    broker: BrokerProcess, zctx: zmq.Context[Any]
) -> None:
    require("eventmq")  # installed by ./run test (--no-deps): fail with the hint, never skip
    from eventmq.client.messages import send_request  # type: ignore[import-untyped]
    from eventmq.sender import Sender  # type: ignore[import-untyped]

    manager = JobManagerProcess(broker.endpoint, "emq-jobs")
    sender = Sender()
    seed_client = RawPeer(broker.endpoint, zctx)
    try:
        with mc0.Client(broker.endpoint) as client:
            _wait_served(client, "emq-jobs")
            # An mc0 client calls eventmq's JobManager (it runs operator.add in its worker process).
            assert json.loads(client.request("emq-jobs", _job("add", 2, 3), timeout=20).body) == {"value": 5}
            # eventmq's own client: send_request on its Sender; the REPLY carries its msgid.
            sender.connect(broker.endpoint)
            job = ["run", {"path": "operator", "callable": "mul", "args": [6, 7]}]
            msgid = send_request(sender, job, queue="emq-jobs", reply_requested=True)
            assert sender.zsocket.poll(20_000), "no REPLY for eventmq's client"
            reply = sender.zsocket.recv_multipart()
            assert reply[:4] == [b"", V, E.REPLY, msgid.encode()] and json.loads(reply[4]) == {"value": 42}
            # A seed-000 client calls it too (cross-dialect).
            seed_client.send(S.CLIENT, S.REQUEST, b"emq-jobs", b"s-1", _job("neg", 5))
            answer = seed_client.recv(20)
            assert answer[:4] == [S.CLIENT, S.C_FINAL, b"emq-jobs", b"s-1"] and json.loads(answer[4]) == {"value": -5}
            peers = json.loads(client.request(P.BROKER_SERVICE, b'{"op":"peers"}', timeout=5).body)
            assert {"emqp-worker", "emqp-client", "seed000-client"} <= {p["kind"] for p in peers}
    finally:
        seed_client.close()
        sender.zsocket.close(linger=0)
        manager.close()


def test_live_eventmq_client_calls_an_mc0_worker_and_a_seed_written_emqp_worker(
    broker: BrokerProcess, zctx: zmq.Context[Any]
) -> None:
    from eventmq.client.messages import send_request
    from eventmq.sender import Sender

    def seed_worker() -> None:
        """An eMQP worker written from the seed text: INFORM (csv), READY, REPLY (msgid of the request)."""
        peer = RawPeer(broker.endpoint, zctx)
        try:
            peer.send(b"", V, E.INFORM, b"w-1", b"seed-q")
            assert peer.recv()[2] == E.ACK
            peer.send(b"", V, E.READY, b"w-2")
            while True:  # bounded by recv's timeout: one REQUEST, skipping heartbeats
                frames = peer.recv(10)
                if frames[2] == E.REQUEST:
                    break
            peer.send(b"", V, E.REPLY, frames[3], frames[6].upper())
            peer.send(b"", V, E.DISCONNECT, b"w-3")
        finally:
            peer.close()

    thread = threading.Thread(target=seed_worker, daemon=True)
    thread.start()
    worker = mc0.Worker(broker.endpoint)
    worker.service("mc0-echo")(lambda r: b"mc0 got " + r.body)
    sender = Sender()
    try:
        with worker, mc0.Client(broker.endpoint) as client:
            _wait_served(client, "mc0-echo")
            _wait_served(client, "seed-q")
            sender.connect(broker.endpoint)
            msgid = send_request(sender, ["run", {"x": 1}], queue="mc0-echo", timeout=5, reply_requested=True)
            assert sender.zsocket.poll(10_000)
            reply = sender.zsocket.recv_multipart()
            assert reply[:4] == [b"", V, E.REPLY, msgid.encode()]
            assert json.loads(reply[4].removeprefix(b"mc0 got ")) == ["run", {"x": 1}]
            msgid = send_request(sender, "hello", queue="seed-q", reply_requested=True)
            assert sender.zsocket.poll(10_000)
            assert sender.zsocket.recv_multipart() == [b"", V, E.REPLY, msgid.encode(), b'"HELLO"']
            # Without reply-requested (eventmq's default) the job runs and no REPLY comes.
            send_request(sender, ["run", {"x": 2}], queue="mc0-echo", guarantee=True)
            assert client.request(P.MMI_SERVICE, b"mc0-echo", timeout=5).body == b"200"  # a round trip later
            assert not sender.zsocket.poll(500)
    finally:
        sender.zsocket.close(linger=0)
    thread.join(10)
    assert not thread.is_alive()


def test_a_queue_serves_its_clients_round_robin_so_a_busy_client_cannot_starve_another() -> None:
    net = Core()
    net.worker(b"w", b"q")
    tokens = [request_for(net.emqp(b"busy", E.REQUEST, b"b0", b"q", RR, b"b0"), b"w", b"q", b"b0")]
    for i in range(1, 6):
        assert net.emqp(b"busy", E.REQUEST, b"b%d" % i, b"q", RR, b"b%d" % i) == []
    # mc0 and eMQP clients alike wait in the same queue, each its turn.
    net.mc0(b"m", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    net.mc0(b"m", "REQUEST", "SERVICE", "q", "ID", "m0", "", "m0")
    net.emqp(b"calm", E.REQUEST, b"c0", b"q", RR, b"c0")
    served = []
    for _ in range(7):  # bounded: 7 requests are waiting
        out = net.emqp(b"w", E.REPLY, tokens[-1], b"ok")
        net_out = net.emqp(b"w", E.READY, b"r")
        ((_, frames),) = [(r, f) for r, f in out + net_out if r == b"w"]
        served.append(frames[6])
        tokens.append(frames[3])
    assert served == [b"b1", b"m0", b"c0", b"b2", b"b3", b"b4", b"b5"]  # not b1..b5 first
