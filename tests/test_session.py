"""ClientSession without sockets: healing, resubscription, heartbeats, local validation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mc0 import errors
from mc0 import protocol as P
from mc0.message import Message
from mc0.protocol import batch
from mc0.session import (
    Answer,
    ClientSession,
    Connected,
    ConnectRefused,
    Fault,
    Received,
    Reconnecting,
    ReplayEnded,
)


def f(*parts: str | bytes) -> list[bytes]:
    return [p.encode() if isinstance(p, str) else p for p in parts]


def connected(ttl_ms: int = 1000) -> ClientSession:
    session = ClientSession(ttl_ms=ttl_ms)
    frames = session.connect(0.0)
    events, _ = session.receive(f("OK", "ID", frames[-1].decode(), "TTL", str(ttl_ms)), 0.0)
    assert events == [Connected(ttl_ms, healed=False)]
    return session


def test_connect_uses_the_ttl_the_broker_grants() -> None:
    session = ClientSession(ttl_ms=50)
    frames = session.connect(0.0)
    assert frames[:5] == f("CONNECT", "VERSION", "1.0", "TTL", "50")
    session.receive(f("OK", "ID", frames[-1].decode(), "TTL", "200"), 0.0)
    assert session.ttl == 0.2


def test_401_heals_by_reconnecting_then_resubscribing_every_pattern() -> None:
    session = connected()
    session.add_pattern("a.>")
    session.add_pattern("b")
    session.add_pattern("b")  # second local holder: no second SUB
    events, replies = session.receive(f("ERROR", "CODE", "401", "MESSAGE", "who?"), 1.0)
    assert isinstance(events[0], Fault) and isinstance(events[1], Reconnecting)
    assert replies[0][0] == b"CONNECT"
    connect_id = replies[0][-1].decode()
    events, replies = session.receive(f("OK", "ID", connect_id, "TTL", "1000"), 1.1)
    assert events == [Connected(1000, healed=True)]
    assert replies == [f("SUB", "", "a.>", "b")]


def test_broker_disconnect_also_heals() -> None:
    session = connected()
    events, replies = session.receive(f("DISCONNECT"), 1.0)
    assert isinstance(events[0], Reconnecting) and replies[0][0] == b"CONNECT"
    assert not session.connected


def test_heartbeat_after_ttl_of_our_silence_and_heal_after_broker_silence() -> None:
    session = connected(ttl_ms=1000)
    session.sent(0.0)
    assert session.tick(0.4) == ([], [])
    assert session.tick(0.5) == ([], [f("NOOP")])  # HEARTBEAT_FRACTION x TTL: a broker may give up at TTL
    session.sent(1.0)
    session.receive(f("NOOP"), 1.0)
    events, frames = session.tick(4.0)  # 3 x TTL without hearing the broker
    assert isinstance(events[0], Reconnecting) and frames[0][0] == b"CONNECT"


def test_refused_connect_reports_the_remote_error() -> None:
    session = ClientSession()
    frames = session.connect(0.0)
    events, _ = session.receive(f("ERROR", "ID", frames[-1].decode(), "CODE", "505", "MESSAGE", "no"), 0.0)
    assert isinstance(events[0], ConnectRefused)
    assert isinstance(events[0].error, errors.UnsupportedVersion)


def test_messages_route_to_every_matching_local_pattern_once() -> None:
    session = connected()
    session.add_pattern("a.*")
    session.add_pattern("a.>")
    session.add_pattern("z")
    events, _ = session.receive(P.message(b"a.b", b"alice", [b"X-K", b"v"], [b"x"]), 1.0)
    (delivery,) = events
    assert isinstance(delivery, Received)
    assert sorted(delivery.keys) == ["a.*", "a.>"]
    assert delivery.message.sender == "alice" and delivery.message.headers == {"X-K": "v"}


def test_answers_and_faults() -> None:
    session = connected()
    (answer,), _ = session.receive(f("ERROR", "ID", "9", "CODE", "403", "MESSAGE", "no"), 1.0)
    assert isinstance(answer, Answer) and isinstance(answer.error(), errors.Forbidden)
    (fault,), _ = session.receive(f("ERROR", "CODE", "429", "MESSAGE", "slow"), 1.0)
    assert isinstance(fault, Fault) and isinstance(fault.error, errors.OverLimit)
    assert session.receive(f("GARBAGE"), 1.0) == ([], [])
    assert session.malformed == 1


def test_a_replay_the_broker_ended_keeps_its_pattern_and_a_withdrawal_drops_it() -> None:
    """``ERROR ... JOURNAL j TOPIC p`` ends a replay (the SUB stays); ``ERROR ... TOPIC p`` withdraws p."""
    session = connected()
    session.replay_patterns(["a.>"], 1, None, session.new_id())
    reason = "journal main: this broker's copy did not reach seq 9 within 5 s; replay stopped at seq 3"
    (ended,), replies = session.receive(f(*P.replay_ended(504, reason, "main", "a.>")), 1.0)
    assert type(ended) is ReplayEnded and (ended.journal, ended.pattern) == ("main", "a.>")
    assert isinstance(ended.error, errors.DeadlineExceeded) and ended.error.reason == reason
    assert replies == [] and session.patterns == ["a.>"]
    (withdrawn,), _ = session.receive(f(*P.error(403, "withdrawn by policy", topic="a.>")), 1.0)
    assert withdrawn == Fault(withdrawn.error, "a.>") and session.patterns == []


def journaled(topic: str, seq: int) -> list[bytes]:
    return f("MESSAGE", "TOPIC", topic, "SENDER", "alice", "JOURNAL", "main", "SEQ", str(seq), "", "x")


@pytest.mark.parametrize(
    ("ok", "routes"),
    [  # the OK to a SUB FROM; then where records 5, 6, 4 of journal main on a.b go (seq 4 after 6: a late one)
        (("OK", "ID", "7", "JOURNAL", "main", "SEQ", "6"), [(" replay 7",), ("a.>",), ("a.>",)]),
        (("OK", "ID", "7"), [("a.>",), ("a.>",), ("a.>",)]),  # a broker from before: no history named
        (("OK", "ID", "7", "JOURNAL", "other", "SEQ", "6"), [("a.>",), ("a.>",), ("a.>",)]),  # another journal's
        (("ERROR", "ID", "7", "CODE", "410", "MESSAGE", "trimmed"), [("a.>",), ("a.>",), ("a.>",)]),
    ],
)
def test_a_replays_history_is_routed_to_the_replaying_subscription_alone(
    ok: tuple[str, ...], routes: list[tuple[str, ...]]
) -> None:
    """Records before the seq the OK to a SUB FROM names are its history: only the subscription that
    replays gets them (``replay_key``), not another of the pattern that had them live; the first record at
    or past it ends the history."""
    session = connected()
    session.add_pattern("a.>")  # a live subscription, then a replay of the same pattern
    assert session._sub_from(["a.>"], None, 1, "7") == session.replay_patterns(["a.>"], 1, None, "7")
    (answer,), _ = session.receive(f(*ok), 1.0)
    assert isinstance(answer, Answer) and answer.request_id == "7"
    got = [session.receive(journaled("a.b", seq), 1.0)[0][0] for seq in (5, 6, 4)]
    assert [event.keys for event in got if isinstance(event, Received)] == routes


def heal(session: ClientSession) -> list[list[bytes]]:
    """A 401, then the broker's OK to the new CONNECT: what the session sends to resubscribe."""
    _, replies = session.receive(f("ERROR", "CODE", "401", "MESSAGE", "who?"), 1.0)
    _, replies = session.receive(f("OK", "ID", replies[0][-1].decode(), "TTL", "1000"), 1.1)
    return replies


def test_a_resumed_replay_has_an_id_of_its_own_and_its_history_still_goes_to_its_subscription() -> None:
    """After a reconnect the SUB FROM that resumes a replay has a new ID (it had none: no OK said where
    its history ended, and the history reached every subscription of the pattern); the history its OK
    names goes to the subscription that first asked, by that first ID's key."""
    session = connected()
    session.add_pattern("a.>")  # a live subscription, then a replay of the same pattern
    session.replay_patterns(["a.>"], 1, "main", "7")
    session.receive(f("OK", "ID", "7", "JOURNAL", "main", "SEQ", "3"), 1.0)
    session.receive(journaled("a.b", 4), 1.0)  # live, past the history: it resumes FROM 5
    (resumed,) = heal(session)
    assert resumed[:7] == f("SUB", "FROM", "5", "ID", resumed[4].decode(), "JOURNAL", "main")
    new_id = resumed[4].decode()
    assert new_id != "7" and resumed[-2:] == f("", "a.>")
    (answer,), _ = session.receive(f("OK", "ID", new_id, "JOURNAL", "main", "SEQ", "7"), 1.2)
    assert isinstance(answer, Answer)  # (no call waits for it: dropped by the shell)
    got = [session.receive(journaled("a.b", seq), 1.3)[0][0] for seq in (5, 6, 7)]
    assert [event.keys for event in got if isinstance(event, Received)] == [(" replay 7",), (" replay 7",), ("a.>",)]


def test_a_resumed_replay_refused_ends_its_subscription_and_the_pattern_stays_live() -> None:
    """A resumed SUB FROM answered 410 (retention passed where it stood): the broker subscribed nothing,
    so the pattern is subscribed live again and the replaying subscription ends with the reason."""
    session = connected()
    session.add_pattern("a.>")
    session.replay_patterns(["a.>"], 1, "main", "7")
    session.receive(f("OK", "ID", "7", "JOURNAL", "main", "SEQ", "1"), 1.0)
    (resumed,) = heal(session)
    refused = f("ERROR", "ID", resumed[4].decode(), "CODE", "410", "MESSAGE", "journal main: seq 1 was trimmed")
    (ended,), replies = session.receive(refused, 1.2)
    assert type(ended) is ReplayEnded and ended.key == " replay 7" and ended.pattern == "a.>"
    assert isinstance(ended.error, errors.Gone)
    assert replies == [f("SUB", "", "a.>")]


def test_a_replaying_subscription_ended_is_not_resumed_at_the_next_heal() -> None:
    """Its pattern, still held by another subscription, is subscribed live (it was resumed FROM a seq
    nobody wanted any more)."""
    session = connected()
    session.add_pattern("a.>")
    session.replay_patterns(["a.>"], 1, "main", "7")
    session.end_replay(" replay 7")
    session.drop_pattern("a.>")  # (the ended subscription's hold; the other one stays)
    assert heal(session) == [f("SUB", "", "a.>")]


@pytest.mark.parametrize(
    ("ok", "routes"),
    [
        (("OK", "ID", "7", "JOURNAL", "main", "SEQ", "6"), [(" replay 7",), ("a.>",), ("a.>",)]),
        (("OK", "ID", "7"), [("a.>",), ("a.>",), ("a.>",)]),
    ],
)
def test_a_replays_history_is_routed_alike_when_its_records_come_batched(
    ok: tuple[str, ...], routes: list[tuple[str, ...]]
) -> None:
    """The journaled copies' shortcut (``batch.journaled_message_fields``) routes a replay's history as
    the general path does, and keeps where a resumed replay would start."""
    session = connected()
    session.add_pattern("a.>")
    session.replay_patterns(["a.>"], 1, None, "7")
    session.receive(f(*ok), 1.0)
    runs: list[tuple[list[int | None], tuple[str, ...]]] = []
    for seq in (5, 6, 4):
        blob = batch.journaled_message_record(b"a.b", b"alice", b"main", seq, b"x")
        session.receive_batch(blob, 1.0, lambda run, keys: runs.append(([m.seq for m in run], keys)))
    assert runs == [([5], routes[0]), ([6], routes[1]), ([4], routes[2])]
    assert session._resume["a.>"] == ("main", 5)  # (the last record seen: a resumed replay goes on after it)


@settings(max_examples=300, deadline=None)
@given(
    topic=st.binary(min_size=1, max_size=40),
    sender=st.binary(max_size=40),
    journal=st.binary(min_size=1, max_size=20),
    seq=st.integers(min_value=0, max_value=10**18 - 1),
    data=st.binary(max_size=200),
    frames=st.lists(st.binary(max_size=12), min_size=11, max_size=11),
)
def test_journaled_message_fields_reads_exactly_the_records_of_that_shape(
    topic: bytes, sender: bytes, journal: bytes, seq: int, data: bytes, frames: list[bytes]
) -> None:
    record = batch.journaled_message_record(topic, sender, journal, seq, data)
    expected = (topic, sender, journal, seq, data) if journal.isascii() else None
    assert batch.journaled_message_fields(record, 5, len(record)) == expected
    other = batch.frames_record(frames)  # any eleven frames: read only when they are that MESSAGE
    read = batch.journaled_message_fields(other, 5, len(other))
    if read is not None:
        topic, sender, journal, seq, data = read
        assert (
            batch.frames_of(other, batch.FRAMES, 5, len(other))[:8]
            == P.message(topic, sender, [], [data], (journal, seq))[:8]
        )
        assert frames[8].isdigit() and int(frames[8]) == seq and frames[10] == data


@pytest.mark.parametrize(
    ("topic", "body", "headers", "error"),
    [
        ("a.*", b"x", None, errors.InvalidTopic),
        ("", b"x", None, errors.InvalidTopic),
        ("a", [], None, errors.ProtocolError),
        ("a", b"x", {"Trace": "1"}, errors.ProtocolError),
        ("a", b"x" * (8 * 1024 * 1024 + 1), None, errors.ProtocolError),
        ("a", [b"x"] * 2000, None, errors.ProtocolError),
    ],
)
def test_publish_misuse_raises_locally(topic: str, body: object, headers: dict[str, str] | None, error: type) -> None:
    with pytest.raises(error):
        ClientSession().publish(topic, body, headers)  # type: ignore[arg-type]


def test_a_batch_delivers_its_messages_in_order_whatever_their_record_shape() -> None:
    """A MESSAGE with headers travels as a FRAMES record, one without as a shortcut: the
    application still sees them in the order the broker sent them (regression: the demo's
    `created` then `audit` arrived swapped)."""
    session = connected()
    session.add_pattern("a.>")
    blob = b"".join(
        [
            batch.record_of(P.message(b"a.one", b"alice", [b"X-Trace", b"t"], [b"1"])),
            batch.message_record(b"a.two", b"alice", b"2"),
            batch.record_of(P.message(b"a.three", b"alice", [b"X-Trace", b"t"], [b"3"])),
            batch.message_record(b"a.four", b"alice", b"4"),
        ]
    )
    assert [code for code, _, _ in batch.records(blob)] == [batch.FRAMES, batch.MESSAGE] * 2
    delivered: list[tuple[str, bytes]] = []
    events, replies = session.receive_batch(
        blob, 1.0, lambda run, _keys: delivered.extend((m.topic, m.body) for m in run)
    )
    assert delivered == [("a.one", b"1"), ("a.two", b"2"), ("a.three", b"3"), ("a.four", b"4")]
    assert events == [] and replies == []


def test_a_batch_hands_over_each_run_of_messages_for_the_same_subscriptions_in_one_call() -> None:
    session = connected()
    session.add_pattern("a.*")
    session.add_pattern("b")
    records = [batch.message_record(topic, b"alice", b"%d" % i) for i, topic in enumerate([b"a.x", b"a.x", b"b"])]
    records.append(batch.record_of(P.message(b"b", b"alice", [b"X-Trace", b"t"], [b"3"])))  # the general shape
    records += [batch.message_record(b"a.y", b"alice", b"4"), batch.message_record(b"a.y", b"alice", b"5")]
    runs: list[tuple[list[bytes], tuple[str, ...]]] = []
    session.receive_batch(b"".join(records), 1.0, lambda run, keys: runs.append(([m.body for m in run], keys)))
    assert runs == [([b"0", b"1"], ("a.*",)), ([b"2", b"3"], ("b",)), ([b"4", b"5"], ("a.*",))]
    runs.clear()
    session.receive_batch(
        b"".join(records[:2]) + b"\x05\x00\x00", 2.0, lambda run, keys: runs.append(([m.body for m in run], keys))
    )
    assert runs == [([b"0", b"1"], ("a.*",))] and session.malformed == 1  # what came before a bad record


def test_a_queue_group_copy_takes_its_shortcut_and_matches_the_general_path() -> None:
    """A group member's copy (a FRAMES record of one shape) is decoded by a shortcut: the same
    message and local subscriptions as the general path, the cache following subscription changes."""
    session = connected()
    session.add_pattern("g.>", group="workers")
    session.add_pattern("g.*", group="others")
    session.add_pattern("g.>")  # a plain subscription never gets a group's copy
    plain_copy = batch.group_message_record(b"g.x", b"alice", b"workers", b"1")
    with_headers = batch.record_of(P.message(b"g.x", b"alice", [b"X-Trace", b"t"], [b"2"], group=b"workers"))
    assert batch.group_message_fields(plain_copy, 5, len(plain_copy)) == (b"g.x", b"alice", b"workers", b"1")
    assert batch.group_message_fields(with_headers, 5, len(with_headers)) is None  # not the shape: general path
    delivered: list[tuple[object, tuple[str, ...]]] = []

    def deliver(run: list[Message], patterns: tuple[str, ...]) -> None:
        delivered.extend((message, patterns) for message in run)

    session.receive_batch(plain_copy + with_headers, 1.0, deliver)
    (fast, fast_patterns), (general, general_patterns) = delivered
    assert (fast.topic, fast.body, fast.sender, fast.group, fast.headers) == ("g.x", b"1", "alice", "workers", {})
    assert (general.topic, general.group, general.headers) == ("g.x", "workers", {"X-Trace": "t"})
    assert fast_patterns == general_patterns == ("g.> workers",)
    session.add_pattern("g.x", group="workers")  # the cache must follow
    delivered.clear()
    session.receive_batch(plain_copy, 2.0, deliver)
    assert sorted(delivered[0][1]) == ["g.> workers", "g.x workers"]
    session.drop_pattern("g.>", "workers")
    session.drop_pattern("g.x", "workers")
    delivered.clear()
    session.receive_batch(plain_copy, 3.0, deliver)
    assert delivered[0][1] == ()  # no subscription of that group left: nobody local gets it


@pytest.mark.parametrize(
    ("record", "frames"),
    [
        (batch.message_record(b"a.b", b"alice", b"1"), P.message(b"a.b", b"alice", [], [b"1"])),
        (batch.message_record(b"z", b"", b""), P.message(b"z", b"", [], [b""])),
        (
            batch.group_message_record(b"a.b", b"alice", b"workers", b"1"),
            P.message(b"a.b", b"alice", [], [b"1"], group=b"workers"),
        ),
        (batch.message_record(b"a..b", b"alice", b"1"), P.message(b"a..b", b"alice", [], [b"1"])),  # no pattern
        (
            batch.journaled_message_record(b"a.b", b"alice", b"main", 7, b"1"),
            P.message(b"a.b", b"alice", [], [b"1"], (b"main", 7)),
        ),
    ],
)
def test_a_message_is_the_same_message_for_the_same_subscriptions_whatever_its_shape(
    record: bytes, frames: list[bytes]
) -> None:
    """A shortcut record, the same MESSAGE as a FRAMES record, and as an unbatched message: one
    Message, equal field for field, for the same local subscriptions."""
    session = connected()
    for pattern, group in (("a.*", None), ("a.>", None), ("z", None), ("a.>", "workers"), ("b", "workers")):
        session.add_pattern(pattern, group=group)
    seen: list[tuple[object, tuple[str, ...]]] = []

    def deliver(run: list[Message], keys: tuple[str, ...]) -> None:
        seen.extend((message, keys) for message in run)

    session.receive_batch(record, 1.0, deliver)
    session.receive_batch(batch.frames_record(frames), 1.0, deliver)
    (delivery,), _ = session.receive(frames, 1.0)
    assert isinstance(delivery, Received)
    seen.append((delivery.message, delivery.keys))
    assert len(seen) == 3 and seen[0] == seen[1] == seen[2], seen
    assert session.malformed == 0


GOOD_BLOB = b"".join(
    [
        batch.message_record(b"a.b", b"alice", b"1"),
        batch.group_message_record(b"a.b", b"alice", b"workers", b"2"),
        batch.journaled_message_record(b"a.b", b"alice", b"main", 12, b"2"),
        batch.record_of(P.message(b"a.b", b"alice", [b"X-T", b"t"], [b"3"])),
        batch.reply_record(True, b"7", b"f"),
        batch.work_record(b"svc", b"9", b"bob", 50, b"w"),
        batch.ok_record(b"1"),
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.tuples(st.integers(0, len(GOOD_BLOB) - 1), st.integers(0, 255)).map(
            lambda at: GOOD_BLOB[: at[0]] + bytes([at[1]]) + GOOD_BLOB[at[0] + 1 :]
        ),
        st.integers(0, len(GOOD_BLOB)).map(lambda n: GOOD_BLOB[:n]),
    )
)
def test_no_batch_from_the_broker_breaks_the_session(blob: bytes) -> None:
    """Any blob, random or a good one cut or with one byte changed, is decoded or counted as
    malformed (once per blob at most): nothing raises, and the session stays usable."""
    session = connected()
    session.add_pattern("a.>")
    session.add_pattern("a.>", group="workers")
    delivered: list[object] = []
    session.receive_batch(blob, 1.0, lambda run, keys: delivered.extend(run))
    assert session.malformed <= 1
    session.receive_batch(GOOD_BLOB, 2.0, lambda run, keys: delivered.extend(run))
    assert session.malformed <= 1 and session.connected
