"""The operator's actions on a real broker process with CURVE and real keys, both ways: the
``mc0.admin`` service over the bus (refused without the grant by name, ``call = [">"]`` included;
done with it) and ``POST /admin/OP`` on the monitoring listener (403 with no token file or from a
foreign Origin, 401 with a missing or wrong token; done with the right one); and the CLI that uses
them (``mc0 conn``, ``mc0 consumer``, ``mc0 journal get|purge``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import mc0
from mc0.ports import free_port
from mc0.process import BrokerProcess

from .clusterbus import until
from .conftest import CurveSetup

pytestmark = pytest.mark.timeout(120)

TOKEN = "s3cret-token-for-the-admin-actions"
POLICY = """
[journals.main]
topics = ["jobs.>"]

[permissions.identity.root]
call = ["mc0.admin", ">"]
subscribe = ["mc0.sys.peer", ">"]

[permissions.identity.alice]
call = [">"]
"""


def post(base: str, op: str, body: object, *, token: str | None = TOKEN, origin: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if origin is not None:
        headers["Origin"] = origin
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}/admin/{op}", data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=40) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(base: str, page: str) -> Any:
    with urllib.request.urlopen(f"{base}{page}", timeout=10) as answer:
        return json.loads(answer.read())


class Operator:
    """A CURVE broker with a file journal, monitoring on a port, the admin token in a 0600 file."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        token_file = root / "admin.token"
        token_file.write_text(TOKEN + "\n")
        token_file.chmod(0o600)
        http = f'\n[http]\nlisten = "127.0.0.1:{self.port}"\nadmin_token_file = "{token_file}"\n'
        self.setup = CurveSetup(root, identities=("root", "alice", "bob"), extra=POLICY + http)
        self.broker = self.setup.start()

    def client(self, identity: str, **options: Any) -> mc0.Client:
        return mc0.Client(self.broker.endpoint, **self.setup.client_options(identity), **options).connect()

    def env(self, identity: str) -> dict[str, str]:
        return {
            "MC0_ENDPOINT": self.broker.endpoint,
            "MC0_KEY": str(self.setup.secret(identity)),
            "MC0_BROKER_KEY": str(self.setup.broker_key),
        }

    def sessions(self) -> dict[str, str]:
        """name -> identity of every session (the peers report: root may see it as an operator)."""
        with self.client("root") as root:
            rows = json.loads(root.request("mc0.broker", b"peers").body)
        return {r["name"]: r["identity"] for r in rows}

    def close(self) -> None:
        self.broker.__exit__(None, None, None)


@pytest.fixture
def operator(tmp_path: Path) -> Any:
    bus = Operator(tmp_path)
    try:
        yield bus
    finally:
        bus.close()


def mc0_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mc0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def one_line_error(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode != 0, result.stdout
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("mc0: error: "), result.stderr
    assert needle in result.stderr and "Traceback" not in result.stderr


def admin(client: mc0.Client, op: str, **args: str) -> Any:
    return json.loads(client.request("mc0.admin", json.dumps({"op": op, **args}).encode(), timeout=10).body)


# ---------------------------------------------------------------- over the bus
def test_over_the_bus_refused_without_the_grant_and_done_with_it(operator: Operator) -> None:
    with (
        operator.client("bob") as first,
        operator.client("bob") as second,
        operator.client("alice") as alice,
        operator.client("root") as root,
    ):
        telemetry = root.subscribe("mc0.sys.peer")
        root.ping()
        names = {name for name, who in operator.sessions().items() if who == "bob"}
        assert len(names) == 2
        # call = [">"] (alice): 403, nothing done.
        for name in names:
            with pytest.raises(mc0.Forbidden, match="alice may not call mc0.admin"):
                admin(alice, "conn.close", id=name)
        assert {n for n, who in operator.sessions().items() if who == "bob"} == names
        # The operator: ends exactly that session; the other of the same identity stays.
        victim = next(n for n in names if n.endswith(f"#{min(int(x.split('#')[1]) for x in names)}"))
        assert admin(root, "conn.close", id=victim) == {"closed": victim, "broker": ""}
        until(lambda: any(isinstance(f, mc0.NotConnected) for f in first.faults), what="the closed session told why")
        (told,) = [f for f in first.faults if isinstance(f, mc0.NotConnected)]
        assert told.reason == f"session {victim} closed by root"
        until(lambda: first.reconnects >= 1, what="the closed client back as a new session")
        after = {n for n, who in operator.sessions().items() if who == "bob"}
        assert victim not in after and (names - {victim}) <= after and len(after) == 2
        assert second.faults == [] and second.reconnects == 0
        first.ping()  # the client carries on, on its new session
        # /connz?state=closed keeps the reason, and peer telemetry says how it went.
        closed = get(operator.base, "/connz?state=closed")["connections"]
        assert [c["reason"] for c in closed if c["name"] == victim] == ["closed by root"]
        events = [json.loads(m.body) for m in telemetry.next_batch(100, timeout=5)]
        for _ in range(20):
            if any(e.get("peer") == victim and e.get("event") == "disconnect" for e in events):
                break
            events += [json.loads(m.body) for m in telemetry.next_batch(100, timeout=1)]
        (gone,) = [e for e in events if e.get("peer") == victim and e.get("event") == "disconnect"]
        assert gone["reason"] == "closed_by_admin"
        varz = get(operator.base, "/varz")
        assert varz["counters"]["forgotten_closed_by_admin"] == 1 and varz["actions"] is True
        with pytest.raises(mc0.NotFound, match=f"no session '{victim}'"):
            admin(root, "conn.close", id=victim)
        with pytest.raises(mc0.BadRequest, match="not a session's name"):
            admin(root, "conn.close", id="bob")


def test_consumer_rm_and_journal_purge_over_the_bus(operator: Operator) -> None:
    with operator.client("bob") as bob, operator.client("root") as root, operator.client("alice") as alice:
        for i in range(5):
            bob.publish("jobs.x", str(i).encode(), confirm=True)
        consumer = bob.consume("main", "invoicing", topics=["jobs.>"])
        assert len(consumer.fetch(2, wait=2)) == 2
        rows = admin(root, "consumer.ls")["consumers"]
        assert [(r["journal"], r["name"], r["owner"], r["num_ack_pending"]) for r in rows] == [
            ("main", "invoicing", "bob", 2)
        ]
        with pytest.raises(mc0.Forbidden):
            admin(alice, "consumer.rm", journal="main", name="invoicing")
        done = admin(root, "consumer.rm", journal="main", name="invoicing")
        assert done["removed"] is True and done["brokers"] == {"": {"status": 200, "removed": True}}
        with pytest.raises(mc0.NotFound):
            consumer.info()
        with pytest.raises(mc0.Forbidden):
            admin(alice, "journal.purge", journal="main")
        assert bob.fetch("main", from_seq=1).records[0].seq == 1
        assert admin(root, "journal.purge", journal="main")["purged"] == 5
        with pytest.raises(mc0.Gone):
            bob.fetch("main", from_seq=1)
        ack = bob.publish("jobs.x", b"after", confirm=True)
        assert ack is not None and ack.seq == 6
        assert [r.body for r in bob.fetch("main", from_seq=6).records] == [b"after"]


def test_a_purge_settles_its_consumers_unacked_records_at_once(operator: Operator) -> None:
    """After a purge, /consumerz (and /metrics, and consumer.ls) counted the purged un-acked records
    until the consumer's next pull: the purge settles them when it is done."""
    with operator.client("bob") as bob, operator.client("root") as root:
        for i in range(8):
            bob.publish("jobs.x", str(i).encode(), confirm=True)
        consumer = bob.consume("main", "invoicing", topics=["jobs.>"], ack_wait=600)
        assert len(consumer.fetch(5, wait=2)) == 5  # handed, never acked
        (row,) = get(operator.base, "/consumerz")["consumers"]
        assert (row["num_ack_pending"], row["num_pending"]) == (5, 3)
        assert admin(root, "journal.purge", journal="main")["purged"] == 8
        (row,) = get(operator.base, "/consumerz")["consumers"]  # no pull in between
        assert (row["num_ack_pending"], row["num_pending"]) == (0, 0)
        metrics = urllib.request.urlopen(f"{operator.base}/metrics", timeout=10).read().decode()
        assert 'mc0_consumer_ack_pending{consumer="invoicing",journal="main"} 0.0' in metrics
        rows = admin(root, "consumer.ls")["consumers"]
        assert [(r["name"], r["num_ack_pending"]) for r in rows] == [("invoicing", 0)]
        bob.publish("jobs.x", b"after", confirm=True)
        (after,) = consumer.fetch(5, wait=2)  # the consumer goes on from the new first seq
        assert (after.seq, after.body) == (9, b"after")


# ---------------------------------------------------------------- over HTTP
def test_over_http_refused_without_a_token_file_a_token_or_from_elsewhere_and_done_with_the_right_token(
    operator: Operator, tmp_path: Path
) -> None:
    base = operator.base
    with operator.client("bob") as first, operator.client("bob") as second:
        first.ping()
        second.ping()
        victim = min((n for n, who in operator.sessions().items() if who == "bob"), key=lambda n: int(n.split("#")[1]))
        body = {"id": victim}
        missing = post(base, "conn.close", body, token=None)
        assert missing == (401, {"error": "missing or wrong token (Authorization: Bearer TOKEN)"})
        assert post(base, "conn.close", body, token="wrong" + TOKEN)[0] == 401
        assert post(base, "conn.close", body, token=TOKEN[:-1])[0] == 401
        refused = post(base, "conn.close", body, origin="http://evil.example:8080")
        assert refused == (403, {"error": "cross-origin request refused: Origin is not this listener's"})
        assert post(base, "conn.close", body, origin=f"http://127.0.0.1:{operator.port + 1}")[0] == 403
        assert len([n for n, who in operator.sessions().items() if who == "bob"]) == 2  # nothing done
        assert post(base, "conn.kill", body)[0] == 404
        assert post(base, "conn.close", b"[1, 2]")[0] == 400
        assert post(base, "conn.close", {"id": "bob"}) == (
            400,
            {"error": "conn.close: id 'bob' is not a session's name (identity#n, or identity#n@BROKER)"},
        )
        status, data = post(base, "conn.close", body, origin=f"http://localhost:{operator.port}")
        assert (status, data) == (200, {"closed": victim, "broker": ""})
        until(lambda: any(isinstance(f, mc0.NotConnected) for f in first.faults), what="the closed session told why")
        (told,) = [f for f in first.faults if isinstance(f, mc0.NotConnected)]
        assert told.reason.startswith(f"session {victim} closed by http token from 127.0.0.1:")
        assert second.faults == []
        assert post(base, "conn.close", body) == (404, {"error": f"no session {victim!r}"})
        for i in range(3):
            second.publish("jobs.y", str(i).encode(), confirm=True)
        second.consume("main", "audit", topics=["jobs.>"])
        assert post(base, "consumer.rm", {"journal": "main", "name": "audit"})[0] == 200
        assert post(base, "consumer.rm", {"journal": "main", "name": "audit"})[0] == 404
        assert post(base, "journal.purge", {"journal": "main"}) == (
            200,
            {"journal": "main", "purged": 3, "brokers": {"": {"status": 200, "purged": 3, "first_seq": 4}}},
        )
        assert post(base, "journal.purge", {"journal": "main", "extra": 1})[0] == 400
    # With no token file, every POST is 403, and /varz tells the console there are no actions.
    port = free_port()
    with BrokerProcess("--http", f"127.0.0.1:{port}", insecure=True):
        other = f"http://127.0.0.1:{port}"
        assert post(other, "conn.close", {"id": "anonymous#1"}) == (
            403,
            {"error": "admin actions are off: [http] admin_token_file names no token"},
        )
        assert post(other, "anything", {}, token=None)[0] == 403
        assert get(other, "/varz")["actions"] is False


@pytest.mark.parametrize(
    ("mode", "text", "needle"),
    [
        (0o640, TOKEN, "is readable or writable by group/others (mode 640): chmod 600 it"),
        (0o604, TOKEN, "(mode 604)"),
        (0o600, "", "must hold one token of at least 16 visible ASCII characters"),
        (0o600, "short", "must hold one token"),
        (0o600, "two words but long enough", "must hold one token"),
        (None, TOKEN, "cannot read"),
    ],
)
def test_a_token_file_others_may_read_or_without_one_good_token_is_refused_at_start(
    tmp_path: Path, mode: int | None, text: str, needle: str
) -> None:
    token_file = tmp_path / "admin.token"
    if mode is not None:
        token_file.write_text(text)
        token_file.chmod(mode)
    config = tmp_path / "mc0.toml"
    config.write_text(f'[http]\nlisten = "127.0.0.1:{free_port()}"\nadmin_token_file = "{token_file}"\n')
    with pytest.raises(mc0.Error) as caught:
        BrokerProcess(config=str(config), insecure=True).start()  # (it ends at once: the bound is a hang guard)
    assert "http.admin_token_file" in str(caught.value) and needle in str(caught.value)
    if text:
        assert text not in str(caught.value)  # the token is never shown
    checked = mc0_cli("broker", "--check-config", "--config", str(config), env={})
    assert checked.returncode != 0 and "http.admin_token_file" in checked.stderr and needle in checked.stderr
    assert TOKEN not in checked.stderr + checked.stdout


# ---------------------------------------------------------------- the CLI
def test_the_cli_lists_closes_removes_gets_and_purges_with_one_line_errors(operator: Operator) -> None:
    root, alice = operator.env("root"), operator.env("alice")
    with operator.client("bob") as bob:
        bob.publish("jobs.x", b"hello world", headers={"X-Order": "42"}, confirm=True, msgid="order-42")
        bob.publish("jobs.x", b"\x00\x01\xff", confirm=True)
        bob.consume("main", "invoicing", topics=["jobs.>"])
        bob_name = next(n for n, who in operator.sessions().items() if who == "bob")
        listed = mc0_cli("conn", "ls", "--json", env=root)
        assert listed.returncode == 0, listed.stderr
        assert bob_name in {r["name"] for r in json.loads(listed.stdout)}
        table = mc0_cli("conn", "ls", env=root)
        assert table.stdout.splitlines()[0].split()[:3] == ["NAME", "IDENTITY", "KIND"] and bob_name in table.stdout
        one_line_error(mc0_cli("conn", "ls", env=alice), "403 the peers report needs a subscribe grant")
        one_line_error(mc0_cli("conn", "close", bob_name, env=alice), "403 alice may not call mc0.admin")
        one_line_error(mc0_cli("conn", "close", "nobody#999", env=root), "404 no session 'nobody#999'")
        one_line_error(mc0_cli("conn", "close", "nobody", env=root), "400 conn.close: id 'nobody' is not")
        consumers = mc0_cli("consumer", "ls", "main", env=root)
        assert consumers.returncode == 0, consumers.stderr
        header, row = consumers.stdout.splitlines()
        assert header.split()[:3] == ["JOURNAL", "NAME", "OWNER"] and row.split()[:3] == ["main", "invoicing", "bob"]
        assert json.loads(mc0_cli("consumer", "ls", "--json", env=root).stdout)[0]["name"] == "invoicing"
        got = mc0_cli("journal", "get", "main", "1", env=alice)
        assert got.returncode == 0, got.stderr
        lines = got.stdout.splitlines()
        assert lines[0] == "seq: 1" and lines[2:] == [
            "topic: jobs.x",
            "sender: bob",
            "trace: none",  # (no traceparent: tests/test_tracing.py shows one)
            "headers:",
            "  MSGID: order-42",
            "  X-Order: 42",
            "body: 11 bytes",
            "hello world",
        ]
        assert mc0_cli("journal", "get", "main", "2", env=alice).stdout.splitlines()[-2:] == [
            "body: 3 bytes, not text: shown as hex",
            "00 01 ff",
        ]
        one_line_error(mc0_cli("journal", "get", "main", "9", env=alice), "journal main has no record at seq 9")
        one_line_error(mc0_cli("journal", "get", "nope", "1", env=alice), "unknown journal 'nope'")
        one_line_error(mc0_cli("consumer", "rm", "main", "invoicing", env=alice), "403 alice may not call mc0.admin")
        removed = mc0_cli("consumer", "rm", "main", "invoicing", env=root)
        assert removed.stdout == "removed consumer invoicing of journal main\n", removed.stderr
        one_line_error(mc0_cli("consumer", "rm", "main", "invoicing", env=root), "404 here: no consumer 'invoicing'")
        refused = mc0_cli("journal", "purge", "main", env=root)
        one_line_error(refused, "give --yes")
        assert len(bob.fetch("main", from_seq=1).records) == 2  # nothing was purged
        purged = mc0_cli("journal", "purge", "main", "--yes", env=root)
        assert purged.stdout == "purged journal main: 2 records dropped\n", purged.stderr
        one_line_error(mc0_cli("journal", "get", "main", "1", env=alice), "410")
        closed = mc0_cli("conn", "close", bob_name, env=root)
        assert closed.stdout == f"closed {bob_name}\n", closed.stderr
        until(lambda: any(isinstance(f, mc0.NotConnected) for f in bob.faults), what="bob told why")
