"""PatternTable: a client's local subscriptions, and which of them a received topic is for.

Contract: a subscription is held under its local key (:func:`mc0.events.group_key`:
the pattern, or ``"pattern group"`` for a queue group's); ``add`` and ``remove``
take the pattern's tokens, the key and the group.  ``match(topic, group)``
answers ``(topic, group, keys)`` for a received MESSAGE (its topic and group as
the bytes that came): a plain copy is for every plain subscription whose
pattern matches, a queue group's copy only for that group's subscriptions.
Each local key appears once, so overlapping subscriptions see a message once.
This is the client's one match from topics to local subscriptions: every
MESSAGE, whatever shape it came in, is matched here ("route" is another
broker's word, never this).  Answers are cached per
received topic (the receive hot path decodes and matches a topic once, not
per message) until the table changes.  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from .errors import InvalidTopic
from .topics import split_topic
from .trie import TopicTrie

CACHE_SIZE = 4096  # received topics (senders) remembered with their answer (cleared when full)
UNBOUNDED = 1 << 30  # a received topic is matched as it came: the broker applied the limits

K = TypeVar("K")
V = TypeVar("V")

# (topic, group, the local keys it is for)
Match = tuple[str, str | None, tuple[str, ...]]


class Remembered(dict[K, V], Generic[K, V]):
    """Answers computed on first sight and remembered (at most CACHE_SIZE, then forgotten at
    once): ``remembered[key]`` is a dict lookup when the key was seen before (the receive hot
    path indexes it directly), ``compute(key)`` otherwise."""

    def __init__(self, compute: Callable[[K], V]) -> None:
        super().__init__()
        self._compute = compute

    def __missing__(self, key: K) -> V:
        if len(self) >= CACHE_SIZE:
            self.clear()
        found = self[key] = self._compute(key)
        return found


class PatternTable:
    """Local subscriptions by pattern (plain) and by group (queue groups), with the matches of
    the topics received so far: ``matches[topic]`` for a plain copy, ``group_matches[group, topic]``
    for a queue group's (both :class:`Remembered`; ``match`` is the same as one call)."""

    def __init__(self) -> None:
        self._plain: TopicTrie[str] = TopicTrie()
        self._groups: dict[str, TopicTrie[str]] = {}  # queue group -> its subscriptions' keys
        self.matches: Remembered[bytes, Match] = Remembered(self._plain_match)
        self.group_matches: Remembered[tuple[bytes, bytes], Match] = Remembered(self._group_match)

    def add(self, tokens: tuple[str, ...], key: str, group: str | None) -> None:
        """A new local subscription: ``key`` for the pattern of ``tokens`` (in ``group``)."""
        if group is None:
            self._plain.insert(tokens, key)
            self.matches.clear()
        else:
            self._groups.setdefault(group, TopicTrie()).insert(tokens, key)
            self.group_matches.clear()

    def remove(self, tokens: tuple[str, ...], key: str, group: str | None) -> None:
        """The local subscription ``key`` is gone."""
        if group is None:
            self._plain.remove(tokens, key)
            self.matches.clear()
            return
        keys = self._groups.get(group)
        if keys is not None:
            keys.remove(tokens, key)
            if not keys:
                del self._groups[group]
        self.group_matches.clear()

    def match(self, topic: bytes, group: bytes | None) -> Match:
        """``(topic, group, keys)``: the local subscriptions a MESSAGE on ``topic`` (a queue
        group's copy when ``group`` is given) is for; UnicodeDecodeError for a topic or group
        that is not UTF-8.  A topic no pattern can match (not a valid topic) is for nobody."""
        return self.matches[topic] if group is None else self.group_matches[group, topic]

    def _plain_match(self, topic: bytes) -> Match:
        text = topic.decode()
        return text, None, _match(self._plain, text)

    def _group_match(self, group_and_topic: tuple[bytes, bytes]) -> Match:
        group, topic = group_and_topic
        text, group_text = topic.decode(), group.decode()
        keys = self._groups.get(group_text)
        return text, group_text, _match(keys, text) if keys is not None else ()


def _match(keys: TopicTrie[str], topic: str) -> tuple[str, ...]:
    try:
        tokens = split_topic(topic, max_bytes=UNBOUNDED, max_tokens=UNBOUNDED)
    except InvalidTopic:
        return ()
    return keys.match(tokens) if tokens else ()
