"""One trace across two brokers joined over real nats-server nodes (issue 38): a publish at b1 and its
delivery at b2, and a request at b1 streamed back from a worker at b2, each side with the real
OpenTelemetry SDK's in-memory exporter (tests/test_tracing.py has the one-broker cases)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mc0
import mc0.aio
from mc0 import protocol as P
from mc0.natsproc import NatsCluster

from .clusterbus import ClusterBus, nats_cluster, until
from .conftest import require
from .test_tracing import Side, child_of

require("opentelemetry.sdk")
from opentelemetry.trace import SpanKind  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    yield from nats_cluster(tmp_path_factory.mktemp("nats"), 2)


@pytest.fixture
def bus(tmp_path: Path, nats: NatsCluster) -> Iterator[ClusterBus]:
    with ClusterBus(tmp_path, nats, 2) as joined:  # b1 on the first NATS node, b2 on the second
        joined.wait_joined()
        yield joined


@pytest.mark.asyncio
async def test_one_trace_across_two_brokers_for_a_publish_and_a_streamed_request(bus: ClusterBus) -> None:
    near, far = Side("at b1"), Side("at b2")

    async def report(request: mc0.Request) -> Any:
        with far.tracer.start_as_current_span("render"):
            yield b"page 1"
        yield b"page 2"

    worker = mc0.aio.Worker(bus.endpoint(1), tracer_provider=far.provider)
    worker.service("reports.make")(report)
    publisher = mc0.aio.Client(bus.endpoint(0), tracer_provider=near.provider)
    subscriber = mc0.aio.Client(bus.endpoint(1), tracer_provider=far.provider)
    async with worker, publisher, subscriber:
        subscription = await subscriber.subscribe("orders.>")
        await asyncio.to_thread(until, lambda: bus.interest(0, "orders.eu") == 1, 20, "b1 knows b2's subscriber")
        with near.tracer.start_as_current_span("checkout"):
            await publisher.publish("orders.eu", b"1", confirm=True)
            for _ in range(1000):  # until b1 has heard of b2's worker (bounded: a route's READY is quick)
                try:
                    stream = await publisher.stream("reports.make", b"q", timeout=10)
                    replies = [reply async for reply in stream]
                    break
                except mc0.NoResponders:
                    await asyncio.sleep(0.02)
        message = await subscription.next(timeout=10)
        assert message.sender == "anonymous" and P.trace_id(message.headers) is not None
        await subscription.close()  # (the message's span ends)
    assert [(r.body, r.final) for r in replies] == [(b"page 1", False), (b"page 2", False), (b"", True)]
    assert all(P.trace_id(r.headers) == P.trace_id(message.headers) for r in replies)  # across the route and back
    checkout = near.one("checkout")
    send = near.one("publish orders.eu")
    process = far.one("process orders.eu")
    assert child_of(send, checkout) and child_of(process, send)  # publisher at b1 -> subscriber at b2
    assert (process.attributes or {})["messaging.mc0.sender"] == "anonymous"
    calls = [s for s in near.spans("reports.make") if s.kind is SpanKind.CLIENT]
    call = calls[-1]  # (a NoResponders before b1 heard of the worker is a call too: failed)
    assert all((c.attributes or {})["error.type"] == "503" for c in calls[:-1])
    assert child_of(call, checkout) and (call.attributes or {})["rpc.status_code"] == "200"
    server = far.wait("reports.make")[0]
    assert server.kind is SpanKind.SERVER and child_of(server, call)  # caller at b1 -> worker at b2
    assert child_of(far.one("render"), server)
    assert (server.attributes or {})["messaging.mc0.caller"] == "anonymous"
    trace_ids = {s.context.trace_id for s in (checkout, send, process, call, server, far.one("render"))}
    assert len(trace_ids) == 1
