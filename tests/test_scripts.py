"""Smoke runs of the scripts in scripts/ (seconds, no thresholds) so they cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent.parent / "scripts"


def test_bench_trie_runs_and_reports_ratios(tmp_path: Path) -> None:
    out = tmp_path / "trie.json"
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "bench_trie.py"),
            "--seconds",
            "0.05",
            "--subscriptions",
            "300",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert set(data) == {"literal", "wildcard-30%"}
    assert all(row["ratio_cache_on"] > 0 for row in data.values())
