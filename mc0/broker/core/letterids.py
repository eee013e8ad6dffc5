"""LetterIds: the MSGIDs of the letters (``PUT TO``) a broker took, so that a re-sent letter is taken once.

Contract (pure: ``now`` is passed in): ``remember(sender, msgid, outcome, now)`` notes that the letter
``sender`` sent with ``msgid`` was ``delivered`` or ``stored``; ``outcome_of(sender, msgid, now)`` is
that outcome while it is younger than ``window_s`` (else None).  MSGIDs are per sender, as a journal's:
one identity cannot suppress another's letters by reusing their MSGID.  At most ``max_ids`` are kept
and at most ``max_bytes`` of senders' names and MSGIDs (a MSGID has no length bound of its own),
the oldest forgotten first, so the memory is bounded whatever the senders do; ``window_s`` 0 keeps
none.  ``forget`` drops one (a letter whose record was not written after all).  This memory lasts
the broker's run: a kept letter's MSGID is also in the record its mailbox journal keeps (that
journal's own dedup memory, rebuilt on restart), and JetStream's duplicate window dedups the letters
a JetStream journal keeps, cluster-wide.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_BYTES = 16 << 20  # senders' names and MSGIDs remembered, at most (with max_ids)


class LetterIds:
    def __init__(self, window_s: float, max_ids: int, max_bytes: int = MAX_BYTES) -> None:
        self.window_s = window_s
        self.max_ids = max_ids
        self.max_bytes = max_bytes
        self._ids: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()  # oldest first
        self.bytes = 0  # len(sender) + len(msgid) of each remembered

    def __len__(self) -> int:
        return len(self._ids)

    def outcome_of(self, sender: str, msgid: str, now: float) -> str | None:
        self._expire(now)
        seen = self._ids.get((sender, msgid))
        return seen[0] if seen is not None else None

    def remember(self, sender: str, msgid: str, outcome: str, now: float) -> None:
        if not self.window_s:
            return
        key = (sender, msgid)
        self.forget(sender, msgid)
        self._ids[key] = (outcome, now)
        self.bytes += len(sender) + len(msgid)
        while len(self._ids) > self.max_ids or self.bytes > self.max_bytes:
            self._drop(next(iter(self._ids)))

    def forget(self, sender: str, msgid: str) -> None:
        if (sender, msgid) in self._ids:
            self._drop((sender, msgid))

    def _drop(self, key: tuple[str, str]) -> None:
        del self._ids[key]
        self.bytes -= len(key[0]) + len(key[1])

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        ids = self._ids
        while ids:
            key = next(iter(ids))
            if ids[key][1] > horizon:
                return
            self._drop(key)
