"""The suite's own rules, run on a throwaway suite with this conftest: a skipped test (in a test or
a whole module) fails the run, with or without pytest-xdist; a missing dependency fails loudly,
naming how to install it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SPARK_JOBS, require, unit_of

HERE = Path(__file__).parent

HIDDEN = {
    "test_skip_in_a_test.py": 'import pytest\n\ndef test_hidden():\n    pytest.skip("no reason")\n',
    "test_skip_a_module.py": 'import pytest\n\npytest.importorskip("mc0_no_such_module")\n\ndef test_x():\n    pass\n',
}


def run_suite(folder: Path, *options: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(HERE / "conftest.py", folder / "conftest.py")
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *options, str(folder)]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=100)


@pytest.mark.parametrize("options", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_a_skipped_test_fails_the_run(tmp_path: Path, options: tuple[str, ...]) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, text in HIDDEN.items():
        (suite / name).write_text(text)
    (suite / "test_fine.py").write_text("def test_fine():\n    assert 1 + 1 == 2\n")
    result = run_suite(suite, *options)
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout[-2000:] + result.stderr[-2000:]
    assert "skipped tests fail the run" in result.stdout
    assert all(name in result.stdout for name in HIDDEN), result.stdout[-2000:]
    for name in HIDDEN:
        (suite / name).unlink()
    passing = run_suite(suite, *options)
    assert passing.returncode == pytest.ExitCode.OK, passing.stdout[-2000:] + passing.stderr[-2000:]


def test_a_missing_dependency_fails_with_the_install_hint() -> None:
    with pytest.raises(ImportError, match=r"mc0_no_such_module is not installed: .*`\./run test` installs"):
        require("mc0_no_such_module")
    assert require("zmq").__name__ == "zmq"


@pytest.mark.parametrize(
    ("nodeid", "unit"),
    [
        ("tests/test_spark.py::test_source_and_sink_over_curve", "spark"),
        ("tests/test_spark_cluster.py::test_a_bad_source_option_is_one_line_before_spark_starts", SPARK_JOBS),
        ("tests/test_pipeline.py::test_report_without_tables_is_one_clear_error", SPARK_JOBS),
        (
            "tests/test_scripts.py::test_spark_scan_bench_smoke_run_reads_every_record_beside_the_plain_source",
            SPARK_JOBS,
        ),  # one function of a file whose other tests are another unit
        ("tests/test_scripts.py::test_bench_harness_smoke_run_reports_rows_and_ratios", "bench"),
        ("tests/test_fuzz.py::test_a_generated_config_loads_or_is_one_config_error", "fuzz"),
        ("tests/test_conformance.py::test_x[a-b]", "tests/test_conformance.py"),
        ("tests/test_topics.py::test_match[a.b-a.*]", "tests/test_topics.py::test_match"),  # variants together
        ("tests/test_topics.py::test_plain", "tests/test_topics.py::test_plain"),
    ],
)
def test_unit_of_puts_each_test_in_its_unit(nodeid: str, unit: str) -> None:
    assert unit_of(nodeid) == unit
