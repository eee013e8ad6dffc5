"""The CLI says the same things the same way (issue 13, point 8): --json on pub, ping and keys list;
``sub --wait`` running out is a plain line and its own exit status; ``--from`` without a journal
names the option; every command's --timeout help says what it bounds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mc0.process import BrokerProcess

from .conftest import write_config


def mc0(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mc0", *args], capture_output=True, text=True, timeout=30, cwd=cwd)


def test_pub_and_ping_json(tmp_path: Path) -> None:
    config = write_config(tmp_path, '[journals.main]\ntopics = ["kept.>"]\n')
    with BrokerProcess(insecure=True, config=config) as broker:
        ep = ("--endpoint", broker.endpoint)
        kept = mc0("pub", "kept.a", "x", "--confirm", "--json", "--msgid", "m1", *ep)
        assert kept.returncode == 0, kept.stderr
        assert json.loads(kept.stdout) == {"topic": "kept.a", "journal": "main", "seq": 1, "duplicate": False}
        again = mc0("pub", "kept.a", "x", "--confirm", "--json", "--msgid", "m1", *ep)
        assert json.loads(again.stdout)["duplicate"] is True
        live = mc0("pub", "live.a", "x", "--confirm", "--json", *ep)
        assert json.loads(live.stdout) == {"topic": "live.a", "journal": None, "seq": None, "duplicate": False}
        pings = mc0("ping", "--count", "3", "--json", *ep)
        assert pings.returncode == 0, pings.stderr
        lines = [json.loads(line) for line in pings.stdout.splitlines()]
        assert len(lines) == 4 and all(line["rtt_ms"] > 0 for line in lines[:3])
        assert lines[3]["count"] == 3 and lines[3]["min_ms"] <= lines[3]["median_ms"]


def test_keys_list_json(tmp_path: Path) -> None:
    assert mc0("keys", "new", "alice", "--dir", str(tmp_path / "keys")).returncode == 0
    assert mc0("keys", "new", "bob", "--dir", str(tmp_path / "keys")).returncode == 0
    allow = mc0("keys", "allow", "alice", "--dir", str(tmp_path / "keys"), "--allowed", str(tmp_path / "allowed"))
    assert allow.returncode == 0, allow.stderr
    listed = mc0("keys", "list", "--json", "--dir", str(tmp_path / "keys"), "--allowed", str(tmp_path / "allowed"))
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert rows["alice"]["status"] == "allowed" and rows["bob"]["status"] == "-"
    assert rows["alice"]["secret"] is True and len(rows["alice"]["fingerprint"]) > 8


def test_sub_wait_running_out_is_not_an_error(broker: BrokerProcess) -> None:
    result = mc0("sub", "quiet.>", "other", "--wait", "0.3", "--endpoint", broker.endpoint)
    assert result.returncode == 3
    assert result.stderr.strip() == "mc0: no message within 0.3s on quiet.>, other (0 received)"


def test_sub_from_without_a_journal_names_the_option(tmp_path: Path) -> None:
    config = write_config(tmp_path, '[journals.a]\ntopics = ["x.>"]\n[journals.b]\ntopics = [">"]\n')
    with BrokerProcess(insecure=True, config=config) as broker:
        both = mc0("sub", "x.y", "--from", "0", "--count", "1", "--endpoint", broker.endpoint)
        assert both.returncode == 1
        assert "several journals keep these topics (a, b): name one (--journal" in both.stderr
        assert "JOURNAL" not in both.stderr


@pytest.mark.parametrize(
    ("command", "needle"),
    [
        ("ping", "Seconds to wait for each answer from the broker"),
        ("pub", "Seconds to wait for each answer from the broker"),
        ("sub", "Seconds to wait for each answer from the broker"),
        ("stats", "Seconds to wait for each answer from the broker"),
        ("call", "The request's deadline in seconds"),
    ],
)
def test_timeout_help_says_what_it_bounds(command: str, needle: str) -> None:
    result = mc0(command, "--help")
    text = " ".join(result.stdout.split())
    assert needle in text and "(call: the request deadline" not in text


def test_bench_help_names_the_command() -> None:
    result = mc0("bench", "--help-bench")
    assert result.returncode == 0 and result.stdout.startswith("usage: mc0 bench ")


@pytest.mark.parametrize(
    ("event", "line"),
    [
        (
            {
                "batchId": 3,
                "numInputRows": 1200,
                "processedRowsPerSecond": 4000.4,
                "sources": [{"endOffset": '{"seq":500}', "latestOffset": '{"seq":750}'}],
            },
            "batch 3: 1,200 records (4,000/s), journal seq 500, 250 behind the head",
        ),
        (
            {"batchId": 0, "numInputRows": 0, "sources": [{"endOffset": {"seq": 7}, "latestOffset": None}]},
            "batch 0: 0 records (0/s), journal seq 7",
        ),
        ({"batchId": 1, "numInputRows": 5, "sources": [{"endOffset": "not json"}]}, "batch 1: 5 records (0/s)"),
        ({"batchId": 2}, "batch 2: 0 records (0/s)"),
    ],
)
def test_pipeline_progress_lines(event: dict[str, object], line: str) -> None:
    from mc0.spark.pipeline import progress_line

    assert progress_line(event) == line


def test_bench_loads_an_existing_broker(broker: BrokerProcess) -> None:
    result = mc0("bench", "--endpoint", broker.endpoint, "--pub", "2", "--sub", "2", "--msgs", "2000", "--size", "64")
    assert result.returncode == 0, result.stderr
    assert "pub: 2 publisher(s), 2,000 msgs of 64 B" in result.stdout
    assert "sub: 2 subscriber(s), 4,000 msgs delivered" in result.stdout
    assert "published" in result.stderr and "delivered" in result.stderr  # the progress bar
    bad = mc0("bench", "--endpoint", "127.0.0.1:1")
    assert bad.returncode == 1 and bad.stderr.strip().startswith("mc0: error: endpoint: '127.0.0.1:1' has no scheme")


def test_bench_scenarios_each_show_their_own_options() -> None:
    top = mc0("bench", "--endpoint", "tcp://127.0.0.1:1", "--help")
    assert top.returncode == 0, top.stderr
    assert all(name in top.stdout for name in ("pubsub", "pub", "sub", "request", "reply", "rpc"))
    assert "--key" in top.stdout and "--broker-key" in top.stdout and "--config" in top.stdout
    request = mc0("bench", "--endpoint", "tcp://127.0.0.1:1", "request", "--help")
    assert request.returncode == 0 and request.stdout.startswith("usage: mc0 bench --endpoint URL request")
    assert "--inflight" in request.stdout and "--clients" in request.stdout and "--pub " not in request.stdout
    pub = mc0("bench", "--endpoint", "tcp://127.0.0.1:1", "pub", "--help")
    assert "--pub" in pub.stdout and "--inflight" not in pub.stdout and "--key" in pub.stdout
    plain = mc0("bench", "--help")  # without --endpoint: the command's own help, not a traceback
    assert plain.returncode == 0 and "--endpoint URL" in plain.stdout
    bad = mc0("bench", "--endpoint", "tcp://127.0.0.1:1", "request", "--inflight", "0")
    assert bad.returncode == 2 and "--inflight must be at least 1" in bad.stderr


def test_bench_scenarios_load_a_curve_broker_with_key_options_or_a_config(curve: Any, tmp_path: Path) -> None:
    setup, broker = curve
    keys = ("--key", str(setup.secret("alice")), "--broker-key", str(setup.broker_key))
    rpc = mc0("bench", "--endpoint", broker.endpoint, *keys, "rpc", "--msgs", "500", "--inflight", "20")
    assert rpc.returncode == 0, rpc.stderr
    assert "request: 1 client(s) x 20 in flight, 500 calls of 128 B" in rpc.stdout
    client = tmp_path / "client.toml"
    client.write_text(f'[client]\nkey = "{setup.secret("bob")}"\nbroker_key = "{setup.broker_key}"\n')
    pub = mc0("bench", "--endpoint", broker.endpoint, "--config", str(client), "pub", "--msgs", "500", "--size", "10")
    assert pub.returncode == 0, pub.stderr
    assert "pub: 1 publisher(s), 500 msgs of 10 B" in pub.stdout
    stranger = mc0("bench", "--endpoint", broker.endpoint, "--key", str(setup.secret("mallory")), "--broker-key",
                   str(setup.broker_key), "pub", "--msgs", "10", "--timeout", "2")  # fmt: skip
    assert stranger.returncode == 1 and stranger.stderr.strip().startswith("mc0: error:")
    assert "Traceback" not in stranger.stderr
