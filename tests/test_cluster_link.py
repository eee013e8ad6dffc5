"""The cluster link's hand-over between its thread and the broker loop (mc0.broker.cluster.link): what the
thread posts reaches the loop in order, and a post is never left without a wake-up of the loop, however it
falls against the loop's reading.  No NATS server is needed: the thread only tries to connect (to a port
nothing listens on) while these run.  The link against real nats-server nodes: tests/test_cluster_live.py."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from mc0.broker.cluster import posts
from mc0.broker.cluster.link import ClusterLink, Hello
from mc0.settings import ClusterConfig


@pytest.fixture
def link() -> Iterator[ClusterLink]:
    context: zmq.Context[Any] = zmq.Context()
    with socket.socket() as unused:  # a port nothing listens on: the thread keeps trying, nothing else
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    link = ClusterLink(ClusterConfig(nats=(f"nats://127.0.0.1:{port}",), hello_ms=1000))
    try:
        link.start(context, "b1")
        assert link.poster is not None  # (made by the thread before start returns)
        yield link
    finally:
        link.close()
        context.term()


def readable(link: ClusterLink, timeout: float = 0.5) -> bool:
    assert link.socket is not None
    return bool(select.select([link.socket], [], [], timeout)[0])


def hello(n: int) -> tuple[bytes, ...]:
    return posts.hello(f"b{n}", n)


def test_what_the_thread_posts_reaches_the_loop_in_order_with_one_wake_up_for_many(link: ClusterLink) -> None:
    assert link.poster is not None
    assert not readable(link, 0.05)
    for n in range(5):
        link.poster(hello(n))
    assert readable(link)
    assert link.receive() == [Hello(f"b{n}", n) for n in range(5)]
    assert not readable(link, 0.05)  # (five posts, one wake-up, read)


def test_a_post_made_while_the_loop_reads_its_wake_ups_wakes_it_for_the_next_post(link: ClusterLink) -> None:
    """The thread posts while the loop is reading its wake-ups: the post after that one must wake the loop
    again (the loop notes it was told only after reading the wake-ups, never before)."""
    assert link.poster is not None
    poster = link.poster
    real = link._wake_r
    assert real is not None

    class PostsWhileRead:
        """The loop's end of the wake-up pair, with the thread posting at the moment the loop reads it."""

        def __init__(self) -> None:
            self.posted = False

        def recv(self, size: int) -> bytes:
            if not self.posted:
                self.posted = True
                poster(hello(1))
            assert real is not None
            return real.recv(size)

    poster(hello(0))
    link._wake_r = PostsWhileRead()  # type: ignore[assignment]
    try:
        assert link.receive() == [Hello("b0", 0), Hello("b1", 1)]
    finally:
        link._wake_r = real
    poster(hello(2))
    assert readable(link)  # (it was lost when the loop noted "told" before reading the wake-ups)
    assert link.receive() == [Hello("b2", 2)]


def test_more_posts_than_one_receive_takes_leave_the_loop_woken(link: ClusterLink) -> None:
    assert link.poster is not None
    for n in range(300):
        link.poster(hello(n))
    first = link.receive(limit=256)
    assert len(first) == 256 and readable(link)  # the rest waits, and the loop is told
    assert first + link.receive(limit=256) == [Hello(f"b{n}", n) for n in range(300)]
    assert not readable(link, 0.05)


def test_items_taken_one_at_a_time_in_a_turn_read_the_wake_ups_once_and_leave_none_lost(link: ClusterLink) -> None:
    """The broker loop takes route traffic one item at a time within its budget (listeners.ClusterListener):
    the turn's first take reads the wake-ups, the others (``look=False``) only take; what is left when the
    turn stops, or posted meanwhile, still wakes the loop."""
    assert link.poster is not None
    for n in range(3):
        link.poster(hello(n))
    assert link.receive(1) == [Hello("b0", 0)] and readable(link)
    assert link.receive(1, look=False) == [Hello("b1", 1)]
    assert readable(link)  # (the turn stops here: b2 is left, and the loop is told)
    assert link.receive(1) == [Hello("b2", 2)]
    assert link.receive(1, look=False) == [] and not readable(link, 0.05)
    link.poster(hello(3))  # (posted after the turn's look: it wakes the loop itself)
    assert readable(link) and link.receive(1) == [Hello("b3", 3)]


def test_a_hosted_link_posts_with_a_call_once_per_look_and_stops_within_its_bound() -> None:
    """Hosted (the broker's own asyncio loop and thread): no socket pair, no thread; a post calls the
    broker's wake once until the loop looks again (``receive``), posts come in order, and a link that
    never reached NATS stops at once when asked (``stop_hosted``)."""
    import asyncio

    context: zmq.Context[Any] = zmq.Context()
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    link = ClusterLink(ClusterConfig(nats=(f"nats://127.0.0.1:{port}",), hello_ms=1000))
    woken: list[int] = []

    async def run() -> None:
        link.start(context, "b1", hosted=True)
        assert link.socket is None and link._thread is None
        task = link.host(lambda: woken.append(1))
        for _ in range(100):  # (bounded) the link's run builds its poster on the loop
            if link.poster is not None:
                break
            await asyncio.sleep(0.01)
        assert link.poster is not None
        for n in range(3):
            link.poster(hello(n))
        assert len(woken) == 1 and link.waiting  # one call for three posts
        assert link.receive(2) == [Hello("b0", 0), Hello("b1", 1)]
        assert len(woken) == 2  # (one left: the loop is told again)
        assert link.receive(1, look=False) == [Hello("b2", 2)] and not link.waiting
        link.poster(hello(3))  # (the loop looked: this post calls it)
        assert len(woken) == 3 and link.receive() == [Hello("b3", 3)]
        started = asyncio.get_running_loop().time()
        await link.stop_hosted()
        assert task.done() and asyncio.get_running_loop().time() - started < 5.0

    try:
        asyncio.run(run())
    finally:
        link.close()
        context.term()
