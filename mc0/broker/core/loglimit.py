"""LogLimiter: what one peer can make the broker write to its log is bounded.

Contract (pure: ``now`` is passed in): ``allow(who, kind, now)`` says whether
a log line of ``kind`` caused by ``who`` (a peer's identity) may be written.
Per ``(who, kind)`` at most ``per_key`` lines are written in each ``window``
seconds and per ``kind`` at most ``per_kind`` (so peers that reconnect under
new names still share one bound); the rest are counted.  ``summary(now)``
returns, once per window, the lines that say how many were left out (the
caller writes them: one line per kind).  The table of keys is bounded too
(the oldest window is dropped first).
"""

from __future__ import annotations

PER_KEY = 5  # lines per (peer, kind) per window
PER_KIND = 50  # lines per kind per window, over all peers
WINDOW = 60.0  # seconds
MAX_KEYS = 4096


class LogLimiter:
    def __init__(
        self, *, per_key: int = PER_KEY, per_kind: int = PER_KIND, window: float = WINDOW, max_keys: int = MAX_KEYS
    ) -> None:
        self.per_key = per_key
        self.per_kind = per_kind
        self.window = window
        self.max_keys = max_keys
        self._window_start: float | None = None
        self._by_key: dict[tuple[str, str], int] = {}
        self._by_kind: dict[str, int] = {}
        self._suppressed: dict[str, tuple[int, set[str]]] = {}  # kind -> (lines left out, by whom, bounded)
        self.suppressed_total = 0

    def _roll(self, now: float) -> None:
        if self._window_start is None or now - self._window_start >= self.window or now < self._window_start:
            self._window_start = now
            self._by_key.clear()
            self._by_kind.clear()

    def allow(self, who: str, kind: str, now: float) -> bool:
        """True: write the line.  False: it was counted instead."""
        self._roll(now)
        key = (who, kind)
        seen = self._by_key.get(key, 0)
        kind_seen = self._by_kind.get(kind, 0)
        if seen < self.per_key and kind_seen < self.per_kind:
            if key not in self._by_key and len(self._by_key) >= self.max_keys:
                self._by_key.pop(next(iter(self._by_key)))
            self._by_key[key] = seen + 1
            self._by_kind[kind] = kind_seen + 1
            return True
        count, whom = self._suppressed.get(kind, (0, set()))
        if len(whom) < 8:
            whom.add(who)
        self._suppressed[kind] = (count + 1, whom)
        self.suppressed_total += 1
        return False

    def summary(self, now: float) -> list[str]:
        """Lines saying what was left out, once the window in which it was left out is over."""
        if not self._suppressed or self._window_start is None or now - self._window_start < self.window:
            return []
        window = f"{self.window:.0f}s"
        lines = [
            f"{count} more log lines like {kind!r} left out in the last {window} (from {', '.join(sorted(whom))})"
            for kind, (count, whom) in sorted(self._suppressed.items())
        ]
        self._suppressed.clear()
        self._roll(now)
        return lines
