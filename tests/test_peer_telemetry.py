"""Peer telemetry (mc0.sys.peer: who connects and disconnects) and the `peers` report are for
identities granted them by name once a [permissions] table exists; `>` does not reach them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mc0
from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore
from mc0.permissions import Permissions

from .conftest import CurveSetup
from .test_core import connect, f

OPS = {"subscribe": [">", "mc0.sys.peer"]}
POLICY = {
    "default": {"subscribe": [">"]},
    "identity": {
        "ops": OPS,
        "sysops": {"subscribe": ["mc0.sys.>"]},
        "denied": {"subscribe": [">", "mc0.sys.>"], "deny": {"subscribe": ["mc0.sys.peer"]}},
    },
}

# (policy table or None, identity, pattern, allowed)
CASES = [
    (None, "anyone", "mc0.sys.peer", True),  # no table: everything stays allowed
    (None, "anyone", "mc0.sys.>", True),
    (POLICY, "anyone", "mc0.sys.peer", False),  # `>` does not name mc0.sys
    (POLICY, "anyone", "mc0.sys.*", False),
    (POLICY, "anyone", "mc0.sys.>", False),
    (POLICY, "anyone", "mc0.sys.rpc", True),  # the rest of mc0.sys is as before
    (POLICY, "anyone", "mc0.sys.dead.>", True),
    (POLICY, "anyone", ">", True),  # never matches mc0.sys.* anyway
    (POLICY, "anyone", "mc0.>", True),
    (POLICY, "ops", "mc0.sys.peer", True),
    (POLICY, "ops", "mc0.sys.>", True),
    (POLICY, "sysops", "mc0.sys.*", True),
    (POLICY, "denied", "mc0.sys.peer", False),  # a deny wins over a grant naming it
    (POLICY, "denied", "mc0.sys.>", False),
    (POLICY, "denied", "mc0.sys.rpc", True),
    ({"default": {"subscribe": [">"], "publish": [">"]}}, "anyone", "mc0.sys.peer", False),  # "allow all" table
]


@pytest.mark.parametrize(("table", "who", "pattern", "allowed"), CASES)
def test_who_may_subscribe_to_peer_telemetry(table: dict | None, who: str, pattern: str, allowed: bool) -> None:
    core = BrokerCore(permissions=Permissions.from_table(table) if table is not None else None)
    connect(core, b"s", who=who)
    ((_, frames),) = core.handle(b"s", f("SUB", "ID", "1", "", pattern), 0.0, who)
    answer = P.decode(frames, sender=P.Side.BROKER)
    if allowed:
        assert answer.verb is P.Verb.OK, answer
    else:
        assert (answer.verb, answer.headers["CODE"]) == (P.Verb.ERROR, "403"), answer
        assert len(core.subscriptions) == 0  # refused whole: nothing half-applied


def subscribers_of_connects(core: BrokerCore) -> list[bytes]:
    out = connect(core, b"newcomer", who="newcomer")
    return sorted(rid for rid, frames in out if rid != b"newcomer")


def test_connect_events_reach_only_granted_subscribers_and_the_peers_report_is_theirs_too() -> None:
    core = BrokerCore(permissions=Permissions.from_table(POLICY))
    for who in ("ops", "anyone", "sysops"):
        connect(core, who.encode(), who=who)
    core.handle(b"ops", f("SUB", "", "mc0.sys.peer"), 0.0, "ops")
    core.handle(b"sysops", f("SUB", "", "mc0.sys.>"), 0.0, "sysops")
    core.handle(b"anyone", f("SUB", "", ">"), 0.0, "anyone")
    assert subscribers_of_connects(core) == [b"ops", b"sysops"]
    for who, code in (("ops", None), ("anyone", "403")):
        ((_, frames),) = core.handle(
            who.encode(), f("REQUEST", "SERVICE", "mc0.broker", "ID", "p", "", "peers"), 0.0, who
        )
        answer = P.decode(frames, sender=P.Side.BROKER)
        if code is None:
            assert answer.verb is P.Verb.FINAL and {p["identity"] for p in json.loads(answer.payload[0])} >= {"ops"}
        else:
            assert (answer.verb, answer.headers["CODE"]) == (P.Verb.ERROR, code)
            assert "mc0.sys.peer" in answer.headers["MESSAGE"]


def test_a_new_policy_withdraws_peer_telemetry_from_who_lost_the_grant() -> None:
    core = BrokerCore(permissions=Permissions.from_table(POLICY))
    connect(core, b"ops", who="ops")
    core.handle(b"ops", f("SUB", "", "mc0.sys.peer"), 0.0, "ops")
    out = core.set_permissions(Permissions.from_table({"default": {"subscribe": [">"]}}), 0.0)
    withdrawn = f("ERROR", "CODE", "403", "MESSAGE", "subscription mc0.sys.peer withdrawn by policy")
    assert [(rid, frames[:5]) for rid, frames in out] == [(b"ops", withdrawn)]
    assert subscribers_of_connects(core) == []


# ---------------------------------------------------------------- live: CURVE keys, a real broker, the CLI

LIVE_POLICY = (
    '[permissions.default]\nsubscribe = [">"]\n[permissions.identity.bob]\nsubscribe = [">", "mc0.sys.peer"]\n'
)


@pytest.mark.timeout(60)
def test_live_only_the_granted_identity_sees_connects_and_the_peers_table(tmp_path: Path) -> None:
    setup = CurveSetup(tmp_path, extra=LIVE_POLICY)
    with setup.start() as broker:
        with mc0.Client(broker.endpoint, **setup.client_options("alice")) as alice:
            with pytest.raises(mc0.Forbidden, match="mc0.sys.peer"):
                alice.subscribe("mc0.sys.>")
            with pytest.raises(mc0.Forbidden, match="mc0.sys.peer"):
                alice.request("mc0.broker", "peers", timeout=5)
            with mc0.Client(broker.endpoint, **setup.client_options("bob")) as bob:
                events = bob.subscribe("mc0.sys.peer")
                with mc0.Client(broker.endpoint, **setup.client_options("carol")):
                    event = json.loads(events.next(timeout=5).body)
                assert (event["event"], event["identity"]) == ("connect", "carol")
                assert "alice" in {p["identity"] for p in json.loads(bob.request("mc0.broker", "peers").body)}
        env = {"MC0_KEY": str(setup.secret("alice")), "MC0_BROKER_KEY": str(setup.broker_key)}
        command = [sys.executable, "-m", "mc0", "stats", "--endpoint", broker.endpoint]
        result = subprocess.run(command, capture_output=True, text=True, timeout=30, env={**os.environ, **env})
        assert result.returncode == 0, result.stderr
        assert "peers: not shown (this identity has no subscribe grant naming mc0.sys.peer)" in result.stdout
