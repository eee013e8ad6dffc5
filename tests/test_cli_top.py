"""``mc0 top`` in a real terminal (a pty of 80 x 24) and ``mc0 stats`` (with ``--watch``) piped, against a
live broker under traffic: they show peers and topics, fit 80 columns, and ``top`` quits on ``q``."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import mc0
from mc0.cli.watch import count, size
from mc0.process import BrokerProcess

CURSOR_HOME = re.compile(r"\x1b\[[0-9;]*H")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def busy_broker() -> Iterator[str]:
    """A broker with a subscriber and a steady publisher on topics load.* (bounded: 60 s at most)."""
    stop = threading.Event()
    with BrokerProcess(insecure=True) as broker:
        with mc0.Client(broker.endpoint) as sub_client, sub_client.subscribe("load.>"):

            def publish() -> None:
                deadline = time.monotonic() + 60
                with mc0.Client(broker.endpoint) as client:
                    while not stop.is_set() and time.monotonic() < deadline:
                        for _ in range(20):
                            client.publish("load.x", b"x" * 64)
                        client.publish("load.a-topic-name-far-too-long-to-fit-in-its-column-" + "z" * 60, b"y")
                        stop.wait(0.01)

            pump = threading.Thread(target=publish, daemon=True)
            pump.start()
            try:
                yield broker.endpoint
            finally:
                stop.set()
                pump.join(10)


@pytest.mark.parametrize(
    ("n", "shown"),
    [(0, "0"), (999, "999"), (9_999, "9,999"), (12_345, "12.3k"), (1_234_567, "1.2M"), (3e9, "3.0G"), (None, "-")],
)
def test_count_stays_narrow(n: float | None, shown: str) -> None:
    assert count(n) == shown


@pytest.mark.parametrize(("n", "shown"), [(0, "0B"), (1023, "1023B"), (1536, "1.5K"), (5 * 2**20, "5.0M")])
def test_size_is_binary_and_narrow(n: int, shown: str) -> None:
    assert size(n) == shown


def _mc0(*args: str) -> list[str]:
    return [sys.executable, "-m", "mc0", *args]


@pytest.mark.timeout(60)
def test_stats_piped_fits_80_columns_and_watch_repeats(busy_broker: str) -> None:
    done = subprocess.run(_mc0("stats", "--endpoint", busy_broker), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "services" in done.stdout and "load.>" in done.stdout and "peers" in done.stdout
    assert max(map(len, lines)) <= 80, [line for line in lines if len(line) > 80]
    watch = subprocess.Popen(
        _mc0("stats", "--watch", "--interval", "0.3", "--endpoint", busy_broker),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert watch.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 20
        while sum(1 for line in seen if line == "-" * 80) < 2 and time.monotonic() < deadline:
            seen.append(watch.stdout.readline().rstrip("\n"))
        assert sum(1 for line in seen if line == "-" * 80) >= 2, seen[-20:]
        assert max(map(len, seen)) <= 80
    finally:
        watch.kill()
        watch.wait(10)
        for pipe in (watch.stdout, watch.stderr):
            if pipe is not None:
                pipe.close()


@pytest.mark.timeout(60)
def test_top_in_a_terminal_shows_peers_and_topics_by_rate_and_quits_on_q(busy_broker: str) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: mc0 top on the pty's other end
        os.chdir(ROOT)
        os.execv(sys.executable, _mc0("top", "--interval", "0.3", "--endpoint", busy_broker))
    try:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        os.kill(pid, signal.SIGWINCH)
        output = b""
        deadline = time.monotonic() + 30
        screen = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    output += os.read(fd, 65536)
                except OSError:
                    break
            screen = ANSI.sub("", output.decode(errors="replace"))
            if "load.x" in screen and "anonymous#" in screen and re.search(r"load\.x\s+[\d.,]+[kM]?/s", screen):
                break
        assert "peers by rate" in screen and "topics by rate" in screen, screen[-2000:]
        assert re.search(r"load\.x\s+[\d.,]+[kM]?/s", screen), screen[-2000:]
        # A frame starts with the cursor sent home (ESC[H): the last row of one frame and the first of the
        # next are separate rows of the terminal though no newline comes between them.
        frames = [ANSI.sub("", frame) for frame in CURSOR_HOME.split(output.decode(errors="replace"))]
        lines = [line for frame in frames for chunk in frame.split("\r") for line in chunk.split("\n")]
        assert max(len(line.rstrip()) for line in lines) <= 80, [line for line in lines if len(line.rstrip()) > 80]
        os.write(fd, b"q")
        deadline = time.monotonic() + 10
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            select.select([fd], [], [], 0.2) and _drain(fd)
        assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


def _drain(fd: int) -> None:
    try:
        os.read(fd, 65536)
    except OSError:
        pass
