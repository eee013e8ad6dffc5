"""Traces across the bus (issue 38): W3C trace context carried in a message's headers on every path,
and the OpenTelemetry spans the clients, workers and ``mc0 serve`` make, checked with the real SDK.

The wire: the two header names join the user headers in the protocol model (``mc0.protocol.model``),
so every path that carries an ``X-`` header carries them, untouched (the broker never reads them);
an ERROR to a request carries its request's too.  The spans: the SDK's in-memory exporter, one
provider per side (publisher, subscriber, caller, worker), parent/child relations and attributes
checked; a durable consumer's hours-old records are linked, not parented; one test exports through
the real OTLP/HTTP exporter (``mc0 serve`` in a child process) to a receiver here that decodes the
requests with ``opentelemetry-proto``.  The cluster's: tests/test_tracing_cluster.py.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mc0
import mc0.aio
from mc0 import protocol as P
from mc0.process import BrokerProcess
from mc0.tracing import tracing_for

from .conftest import require, write_config

require("opentelemetry.sdk")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

ROOT = Path(__file__).parent.parent
TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE = "0af7651916cd43dd8448eb211c80319c"
OTHER = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
JOURNAL = '[journals.main]\ntopics = ["jobs.>", "mc0.sys.dead.>"]\nsegment_bytes = 1048576\n'


class Side:
    """One side's tracing: an SDK provider exporting to memory (spans by name, parents, links)."""

    def __init__(self, name: str) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer(f"test.{name}")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.spans(name)
        assert len(found) == 1, (name, [s.name for s in self.spans()])
        return found[0]

    def wait(self, name: str, count: int = 1, timeout: float = 10.0) -> list[ReadableSpan]:
        """Poll until ``count`` spans named ``name`` ended (a worker's span ends after its reply left)."""
        for _ in range(int(timeout / 0.01)):
            found = self.spans(name)
            if len(found) >= count:
                return found
            time.sleep(0.01)
        raise AssertionError(f"{count} spans {name!r} not ended within {timeout} s: {[s.name for s in self.spans()]}")


def child_of(child: ReadableSpan, parent: ReadableSpan) -> bool:
    assert child.parent is not None, f"{child.name} has no parent"
    return child.parent.span_id == parent.context.span_id and child.context.trace_id == parent.context.trace_id


def linked_to(span: ReadableSpan, other: ReadableSpan) -> bool:
    return any(link.context.span_id == other.context.span_id for link in span.links)


def traceparent_of(span: ReadableSpan) -> str:
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01"


def serving(endpoint: str, services: dict[str, Any], **options: Any) -> mc0.Worker:
    """A sync worker running in a thread of its own, returned once the broker knows it."""
    worker = mc0.Worker(endpoint, **options)
    for name, handler in services.items():
        worker.service(name)(handler)
    ready = threading.Event()
    threading.Thread(target=worker.run, kwargs={"ready": ready.set}, daemon=True).start()
    assert ready.wait(30), "the worker did not register"
    return worker


@pytest.fixture(autouse=True)
def _no_context_left() -> Iterator[None]:
    """Whatever a test made current (a message taken in this thread) is released by its end."""
    yield
    assert not trace.get_current_span().get_span_context().is_valid, "a span left current"


@pytest.fixture
def jbroker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(config=write_config(tmp_path, "[broker]\nmin_ttl_ms = 50\n" + JOURNAL), insecure=True) as b:
        yield b


# ---------------------------------------------------------------- the model and the wire, pure
@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"traceparent": TP}, TRACE),
        ({"traceparent": TP, "tracestate": "congo=t61rcWkgMzE"}, TRACE),
        ({"traceparent": "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later"}, TRACE),  # a later version
        ({}, None),
        ({"X-Trace": "abc"}, None),
        ({"traceparent": ""}, None),
        ({"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"}, None),  # all-zero trace id
        ({"traceparent": "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, None),  # version ff
        ({"traceparent": "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"}, None),  # uppercase
        ({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"}, None),  # no flags
        ({"traceparent": TP + "-x"}, None),  # version 00 has exactly four fields
        ({"Traceparent": TP}, None),  # the name is lowercase, exactly
    ],
)
def test_trace_id_reads_a_well_formed_traceparent_only(headers: dict[str, str], expected: str | None) -> None:
    assert P.trace_id(headers) == expected


@pytest.mark.parametrize(
    ("key", "user"),
    [("traceparent", True), ("tracestate", True), ("X-a", True), ("Traceparent", False), ("baggage", False),
     ("TRACEPARENT", False), ("X-", False), ("traceparent ", False)],
)  # fmt: skip
def test_the_trace_context_headers_are_user_headers_by_the_model(key: str, user: bool) -> None:
    assert P.is_user_header(key) is user
    frames = [b"PUT", b"TOPIC", b"a.b", key.encode(), b"v", b"", b"body"]
    if user:
        command = P.decode(frames, sender=P.Side.PEER)
        assert command.user_headers() == {key: "v"}
        assert P.user_header_frames({**command.headers, "MSGID": "m"}) == [key.encode(), b"v"]
    else:
        with pytest.raises(mc0.ProtocolError) as refused:
            P.decode(frames, sender=P.Side.PEER)
        assert refused.value.code == 400


def test_an_error_from_the_broker_may_carry_the_trace_context_and_a_peers_may_not() -> None:
    answer = [b"ERROR", b"ID", b"r1", b"CODE", b"504", b"MESSAGE", b"late", b"traceparent", TP.encode()]
    assert P.decode(answer, sender=P.Side.BROKER).user_headers() == {"traceparent": TP}
    worker = [b"ERROR", b"ID", b"7", b"CODE", b"500", b"MESSAGE", b"x", b"traceparent", TP.encode()]
    with pytest.raises(mc0.ProtocolError):
        P.decode(worker, sender=P.Side.PEER)  # a worker's ERROR takes none: the broker adds the request's


@pytest.mark.parametrize(
    ("worker", "request_headers", "reply"),
    [
        ({}, {}, {}),
        ({}, {"X-a": "1", "traceparent": TP}, {"X-a": "1", "traceparent": TP}),  # echoed
        ({"X-b": "2"}, {"X-a": "1"}, {"X-b": "2"}),  # the worker's own, as ever
        ({"X-b": "2"}, {"X-a": "1", "traceparent": TP, "tracestate": "s"},
         {"X-b": "2", "traceparent": TP, "tracestate": "s"}),  # the worker's own, and the request's context
        ({"traceparent": OTHER}, {"traceparent": TP}, {"traceparent": OTHER}),  # the worker set a context
    ],
)  # fmt: skip
def test_a_reply_keeps_its_requests_trace_context(
    worker: dict[str, str], request_headers: dict[str, str], reply: dict[str, str]
) -> None:
    assert P.reply_headers(worker, request_headers) == reply


# ---------------------------------------------------------------- off: nothing imported, nothing sent
OFF_PROBE = """
import sys
{before}
import mc0, mc0.aio
client = mc0.aio.Client("tcp://127.0.0.1:1")
worker = mc0.Worker("tcp://127.0.0.1:1")
loaded = any(m.startswith("opentelemetry") and module is not None for m, module in sys.modules.items())
print(client.tracing is None, worker._inner.tracing is None, loaded)
"""


@pytest.mark.parametrize(
    ("before", "expected"),
    [
        ("", "True True False"),  # the application never imported OpenTelemetry: neither does mc0
        ("sys.modules['opentelemetry'] = None", "True True False"),  # not installed at all
        ("from opentelemetry import trace", "True True True"),  # the API, no provider: off
        (
            "from opentelemetry import trace\nfrom opentelemetry.sdk.trace import TracerProvider\n"
            "trace.set_tracer_provider(TracerProvider())",
            "False False True",
        ),
    ],
)
def test_tracing_is_on_only_with_a_provider_the_application_set(before: str, expected: str) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", OFF_PROBE.format(before=before)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == expected


def test_a_client_without_a_provider_sends_no_trace_context(broker: BrokerProcess) -> None:
    trace.get_tracer_provider()  # (the API imported here, no global provider in this process: off)
    assert tracing_for(None) is None
    with mc0.Client(broker.endpoint) as pub, mc0.Client(broker.endpoint) as sub:
        assert pub._inner.tracing is None
        messages = sub.subscribe("a.>")
        pub.publish("a.b", b"1")
        assert messages.next(timeout=10).headers == {}  # a peer that sends none gets none


# ---------------------------------------------------------------- carried on every path, untouched
def test_the_trace_context_travels_every_path_untouched(jbroker: BrokerProcess) -> None:
    """Without tracing (plain headers set by the application): publish and deliver, a queue group, a
    letter, a request's PARTIAL and FINAL, an error, a journaled record's replay, a durable
    consumer's pull and a fetch all carry the context as published."""
    context = {"traceparent": TP, "tracestate": "congo=t61rcWkgMzE", "X-Trace": "t"}

    def chunks(request: mc0.Request) -> Iterator[bytes]:
        assert request.headers == context
        yield b"one"
        return b"done"

    def fails(request: mc0.Request) -> bytes:
        raise ValueError("no")

    worker = serving(jbroker.endpoint, {"chunks": chunks, "fails": fails})
    with mc0.Client(jbroker.endpoint) as client:
        plain, group, mailbox = client.subscribe("jobs.>"), client.subscribe("jobs.>", group="g"), client.mailbox
        client.publish("jobs.a", b"1", headers=context, confirm=True)
        client.send_to("anonymous", "jobs.letter", b"2", headers=context, confirm=True)
        assert plain.next(timeout=10).headers == context
        assert group.next(timeout=10).headers == context
        assert mailbox.next(timeout=10).headers == context
        replies = list(client.stream("chunks", headers=context, timeout=10))
        assert [(r.body, r.final, r.headers) for r in replies] == [(b"one", False, context), (b"done", True, context)]
        with pytest.raises(mc0.HandlerFailed):
            client.request("fails", headers=context, timeout=10)
        with client.subscribe("jobs.>", from_seq=0) as replayed:
            assert replayed.next(timeout=10).headers == context
        consumer = client.consume("main", "c", topics=["jobs.>"])
        pulled = consumer.fetch(10, wait=5)
        assert [m.message.headers for m in pulled] == [context]
        fetched = client.fetch("main").records[0].headers
        assert fetched.pop("MSGID").startswith(client._inner.auto_msgid_prefix) and fetched == context
    worker.stop()


def test_an_error_to_a_request_carries_its_trace_context(broker: BrokerProcess, raw: Any) -> None:
    """The raw wire: the broker's ERROR (503 no worker, and a worker's own error) names the request's
    trace context; a request that sent none gets an ERROR without it."""
    client = raw()
    client.send("REQUEST", "SERVICE", "nobody", "ID", "r1", "traceparent", TP, "tracestate", "s")
    answer = client.recv()
    assert answer[0] == b"ERROR" and P.decode(answer, sender=P.Side.BROKER).user_headers() == {
        "traceparent": TP,
        "tracestate": "s",
    }
    client.send("REQUEST", "SERVICE", "nobody", "ID", "r2")
    assert P.decode(client.recv(), sender=P.Side.BROKER).user_headers() == {}
    worker = raw()
    worker.send("READY", "ID", "w", "", "svc")
    assert worker.recv()[0] == b"OK"
    client.send("REQUEST", "SERVICE", "svc", "ID", "r3", "traceparent", TP)
    work = worker.recv()
    bid = P.decode(work, sender=P.Side.BROKER).headers["ID"]
    worker.send("ERROR", "ID", bid, "CODE", "422", "MESSAGE", "bad input")
    error = P.decode(client.recv(), sender=P.Side.BROKER)
    assert (error.verb, error.headers["CODE"], error.user_headers()) == (P.Verb.ERROR, "422", {"traceparent": TP})


# ---------------------------------------------------------------- spans, one broker
@pytest.mark.asyncio
async def test_one_trace_from_publisher_through_the_broker_to_subscribers(broker: BrokerProcess) -> None:
    pub_side, sub_side = Side("publisher"), Side("subscriber")
    publisher = mc0.aio.Client(broker.endpoint, tracer_provider=pub_side.provider)
    subscriber = mc0.aio.Client(broker.endpoint, tracer_provider=sub_side.provider)
    async with publisher, subscriber:
        plain = await subscriber.subscribe("orders.>")
        member = await subscriber.subscribe("orders.*", group="billing")
        with pub_side.tracer.start_as_current_span("checkout") as checkout:
            await publisher.publish("orders.eu", b"1", headers={"X-Trace": "t"})
            await publisher.publish("orders.eu", b"2", confirm=True, msgid="m-2")
        got = await plain.next(timeout=10)
        with sub_side.tracer.start_as_current_span("bill"):  # the application's own span, in the loop
            pass
        assert (
            got.headers["X-Trace"] == "t" and P.trace_id(got.headers) == f"{checkout.get_span_context().trace_id:032x}"
        )
        second = await plain.next(timeout=10)  # (the first's span ends as the next is taken)
        grouped = [await member.next(timeout=10) for _ in range(2)]
    sends = pub_side.spans("publish orders.eu")
    processes = sub_side.spans("process orders.eu")
    assert len(sends) == 2 and len(processes) == 4, [s.name for s in processes]
    first_send, confirmed = sends
    outer = pub_side.one("checkout")
    for send in sends:
        assert child_of(send, outer) and send.kind is SpanKind.PRODUCER
        assert send.attributes is not None
        assert send.attributes["messaging.system"] == "mc0"
        assert send.attributes["messaging.destination.name"] == "orders.eu"
        assert send.attributes["messaging.operation.type"] == "send"
        assert send.attributes["messaging.operation.name"] == "publish"
    assert "messaging.message.id" not in (first_send.attributes or {})  # a fire-and-forget publish has no id
    assert (confirmed.attributes or {})["messaging.message.id"] == "m-2"
    by_parent = {p.parent.span_id for p in processes if p.parent is not None}
    assert by_parent == {first_send.context.span_id, confirmed.context.span_id}  # each a child of its send
    first_process = next(
        p
        for p in processes
        if child_of(p, first_send) and p.attributes.get("messaging.destination.subscription.name") == "orders.>"
    )  # type: ignore[union-attr]  # noqa: E501
    assert first_process.kind is SpanKind.CONSUMER and linked_to(first_process, first_send)
    assert first_process.attributes == {
        "messaging.system": "mc0",
        "messaging.destination.name": "orders.eu",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.mc0.sender": "anonymous",
        "messaging.destination.subscription.name": "orders.>",
    }
    assert child_of(sub_side.one("bill"), first_process)  # the application's span, inside the message's
    assert all(p.context.trace_id == outer.context.trace_id for p in processes)  # one trace
    grouped_spans = [p for p in processes if (p.attributes or {}).get("messaging.consumer.group.name") == "billing"]
    assert len(grouped_spans) == 2 and second.body == b"2" and [m.group for m in grouped] == ["billing"] * 2


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_client_worker_and_a_streamed_reply_are_one_trace_with_the_handlers_spans_inside(
    broker: BrokerProcess, kind: str
) -> None:
    """A CLIENT span for the request, the worker's SERVER span its child, the handler's own spans
    (an async generator on the loop, a sync generator in the worker's threads) under the server's."""
    caller_side, worker_side = Side("caller"), Side("worker")

    async def stream_async(request: mc0.Request) -> Any:
        for i in range(3):
            with worker_side.tracer.start_as_current_span(f"chunk {i}"):
                yield f"part {i}".encode()

    def stream_sync(request: mc0.Request) -> Iterator[bytes]:
        for i in range(3):
            with worker_side.tracer.start_as_current_span(f"chunk {i}"):
                yield f"part {i}".encode()
        return b"end"

    worker = mc0.aio.Worker(broker.endpoint, tracer_provider=worker_side.provider, capacity=2)
    worker.service("report.make")(stream_async if kind == "async" else stream_sync)
    client = mc0.aio.Client(broker.endpoint, tracer_provider=caller_side.provider)
    async with worker, client:
        stream = await client.stream("report.make", b"q", timeout=10)
        replies = [reply async for reply in stream]
        assert [r.final for r in replies] == [False, False, False, True]
        assert all(P.trace_id(r.headers) is not None for r in replies)  # echoed on each PARTIAL and the FINAL
        final = await client.request("report.make", b"q", timeout=10)  # request(): the same, PARTIALs skipped
        assert final.final
    calls = caller_side.spans("report.make")
    servers = worker_side.wait("report.make", 2)
    assert len(calls) == 2
    for call in calls:
        server = next(s for s in servers if s.context.trace_id == call.context.trace_id)
        assert call.kind is SpanKind.CLIENT and server.kind is SpanKind.SERVER and child_of(server, call)
        chunks = [
            s for s in worker_side.spans() if s.name.startswith("chunk") and s.context.trace_id == call.context.trace_id
        ]
        assert len(chunks) == 3 and all(child_of(c, server) for c in chunks)
        assert (call.attributes or {})["rpc.status_code"] == "200"
        for span in (call, server):
            attributes = span.attributes or {}
            assert attributes["rpc.system.name"] == "mc0" and attributes["rpc.method"] == "report.make"
            assert attributes["messaging.system"] == "mc0" and attributes["messaging.destination.name"] == "report.make"
        assert (server.attributes or {})["messaging.mc0.caller"] == "anonymous"
        assert (server.attributes or {})["messaging.operation.name"] == "handle"
    assert {(c.attributes or {})["messaging.operation.name"] for c in calls} == {"request"}


@pytest.mark.asyncio
async def test_a_batch_services_call_gives_each_request_its_server_span_with_its_outcome(broker: BrokerProcess) -> None:
    """A batch handler serves several requests in one call: each request still gets a SERVER span, the child
    of its caller's CLIENT span, named for the call (operation ``batch``, its size); the one the handler
    failed says so; none is current in the handler (its own span nests under none of them)."""
    caller_side, worker_side = Side("caller"), Side("worker")
    started = asyncio.Event()

    async def price(requests: list[mc0.Request]) -> list[object]:
        with worker_side.tracer.start_as_current_span("price the call"):
            started.set()
            await asyncio.sleep(0.2)  # (the requests that come meanwhile wait for the next call)
        return [ValueError("no price") if r.body == b"bad" else r.body.upper() for r in requests]

    worker = mc0.aio.Worker(broker.endpoint, tracer_provider=worker_side.provider, capacity=4)
    worker.batch_service("price", max=4)(price)
    client = mc0.aio.Client(broker.endpoint, tracer_provider=caller_side.provider)
    async with worker, client:
        bodies = [b"a", b"b", b"bad", b"c"]
        outcomes = await asyncio.gather(
            *(client.request("price", body, timeout=10) for body in bodies), return_exceptions=True
        )
    assert [o.body for o in outcomes if isinstance(o, mc0.Reply)] == [b"A", b"B", b"C"]
    failed = [o for o in outcomes if not isinstance(o, mc0.Reply)]
    assert len(failed) == 1 and "no price" in str(failed[0])
    calls = caller_side.spans("price")
    servers = worker_side.wait("price", 4)
    own = worker_side.spans("price the call")
    assert len(calls) == 4 and len(servers) == 4 and own
    for call in calls:
        server = next(s for s in servers if s.context.trace_id == call.context.trace_id)
        attributes = server.attributes or {}
        assert server.kind is SpanKind.SERVER and child_of(server, call)
        assert attributes["messaging.operation.name"] == "batch"
        assert 1 <= attributes["messaging.batch.message_count"] <= 4  # (as the requests came: one call or more)
        assert attributes["rpc.method"] == "price"
    bad = [s for s in servers if "error.type" in (s.attributes or {})]
    assert [(s.attributes or {})["error.type"] for s in bad] == ["ValueError"]
    assert bad[0].status.status_code is StatusCode.ERROR
    server_ids = {s.context.span_id for s in servers}
    assert all(s.parent is None or s.parent.span_id not in server_ids for s in own)


def test_the_sync_api_traces_in_the_callers_thread(broker: BrokerProcess) -> None:
    """mc0.Client: the caller's current span is the parent of a publish and a request made from its
    thread, and a message taken in a thread is current there until it takes the next."""
    side = Side("sync")
    worker = serving(broker.endpoint, {"echo": lambda request: request.body}, tracer_provider=side.provider)
    with mc0.Client(broker.endpoint, tracer_provider=side.provider) as client:
        messages = client.subscribe("a.>")
        with side.tracer.start_as_current_span("job"):
            client.publish("a.b", b"1")
            assert client.request("echo", b"x", timeout=10).body == b"x"
        for message in messages:
            with side.tracer.start_as_current_span("handle"):
                pass
            assert message.body == b"1"
            break
        messages.close()  # (its span ends with it)
    worker.stop()
    job_span = side.one("job")
    send = side.one("publish a.b")
    call, server = sorted(side.wait("echo", 2), key=lambda s: s.kind is SpanKind.SERVER)
    assert call.kind is SpanKind.CLIENT and server.kind is SpanKind.SERVER
    assert child_of(send, job_span) and child_of(call, job_span) and child_of(server, call)
    process = side.one("process a.b")
    assert child_of(process, send) and child_of(side.one("handle"), process)


@pytest.mark.asyncio
async def test_a_durable_consumer_links_hours_old_records_and_is_not_their_child(tmp_path: Path) -> None:
    """Records written three hours ago (a file journal under an injected clock, each with the
    traceparent of a producer span that ended then) are pulled now: the pull's span and each
    message's span are linked to the producers' contexts, and neither is a child of them."""
    from mc0.broker.storage.filestore import Journal
    from mc0.settings import JournalSettings

    producer = Side("producer")
    three_hours_ago = time.time() - 3 * 3600
    folder = tmp_path / "main"
    journal = Journal("main", JournalSettings(folder=str(folder)), clock=lambda: three_hours_ago).open()
    sends = []
    for i in range(3):
        start = int((three_hours_ago + i) * 1e9)
        span = producer.tracer.start_span("publish jobs.work", kind=SpanKind.PRODUCER, start_time=start)
        span.end(end_time=start + 1000)
        sends.append(span)
        journal.append("jobs.work", "alice", {"MSGID": f"m{i}", "traceparent": traceparent_of(span)}, [b"job"])  # type: ignore[arg-type]
    journal.commit()
    journal.close()
    config = write_config(tmp_path, f'[journals.main]\ntopics = ["jobs.>"]\nfolder = {json.dumps(str(folder))}\n')
    consumer_side = Side("consumer")
    with BrokerProcess(config=config, insecure=True) as broker:
        async with mc0.aio.Client(broker.endpoint, tracer_provider=consumer_side.provider) as client:
            consumer = await client.consume("main", "workers", topics=["jobs.>"])
            with consumer_side.tracer.start_as_current_span("batch job") as batch_job:
                taken = []
                async for message in consumer.messages(batch=10, wait=5):
                    taken.append(message)
                    with consumer_side.tracer.start_as_current_span("work"):
                        assert message.body == b"job"
                    await message.ack()  # (its span ends)
                    if len(taken) == 3:
                        break
            replay = await client.subscribe("jobs.>", from_seq=0)  # a replay's history: linked too
            replayed = [await replay.next(timeout=10) for _ in range(3)]
            await replay.close()
    assert all(abs(m.message.seq - i - 1) == 0 for i, m in enumerate(taken))
    assert [m.seq for m in replayed] == [1, 2, 3]
    pull = consumer_side.spans("pull main")[0]
    assert pull.kind is SpanKind.CLIENT and child_of(pull, consumer_side.one("batch job"))
    calls = [call for call in consumer_side.spans("mc0.consumer") if call.parent is not None]
    assert any(child_of(call, pull) for call in calls)  # its request to the broker, inside it
    assert (pull.attributes or {})["messaging.batch.message_count"] == 3
    assert [link.context.span_id for link in pull.links] == [s.get_span_context().span_id for s in sends]
    assert [(link.attributes or {})["messaging.message.id"] for link in pull.links] == ["m0", "m1", "m2"]
    processes = consumer_side.spans("process jobs.work")
    assert len(processes) == 6  # three pulled, three replayed
    for i, process in enumerate(processes[:3]):
        producer_context = sends[i].get_span_context()
        assert process.context.trace_id != producer_context.trace_id, (process.parent, process.links, processes)
        assert [link.context.span_id for link in process.links] == [producer_context.span_id]
        assert process.parent is not None and process.parent.span_id == batch_job.get_span_context().span_id
        assert (process.attributes or {})["messaging.mc0.seq"] == i + 1
        assert (process.attributes or {})["messaging.mc0.sender"] == "alice"
        work = [
            w
            for w in consumer_side.spans("work")
            if w.parent is not None and w.parent.span_id == process.context.span_id
        ]
        assert len(work) == 1  # the application's work on the message, inside its span
    for i, process in enumerate(processes[3:]):
        assert process.parent is None  # nothing current: a root, linked to the producer
        assert [link.context.span_id for link in process.links] == [sends[i].get_span_context().span_id]
    assert all(s.start_time < (time.time() - 3 * 3600 + 60) * 1e9 for s in sends)  # hours before the pulls


# ---------------------------------------------------------------- the wire: OTLP/HTTP from mc0 serve
HANDLER_MODULE = '''
"""A handler module that configures OpenTelemetry (what an operator's `mc0 serve` module does)."""
import os

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

provider = TracerProvider(resource=Resource.create({"service.name": "greeter"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=os.environ["TRACES_URL"], timeout=10)))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("greeter")


def hello(request):
    with tracer.start_as_current_span("compose"):
        return b"hello " + request.body
'''


class Collector(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP receiver on 127.0.0.1: each POST /v1/traces decoded with opentelemetry-proto."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list[tuple[str, Any]] = []  # (service.name, the span message)
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource_spans in request.resource_spans:
                    names = [
                        a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"
                    ]
                    for scope_spans in resource_spans.scope_spans:
                        collector.spans += [(names[0] if names else "", s) for s in scope_spans.spans]
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"


def test_mc0_serve_exports_its_server_span_over_otlp_http_under_the_callers(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    require("opentelemetry.exporter.otlp.proto.http")
    require("opentelemetry.proto")
    (tmp_path / "greeter.py").write_text(HANDLER_MODULE)
    collector = Collector()
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    env = {**os.environ, "TRACES_URL": collector.url, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    command = [
        sys.executable,
        "-m",
        "mc0",
        "serve",
        "greeter:hello",
        "--service",
        "greet",
        "--endpoint",
        broker.endpoint,
    ]
    serve = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()
        assert line.startswith("mc0 worker serving greet"), line + (serve.stderr.read() if serve.poll() else "")
        caller = Side("caller")
        with mc0.Client(broker.endpoint, tracer_provider=caller.provider) as client:
            assert client.request("greet", b"otlp", timeout=20).body == b"hello otlp"
        for _ in range(2000):  # the exporter posts as each span ends (bounded: 20 s)
            if {s.name for _, s in collector.spans} >= {"greet", "compose"}:
                break
            time.sleep(0.01)
    finally:
        serve.terminate()
        serve.communicate(timeout=30)
        collector.shutdown()
        collector.server_close()
    call = caller.one("greet")
    by_name = {s.name: (service, s) for service, s in collector.spans}
    service, server = by_name["greet"]
    _, compose = by_name["compose"]
    assert service == "greeter"
    assert server.trace_id.hex() == f"{call.context.trace_id:032x}"
    assert server.parent_span_id.hex() == f"{call.context.span_id:016x}"  # the caller's span, across processes
    assert compose.parent_span_id == server.span_id and compose.trace_id == server.trace_id
    assert server.kind == 2  # SPAN_KIND_SERVER
    attributes = {a.key: a.value.string_value for a in server.attributes}
    assert attributes["rpc.system.name"] == "mc0" and attributes["rpc.method"] == "greet"
    assert attributes["messaging.system"] == "mc0" and attributes["messaging.destination.name"] == "greet"
    assert attributes["messaging.mc0.caller"] == "anonymous" and attributes["messaging.operation.name"] == "handle"


def test_journal_get_shows_a_records_trace_id(jbroker: BrokerProcess) -> None:
    with mc0.Client(jbroker.endpoint) as client:
        client.publish("jobs.a", b"x", headers={"traceparent": TP}, confirm=True)
        client.publish("jobs.a", b"y", confirm=True)
    command = [sys.executable, "-m", "mc0", "journal", "get", "main", "1", "--endpoint", jbroker.endpoint]
    shown = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    assert f"trace: {TRACE}\n" in shown.stdout
    command[-3] = "2"
    untraced = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "trace: none\n" in untraced.stdout
