"""The compiled hot path and its pure-Python fallback (mc0.native): the same behaviour both ways.

``./run test`` builds the extensions and sets ``MC0_EXPECT_COMPILED``: the
whole suite then runs compiled, and this module checks that it really is,
and runs one scripted broker session (RPC, pub/sub, queue groups, refusals,
deadlines) in a fresh process per mode, which must send byte for byte the
same, one scripted client session likewise (what it sends, delivers and
reports), plus the core's and the client session's tests again with
``MC0_PURE_PYTHON=1``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mc0 import native

ROOT = Path(__file__).resolve().parent.parent
MODES = {"compiled": {}, "pure": {native.PURE_ENV: "1"}}


def _python(code: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )


def test_the_suite_runs_the_compiled_hot_path_when_built() -> None:
    loaded = native.compiled()
    assert set(loaded) == set(native.HOT_MODULES + native.CYTHON_MODULES)
    if os.environ.get("MC0_EXPECT_COMPILED"):  # ./run test built it: nothing may fall back silently
        assert not native.stale() and all(loaded.values()), loaded
    elif native.pure_requested():
        assert not any(loaded.values())


@pytest.mark.parametrize(
    ("extension_age", "library", "checkout", "expected"),
    [
        (+10, "json", True, []),  # built after its source, shared library found: runs compiled
        (-10, "json", True, ["mc0.trie"]),  # the source changed after the build
        (+10, "mc0_no_such_library", True, ["mc0.trie"]),  # a plain install since dropped the shared library
        # An installed wheel: the installer wrote the source after the extension (both have the
        # install's time), which says nothing about an edit.
        (-10, "json", False, []),
        (+10, "mc0_no_such_library", False, ["mc0.trie"]),
    ],
)
def test_an_extension_that_cannot_run_as_built_is_stale(
    tmp_path: Path, extension_age: int, library: str, checkout: bool, expected: list[str]
) -> None:
    source = tmp_path / "trie.py"
    source.write_text("")
    extension = tmp_path / ("trie" + importlib.machinery.EXTENSION_SUFFIXES[0])
    extension.write_bytes(b"")
    os.utime(extension, (source.stat().st_mtime + extension_age,) * 2)
    (tmp_path / "notes.txt").write_text("")  # neither source nor extension: ignored
    assert native.stale(str(tmp_path), library, checkout=checkout) == expected


def test_a_cython_extension_that_cannot_load_runs_its_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Built against another pyzmq's libzmq, say: the broker still starts, on the .py, and says so once."""
    extension = tmp_path / ("mc0_fake" + importlib.machinery.EXTENSION_SUFFIXES[0])
    extension.write_bytes(b"not an ELF file")
    (tmp_path / "mc0_fake.py").write_text("ANSWER = 42\n")
    loader = native.ExtensionOrSource("mc0_fake", str(extension))
    spec = importlib.util.spec_from_file_location("mc0_fake", extension, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    assert module.ANSWER == 42 and module.__file__ == str(tmp_path / "mc0_fake.py")
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and said[0].startswith("mc0: the compiled mc0_fake cannot load ("), said


def test_this_mc0_is_a_checkouts() -> None:
    """The suite runs a checkout (an editable install linking to it): its edits are looked for."""
    assert native.in_checkout()


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_loads_what_it_says(mode: str) -> None:
    got = _python("from mc0 import native; print(sorted(k for k, v in native.compiled().items() if v))", MODES[mode])
    assert got.returncode == 0, got.stderr
    compiled = eval(got.stdout)  # (a list of module names printed by the line above)
    if mode == "pure":
        assert compiled == []
    elif os.environ.get("MC0_EXPECT_COMPILED"):
        assert compiled == sorted(native.HOT_MODULES + native.CYTHON_MODULES)


@pytest.mark.parametrize("mode", MODES)
def test_mc0_version_names_the_build_that_runs(mode: str) -> None:
    got = subprocess.run(
        [sys.executable, "-m", "mc0", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), **MODES[mode]},
    )
    assert got.returncode == 0 and got.stdout.startswith("mc0 0.1.0 ("), got.stdout + got.stderr
    build = got.stdout.strip().removeprefix("mc0 0.1.0 ")
    if mode == "pure":
        assert build == "(pure Python: MC0_PURE_PYTHON=1)"
    elif os.environ.get("MC0_EXPECT_COMPILED"):
        n = len(native.HOT_MODULES)
        assert build == f"(compiled: {n} of {n} hot modules, mypyc; socket loop native)"


SCENARIO = """
import hashlib
from mc0.broker.core.dispatch import BrokerCore
from mc0.broker.sender import Sender
from mc0.broker.outbox import Outbox
from mc0.protocol import batch

core = BrokerCore()
outbox = Outbox(max_bytes=1 << 20, max_messages=10_000, batch_bytes=4096)
sender = Sender(core, outbox)
log = []

def send(rid, frames, now):
    sender.apply(core.handle(rid, frames, now, fd=len(rid)), now)
    for peer in (b"client", b"worker", b"sub1", b"sub2", b"member1", b"member2", b"pub", b"old"):
        while (message := outbox.next_message(peer)) is not None:
            log.append((peer, [bytes(f) for f in message]))
            outbox.sent(peer, now)

for i, rid in enumerate((b"client", b"worker", b"sub1", b"sub2", b"member1", b"member2", b"pub")):
    send(rid, [b"CONNECT", b"VERSION", b"1.0", b"TTL", b"5000", b"BATCH", b"1", b"ID", b"c%d" % i], 1.0)
send(b"old", [b"CONNECT", b"VERSION", b"0.3", b"TTL", b"5000", b"ID", b"o"], 1.0)
send(b"worker", [b"READY", b"CAPACITY", b"3", b"ID", b"r", b"", b"svc"], 1.0)
send(b"sub1", [b"SUB", b"ID", b"s", b"", b"t.>"], 1.0)
send(b"sub2", [b"SUB", b"ID", b"s", b"", b"t.a"], 1.0)
send(b"old", [b"SUB", b"ID", b"s", b"", b"t.a"], 1.0)
for rid in (b"member1", b"member2"):
    send(rid, [b"SUB", b"GROUP", b"g", b"ID", b"s", b"", b"t.*"], 1.0)
puts = b"".join(batch.put_record(b"t.a" if i % 3 else b"t.b", b"m%d" % i) for i in range(20))
puts += batch.put_record(b"bad topic", b"x") + batch.put_record(b"mc0.sys.x", b"y") + b"\\x05\\x00\\x00\\x00\\x09"
send(b"pub", batch.batch_frames(puts), 1.1)
calls = b"".join(batch.call_record(b"svc", b"%d" % i, 1000 + i, b"q%d" % i) for i in range(6))
calls += batch.call_record(b"none", b"x", 100, b"") + batch.call_record(b"svc", b"0", 100, b"dup")
send(b"client", batch.batch_frames(calls), 1.2)
works = [r for p, m in log if p == b"worker" and m[0] == b"BATCH" for r in [m[2]]]
bids = [batch.work_fields(b, s, e)[1] for b in works for c, s, e in batch.records(b) if c == batch.WORK]
finals = b"".join(batch.reply_record(i % 2 == 0, bid.encode(), b"a" + bid.encode()) for i, bid in enumerate(bids))
finals += batch.reply_record(True, b"999", b"forged")
send(b"worker", batch.batch_frames(finals), 1.3)
send(b"worker", [b"FINAL", b"ID", bids[1].encode(), b"", b"late"], 1.3)
send(b"client", [b"CANCEL", b"ID", b"5"], 1.35)
sender.apply(core.tick(3.0), 3.0)  # deadlines of what is still out
send(b"client", [b"PING", b"ID", b"p"], 3.0)
text = repr(log).encode() + repr(sorted(core.counters.items())).encode()
print(len(log), hashlib.sha256(text).hexdigest())
"""


def test_the_compiled_and_the_pure_broker_core_send_the_same_bytes() -> None:
    runs = {mode: _python(SCENARIO, env) for mode, env in MODES.items()}
    for mode, run in runs.items():
        assert run.returncode == 0, f"{mode}: {run.stderr[-2000:]}"
    assert runs["compiled"].stdout == runs["pure"].stdout
    assert int(runs["pure"].stdout.split()[0]) > 20  # (the scenario sent plenty)


CLIENT_SCENARIO = """
import hashlib
from mc0 import protocol as P
from mc0.errors import Error
from mc0.protocol import batch
from mc0.session import ClientSession

session = ClientSession(ttl_ms=1000)
log = []

def fed(events_and_frames):
    events, frames = events_and_frames
    log.append(("events", [repr(e) for e in events], [[bytes(x) for x in f] for f in frames]))

def deliver(run, keys):
    log.append(("run", [repr(message) for message in run], keys))

def final(request_id, data):
    log.append(("final", request_id, data))
    return request_id != "7"

def tried(build):
    try:
        log.append(("sent", build()))
    except (Error, ValueError) as exc:
        log.append(("refused", type(exc).__name__, str(exc)))

connect = session.connect(0.0)
log.append(("sent", connect))
fed(session.receive([b"OK", b"ID", connect[-1], b"TTL", b"800", b"BATCH", b"1"], 0.1))
for pattern, group in (("a.>", None), ("a.*", None), ("a.b", None), ("a.>", "g"), ("b.*", "g"), ("c.>", None)):
    tried(lambda: session.add_pattern(pattern, session.new_id(), group))
tried(lambda: session.add_pattern("a..b"))
tried(lambda: session.add_pattern("x", group="bad group"))
tried(lambda: session.publish("a.b", [b"1", b"2"], {"X-Trace": "t"}, msgid="m1"))
tried(lambda: session.publish("a.*", b"x"))
tried(lambda: session.publish("a.b", b"x", {"Bad": "h"}))
tried(lambda: session.publish_record("a.b", b"hello"))
tried(lambda: session.call_record("svc", b"q", session.new_id(), 500))
tried(lambda: session.call_record("svc", b"q", "7", 0))
tried(lambda: session.request("svc", [b"q1", b"q2"], "8", 1000, {"X-A": "b"}, scatter=True))
tried(lambda: session.serve(["svc", "svc.b"], 4, session.new_id()))
blob = b"".join(
    [
        batch.message_record(b"a.b", b"alice", b"1"),
        batch.message_record(b"a.c.d", b"bob", b"2"),
        batch.message_record(b"zz", b"alice", b"3"),
        batch.group_message_record(b"a.b", b"carol", b"g", b"4"),
        batch.group_message_record(b"b.x", b"carol", b"g", b"5"),
        batch.group_message_record(b"b.x", b"carol", b"h", b"6"),
        batch.record_of(P.message(b"a.b", b"dave", [b"X-Trace", b"t"], [b"7", b"8"])),
        batch.work_record(b"svc", b"41", b"erin", 900, b"w"),
        batch.reply_record(True, b"7", b"f7"),
        batch.reply_record(True, b"9", b"f9"),
        batch.reply_record(False, b"8", b"p8"),
        batch.record_of([b"CANCEL", b"ID", b"41"]),
        batch.ok_record(b"3"),
    ]
)
fed(session.receive_batch(blob, 0.2, deliver, final))
fed(session.receive_batch(blob[:-3], 0.25, deliver, final))  # cut inside the last record
fed(session.receive_batch(blob + b"\\x05\\x00\\x00\\x00\\x09", 0.3, deliver))
fed(session.receive([b"MESSAGE", b"TOPIC", b"c.d", b"SENDER", b"s", b"JOURNAL", b"j", b"SEQ", b"12", b"", b"x"], 0.4))
fed(session.receive([b"REQUEST", b"SERVICE", b"svc", b"ID", b"42", b"CALLER", b"c", b"TIMEOUT", b"50", b"", b"r"], 0.4))
fed(session.receive([b"FINAL", b"ID", b"8", b"X-A", b"1", b"", b"done"], 0.5))
fed(session.receive([b"ERROR", b"TOPIC", b"c.>", b"CODE", b"403", b"MESSAGE", b"no"], 0.5))
fed(session.receive([b"NOSUCH"], 0.5))
fed(session.tick(0.6))
fed(session.tick(1.0))
fed(session.receive([b"ERROR", b"CODE", b"401", b"MESSAGE", b"who"], 1.1))
for pattern, group in (("a.*", None), ("a.*", None), ("b.*", "g")):
    tried(lambda: session.drop_pattern(pattern, group))
fed(session.receive([b"DISCONNECT"], 1.2))
fed(session.tick(9.0))
log.append(("state", session.malformed, session.patterns, session.connected, session.next_deadline()))
print(len(log), hashlib.sha256(repr(log).encode()).hexdigest())
"""


def test_the_compiled_and_the_pure_client_session_send_and_deliver_the_same() -> None:
    runs = {mode: _python(CLIENT_SCENARIO, env) for mode, env in MODES.items()}
    for mode, run in runs.items():
        assert run.returncode == 0, f"{mode}: {run.stderr[-2000:]}"
    assert runs["compiled"].stdout == runs["pure"].stdout
    assert int(runs["pure"].stdout.split()[0]) > 40  # (the scenario did plenty)


BROKER_SESSION = """
import dataclasses, hashlib, sys, tempfile
from pathlib import Path
import zmq
from mc0 import keys, native
from mc0.broker import server
from mc0.broker.embedded import BrokerThread
from mc0.config import Config
from mc0.protocol import batch
from mc0.security import configure_client

server.first_serial = lambda now: 1000  # (peer names from a fixed serial: the same bytes every run)
folder = Path(tempfile.mkdtemp())
for name in ("broker", "alice", "bob", "carol"):
    keys.create(folder, name)
(folder / "allowed").mkdir()
for name in ("alice", "bob", "carol"):
    (folder / "allowed" / f"{name}.key").write_bytes((folder / f"{name}.key").read_bytes())
config = Config()
config = dataclasses.replace(
    config,
    broker=dataclasses.replace(config.broker, bind=("tcp://127.0.0.1:*",)),
    security=dataclasses.replace(config.security, keys_dir=str(folder), allowed_dir=str(folder / "allowed")),
)
context = zmq.Context()
log = []
with BrokerThread(config) as broker:
    endpoint = broker.broker.endpoints[0]
    broker_public = keys.load_public(folder / "broker.key").public
    peers = {}
    for name, who in (("pub", "alice"), ("sub", "bob"), ("old", "bob"), ("worker", "carol"), ("client", "alice")):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, name.encode())
        configure_client(sock, keys.load_secret(folder / f"{who}.key_secret"), broker_public)
        sock.connect(endpoint)
        peers[name] = sock
    serial = [0]

    def settled(actor):
        # The actor's PING answer comes once its message was handled and the turn's output sent; each
        # other peer's PING answer then comes after whatever that sent it.
        for name in [actor] + [n for n in peers if n != actor]:
            serial[0] += 1
            ping = b"p%d" % serial[0]
            peers[name].send_multipart([b"PING", b"ID", ping])
            while True:
                if not peers[name].poll(10_000):
                    sys.exit(f"{name}: no answer to its PING")
                frames = peers[name].recv_multipart()
                if frames[0] == b"BATCH":  # record by record: how a turn's records were grouped is timing's
                    log.extend((name, frames[2][s - 5 : e]) for c, s, e in batch.records(frames[2]))
                else:
                    log.append((name, frames))
                if ping in frames or (frames[0] == b"BATCH" and ping in frames[2]):
                    break

    def step(actor, frames):
        peers[actor].send_multipart(frames)
        settled(actor)

    for name in peers:
        batched = [b"BATCH", b"1"] if name != "old" else []
        version = b"1.0" if name != "old" else b"0.3"
        step(name, [b"CONNECT", b"VERSION", version, b"TTL", b"60000", *batched, b"ID", b"c"])
    step("sub", [b"SUB", b"ID", b"s1", b"", b"t.>"])
    step("old", [b"SUB", b"ID", b"s2", b"", b"t.a"])
    step("worker", [b"READY", b"CAPACITY", b"4", b"ID", b"r", b"", b"svc"])
    puts = b"".join(batch.put_record(b"t.a" if i % 2 else b"t.b", b"m%d" % i) for i in range(12))
    puts += batch.put_record(b"bad topic", b"x")
    step("pub", batch.batch_frames(puts))
    step("pub", [b"PUT", b"ID", b"big", b"TOPIC", b"t.a", b"", b"x" * 70_000, b"y" * 5000, b"z"])
    step("pub", [b"PUT", b"TOPIC", b"t.a"])  # (malformed: no body)
    calls = b"".join(batch.call_record(b"svc", b"%d" % i, 30_000, b"q%d" % i) for i in range(3))
    step("client", batch.batch_frames(calls))
    works = [r for name, r in log if name == "worker" and isinstance(r, bytes)]
    bids = [batch.work_fields(r, s, e)[1] for r in works for c, s, e in batch.records(r) if c == batch.WORK]
    step("worker", batch.batch_frames(b"".join(batch.reply_record(True, b.encode(), b"a" + b.encode()) for b in bids)))
    step("client", [b"REQUEST", b"SERVICE", b"mc0.broker", b"ID", b"who", b"", b"whoami"])
    step("sub", [b"NOSUCH", b"ID", b"n"])
    step("sub", [b"UNSUB", b"ID", b"u", b"", b"t.>"])
    step("pub", batch.batch_frames(batch.put_record(b"t.a", b"after")))
    for sock in peers.values():
        sock.close()
context.term()
loaded = native.compiled()["mc0.broker.routerio"]
print(len(log), hashlib.sha256(repr(log).encode()).hexdigest(), "native" if loaded else "pure")
"""


def test_the_native_and_the_pure_broker_loop_send_the_same_bytes_over_the_sockets() -> None:
    """One scripted broker session over real sockets (CURVE: User-Id and SRCFD read from each message),
    the broker's loop with the native socket work and with the pure-Python fallback: every peer gets
    byte for byte the same messages, a BATCH's records one by one (which records one BATCH groups
    depends on what a turn happened to read together: timing, not the loop), through batched and
    unbatched peers, a fan-out of a large multi-frame message, RPC, refusals and a built-in service."""
    runs = {mode: _python(BROKER_SESSION, env) for mode, env in MODES.items()}
    for mode, run in runs.items():
        assert run.returncode == 0, f"{mode}: {run.stderr[-2000:]}"
    count, digest, loop = runs["compiled"].stdout.split()
    assert (count, digest) == tuple(runs["pure"].stdout.split()[:2])
    assert runs["pure"].stdout.split()[2] == "pure"
    if os.environ.get("MC0_EXPECT_COMPILED"):
        assert loop == "native"
    assert int(count) > 40  # (the scenario did plenty)


@pytest.mark.timeout(300)
def test_the_core_tests_pass_on_the_pure_fallback(tmp_path: Path) -> None:
    """The fallback is tested in CI: the core's and the client session's own tests again, every hot
    module from source."""
    files = [
        "test_core_rpc.py",
        "test_jobs.py",
        "test_batch.py",
        "test_trie.py",
        "test_deadlines.py",
        "test_core.py",
        "test_groups.py",
        "test_session.py",
        "test_topics.py",
        "test_protocol.py",
    ]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *[str(ROOT / "tests" / f) for f in files]],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,
        env={**os.environ, native.PURE_ENV: "1", "MC0_EXPECT_COMPILED": ""},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
