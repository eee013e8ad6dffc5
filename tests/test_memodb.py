"""MemoDB (seed 003): the pure dialect driven through the core with the shell's routing done by hand
(every NNG token answered exactly once), each command of the seed, its error paths, cross-dialect
calls both ways, and a malformed table after which everyone is still answered."""

from __future__ import annotations

from typing import Any

import pytest

from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.dialects import memodb as M
from mc0.broker.dialects import recognise
from mc0.permissions import Permissions

from .conftest import require

cbor2 = require("cbor2")  # the memodb extra (never a skip: a missing one fails naming its install)

GRANTED = Permissions.from_table({"identity": {"memodb": {}}})  # an identity table: the default's rights


def msg(kind: int, wid: bytes, *fields: object, payload: bytes = b"") -> bytes:
    return cbor2.dumps(["memo01", kind, wid, *fields], canonical=True) + payload


def split(data: bytes) -> tuple[list[Any], bytes]:
    head = cbor2.loads(data)
    return head, data[len(cbor2.dumps(head, canonical=True)) :]


class Net:
    """The broker core plus MemoDB, routed as nngbridge does: core outs for MemoDB routing ids are
    delivered, forgotten MemoDB peers reported; NNG replies land in ``answers`` (token -> data|None)."""

    def __init__(self, permissions: Permissions = GRANTED, **settings: Any) -> None:
        self.core = BrokerCore(
            CoreSettings(**settings), M.with_memodb_identity(permissions, "memodb"), dialects=recognise
        )
        self.memo = M.MemoDB(identity="memodb", nonce=b"run1", heartbeat_ms=1000, max_workers=8, max_payload=1 << 20)
        self.now = 0.0
        self.tokens = 0
        self.answers: dict[bytes, bytes | None] = {}
        self.sent: list[tuple[bytes, list[bytes]]] = []  # to ROUTER (mc0) peers

    def _replies(self, replies: list[M.Reply]) -> None:
        for token, data in replies:
            assert token not in self.answers, f"token {token!r} answered twice"
            self.answers[token] = data

    def route(self, outs: list[Any]) -> None:
        pending = list(outs)
        for _ in range(64):
            for routing_id in self.core.take_forgotten():
                self._replies(self.memo.forgotten(routing_id))
            more: list[Any] = []
            for routing_id, frames in pending:
                if self.memo.owns(routing_id):
                    out, replies = self.memo.deliver(self.core.dialect_ops, routing_id, frames, self.now)
                    self._replies(replies)
                    more += out
                else:
                    self.sent.append((routing_id, list(frames)))
            if not more and not self.core.forgotten:
                return
            pending = more

    def nng(self, data: bytes) -> bytes:
        """One NNG request; returns its token (its answer, if any yet, in ``answers``)."""
        self.tokens += 1
        token = b"t%d" % self.tokens
        out, replies = self.memo.handle(self.core.dialect_ops, token, data, self.now)
        self._replies(replies)
        self.route(out)
        return token

    def mc0(self, who: bytes, *frames: str | bytes) -> list[tuple[bytes, list[bytes]]]:
        self.sent = []
        self.route(self.core.handle(who, [f.encode() if isinstance(f, str) else f for f in frames], self.now))
        return self.sent

    def tick(self, now: float) -> None:
        self.now = now
        self.route(self.core.tick(now))

    def answer(self, token: bytes) -> tuple[list[Any], bytes]:
        data = self.answers[token]
        assert data is not None, "dropped"
        return split(data)

    def ready(self, *services: str) -> bytes:
        """A worker's READY; returns the token it waits on."""
        return self.nng(msg(M.READY, b"", list(services)))

    def job_for(self, token: bytes, service: str) -> tuple[bytes, int, bytes]:
        """The JOB that answered a worker's waiting request: (worker ID, timeout, payload)."""
        head, payload = self.answer(token)
        assert head[:2] == ["memo01", M.JOB] and head[3] == service
        return head[2], head[4], payload

    def waiting(self) -> int:
        return sum(1 for w in self.memo.workers.values() if w.token is not None) + len(self.memo.clients)


def test_ready_job_result_and_the_next_job_on_the_result_request() -> None:
    net = Net()
    parked = net.ready("upper", "lower")
    assert parked not in net.answers  # waits for work
    client = net.nng(msg(M.JOB, b"", "upper", 5000, payload=b"abc"))
    wid, timeout, payload = net.job_for(parked, "upper")
    assert len(wid) == 12 and wid.startswith(b"run1") and timeout == 5000 and payload == b"abc"
    second = net.nng(msg(M.JOB, b"", "lower", 5000, payload=b"XY"))  # waits: the worker is busy
    assert second not in net.answers
    result = net.nng(msg(M.RESULT, wid, payload=b"ABC"))
    head, payload = net.answer(client)
    assert head == ["memo01", M.RESULT, b""] and payload == b"ABC"
    assert net.job_for(result, "lower")[2] == b"XY"  # the next job answers the RESULT's request
    done = net.nng(msg(M.RESULT, wid, False, payload=b"xy"))
    assert net.answer(second) == (["memo01", M.RESULT, b""], b"xy")
    assert done not in net.answers and net.waiting() == 1  # parked again
    assert not net.memo.clients and not [p for p in net.core.sessions if p.startswith(M.CLIENT_PREFIX)]


def test_heartbeat_after_the_interval_is_answered_by_a_heartbeat_and_liveness_follows() -> None:
    net = Net(liveness=3)
    parked = net.ready("svc")
    net.tick(0.5)
    assert parked not in net.answers
    net.tick(1.01)  # one heartbeat interval after it started waiting
    head, _ = net.answer(parked)
    wid = head[2]
    assert head == ["memo01", M.HEARTBEAT, wid]
    again = net.nng(msg(M.HEARTBEAT, wid))
    assert again not in net.answers  # waiting again
    net.tick(2.02)
    assert net.answer(again)[0] == ["memo01", M.HEARTBEAT, wid]
    net.tick(6.0)  # it never answered: gone after liveness x interval
    assert wid not in net.memo.workers and "memodb-worker" not in {p.dialect.name for p in net.core.sessions.values()}
    late = net.nng(msg(M.HEARTBEAT, wid))
    assert net.answer(late)[0] == ["memo01", M.DISCONNECT, wid]


def test_result_with_disconnecting_gets_disconnect_and_the_worker_is_gone() -> None:
    net = Net()
    parked = net.ready("svc")
    client = net.nng(msg(M.JOB, b"", "svc", 1000, payload=b"q"))
    wid, _, _ = net.job_for(parked, "svc")
    last = net.nng(msg(M.RESULT, wid, True, payload=b"a"))
    assert net.answer(client)[1] == b"a"
    assert net.answer(last)[0] == ["memo01", M.DISCONNECT, wid]
    assert not net.memo.workers and net.core.report("services") == {}


def test_job_timeout_gives_up_on_the_worker_and_its_late_result_is_disconnected() -> None:
    net = Net()
    parked = net.ready("slow")
    client = net.nng(msg(M.JOB, b"", "slow", 200, payload=b"q"))
    wid, timeout, _ = net.job_for(parked, "slow")
    assert timeout == 200
    net.tick(0.1)
    assert client not in net.answers and wid in net.memo.workers
    net.tick(0.21)
    assert net.answers[client] is None  # the seed's broker drops the client; its NNG timeout retries
    assert wid not in net.memo.workers and net.core.counters["memodb_job_timeouts"] == 1
    late = net.nng(msg(M.RESULT, wid, payload=b"too late"))
    assert net.answer(late)[0] == ["memo01", M.DISCONNECT, wid]


def test_a_cancelled_job_keeps_the_worker_its_result_is_dropped_and_it_gets_the_next_job() -> None:
    net = Net()
    parked = net.ready("svc")
    net.mc0(b"mc", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    net.mc0(b"mc", "REQUEST", "ID", "r1", "SERVICE", "svc", "TIMEOUT", "5000", "", "one")
    wid = net.job_for(parked, "svc")[0]
    net.mc0(b"mc", "CANCEL", "ID", "r1")  # before the timeout: the worker is not given up
    net.mc0(b"mc", "REQUEST", "ID", "r2", "SERVICE", "svc", "TIMEOUT", "5000", "", "two")
    assert wid in net.memo.workers and net.core.counters["memodb_job_cancelled"] == 1
    net.sent = []
    result = net.nng(msg(M.RESULT, wid, payload=b"for nobody"))
    assert net.sent == [] and net.core.counters["replies_dropped"] == 1
    assert net.job_for(result, "svc")[2] == b"two"


def test_unknown_worker_ids_get_disconnect_as_after_a_broker_restart() -> None:
    net = Net()
    parked = net.ready("svc")
    net.tick(1.01)
    wid = net.answer(parked)[0][2]
    restarted = Net()  # a new broker run: a new nonce, no workers
    restarted.memo.nonce = b"run2"
    for kind, fields in ((M.HEARTBEAT, ()), (M.RESULT, ()), (M.RESULT, (True,))):
        token = restarted.nng(msg(kind, wid, *fields))
        assert restarted.answer(token)[0] == ["memo01", M.DISCONNECT, wid]
    token = restarted.ready("svc")  # it connects again with READY and gets a new ID
    restarted.tick(1.01)
    assert restarted.answer(token)[0][2] != wid


def test_no_worker_and_forbidden_calls_are_dropped_and_a_forbidden_ready_disconnected() -> None:
    net = Net()
    assert net.answers[net.nng(msg(M.JOB, b"", "nobody", 1000))] is None
    denied = Net(Permissions())  # no [permissions.identity.memodb]: MemoDB peers may do nothing
    assert denied.answer(denied.ready("svc"))[0] == ["memo01", M.DISCONNECT, b""]
    denied.mc0(b"w", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    denied.mc0(b"w", "READY", "CAPACITY", "1", "", "svc")
    assert denied.answers[denied.nng(msg(M.JOB, b"", "svc", 1000))] is None
    assert denied.core.counters["memodb_rejected"] == 2
    for reserved in ("mc0.broker", "mmi.service"):
        assert net.answer(net.ready(reserved))[0][1] == M.DISCONNECT
    refused = Net(foreign_dialects=False)
    assert refused.answers[refused.ready("svc")] is None and refused.core.counters["foreign_refused"] == 1


def test_cross_dialect_memodb_client_to_mc0_worker_and_mc0_client_to_memodb_worker() -> None:
    net = Net()
    net.mc0(b"mw", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    net.mc0(b"mw", "READY", "CAPACITY", "1", "", "m0")
    client = net.nng(msg(M.JOB, b"", "m0", 3000, payload=b"from memodb"))
    ((rid, frames),) = net.sent
    assert rid == b"mw" and frames[0] == b"REQUEST" and frames[-1] == b"from memodb"
    bid = frames[frames.index(b"ID") + 1].decode()
    net.mc0(b"mw", "PARTIAL", "ID", bid, "", "p")  # MemoDB has no partial results: nothing yet
    assert client not in net.answers
    net.mc0(b"mw", "FINAL", "ID", bid, "", "to ", "memodb")
    assert net.answer(client)[1] == b"to memodb"  # an mc0 body's frames, joined
    parked = net.ready("memo-svc")
    net.mc0(b"mc", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    net.mc0(b"mc", "REQUEST", "ID", "r1", "SERVICE", "memo-svc", "TIMEOUT", "4000", "", "from mc0")
    wid, timeout, payload = net.job_for(parked, "memo-svc")
    assert payload == b"from mc0" and 0 < timeout <= 4000
    net.sent = []
    net.nng(msg(M.RESULT, wid, payload=b"answered"))
    ((rid, frames),) = net.sent
    assert rid == b"mc" and frames[0] == b"FINAL" and frames[-1] == b"answered"
    peers = net.core.report("peers")
    assert {"memodb-worker"} <= {p["kind"] for p in peers}  # type: ignore[union-attr]


def test_several_workers_and_clients_each_on_their_own_request() -> None:
    net = Net()
    parked = [net.ready("svc") for _ in range(3)]
    clients = [net.nng(msg(M.JOB, b"", "svc", 5000, payload=b"%d" % i)) for i in range(5)]
    jobs = {token: net.job_for(token, "svc") for token in parked}
    assert len({wid for wid, _, _ in jobs.values()}) == 3
    rounds = 0
    while len([c for c in clients if c in net.answers]) < 5 and rounds < 10:  # bounded
        rounds += 1
        for token, (wid, _, payload) in list(jobs.items()):
            if payload is None:
                continue
            nxt = net.nng(msg(M.RESULT, wid, payload=b"r" + payload))
            jobs[token] = (wid, 0, None)  # type: ignore[assignment]
            if nxt in net.answers:
                jobs[nxt] = net.job_for(nxt, "svc")
    assert sorted(net.answer(c)[1] for c in clients) == [b"r%d" % i for i in range(5)]
    assert net.waiting() == 3  # every worker waits again; every client token answered once


def test_a_heartbeat_while_holding_a_job_is_out_of_sync_and_the_job_goes_to_another_worker() -> None:
    net = Net()
    first = net.ready("svc")
    client = net.nng(msg(M.JOB, b"", "svc", 5000, payload=b"q"))
    wid, _, _ = net.job_for(first, "svc")
    other = net.ready("svc")
    bad = net.nng(msg(M.HEARTBEAT, wid))
    assert net.answer(bad)[0] == ["memo01", M.DISCONNECT, wid]
    wid2, _, payload = net.job_for(other, "svc")  # requeued
    assert wid2 != wid and payload == b"q"
    net.nng(msg(M.RESULT, wid2, payload=b"ok"))
    assert net.answer(client)[1] == b"ok"


def test_a_repeated_request_voids_the_older_one() -> None:
    net = Net()
    parked = net.ready("svc")
    net.tick(1.01)
    wid = net.answer(parked)[0][2]
    first = net.nng(msg(M.HEARTBEAT, wid))
    resent = net.nng(msg(M.HEARTBEAT, wid))  # NNG resent it (the reply was lost)
    assert net.answers[first] is None and resent not in net.answers and net.waiting() == 1


def test_too_many_workers_and_broker_shutdown_answer_every_waiting_request() -> None:
    net = Net()
    parked = [net.ready("svc") for _ in range(8)]
    assert net.answer(net.ready("svc"))[0][1] == M.DISCONNECT  # max_workers = 8
    client = net.nng(msg(M.JOB, b"", "svc", 5000))
    (taken,) = [t for t in parked if t in net.answers]
    busy = net.job_for(taken, "svc")[0]
    net.route(net.core.shutdown(net.now))
    assert all(net.answer(t)[0][1] == M.DISCONNECT for t in parked if t != taken)
    assert net.answers[client] is None and not net.memo.workers and not net.memo.clients
    assert net.answer(net.nng(msg(M.RESULT, busy)))[0] == ["memo01", M.DISCONNECT, busy]


def _indefinite_header() -> bytes:
    return b"\x9f" + cbor2.dumps("memo01") + b"\x02\x40" + cbor2.dumps("svc") + b"\x19\x03\xe8\xff"


MALFORMED: list[tuple[str, bytes, str]] = [
    # (case, message, the seed's answer: "disconnect" to a worker-shaped one, "drop" a client's JOB)
    ("empty message", b"", "disconnect"),
    ("not CBOR", b"\xff\xfe\xfd", "disconnect"),
    ("truncated header", msg(M.READY, b"", ["svc"])[:-2], "disconnect"),
    ("a map, not an array", cbor2.dumps({"memo01": 1}), "disconnect"),
    ("array of two", cbor2.dumps(["memo01", 1]), "disconnect"),
    ("wrong version", msg(M.READY, b"", ["svc"]).replace(b"memo01", b"memo02"), "disconnect"),
    ("wrong version, client JOB", msg(M.JOB, b"", "svc", 1000).replace(b"memo01", b"memo02"), "drop"),
    ("unknown type", msg(9, b""), "disconnect"),
    ("type as text", cbor2.dumps(["memo01", "1", b"", ["svc"]]), "disconnect"),
    ("type as bool", cbor2.dumps(["memo01", True, b"", ["svc"]]), "disconnect"),
    ("ID as text", cbor2.dumps(["memo01", M.HEARTBEAT, "id"]), "disconnect"),
    ("ID over 64 bytes", msg(M.HEARTBEAT, b"x" * 65), "disconnect"),
    ("READY services not a list", msg(M.READY, b"", "svc"), "disconnect"),
    ("READY with no services", msg(M.READY, b"", []), "disconnect"),
    ("READY with a number for a service", msg(M.READY, b"", ["svc", 7]), "disconnect"),
    ("READY naming 65 services", msg(M.READY, b"", [f"s{i}" for i in range(65)]), "disconnect"),
    ("READY with a payload", msg(M.READY, b"", ["svc"], payload=b"x"), "disconnect"),
    ("READY with an ID", msg(M.READY, b"someone", ["svc"]), "disconnect"),
    ("huge array claimed", b"\x9b\xff\xff\xff\xff\xff\xff\xff\xff" + b"\x00" * 64, "disconnect"),
    ("deep nesting", b"\x84" + cbor2.dumps("memo01") + b"\x01\x40" + b"\x81" * 500 + b"\x00", "disconnect"),
    ("a semantic tag (regex)", cbor2.dumps(["memo01", M.READY, b"", [cbor2.CBORTag(35, "(a+)+$")]]), "disconnect"),
    ("a bignum", cbor2.dumps(["memo01", M.JOB, b"", "svc", cbor2.CBORTag(2, b"\x01" * 40)]), "disconnect"),
    ("JOB without timeout", msg(M.JOB, b"", "svc"), "drop"),
    ("JOB timeout 0", msg(M.JOB, b"", "svc", 0), "drop"),
    ("JOB timeout negative", msg(M.JOB, b"", "svc", -5), "drop"),
    ("JOB timeout a float", msg(M.JOB, b"", "svc", 1.5), "drop"),
    ("JOB service empty", msg(M.JOB, b"", "", 1000), "drop"),
    ("JOB service over 255 bytes", msg(M.JOB, b"", "s" * 256, 1000), "drop"),
    ("JOB service a bad mc0 name", msg(M.JOB, b"", "a b", 1000), "drop"),
    ("JOB not deterministic (indefinite)", _indefinite_header(), "disconnect"),
    (
        "JOB not deterministic (long int)",
        msg(M.JOB, b"", "svc", 1000).replace(b"\x19\x03\xe8", b"\x1a\x00\x00\x03\xe8"),
        "drop",
    ),
    ("JOB payload over the limit", msg(M.JOB, b"", "svc", 1000, payload=b"x" * ((1 << 20) + 1)), "drop"),
    ("JOB from a worker ID", msg(M.JOB, b"who", "svc", 1000), "disconnect"),
    ("RESULT flag not a bool", msg(M.RESULT, b"who", 1), "disconnect"),
    ("HEARTBEAT with a payload", msg(M.HEARTBEAT, b"who", payload=b"x"), "disconnect"),
    ("DISCONNECT from a peer", msg(M.DISCONNECT, b""), "disconnect"),
    ("HEARTBEAT with no ID", msg(M.HEARTBEAT, b""), "disconnect"),
]


@pytest.mark.parametrize(("case", "data", "reaction"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_gets_the_seeds_reaction_and_everyone_is_still_answered(
    case: str, data: bytes, reaction: str
) -> None:
    net = Net()
    net.mc0(b"m", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    holder = net.ready("svc")
    held = net.nng(msg(M.JOB, b"", "svc", 5000, payload=b"held"))
    wid = net.job_for(holder, "svc")[0]
    spare = net.ready("svc")
    bad = net.nng(data)  # must not raise
    if reaction == "drop":
        assert net.answers[bad] is None
    else:
        head, _ = net.answer(bad)
        assert head[:2] == ["memo01", M.DISCONNECT]
    assert net.mc0(b"m", "PING", "ID", "p")[0][1][0] == b"PONG"
    again = net.nng(msg(M.RESULT, wid, payload=b"done"))
    assert net.answer(held)[1] == b"done"
    client = net.nng(msg(M.JOB, b"", "svc", 5000, payload=b"after"))
    (token,) = [t for t in (spare, again) if t in net.answers]
    worker, _, payload = net.job_for(token, "svc")
    assert payload == b"after"
    net.nng(msg(M.RESULT, worker, payload=b"fine"))
    assert net.answer(client)[1] == b"fine"


# What the bridge's thread reads off a request's first bytes: a worker's (it parks at the broker,
# on a context of its own) or not (a client's JOB, or anything else, on the pool's contexts).
WORKER_SHAPED = [
    (msg(M.READY, b"", ["svc"]), True),
    (msg(M.RESULT, b"w" * 16, payload=b"answer"), True),
    (msg(M.RESULT, b"w" * 16, True), True),
    (msg(M.HEARTBEAT, b"w" * 16), True),
    (msg(M.JOB, b"", "svc", 1000, payload=b"q"), False),
    (msg(M.DISCONNECT, b"w" * 16), False),
    (cbor2.dumps(["memo02", M.READY, b"", ["svc"]]), False),
    (cbor2.dumps(["memo01", M.READY, b"", ["svc"], 1, 2]), False),  # 6 items: no worker's header
    (b"", False),
    (b"\x84fmemo0", False),
]


@pytest.mark.parametrize(("data", "worker"), WORKER_SHAPED)
def test_a_workers_request_is_told_from_its_first_bytes(data: bytes, worker: bool) -> None:
    assert M.is_worker_request(data) is worker
