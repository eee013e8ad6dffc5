"""Shared fixtures: real broker processes, raw DEALER peers, sync/async client variants; the
suite's rules: a missing dependency fails loudly (``require``), and a skipped test fails the run."""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import zmq

from mc0.process import BrokerProcess

NOOPS = ([b"NOOP"], [b"", b"NOOP"])  # a heartbeat, bare or enveloped

# Where each dependency a test needs beyond the package comes from (pyproject's extras and dependency
# groups; eventmq is installed by ./run test with --no-deps: its 2019 pins do not build on Python 3.11).
INSTALLED_BY = {
    "pyspark": "the spark extra",
    "pyarrow": "the spark extra",
    "matplotlib": "the spark extra",
    "atheris": "the test group",
    "nats": "the cluster extra",
    "pynng": "the memodb extra",
    "cbor2": "the memodb extra",
    "majortomo": "the test group",
    "eventmq": "./run test (pip install --no-deps eventmq==0.3.13)",
}
# What `./run test` installs, for a suite run by hand (pip >= 25.1 for --group).
INSTALL_ALL = (
    "pip install -e '.[spark,cluster,memodb]' --group test --group bench && pip install --no-deps eventmq==0.3.13"
)


def require(module: str) -> ModuleType:
    """Import a dependency a test needs, or fail loudly saying how to install it (never a skip:
    ``./run test`` installs everything the suite needs, and a skipped test fails the run)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        where = INSTALLED_BY.get(module, "the test group")
        raise ImportError(
            f"{module} is not installed: the tests need it ({where}); `./run test` installs everything the"
            f" suite needs, or: {INSTALL_ALL}"
        ) from exc


def promtool() -> str:
    """Prometheus's promtool (``./run test`` takes it from Debian's prometheus package into the venv),
    or fail loudly saying how to get it (never a skip)."""
    import shutil
    import sys

    beside = Path(sys.executable).parent / "promtool"  # (the venv's bin, not necessarily on PATH)
    found = str(beside) if beside.exists() else shutil.which("promtool")
    if found is None:
        raise FileNotFoundError(
            "promtool is missing: the alert and metrics tests need it; `./run test` takes it from Debian's "
            "prometheus package (apt-get download prometheus) into .venv/bin"
        )
    return found


# ------------------------------------------------------------ spread over workers (pytest-xdist)
# Tests that run one after another on one worker, named by the unit they join (keyed by file, or by one
# test function where a file's tests go to different units): several of them share something costly (a
# module- or session-scoped fixture), or they load the machine on purpose and must not run beside each
# other.  Every other test function goes, with all its parametrized variants (so a module-scoped fixture
# only it uses is made once), to whichever worker is free.  (Not xdist_group marks: --dist loadgroup
# ignores them under pytest 9.2, pytest-xdist #1386.)
# Spark: at most two JVM workloads at a time, on a 2-core box.  With every Spark test started at once
# (six JVMs beside the wheel's compile) a CI run took 480 s over a standalone cluster pipeline that
# takes 100 s alone, and a driver needed over 120 s to plan its third micro-batch.
SPARK_JOBS = "spark jobs"  # each test its own driver JVM (a subprocess), or a standalone cluster's four
ONE_WORKER = {
    "tests/test_spark.py": "spark",  # one Spark session (a JVM) for the module
    "tests/test_spark_cluster.py": SPARK_JOBS,
    "tests/test_pipeline.py": SPARK_JOBS,
    "tests/test_scripts.py::test_spark_scan_bench_smoke_run_reads_every_record_beside_the_plain_source": SPARK_JOBS,
    "tests/test_fuzz.py": "fuzz",  # the fuzzer keeps a core busy for its bounded time
    "tests/test_scripts.py": "bench",  # the benchmark smoke runs load the machine: one at a time
    "tests/test_mc0d_peers_live.py": "tests/test_mc0d_peers_live.py",  # a module-scoped broker
    "tests/test_docs.py": "tests/test_docs.py",  # a module-scoped broker (README's quick start)
    "tests/test_dialects_curve.py": "tests/test_dialects_curve.py",  # a module-scoped broker and worker
    "tests/test_conformance.py": "tests/test_conformance.py",  # module-scoped brokers (plain and CURVE)
    "tests/test_cluster_live.py": "tests/test_cluster_live.py",  # a module-scoped three-node NATS cluster
    "tests/test_jetstream_live.py": "tests/test_jetstream_live.py",  # a module-scoped three-node NATS cluster
    "tests/test_link_live.py": "tests/test_link_live.py",  # a module-scoped three-node NATS cluster
    "tests/test_packaging.py": "tests/test_packaging.py",  # a module-scoped wheel, compiled from the sdist
    "tests/test_httpd_live.py": "tests/test_httpd_live.py",  # a module-scoped broker
}


def unit_of(nodeid: str) -> str:
    """The unit a test runs in: its function's entry in ONE_WORKER, its file's, or its own function."""
    function = nodeid.split("[", 1)[0]
    return ONE_WORKER.get(function) or ONE_WORKER.get(function.split("::", 1)[0]) or function


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist load`` (./run test): a test function (all its variants) or a ONE_WORKER unit
    at a time, handed out in collection order (the long ones first: see below)."""
    if config.getoption("dist") != "load":
        return None  # another --dist asked for explicitly: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class ByFunctionOrUnit(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # collection order, not the biggest units first
    return ByFunctionOrUnit(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``long`` (tens of seconds: Spark, the fuzzer, the benchmark smoke runs) run
    first, so that under pytest-xdist they start together on separate workers instead of arriving
    last and running alone while the other workers idle.  The sort is stable: the rest keep their order."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


# ------------------------------------------------------------ no test may hide
_skipped: list[str] = []


def _note_skip(report: pytest.TestReport | pytest.CollectReport, when: str) -> None:
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append(f"{report.nodeid} ({when}): {reason}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report, report.when)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report, "collect")  # a whole module skipped (importorskip, allow_module_level)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _skipped and not hasattr(config, "workerinput"):
        terminalreporter.section("skipped tests fail the run", sep="=", red=True, bold=True)
        for line in _skipped:
            terminalreporter.line(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A skipped test is a test that did not run: the run fails (tests must not hide)."""
    if _skipped and not hasattr(session.config, "workerinput") and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


class RawPeer:
    """A bare DEALER socket speaking frames, for wire-level tests."""

    def __init__(self, endpoint: str, context: zmq.Context[Any], routing_id: bytes | None = None) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if routing_id is not None:
            self.socket.setsockopt(zmq.ROUTING_ID, routing_id)
        self.socket.connect(endpoint)

    def send(self, *frames: bytes | str) -> None:
        self.socket.send_multipart([f.encode() if isinstance(f, str) else f for f in frames])

    def offer(self, *frames: bytes | str) -> bool:
        """Send unless libzmq holds no pipe to the broker for this socket (a peer whose handshakes
        keep failing has none between reconnects: a blocking send would wait forever); True if queued."""
        try:
            self.socket.send_multipart([f.encode() if isinstance(f, str) else f for f in frames], zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def recv(self, timeout: float = 5.0) -> list[bytes]:
        if not self.socket.poll(int(timeout * 1000)):
            raise AssertionError(f"no message within {timeout}s")
        return self.socket.recv_multipart()

    def recv_skipping_noop(self, timeout: float = 5.0) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while True:
            frames = self.recv(max(0.01, deadline - time.monotonic()))
            if frames not in NOOPS:
                return frames

    def nothing(self, timeout: float = 0.3) -> bool:
        """True if no non-NOOP message arrives within timeout."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not self.socket.poll(int(left * 1000) + 1):
                return True
            if self.socket.recv_multipart() not in NOOPS:
                return False
        return True

    def connect(self, version: str = "1.0", ttl: int = 5000) -> list[bytes]:
        self.send("CONNECT", "VERSION", version, "TTL", str(ttl), "ID", "c")
        return self.recv()

    def close(self) -> None:
        self.socket.close(linger=0)


def headers_of(frames: list[bytes]) -> dict[str, str]:
    """Header dict of a received message (frames after the verb, up to the empty frame)."""
    out = {}
    i = 1
    while i + 1 < len(frames) and frames[i]:
        out[frames[i].decode()] = frames[i + 1].decode()
        i += 2
    return out


def payload_of(frames: list[bytes]) -> list[bytes]:
    i = 1
    while i < len(frames) and frames[i]:
        i += 2
    return frames[i + 1 :]


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "mc0.toml"
    path.write_text(text)
    return str(path)


def _mc0_children() -> list[Any]:
    import psutil

    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            command = child.cmdline()
            if (
                child.status() != psutil.STATUS_ZOMBIE
                and "mc0" in command
                and ("broker" in command or "serve" in command)
            ):
                found.append(child)
        except psutil.Error:
            continue
    return found


@pytest.fixture(autouse=True)
def _no_leaked_processes() -> Iterator[None]:
    """A broker or worker process a test started must be gone when the test is."""
    before = {p.pid for p in _mc0_children()}
    yield
    leaked = [p for p in _mc0_children() if p.pid not in before]
    described = [" ".join(p.cmdline()[-6:]) for p in leaked]
    for process in leaked:
        process.kill()
    assert not leaked, f"left running: {described}"


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test (and every process it starts) works in its own folder, never in the checkout:
    a CURVE broker creates keys/ where it runs."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def zctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def broker() -> Iterator[BrokerProcess]:
    """A broker without CURVE (wire-level tests); see ``curve`` for the secure one."""
    with BrokerProcess(insecure=True) as process:
        yield process


class CurveSetup:
    """Real keys in a temp folder: a broker keypair, allowed identities, one stranger."""

    def __init__(self, root: Path, identities: tuple[str, ...] = ("alice", "bob", "carol"), extra: str = "") -> None:
        from mc0 import keys

        self.root = root
        self.keys_dir = root / "keys"
        self.allowed_dir = self.keys_dir / "allowed"
        for name in (*identities, "mallory"):
            keys.create(self.keys_dir, name)
        self.allowed_dir.mkdir(parents=True)
        for name in identities:  # mallory has a key the broker does not know
            (self.allowed_dir / f"{name}.key").write_bytes((self.keys_dir / f"{name}.key").read_bytes())
        self.config = root / "mc0.toml"
        self.config.write_text(
            f'[security]\nkeys_dir = "{self.keys_dir}"\nallowed_dir = "{self.allowed_dir}"\nreload_ms = 100\n'
            f"[broker]\nmin_ttl_ms = 50\n{extra}"
        )
        self.broker_key = self.keys_dir / "broker.key"  # created by the broker on first start

    def secret(self, name: str) -> Path:
        return self.keys_dir / f"{name}.key_secret"

    def client_options(self, name: str = "alice") -> dict[str, Any]:
        return {"key": str(self.secret(name)), "broker_key": str(self.broker_key)}

    def start(self) -> BrokerProcess:
        return BrokerProcess(config=str(self.config)).start()


@pytest.fixture
def curve(tmp_path: Path) -> Iterator[tuple[CurveSetup, BrokerProcess]]:
    setup = CurveSetup(tmp_path)
    broker = setup.start()
    try:
        yield setup, broker
    finally:
        broker.__exit__(None, None, None)


class Bus:
    """A running broker plus the client options that reach it (CURVE on or off)."""

    def __init__(self, broker: BrokerProcess, options: dict[str, Any], sender: str) -> None:
        self.broker = broker
        self.endpoint = broker.endpoint
        self.options = options
        self.sender = sender  # the identity the broker stamps on our messages


@pytest.fixture(params=["plain", "curve"])
def bus(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Bus]:
    """One test body on a broker without CURVE and on one with CURVE and real keys."""
    if request.param == "plain":
        with BrokerProcess(insecure=True) as broker:
            yield Bus(broker, {}, "anonymous")
        return
    setup = CurveSetup(tmp_path)
    with setup.start() as broker:
        yield Bus(broker, setup.client_options("alice"), "alice")


@pytest.fixture
def raw(broker: BrokerProcess, zctx: zmq.Context[Any]) -> Iterator[Any]:
    """Factory of raw peers on the broker."""
    peers: list[RawPeer] = []

    def make(routing_id: bytes | None = None, connect: bool = True) -> RawPeer:
        peer = RawPeer(broker.endpoint, zctx, routing_id)
        peers.append(peer)
        if connect:
            reply = peer.connect()
            assert reply[0] == b"OK", reply
        return peer

    yield make
    for peer in peers:
        peer.close()


class SyncRunner:
    """Runs a test body against the sync API: ``await run(x)`` just returns x."""

    name = "sync"

    def __init__(self) -> None:
        import mc0

        self.Client = mc0.Client

    async def __call__(self, value: Any) -> Any:
        return value


class AsyncRunner:
    """Runs the same body against mc0.aio: ``await run(coro)`` awaits it."""

    name = "async"

    def __init__(self) -> None:
        import mc0.aio

        self.Client = mc0.aio.Client

    async def __call__(self, value: Any) -> Any:
        if asyncio.iscoroutine(value):
            return await value
        return value


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> SyncRunner | AsyncRunner:
    """One test body, both client APIs (names mirror each other)."""
    return SyncRunner() if request.param == "sync" else AsyncRunner()
