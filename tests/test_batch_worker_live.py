"""A worker's batch services (``Worker.batch_service``) against a real broker, both APIs: requests
handed over in batches, replies sent in one, each request answered once (an error in one alone),
CANCEL and deadlines, drain, and per-request services beside them unchanged."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import mc0
from mc0.process import BrokerProcess
from mc0.protocol import batch

CALLS = 40


async def start_worker(api: Any, endpoint: str, capacity: int, **services: tuple[Any, int]) -> Any:
    worker = (mc0.Worker if api.name == "sync" else mc0.aio.Worker)(endpoint, capacity=capacity)
    for name, (handler, most) in services.items():
        worker.batch_service(name, max=most)(handler)
    await api(worker.connect())
    return worker


def twin(worker: Any) -> Any:
    """The asyncio worker itself (the sync one's twin): its batch services' state."""
    return getattr(worker, "_worker", worker)


async def submit_all(api: Any, client: Any, service: str, bodies: list[bytes], timeout: float = 10) -> list[Any]:
    """Every body sent at once; each reply or the exception it raised, in order."""
    if api.name == "sync":
        futures = [client.submit(service, body, timeout=timeout) for body in bodies]
        out = []
        for future in futures:
            try:
                out.append(future.result(timeout + 5))
            except Exception as exc:
                out.append(exc)
        return out
    return await asyncio.gather(*[client.submit(service, b, timeout=timeout) for b in bodies], return_exceptions=True)


async def wait_until(condition: Any, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    assert condition()


@pytest.mark.asyncio
async def test_requests_come_in_batches_of_at_most_max_and_each_gets_its_reply(api: Any, broker: BrokerProcess) -> None:
    sizes: list[int] = []

    def upper(requests: list[mc0.Request]) -> list[bytes]:
        sizes.append(len(requests))
        time.sleep(0.05)  # the others arrive meanwhile: the next call takes them together
        return [r.body.upper() for r in requests]

    worker = await start_worker(api, broker.endpoint, CALLS, upper=(upper, 8))
    client = await api(api.Client(broker.endpoint).connect())
    bodies = [b"call %d" % i for i in range(CALLS)]
    replies = await submit_all(api, client, "upper", bodies)
    assert [r.body for r in replies] == [b.upper() for b in bodies]
    assert sum(sizes) == CALLS and max(sizes) <= 8 and max(sizes) > 1 and len(sizes) < CALLS, sizes
    assert worker.handled == CALLS
    await api(worker.close())
    await api(client.close())


@pytest.mark.asyncio
async def test_the_replies_of_a_call_leave_in_one_batch(broker: BrokerProcess) -> None:
    """(asyncio: the worker's link is looked at) One send of every reply of a call, not one per reply."""
    released = asyncio.Event()
    sizes: list[int] = []

    async def echo(requests: list[mc0.Request]) -> list[bytes]:
        await released.wait()
        sizes.append(len(requests))
        return [r.body for r in requests]

    worker = mc0.aio.Worker(broker.endpoint, capacity=CALLS)
    worker.batch_service("echo", max=CALLS)(echo)
    await worker.connect()
    link = worker._outgoing()
    sends: list[int] = []
    send_record = link.send_record

    def counted(record: bytes) -> None:
        sends.append(sum(1 for _ in batch.records(record)))
        send_record(record)

    link.send_record = counted  # type: ignore[method-assign]
    async with mc0.aio.Client(broker.endpoint) as client:
        calls = [asyncio.ensure_future(client.request("echo", b"%d" % i, timeout=10)) for i in range(CALLS)]
        await wait_until(lambda: worker._batches["echo"].busy and len(worker._batched) == CALLS)
        released.set()
        replies = await asyncio.gather(*calls)
    assert [r.body for r in replies] == [b"%d" % i for i in range(CALLS)]
    # The client's first request leaves at once, the 39 others in its next BATCH: two calls at most
    # (the first may have started alone), each call's replies in one send.
    assert sum(sizes) == CALLS and len(sizes) <= 2 and sends == sizes, (sizes, sends)
    await worker.close()


@pytest.mark.asyncio
async def test_an_error_in_one_request_of_a_batch_is_answered_alone(api: Any, broker: BrokerProcess) -> None:
    def mixed(requests: list[mc0.Request]) -> list[object]:
        out: list[object] = []
        for r in requests:
            if r.body == b"bad":
                out.append(ValueError("not this one"))
            elif r.body == b"headers":
                out.append(mc0.Reply(parts=(b"h",), headers={"X-Mine": "1"}))
            elif r.body == b"badheader":
                out.append(mc0.Reply(parts=(b"x",), headers={"Bad Header": "1"}))
            elif r.body == b"number":
                out.append(42)
            else:
                out.append(r.body)
        return out

    def boom(requests: list[mc0.Request]) -> list[bytes]:
        raise KeyError("the whole call")

    def short(requests: list[mc0.Request]) -> list[bytes]:
        return []

    worker = await start_worker(api, broker.endpoint, 10, mixed=(mixed, 10), boom=(boom, 10), short=(short, 10))
    client = await api(api.Client(broker.endpoint).connect())
    bodies = [b"a", b"bad", b"headers", b"badheader", b"number", b"b"]
    replies = await submit_all(api, client, "mixed", bodies)
    assert replies[0].body == b"a" and replies[5].body == b"b"
    assert replies[2].body == b"h" and replies[2].headers == {"X-Mine": "1"}
    for i, name in ((1, "ValueError: not this one"), (3, "Bad Header"), (4, "int")):
        assert isinstance(replies[i], mc0.HandlerFailed) and replies[i].code == 500, replies[i]
        assert name in replies[i].reason, replies[i].reason
    for service, words in (("boom", "KeyError"), ("short", "returned 0 results for")):
        failed = await submit_all(api, client, service, [b"1", b"2"])
        assert all(isinstance(f, mc0.HandlerFailed) and words in f.reason for f in failed), failed
    assert twin(worker).failed >= 3 + 2 + 2 and worker.handled >= 3
    assert (await api(client.request("mixed", b"still", timeout=5))).body == b"still"  # the worker serves on
    await api(worker.close())
    await api(client.close())


@pytest.mark.asyncio
async def test_a_request_past_its_deadline_is_504_and_a_call_left_with_none_is_cancelled(
    api: Any, broker: BrokerProcess
) -> None:
    cancelled = threading.Event()
    seen: list[bytes] = []

    async def slow(requests: list[mc0.Request]) -> list[bytes]:
        seen.extend(r.body for r in requests)
        try:
            await asyncio.sleep(0.8 if requests[0].body == b"first" else 60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return [r.body for r in requests]

    worker = await start_worker(api, broker.endpoint, 4, slow=(slow, 1))
    client = await api(api.Client(broker.endpoint).connect())
    started = time.monotonic()
    with pytest.raises(mc0.DeadlineExceeded) as info:
        await api(client.request("slow", b"forever", timeout=0.3))
    assert info.value.code == 504 and time.monotonic() - started < 2
    await wait_until(cancelled.is_set)  # its one request answered by the broker: the call is cancelled

    # One call runs (max 1); a request that waits behind it past its deadline is never handed over.
    first = (
        client.submit("slow", b"first", timeout=5)
        if api.name == "sync"
        else asyncio.ensure_future(client.request("slow", b"first", timeout=5))
    )
    await wait_until(lambda: b"first" in seen)
    with pytest.raises(mc0.DeadlineExceeded):
        await api(client.request("slow", b"late", timeout=0.2))
    reply = first.result(10) if api.name == "sync" else await first
    assert reply.body == b"first"
    await asyncio.sleep(0.2)
    assert seen == [b"forever", b"first"], seen  # "late" was dropped before its call
    assert not twin(worker)._batched, twin(worker)._batched  # and forgotten
    await api(worker.close())
    await api(client.close())


@pytest.mark.asyncio
async def test_a_cancelled_request_is_not_answered_and_its_call_answers_the_others(
    api: Any, broker: BrokerProcess
) -> None:
    release = threading.Event()
    seen: list[bytes] = []

    def held(requests: list[mc0.Request]) -> list[bytes]:
        seen.extend(r.body for r in requests)
        release.wait(10)
        return [r.body for r in requests]

    worker = await start_worker(api, broker.endpoint, 4, held=(held, 4))
    client = await api(api.Client(broker.endpoint).connect())
    stream = await api(client.stream("held", b"cancel me", timeout=10))
    kept = (
        client.submit("held", b"keep me", timeout=10)
        if api.name == "sync"
        else asyncio.ensure_future(client.request("held", b"keep me", timeout=10))
    )
    # Both at the worker: in the running call, or the first running and the other waiting for the next.
    await wait_until(lambda: len(twin(worker)._batched) == 2 and len(seen) >= 1)
    await api(stream.cancel())
    with pytest.raises(mc0.Cancelled) as info:
        if api.name == "sync":
            next(iter(stream))
        else:
            await stream.__anext__()
    assert info.value.code == 499
    release.set()
    reply = kept.result(10) if api.name == "sync" else await kept
    assert reply.body == b"keep me"
    await wait_until(lambda: not twin(worker)._batched and worker.handled == 1)  # the cancelled one was not answered
    await api(worker.close())
    await api(client.close())


@pytest.mark.asyncio
async def test_drain_lets_the_running_call_reply_and_per_request_services_run_beside(
    api: Any, broker: BrokerProcess
) -> None:
    started = threading.Event()

    def slow(requests: list[mc0.Request]) -> list[bytes]:
        started.set()
        time.sleep(0.4)
        return [b"done " + r.body for r in requests]

    worker = (mc0.Worker if api.name == "sync" else mc0.aio.Worker)(broker.endpoint, capacity=4)
    worker.batch_service("slow", max=4)(slow)
    worker.service("one")(lambda request: b"one " + request.body)  # a per-request service beside it
    await api(worker.connect())
    client = await api(api.Client(broker.endpoint).connect())
    assert (await api(client.request("one", b"x", timeout=5))).body == b"one x"
    pending = (
        client.submit("slow", b"y", timeout=10)
        if api.name == "sync"
        else asyncio.ensure_future(client.request("slow", b"y", timeout=10))
    )
    await wait_until(started.is_set)
    await api(worker.drain(timeout=10))
    reply = pending.result(10) if api.name == "sync" else await pending
    assert reply.body == b"done y" and worker.closed
    await api(client.close())


def test_a_batch_service_is_refused_when_it_cannot_be_one() -> None:
    worker = mc0.aio.Worker("tcp://127.0.0.1:1")

    def generator(requests: list[mc0.Request]) -> Any:
        yield b"x"

    async def agen(requests: list[mc0.Request]) -> Any:
        yield b"x"

    for handler in (generator, agen):
        with pytest.raises(ValueError, match="generator"):
            worker.add_batch_service("svc", handler)
    with pytest.raises(ValueError, match="max"):
        worker.add_batch_service("svc", lambda requests: [], max=0)
    with pytest.raises(mc0.Error):
        worker.add_batch_service("bad service name", lambda requests: [])
    assert worker._batches == {} and worker._handlers == {}  # nothing half registered
