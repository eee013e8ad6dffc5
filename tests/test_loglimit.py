"""The log's bound (mc0.broker.core.loglimit.LogLimiter): what a peer's input may make the broker write to
its log, per peer and per kind of line, the rest counted and summed up once a window; the internal
errors a peer causes are logged within it."""

from __future__ import annotations

import logging

import pytest

from mc0.broker.core.dispatch import BrokerCore
from mc0.broker.core.loglimit import PER_KEY, LogLimiter

from .test_batch import as_frames, connect_batched
from .test_core import f


def test_the_log_limiter_bounds_lines_per_peer_and_per_kind_and_counts_the_rest() -> None:
    limiter = LogLimiter(per_key=2, per_kind=3, window=10.0)
    assert [limiter.allow("mallory", "boom", 0.0) for _ in range(4)] == [True, True, False, False]
    assert limiter.allow("eve", "boom", 1.0) is True  # another peer, the same kind: within the kind's bound
    assert limiter.allow("trent", "boom", 1.0) is False  # the kind's bound holds over all peers
    assert limiter.allow("mallory", "other", 1.0) is True  # another kind
    assert limiter.summary(5.0) == []  # once per window
    (line,) = limiter.summary(10.0)
    assert "3 more log lines like 'boom'" in line and "mallory" in line and "trent" in line
    assert limiter.allow("mallory", "boom", 10.5) is True  # a new window
    assert limiter.suppressed_total == 3


def test_the_log_limiters_table_of_keys_is_bounded() -> None:
    limiter = LogLimiter(per_key=1, per_kind=10**9, window=10.0, max_keys=16)
    for i in range(1000):
        limiter.allow(f"peer{i}", "kind", 0.0)
    assert len(limiter._by_key) <= 16


def test_internal_errors_a_peer_causes_are_logged_within_a_bound_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    core = BrokerCore()
    assert connect_batched(core, b"p")[0] == b"OK"
    caplog.set_level(logging.ERROR, logger="mc0.broker")
    for i in range(1000):
        out = core.internal_error(b"p", f("PING", "ID", str(i)), ValueError("bug"), now=i * 0.001)
        (answer,) = [as_frames(item) for rid, item in out if rid == b"p"]
        assert answer[:3] == f("ERROR", "ID", str(i))  # each still answered 500 with its ID
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == PER_KEY
    assert core.counters["internal_errors"] == 1000 and core.counters["log_lines_left_out"] == 1000 - PER_KEY
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="mc0.broker")
    core.tick(61.0)  # the window is over: one line says how many were left out
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"{1000 - PER_KEY} more log lines" in line
