"""mc0.deadlines: O(1) add and discard, expiry never early and at most a tick late, against a model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mc0.deadlines import Deadlines


def test_literal_cases() -> None:
    d: Deadlines[str] = Deadlines(tick=0.01)
    assert d.next_due() is None and d.pop_due(100.0) == [] and len(d) == 0
    d.add(1.001, "a")
    d.add(1.004, "b")
    d.add(2.0, "c")
    assert len(d) == 3 and "a" in d
    assert d.next_due() == 1.01  # the end of the bucket that holds 1.001 and 1.004
    assert d.pop_due(1.0009) == []  # never early
    assert d.pop_due(1.005) == []  # (the bucket ends at 1.01)
    assert d.pop_due(1.01) == ["a", "b"]  # in the order added
    assert "a" not in d and len(d) == 1
    d.discard("c")
    d.discard("c")  # twice: nothing
    d.discard("never added")
    assert d.next_due() is None and d.pop_due(10.0) == []
    d.add(5.0, "x")
    d.add(3.0, "x")  # added again: moved
    assert d.next_due() == 3.0 and d.pop_due(3.0) == ["x"] and d.pop_due(10.0) == []
    d.add(4.0, "y")
    d.clear()
    assert len(d) == 0 and d.next_due() is None


def test_what_next_due_names_is_due_then() -> None:
    # e.g. 76.377: its bucket 15276 ends at 15276 * 0.005, which divided by 0.005 again rounds below 15276
    d: Deadlines[str] = Deadlines(tick=0.005)
    for i, when in enumerate((0.015, 76.377, 65.159, 38.12, 18.591, 1.015)):
        d.add(when, f"x{i}")
        due = d.next_due()
        assert due is not None and due >= when
        assert d.pop_due(due) == [f"x{i}"]


def test_a_settled_item_is_forgotten_at_once() -> None:
    """The point of the module: finished requests do not wait here for their deadlines."""
    d: Deadlines[object] = Deadlines()
    for i in range(100_000):
        item = object()
        d.add(30.0 + i * 1e-6, item)
        d.discard(item)
    assert len(d) == 0
    assert d.next_due() is None  # the emptied buckets are dropped on the way
    assert not d._buckets and not d._keys


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "discard", "pop"]),
            st.integers(min_value=0, max_value=7),
            st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
        ),
        max_size=60,
    )
)
def test_against_a_model(ops: list[tuple[str, int, float]]) -> None:
    tick = 0.01
    d: Deadlines[int] = Deadlines(tick=tick)
    model: dict[int, float] = {}
    clock = 0.0
    for op, item, value in ops:
        if op == "add":
            d.add(clock + value, item)
            model[item] = clock + value
        elif op == "discard":
            d.discard(item)
            model.pop(item, None)
        else:
            clock += value / 4
            due = d.pop_due(clock)
            assert len(due) == len(set(due))
            for x in due:
                assert model.pop(x) <= clock + 1e-12  # never early
            assert all(when > clock - tick - 1e-9 for when in model.values())  # at most a tick late
        assert len(d) == len(model)
        nxt = d.next_due()
        if model:
            assert nxt is not None and min(model.values()) - 1e-12 <= nxt <= min(model.values()) + tick + 1e-9
        else:
            assert nxt is None
