"""A smoke run of the benchmark harness (seconds, no thresholds) so it cannot rot."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import require

SCRIPTS = Path(__file__).parent.parent / "scripts"


def run_script(command: list[str], *, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, capture_output=True, text=True, timeout=timeout)``, with the script in a
    session of its own that is killed whole when it is done or ``timeout`` (or the test's own timeout)
    runs out: a bench script starts brokers, NATS nodes and load generators, which ``subprocess.run``'s
    kill of its one child would leave running beside the rest of the suite."""
    with subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # (whatever of its session is left; none after a clean exit)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


# Bounds against a hang, not measures: a quick run takes ~30 s on an idle machine and was seen past
# 110 s on two shared, loaded cores (CI's), where every child process starts slowly.
# Benchmarks load the machine on purpose: under pytest-xdist these run one after another on one worker,
# the Spark scan's with the other Spark jobs (conftest.ONE_WORKER).
pytestmark = pytest.mark.long


def _gone(pid: int) -> bool:
    """No process ``pid`` any more, or only its zombie (killed, not yet reaped by init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (FileNotFoundError, ProcessLookupError):
        return True


SPAWNS_A_GRANDCHILD = (
    "import subprocess, sys, time; "
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
    "print(child.pid, flush=True); time.sleep(float(sys.argv[1]))"
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("script_sleeps", "timeout"), [(0, 30), (60, 3)], ids=["exits", "times out"])
def test_run_script_leaves_nothing_of_the_script_running(tmp_path: Path, script_sleeps: float, timeout: float) -> None:
    """What a bench script started and left (its brokers: here a sleeping grandchild, which holds none
    of the script's pipes) goes with it, whether the script exits or its bound runs out."""
    command = [sys.executable, "-c", SPAWNS_A_GRANDCHILD, str(script_sleeps)]
    if script_sleeps < timeout:
        result = run_script(command, timeout=timeout)
        grandchild = int(result.stdout.split()[0])
    else:
        with pytest.raises(subprocess.TimeoutExpired) as raised:
            run_script(command, timeout=timeout)
        said = raised.value.stdout
        said = said.decode() if isinstance(said, bytes) else said or ""
        assert said.strip(), "the script printed its child's pid before the bound ran out"
        grandchild = int(said.split()[0])
    deadline = time.monotonic() + 20
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(grandchild), f"the script's child {grandchild} still runs"


@pytest.mark.timeout(480)  # (~60 s quiet, 156 s beside the suite and a CPU hog per core, 200+ at load 20)
def test_bench_harness_smoke_run_reports_rows_and_ratios(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = run_script(
        [sys.executable, str(SCRIPTS / "bench.py"), "--quick", "--only", "1->1", "--only", "RPC sequential",
         "--only", "RPC 100 in flight, 1", "--only", "trie", "--only", "loop turn",
         "--systems", "mc0,mc0-batched,mc0+curve,pyzmq-loop",
         "--json", str(out)],
        timeout=420,  # a hang guard with room for a loaded box, not a speed claim
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    measured = {(r["scenario"], r["system"]) for r in report["rows"] if r["runs"] and r["median"] > 0}
    for system in ("mc0", "mc0+curve", "pyzmq-loop"):
        assert ("pub/sub 1->1", system) in measured
        assert ("RPC sequential", system) in measured
    assert ("pub/sub 1->1", "mc0-batched") in measured  # the broker alone on the batched wire
    assert ("RPC 100 in flight, 1 worker", "mc0-batched") in measured
    assert any(r["baseline"] == "pyzmq-loop" for r in report["ratios"])
    assert any(r["scenario"].startswith("trie match") for r in report["rows"])
    # The broker's CPU per loop turn carrying one message (benchmarks/loop_turn.py), beside the floor.
    for shape, system in (("echo", "mc0"), ("rpc", "mc0"), ("echo", "pyzmq-loop")):
        assert (f"loop turn carrying one message ({shape})", system) in measured
    turn = next(r for r in report["rows"] if r["scenario"] == "loop turn carrying one message (echo)")
    assert turn["main_us"] > 0 and turn["switches"] > 0


@pytest.mark.timeout(120)
def test_loop_turn_measure_runs_until_the_broker_main_thread_spent_a_countable_cpu_time() -> None:
    """A run far shorter than the CPU clock's 10 ms tick (as a quick run on a loaded box gets) still
    ends with a figure: it goes on until the broker's main thread spent ``MIN_MAIN_CPU``."""
    from benchmarks import loop_turn

    with loop_turn.broker(loop_turn.FLOOR, None) as (endpoint, pid):
        got = loop_turn.measure(endpoint, pid, "echo", 0.001)
    assert got.turns > 0 and got.main_us > 0
    assert got.main_us * got.turns / 1e6 >= loop_turn.MIN_MAIN_CPU * 0.999


@pytest.mark.timeout(120)
def test_loop_turn_measure_says_why_when_the_broker_cpu_does_not_count() -> None:
    """A broker whose CPU clock does not advance within the bound fails its run naming why, rather than
    giving a row of zeros (a process that sleeps stands in for the broker being measured)."""
    from benchmarks import loop_turn

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with loop_turn.broker(loop_turn.FLOOR, None) as (endpoint, _pid):
            with pytest.raises(RuntimeError, match=r"too little broker CPU to measure: .* over [\d,]+ turns"):
                loop_turn.measure(endpoint, sleeper.pid, "echo", 0.001, max_seconds=0.5)
    finally:
        sleeper.kill()
        sleeper.wait(5)


@pytest.mark.timeout(240)
def test_bench_library_smoke_run_reports_delivery_counts_for_both_mc0_apis(tmp_path: Path) -> None:
    out, md = tmp_path / "library.json", tmp_path / "library.md"
    result = run_script(
        [sys.executable, str(SCRIPTS / "bench.py"), "--quick", "--suite", "library", "--only", "lib pub/sub 1KiB",
         "--only", "lib RPC sequential", "--systems", "mc0-aio,mc0-sync", "--json", str(out), "--markdown", str(md)],
        timeout=200,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = {(r["scenario"], r["system"]): r for r in report["rows"]}
    assert {scenario for scenario, _ in rows} == {"lib pub/sub 1KiB 1->1", "lib RPC sequential"}
    for system in ("mc0-aio", "mc0-sync"):
        pubsub = rows[("lib pub/sub 1KiB 1->1", system)]
        assert pubsub["suite"] == "library" and pubsub["runs"] and pubsub["median"] > 0, pubsub
        assert pubsub["published"] > 0 and pubsub["expected"] == pubsub["published"]  # one subscriber
        assert pubsub["delivered"] + pubsub["lost"] == pubsub["expected"]
        assert pubsub["failing"] == (pubsub["lost"] > 0 or pubsub["errors"] > 0)
        assert "broker_us_per_msg" in pubsub
        rpc = rows[("lib RPC sequential", system)]
        assert rpc["calls"] > 0 and rpc["median"] > 0 and "p50_ms" in rpc and "p99_ms" in rpc, rpc
    assert any(r["system"] == "mc0-sync" and r["baseline"] == "mc0-aio" for r in report["ratios"])
    text = md.read_text()
    assert "library: pub/sub" in text and "library: RPC" in text


@pytest.mark.timeout(240)
def test_bench_console_rows_measure_the_same_broker_without_and_with_five_consoles(tmp_path: Path) -> None:
    out = tmp_path / "consoles.json"
    result = run_script(
        [sys.executable, str(SCRIPTS / "bench.py"), "--quick", "--suite", "library", "--only", "consoles",
         "--json", str(out)],
        timeout=200,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = {r["system"]: r for r in report["rows"]}
    assert set(rows) == {"mc0-aio+http", "mc0-aio+5 consoles"}
    assert all(r["runs"] and not r["failing"] for r in rows.values()), rows
    assert any(r["system"] == "mc0-aio+5 consoles" and r["baseline"] == "mc0-aio+http" for r in report["ratios"])
    cost = run_script(
        [sys.executable, str(SCRIPTS / "bench_console_cost.py"), "--seconds", "1", "--rounds", "1", "--peers", "2"],
        timeout=120,
    )
    assert cost.returncode == 0, cost.stderr[-2000:]
    assert "5 consoles: broker CPU" in cost.stdout and "0 consoles: broker CPU" in cost.stdout


@pytest.mark.timeout(240)
def test_journal_bench_smoke_run_reports_every_policy_against_plain_put(tmp_path: Path) -> None:
    out = tmp_path / "journal.json"
    result = run_script(
        [sys.executable, str(SCRIPTS / "bench_journal.py"), "--no-spark", "--runs", "1", "--count", "300",
         "--json", str(out)],
        timeout=200,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"plain PUT", "journal fsync=always", "journal fsync=batch", "journal fsync=never"}
    assert all(r["median"] > 0 and r["baseline"] == "plain PUT" for r in rows.values())


@pytest.mark.timeout(180)
def test_jetstream_bench_smoke_run_puts_the_broker_beside_nats_py_into_r3_streams(tmp_path: Path) -> None:
    out = tmp_path / "js.json"
    result = run_script(
        [sys.executable, str(SCRIPTS / "bench_journal.py"), "--jetstream-only", "--runs", "1", "--count", "300",
         "--json", str(out)],
        timeout=170,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert len(rows) == 4 and all(r["median"] > 0 and r["failed"] == 0 for r in rows.values())
    baselines = {r["baseline"] for r in rows.values()}
    assert all(b.startswith("JetStream R3 via nats-py") and "sync_interval=always" in b for b in baselines)
    assert all("sync_interval=always" in name for name in rows)  # both sides' sync setting stated


@pytest.mark.timeout(180)
def test_file_vs_jetstream_bench_smoke_run_pairs_each_fsync_policy_with_a_one_node_stream(tmp_path: Path) -> None:
    out = tmp_path / "file-js.json"
    result = run_script(
        [sys.executable, str(SCRIPTS / "bench_journal.py"), "--file-vs-jetstream", "--runs", "1", "--count", "300",
         "--json", str(out)],
        timeout=170,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert len(rows) == 10 and all(r["median"] > 0 and r["runs"] == 1 and r["failed"] == 0 for r in rows.values())
    for how in ("1 in flight", "256 in flight"):
        synced = f"JetStream R1 file, nats-py, {how} (sync_interval=always)"
        unsynced = f"JetStream R1 file, nats-py, {how} (sync_interval=default 2m, ack before sync)"
        expected = {  # each mc0 row beside the node at the matching sync setting, as its name states
            f"mc0 file journal, broker, {how} (fsync=always)": synced,
            f"mc0 file journal, broker, {how} (fsync=batch, group commit)": synced,
            f"mc0 file journal, broker, {how} (fsync=never)": unsynced,
            synced: synced,
            unsynced: unsynced,
        }
        assert {name: rows[name]["baseline"] for name in expected} == expected
    assert "FAILING" not in result.stdout


@pytest.mark.timeout(300)
def test_spark_scan_bench_smoke_run_reads_every_record_beside_the_plain_source(tmp_path: Path) -> None:
    require("pyspark")
    out = tmp_path / "scan.json"
    result = run_script(
        [sys.executable, str(SCRIPTS / "bench_journal.py"), "--spark-only", "--runs", "1", "--spark-count", "3000",
         "--option", "maxRecordsPerPartition=1000", "--filter-broker", f"same={SCRIPTS.parent}", "--json", str(out)],
        timeout=280,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    scans = {"client fetch", "client fetch_pages", "plain Python source", "spark read"}
    filtered = {"plain Python source, the filter's rows", "spark read, topic filter"}  # beside the plain scan
    filtered.add("spark read, topic filter, broker same")  # --filter-broker: here this checkout's own mc0
    assert set(rows) == scans | filtered
    assert all(r["median"] > 0 and r["failed"] == 0 for r in rows.values())
    assert {r["baseline"] for n, r in rows.items() if n in scans} == {"plain Python source"}
    assert {r["baseline"] for n, r in rows.items() if n in filtered} == {"spark read"}
    assert "spark read, topic filter" in result.stdout and "FAILING" not in result.stdout


@pytest.mark.timeout(240)
def test_bench_groups_and_consumers_smoke_run_counts_every_message_beside_nats(tmp_path: Path) -> None:
    require("nats")  # the NATS/JetStream rows need the bench group: fail with the hint, never skip
    out, md = tmp_path / "queues.json", tmp_path / "queues.md"
    result = run_script(
        [sys.executable, str(SCRIPTS / "bench.py"), "--quick", "--suite", "consumers", "--only", "ack-batch",
         "--json", str(out), "--markdown", str(md)],
        timeout=100,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    result = run_script(
        [sys.executable, str(SCRIPTS / "bench.py"), "--quick", "--suite", "groups", "--json", str(tmp_path / "g.json")],
        timeout=100,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {(r["scenario"], r["system"]): r for path in (out, tmp_path / "g.json")
            for r in json.loads(path.read_text())["rows"]}  # fmt: skip
    assert set(rows) == {("lib consumer ack-batch", "mc0-aio"), ("lib consumer ack-batch", "jetstream"),
                         ("lib queue group 1->3", "mc0-aio"), ("lib queue group 1->3", "nats")}  # fmt: skip
    for row in rows.values():
        why = f"{row['scenario']} {row['system']}: {row.get('note')}"  # the note names a crash or a timeout
        assert row["runs"] and row["median"] > 0 and row["published"] == row["expected"] == 300, why
        assert (row["delivered"], row["lost"], row["errors"], row["failing"]) == (300, 0, 0, False), why
    for system in ("mc0-aio", "nats"):
        group = rows[("lib queue group 1->3", system)]
        assert group["duplicates"] == 0 and 0 < group["member_share_min"] <= 1 / 3, group  # every member got some
    for system in ("mc0-aio", "jetstream"):
        assert rows[("lib consumer ack-batch", system)]["unacked"] == 0  # the server counts every ack
    ratios = json.loads(out.read_text())["ratios"]
    assert any(r["system"] == "mc0-aio" and r["baseline"] == "jetstream" for r in ratios)
    assert "lib consumer ack-batch" in md.read_text()


@pytest.mark.timeout(120)
def test_core_acks_bench_smoke_run_acks_every_message_one_by_one() -> None:
    """benchmarks/core_acks.py: the core over a file journal; its run asserts one answer per ack."""
    root = SCRIPTS.parent
    for page in ("100", "1000"):
        result = run_script(
            [sys.executable, "-m", "benchmarks.core_acks", "--acks", "2000", "--page", page],
            timeout=100,
            cwd=root,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert f"{page} per pull" in result.stdout and "us of CPU per ack" in result.stdout


@pytest.mark.timeout(240)
def test_cluster_bench_smoke_run_measures_every_system_and_a_compared_mc0(tmp_path: Path) -> None:
    """scripts/bench_cluster.py: across three brokers, one broker and the NATS cluster, plus --compare
    (this checkout again under another name: its brokers run with PYTHONPATH naming it)."""
    require("nats")
    out = tmp_path / "cluster.json"
    checkout = str(SCRIPTS.parent)
    result = run_script(
        [sys.executable, str(SCRIPTS / "bench_cluster.py"), "--quick", "--only", "RPC sequential",
         "--compare", f"again={checkout}", "--json", str(out)],
        timeout=200,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = {r["system"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"mc0 cluster", "mc0 single", "nats cluster", "mc0 cluster again", "mc0 single again"}
    for row in rows.values():
        assert row["values"] and row["values"][0] > 0 and row["counts"]["calls"] > 0 and not row["counts"]["errors"]
    assert "cluster RPC sequential again" in result.stdout  # its own ratio line
