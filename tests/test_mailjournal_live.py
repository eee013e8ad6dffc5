"""Mailboxes kept by a journal, with real broker processes, CURVE and real keys: letters to an
offline identity survive ``kill -9`` and a restart and arrive exactly once, in order; delivered
ones never come back after another restart; expired ones are dropped; an unreadable record
(and a torn write after it) stops nothing else.  ``--check-config`` says where letters live."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mc0
from mc0 import protocol as P
from mc0.broker.storage.filestore import Journal
from mc0.config import load
from mc0.process import BrokerProcess

from .conftest import CurveSetup

LETTERS = """mailbox_ttl_ms = {ttl}
[journals.letters]
mailboxes = true
segment_bytes = 65536
"""
N = 40


def broker_config(setup: CurveSetup, ttl_ms: int) -> None:
    text = setup.config.read_text()
    head = text[: text.index("mailbox_ttl_ms")] if "mailbox_ttl_ms" in text else text
    setup.config.write_text(head + LETTERS.format(ttl=ttl_ms))


def stats(client: mc0.Client) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(client.request("mc0.broker", "stats", timeout=10).body)
    return result


def journal_next_seq(client: mc0.Client) -> int:
    info = json.loads(client.request("mc0.journal", json.dumps({"op": "info"}), timeout=10).body)
    return int(info["letters"]["next_seq"])


def wait_for(condition: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # bounded in time; each check is a request to the broker
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_letters_survive_kill_9_and_arrive_exactly_once_in_order(tmp_path: Path) -> None:
    setup = CurveSetup(tmp_path)
    broker_config(setup, ttl_ms=300)  # a first broker whose letters expire at once
    first = setup.start()
    try:
        endpoint = first.endpoint
        with mc0.Client(endpoint, **setup.client_options("alice")) as alice:
            assert alice.send_to("carol", "cmd.old", b"too late", confirm=True) == "stored"  # committed
    finally:
        first.kill()
    broker_config(setup, ttl_ms=600_000)
    second = BrokerProcess(config=str(setup.config), bind=(endpoint,)).start()
    try:
        with mc0.Client(endpoint, **setup.client_options("alice")) as alice:
            for i in range(N):  # each OK says the letter is committed (fsync = batch)
                answer = alice.send_to("bob", f"cmd.{i}", str(i).encode(), headers={"X-N": str(i)}, confirm=True)
                assert answer == "stored"
            # carol's letter expired (at the restore or at a tick since): dropped, and that recorded
            wait_for(lambda: stats(alice)["counters"].get("mailbox_expired") == 1, "the expired letter dropped")
            kept = stats(alice)["mailboxes"]
            assert (kept["identities"], kept["messages"], kept["journal"]) == (1, N, "letters")
    finally:
        second.kill()  # kill -9: nothing is written on the way out
    # While it is down: an unreadable letter record (valid CRC, no TO), then a torn write.
    settings = load(setup.config).journals["letters"]
    journal = Journal("letters", settings).open()
    journal.append(P.SYS_MAILBOX_LETTER, "alice", {"TOPIC": "cmd.x", P.MAILBOX_EXPIRES: "1"}, [b"bad"])
    journal.close()
    (segment,) = sorted(settings.path("letters").glob("*.seg"))
    with open(segment, "ab") as torn:
        torn.write(b"\x07\x00\x00\x00torn")
    third = BrokerProcess(config=str(setup.config), bind=(endpoint,)).start()
    try:
        with mc0.Client(endpoint, **setup.client_options("alice")) as alice:
            before = stats(alice)
            assert before["mailboxes"]["messages"] == N and before["mailboxes"]["identities"] == 1
            counters = before["counters"]
            assert counters["mailbox_restored"] == N and "mailbox_expired" not in counters
            assert counters["mailbox_record_unreadable"] == 1
            env = {**os.environ, "MC0_KEY": str(setup.secret("alice")), "MC0_BROKER_KEY": str(setup.broker_key)}
            env["COLUMNS"] = "200"
            shown = subprocess.run(
                [sys.executable, "-m", "mc0", "stats", "--endpoint", endpoint],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
            )
            assert shown.returncode == 0, shown.stderr
            assert "mailboxes (journal letters)" in shown.stdout
            assert re.search(rf"^\s*bob\s+{N}\s", shown.stdout, re.MULTILINE), shown.stdout
            seq_before = journal_next_seq(alice)
            with mc0.Client(endpoint, **setup.client_options("bob")) as bob:
                got = [bob.mailbox.next(timeout=10) for _ in range(N)]
                assert [m.body for m in got] == [str(i).encode() for i in range(N)]
                assert [(m.topic, m.sender, m.headers) for m in got] == [
                    (f"cmd.{i}", "alice", {"X-N": str(i)}) for i in range(N)
                ]
                assert alice.send_to("bob", "live", b"marker", confirm=True) == "delivered"
                assert bob.mailbox.next(timeout=10).body == b"marker"  # nothing kept came twice before it
                # the delivery is recorded once the letters left the broker's queue for bob
                wait_for(lambda: journal_next_seq(alice) > seq_before, "the delivered record")
            with mc0.Client(endpoint, **setup.client_options("carol")) as carol:
                assert alice.send_to("carol", "live", b"marker", confirm=True) == "delivered"
                assert carol.mailbox.next(timeout=10).body == b"marker"  # the expired letter never came
            assert stats(alice)["mailboxes"]["messages"] == 0
    finally:
        third.kill()
    log = third.stderr_text()
    assert "mailboxes: record" in log and "unreadable, skipped" in log and "no valid TO" in log
    assert "truncating" in log  # the torn write: the journal's own recovery
    fourth = BrokerProcess(config=str(setup.config), bind=(endpoint,)).start()
    try:
        with mc0.Client(endpoint, **setup.client_options("alice")) as alice:
            after = stats(alice)
            assert after["mailboxes"]["messages"] == 0 and "mailbox_restored" not in after["counters"]
            with mc0.Client(endpoint, **setup.client_options("bob")) as bob:
                assert alice.send_to("bob", "live", b"marker 2", confirm=True) == "delivered"
                assert bob.mailbox.next(timeout=10).body == b"marker 2"  # delivered ones never come back
    finally:
        fourth.kill()


def test_check_config_says_where_kept_letters_live(tmp_path: Path) -> None:
    conf = tmp_path / "mc0.toml"

    def check() -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "mc0", "broker", "--config", str(conf), "--insecure", "--check-config"]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    conf.write_text("[journals.main]\n")
    result = check()
    assert result.returncode == 0, result.stderr
    assert "mailboxes: in memory only" in result.stdout
    conf.write_text("[journals.main]\n[journals.letters]\nmailboxes = true\n")
    result = check()
    assert result.returncode == 0, result.stderr
    assert "journal letters: " in result.stdout and "keeps the mailboxes" in result.stdout
    assert "in memory only" not in result.stdout
    for broken, needle in (
        ("[journals.a]\nmailboxes = true\n[journals.b]\nmailboxes = true\n", "at most one journal keeps mailboxes"),
        ('[journals.a]\nmailboxes = true\ntopics = [">"]\n', "journals.a.topics: a journal that keeps mailboxes"),
    ):
        conf.write_text(broken)
        result = check()
        assert result.returncode == 1 and needle in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_a_letter_sent_again_with_its_msgid_is_taken_once_across_a_kill_9(tmp_path: Path) -> None:
    """A confirmed letter re-sent with the same MSGID (its OK lost: a restart, a failover) was kept
    twice (PUT TO took no MSGID: 400).  Now it is taken once, answered as the first was: from the
    broker's memory while it runs, from the mailbox journal's dedup memory after a kill -9; a letter
    delivered at once is taken once too.  Another identity's letter with the same MSGID is its own."""
    setup = CurveSetup(tmp_path)
    broker_config(setup, ttl_ms=600_000)
    first = setup.start()
    endpoint = first.endpoint
    try:
        with mc0.Client(endpoint, **setup.client_options("alice")) as alice:
            assert alice.send_to("bob", "cmd.pay", b"pay 1", confirm=True, msgid="pay-1") == "stored"
            assert alice.send_to("bob", "cmd.pay", b"pay 1", confirm=True, msgid="pay-1") == "stored"  # again
            assert stats(alice)["counters"]["letter_duplicates"] == 1
    finally:
        first.kill()  # kill -9: the memory is gone, the journal keeps the letter and its MSGID
    second = BrokerProcess(config=str(setup.config), bind=(endpoint,)).start()
    try:
        with (
            mc0.Client(endpoint, **setup.client_options("alice")) as alice,
            mc0.Client(endpoint, **setup.client_options("carol")) as carol,
        ):
            assert alice.send_to("bob", "cmd.pay", b"pay 1", confirm=True, msgid="pay-1") == "stored"
            assert carol.send_to("bob", "cmd.pay", b"carol's", confirm=True, msgid="pay-1") == "stored"  # her own
            assert stats(alice)["counters"]["letter_duplicates"] == 1
            with mc0.Client(endpoint, **setup.client_options("bob")) as bob:
                got = [bob.mailbox.next(timeout=10) for _ in range(2)]
                assert [(m.sender, m.body) for m in got] == [("alice", b"pay 1"), ("carol", b"carol's")]
                # delivered at once, then sent again: delivered once
                assert alice.send_to("bob", "cmd.now", b"now", confirm=True, msgid="now-1") == "delivered"
                assert alice.send_to("bob", "cmd.now", b"now", confirm=True, msgid="now-1") == "delivered"
                assert alice.send_to("bob", "live", b"marker", confirm=True) == "delivered"
                assert [bob.mailbox.next(timeout=10).body for _ in range(2)] == [b"now", b"marker"]
            assert stats(alice)["counters"]["letter_duplicates"] == 2  # (this run: pay-1 and now-1)
    finally:
        second.kill()
