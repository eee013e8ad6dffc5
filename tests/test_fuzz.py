"""Coverage-guided fuzzing in the suite: the checked-in corpus replays in every run, and atheris
mutates from it for a bounded time (MC0_FUZZ_SECONDS, default 60); any crash fails the test and
its input is written under the test's folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import require

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
@pytest.mark.timeout(120)
def test_the_corpus_replays_without_a_crash(tmp_path: Path) -> None:
    inputs = sorted((HERE / "corpus").iterdir())
    assert len(inputs) > 50
    result = run_fuzzer(tmp_path, "-runs=0", corpus=[HERE / "corpus"], timeout=100)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.long
@pytest.mark.timeout(300)
def test_fuzzing_from_the_corpus_finds_no_crash(tmp_path: Path) -> None:
    seconds = int(os.environ.get("MC0_FUZZ_SECONDS", "60"))
    corpus = tmp_path / "corpus"
    shutil.copytree(HERE / "corpus", corpus)
    result = run_fuzzer(
        tmp_path,
        f"-max_total_time={seconds}",
        "-max_len=16384",
        "-timeout=10",
        "-rss_limit_mb=2048",
        f"-dict={HERE / 'mc0.dict'}",
        corpus=[corpus],
        timeout=seconds + 120,
    )
    crashes = sorted(p.name for p in tmp_path.glob("crash-*")) + sorted(p.name for p in tmp_path.glob("timeout-*"))
    assert result.returncode == 0 and not crashes, (crashes, result.stderr[-4000:])
