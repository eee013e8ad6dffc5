"""The broker alone: raw-frame load for mc0, a plain pyzmq forwarding loop, zmq.proxy, NATS and Majordomo.

Contract: ``run_scenario(spec, options, curve, say)`` measures one of
``SCENARIOS`` for each of its systems (a fresh broker per run, every child
killed and joined after) and returns its rows.  Load generators speak each
system's own wire protocol with minimal code: raw pyzmq sockets sending mc0
frames for mc0 and the raw baseline, nats-py for NATS, majortomo's client and
worker for Majordomo, so what differs between rows is the broker.  Brokers
run with a large send HWM and no slow-consumer eviction, and publishers are
paced by the broker (a confirmed PUT every ``PACE`` messages).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import zmq

from mc0.process import BrokerProcess

from . import frames_batched
from .common import (
    BODY,
    CTX,
    LARGE_BODY,
    WINDOW,
    Options,
    Row,
    available,
    child,
    free_port,
    majortomo_main,
    nats_server,
    proxy_main,
    security_toml,
)
from .wire import (
    ALL,
    CAPACITY,
    CONNECT,
    FINAL,
    ID,
    MESSAGE,
    OK,
    PACE,
    PUT,
    READY,
    REQUEST,
    SERVICE,
    SUB,
    TIMEOUT,
    TOPIC,
    dealer,
    mc0_connect,
)

BATCHED = "mc0-batched"  # the same broker, load generators on the batched wire (frames_batched.py)
TUNED = "mc0-batched tuned"  # the same again, with the broker's queue limits lifted (TUNED_TOML)
# A reference point, not a ceiling: one message at a time through a pyzmq ROUTER with no protocol
# logic (what a Python broker pays per message without batching; mc0's batched wire is faster).
LOOP = "pyzmq-loop"
# What the mc0, mc0+curve and "mc0-batched tuned" rows run with (every other system, and the
# mc0-batched rows, at their defaults): no per-peer send limit, no slow-consumer eviction.
TUNED_TOML = "[broker]\nsend_hwm = 1000000\nslow_consumer_ms = 0\nmax_ttl_ms = 600000\n"

# ============================================================== brokers


@contextlib.contextmanager
def mc0_broker(curve: dict[str, Any] | None, *, tuned: bool = True) -> Iterator[str]:
    """A broker process; ``tuned``: with TUNED_TOML (else at its defaults but a 10-minute TTL cap)."""
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "mc0.toml"
        text = TUNED_TOML if tuned else "[broker]\nmax_ttl_ms = 600000\n"
        if curve:
            text += security_toml(curve)
        config.write_text(text)
        with BrokerProcess(config=str(config), insecure=curve is None, cwd=folder) as broker:
            yield broker.endpoint


def raw_broker_main(port: int) -> None:
    """The pyzmq-loop baseline: a ROUTER loop forwarding mc0 frames with no protocol logic."""
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
    elif system in (BATCHED, TUNED):
        args = (endpoint, subs, curve, ready, results, seconds)
        sub = CTX.Process(target=frames_batched.subscribers, args=args, daemon=True)
        pub = CTX.Process(target=frames_batched.publisher, args=(endpoint, size, seconds, curve, go), daemon=True)
    else:
        flavour = {"proxy": "proxy", LOOP: "raw"}.get(system, "mc0")
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
    elif system in (BATCHED, TUNED):
        helpers = [(frames_batched.workers, (endpoint, workers, curve))]
        args = (endpoint, window, seconds, curve, BODY)
        count, latencies, elapsed = measure(frames_batched.rpc_client, args, helpers)
    else:
        flavour = "raw" if system == LOOP else "mc0"
        helpers = [(zmq_workers, (endpoint, workers, flavour, curve))]
        count, latencies, elapsed = measure(
            zmq_rpc_client, (endpoint, flavour, window, seconds, curve, scatter), helpers
        )
    return count / max(elapsed, 1e-9), sorted(latencies or [0.0])


@contextlib.contextmanager
def system_endpoint(system: str, curve: Any) -> Iterator[str]:
    if system in ("mc0", "mc0+curve", BATCHED, TUNED):
        with mc0_broker(curve if system == "mc0+curve" else None, tuned=system != BATCHED) as endpoint:
            yield endpoint
    elif system == LOOP:
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


SCENARIOS: list[dict[str, Any]] = [
    {"name": "pub/sub 1->1", "kind": "pubsub", "subs": 1, "size": BODY, "unit": "deliveries/s",
     "systems": ["mc0", BATCHED, TUNED, "mc0+curve", LOOP, "proxy", "nats"]},
    {"name": "pub/sub 1->10", "kind": "pubsub", "subs": 10, "size": BODY, "unit": "deliveries/s",
     "systems": ["mc0", BATCHED, TUNED, "mc0+curve", LOOP, "proxy", "nats"]},
    {"name": "pub/sub 64KiB 1->1", "kind": "pubsub", "subs": 1, "size": LARGE_BODY, "unit": "MB/s",
     "systems": ["mc0", BATCHED, TUNED, "mc0+curve", LOOP, "proxy", "nats"]},
    {"name": "RPC sequential", "kind": "rpc", "workers": 1, "window": 1, "unit": "calls/s",
     "systems": ["mc0", "mc0+curve", LOOP, "nats", "majortomo"]},
    {"name": "RPC 100 in flight, 1 worker", "kind": "rpc", "workers": 1, "window": WINDOW, "unit": "calls/s",
     "systems": ["mc0", BATCHED, TUNED, "mc0+curve", LOOP, "nats", "majortomo"]},
    {"name": "RPC 100 in flight, 4 workers", "kind": "rpc", "workers": 4, "window": WINDOW, "unit": "calls/s",
     "systems": ["mc0", BATCHED, TUNED, "mc0+curve", LOOP, "nats", "majortomo"]},
    {"name": "scatter-gather to 10 workers", "kind": "rpc", "workers": 10, "window": 1, "scatter": 10,
     "unit": "gathers/s", "systems": ["mc0", "mc0+curve", "nats"]},
]  # fmt: skip

BASELINES = (LOOP, "proxy", "nats", "majortomo", "jetstream")


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
