"""BrokerCore RPC without sockets or sleeps: dispatch, deadlines, retries, scatter, MDP."""

from __future__ import annotations

import json

from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.dialects import mdp, recognise
from mc0.protocol import Side


def f(*parts: str | bytes) -> list[bytes]:
    return [p.encode() if isinstance(p, str) else p for p in parts]


def decode(frames: object) -> P.Command:
    return P.decode(frames, sender=Side.BROKER)  # type: ignore[arg-type]


class Net:
    """A core plus helpers to talk as named peers; every answer is checked against the grammar."""

    def __init__(self, **settings: object) -> None:
        self.core = BrokerCore(CoreSettings(**settings), dialects=recognise)  # type: ignore[arg-type]
        self.now = 0.0

    def send(self, who: str, *frames: str | bytes) -> dict[bytes, list[P.Command]]:
        return self._collect(self.core.handle(who.encode(), f(*frames), self.now, who))

    def connect(self, *names: str, ttl: int = 1000) -> None:
        for name in names:
            self.send(name, "CONNECT", "VERSION", "1.0", "TTL", str(ttl))

    def worker(self, name: str, *services: str, capacity: int = 1) -> dict[bytes, list[P.Command]]:
        self.connect(name)
        return self.send(name, "READY", "CAPACITY", str(capacity), "", *services)

    def tick(self, now: float) -> dict[bytes, list[P.Command]]:
        self.now = now
        return self._collect(self.core.tick(now))

    def _collect(self, out: list[tuple[bytes, object]]) -> dict[bytes, list[P.Command]]:
        result: dict[bytes, list[P.Command]] = {}
        for rid, frames in out:
            if frames and frames[0] in (mdp.CLIENT, mdp.WORKER, b""):  # type: ignore[index]
                result.setdefault(rid, []).append(frames)  # type: ignore[arg-type]
            elif list(frames) != [b"NOOP"]:  # type: ignore[call-overload]  # heartbeats are tested in test_core
                result.setdefault(rid, []).append(decode(frames))
        return result


def only(out: dict[bytes, list[P.Command]], who: str) -> P.Command:
    (command,) = out[who.encode()]
    return command


def test_lru_spreads_requests_and_fresh_workers_go_first() -> None:
    net = Net()
    net.worker("w1", "echo")
    net.worker("w2", "echo")
    net.connect("c")
    order = []
    for i in range(4):
        out = net.send("c", "REQUEST", "SERVICE", "echo", "ID", str(i), "", "x")
        (target,) = out
        order.append(target)
        bid = out[target][0].headers["ID"]
        net.send(target.decode(), "FINAL", "ID", bid, "", "done")
    assert order == [b"w2", b"w1", b"w2", b"w1"]  # w2 registered last, never used: least recently used


def test_request_reaches_the_worker_with_caller_and_remaining_timeout_and_echoes_headers() -> None:
    net = Net()
    net.worker("w", "svc")
    net.connect("c")
    out = net.send("c", "REQUEST", "SERVICE", "svc", "ID", "r1", "TIMEOUT", "2000", "X-Trace", "t", "", "a", "b")
    job = only(out, "w")
    assert job.verb is P.Verb.REQUEST
    assert job.headers["CALLER"] == "c" and job.headers["TIMEOUT"] == "2000" and job.headers["X-Trace"] == "t"
    assert list(job.payload) == [b"a", b"b"]
    bid = job.headers["ID"]
    assert bid != "r1"  # the worker never sees the client's id
    partial = only(net.send("w", "PARTIAL", "ID", bid, "", "p1"), "c")
    assert (partial.verb, partial.headers) == (P.Verb.PARTIAL, {"ID": "r1", "X-Trace": "t"})
    final = only(net.send("w", "FINAL", "ID", bid, "X-Own", "1", "", "f"), "c")
    assert (final.verb, final.headers, list(final.payload)) == (P.Verb.FINAL, {"ID": "r1", "X-Own": "1"}, [b"f"])
    assert net.send("w", "FINAL", "ID", bid, "", "again") == {}  # second terminal: dropped
    assert net.core.counters["replies_dropped"] == 1


def test_no_worker_is_503_at_once_and_duplicate_id_is_409() -> None:
    net = Net()
    net.connect("c")
    err = only(net.send("c", "REQUEST", "SERVICE", "nobody", "ID", "1"), "c")
    assert err.headers["CODE"] == "503" and err.headers["ID"] == "1"
    net.worker("w", "slow")
    net.send("c", "REQUEST", "SERVICE", "slow", "ID", "dup")
    err = only(net.send("c", "REQUEST", "SERVICE", "slow", "ID", "dup"), "c")
    assert err.headers["CODE"] == "409"


def test_queue_is_fifo_and_bounded() -> None:
    net = Net(max_queue=2)
    net.worker("w", "q")
    net.connect("c")
    first = only(net.send("c", "REQUEST", "SERVICE", "q", "ID", "1"), "w")
    assert net.send("c", "REQUEST", "SERVICE", "q", "ID", "2") == {}
    assert net.send("c", "REQUEST", "SERVICE", "q", "ID", "3") == {}
    assert only(net.send("c", "REQUEST", "SERVICE", "q", "ID", "4"), "c").headers["CODE"] == "429"
    out = net.send("w", "FINAL", "ID", first.headers["ID"])
    assert only(out, "c").headers["ID"] == "1"
    assert only(out, "w").verb is P.Verb.REQUEST  # request 2 dispatched as the slot frees


def test_capacity_allows_several_requests_at_once() -> None:
    net = Net()
    net.worker("w", "par", capacity=3)
    net.connect("c")
    got = [net.send("c", "REQUEST", "SERVICE", "par", "ID", str(i)) for i in range(4)]
    assert [bool(g) for g in got] == [True, True, True, False]


def test_deadline_gives_504_and_cancels_the_worker_and_late_reply_is_dropped() -> None:
    net = Net()
    net.worker("w", "slow")
    net.connect("c")
    job = only(net.send("c", "REQUEST", "SERVICE", "slow", "ID", "r", "TIMEOUT", "500"), "w")
    assert net.core.next_deadline() <= 0.5
    assert net.tick(0.49) == {}
    out = net.tick(0.5)
    assert only(out, "c").headers["CODE"] == "504"
    assert only(out, "w").verb is P.Verb.CANCEL and only(out, "w").headers["ID"] == job.headers["ID"]
    assert net.send("w", "FINAL", "ID", job.headers["ID"], "", "late") == {}
    assert net.core.counters["replies_dropped"] == 1


def test_cancel_gives_499_and_tells_the_worker() -> None:
    net = Net()
    net.worker("w", "s")
    net.connect("c")
    job = only(net.send("c", "REQUEST", "SERVICE", "s", "ID", "r"), "w")
    out = net.send("c", "CANCEL", "ID", "r")
    assert only(out, "c").headers == {"ID": "r", "CODE": "499", "MESSAGE": "cancelled"}
    assert only(out, "w").verb is P.Verb.CANCEL and only(out, "w").headers["ID"] == job.headers["ID"]
    assert net.send("c", "CANCEL", "ID", "r") == {}  # unknown or finished: ignored


def test_worker_death_before_any_partial_requeues_to_another_worker() -> None:
    net = Net()
    net.worker("spare", "s")
    net.worker("victim", "s")  # fresh: gets the request
    net.connect("c")
    assert only(net.send("c", "REQUEST", "SERVICE", "s", "ID", "r"), "victim")
    other = only(net.send("c", "REQUEST", "SERVICE", "s", "ID", "r2"), "spare")
    net.send("victim", "DISCONNECT")  # dies holding r; spare is busy with r2
    out = net.send("spare", "FINAL", "ID", other.headers["ID"])
    assert only(out, "c").headers["ID"] == "r2"
    retried = only(out, "spare")
    assert retried.verb is P.Verb.REQUEST
    final = only(net.send("spare", "FINAL", "ID", retried.headers["ID"], "", "ok"), "c")
    assert final.verb is P.Verb.FINAL and final.headers["ID"] == "r"


def test_worker_death_after_a_partial_is_502() -> None:
    net = Net()
    net.worker("w", "s")
    net.worker("spare", "s")
    net.connect("c")
    out = net.send("c", "REQUEST", "SERVICE", "s", "ID", "r")
    ((holder, (job,)),) = out.items()
    net.send(holder.decode(), "PARTIAL", "ID", job.headers["ID"], "", "half")
    out = net.tick(10.0)  # the holder (and everyone) expired: liveness x TTL of silence
    errors = [c for c in out.get(b"c", []) if c.verb is P.Verb.ERROR]
    assert [e.headers["CODE"] for e in errors] == ["502"]


def test_attempts_are_bounded() -> None:
    net = Net(max_attempts=2)
    net.connect("c")
    net.worker("a", "s")
    net.send("c", "REQUEST", "SERVICE", "s", "ID", "r")
    net.send("a", "DISCONNECT")
    assert only(net.worker("b", "s"), "b").verb is P.Verb.REQUEST
    out = net.send("b", "DISCONNECT")
    assert only(out, "c").headers["CODE"] == "502"


def test_a_request_whose_only_worker_was_lost_waits_a_grace_for_another_then_fails_502() -> None:
    from mc0.broker.core.rpc import ORPHAN_GRACE

    net = Net(max_attempts=3)
    net.connect("c")
    net.worker("a", "s")
    net.send("c", "REQUEST", "SERVICE", "s", "ID", "r", "TIMEOUT", "60000")
    net.send("a", "DISCONNECT")
    assert b"c" not in net.tick(ORPHAN_GRACE / 2)  # still waiting: a worker may come back
    out = net.tick(ORPHAN_GRACE + 0.01)
    answer = only(out, "c")
    assert answer.verb is P.Verb.ERROR and answer.headers["CODE"] == "502"
    assert "no other serves s" in answer.headers["MESSAGE"]  # at once, not at the request's deadline


def test_a_request_whose_only_worker_was_lost_is_served_by_one_that_comes_within_the_grace() -> None:
    net = Net(max_attempts=3)
    net.connect("c")
    net.worker("a", "s")
    net.send("c", "REQUEST", "SERVICE", "s", "ID", "r", "TIMEOUT", "60000")
    net.send("a", "DISCONNECT")
    assert only(net.worker("b", "s"), "b").verb is P.Verb.REQUEST
    assert b"c" not in net.tick(5.0)  # b holds it: the grace passing changes nothing


def test_scatter_gathers_finals_as_partials_then_final_with_count_and_missing() -> None:
    net = Net()
    for w in ("w1", "w2", "w3"):
        net.worker(w, "fleet")
    net.connect("c")
    out = net.send("c", "REQUEST", "SERVICE", "fleet", "ID", "s", "ALL", "1", "TIMEOUT", "1000", "", "ping")
    assert sorted(out) == [b"w1", b"w2", b"w3"]
    bids = {w: cmds[0].headers["ID"] for w, cmds in out.items()}
    r1 = only(net.send("w1", "FINAL", "ID", bids[b"w1"], "", "pong1"), "c")
    assert r1.verb is P.Verb.PARTIAL and r1.headers["WORKER"].startswith("w1#")
    r2 = only(net.send("w2", "ERROR", "ID", bids[b"w2"], "CODE", "500", "MESSAGE", "boom"), "c")
    assert (r2.verb, r2.headers["CODE"], r2.headers["MESSAGE"]) == (P.Verb.PARTIAL, "500", "boom")
    out = net.tick(1.0)  # w3 never answers
    final = only(out, "c")
    assert final.verb is P.Verb.FINAL and (final.headers["COUNT"], final.headers["MISSING"]) == ("2", "1")
    assert only(out, "w3").verb is P.Verb.CANCEL


def test_scatter_ends_early_when_everyone_answered_or_died() -> None:
    net = Net()
    net.worker("w1", "fleet")
    net.worker("w2", "fleet")
    net.connect("c")
    out = net.send("c", "REQUEST", "SERVICE", "fleet", "ID", "s", "ALL", "1")
    net.send("w2", "DISCONNECT")
    out = net.send("w1", "FINAL", "ID", out[b"w1"][0].headers["ID"])
    final = out[b"c"][-1]
    assert final.verb is P.Verb.FINAL and (final.headers["COUNT"], final.headers["MISSING"]) == ("1", "1")


def test_client_death_cancels_its_requests_at_the_worker() -> None:
    net = Net()
    net.worker("w", "s")
    net.connect("c")
    job = only(net.send("c", "REQUEST", "SERVICE", "s", "ID", "r"), "w")
    out = net.send("c", "DISCONNECT")
    assert only(out, "w").verb is P.Verb.CANCEL and only(out, "w").headers["ID"] == job.headers["ID"]


def test_a_peer_can_be_worker_and_client_at_once() -> None:
    net = Net()
    net.worker("front", "api")
    net.worker("back", "db")
    net.connect("c")
    job = only(net.send("c", "REQUEST", "SERVICE", "api", "ID", "r"), "front")
    inner = only(net.send("front", "REQUEST", "SERVICE", "db", "ID", "q"), "back")
    assert inner.headers["CALLER"] == "front"
    assert only(net.send("back", "FINAL", "ID", inner.headers["ID"], "", "row"), "front").verb is P.Verb.FINAL
    assert only(net.send("front", "FINAL", "ID", job.headers["ID"], "", "page"), "c").verb is P.Verb.FINAL


def test_builtin_broker_service_and_mmi() -> None:
    net = Net()
    net.worker("w", "echo", capacity=2)
    net.connect("c")
    services = json.loads(
        only(net.send("c", "REQUEST", "SERVICE", "mc0.broker", "ID", "1", "", "services"), "c").payload[0]
    )
    assert services["echo"]["workers"] == 1 and services["echo"]["idle"] == 1
    stats = json.loads(
        only(net.send("c", "REQUEST", "SERVICE", "mc0.broker", "ID", "2", "", '{"op": "stats"}'), "c").payload[0]
    )
    assert stats["peers"] == 2
    assert only(net.send("c", "REQUEST", "SERVICE", "mc0.broker", "ID", "3", "", "bogus"), "c").headers["CODE"] == "400"
    mmi = only(net.send("c", "REQUEST", "SERVICE", "mmi.service", "ID", "4", "", "echo"), "c")
    assert list(mmi.payload) == [b"200"]
    mmi = only(net.send("c", "REQUEST", "SERVICE", "mmi.service", "ID", "5", "", "nope"), "c")
    assert list(mmi.payload) == [b"404"]
    assert only(net.send("w", "READY", "ID", "x", "", "mc0.broker"), "w").headers["CODE"] == "403"


def test_mdp_client_and_worker_share_a_service_with_mc0_peers() -> None:
    net = Net()
    core = net.core
    out = core.handle(b"mdpw", [b"", mdp.WORKER, mdp.READY, b"echo"], 0.0)
    assert out == []
    out = net.send("c", "CONNECT", "VERSION", "1.0", "TTL", "1000")
    out = core.handle(b"c", f("REQUEST", "SERVICE", "echo", "ID", "r", "", "hi"), 0.0, "c")
    ((rid, frames),) = out
    assert rid == b"mdpw" and frames[:3] == [b"", mdp.WORKER, mdp.REQUEST] and frames[4:] == [b"", b"hi"]
    token = frames[3]
    assert token != b"c"  # an opaque broker token, not a routing id
    ((rid, frames),) = core.handle(b"mdpw", [b"", mdp.WORKER, mdp.FINAL, token, b"", b"HI"], 0.0)
    assert rid == b"c" and decode(frames).verb is P.Verb.FINAL and list(decode(frames).payload) == [b"HI"]
    # An MDP client: an error is a FINAL with ERROR, code, reason.
    ((rid, frames),) = core.handle(b"mdpc", [b"", mdp.CLIENT, mdp.REQUEST, b"none", b"x"], 0.0)
    assert frames == [b"", mdp.CLIENT, mdp.FINAL, b"none", b"ERROR", b"503", b"no worker for none"]
    # Malformed MDP is dropped and counted.
    assert core.handle(b"bad", [b"", mdp.WORKER, b"\x09"], 0.0) == []
    assert core.counters["mdp_malformed"] == 1
    # A worker the broker does not know gets DISCONNECT.
    assert core.handle(b"ghost", [b"", mdp.WORKER, mdp.HEARTBEAT], 0.0) == [
        (b"ghost", [b"", mdp.WORKER, mdp.DISCONNECT])
    ]


def test_bad_rpc_input_is_answered_and_changes_nothing() -> None:
    net = Net()
    net.worker("w", "s")
    net.connect("c")
    cases = [
        (("REQUEST", "SERVICE", "bad..name", "ID", "1"), "400"),
        (("REQUEST", "SERVICE", "s", "ID", "2", "TIMEOUT", "soon"), "400"),
        (("REQUEST", "SERVICE", "s", "ID", "3", "ALL", "yes"), "400"),
        (("READY", "ID", "4", "CAPACITY", "0", "", "x"), "400"),
        (("READY", "ID", "5", "CAPACITY", "99999", "", "x"), "400"),
        (("READY", "ID", "6", "", "a..b"), "400"),
        (("CANCEL",), "400"),
        (("ERROR", "ID", "7", "CODE", "500"), "400"),
    ]
    for frames, code in cases:
        assert only(net.send("c", *frames), "c").headers["CODE"] == code, frames
    assert set(net.core.services) == {"s"}
    assert not net.core.rpc.has_requests(net.core.sessions[b"c"])


def test_ready_with_no_services_withdraws_the_worker_but_its_jobs_still_finish() -> None:
    """A draining worker: no new work (not even a scatter leg), its replies still taken, and the
    service it left is gone for new callers (503) unless another worker serves it."""
    net = Net()
    net.worker("w", "drain.me", "other", capacity=2)
    net.worker("w2", "other")
    net.connect("c")
    job = only(net.send("c", "REQUEST", "SERVICE", "drain.me", "ID", "1"), "w")
    ok = only(net.send("w", "READY", "ID", "bye"), "w")
    assert (ok.verb, ok.headers["ID"]) == (P.Verb.OK, "bye")
    refused = only(net.send("c", "REQUEST", "SERVICE", "drain.me", "ID", "2"), "c")
    assert (refused.verb, refused.headers["CODE"]) == (P.Verb.ERROR, "503")
    for rid in ("3", "4"):  # "other" goes to w2 only, though w had spare capacity
        assert list(net.send("c", "REQUEST", "SERVICE", "other", "ID", rid)) in ([b"w2"], [])
    scatter = net.send("c", "REQUEST", "SERVICE", "other", "ID", "5", "ALL", "1")
    assert b"w" not in scatter
    answer = only(net.send("w", "FINAL", "ID", job.headers["ID"], "", "done"), "c")
    assert (answer.verb, answer.headers["ID"], answer.payload) == (P.Verb.FINAL, "1", [b"done"])
    assert net.send("w", "READY", "ID", "again", "", "drain.me")[b"w"][0].verb is P.Verb.OK  # may serve again
    assert b"w" in net.send("c", "REQUEST", "SERVICE", "drain.me", "ID", "6")
