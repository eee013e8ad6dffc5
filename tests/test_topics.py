from __future__ import annotations

import pytest

from mc0.errors import InvalidTopic
from mc0.topics import pattern_matches, split_pattern, split_topic

VALID_TOPICS = ["a", "a.b.c", "orders.eu.42", "ünïcødé.トピック", "a*.b>", "x-y_z.1"]
INVALID_TOPICS = [
    ("", False),
    (".a", False),
    ("a.", False),
    ("a..b", False),
    ("a b", False),
    ("a.\tb", False),
    ("a.*", False),
    ("a.>", False),
    ("*", False),
    ("x" * 1025, True),
    (".".join(["t"] * 33), True),
    (".".join(["t"] * 10_000), True),
]
VALID_PATTERNS = ["a", "a.*", "*.b", "*", ">", "a.>", "a.*.>", "a*.b"]
INVALID_PATTERNS = ["", "a.>.b", ">.a", "a..b", "a. b", "a.b.", ".".join(["*"] * 40)]


@pytest.mark.parametrize("topic", VALID_TOPICS)
def test_valid_topics_split_into_tokens(topic: str) -> None:
    assert split_topic(topic) == tuple(topic.split("."))


@pytest.mark.parametrize(("topic", "oversize"), INVALID_TOPICS)
def test_invalid_topics_are_rejected_with_size_flag(topic: str, oversize: bool) -> None:
    with pytest.raises(InvalidTopic) as info:
        split_topic(topic)
    assert info.value.oversize is oversize


@pytest.mark.parametrize("pattern", VALID_PATTERNS)
def test_valid_patterns(pattern: str) -> None:
    assert split_pattern(pattern) == tuple(pattern.split("."))


@pytest.mark.parametrize("pattern", INVALID_PATTERNS)
def test_invalid_patterns(pattern: str) -> None:
    with pytest.raises(InvalidTopic):
        split_pattern(pattern)


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.*", "a", False),
        ("a.>", "a", False),
        ("a.>", "a.b", True),
        ("a.>", "a.b.c.d", True),
        (">", "x", True),
        ("*.*", "a.b", True),
        ("a*.b", "a*.b", True),
        ("a*.b", "ax.b", False),
        ("*.>", "a", False),
        ("*.>", "a.b", True),
    ],
)
def test_pattern_matches_nats_semantics(pattern: str, topic: str, expected: bool) -> None:
    assert pattern_matches(split_pattern(pattern), split_topic(topic)) is expected
