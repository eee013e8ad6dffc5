"""Library scenarios: what a user actually runs, measured with each library's own client API.

Contract: ``run_library(options, curve, say)`` returns one :class:`Row` per
scenario and system (``suite="library"``), each the median of
``options.runs`` runs, every run on a fresh broker process at its default
settings (``BrokerProcess(insecure=True)``; ``+curve``: CURVE with keys from
``mc0.keys``), with the publishers, subscribers, workers and clients each in
its own spawned process on 127.0.0.1.  Systems: ``mc0-aio`` / ``mc0-aio+curve``
(``mc0.aio``), ``mc0-sync`` (``mc0``), ``nats`` (nats-server + nats-py) and,
for RPC, ``majortomo``; for durable consumers, ``jetstream`` (nats-server
``-js`` with a file store in a temporary folder, nats-py pull consumers)
against an mc0 broker with a journal.  Nothing is paced unless the scenario says so: a
library without back-pressure that loses messages shows it as ``lost``, and a
row that lost any message (or had any RPC error) is *failing* (``LOSS n`` /
``ERRORS n`` in its note, ``"failing": true`` in JSON).  Every loop is bounded
in count and time; every process is killed and joined when its run ends.

Figures: pub/sub rows report deliveries/s summed over subscribers from the
first delivery to the last (clocks: ``time.monotonic_ns``, shared across
processes), with published, expected (published x subscribers), delivered
and lost, summed over the runs; the latency row's figure is the one-way p50
in ms at a fixed rate; RPC rows report calls/s (scatter: gathers/s) and
p50/p99.  Queue-group rows: deliveries/s summed over the members, every
message owed to exactly one member (lost: never delivered; ``duplicates``:
delivered more than once, failing too; ``member_share_min``: the smallest
member's share).  Durable-consumer rows: messages settled per second from
the first fetch to the last settle (``count`` loaded before the clock
starts), lost = loaded but never fetched, ``unacked`` = not counted as
acknowledged by the server at the end (failing), ``redelivered`` and
``duplicates`` (noted; nothing should be redelivered: ``ack_wait`` is 30 s).
Beside each row, the broker process's CPU time per delivered
message (per call, per gather) over the measured window
(``broker_us_per_msg``), for mc0's broker, nats-server and majortomo's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mc0 import native
from mc0.process import BrokerProcess

from . import library_load, library_mc0, library_nats, library_queues
from .common import (
    BODY,
    CTX,
    LARGE_BODY,
    WINDOW,
    Options,
    Row,
    available,
    child,
    cpu_seconds,
    free_port,
    majortomo_main,
    nats_server_process,
    security_toml,
)
from .library_load import QUIET, Link, percentile

PUBSUB_SYSTEMS = ["mc0-aio", "mc0-aio+curve", "mc0-sync", "nats"]
RPC_SYSTEMS = ["mc0-aio", "mc0-aio+curve", "mc0-sync", "nats", "majortomo"]
# Requests in flight: the batch services too (Worker.batch_service), rows of their own beside the per-request ones.
BATCH = "+batch"
INFLIGHT_SYSTEMS = ["mc0-aio", f"mc0-aio{BATCH}", "mc0-aio+curve", "mc0-sync", f"mc0-sync{BATCH}", "nats", "majortomo"]
# --pure: each mc0 system again with every hot module from its source (MC0_PURE_PYTHON=1 in the broker's and
# the load processes' environment): the pure build beside the compiled one, interleaved run by run.
PURE = "+pure"
SCATTER_SYSTEMS = ["mc0-aio", "mc0-aio+curve", "mc0-sync", "nats"]
GROUP_SYSTEMS = ["mc0-aio", "nats"]
CONSUMER_SYSTEMS = ["mc0-aio", "jetstream"]  # jetstream: nats-server -js (file store) + nats-py
# The console rows: mc0-aio against a broker with [http] listen, without and with CONSOLES pollers.
CONSOLES = 5
CONSOLE_SYSTEMS = ["mc0-aio+http", f"mc0-aio+{CONSOLES} consoles"]
# Their runs are this many times the pub/sub count: a console polls every 2 s (library_load.CONSOLE_POLLS),
# and a run of the plain count (~0.2 s at 300k/s) would measure the five first polls' burst, not the cost.
CONSOLE_COUNT_FACTOR = 50
GROUP_MEMBERS = 3
PREFIX = "lib "  # library scenario names: "lib " + the broker-alone scenario they mirror, where there is one
TREE_SYSTEMS = ("mc0-aio", "mc0-sync")  # the systems that --client-tree runs again with another checkout's mc0
# CPU per message (per call) of the load processes, from their own ``cpu_s`` (library_load.Child) or psutil.
CLIENT_CPU = ("sub_us_per_msg", "pub_us_per_msg", "client_us_per_call", "worker_us_per_call")


def split_system(system: str) -> tuple[str, str | None]:
    """``"mc0-aio@base"`` -> ``("mc0-aio", "base")``: the system, and the client tree its load runs from."""
    name, _, tree = system.partition("@")
    return name, tree or None


@dataclass(frozen=True)
class Mains:
    """One library's load processes (child-process entry points)."""

    subscriber: Callable[..., None] | None
    publisher: Callable[..., None] | None
    worker: Callable[..., None]
    client: Callable[..., None]


MAINS = {
    "mc0-aio": Mains(
        library_mc0.aio_subscriber, library_mc0.aio_publisher, library_mc0.aio_worker, library_mc0.aio_rpc_client
    ),
    "mc0-sync": Mains(
        library_mc0.sync_subscriber, library_mc0.sync_publisher, library_mc0.sync_worker, library_mc0.sync_rpc_client
    ),
    f"mc0-aio{BATCH}": Mains(None, None, library_mc0.aio_batch_worker, library_mc0.aio_rpc_client),
    f"mc0-sync{BATCH}": Mains(None, None, library_mc0.sync_batch_worker, library_mc0.sync_rpc_client),
    "nats": Mains(
        library_nats.nats_subscriber,
        library_nats.nats_publisher,
        library_nats.nats_responder,
        library_nats.nats_rpc_client,
    ),
    "majortomo": Mains(None, None, library_nats.majortomo_worker, library_nats.majortomo_client),
}


def scenarios(options: Options) -> list[dict[str, Any]]:
    quick = options.quick
    count = 300 if quick else options.count
    burst = 2_000 if quick else options.burst
    rate = 1_000 if quick else options.rate
    paced = 0.5 if quick else options.latency_seconds
    seconds = 0.3 if quick else options.seconds
    pubsub = {"kind": "pubsub", "unit": "deliveries/s", "systems": PUBSUB_SYSTEMS, "rate": 0}
    rpc = {"kind": "rpc", "unit": "calls/s", "systems": RPC_SYSTEMS, "seconds": seconds, "scatter": 0}
    inflight = {**rpc, "window": WINDOW, "systems": INFLIGHT_SYSTEMS}
    group = {"kind": "group", "family": "groups", "unit": "deliveries/s", "systems": GROUP_SYSTEMS, "size": BODY}
    durable = {"kind": "consumer", "family": "consumers", "unit": "msgs/s", "systems": CONSUMER_SYSTEMS, "size": BODY,
               "count": 300 if quick else options.consumer_count, "clients": 1}  # fmt: skip
    return [
        {**pubsub, "name": "lib pub/sub 1->1", "subs": 1, "size": BODY, "count": count},
        # The web console's cost: the same broker (with [http]) with and without five open consoles polling it.
        {**pubsub, "name": "lib pub/sub 1->1, consoles", "subs": 1, "size": BODY,
         "count": count * CONSOLE_COUNT_FACTOR, "systems": CONSOLE_SYSTEMS},
        {**pubsub, "name": "lib pub/sub 1->4", "subs": 4, "size": BODY, "count": count},
        {**pubsub, "name": "lib pub/sub 1->10", "subs": 10, "size": BODY, "count": count},
        {**pubsub, "name": "lib pub/sub 1KiB 1->1", "subs": 1, "size": 1024, "count": count},
        {**pubsub, "name": "lib pub/sub 64KiB 1->1", "subs": 1, "size": LARGE_BODY, "count": max(1, count // 4)},
        {**pubsub, "name": f"lib burst {burst} -> 4 subs", "subs": 4, "size": BODY, "count": burst},
        {**pubsub, "name": f"lib pub/sub latency at {rate}/s", "subs": 1, "size": BODY, "count": int(rate * paced),
         "rate": rate, "unit": "ms (p50)", "latency": True},
        {**rpc, "name": "lib RPC sequential", "workers": 1, "window": 1},
        {**inflight, "name": "lib RPC 100 in flight, 1 worker", "workers": 1},
        {**inflight, "name": "lib RPC 100 in flight, 4 workers", "workers": 4},
        {**rpc, "name": "lib scatter-gather to 10 workers", "workers": 10, "window": 1, "scatter": 10,
         "unit": "gathers/s", "systems": SCATTER_SYSTEMS},
        {**group, "name": f"lib queue group 1->{GROUP_MEMBERS}", "members": GROUP_MEMBERS, "count": count},
        {**durable, "name": "lib consumer ack-each", "ack": "each"},
        {**durable, "name": "lib consumer ack-each answered", "ack": "each-sync"},
        {**durable, "name": "lib consumer ack-batch", "ack": "batch"},
        {**durable, "name": "lib consumer ack-each, 3 clients", "ack": "each", "clients": 3},  # competing
    ]  # fmt: skip


def family(spec: dict[str, Any]) -> str:
    """Which ``--suite`` besides ``library`` and ``all`` selects this scenario."""
    return str(spec.get("family", "library"))


# ============================================================== brokers and load processes


@dataclass(frozen=True)
class Target:
    endpoint: str
    pid: int  # the broker's process, for its CPU time
    options: dict[str, Any]  # client keyword arguments (CURVE keys)


@contextlib.contextmanager
def target(system: str, curve: dict[str, Any], *, journal: bool = False) -> Iterator[Target]:
    """A fresh broker for one run, at its default settings; stopped (or killed) after.
    ``journal``: mc0's broker keeps the consumers' journal (:func:`library_queues.journal_toml`);
    a console system's broker serves its monitoring pages (``[http] listen``, in ``options["http"]``)."""
    if system.startswith("mc0"):
        with tempfile.TemporaryDirectory() as folder:  # cwd: `python -m mc0` must not import ./mc0
            text = library_queues.journal_toml(str(Path(folder) / "journal")) if journal else ""
            http = ""
            if system in CONSOLE_SYSTEMS:
                http = f"127.0.0.1:{free_port()}"
                text += f'[http]\nlisten = "{http}"\n'
                system = "mc0-aio"
            if system.endswith("+curve"):
                config = Path(folder) / "mc0.toml"
                config.write_text(security_toml(curve) + text)
                broker = BrokerProcess(config=str(config), cwd=folder)
                options = {"key": f"{curve['dir']}/bench.key_secret", "broker_key": f"{curve['dir']}/broker.key"}
            elif text:
                config = Path(folder) / "mc0.toml"
                config.write_text(text)
                broker = BrokerProcess(config=str(config), insecure=True, cwd=folder)
                options = {}
            else:
                broker = BrokerProcess(insecure=True, cwd=folder)
                options = {}
            with broker:
                assert broker.proc is not None
                yield Target(broker.endpoint, broker.proc.pid, {**options, **({"http": http} if http else {})})
    elif system == "nats":
        with nats_server_process() as (url, pid):
            yield Target(url, pid, {})
    elif system == "jetstream":
        with tempfile.TemporaryDirectory() as store, nats_server_process(jetstream=store) as (url, pid):
            yield Target(url, pid, {})
    elif system == "majortomo":
        port = free_port()
        with child(majortomo_main, port) as process:
            yield Target(f"tcp://127.0.0.1:{port}", process.pid, {})
    else:  # pragma: no cover
        raise ValueError(system)


class Crew:
    """One run's load processes: started with a shared :class:`Link`, all killed and joined on exit.
    ``tree``: a checkout whose ``mc0`` the mc0 load processes import instead of this one's (a spawned
    child starts with the parent's ``sys.path`` as it was at ``start``)."""

    def __init__(self, tree: str | None = None) -> None:
        self.link = Link(CTX.Queue(), CTX.Event(), CTX.Event(), CTX.Queue())
        self.processes: list[Any] = []
        self.tree = tree

    def start(self, main: Callable[..., None], *args: Any) -> None:
        process = CTX.Process(target=main, args=(*args, self.link), daemon=True)
        if self.tree is None:
            process.start()
        else:
            sys.path.insert(0, self.tree)
            try:
                process.start()
            finally:
                sys.path.remove(self.tree)
        self.processes.append(process)

    def _died(self, reported: set[int]) -> str | None:
        for process in self.processes:
            if process.exitcode not in (None, 0) and process.pid not in reported:
                return f"load process {process.pid} exited with {process.exitcode}"
        return None

    def wait_ready(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for got in range(count):
            while True:
                try:
                    self.link.ready.get(timeout=0.5)
                    break
                except queue.Empty:
                    if (died := self._died(set())) is not None:
                        raise RuntimeError(died) from None
                    if time.monotonic() > deadline:
                        late = f"{count - got} of {count} load processes not ready in {timeout:g} s"
                        raise RuntimeError(late) from None

    def collect(self, wanted: dict[str, int], timeout: float) -> list[tuple[str, dict[str, Any]]]:
        """Results until ``wanted[role]`` of each role arrived (any role's error counts too)."""
        results: list[tuple[str, dict[str, Any]]] = []
        reported: set[int] = set()
        missing = dict(wanted)
        deadline = time.monotonic() + timeout
        while any(n > 0 for n in missing.values()):
            try:
                role, pid, result = self.link.results.get(timeout=0.5)
            except queue.Empty:
                if (died := self._died(reported)) is not None:
                    raise RuntimeError(died) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no result from {missing} in {timeout:g} s") from None
                continue
            reported.add(pid)
            results.append((role, result))
            if role in missing:
                missing[role] -= 1
        return results

    def __enter__(self) -> Crew:
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(5)


def errors_of(results: list[tuple[str, dict[str, Any]]], tree: str | None = None) -> list[str]:
    """What went wrong in the load processes: what they raised, and (``tree``) any that did not run
    the client tree's mc0."""
    errors = [f"{role}: {r['error']}" for role, r in results if "error" in r]
    if tree is not None:
        errors += [f"{role} ran mc0 from {r.get('mc0_path')}, not {tree}" for role, r in results
                   if not str(r.get("mc0_path", "")).startswith(tree)]  # fmt: skip
    return errors


# ============================================================== one run


def cpu_per(results: list[dict[str, Any]], count: int) -> float:
    """Microseconds of the load processes' CPU (their ``cpu_s``, summed) per message or call."""
    return sum(float(r.get("cpu_s", 0.0)) for r in results) * 1e6 / count if count else 0.0


def pubsub_once(
    system: str, where: Target, spec: dict[str, Any], options: Options, tree: str | None = None
) -> dict[str, Any]:
    mains = MAINS[system.removesuffix("+curve").split("+")[0]]
    assert mains.subscriber is not None and mains.publisher is not None
    subs, count, rate = spec["subs"], spec["count"], spec["rate"]
    limit_s = 60 + count / 2000  # a subscriber's hard limit (it normally stops at the marker)
    quiet_s = 1.0 if options.quick else QUIET
    client_options = {k: v for k, v in where.options.items() if k != "http"}
    with Crew(tree) as crew:
        for _ in range(subs):
            crew.start(mains.subscriber, where.endpoint, client_options, count, bool(rate), limit_s, quiet_s)
        crew.start(mains.publisher, where.endpoint, client_options, count, spec["size"], rate)
        if system.endswith(" consoles"):  # (their own process: their work must not slow the load's)
            crew.start(library_load.console_pollers, f"http://{where.options['http']}", CONSOLES, limit_s)
        crew.wait_ready(subs + 1 + system.endswith(" consoles"), 90)
        cpu = cpu_seconds(where.pid)
        crew.link.go.set()
        results = crew.collect({"pub": 1, "sub": subs}, limit_s + 60)
        cpu = cpu_seconds(where.pid) - cpu
    pub = next((r for role, r in results if role == "pub"), {})
    received = [r for role, r in results if role == "sub"]
    published = int(pub.get("published", 0))
    delivered = sum(int(r.get("delivered", 0)) for r in received)
    expected = published * subs
    times = [r for r in received if r.get("delivered")]
    span = (max(r["last_ns"] for r in times) - min(r["first_ns"] for r in times)) / 1e9 if times else 0.0
    out: dict[str, Any] = {
        "rate": delivered / span if span > 0 else 0.0,
        "published": published,
        "expected": expected,
        "delivered": delivered,
        "lost": max(0, expected - delivered),
        "client_dropped": sum(int(r.get("client_dropped", 0)) for r in received),
        "broker_us_per_msg": cpu * 1e6 / delivered if delivered else 0.0,
        "sub_us_per_msg": cpu_per(received, delivered),
        "pub_us_per_msg": cpu_per([pub], published),
        "crashes": errors_of(results, tree),  # a load process raised
    }
    if times and pub.get("started_ns"):  # end to end: from the first publish to the last delivery
        out["e2e_deliveries_per_s"] = delivered / max(
            1e-9, (max(r["last_ns"] for r in times) - pub["started_ns"]) / 1e9
        )
    if pub.get("publish_s"):
        out["publish_msgs_per_s"] = published / pub["publish_s"]
    latencies = sorted(x for r in received for x in r.get("latencies_ns", ()))
    if latencies:
        out["p50_ms"] = percentile(latencies, 0.50) / 1e6
        out["p99_ms"] = percentile(latencies, 0.99) / 1e6
    return out


def rpc_once(system: str, where: Target, spec: dict[str, Any], tree: str | None = None) -> dict[str, Any]:
    mains = MAINS[system.removesuffix("+curve")]
    scatter = spec["scatter"]
    with Crew(tree) as crew:
        for _ in range(spec["workers"]):
            crew.start(mains.worker, where.endpoint, where.options, scatter)
        crew.wait_ready(spec["workers"], 90)
        if system == "majortomo":
            time.sleep(0.3)  # an MDP worker's READY is not acknowledged: let the broker read it
        crew.start(mains.client, where.endpoint, where.options, spec["window"], spec["seconds"], scatter)
        crew.wait_ready(1, 90)
        workers = [p.pid for p in crew.processes[: spec["workers"]]]  # (they report nothing: psutil reads them)
        cpu = cpu_seconds(where.pid)
        worker_cpu = sum(cpu_seconds(pid) for pid in workers)
        crew.link.go.set()
        results = crew.collect({"client": 1}, spec["seconds"] + 120)
        cpu = cpu_seconds(where.pid) - cpu
        worker_cpu = sum(cpu_seconds(pid) for pid in workers) - worker_cpu
    client = next((r for role, r in results if role == "client"), {})
    latencies = sorted(client.get("latencies_ns", ()))
    calls = len(latencies)
    out: dict[str, Any] = {
        "rate": calls / client["seconds"] if client.get("seconds") else 0.0,
        "calls": calls,
        "errors": int(client.get("errors", 0)),
        "p50_ms": percentile(latencies, 0.50) / 1e6,
        "p99_ms": percentile(latencies, 0.99) / 1e6,
        "broker_us_per_msg": cpu * 1e6 / calls if calls else 0.0,
        "client_us_per_call": cpu_per([client], calls),
        "worker_us_per_call": worker_cpu * 1e6 / calls if calls else 0.0,
        "crashes": errors_of(results, tree),  # a load process raised
        "error_texts": [f"client: {client['first_error']}"] if "first_error" in client else [],
    }
    return out


GROUP_MAINS = {
    "mc0-aio": (library_queues.aio_group_member, library_queues.aio_numbered_publisher),
    "nats": (library_queues.nats_group_member, library_queues.nats_numbered_publisher),
}
CONSUMER_MAINS = {
    "mc0-aio": (library_queues.aio_journal_loader, library_queues.aio_consumer),
    "jetstream": (library_queues.js_loader, library_queues.js_consumer),
}


def span_s(results: list[dict[str, Any]]) -> float:
    """Seconds from the earliest ``first_ns`` to the latest ``last_ns`` of those that got anything."""
    times = [r for r in results if r.get("delivered")]
    return (max(r["last_ns"] for r in times) - min(r["first_ns"] for r in times)) / 1e9 if times else 0.0


def group_once(
    system: str, where: Target, spec: dict[str, Any], options: Options, tree: str | None = None
) -> dict[str, Any]:
    """One publisher, ``members`` members of one queue group: each message must reach exactly one."""
    member, publisher = GROUP_MAINS[system.removesuffix("+curve")]
    members, count = spec["members"], spec["count"]
    limit_s = 60 + count / 2000
    quiet_s = 1.0 if options.quick else QUIET
    with Crew(tree) as crew:
        for _ in range(members):
            crew.start(member, where.endpoint, where.options, limit_s, quiet_s)
        crew.start(publisher, where.endpoint, where.options, count, spec["size"])
        crew.wait_ready(members + 1, 90)
        cpu = cpu_seconds(where.pid)
        crew.link.go.set()
        results = crew.collect({"pub": 1, "sub": members}, limit_s + 60)
        cpu = cpu_seconds(where.pid) - cpu
    pub = next((r for role, r in results if role == "pub"), {})
    got = [r for role, r in results if role == "sub"]
    published = int(pub.get("published", 0))
    indices = [i for r in got for i in r.get("indices", ())]
    unique = len(set(indices))
    span = span_s(got)
    shares = sorted(int(r.get("delivered", 0)) for r in got)
    out: dict[str, Any] = {
        "rate": len(indices) / span if span > 0 else 0.0,
        "published": published,
        "expected": published,  # each message to one member
        "delivered": len(indices),
        "lost": max(0, published - unique),
        "duplicates": len(indices) - unique,
        "client_dropped": sum(int(r.get("client_dropped", 0)) for r in got),
        "broker_us_per_msg": cpu * 1e6 / len(indices) if indices else 0.0,
        "sub_us_per_msg": cpu_per(got, len(indices)),
        "pub_us_per_msg": cpu_per([pub], published),
        "crashes": errors_of(results, tree),
        "shares": shares,
    }
    if pub.get("publish_s"):
        out["publish_msgs_per_s"] = published / pub["publish_s"]
    return out


def consumer_once(system: str, where: Target, spec: dict[str, Any]) -> dict[str, Any]:
    """``count`` messages loaded into a journal / stream, then pulled and settled by ``clients`` consumers."""
    loader, consumer = CONSUMER_MAINS[system.removesuffix("+curve")]
    count, clients = spec["count"], spec["clients"]
    limit_s = 60 + count / 500
    with Crew() as crew:
        crew.start(loader, where.endpoint, where.options, count, spec["size"], spec["ack"])
        loaded = crew.collect({"pub": 1}, 120 + count / 1000)
        for _ in range(clients):
            crew.start(consumer, where.endpoint, where.options, count, spec["ack"], limit_s)
        crew.wait_ready(clients, 90)
        cpu = cpu_seconds(where.pid)
        crew.link.go.set()
        results = crew.collect({"consumer": clients}, limit_s + 60)
        cpu = cpu_seconds(where.pid) - cpu
    published = int(loaded[0][1].get("published", 0))
    got = [r for role, r in results if role == "consumer"]
    seqs = [s for r in got for s in r.get("seqs", ())]
    unique = len(set(seqs))
    span = span_s(got)
    acked = max((int(r.get("acked", 0)) for r in got), default=0)
    return {
        "rate": unique / span if span > 0 else 0.0,  # settled messages per second
        "published": published,
        "expected": published,
        "delivered": unique,
        "lost": max(0, published - unique),
        "redelivered": sum(int(r.get("redelivered", 0)) for r in got),
        "duplicates": len(seqs) - unique,  # fetched more than once (a redelivery after a failure, or a bug)
        "unacked": max(0, published - acked),  # what the server does not count as settled at the end
        "broker_us_per_msg": cpu * 1e6 / unique if unique else 0.0,
        "crashes": errors_of(results + loaded),
    }


# ============================================================== rows


@contextlib.contextmanager
def pure_python(pure: bool) -> Iterator[None]:
    """With ``pure``: the processes started inside (the broker, the load) load every hot module from its
    source (``MC0_PURE_PYTHON=1``, which a spawned process reads from the environment it inherits)."""
    if not pure:
        yield
        return
    before = os.environ.get(native.PURE_ENV)
    os.environ[native.PURE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(native.PURE_ENV, None)
        else:
            os.environ[native.PURE_ENV] = before


def measure_row(spec: dict[str, Any], system_name: str, options: Options, curve: dict[str, Any]) -> Row:
    """``system_name``: a system, or ``system@tree`` (its load processes import that client tree's mc0),
    ``+pure`` at the end: on the pure build (:func:`pure_python`)."""
    latency = bool(spec.get("latency"))
    row = Row(spec["name"], system_name, spec["unit"], suite="library", lower_is_better=latency)
    system, tree_name = split_system(system_name.removesuffix(PURE))
    pure = system_name.endswith(PURE)
    tree = dict(options.client_trees)[tree_name] if tree_name else None
    reason = None if system.startswith("mc0") else available(system)
    if reason:
        row.note = f"skipped: {reason}"
        return row
    problems: list[str] = []
    try:
        for _ in range(1 if options.quick else options.runs):
            with pure_python(pure), target(system, curve, journal=spec["kind"] == "consumer") as where:
                if spec["kind"] == "group":
                    got = group_once(system, where, spec, options, tree)
                    row.add_counts(
                        published=got["published"],
                        expected=got["expected"],
                        delivered=got["delivered"],
                        lost=got["lost"],
                        duplicates=got["duplicates"],
                        client_dropped=got["client_dropped"],
                        errors=len(got["crashes"]) + got["duplicates"],  # more than once is a failure too
                    )
                    problems += got["crashes"]
                    if got["shares"]:
                        row.add_extra("member_share_min", got["shares"][0] / max(1, got["delivered"]))
                    if "publish_msgs_per_s" in got:
                        row.add_extra("publish_msgs_per_s", got["publish_msgs_per_s"])
                elif spec["kind"] == "consumer":
                    got = consumer_once(system, where, spec)
                    row.add_counts(
                        published=got["published"],
                        expected=got["expected"],
                        delivered=got["delivered"],
                        lost=got["lost"],
                        redelivered=got["redelivered"],
                        duplicates=got["duplicates"],
                        unacked=got["unacked"],
                        errors=len(got["crashes"]) + got["unacked"],  # an ack the server never counted fails
                    )
                    problems += got["crashes"]
                elif spec["kind"] == "rpc":
                    got = rpc_once(system, where, spec, tree)
                    row.add_counts(calls=got["calls"], errors=got["errors"] + len(got["crashes"]))
                    problems += got["crashes"] + got["error_texts"]
                else:
                    got = pubsub_once(system, where, spec, options, tree)
                    row.add_counts(
                        published=got["published"],
                        expected=got["expected"],
                        delivered=got["delivered"],
                        lost=got["lost"],
                        client_dropped=got["client_dropped"],
                        errors=len(got["crashes"]),
                    )
                    problems += got["crashes"]
                    for name in ("publish_msgs_per_s", "e2e_deliveries_per_s"):
                        if name in got:
                            row.add_extra(name, got[name])
            row.values.append(got["p50_ms"] if latency else got["rate"])
            for name in ("p50_ms", "p99_ms", "broker_us_per_msg", *CLIENT_CPU):
                if name in got:
                    row.add_extra(name, got[name])
    except Exception as exc:  # a broken run is reported, not fatal (and the row fails)
        problems.append(f"failed: {type(exc).__name__}: {exc}")
        row.add_counts(errors=1)
    notes = []
    if row.counts.get("lost"):
        notes.append(f"LOSS {row.counts['lost']}")
    if row.counts.get("errors"):
        notes.append(f"ERRORS {row.counts['errors']}")
    for name in ("duplicates", "unacked", "redelivered"):
        if row.counts.get(name):
            notes.append(f"{name} {row.counts[name]}")
    notes += list(dict.fromkeys(problems))[:2]
    row.note = "; ".join(notes)[:300]
    return row


def measure_pair(
    spec: dict[str, Any], options: Options, curve: dict[str, Any], systems: list[str] | None = None
) -> dict[str, Row]:
    """The console rows (and every row with ``--client-tree``): a run of each system in turn, the
    order swapped every run, so all see the same machine (a box whose load drifts would otherwise
    favour whichever went first)."""
    rows: dict[str, Row] = {}
    once = dataclasses.replace(options, runs=1)
    systems = spec["systems"] if systems is None else systems
    for run in range(1 if options.quick else options.runs):
        for system in systems if run % 2 == 0 else reversed(systems):
            got = measure_row(spec, system, once, curve)
            latency = bool(spec.get("latency"))
            row = rows.setdefault(
                system, Row(spec["name"], system, spec["unit"], suite="library", lower_is_better=latency)
            )
            row.values += got.values
            for name, values in got.extra.items():
                row.extra.setdefault(name, []).extend(values)
            row.add_counts(**got.counts)
            row.note = "; ".join(n for n in (row.note, got.note) if n)[:300]
    return rows


def systems_of(spec: dict[str, Any], options: Options) -> list[str]:
    """The spec's systems that were asked for, each mc0 one followed by its ``@tree`` variants and,
    with ``--pure``, its pure-build variant."""
    out = []
    for system in spec["systems"]:
        if not options.wants_system(system):
            continue
        out.append(system)
        if system in TREE_SYSTEMS and spec["kind"] != "consumer":
            out += [f"{system}@{name}" for name, _ in options.client_trees]
        if options.pure and system.startswith("mc0") and system not in CONSOLE_SYSTEMS:
            out.append(system + PURE)
    return out


def run_library(options: Options, curve: dict[str, Any], say: Callable[[str], None] = print) -> list[Row]:
    rows = []
    for spec in scenarios(options):
        if not options.wants(spec["name"]) or options.suite not in ("all", "library", family(spec)):
            continue
        systems = systems_of(spec, options)
        paired_runs = bool(options.client_trees or options.pure) and len(systems) > 1
        interleaved = spec["systems"] is CONSOLE_SYSTEMS or paired_runs
        paired = measure_pair(spec, options, curve, systems) if interleaved else {}
        for system in systems:
            started = time.monotonic()
            row = paired[system] if paired else measure_row(spec, system, options, curve)
            rows.append(row)
            extra = ""
            if row.counts.get("expected") is not None:
                extra = f" delivered {row.counts.get('delivered', 0):,}/{row.counts.get('expected', 0):,}"
            if row.extra.get("broker_us_per_msg"):
                extra += f" broker {statistics.median(row.extra['broker_us_per_msg']):.1f} us/msg"
            for name in CLIENT_CPU:
                if row.extra.get(name):
                    extra += f" {name.split('_')[0]} {statistics.median(row.extra[name]):.2f}"
            say(
                f"  {spec['name']:<34} {system:<14} {row.median:>12,.1f} {spec['unit']}{extra}"
                f" ({time.monotonic() - started:.0f} s) {row.note}"
            )
    return rows
