"""Library load for queue groups and durable consumers: mc0.aio beside nats-py (core NATS and JetStream).

Contract: the same roles and :class:`~benchmarks.library_load.Link` as
:mod:`benchmarks.library_mc0`, one role per spawned process, each library's
public API at its defaults unless said here.

Queue groups: a publisher sends ``count`` numbered bodies (the index in the
first 8 bytes) as fast as ``publish`` lets it, then a confirmed (mc0) or
flushed (NATS) marker; each group member (mc0 ``subscribe(TOPIC,
group=GROUP)``, nats-py ``subscribe(TOPIC, queue=GROUP)``) reports the
indices it got, so the harness can check every message reached exactly one
member.  Members stop ``quiet_s`` after the publisher finished and nothing
more came (the marker reaches one member only).

Durable consumers: a loader puts ``count`` messages into a journal (mc0:
``[journals.bench]`` on ``JOB_TOPIC``, the last PUT confirmed, so all are
stored) or a JetStream file stream (core publishes, then the stream's count
polled), creates the consumer and exits; then each consumer client fetches
batches of ``BATCH`` and settles them (``ack``): ``each`` acks every message
without waiting (mc0 ``message.ack_nowait()``, which sends the acks of one
loop turn as one request; nats-py ``msg.ack()``, a publish the server does
not answer, coalesced by its flusher), ``each-sync`` awaits one answered ack
per message (mc0 ``message.ack()``, answered once the broker saved the
state; nats-py ``msg.ack_sync()``), ``batch``
settles the batch at once (mc0 ``consumer.ack(*batch)``, one request;
nats-py has no batch ack: the JetStream consumer is created with
``AckPolicy.ALL`` and the batch's last message is acked, which settles every
earlier one — right for one client only).  Each consumer reports the journal
sequence numbers it got, redeliveries, its first fetch and last settle times,
and at the end how many messages the server counts as acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from .library_load import MARKER, TOPIC, Child, Link, Quiet, guarded

GROUP = "bench-group"
JOURNAL = "bench"  # mc0 journal name (see ``journal_toml``)
STREAM = "BENCH"  # JetStream stream name
CONSUMER = "bench"  # durable consumer name on both
JOB_TOPIC = "bench.jobs"
BATCH = 100  # messages per fetch
IDLE_PULLS = 3  # a consumer stops after this many empty pulls in a row ...
PULL_WAIT = 0.2  # ... each waiting this long for the first message
ACK_WAIT = 30.0  # seconds: longer than any run, so nothing is redelivered unless a client fails


def journal_toml(folder: str) -> str:
    """The mc0 broker config section holding the consumers' journal (fsync at its default, ``batch``)."""
    return f'[journals.{JOURNAL}]\ntopics = ["{JOB_TOPIC}"]\nfolder = "{folder}"\nmax_bytes = 0\n'


def numbered(index: int, size: int) -> bytes:
    return index.to_bytes(8, "little") + b"x" * max(0, size - 8)


class Seen:
    """A group member's tally: the indices it got, first and last arrival."""

    def __init__(self) -> None:
        self.indices: list[int] = []
        self.first = 0
        self.last = 0

    def add(self, body: bytes) -> None:
        now = time.monotonic_ns()
        if not self.indices:
            self.first = now
        self.last = now
        self.indices.append(int.from_bytes(body[:8], "little"))

    def report(self, out: dict[str, Any]) -> None:
        out.update(delivered=len(self.indices), indices=self.indices, first_ns=self.first, last_ns=self.last)


# ============================================================== queue groups: mc0.aio


def aio_group_member(endpoint: str, options: dict[str, Any], limit_s: float, quiet_s: float, link: Link) -> None:
    guarded("sub", link, lambda c: asyncio.run(_aio_group_member(c, endpoint, options, limit_s, quiet_s)))


async def _aio_group_member(
    child: Child, endpoint: str, options: dict[str, Any], limit_s: float, quiet_s: float
) -> None:
    import mc0.aio

    seen = Seen()
    try:
        async with mc0.aio.Client(endpoint, **options) as client:
            sub = await client.subscribe(TOPIC, group=GROUP)  # returns once the broker confirmed it
            quiet = Quiet(child.link.done, limit_s, quiet_s)

            async def watch() -> None:  # ends the iteration below once the stream went quiet
                while not quiet.expired(len(seen.indices)):
                    await asyncio.sleep(0.05)
                await sub.close()

            watchdog = asyncio.create_task(watch())
            child.ready()
            async for message in sub:
                if message.body != MARKER:
                    seen.add(message.body)
            watchdog.cancel()
            child.out["stopped"] = quiet.reason
            child.out["client_dropped"] = getattr(sub, "dropped", 0)
    finally:
        seen.report(child.out)


def aio_numbered_publisher(endpoint: str, options: dict[str, Any], count: int, size: int, link: Link) -> None:
    guarded("pub", link, lambda c: asyncio.run(_aio_numbered_publisher(c, endpoint, options, count, size)))


async def _aio_numbered_publisher(child: Child, endpoint: str, options: dict[str, Any], count: int, size: int) -> None:
    import mc0.aio

    sent = 0
    try:
        async with mc0.aio.Client(endpoint, **options) as client:
            child.ready()
            await asyncio.get_running_loop().run_in_executor(None, child.wait_go)
            started = child.out["started_ns"] = time.monotonic_ns()
            for index in range(count):
                await client.publish(TOPIC, numbered(index, size))
                sent += 1
            child.out["publish_s"] = (time.monotonic_ns() - started) / 1e9
            await client.publish(TOPIC, MARKER, confirm=True, timeout=120)  # the broker has every message
    finally:
        child.out["published"] = sent
        child.link.done.set()


# ============================================================== queue groups: nats-py


def nats_group_member(url: str, options: dict[str, Any], limit_s: float, quiet_s: float, link: Link) -> None:
    guarded("sub", link, lambda c: asyncio.run(_nats_group_member(c, url, limit_s, quiet_s)))


async def _nats_group_member(child: Child, url: str, limit_s: float, quiet_s: float) -> None:
    import nats
    import nats.errors

    seen = Seen()
    dropped = 0

    async def on_error(exc: Exception) -> None:
        nonlocal dropped
        if isinstance(exc, nats.errors.SlowConsumerError):
            dropped += 1

    nc = await nats.connect(url, error_cb=on_error)
    try:

        async def on_message(msg: Any) -> None:
            if msg.data != MARKER:
                seen.add(msg.data)

        await nc.subscribe(TOPIC, queue=GROUP, cb=on_message)
        await nc.flush()  # the server has the subscription
        quiet = Quiet(child.link.done, limit_s, quiet_s)
        child.ready()
        while not quiet.expired(len(seen.indices)):
            await asyncio.sleep(0.05)
        child.out["stopped"] = quiet.reason
        child.out["client_dropped"] = dropped
    finally:
        seen.report(child.out)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)


def nats_numbered_publisher(url: str, options: dict[str, Any], count: int, size: int, link: Link) -> None:
    guarded("pub", link, lambda c: asyncio.run(_nats_numbered_publisher(c, url, count, size)))


async def _nats_numbered_publisher(child: Child, url: str, count: int, size: int) -> None:
    import nats

    sent = 0
    nc = await nats.connect(url)
    try:
        child.ready()
        await asyncio.get_running_loop().run_in_executor(None, child.wait_go)
        started = child.out["started_ns"] = time.monotonic_ns()
        for index in range(count):
            await nc.publish(TOPIC, numbered(index, size))
            sent += 1
        child.out["publish_s"] = (time.monotonic_ns() - started) / 1e9
        await nc.publish(TOPIC, MARKER)
        await nc.flush(timeout=120)  # the server has every message
    finally:
        child.out["published"] = sent
        child.link.done.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)


# ============================================================== durable consumers: shared


class Pulled:
    """A consumer client's tally: sequence numbers got, redeliveries, first fetch and last settle."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.redelivered = 0
        self.first = 0
        self.last = 0

    def report(self, out: dict[str, Any]) -> None:
        out.update(delivered=len(self.seqs), seqs=self.seqs, redelivered=self.redelivered)
        out.update(first_ns=self.first, last_ns=self.last)


# ============================================================== durable consumers: mc0.aio


def aio_journal_loader(endpoint: str, options: dict[str, Any], count: int, size: int, ack: str, link: Link) -> None:
    guarded("pub", link, lambda c: asyncio.run(_aio_journal_loader(c, endpoint, options, count, size)))


async def _aio_journal_loader(child: Child, endpoint: str, options: dict[str, Any], count: int, size: int) -> None:
    import mc0.aio

    body = b"x" * size
    sent = 0
    try:
        async with mc0.aio.Client(endpoint, **options) as client:
            await client.consume(JOURNAL, CONSUMER, topics=[JOB_TOPIC], ack_wait=ACK_WAIT)
            for _ in range(count - 1):
                await client.publish(JOB_TOPIC, body)
                sent += 1
            await client.publish(JOB_TOPIC, body, confirm=True, timeout=120)  # every earlier PUT is stored too
            sent += 1
    finally:
        child.out["published"] = sent


def aio_consumer(endpoint: str, options: dict[str, Any], expected: int, ack: str, limit_s: float, link: Link) -> None:
    guarded("consumer", link, lambda c: asyncio.run(_aio_consumer(c, endpoint, options, expected, ack, limit_s)))


async def _aio_consumer(
    child: Child, endpoint: str, options: dict[str, Any], expected: int, ack: str, limit_s: float
) -> None:
    import mc0.aio

    pulled = Pulled()
    try:
        async with mc0.aio.Client(endpoint, **options) as client:
            consumer = await client.consume(JOURNAL, CONSUMER, topics=[JOB_TOPIC], ack_wait=ACK_WAIT)
            child.ready()
            await asyncio.get_running_loop().run_in_executor(None, child.wait_go)
            pulled.first = time.monotonic_ns()
            hard = time.monotonic() + limit_s
            idle = 0
            while idle < IDLE_PULLS and len(pulled.seqs) < expected and time.monotonic() < hard:
                batch = await consumer.fetch(BATCH, wait=PULL_WAIT)
                if not batch:
                    idle += 1
                    continue
                idle = 0
                pulled.seqs += [m.seq for m in batch]
                pulled.redelivered += sum(m.deliveries > 1 for m in batch)
                if ack == "each":
                    for message in batch:
                        message.ack_nowait()
                    if len(pulled.seqs) >= expected:
                        await consumer.flush_acks()  # the last acks are taken (as nats' flush below)
                elif ack == "each-sync":
                    for message in batch:
                        await message.ack()
                else:
                    await consumer.ack(*batch)
                pulled.last = time.monotonic_ns()
            await consumer.flush_acks()
            child.out["ack_errors"] = consumer.ack_errors
            info = await consumer.info()
            child.out["acked"] = int(info["acked"])
    finally:
        pulled.report(child.out)


# ============================================================== durable consumers: nats-py + JetStream


def js_loader(url: str, options: dict[str, Any], count: int, size: int, ack: str, link: Link) -> None:
    guarded("pub", link, lambda c: asyncio.run(_js_loader(c, url, count, size, ack)))


async def _js_loader(child: Child, url: str, count: int, size: int, ack: str) -> None:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType

    body = b"x" * size
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=STREAM, subjects=[JOB_TOPIC], storage=StorageType.FILE)
        policy = AckPolicy.ALL if ack == "batch" else AckPolicy.EXPLICIT
        config = ConsumerConfig(durable_name=CONSUMER, ack_policy=policy, ack_wait=ACK_WAIT, max_deliver=5)
        await js.add_consumer(STREAM, config)
        for _ in range(count):
            await nc.publish(JOB_TOPIC, body)  # core publishes: the stream captures them
        await nc.flush(timeout=120)
        stored = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the stream has stored them all (or stopped growing)
            stored = (await js.stream_info(STREAM)).state.messages
            if stored >= count:
                break
            await asyncio.sleep(0.05)
        child.out["published"] = stored
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)


def js_consumer(url: str, options: dict[str, Any], expected: int, ack: str, limit_s: float, link: Link) -> None:
    guarded("consumer", link, lambda c: asyncio.run(_js_consumer(c, url, expected, ack, limit_s)))


async def _js_consumer(child: Child, url: str, expected: int, ack: str, limit_s: float) -> None:
    import nats

    pulled = Pulled()
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        psub = await js.pull_subscribe_bind(CONSUMER, stream=STREAM)
        child.ready()
        await asyncio.get_running_loop().run_in_executor(None, child.wait_go)
        pulled.first = time.monotonic_ns()
        hard = time.monotonic() + limit_s
        idle = 0
        while idle < IDLE_PULLS and len(pulled.seqs) < expected and time.monotonic() < hard:
            try:
                batch = await psub.fetch(BATCH, timeout=PULL_WAIT)
            except TimeoutError:  # nats.errors.TimeoutError, or asyncio's when the deadline passed mid-fetch
                idle += 1
                continue
            idle = 0
            for msg in batch:
                pulled.seqs.append(msg.metadata.sequence.stream)
                pulled.redelivered += msg.metadata.num_delivered > 1
            if ack == "each":
                for msg in batch:
                    await msg.ack()
            elif ack == "each-sync":
                for msg in batch:
                    await msg.ack_sync(timeout=30)
            else:
                await batch[-1].ack()  # AckPolicy.ALL: settles every earlier message too
            if len(pulled.seqs) >= expected:
                await nc.flush(timeout=30)  # the last acks reached the server (mc0's acks are answered)
            pulled.last = time.monotonic_ns()
        await nc.flush(timeout=30)
        deadline = time.monotonic() + 5
        acked = 0
        while time.monotonic() < deadline:  # acks are not answered: wait until the consumer shows them
            info = await js.consumer_info(STREAM, CONSUMER)
            acked = int(info.ack_floor.stream_seq) if info.ack_floor else 0
            if not info.num_ack_pending:
                break
            await asyncio.sleep(0.05)
        child.out["acked"] = acked
    finally:
        pulled.report(child.out)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)
