"""CURVE, ZAP, identities, revocation and permissions against a real broker with real keys."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

import mc0
from mc0 import keys
from mc0.process import BrokerProcess
from mc0.security import AllowedKeys, ZapHandler, configure_server

from .conftest import CurveSetup, RawPeer, headers_of, payload_of


def curve_peer(endpoint: str, context: zmq.Context[Any], secret: Path | None, server_key: bytes | None,
               routing_id: bytes | None = None) -> RawPeer:  # fmt: skip
    """A raw DEALER with CURVE keys (or NULL when secret is None)."""
    peer = RawPeer.__new__(RawPeer)
    peer.socket = context.socket(zmq.DEALER)
    peer.socket.setsockopt(zmq.LINGER, 0)
    if routing_id is not None:
        peer.socket.setsockopt(zmq.ROUTING_ID, routing_id)
    if secret is not None:
        pair = keys.load_secret(secret)
        assert pair.secret is not None and server_key is not None
        peer.socket.curve_serverkey = server_key
        peer.socket.curve_publickey = pair.public
        peer.socket.curve_secretkey = pair.secret
    peer.socket.connect(endpoint)
    return peer


def test_allowed_keys_get_their_identity_as_sender_and_caller(curve: tuple[CurveSetup, BrokerProcess]) -> None:
    setup, broker = curve
    worker = mc0.Worker(broker.endpoint, **setup.client_options("carol"))
    worker.service("whoami")(lambda request: request.caller.encode())
    with (
        mc0.Client(broker.endpoint, **setup.client_options("alice")) as alice,
        mc0.Client(broker.endpoint, **setup.client_options("bob")) as bob,
        worker,
    ):
        stream = alice.subscribe("news")
        bob.publish("news", b"hi", confirm=True)
        assert stream.next(timeout=5).sender == "bob"
        assert alice.request("whoami", timeout=5).body == b"alice"
        assert bob.request("whoami", timeout=5).body == b"bob"
        assert (alice.identity, bob.identity) == ("alice", "bob")


@pytest.mark.parametrize("who", ["unknown key", "no key (NULL)", "wrong broker key"])
def test_refused_clients_raise_auth_failed_within_two_seconds(
    curve: tuple[CurveSetup, BrokerProcess], who: str
) -> None:
    setup, broker = curve
    options = {
        "unknown key": setup.client_options("mallory"),
        "no key (NULL)": {},
        "wrong broker key": {"key": str(setup.secret("alice")), "broker_key": str(setup.keys_dir / "bob.key")},
    }[who]
    started = time.monotonic()
    with pytest.raises(mc0.AuthFailed):
        mc0.Client(broker.endpoint, timeout=10, **options).connect()
    assert time.monotonic() - started < 2.0


def test_refused_peers_deliver_nothing_and_the_broker_carries_on(
    curve: tuple[CurveSetup, BrokerProcess], zctx: zmq.Context[Any]
) -> None:
    setup, broker = curve
    with mc0.Client(broker.endpoint, **setup.client_options("alice")) as alice:
        everything = alice.subscribe(">")
        server_key = setup.broker_key.read_text().split('public-key = "')[1][:40].encode()
        intruders = [
            curve_peer(broker.endpoint, zctx, setup.secret("mallory"), server_key),  # unknown key
            curve_peer(broker.endpoint, zctx, None, None),  # NULL
            curve_peer(
                broker.endpoint, zctx, setup.secret("alice"), keys.load_public(setup.keys_dir / "bob.key").public
            ),
        ]
        for peer in intruders:
            peer.send("CONNECT", "VERSION", "1.0", "TTL", "1000")
            peer.send("PUT", "TOPIC", "breach", "", "x")
        host, port = broker.endpoint.rsplit("//", 1)[1].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=2) as raw_tcp:  # not even ZMTP
            # libzmq may cut this peer off at any point: being reset is the expected outcome.
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                raw_tcp.sendall(b"PUT TOPIC breach\r\n\r\n" + b"\xff" * 4096)
                raw_tcp.sendall(b"\xff" + b"\x00" * 8 + b"\x7f\x03\x00" + b"NULL" + b"\x00" * 16 + b"\x00" * 31)
        with pytest.raises(mc0.Timeout):
            everything.next(timeout=1.0)
        for peer in intruders:
            assert peer.nothing(0.1)
            peer.close()
        alice.publish("after", b"still serving", confirm=True)
        assert everything.next(timeout=5).topic == "after"


def test_without_a_running_authenticator_nobody_is_admitted(tmp_path: Path) -> None:
    """ZAP_ENFORCE_DOMAIN: a CURVE server whose ZAP handler is not running admits no key at all."""
    broker_pub, broker_secret = keys.create(tmp_path, "server")
    _, alice_secret = keys.create(tmp_path, "alice")
    context: zmq.Context[Any] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    try:
        configure_server(router, keys.load_secret(broker_secret))
        port = router.bind_to_random_port("tcp://127.0.0.1")
        client = mc0.Client(f"tcp://127.0.0.1:{port}", timeout=5, key=alice_secret, broker_key=broker_pub)
        with pytest.raises(mc0.AuthFailed):
            client.connect()
        assert not router.poll(200)
    finally:
        router.close(linger=0)
        context.term()


class FlakyKeys(AllowedKeys):
    """A key store whose lookup raises for one key (a broken database, say)."""

    poison: bytes = b""

    def identity(self, public_z85: bytes) -> str | None:
        if public_z85 == self.poison:
            raise RuntimeError("key store exploded")
        return super().identity(public_z85)


def test_an_exception_in_the_key_lookup_does_not_stop_later_clients(tmp_path: Path) -> None:
    broker_pub, broker_secret = keys.create(tmp_path, "server")
    allowed = tmp_path / "allowed"
    for name in ("poison", "alice"):
        _, _ = keys.create(tmp_path, name)
        allowed.mkdir(exist_ok=True)
        (allowed / f"{name}.key").write_bytes((tmp_path / f"{name}.key").read_bytes())
    store = FlakyKeys(allowed)
    store.load()
    store.poison = keys.load_public(tmp_path / "poison.key").public
    context: zmq.Context[Any] = zmq.Context()
    zap = ZapHandler(context, store)
    zap.start()
    router = context.socket(zmq.ROUTER)
    configure_server(router, keys.load_secret(broker_secret))
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def serve_zap() -> None:  # the broker's loop does this; here a bounded thread
        while not stop.is_set():
            if zap.zap_socket is not None and zap.zap_socket.poll(50):
                zap.handle()

    thread = threading.Thread(target=serve_zap)
    thread.start()
    try:
        endpoint = f"tcp://127.0.0.1:{port}"
        with pytest.raises(mc0.AuthFailed):
            mc0.Client(endpoint, timeout=5, key=tmp_path / "poison.key_secret", broker_key=broker_pub).connect()
        assert zap.failures >= 1
        good = context.socket(zmq.DEALER)
        alice = keys.load_secret(tmp_path / "alice.key_secret")
        assert alice.secret is not None
        good.curve_serverkey, good.curve_publickey, good.curve_secretkey = (
            keys.load_public(broker_pub).public,
            alice.public,
            alice.secret,
        )
        good.connect(endpoint)
        good.send(b"hello")
        assert router.poll(5000), "a valid client was not admitted after the failure"
        frames = router.recv_multipart(copy=False)
        assert frames[0].get("User-Id") == "alice" and frames[1].bytes == b"hello"
        good.close(linger=0)
    finally:
        stop.set()
        thread.join(5)
        router.close(linger=0)
        zap.stop()
        context.term()


def test_under_curve_a_chosen_routing_id_is_admitted_and_a_squatter_with_another_key_gets_nothing(
    curve: tuple[CurveSetup, BrokerProcess], zctx: zmq.Context[Any]
) -> None:
    """mc0torture and the MCollective connector set ZMQ_IDENTITY: admitted under CURVE, the session
    bound to (routing id, key, connection).  A second connection presenting the same routing id with
    another key gets none of the first one's traffic and does not knock it off (libzmq 4.3.5, with
    ROUTER_HANDOVER off, never reads a connection whose routing id is in use); once the first has
    gone, the newcomer holds the name with nothing of the first's session."""
    setup, broker = curve
    server_key = keys.load_public(setup.broker_key).public
    name = b"chattyClient 0"
    first = curve_peer(broker.endpoint, zctx, setup.secret("alice"), server_key, routing_id=name)
    first.send("", "CONNECT", "ID", name)
    assert first.recv() == [b"", b"OK", b"ID", name, b"TTL", b"5000"]
    first.send("", "SUB", "ID", "s", "", "mcollective discovery")
    assert first.recv() == [b"", b"OK", b"ID", b"s"]
    squatter = curve_peer(broker.endpoint, zctx, setup.secret("bob"), server_key, routing_id=name)
    squatter.send("", "CONNECT", "ID", "c2")
    squatter.send("", "UNSUB", "", "mcollective discovery")  # would end the first's subscription, were it read
    publisher = curve_peer(broker.endpoint, zctx, setup.secret("carol"), server_key)
    publisher.send("", "CONNECT", "VERSION", "0.3", "TTL", "5000", "ID", "p")
    assert publisher.recv()[:2] == [b"", b"OK"]
    publisher.send("", "PUT", "TOPIC", "mcollective discovery", "X-REPLY-TO", "mcollective reply carol 1", "ID", "1",
                   "", "ping")  # fmt: skip
    assert publisher.recv() == [b"", b"OK", b"ID", b"1"]
    assert first.recv_skipping_noop() == [b"", b"MESSAGE", b"TOPIC", b"mcollective discovery",
                                          b"X-REPLY-TO", b"mcollective reply carol 1", b"", b"ping"]  # fmt: skip
    assert squatter.nothing(0.5)  # not even an answer to its CONNECT
    first.send("", "NOOP", "ID", "alive")
    assert first.recv_skipping_noop() == [b"", b"OK", b"ID", b"alive"]  # unaffected
    squatter.close()
    # The first goes; a newcomer with bob's key takes the name and finds no session of alice's.
    first.close()
    time.sleep(0.3)
    newcomer = curve_peer(broker.endpoint, zctx, setup.secret("bob"), server_key, routing_id=name)
    newcomer.send("", "NOOP", "ID", "n")
    reply = newcomer.recv_skipping_noop()
    assert reply[:2] == [b"", b"ERROR"] and headers_of(reply[1:])["CODE"] == "401"
    publisher.send("", "PUT", "TOPIC", "mcollective discovery", "ID", "2", "", "again")
    assert publisher.recv() == [b"", b"OK", b"ID", b"2"]
    assert newcomer.nothing(0.5)
    for peer in (newcomer, publisher):
        peer.close()


def test_routing_id_squatting_gets_none_of_the_victims_traffic(
    curve: tuple[CurveSetup, BrokerProcess], zctx: zmq.Context[Any]
) -> None:
    """A squatter that guessed the victim's (libzmq-shaped) routing id still gets nothing of it."""
    setup, broker = curve
    server_key = keys.load_public(setup.broker_key).public
    guessed = b"\x00vict"
    victim = curve_peer(broker.endpoint, zctx, setup.secret("alice"), server_key, routing_id=guessed)
    assert victim.connect()[0] == b"OK"
    victim.send("SUB", "ID", "s", "", "secret.>")
    assert victim.recv() == [b"OK", b"ID", b"s"]
    squatter = curve_peer(broker.endpoint, zctx, setup.secret("bob"), server_key, routing_id=guessed)
    squatter.send("CONNECT", "VERSION", "1.0", "TTL", "1000", "ID", "c")
    squatter.send("UNSUB", "ID", "u", "", "secret.>")
    with mc0.Client(broker.endpoint, **setup.client_options("carol")) as carol:
        carol.publish("secret.plans", b"for alice only", confirm=True)
    assert payload_of(victim.recv_skipping_noop()) == [b"for alice only"]  # her subscription survived
    assert squatter.nothing(0.5)
    # The victim goes away without a word; the squatter takes the routing id over.
    victim.close()
    time.sleep(0.3)
    squatter2 = curve_peer(broker.endpoint, zctx, setup.secret("bob"), server_key, routing_id=guessed)
    squatter2.send("NOOP", "ID", "n")
    reply = squatter2.recv_skipping_noop()
    assert reply[0] == b"ERROR" and headers_of(reply)["CODE"] == "401"
    with mc0.Client(broker.endpoint, **setup.client_options("carol")) as carol:
        carol.publish("secret.plans", b"still not yours", confirm=True)
    assert squatter2.nothing(0.5)
    squatter.close()
    squatter2.close()


def test_revocation_mid_session_stops_delivery_and_refuses_reconnects(curve: tuple[CurveSetup, BrokerProcess]) -> None:
    setup, broker = curve
    with (
        mc0.Client(broker.endpoint, **setup.client_options("alice")) as alice,
        mc0.Client(broker.endpoint, **setup.client_options("bob")) as bob,
    ):
        stream = bob.subscribe("feed")
        alice.publish("feed", b"before", confirm=True)
        assert stream.next(timeout=5).body == b"before"
        revoked = setup.root / "keys" / "revoked"
        revoked.mkdir()
        (setup.allowed_dir / "bob.key").rename(revoked / "bob.key")  # what `mc0 keys revoke bob` does
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not any(isinstance(f, mc0.NotConnected) for f in bob.faults):
            time.sleep(0.05)
        assert any(isinstance(f, mc0.NotConnected) and "revoked" in f.reason for f in bob.faults)
        for i in range(5):
            alice.publish("feed", f"after {i}".encode(), confirm=True)
        with pytest.raises((mc0.Timeout, mc0.ClosedError)):
            stream.next(timeout=1.0)
        started = time.monotonic()
        with pytest.raises(mc0.AuthFailed):
            mc0.Client(broker.endpoint, timeout=5, **setup.client_options("bob")).connect()
        assert time.monotonic() - started < 2.0


def test_a_connection_made_before_its_key_was_revoked_is_told_key_revoked_at_its_next_connect(
    tmp_path: Path, zctx: zmq.Context[Any]
) -> None:
    """libzmq checks a key at the handshake only: a connection made before ``mc0 keys revoke`` stays
    open.  Its session is told 401 and forgotten; a CONNECT it sends after is answered 401 "key revoked"
    (it was dropped unanswered: the client waited out its timeout, naming no reason)."""
    setup = CurveSetup(tmp_path)
    broker = setup.start()
    try:
        server_key = keys.load_public(setup.broker_key).public
        bob = curve_peer(broker.endpoint, zctx, setup.secret("bob"), server_key)
        bob.send("CONNECT", "VERSION", "1.0", "TTL", "5000", "ID", "c1")
        assert bob.recv(timeout=10)[:3] == [b"OK", b"ID", b"c1"]
        revoked = setup.keys_dir / "revoked"
        revoked.mkdir()
        (setup.allowed_dir / "bob.key").rename(revoked / "bob.key")  # what `mc0 keys revoke bob` does
        # (the broker re-reads the folder every reload_ms, 100: 30 s is a hang guard for a loaded box)
        assert bob.recv_skipping_noop(timeout=30) == [b"ERROR", b"CODE", b"401", b"MESSAGE", b"key revoked"]
        bob.send("CONNECT", "VERSION", "1.0", "TTL", "5000", "ID", "c2")  # on the same connection
        assert bob.recv_skipping_noop(timeout=10) == [
            b"ERROR",
            b"ID",
            b"c2",
            b"CODE",
            b"401",
            b"MESSAGE",
            b"key revoked",
        ]
        bob.send("PUT", "TOPIC", "feed", "ID", "p", "", "x")  # anything else it sends: dropped, unanswered
        assert bob.nothing(0.5)
        bob.close()
    finally:
        broker.stop()


def _refused(broker: BrokerProcess, setup: CurveSetup, secret: Path) -> None:
    with pytest.raises(mc0.AuthFailed):
        mc0.Client(broker.endpoint, timeout=5, key=str(secret), broker_key=str(setup.broker_key)).connect()


def test_a_refused_key_is_logged_by_its_name_and_fingerprint_and_revoked_apart_from_not_allowed(
    tmp_path: Path,
) -> None:
    setup = CurveSetup(tmp_path)  # alice, bob, carol allowed; mallory's key is in keys/ but not allowed
    keys.create(tmp_path / "elsewhere", "eve")  # a key no folder of the broker holds
    revoked = setup.keys_dir / "revoked"
    revoked.mkdir()
    (setup.allowed_dir / "carol.key").rename(revoked / "carol.key")  # revoked before the broker started
    broker = setup.start()
    try:
        _refused(broker, setup, setup.secret("mallory"))
        _refused(broker, setup, tmp_path / "elsewhere" / "eve.key_secret")
        _refused(broker, setup, setup.secret("carol"))
        (setup.allowed_dir / "bob.key").rename(revoked / "bob.key")  # what `mc0 keys revoke bob` does
        # The broker re-reads the folder every reload_ms (100); 30 s is a hang guard for a loaded box.
        deadline = time.monotonic() + 30
        while True:
            try:
                mc0.Client(broker.endpoint, timeout=5, **setup.client_options("bob")).connect().close()
            except mc0.AuthFailed:
                break
            except mc0.NotConnected as exc:  # a handshake made just before the reload: its CONNECT is told why
                assert exc.reason == "key revoked", exc  # (the next handshake is refused, and logged)
            assert time.monotonic() < deadline, "bob still admitted 30 s after his key left the allowed folder"
            time.sleep(0.1)
    finally:
        broker.stop()
    log = broker.stderr_text()
    fingerprint = {name: keys.load_public(setup.keys_dir / f"{name}.key").fingerprint for name in ("mallory", "bob")}
    fingerprint["carol"] = keys.load_public(revoked / "carol.key").fingerprint
    fingerprint["eve"] = keys.load_public(tmp_path / "elsewhere" / "eve.key").fingerprint
    for line in (
        f"refused a key that is not allowed: mallory ({fingerprint['mallory']}); `mc0 keys allow mallory` admits it",
        f"refused a key that is not allowed: {fingerprint['eve']} (no key file of it here; `mc0 keys list`",
        f"refused a revoked key: carol ({fingerprint['carol']}); `mc0 keys allow carol` admits it again",
        f"refused a revoked key: bob ({fingerprint['bob']}); `mc0 keys allow bob` admits it again",
    ):
        assert line in log, log[-3000:]
    publics = [keys.load_public(p).public.decode() for p in (*setup.keys_dir.glob("*.key"), *revoked.glob("*.key"))]
    assert not [key for key in publics if key in log]  # never the raw Z85 key


PERMISSIONS = """
[permissions.default]
publish = ["public.>"]
subscribe = ["public.>"]
call = []
serve = []

[permissions.identity.alice]
publish = ["orders.>", "public.>"]
subscribe = ["orders.>", "billing.*"]
call = ["svc.a"]
serve = ["svc.a", "svc.b"]
[permissions.identity.alice.deny]
subscribe = ["orders.secret.>"]

[permissions.identity.bob]
publish = [">"]
subscribe = [">"]
call = ["svc.>"]
[permissions.identity.bob.deny]
publish = ["orders.>"]
call = ["svc.b"]

[permissions.identity.carol]
call = ["svc.b"]
serve = ["svc.b"]
"""

MATRIX = [
    # identity, action, target, allowed
    ("alice", "publish", "orders.eu", True),
    ("alice", "publish", "billing.q1", False),
    ("bob", "publish", "billing.q1", True),
    ("bob", "publish", "orders.eu", False),  # deny wins over bob's ">"
    ("carol", "publish", "public.news", True),  # the default's list
    ("carol", "publish", "orders.eu", False),
    ("alice", "subscribe", "orders.*", True),
    ("alice", "subscribe", "billing.q1", True),
    ("alice", "subscribe", "billing.>", False),  # wider than billing.*
    ("alice", "subscribe", "orders.secret.>", False),  # wholly denied
    ("bob", "subscribe", ">", True),
    ("carol", "subscribe", "orders.>", False),
    ("alice", "call", "svc.a", True),
    ("alice", "call", "svc.b", False),
    ("bob", "call", "svc.a", True),
    ("bob", "call", "svc.b", False),
    ("carol", "call", "svc.b", True),
    ("carol", "call", "svc.a", False),
    ("alice", "serve", "svc.a", True),
    ("bob", "serve", "svc.a", False),  # the default serves nothing
    ("carol", "serve", "svc.b", True),
    ("carol", "serve", "svc.a", False),
]


@pytest.fixture(scope="module")
def policy_bus(tmp_path_factory: pytest.TempPathFactory) -> Any:
    setup = CurveSetup(tmp_path_factory.mktemp("policy"), extra=PERMISSIONS)
    broker = setup.start()
    workers = []
    for name, service in (("alice", "svc.a"), ("carol", "svc.b")):
        worker = mc0.Worker(broker.endpoint, **setup.client_options(name))
        worker.service(service)(lambda r, s=service: s.encode())
        workers.append(worker.connect())
    yield setup, broker
    for worker in workers:
        worker.close()
    broker.__exit__(None, None, None)


@pytest.mark.parametrize(("identity", "action", "target", "allowed"), MATRIX)
def test_permission_matrix(policy_bus: Any, identity: str, action: str, target: str, allowed: bool) -> None:
    setup, broker = policy_bus
    if action == "serve":
        worker = mc0.Worker(broker.endpoint, **setup.client_options(identity))
        worker.service(target)(lambda r: b"")
        try:
            if allowed:
                worker.connect()
            else:
                with pytest.raises(mc0.Forbidden):
                    worker.connect()
        finally:
            worker.close()
        return
    with mc0.Client(broker.endpoint, **setup.client_options(identity)) as client:
        attempt = {
            "publish": lambda: client.publish(target, b"x", confirm=True),
            "subscribe": lambda: client.subscribe(target),
            "call": lambda: client.request(target, timeout=5),
        }[action]
        if allowed:
            attempt()
        else:
            with pytest.raises(mc0.Forbidden) as info:
                attempt()
            assert info.value.code == 403 and identity in info.value.reason


def test_a_wildcard_overlapping_a_denied_topic_never_delivers_it(policy_bus: Any) -> None:
    setup, broker = policy_bus
    with mc0.Client(broker.endpoint, **setup.client_options("alice")) as alice:
        orders = alice.subscribe("orders.>")  # allowed, though it overlaps orders.secret.>
        alice.publish("orders.secret.plan", b"hidden", confirm=True)
        alice.publish("orders.eu.new", b"visible", confirm=True)
        assert orders.next(timeout=5).body == b"visible"
        with pytest.raises(mc0.Timeout):
            orders.next(timeout=0.5)


def test_sighup_reloads_permissions_and_withdraws_what_they_no_longer_allow(tmp_path: Path) -> None:
    setup = CurveSetup(tmp_path, extra='[permissions.identity.bob]\nsubscribe = [">"]\n')
    with setup.start() as broker, mc0.Client(broker.endpoint, **setup.client_options("bob")) as bob:
        stream = bob.subscribe("alerts.*")
        text = setup.config.read_text().replace('subscribe = [">"]', 'subscribe = ["other.>"]')
        setup.config.write_text(text)
        import signal

        broker.signal(signal.SIGHUP)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not bob.faults:
            time.sleep(0.05)
        assert any(isinstance(f, mc0.Forbidden) and "alerts.*" in f.reason for f in bob.faults)
        with mc0.Client(broker.endpoint, **setup.client_options("alice")) as alice:
            alice.publish("alerts.fire", b"x", confirm=True)
        with pytest.raises(mc0.ClosedError):  # the withdrawn subscription ended; nothing was delivered
            stream.next(timeout=0.5)
        assert stream.closed
        with pytest.raises(mc0.Forbidden):
            bob.subscribe("alerts.*")
