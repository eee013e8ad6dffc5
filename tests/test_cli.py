"""The mc0 command line, run as real processes against a real broker."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mc0.process import BrokerProcess

from .conftest import write_config


def mc0(*args: str, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 30):
    return subprocess.run(
        [sys.executable, "-m", "mc0", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def start_sub(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mc0", "sub", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def publish_until_exit(sub: subprocess.Popen[str], *pub_args: str, stdin: str | None = None, env=None) -> str:
    """Publish one message at a time until the subscriber exits (it may join late); bounded."""
    try:
        for _ in range(100):
            result = mc0("pub", *pub_args, stdin=stdin, env=env)
            assert result.returncode == 0, result.stderr
            try:
                sub.wait(0.2)
                break
            except subprocess.TimeoutExpired:
                continue
        out, err = sub.communicate(timeout=20)
    finally:
        sub.kill()
    assert sub.returncode == 0, err
    return out


def test_pub_and_sub_round_trip_with_json_stdin_and_headers(broker: BrokerProcess) -> None:
    sub = start_sub("cli.>", "--json", "--count", "1", "--wait", "20", "--endpoint", broker.endpoint)
    out = publish_until_exit(sub, "cli.data", "-", "-H", "X-Run=7", "--endpoint", broker.endpoint, stdin="from stdin")
    (line,) = out.splitlines()
    assert json.loads(line) == {
        "topic": "cli.data",
        "sender": "anonymous",
        "headers": {"X-Run": "7"},
        "body": "from stdin",
    }


def test_endpoint_from_the_environment_and_sub_count(broker: BrokerProcess) -> None:
    env = {"MC0_ENDPOINT": broker.endpoint}
    sub = start_sub("n", "other", "--count", "3", "--wait", "20", env=env)
    out = publish_until_exit(sub, "n", "hi", "--confirm", env=env)
    assert out.splitlines() == ["n hi"] * 3


def test_sub_group_members_share_the_messages(broker: BrokerProcess) -> None:
    args = ("jobs.>", "--group", "workers", "--json", "--count", "1", "--wait", "20", "--endpoint", broker.endpoint)
    members = [start_sub(*args) for _ in range(2)]
    try:
        for i in range(100):  # bounded: each member exits after its first message
            assert mc0("pub", "jobs.x", str(i), "--endpoint", broker.endpoint).returncode == 0
            if all(m.poll() is not None for m in members):
                break
        outs = [m.communicate(timeout=20)[0] for m in members]
    finally:
        for m in members:
            m.kill()
    records = [json.loads(line) for out in outs for line in out.splitlines()]
    assert len(records) == 2 and {r["group"] for r in records} == {"workers"}
    assert len({r["body"] for r in records}) == 2  # two different messages: each went to one member


def test_ping_prints_round_trips(broker: BrokerProcess) -> None:
    result = mc0("ping", "--count", "3", "--endpoint", broker.endpoint)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("PONG from") == 3 and "median" in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["pub", "bad..topic", "x"], "invalid topic 'bad..topic': empty token"),
        (["pub", "mc0.sys.x", "x", "--confirm"], "403 topics mc0.sys.> are the broker's own"),
        (["pub", "t", "x", "-H", "NoEquals"], "is not KEY=VALUE"),
        (["pub", "t", "x", "-H", "Trace=1"], "must be ASCII and start with X-"),
        (["sub", "a.>.b", "--count", "1"], "may only be the last token"),
        (["sub", "t", "--group", "has space", "--count", "1"], "group 'has space': 1 to 255 UTF-8 bytes"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_nonzero(broker: BrokerProcess, args: list[str], needle: str) -> None:
    result = mc0(*args, "--endpoint", broker.endpoint)
    assert result.returncode != 0
    assert needle in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("mc0: error: ")
    assert "Traceback" not in result.stderr


def test_unreachable_broker_is_one_line_saying_refused() -> None:
    result = mc0("ping", "--endpoint", "tcp://127.0.0.1:1", "--timeout", "0.3")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "mc0: error: tcp://127.0.0.1:1: connection refused (is a broker running there? start one with `mc0 broker`)"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[broker]\nbogus = 1\n", "broker.bogus: unknown key"),
        ("[broker.limits]\nmax_frames = -1\n", "broker.limits.max_frames: must be at least 1, got -1"),
        ("[broker]\nsend_hwm = 'lots'\n", "broker.send_hwm: must be an integer"),
        ("[broker\n", "not valid TOML"),
        ("[broker]\nmin_ttl_ms = 500\nmax_ttl_ms = 100\n", "broker.min_ttl_ms: 500 exceeds max_ttl_ms 100"),
    ],
)
def test_bad_config_names_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    config = write_config(tmp_path, text)
    result = mc0("broker", "--insecure", "--config", config, timeout=15)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"mc0: error: {config}: ") and message in line


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    result = mc0("ping", "--config", str(tmp_path / "nope.toml"))
    assert result.returncode == 1 and "nope.toml: no such file (`mc0 config sample -o FILE` writes one" in result.stderr


def test_bind_failure_is_one_line(broker: BrokerProcess) -> None:
    result = mc0("broker", "--insecure", "--bind", broker.endpoint, timeout=15)
    assert result.returncode == 1
    assert "cannot bind" in result.stderr and "Address already in use" in result.stderr


def test_sample_config_loads_and_is_the_defaults() -> None:
    from mc0 import config

    sample = Path(__file__).parent.parent / "etc" / "mc0.toml"
    # The text's values are the defaults (data_dir aside: the sample's paths are the checkout's).
    parsed = config.parse(sample.read_text())
    assert parsed.data_dir == ".." and dataclasses.replace(parsed, data_dir="") == config.Config()
    loaded = config.load(sample)
    assert loaded.security.keys_dir == str(sample.parent.parent.resolve() / "keys")


def test_demo_runs_end_to_end_with_curve_and_exits_zero(tmp_path: Path) -> None:
    for run in ("first run creates keys", "second run reuses them"):
        result = subprocess.run(
            [sys.executable, "-m", "mc0", "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, (run, result.stderr)
        for step in (
            "broker listening on",
            "bob got demo.orders.created from alice",
            "ERROR 403: bob may not publish",
            "alice got FINAL: welcome back, alice",
            "bob got FINAL: hello bob",
            "AuthFailed",
            "broker exited 0",
        ):
            assert step in result.stdout, (run, step)
    secrets = sorted((tmp_path / "var" / "demo" / "keys").glob("*.key_secret"))
    assert [p.name for p in secrets] == [f"{n}.key_secret" for n in ("alice", "bob", "broker", "stranger")]
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in secrets)


def test_serve_call_stream_scatter_and_stats(broker: BrokerProcess) -> None:
    root = Path(__file__).parent.parent
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mc0",
            "serve",
            "tests.handlers:whoami",
            "--service",
            "who",
            "--endpoint",
            broker.endpoint,
        ],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().startswith("mc0 worker serving who")
        result = mc0("call", "who", "--endpoint", broker.endpoint)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == str(worker.pid)
        result = mc0("call", "who", "--all", "--json", "--endpoint", broker.endpoint)
        assert result.returncode == 0, result.stderr
        (line,) = result.stdout.splitlines()
        assert json.loads(line)["body"] == str(worker.pid) and "1 answered, 0 missing" in result.stderr
        result = mc0("stats", "--json", "--endpoint", broker.endpoint)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["services"]["who"]["workers"] == 1 and report["services"]["who"]["served"] == 2
        table = mc0("stats", "--endpoint", broker.endpoint)
        assert table.returncode == 0 and "services" in table.stdout and "who" in table.stdout
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(10) == 0  # a clean stop on SIGTERM
        result = mc0("call", "who", "--endpoint", broker.endpoint)
        assert result.returncode == 1 and result.stderr.strip() == (
            "mc0: error: 503 no worker for who (start one: mc0 serve MODULE:FUNCTION --service NAME)"
        )
    finally:
        worker.kill()
        worker.communicate(timeout=10)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["serve", "nocolon", "--service", "x"], "is not MODULE:FUNCTION"),
        (["serve", "no_such_module_xyz:f", "--service", "x"], "cannot import no_such_module_xyz"),
        (["serve", "json:nothing_here", "--service", "x"], "json has no callable 'nothing_here'"),
        (["serve", "json:dumps", "--service", "bad..name"], "invalid topic 'bad..name'"),
        (["call", "bad..svc"], "invalid topic 'bad..svc'"),
    ],
)
def test_serve_and_call_misuse_is_one_line(broker: BrokerProcess, args: list[str], needle: str) -> None:
    result = mc0(*args, "--endpoint", broker.endpoint)
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("mc0: error: ") and needle in line


def test_keys_commands_new_list_show_allow_revoke(tmp_path: Path) -> None:
    folder = ["--dir", str(tmp_path / "k"), "--allowed", str(tmp_path / "k" / "allowed")]
    created = mc0("keys", "new", "alice", "--dir", str(tmp_path / "k"))
    assert created.returncode == 0, created.stderr
    assert "SHA256:" in created.stdout and "mode 0600" in created.stdout
    assert (tmp_path / "k" / "alice.key_secret").stat().st_mode & 0o777 == 0o600
    again = mc0("keys", "new", "alice", "--dir", str(tmp_path / "k"))
    assert again.returncode == 1 and "exists; use --force" in again.stderr
    sealed = mc0("keys", "new", "ops", "--passphrase", "--dir", str(tmp_path / "k"), env={"MC0_PASSPHRASE": "pw"})
    assert sealed.returncode == 0 and "sealed" in sealed.stdout
    shown = mc0("keys", "show", "alice", "--dir", str(tmp_path / "k"))
    assert shown.returncode == 0 and len(shown.stdout.strip()) == 40
    assert mc0("keys", "allow", "alice", *folder).returncode == 0
    assert (tmp_path / "k" / "allowed" / "alice.key").exists()
    wrong = mc0("keys", "allow", str(tmp_path / "k" / "alice.key_secret"), *folder)
    assert wrong.returncode == 1 and "is a secret key file" in wrong.stderr
    listing = mc0("keys", "list", *folder)
    assert listing.returncode == 0 and "alice" in listing.stdout and "allowed" in listing.stdout
    revoked = mc0("keys", "revoke", "alice", "--allowed", str(tmp_path / "k" / "allowed"))
    assert revoked.returncode == 0 and not (tmp_path / "k" / "allowed" / "alice.key").exists()
    assert "revoked" in mc0("keys", "list", *folder).stdout
    missing = mc0("keys", "revoke", "nobody", "--allowed", str(tmp_path / "k" / "allowed"))
    assert missing.returncode == 1 and "is not allowed" in missing.stderr


def test_client_with_half_a_curve_setup_is_a_one_line_error(broker: BrokerProcess, tmp_path: Path) -> None:
    result = mc0("ping", "--endpoint", broker.endpoint, "--key", str(tmp_path / "nope.key_secret"))
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert "CURVE needs" in line and "broker_key" in line
    result = mc0("ping", "--endpoint", broker.endpoint, "--key", str(tmp_path / "nope.key_secret"), "--broker-key", "x")
    assert result.returncode == 1 and "nope.key_secret: no such key file" in result.stderr


def test_an_unusable_journal_folder_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a folder")
    config = write_config(tmp_path, f'[journals.main]\nfolder = "{tmp_path / "afile" / "j"}"\n')
    result = mc0("broker", "--insecure", "--config", config, "--bind", "tcp://127.0.0.1:*", timeout=15)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("mc0: error: journal main: ") and "afile" in line and "Not a directory" in line


def test_pub_to_an_identity_never_seen_says_so_and_one_seen_does_not(broker: BrokerProcess) -> None:
    ep = ("--endpoint", broker.endpoint)
    nobody = mc0("pub", "cmd.x", "now", "--to", "nobody", *ep)
    assert nobody.returncode == 0, nobody.stderr
    assert nobody.stdout.strip() == "nobody: stored"  # --to always says where the letter went
    (note,) = nobody.stderr.strip().splitlines()
    assert note.startswith("mc0: note: no identity 'nobody' has connected to this broker since it started")
    assert "check the name" in note
    # Everyone is 'anonymous' on this broker: an identity seen before (and offline now) gets no note.
    offline = mc0("pub", "cmd.x", "now", "--to", "anonymous", "--json", *ep)
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["outcome"] in ("stored", "delivered") and not offline.stderr.strip()


def test_the_identity_op_answers_only_who_may_send_there(curve: Any) -> None:
    import mc0 as lib

    setup, broker = curve
    query = json.dumps({"op": "identity", "identity": "bob"})
    with lib.Client(broker.endpoint, **setup.client_options("alice")) as alice:
        assert json.loads(alice.request("mc0.broker", query).body) == {
            "identity": "bob",
            "seen": False,
            "connected": False,
        }
        with lib.Client(broker.endpoint, **setup.client_options("bob")):
            assert json.loads(alice.request("mc0.broker", query).body)["connected"] is True
        assert json.loads(alice.request("mc0.broker", query).body)["seen"] is True
        with pytest.raises(lib.BadRequest):
            alice.request("mc0.broker", json.dumps({"op": "identity", "identity": "has space"}))
