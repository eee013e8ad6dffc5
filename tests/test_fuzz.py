"""Coverage-guided fuzzing in the suite: the checked-in corpus replays in every run, and atheris
mutates from it for a bounded time (MC0_FUZZ_SECONDS, default 60); any crash fails the test and
its input is written under the test's folder.  Batched input is part of that target (see
tests/fuzz/fuzz_core.py).  Configs are fuzzed with hypothesis: generated TOML text must load or be
one ConfigError, and a real broker reloads generated configs at SIGHUP without stopping
(MC0_FUZZ_CONFIGS, MC0_FUZZ_RELOADS examples)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import mc0
from mc0.config import load
from mc0.errors import ConfigError
from mc0.process import BrokerProcess

from .conftest import require
from .fuzz_configs import config_texts

HERE = Path(__file__).parent / "fuzz"
TARGET = HERE / "fuzz_core.py"

require("atheris")


def run_fuzzer(tmp_path: Path, *options: str, corpus: list[Path], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TARGET), *options, *map(str, corpus)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,  # crash-* artifacts land here
    )


@pytest.mark.long
@pytest.mark.timeout(600)
def test_the_corpus_replays_and_fuzzing_from_it_finds_no_crash(tmp_path: Path) -> None:
    """One fuzzer run: libFuzzer first runs every checked-in input whole (its INITED line; none is over
    -max_len), then mutates from them for MC0_FUZZ_SECONDS.  (The replay alone took 57 s of a quiet
    full run, so it is not run a second time on its own.)"""
    inputs = sorted((HERE / "corpus").iterdir())
    assert len(inputs) > 50
    max_len = 16384
    assert max(path.stat().st_size for path in inputs) <= max_len  # replayed whole, not cut
    seconds = int(os.environ.get("MC0_FUZZ_SECONDS", "60"))
    corpus = tmp_path / "corpus"
    shutil.copytree(HERE / "corpus", corpus)
    result = run_fuzzer(
        tmp_path,
        f"-max_total_time={seconds}",
        f"-max_len={max_len}",
        "-timeout=10",
        "-rss_limit_mb=2048",
        f"-dict={HERE / 'mc0.dict'}",
        corpus=[corpus],
        timeout=seconds + 400,  # (the replay: 57 s quiet, over 100 s beside the suite and a CPU hog per core)
    )
    crashes = sorted(p.name for p in tmp_path.glob("crash-*")) + sorted(p.name for p in tmp_path.glob("timeout-*"))
    assert result.returncode == 0 and not crashes, (crashes, result.stderr[-4000:])
    assert f"seed corpus: files: {len(inputs)} " in result.stderr, result.stderr[-4000:]
    assert re.search(r"^#\d+\s+INITED ", result.stderr, re.MULTILINE), result.stderr[-4000:]  # all ran first


# ---------------------------------------------------------------- configs, loaded and reloaded (SIGHUP)
@pytest.mark.timeout(300)  # (400 examples: 47 s in a quiet full run, over 60 s beside a loaded suite)
@settings(max_examples=int(os.environ.get("MC0_FUZZ_CONFIGS", "400")), deadline=None, database=None)
@given(text=config_texts())
def test_a_generated_config_loads_or_is_one_config_error(text: str) -> None:
    """Whatever the file says, ``load`` returns a Config or raises ConfigError with one line."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "loop").symlink_to("loop")
        path = Path(folder) / "mc0.toml"
        path.write_text(text, encoding="utf-8")
        try:
            load(path)
        except ConfigError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 1000


@pytest.mark.timeout(300)
def test_sighup_with_generated_configs_never_stops_the_broker(tmp_path: Path) -> None:
    """A real broker reloads a generated config at each SIGHUP (bounded: MC0_FUZZ_RELOADS examples);
    it keeps answering, and a good config still takes effect at the end."""
    (tmp_path / "loop").symlink_to("loop")
    config = tmp_path / "mc0.toml"
    config.write_text("")
    with BrokerProcess(config=str(config), insecure=True) as broker, mc0.Client(broker.endpoint) as client:

        def reloads() -> int:
            return int(json.loads(client.request("mc0.broker", "stats").body)["counters"].get("reloads", 0))

        @settings(
            max_examples=int(os.environ.get("MC0_FUZZ_RELOADS", "100")),
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(text=config_texts(permissions=False))  # (the client asks the broker: keep it allowed to)
        def reload(text: str) -> None:
            config.write_text(text, encoding="utf-8")
            before = reloads()
            broker.signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while reloads() == before:  # bounded: each round is a request; 10 s at most
                assert time.monotonic() < deadline, "the reload was never done"
                time.sleep(0.01)
            assert client.ping(timeout=5) < 5.0

        reload()
        config.write_text('[permissions.default]\npublish = ["ok.>"]\ncall = [">"]\nsubscribe = [">"]\n')
        broker.signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while True:  # the good config takes effect (bounded in time)
            try:
                client.publish("other", b"x", confirm=True)
            except mc0.Forbidden:
                break
            assert time.monotonic() < deadline, "a good config did not take effect"
            time.sleep(0.02)
        assert broker.proc is not None and broker.proc.poll() is None
