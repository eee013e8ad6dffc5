"""mc0.broker.faultlog: a guarded step that raises every turn writes its traceback once, then a line per
``repeat_s`` with the count; another kind of fault (another step, type or line) gets its own traceback."""

from __future__ import annotations

import logging

import pytest

from mc0.broker.faultlog import FaultLog

pytestmark = pytest.mark.timeout(10)


def raised(message: str, kind: type[Exception] = RuntimeError) -> Exception:
    try:
        raise kind(message)
    except Exception as exc:
        return exc


def other_line(message: str) -> Exception:
    try:
        raise RuntimeError(message)
    except Exception as exc:
        return exc


def test_a_fault_every_turn_is_written_once_with_its_traceback_then_counted_and_said_again_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="mc0.broker")
    faults = FaultLog("the broker's timer work", repeat_s=60.0)
    written = [faults.fault("_pages", raised(f"bug {i}"), now=i * 0.001) for i in range(1000)]
    assert written == [True] + [False] * 999 and faults.left_out == 999
    (first,) = caplog.records
    assert first.exc_info is not None and "the broker's timer work (_pages)" in first.getMessage()
    caplog.clear()
    assert faults.fault("_pages", raised("bug late"), now=61.0)  # a minute since: said again, no traceback
    (again,) = caplog.records
    assert again.exc_info is None
    assert "again: 1000 times since it was last written 61 s ago" in again.getMessage()
    assert again.getMessage().endswith("the last: RuntimeError: bug late")
    assert not faults.fault("_pages", raised("bug"), now=62.0)


@pytest.mark.parametrize(
    "step, fault",
    [
        ("_commit", raised("bug")),  # another step
        ("_pages", raised("bug", ValueError)),  # another type
        ("_pages", other_line("bug")),  # raised at another line
    ],
)
def test_another_kind_of_fault_is_written_with_its_own_traceback(
    caplog: pytest.LogCaptureFixture, step: str, fault: Exception
) -> None:
    caplog.set_level(logging.ERROR, logger="mc0.broker")
    faults = FaultLog("the broker's timer work")
    assert faults.fault("_pages", raised("bug"), now=0.0)
    assert faults.fault(step, fault, now=0.1)
    assert [r.exc_info is not None for r in caplog.records] == [True, True]


def test_the_kinds_remembered_are_bounded_and_the_oldest_forgotten_is_written_again() -> None:
    faults = FaultLog("work", max_kinds=4)
    assert all(faults.fault(f"step{i}", raised("bug"), now=0.0) for i in range(5))
    assert faults.fault("step0", raised("bug"), now=0.1)  # forgotten: its traceback again
    assert not faults.fault("step4", raised("bug"), now=0.1)
