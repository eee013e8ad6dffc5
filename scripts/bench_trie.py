#!/usr/bin/env python3
"""Topic trie match rate with N subscriptions against a brute-force scan, in one run.

Prints matches/s for the trie (cache on and off) and for a linear scan of
every pattern with ``pattern_matches``, and the ratios. Bounded: each
measurement runs for --seconds (default 1.0).

    python scripts/bench_trie.py [--subscriptions 10000] [--seconds 1.0] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

from mc0.topics import pattern_matches
from mc0.trie import TopicTrie

WORDS = [f"w{i}" for i in range(40)]


def make_patterns(n: int, wildcard_share: float, rng: random.Random) -> list[tuple[str, ...]]:
    patterns = []
    for _ in range(n):
        tokens = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
        if rng.random() < wildcard_share:
            tokens[rng.randrange(len(tokens))] = "*"
            if rng.random() < 0.3:
                tokens[-1] = ">"
        patterns.append(tuple(tokens))
    return patterns


def rate(fn: Callable[[tuple[str, ...]], object], topics: list[tuple[str, ...]], seconds: float) -> float:
    done = 0
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        for topic in topics[:200]:
            fn(topic)
        done += 200
        topics.append(topics.pop(0))
    return done / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscriptions", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    rng = random.Random(7)
    results = {}
    for mix, share in (("literal", 0.0), ("wildcard-30%", 0.3)):
        patterns = make_patterns(args.subscriptions, share, rng)
        topics = [tuple(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) for _ in range(2000)]
        cached: TopicTrie[int] = TopicTrie()
        uncached: TopicTrie[int] = TopicTrie(cache_size=0)
        for i, p in enumerate(patterns):
            cached.insert(p, i)
            uncached.insert(p, i)

        def brute(topic: tuple[str, ...], patterns: list[tuple[str, ...]] = patterns) -> object:
            return [i for i, p in enumerate(patterns) if pattern_matches(p, topic)]

        for topic in topics[:50]:
            assert set(cached.match(topic)) == set(brute(topic)) == set(uncached.match(topic))
        base = rate(brute, list(topics), args.seconds)
        row = {
            "brute_force_per_s": base,
            "trie_cache_off_per_s": rate(uncached.match, list(topics), args.seconds),
            "trie_cache_on_per_s": rate(cached.match, list(topics), args.seconds),
        }
        row["ratio_cache_off"] = row["trie_cache_off_per_s"] / base
        row["ratio_cache_on"] = row["trie_cache_on_per_s"] / base
        results[mix] = row
        print(
            f"{mix:>13} {args.subscriptions} subs: brute {base:10.0f}/s  "
            f"trie {row['trie_cache_off_per_s']:10.0f}/s ({row['ratio_cache_off']:.0f}x)  "
            f"cached {row['trie_cache_on_per_s']:10.0f}/s ({row['ratio_cache_on']:.0f}x)"
        )
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
