"""Topic traffic: messages and bytes published per topic, for ``/subsz``'s ``topics`` and ``mc0 top``.

Contract: ``tally(topic)`` returns the :class:`Tally` a publish on ``topic``
adds to (``msgs += 1``, ``bytes += n``: two increments where the publish
is handled; the batched PUT path keeps the tally in its topic cache, so a
record costs no lookup here).  At most ``MAX_TOPICS`` topics are counted
one by one (memory stays bounded whatever topics peers invent); beyond them
every new topic adds to the one ``OTHER`` tally, and ``prune`` (called by
the dispatcher's tick, at most every ``PRUNE_INTERVAL``) makes room again by
dropping the topics that saw nothing since the previous prune, raising
``generation`` so that a cache holding their tallies lets them go.  The
figures are totals since the broker started (a rate is the difference of
two readings); ``report(limit)`` gives the busiest first.  Pure: no
sockets, no clock (``now`` is passed in).
"""

from __future__ import annotations

MAX_TOPICS = 4096
OTHER = ""  # the tally of topics beyond MAX_TOPICS (shown as "(other topics)")
PRUNE_INTERVAL = 60.0  # seconds


class Tally:
    __slots__ = ("msgs", "bytes", "seen")

    def __init__(self) -> None:
        self.msgs = 0
        self.bytes = 0
        self.seen = 0  # msgs as of the last prune: unchanged since means idle


class TopicTraffic:
    def __init__(self, max_topics: int = MAX_TOPICS) -> None:
        self.max_topics = max_topics
        self.topics: dict[str, Tally] = {}
        self.other = Tally()
        self.generation = 0  # raised when tallies are dropped: caches of them start afresh
        self._next_prune = 0.0

    def tally(self, topic: str) -> Tally:
        found = self.topics.get(topic)
        if found is not None:
            return found
        if len(self.topics) >= self.max_topics:
            return self.other
        found = self.topics[topic] = Tally()
        return found

    def add(self, topic: str, size: int) -> None:
        """One message on ``topic`` (``size`` body bytes): the general path's count."""
        tally = self.tally(topic)
        tally.msgs += 1
        tally.bytes += size

    def prune(self, now: float) -> None:
        """Drop the topics idle since the last prune, when the table is full (at most every PRUNE_INTERVAL)."""
        if now < self._next_prune:
            return
        self._next_prune = now + PRUNE_INTERVAL
        idle = [topic for topic, t in self.topics.items() if t.msgs == t.seen]
        if len(self.topics) >= self.max_topics and idle:
            for topic in idle:
                del self.topics[topic]
            self.generation += 1
        for t in self.topics.values():
            t.seen = t.msgs

    def report(self, limit: int = 100) -> list[dict[str, object]]:
        """The busiest ``limit`` topics (by messages), then the others' total if any."""
        busiest = sorted(self.topics.items(), key=lambda item: (-item[1].msgs, item[0]))[:limit]
        rows: list[dict[str, object]] = [{"topic": t, "msgs": v.msgs, "bytes": v.bytes} for t, v in busiest]
        if self.other.msgs:
            rows.append({"topic": OTHER, "msgs": self.other.msgs, "bytes": self.other.bytes, "other": True})
        return rows
