"""BrokerProcess: run ``mc0 broker`` as a child process and learn its endpoint.

Contract: ``start()`` launches ``python -m mc0 broker`` with the given
arguments and returns once the broker printed its ``listening on`` line
(``Timeout`` otherwise, with the child's stderr in the message); ``stop()``
sends SIGTERM and returns the exit status; ``kill()`` is SIGKILL.  Used by
the demo, the tests and the benchmarks, so all three run the real thing.
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
        start_timeout: float = 15.0,
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
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[str] | None = None
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
        assert self.proc.stdout is not None
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
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.kill()
        _, stderr = self.proc.communicate(timeout=5)
        return stderr or ""

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
        """The child's stderr so far (only after it exited)."""
        if self.proc is None or self.proc.stderr is None or self.proc.poll() is None:
            return ""
        return self.proc.stderr.read()

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
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()


def _pump_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)
    lines.put("")
