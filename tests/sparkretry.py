"""Spark's one race with a loaded box, and the only failure the Spark tests run again.

Spark waits a hard-coded 10 s for a new Python worker to connect back
(``PythonWorkerFactory.createSimpleWorker``: a streaming Python data source starts one per query).  On a
box loaded far past its cores (the suite's workers, a CPU hog per core beside it) the worker's start,
importing pyspark, can take longer, and the query fails with "Python worker failed to connect back" before
it read anything.  A user's recovery is to run the query again from its checkpoint, which is what these
tests check anyway (exactly once across restarts); any other failure is never retried.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

WORKER_LATE = "Python worker failed to connect back"
ATTEMPTS = 6  # (3 were not enough with a CPU hog per core beside the whole suite: each try costs ~10-20 s)

T = TypeVar("T")


def again_if_worker_late(attempt: Callable[[], T]) -> T:
    """``attempt()``, run again (at most ``ATTEMPTS`` runs) while it raises Spark's worker race."""
    for run in range(1, ATTEMPTS + 1):
        try:
            return attempt()
        except Exception as exc:  # (py4j's and pyspark's own exception types)
            if WORKER_LATE not in str(exc) or run == ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def run_again_if_worker_late(
    run: Callable[[], subprocess.CompletedProcess[str]],
) -> subprocess.CompletedProcess[str]:
    """A Spark job's process, run again (at most ``ATTEMPTS`` runs) while it failed with the worker race."""
    result = run()
    for _ in range(ATTEMPTS - 1):
        if result.returncode == 0 or WORKER_LATE not in (result.stderr or "") + (result.stdout or ""):
            break
        result = run()
    return result


def run_spark_job(
    command: Sequence[str], *, within: float, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A Spark job's process (``command``), run again while it failed with the worker race, every run
    within ``within`` seconds in all (a run is given what is left).  A job that outlives it fails the test
    with how long it ran and the end of what it printed (Spark's progress: where the time went), never
    with a bare ``TimeoutExpired``."""
    deadline = time.monotonic() + within

    def attempt() -> subprocess.CompletedProcess[str]:
        began = time.monotonic()
        try:
            return subprocess.run(
                command, cwd=cwd, env=env, capture_output=True, text=True, timeout=max(1.0, deadline - began)
            )
        except subprocess.TimeoutExpired as exc:
            printed = "\n".join(_text(part)[-4000:] for part in (exc.stdout, exc.stderr))
            raise AssertionError(
                f"the Spark job ran {time.monotonic() - began:.0f} s and was stopped ({within:.0f} s for all its "
                f"runs): {' '.join(command[:6])} ...; the end of what it printed:\n{printed}"
            ) from None

    return run_again_if_worker_late(attempt)


def _text(output: str | bytes | None) -> str:
    """What a timed-out process printed (``TimeoutExpired`` carries bytes even with ``text=True``)."""
    if output is None:
        return ""
    return output if isinstance(output, str) else output.decode(errors="replace")
