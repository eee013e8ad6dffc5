"""mc0.aio.batchwork.RequestBatches: a batch service's requests, waiting and in the running call."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mc0.aio.batchwork import RequestBatches
from mc0.message import Request


def request(bid: str) -> Request:
    return Request(id=bid, service="svc", parts=(bid.encode(),), headers={}, caller="anonymous", deadline=0.0)


def test_a_call_takes_up_to_max_in_arrival_order_and_the_rest_waits() -> None:
    batches = RequestBatches("svc", max=3)
    assert not batches.busy and batches.take() == []
    for bid in "abcde":
        batches.add(request(bid))
    assert batches.busy
    assert [r.id for r in batches.take()] == ["a", "b", "c"]
    with pytest.raises(RuntimeError):
        batches.take()  # one call at a time
    batches.add(request("f"))  # arrives during the call: waits for the next one
    assert list(batches.finish()) == ["a", "b", "c"]
    assert [r.id for r in batches.take()] == ["d", "e", "f"]
    assert list(batches.finish()) == ["d", "e", "f"] and not batches.busy


@pytest.mark.parametrize(
    ("dropped", "cancel_call", "owed", "next_call"),
    [
        (["x"], [False], ["a", "b"], ["c"]),  # unknown: nothing happens
        (["c"], [False], ["a", "b"], []),  # waiting: never handed to the handler
        (["a"], [False], ["b"], ["c"]),  # running: not answered, the call goes on for b
        (["a", "b"], [False, True], [], ["c"]),  # the call's last one: the call is not worth finishing
        (["a", "a"], [False, False], ["b"], ["c"]),  # twice: once
    ],
)
def test_a_request_the_broker_answered_is_dropped(
    dropped: list[str], cancel_call: list[bool], owed: list[str], next_call: list[str]
) -> None:
    batches = RequestBatches("svc", max=2)
    for bid in "abc":
        batches.add(request(bid))
    batches.take()
    assert [batches.drop(bid) for bid in dropped] == cancel_call
    assert list(batches.finish()) == owed
    assert [r.id for r in batches.take()] == next_call


def test_max_below_one_is_refused_and_clear_forgets_everything() -> None:
    with pytest.raises(ValueError):
        RequestBatches("svc", max=0)
    batches = RequestBatches("svc", max=1)
    for bid in "ab":
        batches.add(request(bid))
    batches.take()
    assert sorted(batches.clear()) == ["a", "b"] and not batches.busy and batches.take() == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "drop", "take", "finish"]), st.integers(0, 9)), max_size=60))
def test_every_request_is_handed_on_once_or_dropped_never_both(steps: list[tuple[str, int]]) -> None:
    """Whatever the order of arrivals, drops, calls and their ends: a request is handed to at most
    one call, answered when its call ends unless the broker answered it first, and none is lost."""
    batches = RequestBatches("svc", max=3)
    added: set[str] = set()
    handed: list[str] = []
    answered: set[str] = set()
    dropped: set[str] = set()  # answered by the broker before this worker answered it
    running: list[str] = []
    for action, n in steps:
        bid = str(n)
        if action == "add" and bid not in added:
            added.add(bid)
            batches.add(request(bid))
        elif action == "drop" and bid in added and bid not in answered and bid not in dropped:
            left = [b for b in running if b not in dropped and b != bid]
            assert batches.drop(bid) == (bid in running and not left)  # the call's last: cancel it
            dropped.add(bid)
        elif action == "take" and not running:
            running = [r.id for r in batches.take()]
            assert len(running) <= 3 and not set(running) & dropped
            handed += running
        elif action == "finish" and running:
            owed = set(batches.finish())
            assert owed == set(running) - dropped
            answered |= owed
            running = []
    answered |= set(batches.finish())
    for _ in range(len(added)):  # each call takes at least one waiting request
        taken = [r.id for r in batches.take()]
        handed += taken
        answered |= set(batches.finish())
    assert not batches.busy
    assert len(handed) == len(set(handed))  # each at most once
    assert not answered & dropped and answered | dropped == added  # each answered once, by one side
