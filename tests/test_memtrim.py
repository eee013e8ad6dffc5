"""Trimmer: malloc_trim after dropped queues freed enough, at most once an interval."""

from __future__ import annotations

import pytest

from mc0.broker import memtrim
from mc0.broker.memtrim import Trimmer

pytestmark = pytest.mark.timeout(30)

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("steps", "trims"),
    [
        ([(0, 0.0)], 0),  # nothing freed
        ([(15 * MIB, 0.0)], 0),  # under the threshold
        ([(16 * MIB, 0.0)], 1),  # at it
        ([(16 * MIB, 0.0), (40 * MIB, 0.5)], 1),  # enough again, but within the interval
        ([(16 * MIB, 0.0), (40 * MIB, 0.5), (40 * MIB, 1.0)], 2),  # the interval passed: what waited
        ([(16 * MIB, 0.0), (20 * MIB, 5.0)], 1),  # the interval passed, not enough freed since
        ([(10 * MIB, 0.0), (20 * MIB, 0.1)], 1),  # freed in two steps: counted together
    ],
)
def test_a_trim_comes_after_enough_was_freed_and_at_most_once_an_interval(
    steps: list[tuple[int, float]], trims: int
) -> None:
    calls: list[int] = []

    def fake(pad: int) -> int:
        calls.append(pad)
        return 1

    trimmer = Trimmer(threshold=16 * MIB, interval=1.0, trim=fake)
    for freed_total, now in steps:
        trimmer.maybe_trim(freed_total, now)
    assert calls == [0] * trims and trimmer.trims == trims


def test_off_or_without_malloc_trim_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Trimmer(trim=None).maybe_trim(1 << 40, 10.0) is False
    monkeypatch.setattr(memtrim, "_malloc_trim", lambda: None)  # musl, macOS
    trimmer = Trimmer()
    assert trimmer.maybe_trim(1 << 40, 10.0) is False and trimmer.trims == 0


def test_the_c_librarys_malloc_trim_is_found_and_called_here() -> None:
    trimmer = Trimmer(threshold=1, interval=0.0)
    assert trimmer.maybe_trim(1, 0.0) is True  # (this machine's glibc has it)
    assert trimmer.trims == 1
