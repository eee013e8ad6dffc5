"""The first five minutes' mistakes (issue 27), and those README promises to answer: each is one
line on stderr that names what to do, a non-zero exit, and no traceback.  Real processes: the CLI
in a subprocess, a real CURVE broker with real keys; a missing extra is simulated by running the
CLI in a process whose ``sys.modules`` hides those packages (nothing is uninstalled)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mc0 import ports

from .conftest import CurveSetup

pytestmark = pytest.mark.timeout(120)

# Runs the CLI with some packages hidden: ``import x`` raises ImportError for each (sys.modules[x] = None).
HIDING = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
sys.argv = ["mc0", *sys.argv[2:]]
from mc0.cli import main
main()
"""
SPARK = ("pyspark", "pyarrow", "pandas", "matplotlib")
POLICY = """
[permissions.identity.bob]
publish = ["public.>"]
subscribe = [">"]
"""


@dataclass(frozen=True)
class Mistake:
    name: str
    args: tuple[str, ...]  # {endpoint}, {alice}, {bob}, {broker_key}, {config}, {memodb} are filled in
    says: tuple[str, ...]  # each in the line: what is wrong, and what to do
    hidden: tuple[str, ...] = ()
    status: int = 1
    within: float = 20.0  # seconds, interpreter start-up included (a loaded machine)
    env: dict[str, str] = field(default_factory=dict)


MISTAKES = [
    Mistake(
        "pub refused, unconfirmed",
        ("pub", "orders.x", "x", "--endpoint", "{endpoint}", "--key", "{bob}", "--broker-key", "{broker_key}"),
        ("403 bob may not publish to orders.x", "a grant in the broker's [permissions.identity.bob] allows it"),
    ),
    Mistake(
        "pub refused, confirmed",
        (
            "pub",
            "orders.x",
            "x",
            "--confirm",
            "--endpoint",
            "{endpoint}",
            "--key",
            "{bob}",
            "--broker-key",
            "{broker_key}",
        ),
        ("403 bob may not publish to orders.x", "[permissions.identity.bob]"),
    ),
    Mistake(
        "pub refused, several",
        (
            "pub",
            "orders.x",
            "x",
            "--count",
            "3",
            "--endpoint",
            "{endpoint}",
            "--key",
            "{bob}",
            "--broker-key",
            "{broker_key}",
        ),
        ("403 bob may not publish to orders.x (and 2 more refused)", "[permissions.identity.bob]"),
    ),
    Mistake(
        "pipeline without the Spark extra",
        ("pipeline", "--once", "--endpoint", "{endpoint}", "--key", "{alice}", "--broker-key", "{broker_key}"),
        ("mc0 pipeline needs the Spark extra", "pip install 'mc0[spark]'"),
        hidden=SPARK,
    ),
    Mistake(
        "report without the Spark extra",
        ("report", "--input", "{root}"),
        ("mc0 report needs the Spark extra", "pip install 'mc0[spark]'"),
        hidden=SPARK,
    ),
    Mistake(
        "an ipc:// endpoint nothing listens at",
        ("ping", "--endpoint", "ipc://{root}/missing.sock", "--timeout", "1"),
        ("no broker listening at {root}/missing.sock", "start one there with `mc0 broker --bind ipc://"),
        within=8.0,
    ),
    Mistake(
        "broker --cluster without nats-py",
        ("broker", "--cluster", "nats://127.0.0.1:4222", "--bind", "tcp://127.0.0.1:*"),
        ("joining a cluster needs nats-py", "pip install 'mc0[cluster]'"),
        hidden=("nats",),
    ),
    Mistake(
        "cluster-demo without nats-py",
        ("cluster-demo",),
        ("the cluster demo needs nats-py", "pip install 'mc0[cluster]'"),
        hidden=("nats",),
    ),
    Mistake(
        "MemoDB configured without pynng and cbor2",
        ("broker", "--config", "{memodb}", "--bind", "tcp://127.0.0.1:*"),
        ("MemoDB needs pynng and cbor2, not installed", "pip install 'mc0[memodb]'"),
        hidden=("pynng", "cbor2"),
    ),
    Mistake(
        "an endpoint without a scheme",
        ("ping", "--endpoint", "127.0.0.1:61616"),
        ("'127.0.0.1:61616' has no scheme", "(e.g. tcp://127.0.0.1:61616)"),
    ),
    Mistake(
        "a refused port",
        ("ping", "--endpoint", "tcp://127.0.0.1:{free_port}"),
        ("connection refused", "start one with `mc0 broker`"),
        within=8.0,
    ),
    Mistake(
        "an unresolvable host",
        ("ping", "--endpoint", "tcp://no-such-host.invalid:61616"),
        ("cannot resolve host 'no-such-host.invalid'", "check the name"),
    ),
    Mistake(
        "no keys against a CURVE broker",
        ("ping", "--endpoint", "{endpoint}"),
        ("the broker requires CURVE", "give --key and --broker-key"),
    ),
    Mistake(
        "a key the broker does not allow",
        ("ping", "--endpoint", "{endpoint}", "--key", "{mallory}", "--broker-key", "{broker_key}"),
        ("the broker refused this key", "`mc0 keys allow NAME` on the broker admits it"),
    ),
    Mistake(
        "half a CURVE setup",
        ("ping", "--endpoint", "{endpoint}", "--key", "{alice}"),
        ("CURVE needs this client's secret key and the broker's public key", "--broker-key / MC0_BROKER_KEY"),
    ),
    Mistake(
        "a service nobody serves",
        ("call", "nobody.serves", "--endpoint", "{endpoint}", "--key", "{alice}", "--broker-key", "{broker_key}"),
        ("503 no worker for nobody.serves", "start one: mc0 serve MODULE:FUNCTION --service NAME"),
    ),
    Mistake("an unknown command", ("nope",), ("No such command 'nope'", "see `mc0 --help`"), status=2),
    Mistake("a missing argument", ("sub",), ("Missing argument 'PATTERNS...'", "see `mc0 sub --help`"), status=2),
    Mistake(
        "options that do not go together",
        ("sub", "t", "--group", "g", "--from", "0"),
        ("--group and --from do not go together", "see `mc0 sub --help`"),
        status=2,
    ),
    Mistake("a bad header", ("pub", "t", "x", "-H", "Trace"), ("is not KEY=VALUE", "see `mc0 pub --help`"), status=2),
    Mistake(
        "a config file that is not there",
        ("ping", "--config", "{root}/nope.toml"),
        ("nope.toml: no such file", "`mc0 config sample -o FILE` writes one"),
    ),
    Mistake(
        "a bad config value",
        ("broker", "--config", "{bad_config}", "--check-config"),
        ("broker.send_hwm: must be an integer",),
    ),
    Mistake(
        "a sample over an existing file",
        ("config", "sample", "-o", "{bad_config}"),
        ("exists", "give --force to overwrite it"),
    ),
    Mistake(
        "a keypair that exists",
        ("keys", "new", "alice", "--dir", "{keys_dir}"),
        ("exists", "use --force"),
    ),
    Mistake(
        "a handler that cannot be imported",
        ("serve", "no_such_module_xyz:f", "--service", "s", "--endpoint", "{endpoint}"),
        ("cannot import no_such_module_xyz",),
    ),
    Mistake(
        "a bad topic",
        ("pub", "bad..topic", "x", "--endpoint", "{endpoint}", "--key", "{alice}", "--broker-key", "{broker_key}"),
        ("invalid topic 'bad..topic': empty token",),
    ),
]


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("mistakes")
    setup = CurveSetup(root, extra=POLICY)
    memodb = root / "memodb.toml"
    memodb.write_text(f'[memodb]\nenabled = true\nlisten = "tcp://127.0.0.1:{ports.free_port()}"\n')
    bad_config = root / "bad.toml"
    bad_config.write_text("[broker]\nsend_hwm = 'lots'\n")
    with setup.start() as broker:
        yield {
            "root": str(root),
            "endpoint": broker.endpoint,
            "alice": str(setup.secret("alice")),
            "bob": str(setup.secret("bob")),
            "mallory": str(setup.secret("mallory")),
            "broker_key": str(setup.broker_key),
            "keys_dir": str(setup.keys_dir),
            "memodb": str(memodb),
            "bad_config": str(bad_config),
            "free_port": str(ports.free_port()),
        }


def run_cli(
    args: list[str], hidden: tuple[str, ...], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    command = (
        [sys.executable, "-c", HIDING, ",".join(hidden), *args] if hidden else [sys.executable, "-m", "mc0", *args]
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MC0_")}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60, env={**environment, **env})


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.name for m in MISTAKES])
def test_each_mistake_is_one_line_naming_what_to_do_and_a_non_zero_exit(
    mistake: Mistake, bus: dict[str, str], tmp_path: Path
) -> None:
    args = [arg.format(**bus) for arg in mistake.args]
    started = time.monotonic()
    done = run_cli(args, mistake.hidden, tmp_path, mistake.env)
    took = time.monotonic() - started
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    (line,) = lines
    assert line.startswith("mc0: error: "), line
    for words in mistake.says:
        assert words.format(**bus) in line, line
    assert done.returncode == mistake.status, (done.returncode, line)
    assert took < mistake.within, f"{took:.1f} s"


def test_a_missing_extra_is_named_before_the_broker_makes_a_keypair(tmp_path: Path) -> None:
    done = run_cli(["broker", "--cluster", "nats://127.0.0.1:4222"], ("nats",), tmp_path, {})
    assert done.returncode == 1 and "pip install 'mc0[cluster]'" in done.stderr
    assert not (tmp_path / "keys").exists()  # nothing made: the extra was named first


def test_hidden_packages_are_really_hidden(tmp_path: Path) -> None:
    """The simulation itself: a package hidden this way cannot be imported by the CLI's process."""
    probe = HIDING.replace("from mc0.cli import main\nmain()", "import pyspark")
    done = subprocess.run([sys.executable, "-c", probe, "pyspark"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "import of pyspark halted; None in sys.modules" in done.stderr
