"""The Node.js example client (examples/node/, written from docs/PROTOCOL.md) against a real CURVE broker.

Contract: ``npm ci`` installs the example's one dependency (the ``zeromq`` package, v6, whose prebuilt
binaries have CURVE) from its package-lock.json when node_modules is missing or older than the lock; then
one run of ``node examples/node/demo.js`` as alice, beside Python peers with keys of their own, subscribes
while Python publishes, publishes to a Python subscriber, calls an ``mc0 serve`` worker that streams
PARTIALs (and an unknown service: 503), and heals after the broker is killed and started again on the same
endpoint.  It fails when the spec and the broker part ways on anything a client needs.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0 import ports
from mc0.process import BrokerProcess

from .conftest import CurveSetup

pytestmark = pytest.mark.timeout(300)  # npm ci on a fresh machine, and a loaded one
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "node"
WAIT = 30.0  # seconds for one step (room for a loaded machine)
WORKER = """
def stream(request):
    yield b"one"
    yield b"two"
    return b"done " + request.body
"""


def tool(name: str) -> str:
    found = shutil.which(name)
    assert found is not None, f"{name} is not on PATH: the Node.js example needs Node.js 18 or later and npm"
    return found


def installed() -> None:
    """``npm ci`` from the example's package-lock.json, unless node_modules is as the lock says already."""
    marker = EXAMPLE / "node_modules" / ".package-lock.json"
    lock = EXAMPLE / "package-lock.json"
    if marker.exists() and marker.stat().st_mtime >= lock.stat().st_mtime:
        return
    done = subprocess.run(
        [tool("npm"), "ci", "--no-audit", "--no-fund"], cwd=EXAMPLE, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr


class Node:
    """``node demo.js``: JSON commands in on stdin, JSON events out on stdout (read by a thread)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [tool("node"), "demo.js"],
            cwd=EXAMPLE,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def do(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def wait(self, matches: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """The next event ``matches`` accepts (the others are kept in ``seen``)."""
        deadline = time.monotonic() + WAIT
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(event)
            if matches(event):
                return event
        stderr = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
        raise AssertionError(f"node: no {what} within {WAIT}s; saw {self.seen[-10:]} {stderr}")

    def event(self, name: str, **fields: Any) -> dict[str, Any]:
        return self.wait(lambda e: e["event"] == name and all(e.get(k) == v for k, v in fields.items()), name)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def served(python: mc0.Client, service: str) -> None:
    """Wait until a worker serves ``service`` (Majordomo's mmi.service answers 200)."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            if python.request("mmi.service", service.encode(), timeout=2.0).body == b"200":
                return
        except mc0.Error:
            pass  # (the client heals after a restart: its calls fail meanwhile)
        assert time.monotonic() < deadline, f"no worker serves {service} after {WAIT}s"
        time.sleep(0.1)


@pytest.fixture
def node_setup(tmp_path: Path) -> Iterator[tuple[CurveSetup, str]]:
    installed()
    setup = CurveSetup(tmp_path)
    yield setup, f"tcp://127.0.0.1:{ports.free_port()}"


def test_the_node_example_subscribes_publishes_calls_with_partials_and_heals(
    node_setup: tuple[CurveSetup, str], tmp_path: Path
) -> None:
    setup, endpoint = node_setup
    broker = BrokerProcess(config=str(setup.config), bind=(endpoint,), start_timeout=60).start()
    (tmp_path / "chunks.py").write_text(WORKER)
    serve = [sys.executable, "-m", "mc0", "serve", "chunks:stream", "--service", "demo.chunks"]
    serve += ["--endpoint", endpoint, "--key", str(setup.secret("bob")), "--broker-key", str(setup.broker_key)]
    worker = subprocess.Popen(serve, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    env = {"MC0_ENDPOINT": endpoint, "MC0_KEY": str(setup.secret("alice")), "MC0_BROKER_KEY": str(setup.broker_key)}
    node = Node({**env, "MC0_TTL": "1000"})
    python = mc0.Client(endpoint, **setup.client_options("carol")).connect()
    try:
        assert node.event("ready")["ttl"] == 1000
        # subscribe while Python publishes
        node.do(op="sub", pattern="demo.>")
        node.event("subscribed")
        python.publish("demo.py", b"from python", confirm=True)
        assert node.event("message", topic="demo.py")["sender"] == "carol"
        # publish to a Python subscriber
        heard = python.subscribe("node.>")
        node.do(op="pub", topic="node.x", body="from node", headers={"X-Trace": "t1"})
        node.event("published")
        message = heard.next(timeout=WAIT)
        assert (message.body, message.sender, message.headers) == (b"from node", "alice", {"X-Trace": "t1"})
        # call a Python worker that streams PARTIALs, and a service nobody serves
        served(python, "demo.chunks")
        node.do(op="call", service="demo.chunks", body="x")
        assert [node.event("partial")["body"] for _ in range(2)] == [["one"], ["two"]]
        assert node.event("final")["body"] == ["done x"]
        node.do(op="call", service="demo.nobody", body="x")
        assert node.event("error", op="call")["code"] == 503
        # heal after the broker is killed and started again on the same endpoint
        broker.kill()
        broker = BrokerProcess(config=str(setup.config), bind=(endpoint,), start_timeout=60).start()
        assert node.event("connected", healed=True)["resubscribed"] == 1
        deadline = time.monotonic() + WAIT  # the Python client heals by itself too: publish until it has
        while not any(e["event"] == "message" and e["body"] == ["again"] for e in node.seen):
            assert time.monotonic() < deadline, node.seen[-10:]
            try:
                python.publish("demo.py", b"again", confirm=True, timeout=1.0)
            except mc0.Error:
                continue
            try:
                node.event("message", topic="demo.py")
            except AssertionError:
                continue
        served(python, "demo.chunks")  # the worker heals by itself (its READY again)
        node.do(op="call", service="demo.chunks", body="y")
        assert node.event("final")["body"] == ["done y"]
        node.do(op="close")
        assert node.proc.wait(WAIT) == 0
    finally:
        node.stop()
        python.close()
        worker.terminate()
        try:
            worker.wait(10)
        except subprocess.TimeoutExpired:
            worker.kill()
        broker.kill()
