"""LetterIds: the MSGIDs of the letters (``PUT TO``) a broker took, so that a re-sent letter is taken once.

Contract (pure: ``now`` is passed in): ``remember(sender, msgid, outcome, now)`` notes that the letter
``sender`` sent with ``msgid`` was ``delivered`` or ``stored``; ``outcome_of(sender, msgid, now)`` is
that outcome while it is younger than ``window_s`` (else None).  MSGIDs are per sender, as a journal's:
one identity cannot suppress another's letters by reusing their MSGID.  At most ``max_ids`` are kept
(the oldest forgotten first), so the memory is bounded whatever the senders do; ``window_s`` 0 keeps
none.  This memory lasts the broker's run: a kept letter's MSGID is also in the record its mailbox
journal keeps (that journal's own dedup memory, rebuilt on restart), and JetStream's duplicate window
dedups the letters a JetStream journal keeps, cluster-wide.
"""

from __future__ import annotations

from collections import OrderedDict


class LetterIds:
    def __init__(self, window_s: float, max_ids: int) -> None:
        self.window_s = window_s
        self.max_ids = max_ids
        self._ids: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()  # oldest first

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
        self._ids.pop(key, None)
        self._ids[key] = (outcome, now)
        while len(self._ids) > self.max_ids:
            self._ids.popitem(last=False)

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        ids = self._ids
        while ids:
            key = next(iter(ids))
            if ids[key][1] > horizon:
                return
            del ids[key]
