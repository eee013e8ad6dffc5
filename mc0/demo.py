"""The end-to-end demo behind ``mc0 demo`` and the README's first command.

Contract: with CURVE on, on the embedded defaults: creates the demo's keys
on first run (``var/demo/keys``: the broker's, and alice's, bob's and a
stranger's, only alice and bob allowed) and a config with per-identity
permissions, starts a real broker process on a free loopback port, then a
subscriber, publishers, a worker and clients (library objects).  It shows
wildcard delivery with the authenticated SENDER, a permission refusal, RPC
answered differently per CALLER, a streamed reply, the broker's stats
service, an unknown key refused at the handshake, a 503, a ping, a bad
input, a queue group, a durable consumer on a journal (kept fresh under
``var/demo/journal``) and a mailbox letter kept for an offline identity,
and stops the broker with SIGTERM.  Prints each step; raises
:class:`mc0.Error` (exit 1 from the CLI) if anything does not happen as shown.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import keys
from .client import Client, Worker
from .errors import AuthFailed, Error, Forbidden, NoResponders
from .message import Request
from .process import BrokerProcess

DEMO_DIR = Path("var/demo")

DEMO_CONFIG = """# Written by `mc0 demo`: the demo broker's config (CURVE on, keys in {keys}).
[security]
keys_dir = "{keys}"
allowed_dir = "{keys}/allowed"

# alice may do everything; bob may read orders but not publish them.
[permissions.identity.bob]
publish = ["demo.billing.>"]

# A journal for the durable-consumer step (recreated by every demo run).
[journals.demo]
topics = ["demo.jobs.>"]
folder = "{journal}"
"""


def _greet(request: Request) -> bytes:
    if request.caller == "alice":
        return f"welcome back, alice: {request.body.decode()}".encode()
    return f"hello {request.caller}, you asked {request.body.decode()!r}".encode()


def _count(request: Request) -> Iterator[bytes]:
    for i in range(1, int(request.body or b"3") + 1):
        yield f"step {i}".encode()
    return b"counted"  # type: ignore[return-value]


def prepare(folder: Path, say: Callable[[str], None]) -> Path:
    """Keys and config for the demo, created once and reused."""
    key_dir = folder / "keys"
    allowed = key_dir / "allowed"
    for name in ("alice", "bob", "stranger"):
        if not (key_dir / f"{name}{keys.SECRET_SUFFIX}").exists():
            keys.create(key_dir, name, force=True)
            say(f"   created keypair {key_dir / name}.key / .key_secret (secret mode 0600)")
    allowed.mkdir(parents=True, exist_ok=True)
    for name in ("alice", "bob"):
        (allowed / f"{name}{keys.PUBLIC_SUFFIX}").write_bytes((key_dir / f"{name}{keys.PUBLIC_SUFFIX}").read_bytes())
    journal = folder / "journal"
    shutil.rmtree(journal, ignore_errors=True)  # each run starts its journal empty
    config = folder / "mc0.toml"
    config.write_text(DEMO_CONFIG.format(keys=key_dir.resolve(), journal=journal.resolve()))
    return config


def run_demo(say: Callable[[str], None], folder: Path = DEMO_DIR) -> None:
    say(f"1. keys and config in {folder} (created on first run; only alice and bob are allowed)")
    config = prepare(folder, say)
    key_dir = folder / "keys"
    broker_key = key_dir / f"broker{keys.PUBLIC_SUFFIX}"

    say("2. starting a broker process with CURVE on a free loopback port ...")
    with BrokerProcess(config=str(config)) as broker:
        endpoint = broker.endpoint
        say(f"   broker listening on {endpoint}, public key {(broker.public_key or b'?').decode()}")

        def client(name: str, **options: Any) -> Client:
            """A client of ``name``'s key (not connected)."""
            return Client(endpoint, key=key_dir / f"{name}{keys.SECRET_SUFFIX}", broker_key=broker_key, **options)

        def worker(name: str) -> Worker:
            return Worker(endpoint, capacity=2, key=key_dir / f"{name}{keys.SECRET_SUFFIX}", broker_key=broker_key)

        alice, bob = client("alice"), client("bob")
        with alice, bob:
            _pubsub(alice, bob, say)
            _rpc(alice, bob, worker("alice"), say)
            _refusals(alice, client, say)
            _bus_features(alice, lambda: client("alice"), say)
            _mailbox(alice, bob, lambda: client("bob"), say)
        say("18. stopping the broker with SIGTERM")
        status = broker.stop()
        if status != 0:
            raise Error(f"demo: broker exited with status {status}")
        say("   broker exited 0")


def _pubsub(alice: Client, bob: Client, say: Callable[[str], None]) -> None:
    """Wildcards, the authenticated SENDER, one delivery for overlapping patterns, a refused publish."""
    say("3. bob subscribes to 'demo.orders.>' and 'demo.*.audit'")
    subscription = bob.subscribe("demo.orders.>", "demo.*.audit")
    say("4. alice publishes; the broker stamps her authenticated identity as SENDER")
    alice.publish("demo.orders.created", b'{"order": 1}', headers={"X-Trace": "t-1"})
    alice.publish("demo.orders.audit", b"matches both of bob's patterns, arrives once", confirm=True)
    for topic in ["demo.orders.created", "demo.orders.audit"]:
        message = subscription.next(timeout=5)
        body = message.body.decode()
        say(f"   bob got {message.topic} from {message.sender}: {body} {message.headers}")
        if (message.topic, message.sender) != (topic, "alice"):
            raise Error(f"demo: expected {topic} from alice, got {message.topic} from {message.sender}")
    say("5. bob may not publish orders (permissions in the demo config)")
    try:
        bob.publish("demo.orders.forged", b"x", confirm=True)
        raise Error("demo: bob published an order")
    except Forbidden as exc:
        say(f"   broker answered ERROR {exc.code}: {exc.reason}")


def _rpc(alice: Client, bob: Client, worker: Worker, say: Callable[[str], None]) -> None:
    """A worker's answers per CALLER, a streamed reply, the broker's own service, then a 503."""
    say("6. a worker (as alice) serves 'demo.greet' and 'demo.count'")
    worker.service("demo.greet")(_greet)
    worker.service("demo.count")(_count)
    with worker:
        say("7. RPC: the worker answers differently per authenticated CALLER")
        for client in (alice, bob):
            reply = client.request("demo.greet", b"how are you?", timeout=5)
            say(f"   {client.identity} got FINAL: {reply.body.decode()}")
        say("8. a streamed reply: PARTIALs then the FINAL")
        for part in bob.stream("demo.count", b"3", timeout=5):
            say(f"   {'FINAL  ' if part.final else 'PARTIAL'} {part.body.decode()}")
        say("9. the broker's own service mc0.broker answers 'services'")
        services = json.loads(alice.request("mc0.broker", b"services", timeout=5).body)
        for name, row in services.items():
            say(f"   {name}: {row['workers']} worker(s), served {row['served']}")
    say("10. with the worker gone, a request gets 503 at once")
    try:
        alice.request("demo.greet", b"anyone?", timeout=5)
        raise Error("demo: a request without workers was answered")
    except NoResponders as exc:
        say(f"   broker answered ERROR {exc.code}: {exc.reason}")


def _refusals(alice: Client, client: Callable[..., Client], say: Callable[[str], None]) -> None:
    """An unknown key refused at the handshake, a ping, a PUT to the broker's own topics refused."""
    say("11. a key the broker does not know is refused at the CURVE handshake")
    try:
        client("stranger", timeout=5).connect()
        raise Error("demo: the stranger got in")
    except AuthFailed as exc:
        say(f"   AuthFailed: {exc}")
    say(f"12. ping: {alice.ping() * 1000:.2f} ms round trip")
    say("13. bad input gets a clear answer: PUT to the broker's own topic space")
    try:
        alice.publish("mc0.sys.fake", b"x", confirm=True)
        raise Error("demo: the broker accepted a PUT to mc0.sys.*")
    except Forbidden as exc:
        say(f"   broker answered ERROR {exc.code}: {exc.reason}")


def _mailbox(alice: Client, bob: Client, bob_again: Callable[[], Client], say: Callable[[str], None]) -> None:
    """A letter to bob while he is offline, kept by the broker and found when he connects."""
    say("17. a direct message to bob while bob is offline: the broker keeps it")
    bob.close()
    outcome = alice.send_to("bob", "demo.notice", b"your report is ready", confirm=True)
    say(f"   the broker says: {outcome}")
    with bob_again() as bob_back:
        letter = bob_back.mailbox.next(timeout=5)
        say(f"   bob connects and finds it in his mailbox: {letter.body.decode()!r} from {letter.sender}")
        if (outcome, letter.sender) != ("stored", "alice"):
            raise Error(f"demo: expected a stored letter from alice, got {outcome} from {letter.sender}")


def _bus_features(alice: Client, another: Callable[[], Client], say: Callable[[str], None]) -> None:
    """Queue groups and a durable consumer, as alice (``another`` makes a second client)."""
    say("14. a queue group: two subscriptions in group 'demo-workers' share the jobs")
    with another() as other:
        subs = [
            alice.subscribe("demo.jobs.>", group="demo-workers"),
            other.subscribe("demo.jobs.>", group="demo-workers"),
        ]
        for i in range(6):
            alice.publish("demo.jobs.resize", f"job {i}".encode())
        alice.flush(timeout=5)
        shares = [0, 0]
        for _ in range(20):  # bounded: until all 6 arrived (they come over two connections)
            for i, sub in enumerate(subs):
                if sub.pending or sum(shares) < 6:
                    try:
                        shares[i] += len(sub.next_batch(100, timeout=0.05))
                    except Error:
                        pass  # nothing yet on this one
            if sum(shares) >= 6:
                break
        say(f"   6 jobs published: the members got {shares[0]} and {shares[1]}, each job exactly once")
        if sorted(shares) != [3, 3]:
            raise Error(f"demo: the group shared the jobs as {shares}, expected 3 and 3")
        for sub in subs:
            sub.close()
    say("15. a durable consumer on journal 'demo': the broker keeps its position and the acks")
    consumer = alice.consume("demo", "thumbnails", topics=["demo.jobs.>"], ack_wait=30)
    batch = consumer.fetch(100, wait=1)
    say(f"   fetched {len(batch)} journaled jobs (seq {batch[0].seq}..{batch[-1].seq}); acking them in one call")
    consumer.ack(*batch)
    info = consumer.info()
    say(f"   consumer info: acked {info['acked']}, pending {info['pending']}, ack floor {info['ack_floor']}")
    if (info["acked"], info["pending"]) != (6, 0):
        raise Error(f"demo: expected 6 acked and 0 pending, got {info['acked']} and {info['pending']}")
    say("16. nothing more to fetch: the position is the broker's, not the client's")
    if consumer.fetch(10, wait=0.2):
        raise Error("demo: an acknowledged job came back")
