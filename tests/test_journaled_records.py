"""The journaled PUT record's fast path (core/batched.py ``_journaled_record``, pubsub ``fan_out_journaled``):
a batch of PUT records on journaled topics does exactly what the same PUTs sent one by one as frames do
(``verbs.put_journaled``): the same records in the journals, the same copies to every kind of subscriber
(batched, 1.0, 0.x, queue-group members, a replaying one held back, a denied one, an ECHO 0 publisher),
the same refusals and counters.  No sockets."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.storage.filestore import Journal
from mc0.broker.storage.memstore import MemoryStore
from mc0.permissions import Permissions
from mc0.protocol import batch, builders
from mc0.protocol import journalrecords as records
from mc0.settings import JournalSettings

from .test_batch import as_frames, unpack
from .test_core import f

POLICY = Permissions.from_table(
    {
        "identity": {
            "bob": {"deny": {"subscribe": ["orders.secret"]}},
            "pub": {"deny": {"publish": ["orders.closed"]}},
        }
    }
)
# PUT records of one batch: journaled topics (one kept by two journals), a plain one, the broker's own
# (403), one the publisher may not publish (403), a malformed topic (400), a topic another journal keeps.
TOPICS = ["orders.1", "orders.secret", "audit.x", "plain.t", "mc0.sys.x", "orders.closed", "orders..bad", "orders.1"]


@settings(max_examples=200, deadline=None)
@given(
    topic=st.binary(min_size=1, max_size=40),
    sender=st.binary(max_size=40),
    journal=st.binary(min_size=1, max_size=20),
    seq=st.integers(min_value=1, max_value=2**63 - 1),
    data=st.binary(max_size=300),
)
def test_journaled_message_record_is_the_frames_record_of_the_journaled_message(
    topic: bytes, sender: bytes, journal: bytes, seq: int, data: bytes
) -> None:
    expected = batch.frames_record(builders.message(topic, sender, (), [data], (journal, seq)))
    assert batch.journaled_message_record(topic, sender, journal, seq, data) == expected


@settings(max_examples=300, deadline=None)
@given(
    topic=st.text(min_size=1, max_size=40),
    sender=st.text(max_size=40),
    seq=st.integers(min_value=1, max_value=2**63 - 1),
    ts=st.floats(allow_nan=False, allow_infinity=False),
    body=st.binary(max_size=300),
)
def test_a_put_records_journal_record_is_encode_records_bytes(
    topic: str, sender: str, seq: int, ts: float, body: bytes
) -> None:
    """The append shortcut (``records.encode_body_record`` from a cached ``payload_prefix``, its CRC
    chained piece by piece) writes exactly what ``encode_record`` writes, so the reader's CRC check holds."""
    prefix = records.payload_prefix(topic, sender)
    expected = records.encode_record(seq, ts, topic, sender, {}, [body])
    assert records.encode_body_record(seq, ts, prefix, body) == expected


WHO = {b"batched": "alice", b"plain": "carol", b"seed": "dave", b"bob": "bob", b"m1": "m1", b"m2": "m2",
       b"replayer": "erin", b"pub": "pub"}  # fmt: skip


def send(core: BrokerCore, rid: bytes, frames: list[bytes], now: float = 0.0) -> list[tuple[bytes, Any]]:
    """A message from a peer, under its authenticated identity (``WHO``)."""
    return core.handle(rid, frames, now, WHO[rid])


def core_with_everyone(journals: list[Any]) -> BrokerCore:
    """A core with journals ``main`` (orders.>) and ``audit`` (orders.1, audit.>) and every kind of
    subscriber: batched, 1.0 frames, 0.x, a denied one (bob), a queue group (a batched and a plain
    member), a replay of ``main`` under way (its live copies held back), the publisher (ECHO 0) itself."""
    core = BrokerCore(CoreSettings(), permissions=POLICY, journals=journals)
    connect = "CONNECT", "VERSION", "1.0", "TTL", "60000"
    for rid in (b"batched", b"bob", b"m1", b"replayer"):
        send(core, rid, f(*connect, "BATCH", "1"))
    for rid in (b"plain", b"m2"):
        send(core, rid, f(*connect))
    send(core, b"seed", f("CONNECT", "VERSION", "0.3", "TTL", "60000"))
    send(core, b"pub", f(*connect, "BATCH", "1", "ECHO", "0"))
    for rid in (b"batched", b"plain", b"bob", b"pub"):
        send(core, rid, f("SUB", "", "orders.>", "audit.>", "plain.>"))
    send(core, b"seed", f("SUB", "", "orders.1"))
    for rid in (b"m1", b"m2"):
        send(core, rid, f("SUB", "GROUP", "g", "", "orders.>"))
    send(core, b"pub", f("PUT", "TOPIC", "orders.0", "", "before"))  # a record for the replay to read
    send(core, b"replayer", f("SUB", "FROM", "1", "JOURNAL", "main", "", "orders.>"))
    core.commit()
    assert core.counters["journaled"] == 1 and core.journaling.paging
    return core


def journals_of(kind: str, tmp_path: Path) -> list[Any]:
    main = JournalSettings(topics=("orders.>",), folder=str(tmp_path / "main"))
    audit = JournalSettings(topics=("orders.1", "audit.>"), folder=str(tmp_path / "audit"))
    if kind == "memory":
        return [MemoryStore("main", main), MemoryStore("audit", audit)]
    return [Journal("main", main, clock=lambda: 5.0).open(), Journal("audit", audit, clock=lambda: 5.0).open()]


def received(out: list[tuple[bytes, Any]]) -> dict[bytes, list[list[bytes]]]:
    """Each peer's messages as frames, in order (a batched peer's joined records split)."""
    got: dict[bytes, list[list[bytes]]] = collections.defaultdict(list)
    for rid, item in out:
        got[rid] += unpack(item) if isinstance(item, bytes) else [list(item)]
    return dict(got)


def stored(journal: Any) -> list[tuple[int, str, str, dict[str, str], tuple[bytes, ...]]]:
    return [(r.seq, r.topic, r.sender, r.headers, r.parts) for r in journal.read(1, max_records=10_000)[0]]


@pytest.mark.parametrize("kind", ["memory", "files"])
def test_a_batch_of_journaled_put_records_does_what_the_same_puts_as_frames_do(tmp_path: Path, kind: str) -> None:
    fast_journals = journals_of(kind, tmp_path / "fast")
    general_journals = journals_of(kind, tmp_path / "general")
    fast, general = core_with_everyone(fast_journals), core_with_everyone(general_journals)
    records = b"".join(batch.put_record(t.encode(), f"body {i}".encode()) for i, t in enumerate(TOPICS))
    fast_out = send(fast, b"pub", batch.batch_frames(records), 1.0)
    general_out: list[tuple[bytes, Any]] = []
    for i, topic in enumerate(TOPICS):
        general_out += send(general, b"pub", f("PUT", "TOPIC", topic, "", f"body {i}"), 1.0)
    fast_out += fast.commit()
    general_out += general.commit()
    assert fast.counters["journaled"] == general.counters["journaled"] == 1 + 4
    assert set(fast.batched._journaled_topics) == {b"orders.1", b"orders.secret", b"audit.x", b"orders.closed"}
    got, expected = received(fast_out), received(general_out)
    errors = got.pop(b"pub"), expected.pop(b"pub")  # the refusals: the same codes, in order
    assert [e[:5] for e in errors[0]] == [e[:5] for e in errors[1]] and len(errors[0]) == 3
    assert got == expected
    assert set(got) == {b"batched", b"plain", b"seed", b"bob", b"m1", b"m2"}  # not the replayer, not pub (ECHO 0)
    assert all(b"SEQ" in frames for frames in got[b"batched"] if b"orders.1" in frames)
    assert not [frames for frames in got[b"bob"] if b"orders.secret" in frames]  # denied
    for one, other in zip(fast_journals, general_journals, strict=True):
        assert stored(one) == stored(other)
    changed = {k for k in set(fast.counters) | set(general.counters) if fast.counters[k] != general.counters[k]}
    changed.discard("received")  # (messages received: one batch against eight)
    assert not changed, {k: (fast.counters[k], general.counters[k]) for k in changed}
    # (the fast path's topic cache holds a tally for a topic it saw refused, as the plain one's does: empty)
    counted = [[row for row in core.traffic.report() if row["msgs"]] for core in (fast, general)]
    assert counted[0] == counted[1]


def test_a_journal_that_cannot_write_refuses_the_record_507_and_the_batch_goes_on(tmp_path: Path) -> None:
    import os

    journal = Journal("main", JournalSettings(topics=("orders.>",), folder=str(tmp_path), fsync="always")).open()
    core = BrokerCore(CoreSettings(), journals=[journal])
    core.handle(b"pub", f("CONNECT", "VERSION", "1.0", "TTL", "60000", "BATCH", "1"), 0.0)
    os.close(journal._segments[-1].fd)  # the disk goes away under the journal
    records = batch.put_record(b"orders.1", b"a") + batch.put_record(b"plain.t", b"b")
    out = core.handle(b"pub", batch.batch_frames(records), 0.0)
    assert [as_frames(item)[:3] for _, item in out] == [f("ERROR", "CODE", "507")]
    assert journal.next_seq == 1 and core.counters["published"] == 2  # (counted as verbs.put counts them)
    assert P.Status.STORAGE_FAILED == 507
