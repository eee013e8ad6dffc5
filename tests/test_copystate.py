"""CopyState (mc0/broker/jetstream/copystate.py): where a JetStream journal's local copy stands, from what its
feed says and the copy's and the stream's ends, as time passes (no clock: ``now`` is handed in); and the
local copy (ReplicatedJournal) reporting it in its info.  The same states with real nats-server nodes:
tests/test_local_copy_quorum_live.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mc0.broker.jetstream.copystate import STUCK_AFTER_S, CopyState
from mc0.broker.jetstream.replicated import ReplicatedJournal
from mc0.protocol import jetstream as jsw
from mc0.protocol.journalrecords import encode_payload
from mc0.settings import JournalSettings

S = STUCK_AFTER_S

# Steps: ("feed", following, reason) | ("learnt",) | ("watch", dt, copy_next, stream_next, broken); then the
# state, lag and reason after the last watch, and the warnings logged.
CASES = [
    # A broker just started: its copy has learnt nothing of the stream, its feed waits.
    ([("feed", False, "waiting for JetStream"), ("watch", 0, 1, 1, "")], "starting", "waiting for JetStream", 0),
    # Still nothing after STUCK_AFTER_S: stuck, naming the feed's reason (logged once).
    (
        [("feed", False, "no leader"), ("watch", 0, 1, 1, ""), ("watch", S, 1, 1, ""), ("watch", 1, 1, 1, "")],
        "stuck",
        "no leader",
        1,
    ),
    # The feed follows, the copy holds all the stream is known to hold.
    ([("learnt",), ("feed", True, ""), ("watch", 0, 5, 5, "")], "following", "", 0),
    # Behind and taking records: catching up, however long it takes.
    (
        [
            ("learnt",),
            ("feed", True, ""),
            ("watch", 0, 5, 9, ""),
            ("watch", S - 1, 6, 9, ""),
            ("watch", S - 1, 7, 9, ""),
        ],
        "catching_up",
        "",
        0,
    ),
    # Behind and given nothing for STUCK_AFTER_S while its consumer runs: stuck (a consumer that never delivers).
    (
        [("learnt",), ("feed", True, ""), ("watch", 0, 5, 9, ""), ("watch", S, 5, 9, "")],
        "stuck",
        "delivered nothing",
        1,
    ),
    # Its consumer made again after a failover: restarting, not stuck yet.
    (
        [
            ("learnt",),
            ("feed", True, ""),
            ("watch", 0, 5, 5, ""),
            ("feed", False, "failed over"),
            ("watch", S - 1, 5, 5, ""),
        ],
        "restarting",
        "failed over",
        0,
    ),
    # ... and for too long: stuck, once, and following again (logged once too).
    (
        [
            ("learnt",),
            ("feed", True, ""),
            ("watch", 0, 5, 5, ""),
            ("feed", False, "no leader"),
            ("watch", S, 5, 5, ""),
            ("watch", 1, 5, 5, ""),
            ("feed", True, ""),
            ("watch", 0, 5, 5, ""),
        ],
        "following",
        "",
        1,
    ),  # fmt: skip
    # A copy that cannot be written: broken, whatever its feed does.
    ([("learnt",), ("feed", True, ""), ("watch", 0, 5, 7, "OSError: disk full")], "broken", "disk full", 0),
]


@pytest.mark.parametrize(("steps", "state", "reason", "stuck"), CASES)
def test_a_copys_state_follows_its_feed_and_its_ends_and_stuck_is_logged_once_each_way(
    steps: list[tuple[object, ...]], state: str, reason: str, stuck: int, caplog: pytest.LogCaptureFixture
) -> None:
    copy = CopyState("main", "MC0_J_main")
    now = 100.0
    with caplog.at_level(logging.INFO, logger="mc0.journal"):
        for step in steps:
            if step[0] == "feed":
                copy.feed(bool(step[1]), str(step[2]), now)
            elif step[0] == "learnt":
                copy.learnt()
            else:
                _, dt, copy_next, stream_next, broken = step
                now += float(dt)  # type: ignore[arg-type]
                copy.watch(now, int(copy_next), int(stream_next), str(broken))  # type: ignore[call-overload]
    assert (copy.state, reason in copy.reason, copy.stuck_times) == (state, True, stuck)
    if not reason:
        assert copy.reason == ""
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "is stuck" in m]) == stuck  # once per time it got stuck
    assert len([m for m in said if "again, after" in m]) == (stuck if state != "stuck" else 0)
    assert all("MC0_J_main" in m for m in said)


def test_a_local_copy_tells_its_state_lag_and_why_in_its_info(tmp_path: Path) -> None:
    """The copy learns the stream holds seqs 1..3, gets one: catching up, lag 2; all: following, lag 0.  A
    journal that keeps mailboxes has no copy: no copy fields, and never waits for a feed."""
    settings = JournalSettings(folder=str(tmp_path / "main"), topics=("orders.>",), store="jetstream")
    copy = ReplicatedJournal("main", settings).open()
    try:
        copy.watch(0.0)
        before = copy.info()
        assert (before["copy_state"], before["copy_lag"], copy.following) == ("starting", 0, False)
        copy.stream_state(1, 3, "made-1", 1)
        copy.feed_status(True, "", 0.0)
        copy.arrived(1, 0.0, encode_payload("orders.a", "alice", {}, [b"1"]))
        copy.watch(1.0)
        behind = copy.info()
        assert (behind["copy_state"], behind["copy_lag"], behind["copy_reason"]) == ("catching_up", 2, "")
        for seq in (2, 3):
            copy.arrived(seq, 0.0, encode_payload("orders.a", "alice", {}, [b"%d" % seq]))
        copy.watch(2.0)
        after = copy.info()
        assert (after["copy_state"], after["copy_lag"], copy.following) == ("following", 0, True)
        copy.feed_status(False, "stream MC0_J_main has no leader now", 3.0)
        copy.watch(3.0 + S)
        stuck = copy.info()
        assert (stuck["copy_state"], stuck["copy_stuck_times"], copy.following) == ("stuck", 1, False)
        assert copy.copy_reason == "stream MC0_J_main has no leader now"
    finally:
        copy.close()
    letters = JournalSettings(folder=str(tmp_path / "letters"), store="jetstream", mailboxes=True)
    box = ReplicatedJournal("letters", letters).open()
    try:
        box.watch(S * 2)
        assert "copy_state" not in box.info() and box.following
    finally:
        box.close()
    assert set(jsw.COPY_STATES) == {"starting", "following", "catching_up", "restarting", "stuck", "broken"}
