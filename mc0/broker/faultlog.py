"""FaultLog: what the broker loop writes when a guarded step raises, bounded for a step that raises every turn.

Contract: ``fault(step, exc, now)`` is called from an ``except`` block (``now``:
a monotonic time).  The first fault of a kind (the step, the exception's type
and the line it was raised at) is logged with its traceback; the same kind
again is only counted until ``repeat_s`` passed since that kind was last
written: then one line (no traceback) says how many came since and the last
one's message.  So a step that raises every turn (thousands of turns a second)
writes one traceback and then a line per ``repeat_s``, not a traceback a turn.
At most ``max_kinds`` kinds are remembered (the oldest written is forgotten:
it gets its traceback again).  Not thread-safe: the loop's thread only.
"""

from __future__ import annotations

import logging
import traceback
from collections import OrderedDict

log = logging.getLogger("mc0.broker")

REPEAT_S = 60.0  # a fault that keeps coming is said again at most this often
MAX_KINDS = 64


class _Kind:
    __slots__ = ("written", "since")

    def __init__(self, written: float) -> None:
        self.written = written  # when it was last written
        self.since = 0  # how many came since, not written


def kind_of(step: str, exc: BaseException) -> tuple[str, str, str]:
    """(step, exception type, the file:line it was raised at): faults alike are one kind."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return step, type(exc).__qualname__, where


class FaultLog:
    def __init__(self, what: str, *, repeat_s: float = REPEAT_S, max_kinds: int = MAX_KINDS) -> None:
        """``what``: the work that failed, as the log line names it ("the broker's timer work")."""
        self.what = what
        self.repeat_s = repeat_s
        self.max_kinds = max_kinds
        self._kinds: OrderedDict[tuple[str, str, str], _Kind] = OrderedDict()  # the last written last
        self.left_out = 0  # faults counted, not written (all kinds)

    def fault(self, step: str, exc: BaseException, now: float) -> bool:
        """Write ``exc`` (raised by ``step``) or count it; True if it was written."""
        key = kind_of(step, exc)
        kind = self._kinds.get(key)
        if kind is None:
            self._kinds[key] = _Kind(now)
            while len(self._kinds) > self.max_kinds:
                self._kinds.popitem(last=False)
            log.error("internal error in %s (%s)", self.what, step, exc_info=exc)
            return True
        if now - kind.written < self.repeat_s:
            kind.since += 1
            self.left_out += 1
            return False
        log.error(
            "internal error in %s (%s) again: %d times since it was last written %.0f s ago "
            "(its traceback was written the first time); the last: %s: %s",
            self.what,
            step,
            kind.since + 1,
            now - kind.written,
            type(exc).__name__,
            str(exc)[:200],
        )
        kind.written, kind.since = now, 0
        self._kinds.move_to_end(key)
        return True
