"""The ``[cluster]`` interface of issue 21 as a table: what loads, what is refused (naming the key,
never showing a password), and the nats-py options the link connects with (servers, credentials,
nkey seed, TLS).  The link itself, against real nats-server nodes: tests/test_cluster_live.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mc0.broker.cluster.link import nats_options, redacted
from mc0.config import load, parse
from mc0.errors import ConfigError

GOOD = 'nats = ["nats://mc0:secret@127.0.0.1:4222", "tls://10.0.0.2:4222"]\nname = "b-1_x"\n'


def test_a_cluster_loads_and_its_options_name_every_server_credentials_and_nkey(tmp_path: Path) -> None:
    path = tmp_path / "mc0.toml"
    path.write_text(f'[cluster]\n{GOOD}credentials = "keys/broker.creds"\nnkey_seed = "keys/broker.nk"\n')
    cluster = load(path).cluster
    options = nats_options(cluster, "mc0 b-1_x")
    assert options["servers"] == ["nats://mc0:secret@127.0.0.1:4222", "tls://10.0.0.2:4222"]
    assert options["name"] == "mc0 b-1_x" and options["max_reconnect_attempts"] == -1 and options["no_echo"]
    assert options["user_credentials"] == str(tmp_path / "keys/broker.creds")  # relative to the config file
    assert options["nkeys_seed"] == str(tmp_path / "keys/broker.nk")
    assert "tls" not in options  # (TLS as the tls:// scheme says)
    assert parse("", "x").cluster.nats == ()  # standalone: the default


@pytest.mark.parametrize(
    ("body", "where", "shown", "hidden"),
    [
        ('nats = ["http://127.0.0.1:4222"]', "cluster.nats[0]", "http://127.0.0.1:4222", None),
        ('nats = ["nats://127.0.0.1"]', "cluster.nats[0]", "not a NATS URL", None),  # no port
        ('nats = ["nats://a:4222", "nats://mc0:hunter2@:4222"]', "cluster.nats[1]", "not a NATS URL", "hunter2"),
        ('nats = ["nats://a:4222"]\nname = "b.1"', "cluster.name", "'b.1'", None),  # a subject token: no dots
        ('nats = ["nats://a:4222"]\nname = "b 1"', "cluster.name", "'b 1'", None),
        ('nats = ["nats://a:4222"]\ntls_key = "k.pem"', "cluster.tls_key", "tls_cert", None),
        ('nats = ["nats://a:4222"]\nroutes = 3', "cluster.routes", "", None),  # unknown key
    ],
)
def test_a_bad_cluster_is_a_config_error_naming_the_key_and_no_password(
    body: str, where: str, shown: str, hidden: str | None
) -> None:
    with pytest.raises(ConfigError) as info:
        parse(f"[cluster]\n{body}\n", "mc0.toml")
    assert where in str(info.value.where) and shown in str(info.value)
    if hidden is not None:
        assert hidden not in str(info.value)


def test_a_tls_file_that_cannot_be_read_is_a_config_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "mc0.toml"
    path.write_text(f'[cluster]\n{GOOD}tls_ca = "missing-ca.pem"\n')
    cluster = load(path).cluster
    with pytest.raises(ConfigError) as info:
        nats_options(cluster, "mc0 b")
    assert "cluster.tls_ca" in str(info.value.where)


def test_urls_are_shown_without_credentials() -> None:
    assert redacted("nats://mc0:secret@127.0.0.1:4222") == "nats://127.0.0.1:4222"
    assert redacted("tls://10.0.0.2:4222") == "tls://10.0.0.2:4222"


def test_the_command_line_cluster_is_checked_in_one_line_and_check_config_hides_the_password(
    tmp_path: Path,
) -> None:
    command = [sys.executable, "-m", "mc0", "broker", "--insecure", "--check-config"]
    bad = subprocess.run([*command, "--cluster", "nats://127.0.0.1"], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("mc0: error: --cluster entry 1: not a NATS URL")
    good = subprocess.run(
        [*command, "--cluster", "nats://mc0:secret@127.0.0.1:4222", "--name", "b1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert good.returncode == 0, good.stderr
    assert "127.0.0.1:4222" in good.stdout and "secret" not in good.stdout + good.stderr


@pytest.mark.parametrize(
    ("given", "warned"),
    [
        pytest.param(["--cluster", "nats://mc0:secret@127.0.0.1:4222"], True, id="password-on-the-command-line"),
        pytest.param(["--cluster", "nats://s3cr3ttoken@127.0.0.1:4222"], True, id="token-on-the-command-line"),
        pytest.param(["--cluster", "nats://127.0.0.1:4222"], False, id="no-credentials"),
        pytest.param([], False, id="from-MC0_CLUSTER"),
    ],
)
def test_nats_credentials_on_the_command_line_are_warned_of_in_one_line_and_mc0_cluster_takes_them_unseen(
    given: list[str], warned: bool
) -> None:
    """A password (or token) in ``--cluster`` is readable by every local user in /proc/PID/cmdline: the
    broker says so in one line on stderr (never showing it) and names the ways that are not: $MC0_CLUSTER
    (the same URLs, in the environment only its user and root can read) or the config file."""
    import os

    command = [sys.executable, "-m", "mc0", "broker", "--insecure", "--check-config", "--name", "b1", *given]
    env = {**os.environ, "MC0_CLUSTER": "nats://mc0:secret@127.0.0.1:4223"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("mc0: warning: ")]
    assert len(warnings) == warned and "secret" not in done.stdout + done.stderr
    if warned:
        assert "$MC0_CLUSTER" in warnings[0] and "every local user can read" in warnings[0]
    assert ("127.0.0.1:4223" in done.stdout) == (not given)  # the command line wins over $MC0_CLUSTER


def test_the_brokers_help_shows_no_password_in_its_cluster_example() -> None:
    done = subprocess.run([sys.executable, "-m", "mc0", "broker", "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "$MC0_CLUSTER" in done.stdout
    assert "user:pass" not in done.stdout and "@10." not in done.stdout
