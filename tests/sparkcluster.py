"""A Spark standalone cluster on loopback from the pyspark installation: one master and one worker
started with pyspark's own ``spark-class`` (the pip package has no sbin/start-*.sh), web UIs on free
ports, no REST submission server (it would take the fixed port 6066), everything in ``root``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from mc0.ports import free_ports

MASTER_READY = "New state: ALIVE"
WORKER_READY = "Successfully registered with master"


class SparkStandalone:
    def __init__(self, root: Path) -> None:
        import pyspark

        self.root = root
        self.home = Path(pyspark.__file__).parent
        self.spark_class = self.home / "bin" / "spark-class"
        self.port, self.master_ui, self.worker_ui = free_ports(3)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.began = 0.0

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(self.home),
            "SPARK_LOCAL_IP": "127.0.0.1",  # every Spark socket on loopback (the driver's too)
            "SPARK_LOCAL_DIRS": str(self.root / "local"),
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_DAEMON_MEMORY": "512m",
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "PYSPARK_PYTHON": sys.executable,  # the executors' Python: this one, where mc0 is installed
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.root / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [str(self.spark_class), *args],
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def start(self) -> SparkStandalone:
        """Launch master and worker (the worker retries registering until the master is up)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.began = time.monotonic()
        self._start(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
            "--webui-port", str(self.master_ui),
        )  # fmt: skip
        self._start(
            "worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", "0",
            "--webui-port", str(self.worker_ui), "--cores", "1", "--memory", "1g",
            "--work-dir", str(self.root / "work"), self.master,
        )  # fmt: skip
        return self

    def wait_ready(self, timeout: float = 120.0) -> float:
        """Poll the logs until the master is ALIVE and the worker registered; seconds since ``start``."""
        deadline = time.monotonic() + timeout
        for proc, name, needle in zip(self.procs, ("master", "worker"), (MASTER_READY, WORKER_READY), strict=True):
            self._wait_log(proc, name, needle, deadline)
        return time.monotonic() - self.began

    def _wait_log(self, proc: subprocess.Popen[bytes], name: str, needle: str, deadline: float) -> None:
        path = self.root / f"{name}.log"
        for _ in range(100_000):
            if needle in path.read_text(errors="replace"):
                return
            if proc.poll() is not None:
                raise AssertionError(f"spark {name} exited: {path.read_text(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"spark {name} not ready: {path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        for proc in reversed(self.procs):  # the worker, then the master
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        self.procs.clear()

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
