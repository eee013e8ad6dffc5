"""Library load for mc0: what a user's program does with ``mc0.aio`` and with the sync ``mc0`` API.

Contract: one role per process (started by :mod:`benchmarks.library`), only
the public API: ``Client.publish`` / ``subscribe`` (iterated with ``async
for`` / ``for``) / ``request`` / ``submit`` / ``scatter`` and ``Worker``
with an echo handler (async for ``mc0.aio``, a plain function for ``mc0``).
Subscriptions keep the default ``max_pending``; publishers send as fast as
``publish`` lets them (``rate`` > 0: paced on a deadline schedule, each body
stamped with its send time) and end with a confirmed marker.  ``options``
are the client keyword arguments (CURVE keys for the ``+curve`` rows).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

from .common import BODY
from .library_load import (
    MARKER,
    MAX_CALLS,
    SERVICE,
    TOPIC,
    WORKER_CAPACITY,
    Child,
    Link,
    Quiet,
    Tally,
    guarded,
    schedule,
    stamped,
)

# ============================================================== mc0.aio


def aio_subscriber(
    endpoint: str, options: dict[str, Any], expected: int, latency: bool, limit_s: float, quiet_s: float, link: Link
) -> None:
    guarded(
        "sub", link, lambda c: asyncio.run(_aio_subscriber(c, endpoint, options, expected, latency, limit_s, quiet_s))
    )


async def _aio_subscriber(
    child: Child, endpoint: str, options: dict[str, Any], expected: int, latency: bool, limit_s: float, quiet_s: float
) -> None:
    import mc0.aio

    tally = Tally(expected, latency)
    try:
        async with mc0.aio.Client(endpoint, **options) as client:
            sub = await client.subscribe(TOPIC)
            quiet = Quiet(child.link.done, limit_s, quiet_s)

            async def watch() -> None:  # ends the iteration below if the marker never comes
                while not quiet.expired(tally.count):
                    await asyncio.sleep(0.1)
                await sub.close()

            watchdog = asyncio.create_task(watch())
            child.ready()
            async for message in sub:
                body = message.body
                if body == MARKER:
                    child.out["marker"] = True
                    break
                if tally.add(body):
                    break
            watchdog.cancel()
            child.out["stopped"] = quiet.reason
            child.out["client_dropped"] = getattr(sub, "dropped", 0)
    finally:
        tally.report(child.out)


def aio_publisher(endpoint: str, options: dict[str, Any], count: int, size: int, rate: int, link: Link) -> None:
    guarded("pub", link, lambda c: asyncio.run(_aio_publisher(c, endpoint, options, count, size, rate)))


async def _aio_publisher(
    child: Child, endpoint: str, options: dict[str, Any], count: int, size: int, rate: int
) -> None:
    import mc0.aio

    body = b"x" * size
    sent = 0
    try:
        async with mc0.aio.Client(endpoint, **options) as client:
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
                    await client.publish(TOPIC, stamped(body))
                    sent += 1
            else:
                for _ in range(count):
                    await client.publish(TOPIC, body)
                    sent += 1
            child.out["publish_s"] = (time.monotonic_ns() - started) / 1e9
            await client.publish(TOPIC, MARKER, confirm=True, timeout=120)  # the broker has every message
            child.out["confirmed_s"] = (time.monotonic_ns() - started) / 1e9
    finally:
        child.out["published"] = sent
        child.link.done.set()


def aio_worker(endpoint: str, options: dict[str, Any], scatter: int, link: Link) -> None:
    guarded("worker", link, lambda c: asyncio.run(_aio_worker(c, endpoint, options)), report=False)


async def _aio_worker(child: Child, endpoint: str, options: dict[str, Any]) -> None:
    import mc0.aio

    worker = mc0.aio.Worker(endpoint, capacity=WORKER_CAPACITY, **options)

    @worker.service(SERVICE)
    async def echo(request: Any) -> bytes:
        return bytes(request.body)

    await worker.connect()  # returns once the broker confirmed the service
    child.ready()
    await worker.run()  # until the harness kills this process


def aio_batch_worker(endpoint: str, options: dict[str, Any], scatter: int, link: Link) -> None:
    """The echo service as a batch service (``Worker.batch_service``): the requests that wait, in one call."""
    guarded("worker", link, lambda c: asyncio.run(_aio_batch_worker(c, endpoint, options)), report=False)


async def _aio_batch_worker(child: Child, endpoint: str, options: dict[str, Any]) -> None:
    import mc0.aio

    worker = mc0.aio.Worker(endpoint, capacity=WORKER_CAPACITY, **options)

    @worker.batch_service(SERVICE, max=WORKER_CAPACITY)
    async def echo(requests: list[Any]) -> list[bytes]:
        return [bytes(request.body) for request in requests]

    await worker.connect()
    child.ready()
    await worker.run()


def aio_rpc_client(
    endpoint: str, options: dict[str, Any], window: int, seconds: float, scatter: int, link: Link
) -> None:
    guarded("client", link, lambda c: asyncio.run(_aio_rpc_client(c, endpoint, options, window, seconds, scatter)))


async def _aio_rpc_client(
    child: Child, endpoint: str, options: dict[str, Any], window: int, seconds: float, scatter: int
) -> None:
    import mc0.aio

    body = b"x" * BODY
    latencies: list[int] = []
    errors: list[str] = []

    async def gather_all(client: Any) -> None:
        stream = await client.scatter(SERVICE, body, timeout=10)
        replies = 0
        async for reply in stream:
            replies += reply.error is None
        if replies != scatter:
            raise RuntimeError(f"scatter: {replies} good replies of {scatter}")

    try:
        async with mc0.aio.Client(endpoint, **options) as client:
            child.ready()
            await asyncio.get_running_loop().run_in_executor(None, child.wait_go)
            end = time.monotonic() + seconds

            async def lane() -> None:
                while time.monotonic() < end and len(latencies) + len(errors) < MAX_CALLS:
                    began = time.perf_counter_ns()
                    try:
                        if scatter:
                            await gather_all(client)
                        else:
                            await client.request(SERVICE, body, timeout=30)
                    except Exception as exc:  # counted and reported; the load goes on
                        errors.append(f"{type(exc).__name__}: {exc}")
                        continue
                    latencies.append(time.perf_counter_ns() - began)

            started = time.perf_counter_ns()
            await asyncio.gather(*(lane() for _ in range(window)))
            child.out["seconds"] = (time.perf_counter_ns() - started) / 1e9
    finally:
        rpc_report(child, latencies, errors)


def rpc_report(child: Child, latencies: list[int], errors: list[str]) -> None:
    child.out.update(calls=len(latencies), errors=len(errors), latencies_ns=latencies)
    if errors:
        child.out["first_error"] = errors[0][:300]


# ============================================================== mc0 (sync)


def sync_subscriber(
    endpoint: str, options: dict[str, Any], expected: int, latency: bool, limit_s: float, quiet_s: float, link: Link
) -> None:
    guarded("sub", link, lambda c: _sync_subscriber(c, endpoint, options, expected, latency, limit_s, quiet_s))


def _sync_subscriber(
    child: Child, endpoint: str, options: dict[str, Any], expected: int, latency: bool, limit_s: float, quiet_s: float
) -> None:
    import mc0

    tally = Tally(expected, latency)
    try:
        with mc0.Client(endpoint, **options) as client:
            sub = client.subscribe(TOPIC)
            quiet = Quiet(child.link.done, limit_s, quiet_s)
            finished = threading.Event()

            def watch() -> None:  # ends the iteration below if the marker never comes
                while not finished.wait(0.1):
                    if quiet.expired(tally.count):
                        with contextlib.suppress(Exception):
                            sub.close()
                        return

            watchdog = threading.Thread(target=watch, daemon=True)
            watchdog.start()
            child.ready()
            for message in sub:
                body = message.body
                if body == MARKER:
                    child.out["marker"] = True
                    break
                if tally.add(body):
                    break
            finished.set()
            watchdog.join(5)
            child.out["stopped"] = quiet.reason
            child.out["client_dropped"] = getattr(sub, "dropped", 0)
    finally:
        tally.report(child.out)


def sync_publisher(endpoint: str, options: dict[str, Any], count: int, size: int, rate: int, link: Link) -> None:
    guarded("pub", link, lambda c: _sync_publisher(c, endpoint, options, count, size, rate))


def _sync_publisher(child: Child, endpoint: str, options: dict[str, Any], count: int, size: int, rate: int) -> None:
    import mc0

    body = b"x" * size
    sent = 0
    try:
        with mc0.Client(endpoint, **options) as client:
            child.ready()
            child.wait_go()
            started = child.out["started_ns"] = time.monotonic_ns()
            if rate:
                _, interval = schedule(rate, 1.0)
                hard = started + int((count * interval) * 3 + 10e9)
                while sent < count:
                    now = time.monotonic_ns()
                    due = started + sent * interval
                    if now < due:
                        time.sleep((due - now) / 1e9)
                        continue
                    if now > hard:
                        break
                    client.publish(TOPIC, stamped(body))
                    sent += 1
            else:
                for _ in range(count):
                    client.publish(TOPIC, body)
                    sent += 1
            child.out["publish_s"] = (time.monotonic_ns() - started) / 1e9
            client.publish(TOPIC, MARKER, confirm=True, timeout=120)  # the broker has every message
            child.out["confirmed_s"] = (time.monotonic_ns() - started) / 1e9
    finally:
        child.out["published"] = sent
        child.link.done.set()


def sync_worker(endpoint: str, options: dict[str, Any], scatter: int, link: Link) -> None:
    guarded("worker", link, lambda c: _sync_worker(c, endpoint, options), report=False)


def _sync_worker(child: Child, endpoint: str, options: dict[str, Any]) -> None:
    import mc0

    worker = mc0.Worker(endpoint, capacity=WORKER_CAPACITY, **options)

    @worker.service(SERVICE)
    def echo(request: Any) -> bytes:
        return bytes(request.body)

    worker.connect()  # returns once the broker confirmed the service
    child.ready()
    worker.run()  # until the harness kills this process


def sync_batch_worker(endpoint: str, options: dict[str, Any], scatter: int, link: Link) -> None:
    """The sync twin of :func:`aio_batch_worker`: a plain function, called in the worker's thread pool."""
    guarded("worker", link, lambda c: _sync_batch_worker(c, endpoint, options), report=False)


def _sync_batch_worker(child: Child, endpoint: str, options: dict[str, Any]) -> None:
    import mc0

    worker = mc0.Worker(endpoint, capacity=WORKER_CAPACITY, **options)

    @worker.batch_service(SERVICE, max=WORKER_CAPACITY)
    def echo(requests: list[Any]) -> list[bytes]:
        return [bytes(request.body) for request in requests]

    worker.connect()
    child.ready()
    worker.run()


def sync_rpc_client(
    endpoint: str, options: dict[str, Any], window: int, seconds: float, scatter: int, link: Link
) -> None:
    guarded("client", link, lambda c: _sync_rpc_client(c, endpoint, options, window, seconds, scatter))


def _sync_rpc_client(
    child: Child, endpoint: str, options: dict[str, Any], window: int, seconds: float, scatter: int
) -> None:
    import mc0

    body = b"x" * BODY
    latencies: list[int] = []
    errors: list[str] = []
    try:
        with mc0.Client(endpoint, **options) as client:
            child.ready()
            child.wait_go()
            end = time.monotonic() + seconds
            started = time.perf_counter_ns()
            if window == 1:
                while time.monotonic() < end and len(latencies) + len(errors) < MAX_CALLS:
                    began = time.perf_counter_ns()
                    try:
                        if scatter:
                            replies = sum(reply.error is None for reply in client.scatter(SERVICE, body, timeout=10))
                            if replies != scatter:
                                raise RuntimeError(f"scatter: {replies} good replies of {scatter}")
                        else:
                            client.request(SERVICE, body, timeout=30)
                    except Exception as exc:  # counted and reported; the load goes on
                        errors.append(f"{type(exc).__name__}: {exc}")
                        continue
                    latencies.append(time.perf_counter_ns() - began)
            else:
                _submit_window(client, body, window, end, latencies, errors)
            child.out["seconds"] = (time.perf_counter_ns() - started) / 1e9
    finally:
        rpc_report(child, latencies, errors)


def _submit_window(client: Any, body: bytes, window: int, end: float, latencies: list[int], errors: list[str]) -> None:
    """``window`` futures from ``client.submit`` outstanding; each completed one is replaced until ``end``."""
    finished: queue.SimpleQueue[Future[Any]] = queue.SimpleQueue()
    began: dict[Future[Any], int] = {}

    def submit() -> None:
        started = time.perf_counter_ns()
        future = client.submit(SERVICE, body, timeout=30)
        began[future] = started
        future.add_done_callback(finished.put)  # runs on mc0's loop thread: hands the future over

    for _ in range(window):
        submit()
    while began:
        try:
            future = finished.get(timeout=40)
        except queue.Empty:
            errors += [f"no answer within 40 s ({len(began)} outstanding)"] * len(began)
            return
        now = time.perf_counter_ns()
        started = began.pop(future)
        try:
            future.result()
            latencies.append(now - started)
        except Exception as exc:  # counted and reported; the load goes on
            errors.append(f"{type(exc).__name__}: {exc}")
        if time.monotonic() < end and len(latencies) + len(errors) < MAX_CALLS:
            submit()
