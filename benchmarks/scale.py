"""Scale: what a broker costs with many peers, beside nats-server in the same invocation.

Contract: ``run(options, say)`` returns ``Row``s, each measured for mc0 (CURVE, the peers
authenticated) and nats-server (plaintext: the comparison is unfavourable to mc0) one after the
other in the same invocation, with the ratio in the row's note:

* ``idle N``: N idle peers held (N from ``--peers``, 1,000 / 5,000 / 10,000 by default): the
  broker's CPU (% of a core, over ``--seconds``), its resident memory, and a probe's round-trip
  p50/p99 (a PUT to its own subscription, paced) with the N held against with none;
* ``connects``: ``--connects`` peers connecting at once, until each has its answer (CONNECT's OK for
  mc0, PONG for NATS): connects/s and broker CPU per connect; and a reconnect storm: the same peers
  held, the broker restarted, every peer reconnecting at once while a probe's round trips go on
  (none may fail; the probe's p99 while it lasts is reported).

The harness's peers are raw and light (bare pyzmq DEALERs speaking mc0 frames; bare TCP sockets
speaking NATS's text protocol), held by child processes of ``HOLDER_PEERS`` each (a libzmq socket
holds two fds: its TCP connection and its mailbox), each raising its soft fd limit to the hard one.
An mc0 peer names the library's TTL (``mc0.protocol.DEFAULT_TTL_MS``, unless ``--ttl-ms``) and sends
NOOP as the library does (after half of it silent); nats-server pings every 2 minutes.
"""

from __future__ import annotations

import contextlib
import os
import queue
import resource
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from mc0 import protocol as P
from mc0.process import BrokerProcess

from .common import CTX, Row, cpu_seconds, make_keys, nats_server_process, security_toml
from .wire import CONNECT, ID, MESSAGE, NOOP, OK, PUT, SUB, TOPIC, TTL, VERSION, dealer

HOLDER_PEERS = 2_500  # peers one holder process keeps (5,000 fds for mc0's)
PROBE_EVERY = 0.002  # seconds between a probe's round trips
PROBE_COUNT = 2_000  # round trips per probe run


@dataclass
class ScaleOptions:
    peers: tuple[int, ...] = (1_000, 5_000, 10_000)
    seconds: float = 10.0  # CPU measured over this, once every peer is held
    connects: int = 2_000
    ttl_ms: int = P.DEFAULT_TTL_MS
    runs: int = 1
    only: tuple[str, ...] = ()

    def wants(self, name: str) -> bool:
        return not self.only or any(o in name for o in self.only)


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# ============================================================== peers held


def mc0_holder(
    endpoint: str, n: int, curve: dict[str, Any], ttl_ms: int, subscribe: bool, ready: Any, stop: Any, out: Any
) -> None:
    """``n`` peers (CURVE when ``curve`` has keys): CONNECT each (all at once; ``subscribe``: and one
    subscription each, ``held.<i>.>``), then a NOOP from each after half its TTL of silence, spread
    evenly; what the broker sends is read and dropped.  Puts (connected, seconds to connect them all)
    on ``ready``, and the peers still held on ``out`` when ``stop`` is set."""
    raise_nofile()
    context: zmq.Context[Any] = zmq.Context()
    context.set(zmq.MAX_SOCKETS, n + 64)  # (libzmq's default: 1,023)
    sockets = [dealer(context, endpoint, curve) for _ in range(n)]
    started = time.monotonic()
    connect = [CONNECT, VERSION, P.FULL_VERSION.encode(), TTL, str(ttl_ms).encode(), ID, b"c"]
    for sock in sockets:
        sock.send_multipart(connect)
    pending = set(range(n))
    index = {id(sock): i for i, sock in enumerate(sockets)}
    poller = zmq.Poller()
    for sock in sockets:
        poller.register(sock, zmq.POLLIN)
    deadline = started + 300
    while pending and time.monotonic() < deadline:
        for sock, _ in poller.poll(500):
            with contextlib.suppress(zmq.Again):
                while True:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                    if frames[0] == OK:
                        pending.discard(index[id(sock)])
    connected_in = time.monotonic() - started
    if subscribe:
        for i, sock in enumerate(sockets):
            sock.send_multipart([SUB, b"", b"held.%d.>" % i])
    ready.put((n - len(pending), connected_in))
    beat = ttl_ms / 1000.0 * P.HEARTBEAT_FRACTION * 0.9
    step = beat / max(1, n)
    noop = [NOOP]
    i = 0
    next_at = time.monotonic()
    while True:
        now = time.monotonic()
        while next_at <= now:
            sock = sockets[i]
            with contextlib.suppress(zmq.Again):
                sock.send_multipart(noop, zmq.NOBLOCK)
                while True:
                    sock.recv_multipart(zmq.NOBLOCK)
            i = (i + 1) % n
            next_at += step
        if stop.poll(max(0.0, min(0.05, next_at - time.monotonic()))):
            break
    out.put(n - len(pending))
    for sock in sockets:
        sock.close(0)
    context.term()


def nats_holder(url: str, n: int, ttl_ms: int, ready: Any, stop: Any, out: Any) -> None:
    """``n`` plaintext NATS connections (CONNECT, then PING answered by PONG); held silent
    (nats-server pings every 2 minutes: a PING read is answered)."""
    raise_nofile()
    host, port = url.removeprefix("nats://").split(":")
    started = time.monotonic()
    conns = []
    for _ in range(n):
        conn = socket.create_connection((host, int(port)), timeout=30)
        conns.append(conn)
    for conn in conns:
        conn.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
    ok = 0
    for conn in conns:
        data = b""
        while b"PONG" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        ok += b"PONG" in data
        conn.setblocking(False)
    ready.put((ok, time.monotonic() - started))
    while not stop.poll(1.0):
        for conn in conns:
            with contextlib.suppress(BlockingIOError, OSError):
                if b"PING" in conn.recv(65536):
                    conn.sendall(b"PONG\r\n")
    out.put(ok)
    for conn in conns:
        conn.close()


@contextlib.contextmanager
def held(
    system: str, endpoint: str, n: int, curve: dict[str, Any], ttl_ms: int, *, subscribe: bool = False
) -> Iterator[tuple[int, float]]:
    """``n`` peers held by holder processes for the block; yields (connected, seconds to connect all).
    The holders stop when the block ends (the write end of their pipe closed: a pipe, not an Event,
    so that a holder that died never blocks the others' stop)."""
    stop, stopping = CTX.Pipe(duplex=False)
    ready, out = CTX.Queue(), CTX.Queue()
    processes = []
    shares = [min(HOLDER_PEERS, n - i) for i in range(0, n, HOLDER_PEERS)]
    for share in shares:
        args: tuple[Any, ...]
        if system == "mc0":
            target: Callable[..., None] = mc0_holder
            args = (endpoint, share, curve, ttl_ms, subscribe, ready, stop, out)
        else:
            target, args = nats_holder, (endpoint, share, ttl_ms, ready, stop, out)
        process = CTX.Process(target=target, args=args, daemon=True)
        process.start()
        processes.append(process)
    try:
        reports = []
        deadline = time.monotonic() + 400
        while len(reports) < len(shares):
            try:
                reports.append(ready.get(timeout=1.0))
            except queue.Empty:
                if time.monotonic() > deadline or any(not p.is_alive() for p in processes):
                    raise RuntimeError(f"{system}: a holder of peers died or never got ready") from None
        yield sum(r[0] for r in reports), max(r[1] for r in reports)
    finally:
        stopping.close()
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join(5)


# ============================================================== probes


def mc0_probe(endpoint: str, curve: dict[str, Any], count: int, results: Any) -> None:
    """``count`` round trips, one every ``PROBE_EVERY``: a PUT to the probe's own subscription, timed
    to its MESSAGE.  Reports the round trips in seconds, and how many never came back."""
    context: zmq.Context[Any] = zmq.Context()
    sock = dealer(context, endpoint, curve)
    sock.send_multipart([CONNECT, VERSION, P.FULL_VERSION.encode(), TTL, b"60000", ID, b"c"])
    sock.poll(30_000) and sock.recv_multipart()
    sock.send_multipart([SUB, ID, b"s", b"", b"probe.rt"])
    sock.poll(30_000) and sock.recv_multipart()
    put = [PUT, TOPIC, b"probe.rt", b"", b"x" * 16]
    times: list[float] = []
    lost = 0
    next_at = time.perf_counter()
    end = next_at + count * PROBE_EVERY + 30  # (a bound: what did not come back by then is lost)
    for i in range(count):
        if time.perf_counter() > end:
            lost += count - i
            break
        next_at += PROBE_EVERY
        sent = time.perf_counter()
        sock.send_multipart(put)
        while True:
            if not sock.poll(1_000):
                lost += 1
                break
            if sock.recv_multipart()[0] == MESSAGE:
                times.append(time.perf_counter() - sent)
                break
        time.sleep(max(0.0, next_at - time.perf_counter()))
    results.put((times, lost))
    sock.close(0)
    context.term()


def nats_probe(url: str, count: int, results: Any) -> None:
    host, port = url.removeprefix("nats://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=30)
    conn.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nSUB probe.rt 1\r\nPING\r\n')
    data = b""
    while b"PONG" not in data:
        data += conn.recv(4096)
    conn.settimeout(1.0)
    times: list[float] = []
    lost = 0
    next_at = time.perf_counter()
    end = next_at + count * PROBE_EVERY + 30
    for i in range(count):
        if time.perf_counter() > end:
            lost += count - i
            break
        next_at += PROBE_EVERY
        sent = time.perf_counter()
        conn.sendall(b"PUB probe.rt 16\r\nxxxxxxxxxxxxxxxx\r\n")
        data = b""
        try:
            while b"\r\nxxxxxxxxxxxxxxxx\r\n" not in data:
                data += conn.recv(4096)
            times.append(time.perf_counter() - sent)
        except TimeoutError:
            lost += 1
        time.sleep(max(0.0, next_at - time.perf_counter()))
    results.put((times, lost))
    conn.close()


def probe(system: str, endpoint: str, curve: dict[str, Any], count: int = PROBE_COUNT) -> tuple[float, float, int]:
    """(p50 ms, p99 ms, lost) of ``count`` paced round trips from a child process."""
    results = CTX.Queue()
    args = (endpoint, curve, count, results) if system == "mc0" else (endpoint, count, results)
    process = CTX.Process(target=mc0_probe if system == "mc0" else nats_probe, args=args, daemon=True)
    process.start()
    try:
        times, lost = results.get(timeout=count * PROBE_EVERY + 90)
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()
    times.sort()
    if not times:
        return 0.0, 0.0, lost
    return (statistics.median(times) * 1000, times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, lost)


# ============================================================== servers


@contextlib.contextmanager
def server(system: str, curve: dict[str, Any], folder: Path) -> Iterator[tuple[str, int]]:
    """(endpoint, pid) of a fresh mc0 broker (CURVE on) or nats-server for the block."""
    if system == "nats":
        with nats_server_process() as (url, pid):
            yield url, pid
        return
    config = folder / "broker.toml"
    config.write_text(security_toml(curve))
    with BrokerProcess(config=str(config), cwd=str(folder), start_timeout=60) as broker:
        assert broker.proc is not None
        yield broker.endpoint, broker.proc.pid


def rss_mib(pid: int) -> float:
    try:
        import psutil  # type: ignore[import-untyped]

        return float(psutil.Process(pid).memory_info().rss) / (1 << 20)
    except Exception:
        return 0.0


# ============================================================== rows


SYSTEMS = ("mc0", "nats")


def idle_rows(options: ScaleOptions, curve: dict[str, Any], folder: Path, say: Callable[[str], None]) -> list[Row]:
    rows: list[Row] = []
    by: dict[tuple[str, int], Row] = {}
    for run in range(options.runs):
        for system in SYSTEMS:
            for n in options.peers:
                row = by.get((system, n))
                if row is None:
                    row = by[(system, n)] = Row(f"idle {n:,} peers", system, "% of a core", suite="scale")
                    row.lower_is_better = True
                    rows.append(row)
                with server(system, curve, folder) as (endpoint, pid):
                    base_p50, base_p99, base_lost = probe(system, endpoint, curve)
                    base_rss = rss_mib(pid)
                    with held(system, endpoint, n, curve, options.ttl_ms) as (connected, took):
                        time.sleep(min(3.0, options.seconds / 3))  # the connects' aftermath settles
                        before, t0 = cpu_seconds(pid), time.monotonic()
                        time.sleep(options.seconds)
                        cpu = (cpu_seconds(pid) - before) / (time.monotonic() - t0) * 100
                        rss = rss_mib(pid)
                        p50, p99, lost = probe(system, endpoint, curve)
                row.values.append(cpu)
                for name, value in (
                    ("rss_mib", rss), ("kib_per_peer", (rss - base_rss) * 1024 / max(1, n)),
                    ("p50_ms", p50), ("p99_ms", p99), ("p50_none_ms", base_p50), ("p99_none_ms", base_p99),
                    ("p99_ratio", p99 / base_p99 if base_p99 else 0.0),
                    ("p50_ratio", p50 / base_p50 if base_p50 else 0.0),
                ):  # fmt: skip
                    row.add_extra(name, value)
                row.add_counts(expected=n, connected=connected, lost=lost + base_lost + (n - connected))
                say(
                    f"run {run + 1} {system} idle {n:,}: cpu {cpu:.1f}% rss {rss:.0f} MiB"
                    f" ({(rss - base_rss) * 1024 / max(1, n):.1f} KiB/peer) p50 {p50:.3f} ms (none {base_p50:.3f})"
                    f" p99 {p99:.3f} ms (none {base_p99:.3f}) connected {connected}/{n} lost {lost}"
                )
    return rows


def connect_rows(options: ScaleOptions, curve: dict[str, Any], folder: Path, say: Callable[[str], None]) -> list[Row]:
    rows = []
    for system in SYSTEMS:
        row = Row(f"connects ({options.connects:,} at once)", system, "connects/s", suite="scale")
        rows.append(row)
        for run in range(options.runs):
            with server(system, curve, folder) as (endpoint, pid):
                before = cpu_seconds(pid)
                with held(system, endpoint, options.connects, curve, options.ttl_ms) as (connected, took):
                    spent = cpu_seconds(pid) - before
                rate = connected / took if took else 0.0
                row.values.append(rate)
                row.add_extra("broker_ms_per_connect", spent * 1000 / max(1, connected))
                row.add_counts(expected=options.connects, connected=connected, errors=options.connects - connected)
                say(
                    f"run {run + 1} {system} connects: {rate:,.0f}/s, broker {spent * 1000 / max(1, connected):.3f}"
                    f" ms CPU each, {connected}/{options.connects} connected"
                )
    return rows


def ratio_notes(rows: list[Row]) -> None:
    """Each mc0 row's note: its median against nats-server's in the same scenario."""
    nats = {r.scenario: r for r in rows if r.system == "nats"}
    for row in rows:
        other = nats.get(row.scenario)
        if row.system == "mc0" and other is not None and other.median:
            row.note = f"{row.median / other.median:.2f}x nats-server"


def run(options: ScaleOptions, say: Callable[[str], None]) -> list[Row]:
    rows: list[Row] = []
    raise_nofile()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        curve = make_keys(folder)
        if options.wants("idle"):
            rows += idle_rows(options, curve, folder, say)
        if options.wants("connects"):
            rows += connect_rows(options, curve, folder, say)
    ratio_notes(rows)
    return rows


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
