"""Durable consumers and dead letters under permissions, in the broker core (no sockets, time passed in):
a consumer's deliveries pass the subscribe check a SUB's do (deny lists included, with its owner's
current grants), dead letters reach only those allowed their original topic (peer telemetry keeps
its grant), and a reload withdraws waiting pulls the new policy does not allow."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore
from mc0.broker.storage.memstore import MemoryStore
from mc0.permissions import Permissions
from mc0.settings import CoreSettings, JournalSettings

from .test_consumers import body_of, error_code, f, page

CAROL = {"subscribe": ["orders.>"], "deny": {"subscribe": ["orders.secret.>"]}}
OPS = {"subscribe": [">", "mc0.sys.peer", "mc0.sys.dead.>"]}


def policy(**identities: dict[str, Any]) -> Permissions:
    return Permissions.from_table({"identity": identities})


class Bus:
    """A core with one in-memory journal keeping orders.>, peer telemetry and dead letters."""

    def __init__(
        self, permissions: Permissions, settings: CoreSettings | None = None, store: MemoryStore | None = None
    ) -> None:
        topics = ("orders.>", P.SYS_PEER_TOPIC, "mc0.sys.dead.>")
        self.store = store or MemoryStore("main", JournalSettings(topics=topics))
        self.core = BrokerCore(settings, permissions, journals=[self.store])
        self.ids = 0
        self.who: dict[bytes, str] = {}

    def connect(self, rid: bytes, who: str, now: float = 0.0) -> list[Any]:
        self.who[rid] = who
        return self.core.handle(rid, f("CONNECT", "VERSION", "1.0", "TTL", "600000", "ID", "c"), now, who)

    def put(self, *topics: str, now: float = 0.0) -> None:
        for topic in topics:
            out = self.core.handle(b"pub", f("PUT", "TOPIC", topic, "ID", "p", "", topic.encode()), now, "pub")
            assert not [o for o in out if o[1][0] == b"ERROR"], out
        self.core.commit()

    def ask(self, rid: bytes, query: dict[str, Any], now: float = 0.0, name: str = "c") -> list[tuple[bytes, Any]]:
        self.ids += 1
        body = json.dumps({"journal": "main", "name": name, **query})
        req = f("REQUEST", "SERVICE", P.CONSUMER_SERVICE, "ID", f"r{self.ids}", "", body)
        return self.core.handle(rid, req, now, self.who[rid]) + self.core.commit()

    def answer(self, rid: bytes, query: dict[str, Any], now: float = 0.0, name: str = "c") -> list[bytes]:
        ((to, frames),) = self.ask(rid, query, now, name)
        assert to == rid
        return frames

    def sub(self, rid: bytes, *frames: str) -> None:
        ((_, answer),) = self.core.handle(rid, f("SUB", *frames[:-1], "ID", "s", "", frames[-1]), 0.0, self.who[rid])
        assert answer[0] == b"OK", answer


def topics_of(frames: list[bytes]) -> list[str]:
    """A pull's FINAL -> the topics of its records, in order."""
    assert frames[0] == b"FINAL", frames
    parts = frames[frames.index(b"") + 1 :]
    records = P.parse_journal_page(parts[:2])
    assert len(json.loads(parts[2])) == len(records) == len(page(frames))
    return [r.topic for r in records]


# ------------------------------------------------------------------ 7. deny lists on every delivery path

SECRET, OPEN = "orders.secret.x", "orders.open.x"


def deliver_by_pull(bus: Bus) -> list[str]:
    bus.put(SECRET, OPEN)
    return topics_of(bus.answer(b"c", {"op": "pull", "max": 10}))


def deliver_to_a_waiting_pull(bus: Bus) -> list[str]:
    assert bus.ask(b"c", {"op": "pull", "max": 10, "wait_ms": 5000}) == []
    bus.put(SECRET, OPEN, now=0.1)
    ((rid, frames),) = bus.core.tick(0.1)
    assert rid == b"c"
    return topics_of(frames)


def redeliver_after_a_reload_added_the_deny(bus: Bus) -> list[str]:
    """Delivered while the policy allowed it, then the deny arrives: the redelivery is filtered."""
    bus.core.set_permissions(policy(carol={"subscribe": ["orders.>"]}), 0.0)
    bus.put(SECRET, OPEN)
    pulled = bus.answer(b"c", {"op": "pull", "max": 10})
    assert topics_of(pulled) == [SECRET, OPEN]
    bus.core.set_permissions(policy(carol=CAROL), 0.5)
    seqs = [seq for seq, _, _ in page(pulled)]
    assert body_of(bus.answer(b"c", {"op": "nak", "seqs": seqs}, 0.5))["nak"] == 2
    return topics_of(bus.answer(b"c", {"op": "pull", "max": 10}, 0.6))


def redeliver_after_ack_wait(bus: Bus) -> list[str]:
    bus.core.set_permissions(policy(carol={"subscribe": ["orders.>"]}), 0.0)
    bus.put(SECRET, OPEN)
    topics_of(bus.answer(b"c", {"op": "pull", "max": 10}))
    bus.core.set_permissions(policy(carol=CAROL), 0.5)
    return topics_of(bus.answer(b"c", {"op": "pull", "max": 10}, 2.0))  # ack_wait (1 s) passed


DENY_PATHS = [
    deliver_by_pull,
    deliver_to_a_waiting_pull,
    redeliver_after_a_reload_added_the_deny,
    redeliver_after_ack_wait,
]


@pytest.mark.parametrize("path", DENY_PATHS, ids=lambda p: p.__name__)
def test_a_consumer_never_delivers_what_its_owner_is_denied(path: Any) -> None:
    bus = Bus(policy(carol=CAROL))
    bus.connect(b"pub", "pub")
    bus.connect(b"c", "carol")
    # Like a SUB: a pattern that only overlaps the deny is accepted, and filtered at delivery.
    bus.answer(b"c", {"op": "create", "topics": ["orders.>"], "ack_wait_ms": 1000})
    assert path(bus) == [OPEN]
    info = body_of(bus.answer(b"c", {"op": "info"}, 2.0))
    assert (info["owner"], info["filtered"]) == ("carol", 1)


def test_a_pattern_wholly_inside_a_deny_is_refused_as_a_sub_is() -> None:
    bus = Bus(policy(carol=CAROL))
    bus.connect(b"c", "carol")
    assert error_code(bus.answer(b"c", {"op": "create", "topics": ["orders.secret.>"]})) == 403
    ((_, frames),) = bus.core.handle(b"c", f("SUB", "ID", "s", "", "orders.secret.>"), 0.0, "carol")
    assert error_code(frames) == 403


# (identity, op) -> what another identity gets on carol's consumer; its owner is unaffected
OTHERS = [
    ({"op": "pull"}, 403),
    ({"op": "pull", "wait_ms": 1000}, 403),
    ({"op": "ack", "seqs": [1]}, 403),
    ({"op": "nak", "seqs": [1]}, 403),
    ({"op": "term", "seqs": [1]}, 403),
    ({"op": "info"}, 403),
    ({"op": "delete"}, 403),
    ({"op": "create", "topics": ["orders.>"]}, 403),  # the same name and config: still carol's
]


@pytest.mark.parametrize(("query", "code"), OTHERS)
def test_a_consumer_belongs_to_the_identity_that_created_it(query: dict[str, Any], code: int) -> None:
    """bob is allowed everything carol is, without her deny: sharing her consumer would hand him
    what her deny filters (and the reverse would leak to her), so only her sessions use it."""
    bus = Bus(policy(carol=CAROL, bob={"subscribe": ["orders.>"]}))
    bus.connect(b"pub", "pub")
    bus.connect(b"c", "carol")
    bus.connect(b"b", "bob")
    bus.answer(b"c", {"op": "create", "topics": ["orders.>"]})
    bus.put(SECRET, OPEN)
    before = body_of(bus.answer(b"c", {"op": "info"}))
    frames = bus.answer(b"b", query)
    assert error_code(frames) == code and b"belongs to another identity" in frames[-1]
    assert body_of(bus.answer(b"c", {"op": "info"})) == before
    assert body_of(bus.answer(b"b", {"op": "list"})) == []  # bob lists his own
    assert body_of(bus.answer(b"c", {"op": "list"})) == ["main/c"]


# ------------------------------------------------------------------ 8. dead letters reach those allowed their topic

DEAD_PEER = "mc0.sys.peer"
# (identity, its grants, the original topics of the dead letters it may be handed)
READERS = [
    ("bob", {"subscribe": [">"], "deny": {"subscribe": ["orders.secret.>"]}}, {OPEN}),
    ("dave", {"subscribe": ["mc0.sys.dead.>"]}, set()),  # the dead-letter topic alone is not enough
    ("erin", {"subscribe": [">"]}, {SECRET, OPEN}),  # > does not reach peer telemetry
    ("olga", OPS, {SECRET, OPEN, DEAD_PEER}),  # granted peer telemetry by name
]


def dead_letters(bus: Bus, now: float) -> list[tuple[bytes, Any]]:
    """ops' consumer on orders.> and peer telemetry gives up on everything it pulled (max_deliver 1)."""
    query = {"op": "create", "topics": ["orders.>", DEAD_PEER], "max_deliver": 1, "ack_wait_ms": 1000}
    bus.answer(b"ops", query, name="d")
    bus.put(SECRET, OPEN)
    pulled = topics_of(bus.answer(b"ops", {"op": "pull", "max": 100}, name="d"))
    assert {SECRET, OPEN, DEAD_PEER} <= set(pulled)
    out = bus.core.tick(now)
    assert bus.core.counters["dead_letters"] == len(pulled)
    return out


def origins(frames_list: list[list[bytes]]) -> set[str]:
    found = set()
    for frames in frames_list:
        assert frames[0] == b"MESSAGE" and frames[2].startswith(b"mc0.sys.dead."), frames
        found.add(frames[frames.index(b"X-Dead-Topic") + 1].decode())
    return found


def live(bus: Bus, rid: bytes) -> set[str]:
    bus.sub(rid, "mc0.sys.dead.>")
    return origins([frames for to, frames in dead_letters(bus, 5.0) if to == rid])


def in_a_queue_group(bus: Bus, rid: bytes) -> set[str]:
    bus.sub(rid, "GROUP", "g-" + bus.who[rid], "mc0.sys.dead.>")
    return origins([frames for to, frames in dead_letters(bus, 5.0) if to == rid])


def replayed(bus: Bus, rid: bytes) -> set[str]:
    dead_letters(bus, 5.0)
    bus.core.commit()
    bus.sub(rid, "FROM", "0", "JOURNAL", "main", "mc0.sys.dead.>")
    return origins([list(s.frames) for s in bus.core.pages(5.0) if s.routing_id == rid])


def fetched(bus: Bus, rid: bytes, page: str = "json") -> set[str]:
    dead_letters(bus, 5.0)
    bus.core.commit()
    body = json.dumps({"op": "fetch", "journal": "main", "topics": ["mc0.sys.dead.>"], "page": page})
    assert bus.core.handle(rid, f("REQUEST", "SERVICE", "mc0.journal", "ID", "j", "", body), 5.0, bus.who[rid]) == []
    found = set()
    for _ in range(5):  # bounded: pages then the FINAL
        for sent in bus.core.pages(5.0):
            frames = list(sent.frames)
            if frames[0] == b"PARTIAL":
                parts = frames[frames.index(b"") + 1 :]
                if page == "json":
                    records = P.parse_journal_page(parts)
                else:
                    records = P.parse_columns_page(parts[0]).records()
                found |= {r.headers["X-Dead-Topic"] for r in records}
    return found


def fetched_as_columns(bus: Bus, rid: bytes) -> set[str]:
    return fetched(bus, rid, "columns/1")


def consumed(bus: Bus, rid: bytes) -> set[str]:
    bus.answer(rid, {"op": "create", "topics": ["mc0.sys.dead.>"]}, name="mine")
    dead_letters(bus, 5.0)
    bus.core.commit()
    frames = bus.answer(rid, {"op": "pull", "max": 100}, 5.0, name="mine")
    parts = frames[frames.index(b"") + 1 :]
    return {r.headers["X-Dead-Topic"] for r in P.parse_journal_page(parts[:2])}


DEAD_PATHS = [live, in_a_queue_group, replayed, fetched, fetched_as_columns, consumed]


@pytest.mark.parametrize("path", DEAD_PATHS, ids=lambda p: p.__name__)
@pytest.mark.parametrize(("who", "grants", "expected"), READERS, ids=[r[0] for r in READERS])
def test_a_dead_letter_reaches_only_those_allowed_its_original_topic(
    path: Any, who: str, grants: dict[str, Any], expected: set[str]
) -> None:
    bus = Bus(policy(ops=OPS, **{who: grants}))
    bus.connect(b"pub", "pub")
    bus.connect(b"ops", "ops")
    bus.connect(b"r", who)
    assert path(bus, b"r") == expected


# ------------------------------------------------------------------ 9. a reload withdraws waiting pulls

# (carol's grants after the reload, what her waiting pull gets at once: a code, or None = still waiting)
RELOADS = [
    ({"subscribe": ["billing.>"]}, 403),  # the allow that covered the consumer is gone
    ({"subscribe": ["orders.>"], "deny": {"subscribe": ["orders.>"]}}, 403),  # denied wholly
    ({"subscribe": ["orders.>"], "call": ["svc.>"]}, 403),  # may no longer call mc0.consumer
    (CAROL, None),  # a deny that only overlaps: the pull stays, and is filtered
    ({"subscribe": ["orders.>"]}, None),
]


@pytest.mark.parametrize(("grants", "code"), RELOADS)
def test_a_reload_withdraws_the_waiting_pulls_it_no_longer_allows(grants: dict[str, Any], code: int | None) -> None:
    bus = Bus(policy(carol={"subscribe": ["orders.>"]}))
    bus.connect(b"pub", "pub")
    bus.connect(b"c", "carol")
    bus.answer(b"c", {"op": "create", "topics": ["orders.>"]})
    assert bus.ask(b"c", {"op": "pull", "max": 10, "wait_ms": 60_000}) == []
    out = bus.core.set_permissions(policy(carol=grants), 1.0)
    bus.put(SECRET, OPEN, now=1.1)
    later = bus.core.tick(1.1)
    if code is None:
        assert out == []
        ((rid, frames),) = later
        assert rid == b"c" and topics_of(frames) == ([OPEN] if "deny" in grants else [SECRET, OPEN])
        return
    ((rid, frames),) = out
    assert rid == b"c" and error_code(frames) == code and frames[:3] == f("ERROR", "ID", "r2")
    assert b"withdrawn by policy" in frames[-1]
    assert later == []  # nothing is delivered after
    info = bus.core.consumers.info(bus.core.consumers.consumers["main", "c"])
    assert (info["waiting_pulls"], info["delivered"]) == (0, 0)  # the consumer itself is kept
    assert error_code(bus.answer(b"c", {"op": "pull"}, 1.2)) == code  # and refused while the policy says so
    bus.core.set_permissions(policy(carol={"subscribe": ["orders.>"]}), 2.0)  # allowed again: it resumes
    assert topics_of(bus.answer(b"c", {"op": "pull"}, 2.1)) == [SECRET, OPEN]


# ------------------------------------------------------------------ 11. consumer quotas per identity


def test_one_identity_cannot_take_every_consumer_slot() -> None:
    bus = Bus(Permissions(), CoreSettings(max_consumers=4, max_consumers_per_identity=2))
    for rid, who in ((b"c", "carol"), (b"b", "bob"), (b"e", "erin")):
        bus.connect(rid, who)

    def create(rid: bytes, name: str) -> list[bytes]:
        return bus.answer(rid, {"op": "create", "topics": ["orders.>"]}, name=name)

    assert [create(b"c", f"c{i}")[0] for i in range(2)] == [b"FINAL", b"FINAL"]
    refused = create(b"c", "c2")
    assert error_code(refused) == 429 and b"max_consumers_per_identity 2" in refused[-1]
    assert create(b"c", "c0")[0] == b"FINAL"  # creating an existing one again is not a new one
    assert create(b"b", "b0")[0] == b"FINAL" and create(b"b", "b1")[0] == b"FINAL"  # others still can
    refused = create(b"e", "e0")
    assert error_code(refused) == 429 and b"max_consumers 4" in refused[-1]  # the broker's own limit
    assert body_of(bus.answer(b"c", {"op": "delete"}, name="c0")) == {"deleted": "c0"}
    assert create(b"c", "c2")[0] == b"FINAL"  # a deleted one frees its owner's slot
    assert sorted(bus.core.consumers.consumers) == [("main", n) for n in ("b0", "b1", "c1", "c2")]


def test_saved_consumers_come_back_over_a_lower_quota_and_an_ownerless_one_is_claimed() -> None:
    first = Bus(Permissions())
    first.connect(b"c", "carol")
    for name in ("a", "b", "c"):
        first.answer(b"c", {"op": "create", "topics": ["orders.>"]}, name=name)
    # a state saved before owners were kept
    first.store.consumers["old"] = first.store.consumers["a"].replace(b'"owner":"carol",', b"")
    again = Bus(Permissions(), CoreSettings(max_consumers_per_identity=1), first.store)  # a restart
    again.connect(b"c", "carol")
    again.connect(b"b", "bob")
    assert sorted(n for _, n in again.core.consumers.consumers) == ["a", "b", "c", "old"]
    assert body_of(again.answer(b"c", {"op": "info"}, name="a"))["owner"] == "carol"
    assert error_code(again.answer(b"c", {"op": "create", "topics": ["orders.>"]}, name="d")) == 429
    assert body_of(again.answer(b"b", {"op": "info"}, name="old"))["owner"] == "bob"  # claimed by its first user
    assert error_code(again.answer(b"c", {"op": "info"}, name="old")) == 403
    assert b'"owner":"bob"' in again.core.consumers.consumers["main", "old"].state()


# A bad value names its key.
BROKEN_CONFIGS = [
    ("[broker]\nmax_consumers = 0", "broker.max_consumers"),
    ("[broker]\nmax_consumers_per_identity = -1", "broker.max_consumers_per_identity"),
    ('[broker]\nmax_consumers_per_identity = "10"', "broker.max_consumers_per_identity"),
    ("[broker]\nmax_consumers = 10\nmax_consumers_per_identity = 11", "broker.max_consumers_per_identity"),
]


@pytest.mark.parametrize(("text", "where"), BROKEN_CONFIGS)
def test_a_bad_quota_names_its_key(text: str, where: str) -> None:
    from mc0.config import parse
    from mc0.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        parse(text, "mc0.toml")
    assert info.value.where == f"mc0.toml: {where}"
