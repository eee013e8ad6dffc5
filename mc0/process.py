"""BrokerProcess: run ``mc0 broker`` as a child process and learn its endpoint.

Contract: ``start()`` launches ``python -m mc0 broker`` with the given
arguments and returns once the broker printed its ``listening on`` line
(``Timeout`` otherwise, with the child's stderr in the message); ``stop()``
sends SIGTERM and returns the exit status; ``kill()`` is SIGKILL.  Used by
the demo, the tests and the benchmarks, so all three run the real thing.

The child's stdout and stderr are read by threads for as long as it runs, so
a broker that logs a lot never blocks in ``write(2)`` on a full pipe (at
``-vv`` a pipe nobody read filled after ~350 connections and the broker
stopped answering).  What it wrote to stderr is kept up to
``STDERR_KEPT_BYTES``; past that the oldest half goes, and
:meth:`stderr_text` says how much was left out.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from .errors import Error, Timeout

READY_PREFIX = "mc0 broker listening on "
KEY_PREFIX = "mc0 broker public key "
STDERR_KEPT_BYTES = 8 << 20  # what stderr_text() can show; the rest of a long log is dropped from the front


class StderrKeeper:
    """Reads a child's stderr to its end in a thread, keeping at most ``limit`` characters of it."""

    def __init__(self, stream: Any, limit: int = STDERR_KEPT_BYTES) -> None:
        self._stream = stream
        self._limit = limit
        self._chunks: list[str] = []
        self._kept = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for line in self._stream:
            with self._lock:
                self._chunks.append(line)
                self._kept += len(line)
                if self._kept > self._limit:  # (amortised: drop the oldest half at once)
                    text = "".join(self._chunks)
                    cut = len(text) - self._limit // 2
                    self.dropped += cut
                    self._chunks = [text[cut:]]
                    self._kept = len(self._chunks[0])
        self._stream.close()  # (EOF: the child closed its end)

    def text(self, wait: float = 0.0) -> str:
        """What was kept so far (``wait``: first give the reader that long to reach the end)."""
        if wait:
            self._thread.join(wait)
        with self._lock:
            kept = "".join(self._chunks)
        return f"[... {self.dropped} characters of stderr left out ...]\n{kept}" if self.dropped else kept


class BrokerProcess:
    def __init__(
        self,
        *args: str,
        config: str | None = None,
        insecure: bool = False,
        verbose: int = 0,
        bind: Sequence[str] = ("tcp://127.0.0.1:*",),
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        self.args = list(args)
        if config is not None:
            self.args += ["--config", config]
        if insecure:
            self.args.append("--insecure")
        self.verbose = verbose
        self.bind = list(bind)
        self.env = env
        self.cwd = cwd
        # A hang guard: start() returns at the child's "listening on" line or its exit.  The child's
        # imports and binds take about a second of CPU; on a loaded box (a test suite beside a CPU hog
        # per core) that was seen past 15 s.
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[str] | None = None
        self._stderr: StderrKeeper | None = None
        self.endpoints: list[str] = []
        self.public_key: bytes | None = None

    @property
    def endpoint(self) -> str:
        return self.endpoints[0]

    def start(self) -> BrokerProcess:
        """Start the child and wait for its "listening on" line; idempotent while it runs."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        command = [sys.executable, "-m", "mc0", *(["-v"] * self.verbose), "broker", *self.args]
        for endpoint in self.bind:
            command += ["--bind", endpoint]
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=self.cwd
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._stderr = StderrKeeper(self.proc.stderr)
        # A thread reads stdout line by line (select() on a buffered pipe misses
        # lines already read ahead) and keeps draining it after start.
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_pump_lines, args=(self.proc.stdout, lines), daemon=True).start()
        deadline = time.monotonic() + self.start_timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if line.startswith(KEY_PREFIX):
                self.public_key = line[len(KEY_PREFIX) :].strip().encode()
            elif line.startswith(READY_PREFIX):
                self.endpoints = line[len(READY_PREFIX) :].split()
                return self
            elif not line:  # the child exited
                break
        stderr = self._stderr_after_kill()
        raise Timeout(f"broker start ({' '.join(command)}): {stderr.strip()[-500:]}", self.start_timeout)

    def _stderr_after_kill(self) -> str:
        assert self.proc is not None and self._stderr is not None
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)
        return self._stderr.text(wait=5.0)

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait, return the exit status (SIGKILL if it does not stop)."""
        if self.proc is None:
            return 0
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise Error(f"broker pid {self.proc.pid} ignored SIGTERM for {timeout}s") from None
        finally:
            self._close_pipes()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self._close_pipes()

    def stderr_text(self) -> str:
        """The child's stderr so far (all of it once the child exited; at most STDERR_KEPT_BYTES)."""
        if self._stderr is None or self.proc is None:
            return ""
        return self._stderr.text(wait=5.0 if self.proc.poll() is not None else 0.0)

    def _close_pipes(self) -> None:
        pass  # stdout belongs to the reader thread, which ends at EOF

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.stop()
            except Error:
                pass
        if self._stderr is not None:
            self._stderr.text(wait=5.0)  # the reader reaches EOF: the pipe is then closed with the process


def _pump_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)
    lines.put("")
