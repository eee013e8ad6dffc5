"""A configuration reload (SIGHUP) against a real broker process: a config that raised anything but
ConfigError never stops the broker, and the one in force stays until a good one comes."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

import mc0
from mc0.process import BrokerProcess

from .test_config import BROKEN_CONFIGS


def counter(client: mc0.Client, name: str) -> int:
    return int(json.loads(client.request("mc0.broker", "stats").body)["counters"].get(name, 0))


def sighup_and_wait(broker: BrokerProcess, client: mc0.Client) -> None:
    """SIGHUP, and wait (bounded) until the broker counts the reload done."""
    before = counter(client, "reloads")
    broker.signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while counter(client, "reloads") == before:
        assert time.monotonic() < deadline, "the reload was never done"
        time.sleep(0.02)


@pytest.mark.timeout(90)
def test_sighup_with_a_broken_config_never_stops_the_broker_and_the_one_in_force_stays(tmp_path: Path) -> None:
    """Item 4: a reload whose config raised anything but ConfigError killed the broker."""
    (tmp_path / "loop").symlink_to("loop")
    config = tmp_path / "mc0.toml"
    strict = '[permissions.default]\npublish = ["ok.>"]\nsubscribe = [">"]\ncall = [">"]\n'
    config.write_text(strict)
    with BrokerProcess(config=str(config), insecure=True) as broker:
        with mc0.Client(broker.endpoint) as client:
            for _, text, _ in BROKEN_CONFIGS:
                config.write_text(text)
                sighup_and_wait(broker, client)
                client.publish("ok.x", b"allowed", confirm=True)  # alive, and the permissions in force stay
                with pytest.raises(mc0.Forbidden):
                    client.publish("other", b"still denied", confirm=True)
            assert counter(client, "reload_failed") == len(BROKEN_CONFIGS)
            config.write_text("")  # a good config again: it takes effect
            sighup_and_wait(broker, client)
            client.publish("other", b"now allowed", confirm=True)
        assert broker.stop() == 0
        log = broker.stderr_text()
    lines = [line for line in log.splitlines() if "configuration not reloaded" in line]
    assert all(any(where in line for line in lines) for _, _, where in BROKEN_CONFIGS), log[-3000:]
    assert len(lines) <= len(BROKEN_CONFIGS) and "Traceback" not in log  # one line each (a repeat: none)
