"""TopicTrie: subscription patterns -> values, matched against literal topics.

Modelled on nats-server's ``server/sublist.go``:

* one node per token level, holding a dict of literal children plus dedicated
  ``*`` and ``>`` children (so a wildcard is never looked up as a string);
* ``match`` walks the levels iteratively (no recursion depth tied to input);
* results are cached per topic in a bounded dict; ``insert`` patches cached
  results in place, ``remove`` evicts the cached topics the pattern matched
  (a value may still be reached through another of its patterns);
* every miss returns the one shared empty tuple, so the hot path allocates
  nothing when nobody listens.

Topics under ``mc0.sys.`` are reached only through patterns that name
``mc0.sys`` literally (the rule is :func:`mc0.topics.pattern_matches`'s).

Values are deduplicated: a value subscribed through several overlapping
patterns appears once in a match result (exactly-once delivery per peer).
The caller validates topics/patterns (see :mod:`mc0.topics`); the trie only
needs tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from .topics import SINGLE, SYSTEM_TOKENS, TAIL, is_system, pattern_matches

T = TypeVar("T", bound=Hashable)

EMPTY: tuple[object, ...] = ()
DEFAULT_CACHE_SIZE = 1024


class _Node(Generic[T]):
    __slots__ = ("literal", "single", "tail", "values")

    def __init__(self) -> None:
        self.literal: dict[str, _Node[T]] = {}
        self.single: _Node[T] | None = None
        self.tail: _Node[T] | None = None
        # dict used as an insertion-ordered set: results keep subscription order.
        self.values: dict[T, None] = {}

    def child(self, token: str) -> _Node[T] | None:
        if token == SINGLE:
            return self.single
        if token == TAIL:
            return self.tail
        return self.literal.get(token)

    def is_empty(self) -> bool:
        return not (self.values or self.literal or self.single or self.tail)


class TopicTrie(Generic[T]):
    """Map patterns to sets of values; ``match(topic)`` -> unique values.

    ``cache_size=0`` disables the match cache (tests run both ways).
    Not thread-safe: one owner (the broker loop, or one client).
    """

    def __init__(self, *, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._root: _Node[T] = _Node()
        self._cache: dict[tuple[str, ...], tuple[T, ...]] = {}
        self._cache_size = cache_size
        self._count = 0
        self.cache_hits = 0
        self.cache_misses = 0

    def __len__(self) -> int:
        """Number of (pattern, value) pairs held."""
        return self._count

    def insert(self, pattern: tuple[str, ...], value: T) -> bool:
        """Add value under pattern; False if that pair was already present."""
        node = self._root
        for token in pattern:
            nxt = node.child(token)
            if nxt is None:
                nxt = _Node()
                if token == SINGLE:
                    node.single = nxt
                elif token == TAIL:
                    node.tail = nxt
                else:
                    node.literal[token] = nxt
            node = nxt
        if value in node.values:
            return False
        node.values[value] = None
        self._count += 1
        if self._cache:
            for topic, result in list(self._cache.items()):
                if value not in result and pattern_matches(pattern, topic):
                    self._cache[topic] = (*result, value)
        return True

    def remove(self, pattern: tuple[str, ...], value: T) -> bool:
        """Remove value from pattern; False if that pair was not present."""
        path: list[tuple[_Node[T], str]] = []
        node: _Node[T] | None = self._root
        for token in pattern:
            assert node is not None
            nxt = node.child(token)
            if nxt is None:
                return False
            path.append((node, token))
            node = nxt
        assert node is not None
        if value not in node.values:
            return False
        del node.values[value]
        self._count -= 1
        # Prune emptied nodes bottom-up, iteratively.
        while path and node is not None and node.is_empty():
            parent, token = path.pop()
            if token == SINGLE:
                parent.single = None
            elif token == TAIL:
                parent.tail = None
            else:
                del parent.literal[token]
            node = parent
        if self._cache:
            for topic in [t for t, r in self._cache.items() if value in r and pattern_matches(pattern, t)]:
                del self._cache[topic]
        return True

    def match(self, topic: tuple[str, ...]) -> tuple[T, ...]:
        """Unique values whose patterns match the literal topic tokens."""
        cached = self._cache.get(topic)
        if cached is not None:
            self.cache_hits += 1
            return cached
        self.cache_misses += 1
        result = self._walk(topic)
        if self._cache_size:
            if len(self._cache) >= self._cache_size:
                # Sweep like sublist.go: drop the oldest quarter in one go, so the
                # cost is amortised instead of paid on every miss.
                for stale in list(self._cache)[: max(1, self._cache_size // 4)]:
                    del self._cache[stale]
            self._cache[topic] = result
        return result

    def _walk(self, topic: tuple[str, ...]) -> tuple[T, ...]:
        found: dict[T, None] | None = None
        level: list[_Node[T]] = [self._root]
        if is_system(topic):  # only patterns naming mc0.sys literally reach it (see mc0.topics)
            node: _Node[T] | None = self._root
            for token in SYSTEM_TOKENS:
                node = node.literal.get(token) if node is not None else None
            if node is None:
                return EMPTY  # type: ignore[return-value]
            level = [node]
            topic = topic[2:]
        for token in topic:
            nxt: list[_Node[T]] = []
            for node in level:
                if node.tail is not None and node.tail.values:
                    # '>' still has at least this token to consume: a match.
                    if found is None:
                        found = dict(node.tail.values)
                    else:
                        found.update(node.tail.values)
                if node.single is not None:
                    nxt.append(node.single)
                child = node.literal.get(token)
                if child is not None:
                    nxt.append(child)
            if not nxt:
                level = nxt
                break
            level = nxt
        for node in level:
            if node.values:
                if found is None:
                    found = dict(node.values)
                else:
                    found.update(node.values)
        if found is None:
            return EMPTY  # type: ignore[return-value]
        return tuple(found)

    def patterns(self) -> Iterator[tuple[tuple[str, ...], tuple[T, ...]]]:
        """Every pattern with its values (depth-first, iterative)."""
        stack: list[tuple[_Node[T], tuple[str, ...]]] = [(self._root, ())]
        while stack:
            node, prefix = stack.pop()
            if node.values:
                yield prefix, tuple(node.values)
            if node.tail is not None:
                stack.append((node.tail, (*prefix, TAIL)))
            if node.single is not None:
                stack.append((node.single, (*prefix, SINGLE)))
            for token, child in node.literal.items():
                stack.append((child, (*prefix, token)))

    @property
    def cache_len(self) -> int:
        return len(self._cache)
