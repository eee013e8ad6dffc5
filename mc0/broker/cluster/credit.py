"""The link thread's posts to the broker loop, counted: the credit that bounds what waits in the pipe.

Contract: :class:`Poster` is the link thread's ``post``; it counts the bytes of
the bulky kinds it is told (a JetStream feed's ``Records``, route traffic)
from when they are posted until the loop has taken them (``consumed``).
Whoever posts those kinds waits while more than the budget waits there: the
route inbound for credit (:mod:`.inbound`), a JetStream feed by holding its
flow control (:mod:`mc0.broker.jetstream.feed`).  Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

# What the link posted to the broker loop and the loop has not taken yet, beyond which posters wait.
FEED_BUDGET_BYTES = 64 * 1024 * 1024


class Poster:
    """The link thread's ``post`` to the broker loop, counting the bytes of the bulky messages in the
    pipe (the kinds named in ``counted``: a JetStream feed's ``Records``, route traffic): added here when posted
    (link thread), taken off by ``consumed`` (the loop, as it receives them).  Thread-safe; ``send``
    never blocks."""

    def __init__(
        self,
        send: Callable[[Sequence[bytes]], None],
        budget: int = FEED_BUDGET_BYTES,
        *,
        counted: frozenset[bytes] = frozenset(),
    ) -> None:
        self._send = send
        self.budget = budget
        self.counted = counted
        self._lock = threading.Lock()
        self._backlog = 0
        self._wake: Callable[[], None] | None = None  # armed by a waiter: called once the budget frees

    def __call__(self, frames: Sequence[bytes]) -> None:
        if frames[0] in self.counted:
            size = sum(len(f) for f in frames)
            with self._lock:
                self._backlog += size
        self._send(frames)

    def consumed(self, size: int) -> None:
        """The loop took a counted message of ``size`` bytes (all its frames) off the pipe."""
        with self._lock:
            self._backlog = max(0, self._backlog - size)
            wake = self._wake if self._backlog < self.budget else None
            if wake is not None:
                self._wake = None
        if wake is not None:
            wake()

    def arm(self, wake: Callable[[], None]) -> bool:
        """Have ``wake`` called (once, from the thread that frees it) when the budget is no longer spent;
        False, and nothing armed, when it is not spent now."""
        with self._lock:
            if self._backlog < self.budget:
                return False
            self._wake = wake
            return True

    @property
    def backlog(self) -> int:
        return self._backlog

    @property
    def over(self) -> bool:
        """Too much waits for the loop: hold flow control."""
        return self._backlog >= self.budget
