"""Every ZeroMQ dialect's peer against a CURVE broker (the default), with real keys: CURVE comes
from socket options, so no protocol changes.  mc0 0.x enveloped (chosen routing ids, as the
original peers set them), mc0 1.0 (the library), MDP/0.2 with majortomo (given a context whose
sockets carry keys), seed 000 and DCP peers written from their seeds, eMQP with the real eventmq
(keys on the socket it exposes).  Each peer is its key's identity (SENDER, CALLER), and an
unknown key gets nothing.  One broker serves the module.  docs/SECURITY.md says which peer needs
what.  MemoDB is NNG, not ZeroMQ: see docs/SECURITY.md (loopback, or a tunnel)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

import mc0
from mc0 import keys
from mc0 import protocol as P
from mc0.broker.dialects import dcp as D
from mc0.broker.dialects import emqp as E
from mc0.broker.dialects import mdpx as S
from mc0.process import BrokerProcess

from .conftest import CurveSetup, RawPeer, require
from .test_emqp import JobManagerProcess, _job

pytestmark = pytest.mark.timeout(90)

IDENTITIES = ("alice", "bob", "carol", "dave", "erin", "frank")
DCP_HEAD = [b"", D.PROTOCOL]


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CurveSetup, BrokerProcess]]:
    setup = CurveSetup(tmp_path_factory.mktemp("curve-dialects"), identities=IDENTITIES)
    broker = setup.start()
    try:
        yield setup, broker
    finally:
        broker.__exit__(None, None, None)


@pytest.fixture(scope="module")
def echo(secure: tuple[CurveSetup, BrokerProcess]) -> Iterator[None]:
    """An mc0 1.0 worker (carol) every dialect's client calls: it answers with the caller's identity."""
    setup, broker = secure
    worker = mc0.Worker(broker.endpoint, **setup.client_options("carol"))
    worker.service("curve.echo")(lambda request: request.caller.encode() + b" said " + request.body)
    with worker:
        yield


def keyed(setup: CurveSetup, name: str, sock: zmq.Socket[Any]) -> zmq.Socket[Any]:
    """CURVE options on a socket, from ``name``'s key files: all any ZeroMQ peer needs."""
    own = keys.load_secret(setup.secret(name))
    assert own.secret is not None
    sock.curve_serverkey = keys.load_public(setup.broker_key).public
    sock.curve_publickey, sock.curve_secretkey = own.public, own.secret
    return sock


def raw(
    setup: CurveSetup, broker: BrokerProcess, zctx: zmq.Context[Any], name: str, routing_id: bytes | None = None
) -> RawPeer:
    peer = RawPeer.__new__(RawPeer)
    peer.socket = zctx.socket(zmq.DEALER)
    peer.socket.setsockopt(zmq.LINGER, 0)
    if routing_id is not None:
        peer.socket.setsockopt(zmq.ROUTING_ID, routing_id)
    keyed(setup, name, peer.socket).connect(broker.endpoint)
    return peer


class CurveContext(zmq.Context):  # type: ignore[type-arg]
    """A context whose sockets carry one identity's CURVE keys: how a library that makes its own
    sockets (majortomo takes a ``zmq_context``) gets CURVE without any change to it."""

    setup: CurveSetup | None = None  # declared here: pyzmq takes unknown attributes for socket options
    name = ""

    def __init__(self, setup: CurveSetup, name: str) -> None:
        super().__init__()
        self.setup, self.name = setup, name

    def socket(self, socket_type: int, **kwargs: Any) -> zmq.Socket[Any]:  # type: ignore[override]
        assert self.setup is not None
        return keyed(self.setup, self.name, super().socket(socket_type, **kwargs))


def test_mc0_0x_enveloped_peers_with_chosen_routing_ids_and_a_1_0_library_client(
    secure: tuple[CurveSetup, BrokerProcess], zctx: zmq.Context[Any]
) -> None:
    setup, broker = secure
    # The MCollective connector's routing id: "<identity> <pid> #<Thread...>" (spaces and all).
    old = raw(setup, broker, zctx, "alice", b"node1 4242 #<Thread:0x00007f main run>")
    bare = raw(setup, broker, zctx, "bob", b"chattyClient 3")
    try:
        old.send("", "CONNECT", "VERSION", "0.2", "TTL", "10000", "ID", "c")
        assert old.recv()[:3] == [b"", b"OK", b"ID"]
        bare.send("CONNECT", "ID", "chattyClient 3")
        assert bare.recv() == [b"OK", b"ID", b"chattyClient 3", b"TTL", b"5000"]
        for peer, prefix in ((old, [""]), (bare, [])):
            peer.send(*prefix, "SUB", "ID", "s", "", "mcollective discovery", "mc.nodes.node1")
            assert peer.recv() == [*(b"" for _ in prefix), b"OK", b"ID", b"s"]
        with mc0.Client(broker.endpoint, **setup.client_options("carol")) as library:
            stream = library.subscribe("mc.>")
            old.send("", "PUT", "TOPIC", "mcollective discovery", "X-REPLY-TO", "mcollective reply node1 4242",
                     "ID", "p", "", "ping")  # fmt: skip
            want = [b"MESSAGE", b"TOPIC", b"mcollective discovery", b"X-REPLY-TO", b"mcollective reply node1 4242"]
            assert old.recv_skipping_noop() == [b"", *want, b"", b"ping"]
            assert old.recv_skipping_noop() == [b"", b"OK", b"ID", b"p"]
            assert bare.recv_skipping_noop() == [*want, b"", b"ping"]
            library.publish("mc.nodes.node1", b"from carol", headers={"X-REPLY-TO": "mc.reply.carol"}, confirm=True)
            message = stream.next(timeout=5)
            assert (message.sender, message.body) == ("carol", b"from carol")
            expected = [b"MESSAGE", b"TOPIC", b"mc.nodes.node1", b"X-REPLY-TO", b"mc.reply.carol", b"", b"from carol"]
            assert old.recv_skipping_noop() == [b"", *expected]
            assert bare.recv_skipping_noop() == expected
            bare.send("PUT", "TOPIC", "mc.nodes.node1", "ID", "q", "", "from bob")
            assert stream.next(timeout=5).sender == "bob"  # the identity of bob's key, not his routing id
    finally:
        old.close()
        bare.close()


def test_majortomo_mdp_peers_with_keys_from_their_context(secure: tuple[CurveSetup, BrokerProcess], echo: None) -> None:
    from majortomo import Client as MdpClient
    from majortomo import Worker as MdpWorker

    setup, broker = secure
    client_context, worker_context = CurveContext(setup, "dave"), CurveContext(setup, "erin")

    def serve() -> None:
        with MdpWorker(broker.endpoint, b"curve.mdp", zmq_context=worker_context) as worker:
            client_token, frames = worker.wait_for_request()
            worker.send_reply_final(client_token, [frames[0].upper()])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with MdpClient(broker.endpoint, zmq_context=client_context) as client:
            client.send(b"curve.echo", b"hi")
            assert client.recv_all_as_list(timeout=10) == [b"curve.echo", b"dave said hi"]
        with mc0.Client(broker.endpoint, **setup.client_options("alice")) as library:
            assert _served(library, "curve.mdp")
            assert library.request("curve.mdp", b"quiet", timeout=10).body == b"QUIET"
        thread.join(10)
        assert not thread.is_alive()
    finally:
        client_context.destroy(linger=0)
        worker_context.destroy(linger=0)


def test_seed000_and_dcp_peers_written_from_their_seeds(
    secure: tuple[CurveSetup, BrokerProcess], zctx: zmq.Context[Any], echo: None
) -> None:
    setup, broker = secure
    seed_client, seed_worker = raw(setup, broker, zctx, "dave"), raw(setup, broker, zctx, "erin")
    dcp_client, dcp_worker = raw(setup, broker, zctx, "frank"), raw(setup, broker, zctx, "bob")
    stranger = raw(setup, broker, zctx, "mallory")  # a key the broker does not know
    try:
        seed_client.send(S.CLIENT, S.REQUEST, b"curve.echo", b"s-1", b"x")
        assert seed_client.recv(10) == [S.CLIENT, S.C_FINAL, b"curve.echo", b"s-1", b"dave said x"]
        dcp_client.send(*DCP_HEAD, D.REQUEST, b"curve.echo", b"", b"meta", b"", b"y")
        reply = dcp_client.recv(10)
        assert reply[:3] == [*DCP_HEAD, D.REPLY] and reply[-4:] == [b"", b"meta", b"", b"frank said y"]
        # Workers of both, called by the library (erin's and bob's identities serve them).
        seed_worker.send(S.WORKER, S.READY, b"curve.s0")
        dcp_worker.send(*DCP_HEAD, D.REGISTER, b"curve.d0")
        assert dcp_worker.recv(10) == [*DCP_HEAD, D.REGISTER, b"curve.d0"]
        with mc0.Client(broker.endpoint, **setup.client_options("alice")) as library:
            assert _served(library, "curve.s0")
            answer: list[bytes] = []
            thread = threading.Thread(
                target=lambda: answer.append(library.request("curve.s0", b"one", timeout=10).body)
            )
            thread.start()
            request = seed_worker.recv(10)
            seed_worker.send(S.WORKER, S.W_FINAL, request[2], b"", request[4], b"ONE")
            thread.join(10)
            assert answer == [b"ONE"]
            thread = threading.Thread(
                target=lambda: answer.append(library.request("curve.d0", b"two", timeout=10).body)
            )
            thread.start()
            request = dcp_worker.recv(10)
            assert request[:4] == [*DCP_HEAD, D.REQUEST, b"curve.d0"]
            dcp_worker.send(*DCP_HEAD, D.REPLY, request[4], b"", b"", b"TWO")
            thread.join(10)
            assert answer == [b"ONE", b"TWO"]
        # Its handshakes fail, so between reconnects libzmq may hold no pipe to queue on (a blocking
        # send would hang): offered, queued or not, and never answered.
        stranger.offer(S.CLIENT, S.REQUEST, b"curve.echo", b"s-2", b"x")
        stranger.offer(*DCP_HEAD, D.REQUEST, b"curve.echo", b"", b"", b"y")
        assert stranger.nothing(0.5)  # ZAP refused the key: nothing of it reached the broker
    finally:
        for peer in (seed_client, seed_worker, dcp_client, dcp_worker, stranger):
            peer.close()


def test_eventmq_client_and_jobmanager_with_keys_on_their_sockets(
    secure: tuple[CurveSetup, BrokerProcess], echo: None
) -> None:
    require("eventmq")  # installed by ./run test (--no-deps): fail with the hint, never skip
    from eventmq.client.messages import send_request  # type: ignore[import-untyped]
    from eventmq.sender import Sender  # type: ignore[import-untyped]

    setup, broker = secure
    manager = JobManagerProcess(broker.endpoint, "curve.jobs", str(setup.secret("erin")), str(setup.broker_key))
    sender = Sender()  # sets ZMQ_IDENTITY (a uuid): a chosen routing id, admitted under CURVE
    try:
        keyed(setup, "dave", sender.zsocket)
        sender.connect(broker.endpoint)
        msgid = send_request(sender, ["run", {"x": 1}], queue="curve.echo", reply_requested=True)
        assert sender.zsocket.poll(10_000), "no REPLY for eventmq's client under CURVE"
        reply = sender.zsocket.recv_multipart()
        assert reply == [b"", E.VERSION, E.REPLY, msgid.encode(), b'dave said ["run", {"x": 1}]']

        def kinds(library: mc0.Client) -> set[tuple[str, str]]:
            peers = json.loads(library.request(P.BROKER_SERVICE, b'{"op":"peers"}', timeout=5).body)
            return {(p["kind"], p["identity"]) for p in peers}

        with mc0.Client(broker.endpoint, **setup.client_options("alice")) as library:
            # Asked at once: eventmq's client never heartbeats, so its session ends foreign_ttl_ms after its
            # last word, and the job manager (a process of its own) may take longer than that to come up.
            assert ("emqp-client", "dave") in kinds(library)
            assert _served(library, "curve.jobs", 30)
            assert json.loads(library.request("curve.jobs", _job("add", 2, 3), timeout=20).body) == {"value": 5}
            assert ("emqp-worker", "erin") in kinds(library)
    finally:
        sender.zsocket.close(linger=0)
        manager.close()


def _served(client: mc0.Client, service: str, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # bounded: poll MMI until the worker's READY arrived
        if client.request(P.MMI_SERVICE, service.encode(), timeout=2).body == b"200":
            return True
        time.sleep(0.05)
    return False
