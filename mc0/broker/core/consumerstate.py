"""A durable consumer's state: the delivery state table, the consumer record, its saved form, its config.

Contract: each delivered message is in one :class:`HeldState` state, moved
only by ``held_transition`` (one table, tested as one): ``ack``/``term``
settle it, ``nak`` makes it due again (after a delay), ``ack_wait`` passing
makes it due, and a due message that already had ``max_deliver`` deliveries
is dead-lettered and settled.  :class:`Consumer` holds one consumer (its
config, its owner: the identity that created it, its cursor, what it
delivered and has not heard about, its waiting pulls); ``state()`` is what is
saved and ``consumer_of`` reads it back (ValueError/KeyError/TypeError/
InvalidTopic when it cannot).  A :data:`DeadLetter` is what a consumer gave
up on, as either backend hands it over.  A ``create`` request's config
(:class:`~mc0.protocol.consumerrequests.ConsumerConfig`) is parsed by
:mod:`mc0.protocol.consumerrequests`.  Pure: no sockets, no clock.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum

from ...message import Record
from ...protocol.consumerrequests import ConsumerConfig
from ...topics import pattern_matches, split_pattern
from ..storage.port import JournalStore
from .peers import Peer

MAX_CHANGES = 64  # change records between whole saves (bounds the log a start replays)
# A record a consumer gave up on: (its dead-letter topic, the record, the reason, its deliveries).
DeadLetter = tuple[str, Record, str, int]


class HeldState(Enum):
    PENDING = "pending"  # delivered, waiting for ack/nak/term until its ack_wait passes
    DUE = "due"  # to be delivered again (nak, ack_wait passed, or a restart)
    SETTLED = "settled"  # acked, termed or dead-lettered: never delivered again


class Event(Enum):
    DELIVER = "deliver"  # a pull hands it out
    ACK = "ack"
    NAK = "nak"
    TERM = "term"
    ACK_WAIT = "ack_wait"  # its ack_wait passed without an answer
    EXHAUSTED = "exhausted"  # due, and it already had max_deliver deliveries


# (state, event) -> the next state; a missing pair leaves the state as it is (a late ack of a
# settled message, say) and is counted by the caller as ignored.
TRANSITIONS: dict[tuple[HeldState, Event], HeldState] = {
    (HeldState.DUE, Event.DELIVER): HeldState.PENDING,
    (HeldState.PENDING, Event.ACK): HeldState.SETTLED,
    (HeldState.PENDING, Event.TERM): HeldState.SETTLED,
    (HeldState.PENDING, Event.NAK): HeldState.DUE,
    (HeldState.PENDING, Event.ACK_WAIT): HeldState.DUE,
    (HeldState.DUE, Event.ACK): HeldState.SETTLED,  # an ack that arrives after ack_wait still counts
    (HeldState.DUE, Event.TERM): HeldState.SETTLED,
    (HeldState.DUE, Event.EXHAUSTED): HeldState.SETTLED,
}


def held_transition(state: HeldState, event: Event) -> HeldState | None:
    """The next state, or None when the event does not apply (nothing changes)."""
    return TRANSITIONS.get((state, event))


@dataclass(slots=True)
class Held:
    """A delivered message the consumer has not settled."""

    state: HeldState
    deliveries: int
    due: float  # PENDING: when ack_wait passes; DUE: when it may be delivered again


@dataclass(slots=True)
class Waiting:
    peer: Peer
    rid: str
    user: dict[str, str]
    max: int
    until: float


@dataclass(slots=True)
class Consumer:
    config: ConsumerConfig
    journal: JournalStore
    patterns: tuple[tuple[str, ...], ...]
    cursor: int  # the next journal seq never looked at; every seq below it is settled unless held
    # The identity that created it: only its sessions use it, and what it delivers passes that
    # identity's current subscribe grants.  "" = saved before owners were kept: the first
    # identity allowed its topics that uses it claims it.
    owner: str = ""
    held: dict[int, Held] = field(default_factory=dict)
    timers: list[tuple[float, int]] = field(default_factory=list)  # (due, seq) heap, stale entries skipped
    waiting: list[Waiting] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    # Saving: the seqs acked or termed since the last save (an answered ack saves them alone, as a
    # change record, unless something else changed too), change records since the last whole save,
    # and whether the last save failed (then the next is whole).
    settled_unsaved: list[int] = field(default_factory=list)
    changes_saved: int = 0
    save_failed: bool = False
    # (owner, the saved state's text up to the cursor): rebuilt when the owner changes (a claim).
    _saved_head: tuple[str, str] | None = field(default=None, repr=False, compare=False)
    # (from_seq, to_seq, records its topics take in between): the last pending count, so the next
    # one counts only what the cursor passed and what was appended since (monitoring pages).
    pending_counted: tuple[int, int, int] | None = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return self.config.journal, self.config.name

    @property
    def ack_floor(self) -> int:
        """Every seq up to this one is settled (or never matched)."""
        return min(self.held, default=self.cursor) - 1

    def matches(self, topic_tokens: tuple[str, ...] | None) -> bool:
        return topic_tokens is not None and any(pattern_matches(p, topic_tokens) for p in self.patterns)

    def state(self) -> bytes:
        """What is persisted (JSON).  Saved once per loop turn that changed the consumer (every
        answered ack), so it is built by hand: the config and owner part once per owner (the config
        never changes), then the cursor and the held map (json.dumps of asdict was half the core's
        CPU per answered ack, benchmarks/core_acks.py)."""
        head = self._saved_head
        if head is None or head[0] != self.owner:
            config = json.dumps(asdict(self.config), separators=(",", ":"))
            head = self._saved_head = (self.owner, f'{{"config":{config},"owner":{json.dumps(self.owner)},"cursor":')
        held = ",".join([f'"{seq}":{h.deliveries}' for seq, h in self.held.items()])
        return f'{head[1]}{self.cursor},"held":{{{held}}}}}'.encode()


def save(consumer: Consumer, whole: bool) -> None:
    """Save what changed since the last save through the journal store: the whole state when
    ``whole`` (anything besides acks and terms changed), after ``MAX_CHANGES`` change records, or
    after a failed save; else the seqs settled since, as one change record (``{"settled": [...]}``,
    a few bytes: an answered ack no longer writes the whole held map).  OSError from the store."""
    name = consumer.config.name
    if whole or consumer.changes_saved >= MAX_CHANGES or consumer.save_failed:
        consumer.save_failed = True  # until the save returns
        consumer.journal.save_consumer(name, consumer.state())
        consumer.changes_saved = 0
    elif consumer.settled_unsaved:
        consumer.save_failed = True
        settled = ",".join([str(seq) for seq in consumer.settled_unsaved])
        consumer.journal.save_consumer_change(name, f'{{"settled":[{settled}]}}'.encode())
        consumer.changes_saved += 1
    consumer.settled_unsaved.clear()
    consumer.save_failed = False


def consumer_of(journal: JournalStore, raw: bytes, changes: Sequence[bytes] = ()) -> Consumer:
    """A saved state read back, with the changes saved after it applied in order: what it
    delivered and was not settled is due at once (whoever held it is gone), with its delivery
    counts.  ValueError, KeyError, TypeError or InvalidTopic if unreadable."""
    saved = json.loads(raw)
    config = ConsumerConfig(**{**saved["config"], "topics": tuple(saved["config"]["topics"])})
    owner = saved.get("owner", "")
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a string, not {type(owner).__name__}")
    patterns = tuple(split_pattern(t) for t in config.topics)
    consumer = Consumer(config, journal, patterns, int(saved["cursor"]), owner)
    held = {int(seq_text): int(deliveries) for seq_text, deliveries in saved["held"].items()}
    for change in changes:
        settled = json.loads(change)["settled"]
        if not isinstance(settled, list) or not all(type(seq) is int for seq in settled):
            raise TypeError("a change's settled must be a list of integers")
        for seq in settled:
            held.pop(seq, None)
    consumer.changes_saved = len(changes)  # they count toward the next whole save
    for seq, deliveries in held.items():
        consumer.held[seq] = Held(HeldState.DUE, deliveries, 0.0)
        heapq.heappush(consumer.timers, (0.0, seq))
    return consumer


def settled_body(op: str, done: int, ignored: int) -> bytes:
    """An ack/nak/term's answer: ``json.dumps({op: done, "ignored": ignored}, sort_keys=True)``,
    built by hand (one per answered ack: the encoder was a tenth of the core's time for it)."""
    if op < "ignored":
        return f'{{"{op}": {done}, "ignored": {ignored}}}'.encode()
    return f'{{"ignored": {ignored}, "{op}": {done}}}'.encode()
