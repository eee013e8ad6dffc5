"""Heartbeats and expiry from deadlines (mc0.broker.core.peers: ``PeerTable.sweep``, the looks heap):
what a sweep costs is the peers due, and what it decides is what the walk over every peer decided."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.core.peers import LOOKS_SLACK, MIN_SWEEP_INTERVAL

from .test_core import connect, f


def test_a_turn_with_nothing_due_looks_at_no_peer_whatever_their_number() -> None:
    for n in (100, 10_000):
        core = BrokerCore()
        for i in range(n):
            connect(core, b"p%d" % i, now=0.0, ttl=10_000)  # beat 5 s, expiry 30 s
        peers = core.peers
        assert peers.watched == n and peers.next_sweep == 5.0
        for now in (0.5, 1.0, 2.5, 4.9):
            assert core.tick(now) == [] and peers.looks_taken == 0  # nothing due: nothing looked at
        beats = core.tick(5.0)
        assert len(beats) == n and peers.looks_taken == n  # each due peer once
        assert core.tick(7.0) == [] and peers.looks_taken == n
        assert peers.next_sweep == 10.0


def test_a_peer_sent_something_since_its_look_was_set_gets_no_heartbeat_and_is_looked_at_again_later() -> None:
    core = BrokerCore()
    connect(core, b"quiet", ttl=1000)
    connect(core, b"busy", ttl=1000)
    core.handle(b"busy", f("SUB", "", "t"), 0.0)
    core.handle(b"quiet", f("PUT", "TOPIC", "t", "", "x"), 0.3)  # the broker sends busy a MESSAGE at 0.3
    assert core.tick(0.5) == [(b"quiet", P.NOOP_FRAMES)]  # busy's look came and found it spoken to
    assert core.peers.next_sweep == 0.8  # ... put back at its real heartbeat
    assert core.tick(0.8) == [(b"busy", P.NOOP_FRAMES)]


def test_forgotten_peers_looks_are_skipped_and_the_heap_stays_bounded_under_churn() -> None:
    core = BrokerCore()
    for i in range(3 * LOOKS_SLACK):
        connect(core, b"c", now=i * 0.001, ttl=60_000)  # the same routing id reconnecting: a new peer each time
        core.handle(b"c", f("DISCONNECT"), i * 0.001)
    peers = core.peers
    assert len(peers) == 0 and peers.watched == 0
    assert len(peers._looks) <= LOOKS_SLACK + 1  # (stale looks dropped when they outnumber the live)
    assert peers.next_sweep == float("inf")  # every look left is stale
    assert core.tick(100.0) == [] and peers.looks_taken == 0


# One step of a lifecycle: (what, which peer, how many tenths of a second later).
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["connect", "hear", "send", "disconnect", "tick", "tick", "tick"]),
        st.integers(0, 3),
        st.integers(0, 7),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(STEPS, st.sampled_from([200, 500, 1000]))
@example([("connect", 0, 0), ("tick", 0, 1), ("tick", 0, 2)], 200)  # a look put back late misses a beat
def test_sweeps_from_deadlines_decide_what_a_walk_over_every_peer_decides(
    steps: list[tuple[str, int, int]], ttl: int
) -> None:
    """After every tick, as the walk guaranteed: no peer is known past its liveness x TTL of silence
    (by more than one sweep interval), none was expired before it; no peer went without anything
    sent for longer than its beat (and one sweep interval), and no heartbeat went to a peer spoken to
    within its beat."""
    liveness = 3
    core = BrokerCore(CoreSettings(liveness=liveness))
    peers = core.peers
    now = 0.0
    slack = MIN_SWEEP_INTERVAL + 1e-9
    core.handle(b"sub", f("CONNECT", "VERSION", "1.0"), 0.0)  # named no TTL: never expired
    core.handle(b"sub", f("SUB", "", "t.>"), 0.0)
    for what, who, later in steps:
        now += later / 10
        rid = b"p%d" % who
        peer = peers.get(rid)
        if what == "connect" and peer is None:
            connect(core, rid, now=now, ttl=ttl)
        elif what == "hear" and peer is not None:
            core.handle(rid, f("NOOP"), now)
        elif what == "send" and peer is not None:
            core.handle(rid, f("SUB", "", f"t.{who}"), now)
            core.handle(b"sub", f("PUT", "TOPIC", f"t.{who}", "", "x"), now)  # the broker sends rid a MESSAGE
        elif what == "disconnect" and peer is not None:
            core.handle(rid, f("DISCONNECT"), now)
        elif what == "tick":
            before = {p.routing_id: (p.last_sent, p.last_recv) for p in peers.by_id.values()}
            # When the walk would have swept: the earliest heartbeat or expiry of any peer, read from the
            # peers themselves (never from the looks under test), at most once per sweep interval.
            earliest = min(
                (min(p.last_sent + p.beat, p.last_recv + p.ttl * liveness if p.expires else 1e18)
                 for p in peers.by_id.values()),
                default=1e18,
            )  # fmt: skip
            deadline = max(earliest, peers._swept + MIN_SWEEP_INTERVAL)
            out = core.tick(now)
            beaten = {rid for rid, frames in out if frames == P.NOOP_FRAMES}
            for rid in beaten:
                assert now - before[rid][0] >= peers.get(rid).beat - 1e-9  # type: ignore[union-attr]
            for rid, (_, last_recv) in before.items():
                if rid not in peers.by_id:  # expired at this tick
                    assert now - last_recv >= ttl / 1000 * liveness - 1e-9
            if now >= deadline:
                for p in peers.by_id.values():
                    if p.expires:
                        assert now - p.last_recv < p.ttl * liveness + slack
                    assert now - p.last_sent < p.beat + slack
        assert peers.watched == len(peers)


def test_a_bare_noop_is_heard_and_answered_as_the_verb_table_answers_it() -> None:
    core = BrokerCore()
    connect(core, b"a", now=0.0)
    core.handle(b"e", f("", "CONNECT", "VERSION", "0.3", "TTL", "1000"), 0.0)  # an enveloped (mc0d-era) session
    peer = core.peers.get(b"a")
    assert peer is not None
    assert core.handle(b"a", f("NOOP"), 1.0) == []  # heard, nothing to answer
    assert (peer.last_recv, peer.msgs_in) == (1.0, 1)
    assert core.handle(b"a", f("NOOP", "ID", "7"), 1.1) == [(b"a", f("OK", "ID", "7"))]  # an ID: answered
    assert core.handle(b"e", f("", "NOOP"), 1.2) == []
    ((rid, frames),) = core.handle(b"e", f("NOOP"), 1.3)  # not in its session's framing: refused as before
    assert rid == b"e" and b"ERROR" in frames and b"keep its framing" in b" ".join(frames)
