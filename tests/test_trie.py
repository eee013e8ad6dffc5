"""TopicTrie: literal tables, overlap, cache on/off, and a brute-force oracle."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mc0.topics import pattern_matches, split_pattern, split_topic
from mc0.trie import EMPTY, TopicTrie


@pytest.fixture(params=[0, 1024, 4], ids=["cache-off", "cache-on", "cache-tiny"])
def trie(request: pytest.FixtureRequest) -> TopicTrie[str]:
    return TopicTrie(cache_size=request.param)


def P(text: str) -> tuple[str, ...]:
    return split_pattern(text)


def T(text: str) -> tuple[str, ...]:
    return split_topic(text)


def oracle(pattern: str, topic: str) -> bool:
    """Independent matcher: pattern -> regex."""
    parts = []
    for token in pattern.split("."):
        if token == "*":
            parts.append(r"[^.]+")
        elif token == ">":
            parts.append(r"[^.]+(?:\.[^.]+)*")
        else:
            parts.append(re.escape(token))
    return re.fullmatch(r"\.".join(parts), topic) is not None


SUBS = [
    ("a.b.c", "s1"),
    ("a.*.c", "s2"),
    ("a.>", "s3"),
    (">", "s4"),
    ("*.b.*", "s5"),
    ("a.b", "s6"),
    ("a.*.c", "s7"),
]
EXPECTED = {
    "a.b.c": {"s1", "s2", "s3", "s4", "s5", "s7"},
    "a.b": {"s3", "s4", "s6"},
    "a": {"s4"},
    "x.b.y": {"s4", "s5"},
    "a.x.c": {"s2", "s3", "s4", "s7"},
    "a.b.c.d": {"s3", "s4"},
}


@pytest.mark.parametrize(("topic", "expected"), sorted(EXPECTED.items()))
def test_literal_table_matches(trie: TopicTrie[str], topic: str, expected: set[str]) -> None:
    for pattern, value in SUBS:
        assert trie.insert(P(pattern), value)
    assert set(trie.match(T(topic))) == expected
    assert set(trie.match(T(topic))) == expected  # second time from the cache when on


def test_overlapping_patterns_yield_a_value_once(trie: TopicTrie[str]) -> None:
    for pattern in ["a.b", "a.*", "a.>", ">", "*.b"]:
        trie.insert(P(pattern), "peer")
    assert trie.match(T("a.b")) == ("peer",)
    trie.remove(P("a.b"), "peer")
    assert trie.match(T("a.b")) == ("peer",)
    for pattern in ["a.*", "a.>", ">", "*.b"]:
        trie.remove(P(pattern), "peer")
    assert trie.match(T("a.b")) is EMPTY


def test_insert_twice_and_remove_missing_report_false(trie: TopicTrie[str]) -> None:
    assert trie.insert(P("a.*"), "x")
    assert not trie.insert(P("a.*"), "x")
    assert len(trie) == 1
    assert not trie.remove(P("a.b"), "x")
    assert not trie.remove(P("a.*"), "y")
    assert trie.remove(P("a.*"), "x")
    assert not trie.remove(P("a.*"), "x")
    assert len(trie) == 0


def test_no_match_returns_the_shared_empty_result(trie: TopicTrie[str]) -> None:
    trie.insert(P("a.b"), "x")
    assert trie.match(T("z")) is EMPTY
    assert trie.match(T("a.c")) is EMPTY


def test_remove_prunes_nodes(trie: TopicTrie[str]) -> None:
    trie.insert(P("a.b.c.d"), "x")
    trie.insert(P("a.*.>"), "x")
    trie.remove(P("a.b.c.d"), "x")
    trie.remove(P("a.*.>"), "x")
    assert trie._root.is_empty()
    assert list(trie.patterns()) == []


def test_cache_is_patched_on_insert_and_remove() -> None:
    trie: TopicTrie[str] = TopicTrie(cache_size=16)
    trie.insert(P("a.*"), "x")
    assert trie.match(T("a.b")) == ("x",)
    trie.insert(P("a.>"), "y")  # patched in place
    assert set(trie.match(T("a.b"))) == {"x", "y"}
    trie.remove(P("a.*"), "x")
    assert trie.match(T("a.b")) == ("y",)
    assert trie.cache_hits >= 1


def test_cache_stays_bounded() -> None:
    trie: TopicTrie[str] = TopicTrie(cache_size=8)
    trie.insert(P(">"), "x")
    for i in range(100):
        trie.match(T(f"t.{i}"))
        assert trie.cache_len <= 8


def test_ten_thousand_token_topic_matches_iteratively(trie: TopicTrie[str]) -> None:
    deep = tuple(["t"] * 10_000)
    trie.insert(deep, "deep")  # the trie itself has no depth limit and no recursion
    trie.insert(("t", ">"), "tail")
    assert set(trie.match(deep)) == {"deep", "tail"}
    assert trie.remove(deep, "deep")
    assert [p for p, _ in trie.patterns()] == [("t", ">")]


def test_patterns_lists_every_subscription(trie: TopicTrie[str]) -> None:
    for pattern, value in SUBS:
        trie.insert(P(pattern), value)
    listed = {(".".join(p), v) for p, values in trie.patterns() for v in values}
    assert listed == set(SUBS)


TOKENS = ["a", "b", "c", "d"]


@pytest.mark.parametrize("cache_size", [0, 1024, 3])
@pytest.mark.parametrize("seed", range(5))
def test_randomized_against_brute_force_oracle(cache_size: int, seed: int) -> None:
    rng = random.Random(seed)
    trie: TopicTrie[int] = TopicTrie(cache_size=cache_size)
    live: set[tuple[str, int]] = set()

    def random_pattern() -> str:
        n = rng.randint(1, 4)
        tokens = [rng.choice(TOKENS + ["*"]) for _ in range(n)]
        if rng.random() < 0.3:
            tokens[-1] = ">"
        return ".".join(tokens)

    def random_topic() -> str:
        return ".".join(rng.choice(TOKENS) for _ in range(rng.randint(1, 5)))

    for _ in range(600):
        action = rng.random()
        if action < 0.45:
            pattern, value = random_pattern(), rng.randint(0, 9)
            assert trie.insert(P(pattern), value) is ((pattern, value) not in live)
            live.add((pattern, value))
        elif action < 0.7 and live:
            pattern, value = rng.choice(sorted(live))
            assert trie.remove(P(pattern), value)
            live.discard((pattern, value))
        else:
            topic = random_topic()
            got = trie.match(T(topic))
            assert len(got) == len(set(got)), "a value appears twice"
            assert set(got) == {v for p, v in live if oracle(p, topic)}
    assert len(trie) == len(live)


token = st.sampled_from(["a", "b", "*", ">"])


@settings(max_examples=200, deadline=None)
@given(
    patterns=st.lists(st.lists(token, min_size=1, max_size=4), max_size=12),
    topic=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=5),
    cache_size=st.sampled_from([0, 2, 1024]),
)
def test_hypothesis_match_equals_oracle(patterns: list[list[str]], topic: list[str], cache_size: int) -> None:
    trie: TopicTrie[int] = TopicTrie(cache_size=cache_size)
    valid = []
    for i, tokens in enumerate(patterns):
        if ">" in tokens[:-1]:
            continue
        trie.insert(tuple(tokens), i)
        valid.append((".".join(tokens), i))
        trie.match(tuple(topic))  # warm the cache between inserts
    text = ".".join(topic)
    assert set(trie.match(tuple(topic))) == {i for p, i in valid if oracle(p, text)}


@pytest.mark.parametrize(
    ("pattern", "topic", "matches"),
    [
        (">", "mc0.sys.rpc", False),  # the broker's own space stays out of wildcards...
        ("mc0.>", "mc0.sys.peer", False),
        ("*.sys.rpc", "mc0.sys.rpc", False),
        ("mc0.*.rpc", "mc0.sys.rpc", False),
        ("*.*.*", "mc0.sys.rpc", False),
        ("mc0.sys.>", "mc0.sys.rpc", True),  # ...unless a pattern names it
        ("mc0.sys.*", "mc0.sys.peer", True),
        ("mc0.sys.rpc", "mc0.sys.rpc", True),
        (">", "mc0.other.x", True),  # only mc0.sys is set apart
        ("mc0.>", "mc0.rollup.x", True),
        (">", "mc0.sys", True),  # (not a topic the broker publishes: two tokens)
    ],
)
def test_system_topics_are_matched_only_by_patterns_that_name_them(pattern: str, topic: str, matches: bool) -> None:
    for cache_size in (0, 16):
        trie: TopicTrie[str] = TopicTrie(cache_size=cache_size)
        trie.insert(split_pattern(pattern), "v")
        assert trie.match(split_topic(topic)) == (("v",) if matches else ())
        assert trie.match(split_topic(topic)) == (("v",) if matches else ())  # (cached)
        assert pattern_matches(split_pattern(pattern), split_topic(topic)) is matches
