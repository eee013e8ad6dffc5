"""Each foreign dialect against its seed, one test per deviation an audit found (issue 19): made
faithful where mc0 can, otherwise answered with an error the peer cannot misread (and named in
docs/PROTOCOL.md's compatibility table).  The core, no sockets; live peers are in each dialect's
own module and, under CURVE, in tests/test_dialects_curve.py."""

from __future__ import annotations

import pytest

from mc0 import protocol as P
from mc0.broker.dialects import dcp as D
from mc0.broker.dialects import emqp as E
from mc0.broker.dialects import mdpx as S
from mc0.broker.dialects import memodb as M

from .test_emqp import RR
from .test_emqp import Core as EmqpNet
from .test_memodb import Net as MemoNet
from .test_memodb import msg

H = [b"", D.PROTOCOL]
V = E.VERSION


def mc0_worker(net: EmqpNet, who: bytes, service: str) -> None:
    net.mc0(who, "CONNECT", "VERSION", "1.0", "TTL", "5000")
    net.mc0(who, "READY", "CAPACITY", "4", "", service)


def bid_of(frames: list[bytes]) -> str:
    return frames[frames.index(b"ID") + 1].decode()


# ---------------------------------------------------------------- in-band errors (MDP, seed 000, DCP)
# A worker's reply shaped like the broker's in-band error keeps its code only if it is an
# application's; the broker's own verdicts (401, 499, 502-505, 507) are never a worker's.
IN_BAND = [
    ([b"ERROR", b"503", b"busy"], [b"ERROR", b"500", b"[worker sent code '503'] busy"]),
    ([b"ERROR", b"504", b"slow"], [b"ERROR", b"500", b"[worker sent code '504'] slow"]),
    ([b"ERROR", b"401", b"x"], [b"ERROR", b"500", b"[worker sent code '401'] x"]),
    ([b"ERROR", b"404", b"no such user"], [b"ERROR", b"404", b"no such user"]),  # the application's own
    ([b"ERROR", b"busy", b"x"], [b"ERROR", b"busy", b"x"]),  # not a code: data
    ([b"ERROR", b"503"], [b"ERROR", b"503"]),  # not three frames: data
    ([b"ERROR", b"503", b"a", b"b"], [b"ERROR", b"503", b"a", b"b"]),
    ([b"error", b"503", b"x"], [b"error", b"503", b"x"]),
    ([b"ERROR", b"\xff\xfe\xfd", b"x"], [b"ERROR", b"\xff\xfe\xfd", b"x"]),
]


@pytest.mark.parametrize(("body", "shown"), IN_BAND)
def test_in_band_bodies_never_speak_for_the_broker(body: list[bytes], shown: list[bytes]) -> None:
    assert list(P.in_band_body(body)) == shown


def test_seed000_a_workers_503_is_told_from_the_brokers_and_replies_always_carry_a_body() -> None:
    net = EmqpNet()
    out = net.send(b"c", S.CLIENT, S.REQUEST, b"nobody", b"r0", b"x")
    assert out == [(b"c", [S.CLIENT, S.C_FINAL, b"nobody", b"r0", b"ERROR", b"503", b"no worker for nobody"])]
    net.send(b"w", S.WORKER, S.READY, b"svc")
    ((_, request),) = net.send(b"c", S.CLIENT, S.REQUEST, b"svc", b"r1", b"x")
    token = request[2]
    # The address frame is the broker's token, never a routing id (the seed: an opaque envelope).
    assert request[:2] == [S.WORKER, S.W_REQUEST] and request[3] == b"" and request[4] == token
    out = net.send(b"w", S.WORKER, S.W_FINAL, token, b"", token, b"ERROR", b"503", b"busy")
    assert out[0] == (b"c", [S.CLIENT, S.C_FINAL, b"svc", b"r1", b"ERROR", b"500", b"[worker sent code '503'] busy"])
    ((_, request),) = net.send(b"c", S.CLIENT, S.REQUEST, b"svc", b"r2", b"x")
    token = request[2]
    out = net.send(b"w", S.WORKER, S.W_FINAL, token, b"", token)  # no body: "5 or more frames" for the client
    assert out[0] == (b"c", [S.CLIENT, S.C_FINAL, b"svc", b"r2", b""])


def test_seed000_a_request_without_a_body_is_refused_with_an_error_final() -> None:
    net = EmqpNet()
    net.send(b"w", S.WORKER, S.READY, b"svc")
    out = net.send(b"c", S.CLIENT, S.REQUEST, b"svc", b"r1")  # 4 frames: the seed asks 5 or more
    assert out == [
        (
            b"c",
            [
                S.CLIENT,
                S.C_FINAL,
                b"svc",
                b"r1",
                b"ERROR",
                b"400",
                b"a seed-000 REQUEST needs a body frame (5 or more frames)",
            ],
        )  # fmt: skip
    ]
    assert net.core.report("services")["svc"]["requests"] == 0  # type: ignore[index]


# ---------------------------------------------------------------- DCP (seed 001)
def test_dcp_clients_get_no_unsolicited_pong_and_a_workers_error_is_told_from_the_brokers() -> None:
    net = EmqpNet()
    mc0_worker(net, b"mw", "svc")
    ((_, request),) = net.send(b"dc", *H, D.REQUEST, b"svc", b"", b"m1", b"", b"data")
    bid = bid_of(request)
    assert net.mc0(b"mw", "PARTIAL", "ID", bid, "", "half") == []  # DCP has no partial replies
    assert net.core.counters["partials_unsent"] == 1
    out = net.mc0(b"mw", "FINAL", "ID", bid, "", "ERROR", "503", "busy")
    ((_, reply),) = [o for o in out if o[0] == b"dc"]
    assert reply[:3] == [*H, D.REPLY] and reply[-3:] == [b"ERROR", b"500", b"[worker sent code '503'] busy"]
    assert reply[4:7] == [b"", b"m1", b""]  # the metadata, byte for byte
    out = net.send(b"dc", *H, D.REQUEST, b"nobody", b"", b"m2", b"", b"data")
    ((_, reply),) = out
    assert reply[-3:] == [b"ERROR", b"503", b"no worker for nobody"]  # only the broker says 503


# ---------------------------------------------------------------- eMQP (seed 002)
def test_emqp_headers_cross_to_the_worker_as_they_came() -> None:
    net = EmqpNet()
    net.worker(b"ew", b"eq", readies=2)
    mc0_worker(net, b"mw", "mq")
    headers = b"reply-requested,guarantee,retry-count:3,timeout:5,x-trace:abc"
    ((_, request),) = net.emqp(b"c", E.REQUEST, b"e1", b"eq", headers, b"job")
    assert request[5] == b"reply-requested,timeout:5,guarantee,retry-count:3,x-trace:abc"
    ((_, request),) = net.emqp(b"c", E.REQUEST, b"e2", b"mq", headers, b"job")
    assert request[request.index(b"X-Emqp-Headers") + 1] == b"guarantee,retry-count:3,x-trace:abc"
    # An mc0 client gives an eMQP worker headers the same way (its own reply-requested/timeout do not count).
    net.mc0(b"mc", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    out = net.mc0(b"mc", "REQUEST", "SERVICE", "eq", "ID", "r", "TIMEOUT", "9000", "X-Emqp-Headers",
                  "guarantee,timeout:99", "", "hi")  # fmt: skip
    ((_, request),) = [o for o in out if o[0] == b"ew"]
    assert request[5] == b"reply-requested,timeout:9,guarantee"


def test_emqp_a_request_without_reply_requested_runs_and_gets_nothing_back() -> None:
    net = EmqpNet()
    net.worker(b"ew", b"eq")
    ((_, request),) = net.emqp(b"c", E.REQUEST, b"e1", b"eq", b"guarantee", b"job")
    assert request[5].startswith(b"reply-requested,")  # the worker is always asked: its REPLY frees its slot
    assert net.emqp(b"ew", E.REPLY, request[3], b"done") == []  # ... and the client gets nothing
    assert net.emqp(b"c", E.REQUEST, b"e2", b"nobody", b"", b"job") == []  # nor an error
    assert net.core.counters["answers_unwanted"] == 2


def test_emqp_has_no_partials_and_one_frame_bodies_both_ways() -> None:
    net = EmqpNet()
    mc0_worker(net, b"mw", "mq")
    ((_, request),) = net.emqp(b"c", E.REQUEST, b"e1", b"mq", RR, b"job")
    bid = bid_of(request)
    assert net.mc0(b"mw", "PARTIAL", "ID", bid, "", "half") == []  # not a HEARTBEAT any more
    out = net.mc0(b"mw", "FINAL", "ID", bid, "", "two", "frames")
    assert [o for o in out if o[0] == b"c"] == [
        (b"c", [b"", V, E.REPLY, b"e1", b"ERROR", b"500", b"[the reply has 2 frames; eMQP carries one]"])
    ]
    # An mc0 client's multi-frame request to a service an eMQP worker serves: 400 at once, nothing queued.
    net.worker(b"ew", b"mq")
    net.mc0(b"mc", "CONNECT", "VERSION", "1.0", "TTL", "5000")
    ((_, refused),) = net.mc0(b"mc", "REQUEST", "SERVICE", "mq", "ID", "r", "", "a", "b")
    assert refused[:5] == [b"ERROR", b"ID", b"r", b"CODE", b"400"] and b"one body frame" in refused[-1]
    ((rid, _),) = net.mc0(b"mc", "REQUEST", "SERVICE", "mq", "ID", "r2", "", "one")
    assert rid in (b"mw", b"ew")


def test_emqp_queue_weights_are_read_and_every_named_queue_served() -> None:
    """eventmq's [[weight, name]] INFORM: the names are served; the weights are not used (mc0 dispatches
    least recently used, one rule for every dialect; documented in docs/PROTOCOL.md)."""
    net = EmqpNet()
    net.worker(b"heavy", b'[[10, "q"]]')
    net.worker(b"light", b'[[1, "q"]]')
    takers = {net.emqp(b"c", E.REQUEST, b"m%d" % i, b"q", RR, b"x")[0][0] for i in range(2)}
    assert takers == {b"heavy", b"light"}


# ---------------------------------------------------------------- MemoDB (seed 003)
def test_memodb_a_job_timeout_over_the_limit_is_refused_not_cut_short() -> None:
    net = MemoNet(max_request_timeout_ms=600_000)
    parked = net.ready("slow")
    too_long = net.nng(msg(M.JOB, b"", "slow", 900_000, payload=b"x"))
    assert net.answers[too_long] is None and parked not in net.answers  # dropped; the worker got nothing
    assert net.core.counters["memodb_timeout_over_limit"] == 1
    net.nng(msg(M.JOB, b"", "slow", 600_000, payload=b"y"))
    _, timeout, payload = net.job_for(parked, "slow")
    assert (timeout, payload) == (600_000, b"y")  # at the limit: served with its own timeout
