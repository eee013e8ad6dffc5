"""Deployment: a config file's paths follow the file (or its data_dir), not the current directory;
``mc0 broker --check-config``; logs as text or JSON, ``-v`` anywhere, refused keys at WARNING,
never a raw routing id; the systemd unit."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mc0
from mc0 import config as cfg
from mc0 import keys
from mc0.cli.base import hoist_global_options
from mc0.process import BrokerProcess

from .conftest import CurveSetup

ROOT = Path(__file__).resolve().parent.parent


def _mc0(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mc0", *args], capture_output=True, text=True, timeout=30, cwd=cwd)


@pytest.mark.parametrize(
    ("text", "keys_dir", "journal"),
    [
        ("", "etc/keys", "etc/var/journal/main"),
        ('data_dir = ".."\n', "keys", "var/journal/main"),
        ('data_dir = "state"\n', "etc/state/keys", "etc/state/var/journal/main"),
        ('[security]\nkeys_dir = "/abs/keys"\n', "/abs/keys", "etc/var/journal/main"),
        ('[journals.main]\nfolder = "j"\n', "etc/keys", "etc/j"),
    ],
)
def test_config_paths_follow_the_file(tmp_path: Path, text: str, keys_dir: str, journal: str) -> None:
    path = tmp_path / "etc" / "mc0.toml"
    path.parent.mkdir()
    body = text if "[journals.main]" in text else text + "[journals.main]\n"
    path.write_text(body)
    loaded = cfg.load(path)
    base = tmp_path.resolve()
    assert loaded.security.keys_dir == (keys_dir if keys_dir.startswith("/") else str(base / keys_dir))
    assert loaded.journals["main"].path("main") == base / journal
    # Without a file (text only) paths stay relative: they follow the current directory.
    assert cfg.parse(body).security.keys_dir in ("keys", "/abs/keys")


def test_broker_started_elsewhere_uses_the_config_folder(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (etc / "mc0.toml").write_text('[broker]\nbind = ["tcp://127.0.0.1:*"]\n[journals.main]\ntopics = [">"]\n')
    with BrokerProcess(config=str(etc / "mc0.toml"), cwd=str(elsewhere)):
        pass
    assert (etc / "keys" / "broker.key_secret").exists() and (etc / "var" / "journal" / "main").is_dir()
    assert list(elsewhere.iterdir()) == []  # nothing created where it was started


@pytest.mark.timeout(240)  # (several CLI runs, each a Python start: 32 s in a quiet full run)
def test_check_config_reports_and_fails_in_one_line(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    keys.create(etc / "keys", "broker")
    (etc / "keys" / "allowed").mkdir()
    keys.create(etc / "keys", "alice")
    (etc / "keys" / "allowed" / "alice.key").write_bytes((etc / "keys" / "alice.key").read_bytes())
    conf = etc / "mc0.toml"
    conf.write_text('[http]\nlisten = "127.0.0.1:8222"\n[journals.main]\n')
    good = _mc0("broker", "--config", str(conf), "--check-config", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    out = good.stdout
    assert f"broker key: {etc.resolve()}/keys/broker.key_secret (broker, mode 600)" in out
    assert "allowed: " in out and "alice" in out and "http: monitoring on 127.0.0.1:8222" in out
    assert f"journal main: {etc.resolve()}/var/journal/main (will be created" in out
    assert out.strip().endswith("config OK")
    assert not (etc / "var").exists()  # checked, not created
    (etc / "keys" / "allowed" / "bad.key").write_text("not a key\n")
    bad = _mc0("broker", "--config", str(conf), "--check-config")
    assert bad.returncode == 1
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith("mc0: error: ") and "bad.key" in line
    for broken, needle in (
        ('[http]\nlisten = "http://x:1"\n', "http.listen"),
        ('[http]\nlisten = "127.0.0.1:1"\nallowed_hosts = ["http://mc0.example.org"]\n', "http.allowed_hosts"),
        ('[http]\nlisten = "127.0.0.1:1"\nallowed_hosts = ["mc0.example.org:8222"]\n', "http.allowed_hosts"),
        ('[broker]\nbind = ["127.0.0.1:1"]\n', "broker.bind"),
        ("[broker]\nnope = 1\n", "broker.nope: unknown key"),
    ):
        conf.write_text(broken)
        result = _mc0("broker", "--config", str(conf), "--check-config")
        assert result.returncode == 1 and needle in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["ping", "-v"], ["-v", "ping"]),
        (["sub", "t", "-vv", "--json"], ["-vv", "sub", "t", "--json"]),
        (["broker", "--log-format", "json"], ["--log-format", "json", "broker"]),
        (["broker", "--log-format=json", "--verbose"], ["--log-format=json", "--verbose", "broker"]),
        (["pub", "t", "--", "-v"], ["pub", "t", "--", "-v"]),  # after --, a body stays a body
        (["-v", "ping"], ["-v", "ping"]),
        (["pub", "t", "-vx"], ["pub", "t", "-vx"]),
    ],
)
def test_global_options_anywhere(args: list[str], expected: list[str]) -> None:
    assert hoist_global_options(args) == expected


def test_verbose_after_the_subcommand_is_accepted() -> None:
    result = _mc0("ping", "--endpoint", "tcp://127.0.0.1:1", "--timeout", "0.3", "-v")
    assert "no such option" not in result.stderr and "connection refused" in result.stderr


HEX_ID = re.compile(r"\b[0-9a-f]{10}\b")


def test_json_logs_refused_keys_at_warning_and_no_routing_ids(tmp_path: Path) -> None:
    setup = CurveSetup(tmp_path)
    broker = BrokerProcess("--log-format", "json", "-v", config=str(setup.config)).start()
    try:
        with mc0.Client(broker.endpoint, **setup.client_options("alice")) as alice:
            alice.publish("t", b"x", confirm=True)
        with pytest.raises(mc0.AuthFailed):
            mc0.Client(broker.endpoint, timeout=3, **setup.client_options("mallory")).connect()
    finally:
        broker.stop()
    text = broker.stderr_text()
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert entries and all({"ts", "level", "logger", "msg"} <= set(e) for e in entries)
    refused = [e for e in entries if "refused a key" in e["msg"]]
    assert refused and refused[0]["level"] == "WARNING"
    connected = [e["msg"] for e in entries if "connected as alice" in e["msg"]]
    assert connected and connected[0].startswith("peer alice#")  # identity#n (INFO, shown by -v)
    assert not [e["msg"] for e in entries if HEX_ID.search(e["msg"])]


def test_systemd_unit_runs_the_checked_config_and_reloads_on_sighup() -> None:
    unit = (ROOT / "etc" / "mc0.service").read_text()
    section = None
    keys_seen: dict[str, list[str]] = {}
    for line in unit.splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            keys_seen.setdefault(f"{section}.{key}", []).append(value)
    assert "--check-config" in keys_seen["Service.ExecStartPre"][0]
    assert "mc0 broker --config /etc/mc0/mc0.toml" in keys_seen["Service.ExecStart"][0]
    assert keys_seen["Service.ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert keys_seen["Install.WantedBy"] == ["multi-user.target"]
