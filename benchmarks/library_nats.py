"""Library load for the baselines: nats-py against nats-server, and majortomo's own Client and Worker.

Contract: the same roles and results as :mod:`benchmarks.library_mc0`, with
each library's public API at its defaults: ``nats.connect`` /
``publish`` / ``subscribe`` with a callback (default pending limits; a
dropped message is counted from the ``SlowConsumerError``s nats-py reports)
/ ``request`` / queue-group responders that ``msg.respond``; scatter-gather
is a publish to a subject with every responder subscribed and 10 replies
gathered on an inbox.  The publisher's marker is followed by a ``flush``
(a PING/PONG: the server has everything).  Majordomo (MDP/0.2) has one
request in flight per client: ``window`` clients, each sending one request,
then each reading its reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from .common import BODY
from .library_load import (
    MARKER,
    MAX_CALLS,
    SCATTER_SUBJECT,
    SERVICE,
    TOPIC,
    Child,
    Link,
    Quiet,
    Tally,
    guarded,
    schedule,
    stamped,
)
from .library_mc0 import rpc_report

# ============================================================== NATS


def nats_subscriber(
    url: str, options: dict[str, Any], expected: int, latency: bool, limit_s: float, quiet_s: float, link: Link
) -> None:
    guarded("sub", link, lambda c: asyncio.run(_nats_subscriber(c, url, expected, latency, limit_s, quiet_s)))


async def _nats_subscriber(
    child: Child, url: str, expected: int, latency: bool, limit_s: float, quiet_s: float
) -> None:
    import nats
    import nats.errors

    tally = Tally(expected, latency)
    dropped = 0

    async def on_error(exc: Exception) -> None:
        nonlocal dropped
        if isinstance(exc, nats.errors.SlowConsumerError):
            dropped += 1

    nc = await nats.connect(url, error_cb=on_error)
    try:
        finished = asyncio.Event()

        async def on_message(msg: Any) -> None:
            body = msg.data
            if body == MARKER:
                child.out["marker"] = True
                finished.set()
            elif tally.add(body):
                finished.set()

        await nc.subscribe(TOPIC, cb=on_message)
        await nc.flush()  # the server has the subscription
        quiet = Quiet(child.link.done, limit_s, quiet_s)
        child.ready()
        while not finished.is_set() and not quiet.expired(tally.count):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), 0.1)
        child.out["stopped"] = quiet.reason
        child.out["client_dropped"] = dropped
    finally:
        tally.report(child.out)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)


def nats_publisher(url: str, options: dict[str, Any], count: int, size: int, rate: int, link: Link) -> None:
    guarded("pub", link, lambda c: asyncio.run(_nats_publisher(c, url, count, size, rate)))


async def _nats_publisher(child: Child, url: str, count: int, size: int, rate: int) -> None:
    import nats

    body = b"x" * size
    sent = 0
    nc = await nats.connect(url)
    try:
        child.ready()
        await asyncio.get_running_loop().run_in_executor(None, child.wait_go)
        started = child.out["started_ns"] = time.monotonic_ns()
        if rate:
            _, interval = schedule(rate, 1.0)
            hard = started + int((count * interval) * 3 + 10e9)
            while sent < count:
                now = time.monotonic_ns()
                due = started + sent * interval
                if now < due:
                    await asyncio.sleep((due - now) / 1e9)
                    continue
                if now > hard:
                    break
                await nc.publish(TOPIC, stamped(body))  # nats-py's flusher task writes it at the next await
                sent += 1
        else:
            for _ in range(count):
                await nc.publish(TOPIC, body)
                sent += 1
        child.out["publish_s"] = (time.monotonic_ns() - started) / 1e9
        await nc.publish(TOPIC, MARKER)
        await nc.flush(timeout=120)  # the server has every message
        child.out["confirmed_s"] = (time.monotonic_ns() - started) / 1e9
    finally:
        child.out["published"] = sent
        child.link.done.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)


def nats_responder(url: str, options: dict[str, Any], scatter: int, link: Link) -> None:
    guarded("worker", link, lambda c: asyncio.run(_nats_responder(c, url, scatter)), report=False)


async def _nats_responder(child: Child, url: str, scatter: int) -> None:
    import nats

    nc = await nats.connect(url)

    async def answer(msg: Any) -> None:
        await msg.respond(msg.data)

    if scatter:
        await nc.subscribe(SCATTER_SUBJECT, cb=answer)  # every responder answers
    else:
        await nc.subscribe(SERVICE, queue="bench-workers", cb=answer)  # one responder per request
    await nc.flush()
    child.ready()
    await asyncio.Event().wait()  # until the harness kills this process


def nats_rpc_client(url: str, options: dict[str, Any], window: int, seconds: float, scatter: int, link: Link) -> None:
    guarded("client", link, lambda c: asyncio.run(_nats_rpc_client(c, url, window, seconds, scatter)))


async def _nats_rpc_client(child: Child, url: str, window: int, seconds: float, scatter: int) -> None:
    import nats

    body = b"x" * BODY
    latencies: list[int] = []
    errors: list[str] = []
    nc = await nats.connect(url)

    async def gather_all() -> None:  # NATS has no scatter-gather: an inbox, a publish, count the replies
        inbox = nc.new_inbox()
        got = asyncio.get_running_loop().create_future()
        replies = 0

        async def on_reply(msg: Any) -> None:
            nonlocal replies
            replies += 1
            if replies == scatter and not got.done():
                got.set_result(None)

        sub = await nc.subscribe(inbox, cb=on_reply)
        try:
            await nc.publish(SCATTER_SUBJECT, body, reply=inbox)
            await asyncio.wait_for(got, 10)
        finally:
            await sub.unsubscribe()

    try:
        child.ready()
        await asyncio.get_running_loop().run_in_executor(None, child.wait_go)
        end = time.monotonic() + seconds

        async def lane() -> None:
            while time.monotonic() < end and len(latencies) + len(errors) < MAX_CALLS:
                began = time.perf_counter_ns()
                try:
                    if scatter:
                        await gather_all()
                    else:
                        await nc.request(SERVICE, body, timeout=30)
                except Exception as exc:  # counted and reported; the load goes on
                    errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                latencies.append(time.perf_counter_ns() - began)

        started = time.perf_counter_ns()
        await asyncio.gather(*(lane() for _ in range(window)))
        child.out["seconds"] = (time.perf_counter_ns() - started) / 1e9
    finally:
        rpc_report(child, latencies, errors)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)


# ============================================================== Majordomo (majortomo)


def majortomo_worker(endpoint: str, options: dict[str, Any], scatter: int, link: Link) -> None:
    def body(child: Child) -> None:
        from majortomo import Worker

        with Worker(endpoint, SERVICE.encode()) as worker:  # connects and sends READY
            child.ready()
            while True:  # until the harness kills this process
                client, frames = worker.wait_for_request()
                worker.send_reply_final(client, frames)

    guarded("worker", link, body, report=False)


def majortomo_client(
    endpoint: str, options: dict[str, Any], window: int, seconds: float, scatter: int, link: Link
) -> None:
    guarded("client", link, lambda c: _majortomo_client(c, endpoint, window, seconds))


def _majortomo_client(child: Child, endpoint: str, window: int, seconds: float) -> None:
    from majortomo import Client

    body = b"x" * BODY
    latencies: list[int] = []
    errors: list[str] = []
    clients = [Client(endpoint) for _ in range(window)]
    try:
        for client in clients:
            client.connect()
        child.ready()
        child.wait_go()
        end = time.monotonic() + seconds
        started = time.perf_counter_ns()
        while time.monotonic() < end and len(latencies) + len(errors) < MAX_CALLS:
            sent = []
            for client in clients:  # `window` requests outstanding at once, one per client
                sent.append(time.perf_counter_ns())
                client.send(SERVICE.encode(), body)
            for client, began in zip(clients, sent, strict=True):
                try:
                    client.recv_all_as_list(timeout=30)
                except Exception as exc:  # counted; the client starts afresh
                    errors.append(f"{type(exc).__name__}: {exc}")
                    client.connect(reconnect=True)
                    continue
                latencies.append(time.perf_counter_ns() - began)
        child.out["seconds"] = (time.perf_counter_ns() - started) / 1e9
    finally:
        rpc_report(child, latencies, errors)
        for client in clients:
            client.close()  # type: ignore[no-untyped-call]
