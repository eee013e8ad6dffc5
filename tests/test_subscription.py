"""mc0.aio.subscription: a run of messages offered at once is held, dropped and reported as one by one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mc0.aio.subscription import Subscription
from mc0.message import Message


class Owner:
    def __init__(self) -> None:
        self.faults: list[Exception] = []

    def report_fault(self, error: Exception) -> None:
        self.faults.append(error)

    async def unsubscribe(self, subscription: Subscription) -> None:
        raise AssertionError("not in this test")


def _message(i: int, sizes: list[int]) -> Message:
    return Message(f"t.{i}", tuple(b"x" * n for n in sizes))


@settings(max_examples=300, deadline=None)
@given(
    max_pending=st.integers(1, 12),
    max_pending_bytes=st.integers(1, 60),
    runs=st.lists(st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=3), max_size=8), max_size=5),
    taken=st.lists(st.integers(0, 4), max_size=5),
)
def test_a_run_is_offered_as_its_messages_one_by_one(
    max_pending: int, max_pending_bytes: int, runs: list[list[list[int]]], taken: list[int]
) -> None:
    owners = Owner(), Owner()
    one_by_one, at_once = (Subscription(o, ("t.>",), max_pending, max_pending_bytes) for o in owners)
    counter = 0
    for i, run in enumerate(runs):
        messages = [_message(counter + j, sizes) for j, sizes in enumerate(run)]
        counter += len(run)
        for message in messages:
            one_by_one._offer(message)
        at_once.offer_run(messages)
        for _ in range(min(taken[i] if i < len(taken) else 0, one_by_one.pending)):
            assert one_by_one._take() is at_once._take()
        state = [(list(s._items), s._bytes, s.dropped, s._dropping) for s in (one_by_one, at_once)]
        assert state[0] == state[1]
    assert [str(f) for f in owners[0].faults] == [str(f) for f in owners[1].faults]
