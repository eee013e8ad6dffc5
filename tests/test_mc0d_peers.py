"""Seed 004 as the original mc0d peers speak it, in the core (no sockets, time an argument):
the envelope, CONNECT's defaults, exact 0.x topics and how they meet 1.0 topics, heartbeats
under the peer's TTL, and what a session bound to (routing id, identity, connection) keeps.
The same peers against a real broker: tests/test_mc0d_peers_live.py."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.dialects import recognise
from mc0.permissions import Permissions
from mc0.topics import seed_topic

E = b""  # the envelope frame


def f(*parts: str | bytes) -> list[bytes]:
    return [p.encode() if isinstance(p, str) else p for p in parts]


def frames_of(out: Sequence[tuple[bytes, object]], who: bytes) -> list[list[bytes]]:
    """What the core hands the shell for ``who``."""
    return [list(payload) for rid, payload in out if rid == who]  # type: ignore[call-overload]


def wire(core: BrokerCore, out: Sequence[tuple[bytes, object]], who: bytes) -> list[list[bytes]]:
    """What ``who`` receives: the shell frames each message for a known peer's session (Peer.framed)."""
    peer = core.sessions.get(who)
    return [list(peer.framed(f) if peer is not None else f) for f in frames_of(out, who)]


FRAMINGS = {"bare": [], "enveloped": [E]}


# (what a fresh peer sends, in order; what it gets back for the last one, without envelope)
CONNECTS = [
    (f("CONNECT", "ID", "chattyClient 0"), [f("OK", "ID", "chattyClient 0", "TTL", "5000")]),  # mc0torture
    (f("CONNECT", "VERSION", "0.2", "ID", "c"), [f("OK", "ID", "c", "TTL", "5000")]),  # the connector, no TTL
    (f("CONNECT", "TTL", "2000", "ID", "c"), [f("OK", "ID", "c", "TTL", "2000")]),  # no VERSION: 0.1
    (f("CONNECT", "VERSION", "0.3", "TTL", "1", "ID", "c"), [f("OK", "ID", "c", "TTL", "100")]),  # clamped
    (f("CONNECT", "VERSION", "0.9", "ID", "c"), [f("ERROR", "ID", "c", "CODE", "505")]),
    (f("CONNECT", "VERSION", "1.0", "TTL", "soon", "ID", "c"), [f("ERROR", "ID", "c", "CODE", "400")]),
    (f("NOOP", "ID", "n"), [f("ERROR", "ID", "n", "CODE", "401")]),  # not connected
    (f("DISCONNECT", "ID", "d"), [f("OK", "ID", "d")]),  # an unknown peer's DISCONNECT: acknowledged
    ([], [f("ERROR", "CODE", "400")]),  # "" alone: an enveloped empty message
]


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize(("sent", "expected"), CONNECTS)
def test_connect_and_its_answers_in_both_framings(framing: str, sent: list[bytes], expected: list[list[bytes]]) -> None:
    if not sent and framing == "bare":
        return  # a zero-frame message cannot exist
    prefix = FRAMINGS[framing]
    core = BrokerCore()
    answers = wire(core, core.handle(b"p", prefix + sent, 0.0), b"p")
    assert [a[: len(prefix) + len(e)] for a, e in zip(answers, expected, strict=True)] == [prefix + e for e in expected]


def test_connect_defaults_the_version_to_the_oldest_and_never_expires_a_peer_that_named_no_ttl() -> None:
    core = BrokerCore(CoreSettings(liveness=3))
    core.handle(b"torture", f("", "CONNECT", "ID", "t"), 0.0)
    core.handle(b"timed", f("", "CONNECT", "VERSION", "0.3", "TTL", "1000", "ID", "c"), 0.0)
    torture, timed = core.sessions[b"torture"], core.sessions[b"timed"]
    assert (torture.version, torture.ttl, torture.expires, torture.legacy) == ("0.1", 5.0, False, True)
    assert (timed.version, timed.expires) == ("0.3", True)
    core.tick(3.5)  # > liveness x 1 s of silence from both
    assert b"timed" not in core.sessions and b"torture" in core.sessions
    beats = core.tick(100.0)  # silent for 100 s: still there, still heartbeated
    assert b"torture" in core.sessions and wire(core, beats, b"torture") == [[E, b"NOOP"]]


def test_heartbeats_leave_at_half_the_ttl_of_the_brokers_silence_and_never_for_a_busy_peer() -> None:
    core = BrokerCore()
    assert core.tick(0.0) == []  # nobody yet: the next sweep is a second away ...
    core.handle(b"e", f("", "CONNECT", "VERSION", "0.3", "TTL", "1000"), 0.0)  # ... a newcomer brings it forward
    core.handle(b"b", f("CONNECT", "VERSION", "1.0", "TTL", "1000"), 0.0)
    assert core.tick(0.45) == []
    beats = core.tick(0.5)
    # The core hands the shell plain NOOPs for known peers; the shell frames them per session.
    assert sorted(beats) == [(b"b", P.NOOP_FRAMES), (b"e", P.NOOP_FRAMES)]
    assert core.sessions[b"e"].framed(P.NOOP_FRAMES) == [E, b"NOOP"]
    assert core.sessions[b"b"].framed(P.NOOP_FRAMES) == P.NOOP_FRAMES
    core.handle(b"b", f("NOOP", "ID", "x"), 0.9)  # answered: the broker spoke to b at 0.9
    beats = core.tick(1.0)
    assert beats == [(b"e", P.NOOP_FRAMES)]
    assert core.tick(1.4) == [(b"b", P.NOOP_FRAMES)]


def test_the_framing_belongs_to_the_session_and_a_connect_may_change_it() -> None:
    core = BrokerCore()
    core.handle(b"p", f("", "CONNECT", "ID", "c"), 0.0)
    assert core.sessions[b"p"].enveloped
    core.handle(b"p", f("", "CONNECT", "VERSION", "0.3", "TTL", "1000"), 0.0)  # again, in its own framing
    assert core.sessions[b"p"].enveloped and core.sessions[b"p"].version == "0.3"
    ((_, answer),) = core.handle(b"p", f("NOOP", "ID", "bare"), 0.0)
    assert list(answer)[:5] == f("ERROR", "ID", "bare", "CODE", "400")  # framed by the shell: enveloped
    ((_, answer),) = core.handle(b"p", f("CONNECT", "VERSION", "1.0", "TTL", "1000", "ID", "c2"), 0.0)
    assert not core.sessions[b"p"].enveloped and list(answer)[:3] == f("OK", "ID", "c2")
    assert core.handle(b"p", f("", "DISCONNECT", "ID", "bye"), 0.0) == [(b"p", f("ERROR", "ID", "bye", "CODE", "400",
        "MESSAGE", "this session was opened without an empty first frame: keep its framing"))]  # fmt: skip


def test_what_the_core_says_to_a_peer_it_no_longer_tracks_carries_the_envelope_itself() -> None:
    core = BrokerCore(CoreSettings(slow_consumer_ms=1))
    core.handle(b"p", f("", "CONNECT", "ID", "c"), 0.0)
    assert core.handle(b"p", f("", "DISCONNECT", "ID", "bye"), 0.0) == [(b"p", f("", "OK", "ID", "bye"))]
    core.handle(b"slow", f("", "CONNECT", "ID", "c"), 0.0)
    core.send_failed(b"slow", 0.0, unreachable=False)
    last = frames_of(core.send_failed(b"slow", 0.1, unreachable=False), b"slow")
    assert [frames[:5] for frames in last] == [f("", "ERROR", "CODE", "429", "MESSAGE"), f("", "DISCONNECT")]
    core.handle(b"r", f("", "CONNECT", "ID", "c"), 0.0, "rita")
    ((_, revoked),) = core.revoke({"rita"}, 0.0)
    assert list(revoked)[:4] == f("", "ERROR", "CODE", "401")
    core.handle(b"s", f("", "CONNECT", "ID", "c"), 0.0)
    core.handle(b"t", f("CONNECT", "ID", "c"), 0.0)
    assert sorted(core.shutdown(0.0)) == [(b"s", f("", "DISCONNECT")), (b"t", P.DISCONNECT_FRAMES)]


def test_an_enveloped_session_is_not_batched_and_foreign_dialects_keep_their_empty_frame() -> None:
    core = BrokerCore(dialects=recognise)
    out = core.handle(b"p", f("", "CONNECT", "VERSION", "1.0", "TTL", "1000", "BATCH", "1", "ID", "c"), 0.0)
    assert wire(core, out, b"p") == [f("", "OK", "ID", "c", "TTL", "1000")] and not core.sessions[b"p"].batched
    # MDP (REQ-style), eMQP and DCP messages also start with an empty frame: still theirs.
    core.handle(b"w", f("", "MDPW02", b"\x01", "echo"), 0.0)
    core.handle(b"e", f("", "eMQP/1.0", "INFORM", "m1", "jobs"), 0.0)
    core.handle(b"d", f("", b"DGBX\x01", b"\x01", "svc"), 0.0)
    kinds = {rid: peer.dialect.name for rid, peer in core.sessions.items()}
    assert kinds == {b"p": "mc0", b"w": "mdp-worker", b"e": "emqp-worker", b"d": "dcp-worker"}


# ---------------------------------------------------------------- topics: exact strings for 0.x
SEED_TOPICS = [
    ("a.b", ("a", "b")),  # a 1.0 topic: the same topic for both
    ("mcollective.discovery", ("mcollective", "discovery")),
    ("mcollective discovery", ()),  # whitespace: opaque, exact
    ("mcollective reply client-0 4242", ()),
    ("a.*", ()),  # a 1.0 pattern is not a 0.x wildcard: the literal string
    ("a.>", ()),
    ("a..b", ()),
    (".", ()),
    ("x" * 1024, ("x" * 1024,)),
]


@pytest.mark.parametrize(("topic", "tokens"), SEED_TOPICS)
def test_seed_topics_are_1_0_topics_when_they_can_be_and_opaque_otherwise(topic: str, tokens: tuple[str, ...]) -> None:
    assert seed_topic(topic) == tokens


@pytest.mark.parametrize("topic", ["", "y" * 1025, "é" * 513])
def test_seed_topics_are_bounded(topic: str) -> None:
    with pytest.raises(Exception, match="empty|longer than"):
        seed_topic(topic)


def connect_pair(core: BrokerCore) -> None:
    core.handle(b"old", f("", "CONNECT", "VERSION", "0.3", "TTL", "5000"), 0.0)
    core.handle(b"bare", f("CONNECT", "VERSION", "0.1", "TTL", "5000"), 0.0)
    core.handle(b"new", f("CONNECT", "VERSION", "1.0", "TTL", "5000"), 0.0)


# (subscriber, its SUB patterns), (publisher, PUT topic) -> who gets the MESSAGE
MEETINGS = [
    ("old", "mcollective discovery", "bare", "mcollective discovery", True),
    ("bare", "mcollective discovery", "old", "mcollective discovery", True),
    ("old", "mcollective discovery", "old", "mcollective  discovery", False),  # exact: two spaces differ
    ("old", "a.b", "new", "a.b", True),  # a topic valid in both reaches both
    ("new", "a.b", "old", "a.b", True),
    ("new", "a.*", "old", "a.b", True),  # a 1.0 wildcard reaches a 0.x publisher's topic
    ("new", ">", "old", "a.b", True),
    ("old", "a.*", "new", "a.b", False),  # a 0.x SUB has no wildcards
    ("old", "a.*", "old", "a.*", True),  # ... it is the string "a.*"
    ("new", ">", "old", "mcollective discovery", False),  # an opaque topic is not a 1.0 topic
    ("old", "a.>", "old", "a.b", False),
]


@pytest.mark.parametrize(("sub", "pattern", "pub", "topic", "delivered"), MEETINGS)
def test_how_0x_and_1_0_topics_meet(sub: str, pattern: str, pub: str, topic: str, delivered: bool) -> None:
    core = BrokerCore()
    connect_pair(core)
    sub_id, pub_id = sub.encode(), pub.encode()
    core.handle(sub_id, FRAMINGS["enveloped" if sub == "old" else "bare"] + f("SUB", "", pattern), 0.0)
    put = f("PUT", "TOPIC", topic, "X-REPLY-TO", "mcollective reply client-0 4242", "", "body")
    out = core.handle(pub_id, FRAMINGS["enveloped" if pub == "old" else "bare"] + put, 0.0)
    got = frames_of(out, sub_id)
    if not delivered:
        assert got == []
        return
    sender = [] if sub != "new" else f("SENDER", "anonymous")
    assert got == [f("MESSAGE", "TOPIC", topic, *sender, "X-REPLY-TO", "mcollective reply client-0 4242", "", "body")]


def test_opaque_topics_need_an_identity_free_to_use_any_topic() -> None:
    permissions = Permissions.from_table(
        {
            "identity": {
                "free": {},
                "scoped": {"publish": ["mcollective.>"], "subscribe": ["mcollective.>"]},
                "denied": {"deny": {"subscribe": ["secret.>"]}},
            }
        }
    )
    core = BrokerCore(permissions=permissions)
    for who in ("free", "scoped", "denied"):
        core.handle(who.encode(), f("CONNECT", "VERSION", "0.3", "TTL", "1000"), 0.0, who)

    def verdict(who: str, *frames: str) -> str:
        """OK, or the ERROR's code: the last thing ``who`` is sent (a MESSAGE to itself may come first)."""
        last = frames_of(core.handle(who.encode(), f(*frames), 0.0, who), who.encode())[-1]
        return "OK" if last[0] == b"OK" else last[4].decode()

    assert verdict("free", "SUB", "ID", "i", "", "mcollective discovery") == "OK"
    assert verdict("scoped", "SUB", "ID", "i", "", "mcollective.discovery") == "OK"  # a 1.0 topic: its grant applies
    assert verdict("scoped", "SUB", "ID", "i", "", "mcollective discovery") == "403"  # no tokens to match a grant
    assert verdict("denied", "SUB", "ID", "i", "", "mcollective discovery") == "403"  # a deny could be meant for it
    assert verdict("free", "PUT", "TOPIC", "mcollective discovery", "ID", "i", "", "x") == "OK"
    assert verdict("scoped", "PUT", "TOPIC", "mcollective discovery", "ID", "i", "", "x") == "403"
    assert verdict("free", "PUT", "TOPIC", "mc0.sys. peer", "ID", "i", "", "x") == "403"  # the broker's prefix


def test_opaque_subscriptions_count_report_and_go_with_their_peer() -> None:
    core = BrokerCore(CoreSettings(limits=P.Limits(max_subscriptions=2)))
    core.handle(b"old", f("", "CONNECT", "ID", "c"), 0.0)
    assert frames_of(core.handle(b"old", f("", "SUB", "ID", "s", "", "a b", "c d", "e f"), 0.0), b"old")[0][:5] == f(
        "ERROR", "ID", "s", "CODE", "429"
    )
    core.handle(b"old", f("", "SUB", "", "a b", "a.b"), 0.0)
    assert core.pubsub.report() == {"a.b": 1, "a b": 1}
    assert core.pubsub.patterns_of(core.sessions[b"old"]) == ["a b", "a.b"]
    core.handle(b"old", f("", "UNSUB", "", "a b"), 0.0)
    assert core.pubsub.report() == {"a.b": 1}
    core.handle(b"old", f("", "SUB", "", "a b"), 0.0)
    core.handle(b"old", f("", "DISCONNECT"), 0.0)
    assert core.pubsub.report() == {}
    core.handle(b"pub", f("CONNECT", "ID", "c"), 0.0)
    assert core.handle(b"pub", f("PUT", "TOPIC", "a b", "", "x"), 0.0) == []
