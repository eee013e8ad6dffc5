"""Queue groups and ECHO 0 in the broker core: no sockets, time is an argument."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.permissions import Permissions
from mc0.protocol import Limits, batch


def f(*parts: str | bytes) -> list[bytes]:
    return [p.encode() if isinstance(p, str) else p for p in parts]


def connect(core: BrokerCore, rid: bytes, *extra: str, version: str = "1.0", who: str = "anonymous") -> list[bytes]:
    ((_, answer),) = core.handle(rid, f("CONNECT", "VERSION", version, "TTL", "1000", *extra, "ID", "c"), 0.0, who)
    return answer


def frames_of(item: object) -> list[bytes]:
    if isinstance(item, bytes):  # a batched peer's record
        ((code, start, end),) = batch.records(item)
        return batch.frames_of(item, code, start, end)
    assert isinstance(item, list)
    return item


def records(item: object) -> list[list[bytes]]:
    """The commands in what the core handed out for one peer (a batched peer's records are joined)."""
    if isinstance(item, bytes):
        return [batch.frames_of(item, code, start, end) for code, start, end in batch.records(item)]
    assert isinstance(item, list)
    return [item]


def deliveries(out: list[tuple[bytes, object]]) -> list[tuple[bytes, list[bytes]]]:
    return [(rid, frames_of(item)) for rid, item in out if frames_of(item)[0] == b"MESSAGE"]


def code_of(out: list[tuple[bytes, object]]) -> str:
    ((_, frames),) = out
    frames = frames_of(frames)
    return frames[frames.index(b"CODE") + 1].decode() if frames[0] == b"ERROR" else frames[0].decode()


# Each row: who sends what after CONNECT (version), and the answer's code ("OK" or a status).
SUBSCRIBE_CASES = [
    ("1.0", f("SUB", "GROUP", "billing", "ID", "1", "", "orders.>"), "OK"),
    ("1.0", f("SUB", "GROUP", "billing", "ID", "1", "", "orders.>", "refunds.*"), "OK"),
    ("1.0", f("SUB", "GROUP", "büro.ß", "ID", "1", "", "orders.>"), "OK"),
    ("1.0", f("UNSUB", "GROUP", "billing", "ID", "1", "", "never.held"), "OK"),
    ("1.0", f("SUB", "GROUP", "bill ing", "ID", "1", "", "orders.>"), "400"),
    ("1.0", f("SUB", "GROUP", "", "ID", "1", "", "orders.>"), "400"),
    ("1.0", f("SUB", "GROUP", "g" * 256, "ID", "1", "", "orders.>"), "400"),
    ("1.0", f("SUB", "GROUP", "billing", "FROM", "0", "ID", "1", "", "orders.>"), "400"),
    ("1.0", f("SUB", "GROUP", "billing", "ID", "1", "", "orders..x"), "400"),
    ("1.0", f("SUB", "GROUP", "billing", "ID", "1", "", "secret.>"), "403"),
    ("0.3", f("SUB", "GROUP", "billing", "ID", "1", "", "orders.>"), "400"),
    ("1.0", f("SUB", "GROUP", "billing", "ID", "1", "", *[f"t.{i}" for i in range(9)]), "429"),
]


@pytest.mark.parametrize(("version", "frames", "expected"), SUBSCRIBE_CASES)
def test_sub_group_table(version: str, frames: list[bytes], expected: str) -> None:
    permissions = Permissions.from_table({"default": {"subscribe": ["orders.>", "refunds.>", "t.>"]}})
    core = BrokerCore(CoreSettings(limits=Limits(max_subscriptions=8)), permissions)
    connect(core, b"m", version=version)
    before = core.pubsub.group_report()
    out = core.handle(b"m", frames, 0.0)
    assert code_of(out) == expected
    if expected != "OK":
        assert core.pubsub.group_report() == before  # a refused SUB changes nothing


def test_group_and_plain_subscriptions_count_together_against_the_limit() -> None:
    core = BrokerCore(CoreSettings(limits=Limits(max_subscriptions=2)))
    connect(core, b"m")
    assert code_of(core.handle(b"m", f("SUB", "ID", "1", "", "a"), 0.0)) == "OK"
    assert code_of(core.handle(b"m", f("SUB", "GROUP", "g", "ID", "2", "", "b"), 0.0)) == "OK"
    assert code_of(core.handle(b"m", f("SUB", "GROUP", "h", "ID", "3", "", "c"), 0.0)) == "429"


def test_each_message_goes_to_one_member_in_turn_and_every_plain_subscriber() -> None:
    core = BrokerCore()
    for rid in (b"m1", b"m2", b"m3", b"plain", b"pub"):
        connect(core, rid)
    for rid in (b"m1", b"m2", b"m3"):
        core.handle(rid, f("SUB", "GROUP", "workers", "", "jobs.>", "jobs.*"), 0.0)  # two patterns: still once
    core.handle(b"plain", f("SUB", "", "jobs.>"), 0.0)
    got: Counter[bytes] = Counter()
    for i in range(300):
        out = deliveries(core.handle(b"pub", f("PUT", "TOPIC", "jobs.x", "", str(i)), 0.0))
        assert len(out) == 2
        (member, frames), plain = sorted(out, key=lambda o: o[0] == b"plain")
        assert plain == (b"plain", f("MESSAGE", "TOPIC", "jobs.x", "SENDER", "anonymous", "", str(i)))
        assert frames == f("MESSAGE", "TOPIC", "jobs.x", "SENDER", "anonymous", "GROUP", "workers", "", str(i))
        got[member] += 1
    assert got == {b"m1": 100, b"m2": 100, b"m3": 100}


def test_a_member_that_cannot_take_more_is_skipped_unless_no_one_can() -> None:
    queued = {b"m1": 1000}  # bytes waiting in the shell for each routing id
    core = BrokerCore(backlog=lambda rid: queued.get(rid, 0), group_skip_bytes=1000)
    for rid in (b"m1", b"m2", b"pub"):
        connect(core, rid)
        core.handle(rid, f("SUB", "GROUP", "g", "", "t"), 0.0)
    members = [deliveries(core.handle(b"pub", f("PUT", "TOPIC", "t", "", "x"), 0.0))[0][0] for _ in range(4)]
    assert set(members) == {b"m2", b"pub"}  # m1 passed over
    queued.update({b"m2": 5000, b"pub": 1000})
    out = deliveries(core.handle(b"pub", f("PUT", "TOPIC", "t", "", "x"), 0.0))
    assert [rid for rid, _ in out] == [b"m1"]  # nobody can: the least recently chosen still gets it


# Each step: the topic published to and the members backed up at that moment.
STEPS = st.lists(st.tuples(st.sampled_from(["t.a", "t.secret"]), st.sets(st.integers(0, 4))), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(members=st.integers(2, 5), batched=st.booleans(), quiet_member=st.booleans(), steps=STEPS)
def test_the_chosen_member_is_the_least_recently_chosen_that_can_take_it(
    members: int, batched: bool, quiet_member: bool, steps: list[tuple[str, set[int]]]
) -> None:
    """Against a model of the rule: of the members that may see the topic (m0 has t.secret denied,
    an ECHO 0 publisher is never handed its own), the least recently chosen that is not backed up;
    when all are, the least recently chosen of all.  Both the PUT fast path and the general one."""
    policy = Permissions.from_table(
        {"default": {"publish": [">"], "subscribe": [">"]}, "identity": {"m0": {"deny": {"subscribe": ["t.secret"]}}}}
    )
    backed_up: set[bytes] = set()
    core = BrokerCore(permissions=policy, backlog=lambda rid: 10_000 if rid in backed_up else 0, group_skip_bytes=1000)
    names = [f"m{i}".encode() for i in range(members)]
    extra = ("BATCH", "1") if batched else ()
    for i, rid in enumerate(names):
        connect(core, rid, *extra, *(("ECHO", "0") if quiet_member and i == 1 else ()), who=rid.decode())
        pattern = "t.*" if i % 2 else "t.>"  # two patterns: the members come from two trie nodes
        assert code_of(core.handle(rid, f("SUB", "GROUP", "g", "ID", "s", "", pattern), 0.0, rid.decode())) == "OK"
    publisher = b"m1" if quiet_member else b"pub"
    if not quiet_member:
        connect(core, publisher, *extra, who="pub")
    last: dict[bytes, int] = {}  # the model: the step each member was last chosen at
    for step, (topic, busy) in enumerate(steps, 1):
        backed_up.clear()
        backed_up.update(names[i] for i in busy if i < members)
        allowed = [
            rid for rid in names if not (rid == b"m0" and topic == "t.secret") and not (quiet_member and rid == b"m1")
        ]
        put = (
            batch.batch_frames(batch.put_record(topic.encode(), b"x")) if batched else f("PUT", "TOPIC", topic, "", "x")
        )
        got = [rid for rid, item in core.handle(publisher, put, 0.0, publisher.decode()) for _ in records(item)]
        if not allowed:
            assert got == []
            continue
        free = [rid for rid in allowed if rid not in backed_up] or allowed
        first = min(last.get(rid, 0) for rid in free)
        assert len(got) == 1 and got[0] in [rid for rid in free if last.get(rid, 0) == first], (step, got, last)
        last[got[0]] = step


def test_groups_are_independent_and_unsub_or_disconnect_leaves_the_others() -> None:
    core = BrokerCore()
    for rid in (b"a1", b"a2", b"b1", b"pub"):
        connect(core, rid)
    core.handle(b"a1", f("SUB", "GROUP", "a", "", "t"), 0.0)
    core.handle(b"a2", f("SUB", "GROUP", "a", "", "t"), 0.0)
    core.handle(b"b1", f("SUB", "GROUP", "b", "", "t"), 0.0)
    out = deliveries(core.handle(b"pub", f("PUT", "TOPIC", "t", "", "x"), 0.0))
    assert sorted(frames[frames.index(b"GROUP") + 1] for _, frames in out) == [b"a", b"b"]
    assert code_of(core.handle(b"a1", f("UNSUB", "GROUP", "a", "ID", "u", "", "t"), 0.0)) == "OK"
    core.handle(b"b1", f("DISCONNECT"), 0.0)
    for _ in range(3):
        assert [rid for rid, _ in deliveries(core.handle(b"pub", f("PUT", "TOPIC", "t", "", "x"), 0.0))] == [b"a2"]
    assert core.pubsub.group_report() == {"a": {"t": 1}}
    core.handle(b"a2", f("DISCONNECT"), 0.0)
    assert core.pubsub.group_report() == {}
    assert deliveries(core.handle(b"pub", f("PUT", "TOPIC", "t", "", "x"), 0.0)) == []


def test_batched_members_get_group_records_from_the_put_fast_path() -> None:
    core = BrokerCore()
    for rid in (b"m1", b"m2", b"pub"):
        assert connect(core, rid, "BATCH", "1")[-2:] == f("BATCH", "1")
    for rid in (b"m1", b"m2"):
        core.handle(rid, batch.batch_frames(batch.record_of(f("SUB", "GROUP", "g", "", "t.>"))), 0.0)
    blob = b"".join(batch.put_record(b"t.a", str(i).encode()) for i in range(10))
    out = core.handle(b"pub", batch.batch_frames(blob), 0.0)
    seen: dict[bytes, list[bytes]] = {}
    for rid, payload in out:
        assert isinstance(payload, bytes)
        for code, start, end in batch.records(payload):
            frames = batch.frames_of(payload, code, start, end)
            assert frames[:7] == f("MESSAGE", "TOPIC", "t.a", "SENDER", "anonymous", "GROUP", "g")
            seen.setdefault(rid, []).append(frames[-1])
    assert sorted(seen) == [b"m1", b"m2"]
    assert sorted(seen[b"m1"] + seen[b"m2"], key=int) == [str(i).encode() for i in range(10)]
    assert len(seen[b"m1"]) == len(seen[b"m2"]) == 5


def test_withdrawn_group_patterns_are_named_with_their_group() -> None:
    core = BrokerCore()
    connect(core, b"m")
    core.handle(b"m", f("SUB", "GROUP", "g", "", "a.>", "b.>"), 0.0)
    out = core.set_permissions(Permissions.from_table({"default": {"subscribe": ["b.>"]}}), 0.0)
    assert out == [(b"m", P.error(403, "subscription a.> in group g withdrawn by policy", topic="a.>", group="g"))]
    assert core.pubsub.group_report() == {"g": {"b.>": 1}}


CONNECT_ECHO_CASES = [
    ("1.0", "0", "OK"),
    ("1.0", "1", "OK"),
    ("1.0", "no", "400"),
    ("0.3", "0", "400"),
    ("0.3", "1", "OK"),
]


@pytest.mark.parametrize(("version", "echo", "expected"), CONNECT_ECHO_CASES)
def test_connect_echo_table(version: str, echo: str, expected: str) -> None:
    core = BrokerCore()
    answer = connect(core, b"p", "ECHO", echo, version=version)
    assert (answer[answer.index(b"CODE") + 1].decode() if answer[0] == b"ERROR" else answer[0].decode()) == expected
    assert (b"p" in core.sessions) == (expected == "OK")


@pytest.mark.parametrize("batched", [False, True])
def test_echo_0_never_hands_a_peer_its_own_publishes(batched: bool) -> None:
    core = BrokerCore()
    extra = ("BATCH", "1") if batched else ()
    connect(core, b"quiet", "ECHO", "0", *extra)
    connect(core, b"loud", *extra)
    for rid in (b"quiet", b"loud"):
        core.handle(rid, f("SUB", "", "t"), 0.0)
        core.handle(rid, f("SUB", "GROUP", "g", "", "t"), 0.0)
    for _ in range(4):  # plain and group copies: never back to the quiet publisher
        put = batch.batch_frames(batch.put_record(b"t", b"x")) if batched else f("PUT", "TOPIC", "t", "", "x")
        got = [rid for rid, item in core.handle(b"quiet", put, 0.0) for _ in records(item)]
        assert got == [b"loud", b"loud"]
    got = [rid for rid, _ in core.handle(b"loud", f("PUT", "TOPIC", "t", "", "x"), 0.0)]
    assert sorted(got).count(b"quiet") >= 1 and sorted(got).count(b"loud") >= 1  # echo on: its own copy too
