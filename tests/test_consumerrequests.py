"""mc0.protocol.consumerrequests: the mc0.consumer requests on one consumer, as a table of literal
cases (each good one's typed request, each bad one's status and whole error text), the body's own
refusals, and the op checked apart from its arguments (the broker's own consumers check grants
between the two); any JSON object fuzzed in gives a request or a 400, never another exception."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mc0.errors import ProtocolError
from mc0.protocol.consumerrequests import (
    ConsumerConfig,
    ConsumerDelete,
    ConsumerInfo,
    ConsumerPull,
    ConsumerRequest,
    ConsumerSettle,
    consumer_op,
    consumer_query,
    consumer_request,
    parse_config,
    parse_consumer_request,
)

J = {"journal": "main", "name": "c"}
OPS = "ops: create, pull, ack, nak, term, info, delete, list"
MOST = tuple(range(1, 10_001))  # as many seqs as one request may settle
SEQS = "seqs must be a list of at most 10000 positive integers"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # good: the typed request
        ({"op": "info", **J}, ConsumerInfo("main", "c")),
        ({"op": "delete", **J}, ConsumerDelete("main", "c")),
        ({"op": "info"}, ConsumerInfo("", "")),  # (no journal, no name: no such consumer, found later)
        ({"op": "info", "journal": 7, "name": None}, ConsumerInfo("7", "None")),  # as str() has them
        ({"op": "pull", **J}, ConsumerPull("main", "c", 100, 0)),
        ({"op": "pull", **J, "max": 1, "wait_ms": 5000}, ConsumerPull("main", "c", 1, 5000)),
        ({"op": "pull", **J, "max": 1000, "wait_ms": 0}, ConsumerPull("main", "c", 1000, 0)),
        ({"op": "ack", **J, "seqs": [3, 1, 3]}, ConsumerSettle("main", "c", "ack", (3, 1, 3), 0)),
        ({"op": "ack", **J, "seqs": []}, ConsumerSettle("main", "c", "ack", (), 0)),
        ({"op": "term", **J, "seqs": [1]}, ConsumerSettle("main", "c", "term", (1,), 0)),
        ({"op": "nak", **J, "seqs": [2]}, ConsumerSettle("main", "c", "nak", (2,), 0)),
        ({"op": "nak", **J, "seqs": [2], "delay_ms": 86_400_000}, ConsumerSettle("main", "c", "nak", (2,), 86_400_000)),
        ({"op": "ack", **J, "seqs": [1], "delay_ms": "soon"}, ConsumerSettle("main", "c", "ack", (1,), 0)),  # nak only
        ({"op": "ack", **J, "seqs": [*MOST]}, ConsumerSettle("main", "c", "ack", MOST, 0)),
        # bad: 400 and the whole text
        ({}, f"unknown op 'None'; {OPS}"),
        ({"op": "fly"}, f"unknown op 'fly'; {OPS}"),
        ({"op": "create"}, f"unknown op 'create'; {OPS}"),  # not on one consumer
        ({"op": "list"}, f"unknown op 'list'; {OPS}"),
        ({"op": ["pull"]}, f"unknown op '['pull']'; {OPS}"),  # as the peer sent it, never a repr
        ({"op": "x" * 100}, f"unknown op '{'x' * 40}...'; {OPS}"),
        ({"op": "pull", "max": 0}, "max must be an integer in [1, 1000]"),
        ({"op": "pull", "max": 1001}, "max must be an integer in [1, 1000]"),
        ({"op": "pull", "max": 2.0}, "max must be an integer in [1, 1000]"),
        ({"op": "pull", "max": True}, "max must be an integer in [1, 1000]"),
        ({"op": "pull", "max": "5"}, "max must be an integer in [1, 1000]"),
        ({"op": "pull", "max": None}, "max must be an integer in [1, 1000]"),
        ({"op": "pull", "max": 5, "wait_ms": -1}, "wait_ms must be an integer in [0, 30000]"),
        ({"op": "pull", "wait_ms": 30_001}, "wait_ms must be an integer in [0, 30000]"),
        ({"op": "pull", "max": 0, "wait_ms": -1}, "max must be an integer in [1, 1000]"),  # the first wrong field
        ({"op": "ack"}, SEQS),
        ({"op": "ack", "seqs": "1"}, SEQS),
        ({"op": "ack", "seqs": 1}, SEQS),
        ({"op": "ack", "seqs": [0]}, SEQS),
        ({"op": "term", "seqs": [-1]}, SEQS),
        ({"op": "ack", "seqs": [True]}, SEQS),
        ({"op": "ack", "seqs": [1.0]}, SEQS),
        ({"op": "nak", "seqs": [1, "2"]}, SEQS),
        ({"op": "ack", "seqs": list(range(1, 10_002))}, SEQS),
        ({"op": "nak", "seqs": "x", "delay_ms": -1}, SEQS),  # the first wrong field
        ({"op": "nak", "seqs": [1], "delay_ms": "soon"}, "delay_ms must be an integer in [0, 86400000]"),
        ({"op": "nak", "seqs": [1], "delay_ms": -1}, "delay_ms must be an integer in [0, 86400000]"),
        ({"op": "nak", "seqs": [1], "delay_ms": 86_400_001}, "delay_ms must be an integer in [0, 86400000]"),
        ({"op": "nak", "seqs": [1], "delay_ms": False}, "delay_ms must be an integer in [0, 86400000]"),
    ],
)
def test_parse_consumer_request(query: dict[str, Any], expected: ConsumerRequest | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(ProtocolError) as caught:
            parse_consumer_request(query, "r", max_wait_ms=30_000)
        assert (caught.value.code, caught.value.reason, caught.value.request_id) == (400, expected, "r")
    else:
        assert parse_consumer_request(query, "r", max_wait_ms=30_000) == expected


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # good: the config (the journal is the one the request named, found by the caller)
        ({"name": "c"}, ConsumerConfig("main", "c")),
        ({"name": "A-z_9", "topics": "jobs.*"}, ConsumerConfig("main", "A-z_9", ("jobs.*",))),
        (
            {"name": "c", "topics": ["a.>", "b"], "ack_wait_ms": 1, "max_deliver": 1_000_000, "deliver": "new"},
            ConsumerConfig("main", "c", ("a.>", "b"), 1, 1_000_000, 1_000, "new"),
        ),
        (
            {"name": "c", "max_ack_pending": 100_000, "ack_wait_ms": 86_400_000},
            ConsumerConfig("main", "c", (">",), 86_400_000, 5, 100_000),
        ),
        ({"name": "x" * 64}, ConsumerConfig("main", "x" * 64)),
        # bad: 400 and the whole text
        ({}, "name must be 1-64 letters, digits, '-' or '_'"),
        ({"name": ""}, "name must be 1-64 letters, digits, '-' or '_'"),
        ({"name": "x" * 65}, "name must be 1-64 letters, digits, '-' or '_'"),
        ({"name": "a.b"}, "name must be 1-64 letters, digits, '-' or '_'"),
        ({"name": 7}, "name must be 1-64 letters, digits, '-' or '_'"),
        ({"name": "c", "topics": []}, "topics must be a non-empty list of patterns"),
        ({"name": "c", "topics": [1]}, "topics must be a non-empty list of patterns"),
        ({"name": "c", "topics": None}, "topics must be a non-empty list of patterns"),
        ({"name": "c", "topics": ["a..b"]}, "invalid topic 'a..b': empty token"),
        ({"name": "c", "deliver": "sometimes"}, "deliver must be 'all' or 'new'"),
        ({"name": "c", "ack_wait_ms": 0}, "ack_wait_ms must be an integer in [1, 86400000]"),
        ({"name": "c", "max_deliver": 0}, "max_deliver must be an integer in [1, 1000000]"),
        ({"name": "c", "max_ack_pending": 100_001}, "max_ack_pending must be an integer in [1, 100000]"),
        ({"name": "bad name", "topics": []}, "name must be 1-64 letters, digits, '-' or '_'"),  # the first wrong field
    ],
)
def test_parse_config(query: dict[str, Any], expected: ConsumerConfig | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(ProtocolError) as caught:
            parse_config("main", query, "r")
        assert (caught.value.code, caught.value.reason) == (400, expected)
    else:
        config, patterns = parse_config("main", query, "r")
        assert config == expected and patterns == tuple(tuple(t.split(".")) for t in expected.topics)


def test_a_pull_waits_at_most_the_brokers_max_wait_ms() -> None:
    assert parse_consumer_request({"op": "pull", "wait_ms": 500}, "r", max_wait_ms=500).wait_ms == 500  # type: ignore[union-attr]
    with pytest.raises(ProtocolError, match=r"^400 wait_ms must be an integer in \[0, 499\]$"):
        parse_consumer_request({"op": "pull", "wait_ms": 500}, "r", max_wait_ms=499)


def test_the_op_is_checked_apart_from_its_arguments() -> None:
    """An op known with arguments still wrong: the op passes, its arguments are refused after."""
    query = {"op": "pull", "max": 0}
    assert consumer_op(query, "r") == "pull"
    with pytest.raises(ProtocolError, match=r"max must be"):
        consumer_request("pull", query, "r", max_wait_ms=1)
    with pytest.raises(ProtocolError, match=r"^400 unknown op 'fly'"):
        consumer_op({"op": "fly", "max": 0}, "r")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ([b'{"op": "info"}'], {"op": "info"}),
        ([b'{"op": ', b'"info"}'], {"op": "info"}),  # frames joined
        ([b'  {"op": "info"}\n'], {"op": "info"}),
        ([b"[1]"], (400, "body must be a JSON object")),
        ([b'"info"'], (400, "body must be a JSON object")),
        ([b""], (400, "body must be JSON")),
        ([b"\xff"], (400, "body must be JSON")),
        ([json.dumps({"x": "y" * 70_000}).encode()], (413, "body of 70009 bytes, the limit is 65536")),
    ],
)
def test_consumer_query(body: list[bytes], expected: dict[str, Any] | tuple[int, str]) -> None:
    if isinstance(expected, tuple):
        with pytest.raises(ProtocolError) as caught:
            consumer_query(body, "r")
        assert (caught.value.code, caught.value.reason) == expected
    else:
        assert consumer_query(body, "r") == expected


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
INT_TEXTS = ("max must be", "wait_ms must be", "delay_ms must be")


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["op", "journal", "name", "max", "wait_ms", "seqs", "delay_ms"]),
        JSON | st.sampled_from(["info", "pull", "ack", "nak", "term", "delete"]) | st.lists(st.integers(), max_size=4),
    )
)
def test_parse_consumer_request_takes_any_json_a_request_or_a_400(query: dict[str, Any]) -> None:
    try:
        request = parse_consumer_request(query, "r", max_wait_ms=30_000)
    except ProtocolError as exc:
        assert exc.code == 400 and exc.reason.startswith(("unknown op ", SEQS, *INT_TEXTS)), exc.reason
    else:
        assert isinstance(request, ConsumerInfo | ConsumerDelete | ConsumerPull | ConsumerSettle)
        assert (request.journal, request.name) == (str(query.get("journal", "")), str(query.get("name", "")))
