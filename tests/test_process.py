"""mc0.process.BrokerProcess: the harness the demo, the tests and the benchmarks run the broker with."""

from __future__ import annotations

import io

import pytest

import mc0
from mc0.process import BrokerProcess, StderrKeeper


@pytest.mark.timeout(180)
def test_a_broker_process_that_logs_a_lot_is_never_blocked_by_its_own_stderr() -> None:
    """Its stderr was read only after the broker exited: past the pipe's 64 KiB of log lines the broker
    blocked in write(2) and stopped answering (at -vv after ~350 connections)."""
    with BrokerProcess(insecure=True, verbose=2) as broker:
        answered = 0
        for _ in range(600):
            try:
                with mc0.Client(broker.endpoint, timeout=10).connect() as client:
                    client.request("mc0.broker", b"stats", timeout=10)
            except mc0.Error:
                break
            answered += 1
        assert answered == 600, f"the broker stopped answering after {answered} connections"
        assert "connected" in broker.stderr_text()  # readable while it runs
    assert broker.stderr_text().count("\n") > 600  # and whole after it stopped


@pytest.mark.timeout(30)
def test_what_stderr_keeps_is_bounded_and_says_what_it_left_out() -> None:
    lines = "".join(f"line {i:06d}\n" for i in range(10_000))  # 120,000 characters
    keeper = StderrKeeper(io.StringIO(lines), limit=10_000)
    text = keeper.text(wait=10)
    head, _, kept = text.partition("\n")
    assert head.startswith("[... ") and head.endswith(" characters of stderr left out ...]")
    assert len(kept) <= 10_000 and kept.endswith("line 009999\n")
    assert keeper.dropped + len(kept) == len(lines)
    assert StderrKeeper(io.StringIO("short\n")).text(wait=10) == "short\n"
