"""Journaled pub/sub beside JetStream capturing the same subjects, and the journal's cost against none (issue 39).

Contract: ``journaled_once(system, where, spec, options)`` runs one measurement
of the ``lib journaled pub/sub 1->1`` row (:mod:`benchmarks.library` starts a
fresh broker or nats-server per run and interleaves the systems run by run):
one publisher process streams ``count`` unconfirmed ``BODY``-byte messages on
``TOPIC`` (``mc0.aio``'s ``publish_nowait``, a ``flush`` every
``FLUSH_EVERY``; nats-py's ``publish``, a ``flush`` every ``FLUSH_EVERY``)
and one subscriber process on ``SUBJECTS`` counts them.  Systems:

- ``mc0-aio+journal``: a broker with a file journal on ``>`` at the default
  ``fsync = "batch"`` (``JOURNAL_TOML``), which stores every message;
- ``mc0-aio``: the same broker without the journal (what the journal costs);
- ``jetstream``: nats-server ``-js`` with a file stream on ``SUBJECTS`` at its
  default sync (captures the core publishes), a core subscriber;
- ``…@NAME``: the mc0 systems with the broker run from another checkout
  (``--broker-tree NAME=PATH``: before/after a change, in the same invocation).

A run fails (``errors``) unless the store holds exactly what was published
(the journal's ``next_seq``, the stream's ``state.messages``); ``lost`` counts
what the subscriber never got.  Beside the rate: the broker's CPU per
delivered message (every thread, and its loop thread alone, ``loop_us_per_msg``), and the
subscriber's and publisher's own (``sub_us_per_msg``, ``pub_us_per_msg``).

``cli_once`` runs the issue's other row: ``mc0 bench --pub 1 --sub 1 --msgs N``
(the CLI, this checkout's) against a broker run with the README's sample
``mc0 config sample journal.toml`` (CURVE on, a journal on every topic), or the
same sample without its journal (``mc0 bench`` system), and reads the delivery
rate the CLI prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mc0.process import BrokerProcess

from .library_load import Child, Link, Quiet, guarded

SUBJECTS = "jb.>"
TOPIC = "jb.load"
FLUSH_EVERY = 5_000
JOURNAL = "all"
STREAM = "JB"
JOURNALED_SYSTEMS = ["mc0-aio+journal", "mc0-aio", "jetstream"]
CLI_SYSTEMS = ["mc0 bench+journal", "mc0 bench"]


def journal_toml(folder: str) -> str:
    """A journal on every topic, fsync at its default (``batch``), no size bound (nothing trimmed mid-run)."""
    return f'[journals.{JOURNAL}]\ntopics = [">"]\nfolder = "{folder}"\nmax_bytes = 0\n'


def broker_env(tree: str | None) -> dict[str, str] | None:
    """The environment of a broker run from checkout ``tree`` (its mc0 first on the path); None: this one's."""
    if tree is None:
        return None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH", "")) if p)
    return env


# ============================================================== load processes


def aio_subscriber(endpoint: str, options: dict[str, Any], expected: int, limit_s: float, link: Link) -> None:
    guarded("sub", link, lambda c: asyncio.run(_aio_subscriber(c, endpoint, options, expected, limit_s)))


async def _aio_subscriber(child: Child, endpoint: str, options: dict[str, Any], expected: int, limit_s: float) -> None:
    import mc0.aio

    count = first = last = 0
    try:
        async with mc0.aio.Client(endpoint, **options) as client:
            sub = await client.subscribe(SUBJECTS)
            quiet = Quiet(child.link.done, limit_s)

            async def watch() -> None:  # ends the iteration below if messages stop coming
                while not quiet.expired(count):
                    await asyncio.sleep(0.1)
                await sub.close()

            watchdog = asyncio.create_task(watch())
            child.ready()
            async for batch in sub.batches(max=10_000):
                now = time.monotonic_ns()
                if not count:
                    first = now
                count += len(batch)
                last = now
                if count >= expected:
                    break
            watchdog.cancel()
            child.out["stopped"] = quiet.reason
            child.out["client_dropped"] = getattr(sub, "dropped", 0)
    finally:
        child.out.update(delivered=count, first_ns=first, last_ns=last)


def aio_publisher(endpoint: str, options: dict[str, Any], count: int, size: int, link: Link) -> None:
    guarded("pub", link, lambda c: asyncio.run(_aio_publisher(c, endpoint, options, count, size)))


async def _aio_publisher(child: Child, endpoint: str, options: dict[str, Any], count: int, size: int) -> None:
    import mc0.aio

    body = b"x" * size
    sent = 0
    try:
        async with mc0.aio.Client(endpoint, **options) as client:
            child.ready()
            await asyncio.get_running_loop().run_in_executor(None, child.wait_go)
            started = child.out["started_ns"] = time.monotonic_ns()
            for _ in range(count):
                client.publish_nowait(TOPIC, body)
                sent += 1
                if sent % FLUSH_EVERY == 0:
                    await client.flush(timeout=120)
            await client.flush(timeout=120)  # the broker has every message
            child.out["publish_s"] = (time.monotonic_ns() - started) / 1e9
    finally:
        child.out["published"] = sent
        child.link.done.set()


def nats_subscriber(url: str, options: dict[str, Any], expected: int, limit_s: float, link: Link) -> None:
    guarded("sub", link, lambda c: asyncio.run(_nats_subscriber(c, url, expected, limit_s)))


async def _nats_subscriber(child: Child, url: str, expected: int, limit_s: float) -> None:
    import nats
    import nats.errors

    count = first = last = 0
    dropped = 0

    async def on_error(exc: Exception) -> None:
        nonlocal dropped
        if isinstance(exc, nats.errors.SlowConsumerError):
            dropped += 1

    nc = await nats.connect(url, error_cb=on_error)
    try:
        finished = asyncio.Event()

        async def on_message(msg: Any) -> None:
            nonlocal count, first, last
            now = time.monotonic_ns()
            if not count:
                first = now
            count += 1
            last = now
            if count >= expected:
                finished.set()

        await nc.subscribe(SUBJECTS, cb=on_message)
        await nc.flush()  # the server has the subscription
        quiet = Quiet(child.link.done, limit_s)
        child.ready()
        while not finished.is_set() and not quiet.expired(count):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), 0.1)
        child.out["stopped"] = quiet.reason
        child.out["client_dropped"] = dropped
    finally:
        child.out.update(delivered=count, first_ns=first, last_ns=last)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)


def nats_publisher(url: str, options: dict[str, Any], count: int, size: int, link: Link) -> None:
    guarded("pub", link, lambda c: asyncio.run(_nats_publisher(c, url, count, size)))


async def _nats_publisher(child: Child, url: str, count: int, size: int) -> None:
    import nats

    body = b"x" * size
    sent = 0
    nc = await nats.connect(url)
    try:
        child.ready()
        await asyncio.get_running_loop().run_in_executor(None, child.wait_go)
        started = child.out["started_ns"] = time.monotonic_ns()
        for _ in range(count):
            await nc.publish(TOPIC, body)
            sent += 1
            if sent % FLUSH_EVERY == 0:
                await nc.flush(timeout=120)
        await nc.flush(timeout=120)  # the server has every message
        child.out["publish_s"] = (time.monotonic_ns() - started) / 1e9
    finally:
        child.out["published"] = sent
        child.link.done.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)


# ============================================================== what the stores hold


async def create_stream(url: str) -> None:
    """The stream capturing ``SUBJECTS`` (file storage, nats-server's default sync)."""
    import nats
    from nats.js.api import StorageType

    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(name=STREAM, subjects=[SUBJECTS], storage=StorageType.FILE)
    finally:
        await nc.close()


async def stream_stored(url: str, published: int) -> int:
    """What the stream holds, once it holds ``published`` or stopped growing (it stores behind the publisher)."""
    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        stored, deadline = -1, time.monotonic() + 60
        while time.monotonic() < deadline:
            now = (await js.stream_info(STREAM)).state.messages
            if now >= published or now == stored:
                return int(now)
            stored = now
            await asyncio.sleep(0.5)
        return int(stored)
    finally:
        await nc.close()


async def journal_stored(endpoint: str, options: dict[str, Any], journal: str = JOURNAL) -> int:
    """How many records the journal holds (a fresh broker per run: its first seq is 1)."""
    import mc0.aio

    async with mc0.aio.Client(endpoint, timeout=30, **options) as client:
        info = (await client.journal_info())[journal]
    return int(info["next_seq"]) - int(info["first_seq"])


def thread_seconds(pid: int) -> dict[int, float]:
    """Each thread's CPU time (user + system) so far; {} once the process is gone or without psutil."""
    try:
        import psutil  # type: ignore[import-untyped]

        return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}
    except Exception:
        return {}


# ============================================================== one run


def journaled_once(system: str, where: Any, spec: dict[str, Any], crew: Any) -> dict[str, Any]:
    """One publisher, one subscriber through ``where`` (a :class:`benchmarks.library.Target`); ``crew``
    the run's load processes (:class:`benchmarks.library.Crew`)."""
    nats = system == "jetstream"
    sub, pub = (nats_subscriber, nats_publisher) if nats else (aio_subscriber, aio_publisher)
    count = spec["count"]
    limit_s = 60 + count / 2000
    if nats:
        asyncio.run(create_stream(where.endpoint))
    crew.start(sub, where.endpoint, where.options, count, limit_s)
    crew.start(pub, where.endpoint, where.options, count, spec["size"])
    crew.wait_ready(2, 90)
    threads = thread_seconds(where.pid)
    crew.link.go.set()
    results = crew.collect({"pub": 1, "sub": 1}, limit_s + 60)
    after = thread_seconds(where.pid)
    publisher: dict[str, Any] = next((r for role, r in results if role == "pub"), {})
    received: dict[str, Any] = next((r for role, r in results if role == "sub"), {})
    published = int(publisher.get("published", 0))
    delivered = int(received.get("delivered", 0))
    if nats:
        stored = asyncio.run(stream_stored(where.endpoint, published))
    elif system.startswith("mc0-aio+journal"):
        stored = asyncio.run(journal_stored(where.endpoint, where.options))
    else:
        stored = published  # (nothing to store)
    span = (received.get("last_ns", 0) - received.get("first_ns", 0)) / 1e9
    cpu = sum(after.get(t, 0.0) - threads.get(t, 0.0) for t in after)
    loop = after.get(where.pid, 0.0) - threads.get(where.pid, 0.0)  # (Linux: the main thread's id is the pid)
    crashes = [f"{role}: {r['error']}" for role, r in results if "error" in r]
    if stored != published:
        crashes.append(f"the store holds {stored:,} of {published:,} published")
    out: dict[str, Any] = {
        "rate": delivered / span if span > 0 else 0.0,
        "published": published,
        "expected": published,
        "delivered": delivered,
        "lost": max(0, published - delivered),
        "stored": stored,
        "client_dropped": int(received.get("client_dropped", 0)),
        "broker_us_per_msg": cpu * 1e6 / delivered if delivered else 0.0,
        "sub_us_per_msg": float(received.get("cpu_s", 0.0)) * 1e6 / delivered if delivered else 0.0,
        "pub_us_per_msg": float(publisher.get("cpu_s", 0.0)) * 1e6 / published if published else 0.0,
        "crashes": crashes,
    }
    if not nats and delivered:
        out["loop_us_per_msg"] = loop * 1e6 / delivered
    if received.get("first_ns") and publisher.get("started_ns"):
        out["e2e_deliveries_per_s"] = delivered / max(1e-9, (received["last_ns"] - publisher["started_ns"]) / 1e9)
    return out


# ============================================================== the CLI row: `mc0 bench` against the README's sample


@contextlib.contextmanager
def sample_broker(journal: bool, tree: str | None) -> Iterator[tuple[str, Path, int]]:
    """The broker the README starts (``mc0 config sample journal.toml``, CURVE on, a client key allowed) on a
    free port; ``journal=False``: the same file without its journal.  Yields (endpoint, folder, pid)."""
    from mc0 import keys as keyfiles

    with tempfile.TemporaryDirectory(prefix="mc0-bench-sample-") as tmp:
        folder = Path(tmp)
        sample = [sys.executable, "-m", "mc0", "config", "sample", "journal.toml", "-o", str(folder / "journal.toml")]
        subprocess.run(sample, check=True, capture_output=True, cwd=tmp)
        if not journal:
            text = (folder / "journal.toml").read_text()
            (folder / "journal.toml").write_text(text.split("[journals.main]")[0])
        keyfiles.create(folder / "keys", "alice")
        (folder / "keys" / "allowed").mkdir(exist_ok=True)
        (folder / "keys" / "allowed" / "alice.key").write_bytes((folder / "keys" / "alice.key").read_bytes())
        broker = BrokerProcess(config=str(folder / "journal.toml"), cwd=tmp, env=broker_env(tree), start_timeout=60.0)
        with broker:
            assert broker.proc is not None
            yield broker.endpoint, folder, broker.proc.pid


DELIVERED = re.compile(r"sub: 1 subscriber\(s\), ([\d,]+) msgs delivered: ([\d,]+) msg/s")


def cli_once(system: str, tree: str | None, client_tree: str | None, msgs: int) -> dict[str, Any]:
    """``mc0 bench --pub 1 --sub 1 --msgs N`` (this checkout's CLI, or ``client_tree``'s) against the README's
    sample broker (run from ``tree``, or this checkout)."""
    journal = system.startswith("mc0 bench+journal")
    with sample_broker(journal, tree) as (endpoint, folder, pid):
        secret, public = str(folder / "keys" / "alice.key_secret"), str(folder / "keys" / "broker.key")
        keys = ["--key", secret, "--broker-key", public]
        command = [sys.executable, "-m", "mc0", "bench", "--endpoint", endpoint, *keys,
                   "--pub", "1", "--sub", "1", "--msgs", str(msgs), "--timeout", "60"]  # fmt: skip
        threads = thread_seconds(pid)
        env = broker_env(client_tree)
        done = subprocess.run(command, capture_output=True, text=True, timeout=120 + msgs / 1000, cwd=folder, env=env)
        after = thread_seconds(pid)
        found = DELIVERED.search(done.stdout)
        crashes = [] if done.returncode == 0 and found else [f"mc0 bench: {(done.stdout + done.stderr)[-300:]}"]
        delivered = int(found.group(1).replace(",", "")) if found else 0
        stored = msgs
        if journal:
            stored = asyncio.run(journal_stored(endpoint, {"key": secret, "broker_key": public}, "main"))
            if stored != msgs:
                crashes.append(f"the journal holds {stored:,} of {msgs:,} published")
    cpu = sum(after.get(t, 0.0) - threads.get(t, 0.0) for t in after)
    return {
        "rate": float(found.group(2).replace(",", "")) if found else 0.0,
        "published": msgs,
        "expected": msgs,
        "delivered": delivered,
        "lost": max(0, msgs - delivered),
        "stored": stored,
        "broker_us_per_msg": cpu * 1e6 / delivered if delivered else 0.0,
        "loop_us_per_msg": (after.get(pid, 0.0) - threads.get(pid, 0.0)) * 1e6 / delivered if delivered else 0.0,
        "crashes": crashes,
    }
