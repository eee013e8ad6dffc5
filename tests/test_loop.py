"""The broker's turns on an asyncio loop (mc0.broker.loop.AsyncTurns), with scripted sockets: what wakes a turn,
what only costs a look, the rest between turns while route traffic waits, and a turn that raises.  The same
turns against real brokers and nats-server: the cluster suite (tests/test_cluster_live.py and the rest)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from mc0.broker import loop as loops


class ScriptedSockets:
    """What AsyncTurns asks of a SocketLoop: one fd (a socket pair's read end), what a look finds ready
    (``ready``, taken once), whether route traffic waits (``behind``)."""

    def __init__(self) -> None:
        self.read_end, self.write_end = socket.socketpair()
        self.read_end.setblocking(False)
        self.ready = 0
        self.behind = False
        self.looks = 0

    def fds(self) -> list[int]:
        return [self.read_end.fileno()]

    def wait(self, timeout_ms: int, held: bool) -> int:
        self.looks += 1
        try:
            while self.read_end.recv(64):
                pass
        except BlockingIOError:
            pass
        found, self.ready = self.ready, 0
        return found

    def listeners_behind(self) -> bool:
        return self.behind

    def close(self) -> None:
        self.read_end.close()
        self.write_end.close()


def turns_of(sockets: ScriptedSockets, script: Any) -> tuple[loops.AsyncTurns, list[tuple[int, int]]]:
    """AsyncTurns over ``sockets`` whose turns log (ready, the loop's runs so far) and then call ``script``."""
    log: list[tuple[int, int]] = []
    state = {"stop": False, "runs": 0, "wait_ms": 1000}

    def turn(ready: int, held: bool) -> None:
        log.append((ready, state["runs"]))
        script(turns, state)

    turns = loops.AsyncTurns(
        sockets,  # type: ignore[arg-type]
        turn,
        holding=lambda now: False,
        timeout=lambda now, held: int(state["wait_ms"]),
        stopping=lambda: bool(state["stop"]),
    )
    turns.state = state  # type: ignore[attr-defined]
    return turns, log


async def counting_runs(state: dict[str, Any]) -> None:
    """Counts the asyncio loop's runs (each call_soon callback runs in the next one)."""
    loop = asyncio.get_running_loop()

    def tick() -> None:
        state["runs"] += 1
        if not state["stop"]:
            loop.call_soon(tick)

    loop.call_soon(tick)


@pytest.mark.timeout(30)
def test_an_fd_signal_with_nothing_ready_costs_a_look_and_input_or_a_post_a_turn() -> None:
    sockets = ScriptedSockets()

    def script(turns: loops.AsyncTurns, state: dict[str, Any]) -> None:
        pass

    turns, log = turns_of(sockets, script)

    async def drive() -> None:
        task = asyncio.get_running_loop().create_task(turns.run())
        await asyncio.sleep(0.05)
        assert len(log) == 1  # the first turn, due at start
        looks = sockets.looks
        sockets.write_end.send(b"x")  # an fd's signal, nothing ready: a look, no turn
        await asyncio.sleep(0.05)
        assert len(log) == 1 and sockets.looks > looks
        sockets.ready = loops.ROUTER_BIT
        sockets.write_end.send(b"x")  # input: a turn with what was found ready
        await asyncio.sleep(0.05)
        assert log[-1][0] == loops.ROUTER_BIT and len(log) == 2
        turns.wake()  # a post (nothing ready): a turn all the same
        turns.wake()  # (twice before it runs: once)
        await asyncio.sleep(0.05)
        assert len(log) == 3 and log[-1][0] == 0
        turns.state["stop"] = True  # type: ignore[attr-defined]
        turns.wake()
        await asyncio.wait_for(task, 5)

    try:
        asyncio.run(drive())
    finally:
        sockets.close()


@pytest.mark.timeout(30)
def test_while_route_traffic_waits_the_loop_runs_its_rest_between_two_turns() -> None:
    sockets = ScriptedSockets()

    def script(turns: loops.AsyncTurns, state: dict[str, Any]) -> None:
        sockets.behind = len(log) >= 3  # from the third turn on: route traffic left for the next
        state["stop"] = len(log) >= 5
        state["wait_ms"] = 0  # more to do at once

    turns, log = turns_of(sockets, script)

    async def drive() -> None:
        await counting_runs(turns.state)  # type: ignore[attr-defined]
        await asyncio.wait_for(turns.run(), 5)

    try:
        asyncio.run(drive())
    finally:
        sockets.close()
    gaps = [b[1] - a[1] for a, b in zip(log, log[1:], strict=False)]
    assert len(log) == 5
    assert max(gaps[:2]) <= 2  # no route traffic waiting: the next turn at the loop's next run
    assert min(gaps[2:]) >= loops.REST + 1  # waiting: the loop ran its rest before each next turn


@pytest.mark.timeout(30)
def test_a_turn_that_raises_ends_the_run_with_its_error() -> None:
    sockets = ScriptedSockets()

    def script(turns: loops.AsyncTurns, state: dict[str, Any]) -> None:
        raise RuntimeError("a bug in a turn")

    turns, _ = turns_of(sockets, script)
    try:
        with pytest.raises(RuntimeError, match="a bug in a turn"):
            asyncio.run(asyncio.wait_for(turns.run(), 5))
    finally:
        sockets.close()
