"""Give memory freed by dropped queues back to the operating system (glibc's ``malloc_trim``).

Contract: ``Trimmer.maybe_trim(freed_total, now)`` is called once per loop
turn with the outbox's running count of bytes freed by dropping queues (an
evicted slow consumer, a peer gone) and the time; once at least
``threshold`` bytes were freed since the last trim, and ``interval`` seconds
have passed, it calls ``malloc_trim(0)``.  Why: the queues hold big message
bodies that glibc serves from its heaps once a large block has been freed
(its mmap threshold rises); freed, they stay in the process's RSS when a
smaller block sits above them, so an operator would see a broker that never
gave back what an evicted peer cost.  ``malloc_trim`` releases every free
page of every arena.  Cost: it walks the heaps (about a millisecond per
100 MiB), at most once per ``interval``.  Where the C library has no
``malloc_trim`` (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger("mc0.broker")

TRIM_THRESHOLD = 16 * 1024 * 1024  # bytes freed by dropped queues before a trim is worth it
TRIM_INTERVAL_S = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class Trimmer:
    def __init__(
        self,
        *,
        threshold: int = TRIM_THRESHOLD,
        interval: float = TRIM_INTERVAL_S,
        trim: Callable[[int], int] | None | bool = True,
    ) -> None:
        """``trim``: True finds the C library's ``malloc_trim`` (at the first trim: the constructor
        loads nothing); a callable stands in for it (tests); None turns trimming off."""
        self.threshold = threshold
        self.interval = interval
        self._find = trim is True
        self._trim: Callable[[int], int] | None = None if isinstance(trim, bool) else trim
        self._freed_at_last = 0
        self._last = float("-inf")
        self.trims = 0
        # The freed total from which a trim is worth it: the loop compares before it calls (no call a turn).
        self.worth_from = threshold

    def maybe_trim(self, freed_total: int, now: float) -> bool:
        """Trim if enough was freed since the last trim and the interval passed; True if it trimmed."""
        if freed_total - self._freed_at_last < self.threshold or now - self._last < self.interval:
            return False
        self._freed_at_last = freed_total
        self.worth_from = freed_total + self.threshold
        self._last = now
        if self._find:
            self._find = False
            self._trim = _malloc_trim()
        if self._trim is None:
            return False
        self.trims += 1
        self._trim(0)
        return True
