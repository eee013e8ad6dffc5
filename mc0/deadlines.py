"""Deadlines: things that expire, kept in time buckets so that one settled early is forgotten at once.

Contract: ``add(when, item)`` and ``discard(item)`` cost O(1); ``pop_due(now)``
takes every item whose bucket has ended by ``now`` (each at most ``tick``
seconds after its ``when``, never before), in bucket order; ``next_due()``
is when the earliest bucket ends (None when nothing waits).  Items are
hashable and held by identity of their hash; adding one again moves it.
Pure: no clock (``now`` and ``when`` are the caller's).

Why not a heap of ``(when, item)``: a heap can only forget an item at its
deadline, so every request answered in a millisecond stayed there for its
whole timeout (a broker serving 25,000 calls a second with 30 s timeouts
held 750,000 finished requests, their bodies, and the garbage collector's
time over them).  Here a settled item leaves at once; the buckets left
empty wait, as empty dicts, for their time to be popped (at most one per
``tick`` of the longest timeout in use).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)

TICK = 0.005  # seconds: how late an expiry may fire (never early)


class Deadlines(Generic[T]):
    __slots__ = ("tick", "_buckets", "_keys", "_key_of")

    def __init__(self, tick: float = TICK) -> None:
        self.tick = tick
        self._buckets: dict[int, dict[T, None]] = {}  # bucket -> its items (insertion order)
        self._keys: list[int] = []  # a heap of the buckets' numbers
        self._key_of: dict[T, int] = {}

    def add(self, when: float, item: T) -> None:
        key = -int(-when // self.tick)  # the first bucket that ends at or after ``when``
        old = self._key_of.get(item)
        if old is not None:
            if old == key:
                return
            self._buckets[old].pop(item, None)
        self._key_of[item] = key
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = {}
            heapq.heappush(self._keys, key)
        bucket[item] = None

    def discard(self, item: T) -> None:
        """Forget ``item`` (settled before its deadline); nothing if it is not here."""
        key = self._key_of.pop(item, None)
        if key is not None:
            del self._buckets[key][item]

    def __contains__(self, item: T) -> bool:
        return item in self._key_of

    def __len__(self) -> int:
        return len(self._key_of)

    def next_due(self) -> float | None:
        """When the earliest bucket that holds anything ends (empty ones are dropped on the way)."""
        keys, buckets = self._keys, self._buckets
        while keys:
            key = keys[0]
            if buckets[key]:
                return key * self.tick
            heapq.heappop(keys)
            del buckets[key]
        return None

    def pop_due(self, now: float) -> list[T]:
        """Every item of the buckets that ended by ``now``, forgotten here."""
        keys, buckets, key_of = self._keys, self._buckets, self._key_of
        due: list[T] = []
        tick = self.tick
        # (the same product next_due returns: now / tick can round below the bucket it named)
        while keys and keys[0] * tick <= now:
            bucket = buckets.pop(heapq.heappop(keys))
            for item in bucket:
                del key_of[item]
            due += bucket
        return due

    def clear(self) -> None:
        self._buckets.clear()
        self._keys.clear()
        self._key_of.clear()
