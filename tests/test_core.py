"""BrokerCore without sockets or sleeps: time is an argument."""

from __future__ import annotations

import pytest

from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.core.peers import CLOSE_WAIT_LIMIT
from mc0.protocol import Limits


def f(*parts: str | bytes) -> list[bytes]:
    return [p.encode() if isinstance(p, str) else p for p in parts]


def connect(
    core: BrokerCore, rid: bytes, now: float = 0.0, ttl: int = 1000, version: str = "1.0", who: str = "anonymous"
):
    return core.handle(rid, f("CONNECT", "VERSION", version, "TTL", str(ttl), "ID", "c"), now, who)


def test_every_verb_a_peer_may_send_has_one_handler() -> None:
    """The verb table (verbs.VERBS and the dispatcher's CONNECT and DISCONNECT) has a row for each verb of
    the peer grammar and no other: a verb added to protocol.model without its handler fails here, not as
    a 500 at its first use (docs/ARCHITECTURE.md, "Extending": a new verb)."""
    assert set(BrokerCore(CoreSettings()).verbs) == set(P.PEER_GRAMMAR)


def test_connect_clamps_ttl_and_answers_with_it() -> None:
    core = BrokerCore(CoreSettings(min_ttl_ms=200, max_ttl_ms=2000))
    assert connect(core, b"a", ttl=1) == [(b"a", f("OK", "ID", "c", "TTL", "200"))]
    assert connect(core, b"b", ttl=99999) == [(b"b", f("OK", "ID", "c", "TTL", "2000"))]
    assert connect(core, b"c", ttl=500) == [(b"c", f("OK", "ID", "c", "TTL", "500"))]


def test_commands_before_connect_get_401() -> None:
    core = BrokerCore()
    assert core.handle(b"a", f("NOOP", "ID", "1"), 0.0) == [
        (b"a", P.error(401, "not connected: send CONNECT first", "1"))
    ]
    assert core.handle(b"a", f("PUT", "TOPIC", "t", "", "x"), 0.0)[0][1][:3] == f("ERROR", "CODE", "401")


REVOKED = P.error(401, "key revoked", "c")


@pytest.mark.parametrize(
    ("frames", "answer"),
    [
        (f("CONNECT", "VERSION", "1.0", "TTL", "1000", "ID", "c"), [REVOKED]),
        (f("", "CONNECT", "VERSION", "1.0", "TTL", "1000", "ID", "c"), [P.enveloped(REVOKED)]),  # an mc0d-era DEALER
        (f("CONNECT", "VERSION", "1.0"), [P.error(401, "key revoked")]),  # no ID: answered without one
        (f("CONNECT", "TTL", "soon", "ID", "c"), [REVOKED]),  # (a bad TTL would be told after the key)
        (f("CONNECT", "ID"), []),  # not a CONNECT after all: dropped
        (f("CONNECT", "BOGUS", "1"), []),
        (f("PUT", "TOPIC", "t", "", "x"), []),  # anything else: dropped, as before
        (f("NOOP", "ID", "1"), []),
        (f("BATCH", "", b"\x00" * 8), []),
        (f(""), []),
        ([], []),
    ],
)
def test_a_revoked_identitys_connect_is_answered_key_revoked_and_the_rest_dropped(
    frames: list[bytes], answer: list[list[bytes]]
) -> None:
    """A connection whose handshake passed just before its key was revoked: its CONNECT gets 401 "key
    revoked" (its client says why instead of timing out); nothing else it sends is answered or kept."""
    core = BrokerCore()
    connect(core, b"old", who="bob")
    core.revoke({"bob"}, 0.0)
    assert core.handle(b"new", frames, 1.0, "bob") == [(b"new", a) for a in answer]
    assert b"new" not in core.sessions and core.counters["revoked_dropped"] == 1


def test_heartbeat_noop_after_ttl_and_expiry_removes_subscriptions() -> None:
    core = BrokerCore(CoreSettings(liveness=3))
    connect(core, b"a", now=0.0, ttl=1000)
    connect(core, b"p", now=0.0, ttl=1000)
    core.handle(b"a", f("SUB", "", "x.>"), 0.0)
    assert len(core.subscriptions) == 1
    assert core.tick(0.4) == []
    out = core.tick(0.5)  # HEARTBEAT_FRACTION x TTL of the broker's silence toward each
    assert (b"a", P.NOOP_FRAMES) in out and (b"p", P.NOOP_FRAMES) in out
    core.handle(b"p", f("NOOP"), 2.5)  # p stays alive, a stays silent
    core.tick(2.9)
    assert b"a" in core.sessions
    core.tick(3.0)
    assert b"a" not in core.sessions and b"p" in core.sessions
    assert len(core.subscriptions) == 0
    assert core.handle(b"p", f("PUT", "TOPIC", "x.y", "", "b"), 3.1) == []


def test_put_fans_out_once_per_peer_with_sender_and_user_headers() -> None:
    core = BrokerCore()
    for rid in (b"s1", b"s2", b"pub"):
        connect(core, rid)
    core.handle(b"s1", f("SUB", "", "a.>", "a.*", "*.b"), 0.0)
    core.handle(b"s2", f("SUB", "", "z"), 0.0)
    out = core.handle(b"pub", f("PUT", "TOPIC", "a.b", "X-Trace", "1", "ID", "9", "", "body", "more"), 0.0, "anonymous")
    assert out == [
        (b"s1", f("MESSAGE", "TOPIC", "a.b", "SENDER", "anonymous", "X-Trace", "1", "", "body", "more")),
        (b"pub", f("OK", "ID", "9")),
    ]


def test_seed_peers_get_the_seed_message_shape_and_only_seed_verbs() -> None:
    core = BrokerCore()
    connect(core, b"old", version="0.1")
    connect(core, b"new")
    core.handle(b"old", f("SUB", "", "t"), 0.0)
    core.handle(b"new", f("SUB", "", "t"), 0.0)
    out = dict(core.handle(b"new", f("PUT", "TOPIC", "t", "", "x"), 0.0))
    assert out[b"old"] == f("MESSAGE", "TOPIC", "t", "", "x")
    assert out[b"new"] == f("MESSAGE", "TOPIC", "t", "SENDER", "anonymous", "", "x")
    ((_, frames),) = core.handle(b"old", f("PING", "ID", "1"), 0.0)
    assert frames[:5] == f("ERROR", "ID", "1", "CODE", "400")


def test_unsupported_version_is_505() -> None:
    core = BrokerCore()
    ((_, frames),) = connect(core, b"a", version="2.0")
    assert frames[:5] == f("ERROR", "ID", "c", "CODE", "505")
    assert b"a" not in core.sessions


def test_sub_is_all_or_nothing_and_limited() -> None:
    core = BrokerCore(CoreSettings(limits=Limits(max_subscriptions=2)))
    connect(core, b"a")
    ((_, bad),) = core.handle(b"a", f("SUB", "ID", "1", "", "ok.1", "bad..pattern"), 0.0)
    assert bad[:5] == f("ERROR", "ID", "1", "CODE", "400")
    assert len(core.subscriptions) == 0
    ((_, over),) = core.handle(b"a", f("SUB", "ID", "2", "", "a", "b", "c"), 0.0)
    assert over[:5] == f("ERROR", "ID", "2", "CODE", "429")
    assert core.handle(b"a", f("SUB", "ID", "3", "", "a", "b", "a"), 0.0) == [(b"a", f("OK", "ID", "3"))]
    assert len(core.subscriptions) == 2


def test_a_routing_id_that_changed_hands_gets_nothing_of_the_old_session() -> None:
    core = BrokerCore()
    connect(core, b"victim", who="alice")
    core.handle(b"victim", f("SUB", "", "secret"), 0.0, "alice")
    ((_, frames),) = core.handle(b"victim", f("UNSUB", "ID", "1", "", "secret"), 0.0, "mallory")
    assert frames[:5] == f("ERROR", "ID", "1", "CODE", "401")
    assert b"victim" not in core.sessions and len(core.subscriptions) == 0  # alice's session is gone
    connect(core, b"pub")
    assert core.handle(b"pub", f("PUT", "TOPIC", "secret", "", "x"), 0.0) == []
    ((_, frames),) = connect(core, b"victim", who="mallory")
    assert frames[:3] == f("OK", "ID", "c")  # mallory may hold the name, with an empty session of her own
    assert core.sessions[b"victim"].identity == "mallory" and not core.pubsub.patterns_of(core.sessions[b"victim"])


def test_a_new_connection_on_a_routing_id_replaces_the_session_and_a_closed_one_goes_at_once() -> None:
    core = BrokerCore()
    core.handle(b"r", f("CONNECT", "VERSION", "1.0", "TTL", "1000"), 0.0, "alice", fd=7)
    core.handle(b"r", f("SUB", "", "t"), 0.0, "alice", fd=7)
    ((_, frames),) = core.handle(b"r", f("NOOP", "ID", "n"), 0.0, "alice", fd=9)  # same name, other connection
    assert frames[:5] == f("ERROR", "ID", "n", "CODE", "401")
    assert len(core.subscriptions) == 0
    core.handle(b"r", f("CONNECT", "VERSION", "1.0", "TTL", "1000"), 0.0, "alice", fd=9)
    core.handle(b"r", f("SUB", "", "t"), 0.0, "alice", fd=9)
    core.connection_closed(7, 0.0)
    assert core.forget_closed(0.0, drained=True) == []  # an old fd: nothing of the new session goes
    assert len(core.subscriptions) == 1
    core.connection_closed(9, 0.0)
    core.forget_closed(0.0, drained=True)
    assert b"r" not in core.sessions and len(core.subscriptions) == 0


def test_what_a_closed_connection_sent_is_handled_before_its_session_goes() -> None:
    # libzmq reports a close while the connection's last messages may still wait
    # in the ROUTER queue: a worker's FINAL must still reach its caller.
    core = BrokerCore()
    core.handle(b"w", f("CONNECT", "VERSION", "1.0", "TTL", "1000"), 0.0, fd=5)
    core.handle(b"w", f("READY", "", "svc"), 0.0, fd=5)
    core.handle(b"c", f("CONNECT", "VERSION", "1.0", "TTL", "1000"), 0.0, fd=6)
    ((_, job),) = core.handle(b"c", f("REQUEST", "SERVICE", "svc", "ID", "r", "", "x"), 0.0, fd=6)
    core.connection_closed(5, 0.1)
    assert core.closing and b"w" in core.sessions
    # The fd number is free at once: a new connection on it binds without being closed later.
    core.handle(b"n", f("CONNECT", "VERSION", "1.0", "TTL", "1000"), 0.1, fd=5)
    ((to, final),) = core.handle(b"w", f("FINAL", "ID", job[job.index(b"ID") + 1], "", "done"), 0.1, fd=5)
    assert to == b"c" and final[:3] == f("FINAL", "ID", "r") and final[-1] == b"done"
    assert core.forget_closed(0.1 + CLOSE_WAIT_LIMIT / 2, drained=False) == []  # not read empty, not overdue
    assert b"w" in core.sessions
    core.forget_closed(0.2, drained=True)
    assert b"w" not in core.sessions and b"n" in core.sessions and not core.closing
    core.connection_closed(5, 0.3)
    core.forget_closed(0.3 + CLOSE_WAIT_LIMIT, drained=False)  # overdue under constant load
    assert b"n" not in core.sessions


def test_the_generated_ids_only_option_refuses_chosen_routing_ids() -> None:
    core = BrokerCore(generated_ids_only=True)  # an embedding's choice; the broker admits chosen ids
    ((_, frames),) = connect(core, b"chosen-name", who="alice")
    assert frames[:5] == f("ERROR", "ID", "c", "CODE", "400")
    assert connect(core, b"\x00\x01\x02\x03\x04", who="alice")[0][1][0] == b"OK"


def test_slow_consumer_is_told_429_and_forgotten_after_a_drop_episode() -> None:
    core = BrokerCore(CoreSettings(slow_consumer_ms=2000))
    connect(core, b"slow")
    core.handle(b"slow", f("SUB", "", "t"), 0.0)
    for i in range(20):
        assert core.send_failed(b"slow", i * 0.1, unreachable=False) == []
    out = core.send_failed(b"slow", 2.0, unreachable=False)
    assert out[0][1][:3] == f("ERROR", "CODE", "429")
    assert out[1] == (b"slow", P.DISCONNECT_FRAMES)
    assert b"slow" not in core.sessions and len(core.subscriptions) == 0
    assert core.counters["dropped"] == 21


def test_drops_separated_by_quiet_gaps_do_not_evict() -> None:
    core = BrokerCore(CoreSettings(slow_consumer_ms=2000))
    connect(core, b"bursty")
    for i in range(10):
        assert core.send_failed(b"bursty", i * 1.5, unreachable=False) == []
    assert b"bursty" in core.sessions


def test_unreachable_peer_is_forgotten() -> None:
    core = BrokerCore()
    connect(core, b"gone")
    core.handle(b"gone", f("SUB", "", "t"), 0.0)
    core.send_failed(b"gone", 0.0, unreachable=True)
    assert b"gone" not in core.sessions and len(core.subscriptions) == 0


def test_the_forgotten_are_taken_once_from_a_list_the_shell_may_hold() -> None:
    core = BrokerCore()
    held = core.forgotten  # the shell's loop tests this list, per message, for work waiting
    for rid in (b"a", b"b"):
        connect(core, rid)
    core.send_failed(b"a", 0.0, unreachable=True)
    assert held == [b"a"]
    core.send_failed(b"b", 0.0, unreachable=True)
    assert core.take_forgotten() == [b"a", b"b"]
    assert core.take_forgotten() == [] and held == [] and core.forgotten is held


def test_reserved_topics_are_forbidden_and_put_needs_a_literal_topic() -> None:
    core = BrokerCore()
    connect(core, b"a")
    ((_, frames),) = core.handle(b"a", f("PUT", "TOPIC", "mc0.sys.peer", "ID", "1", "", "x"), 0.0)
    assert frames[:5] == f("ERROR", "ID", "1", "CODE", "403")
    ((_, frames),) = core.handle(b"a", f("PUT", "TOPIC", "a.*", "ID", "2", "", "x"), 0.0)
    assert frames[:5] == f("ERROR", "ID", "2", "CODE", "400")
    ((_, frames),) = core.handle(b"a", f("PUT", "TOPIC", ".".join(["t"] * 40), "ID", "3", "", "x"), 0.0)
    assert frames[:5] == f("ERROR", "ID", "3", "CODE", "413")


def test_reconnect_starts_a_fresh_session_and_disconnect_forgets() -> None:
    core = BrokerCore()
    connect(core, b"a")
    core.handle(b"a", f("SUB", "", "t"), 0.0)
    connect(core, b"a", now=1.0)
    assert len(core.subscriptions) == 0
    assert core.handle(b"a", f("DISCONNECT", "ID", "d"), 1.0) == [(b"a", f("OK", "ID", "d"))]
    assert b"a" not in core.sessions


def test_shutdown_disconnects_everyone() -> None:
    core = BrokerCore()
    connect(core, b"a")
    connect(core, b"b")
    assert sorted(core.shutdown(0.0)) == [(b"a", P.DISCONNECT_FRAMES), (b"b", P.DISCONNECT_FRAMES)]
    assert core.sessions == {}


@pytest.mark.parametrize("garbage", [[b""], [b"\xff" * 10], [b"PUT"] * 2000, [b"SUB", b"", b"\xfe"]])
def test_garbage_never_raises(garbage: list[bytes]) -> None:
    core = BrokerCore()
    connect(core, b"a")
    ((rid, frames),) = core.handle(b"a", garbage, 0.0)
    assert rid == b"a" and frames[0] == b"ERROR"


def test_an_invalid_repeat_connect_leaves_the_session_alone() -> None:
    core = BrokerCore()
    connect(core, b"a")
    core.handle(b"a", f("SUB", "", "t"), 0.0)
    ((_, frames),) = core.handle(b"a", f("CONNECT", "VERSION", "1.0", "TTL", "soon", "ID", "x"), 0.0)
    assert frames[:5] == f("ERROR", "ID", "x", "CODE", "400")
    ((_, frames),) = connect(core, b"a", version="7.0")
    assert frames[:5] == f("ERROR", "ID", "c", "CODE", "505")
    assert b"a" in core.sessions and len(core.subscriptions) == 1


def test_deliveries_denied_at_delivery_are_neither_sent_nor_counted() -> None:
    from mc0.permissions import Permissions

    policy = Permissions.from_table({"identity": {"bob": {"deny": {"subscribe": ["news.secret"]}}}})
    core = BrokerCore(permissions=policy)
    for who in ("alice", "bob", "pub"):
        connect(core, who.encode(), who=who)
    for who in ("alice", "bob"):
        core.handle(who.encode(), f("SUB", "", "news.*"), 0.0, who)
    out = core.handle(b"pub", f("PUT", "TOPIC", "news.secret", "", "x"), 0.0, "pub")
    assert [rid for rid, _ in out] == [b"alice"]
    assert core.counters["delivered"] == 1
