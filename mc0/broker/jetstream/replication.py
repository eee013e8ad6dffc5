"""Replication: the journals JetStream keeps (``store = "jetstream"``), as the core sees them.

Contract: owns the answers held until the store says a record is durable (the
OK of a confirmed PUT, the ``OK MAILBOX stored`` of a kept letter), by journal
and proposal token: ``hold`` one, then ``stored`` turns it into its OK (``JOURNAL
j SEQ n``, ``DUPLICATE 1`` when the stream's duplicate window knew the MSGID:
the first copy's seq) and ``failed`` into an ERROR (504: no acknowledgement in
time, stored or not is unknown, a re-send with the same MSGID is stored once;
507: the store refused; 429: the store's bounds, a full mailbox; 413: larger
than the store can ever hold, so sending it again is no use).  ``arrived``
takes the records the stream delivered (in seq order, the shell having put
them in the local copy) and fans each out to this broker's *own* subscribers
with its JOURNAL and SEQ, as every other broker does from its own delivery:
each subscriber cluster-wide gets each record once, numbered alike
everywhere, and routes never carry these topics.  The broker the record was
published through also hands its queue groups their one copy (a member here
or, through the routes, at another broker), and skips its ``ECHO 0``
publisher.  A record is fanned out only by the journal that speaks for its
topic (``primary``), so a topic several journals keep is delivered once.
It reads its siblings through three narrow protocols: ``KeptTopics`` (the
journaling room), ``Listeners`` (the pub/sub room) and ``PeerLookup`` (the
peer table).  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from ... import protocol as P
from ...message import Record
from ...permissions import Grants
from ...protocol import Header, Status
from ...protocol import jetstream as jsw
from ..core.access import dead_letter_origin, is_dead_letter
from ..core.journaling import primary
from ..core.peers import Out, Peer
from ..storage.port import JournalStore


class Held(NamedTuple):
    routing_id: bytes
    request_id: str
    letter: bool  # a kept letter's OK (MAILBOX stored), else a journaled PUT's (JOURNAL j SEQ n)


class Listeners(Protocol):
    """Who listens here, and a delivered record handed to them (the pub/sub room: ``PubSub``)."""

    def has_subscribers(self) -> bool: ...

    def tokens_of(self, topic: str) -> tuple[str, ...] | None: ...

    def fan_out(
        self,
        topic: str,
        tokens: tuple[str, ...],
        sender: bytes,
        headers: dict[str, str],
        body: Sequence[bytes],
        now: float,
        position: tuple[str, int] | None = None,
        held_back: set[Peer] | None = None,
        *,
        publisher: Peer | None = None,
        admits: Callable[[Grants], bool] | None = None,
        from_route: tuple[str | None] | None = None,
    ) -> list[Out]: ...

    def fan_out_groups(
        self,
        topic: str,
        tokens: tuple[str, ...],
        sender: bytes,
        headers: dict[str, str],
        body: Sequence[bytes],
        now: float,
        publisher: Peer | None = None,
        admits: Callable[[Grants], bool] | None = None,
    ) -> list[Out]: ...


class KeptTopics(Protocol):
    """Which journal speaks for a topic, and the replays a delivered record must wait for or skip (the
    journaling room: ``Journaling``)."""

    def journals_of(self, tokens: tuple[str, ...]) -> Sequence[JournalStore]: ...

    def held_back(self, appended: Sequence[JournalStore], tokens: tuple[str, ...]) -> set[Peer] | None: ...

    @property
    def floors(self) -> bool: ...

    def below_floor(
        self, journal: JournalStore, seq: int, tokens: tuple[str, ...], held: set[Peer] | None
    ) -> set[Peer] | None: ...

    @property
    def paging(self) -> bool: ...


class PeerLookup(Protocol):
    """A peer by its routing id (the peer table: ``PeerTable``)."""

    def get(self, routing_id: bytes) -> Peer | None: ...


class Replication:
    def __init__(
        self,
        kept: KeptTopics,
        listeners: Listeners,
        peers: PeerLookup,
        counters: Counter[str],
        *,
        broker_name: Callable[[], str],
    ) -> None:
        """``kept``: which journal speaks for a topic, and the replays under way (the journaling room);
        ``listeners``: this broker's subscribers and queue groups (the pub/sub room); ``peers``: a record's
        publisher, when it came through this broker (the peer table)."""
        self._kept = kept
        self._listeners = listeners
        self._peers = peers
        self.counters = counters
        self._broker_name = broker_name
        self._held: dict[tuple[str, int], Held] = {}

    # ------------------------------------------------------------ answers held for the store
    def hold(self, journal: str, token: int, routing_id: bytes, request_id: str, *, letter: bool = False) -> None:
        self._held[journal, token] = Held(routing_id, request_id, letter)

    @property
    def holding(self) -> int:
        return len(self._held)

    def stored(self, journal: str, token: int, seq: int, duplicate: bool) -> list[Out]:
        """The store holds proposal ``token`` of ``journal`` at ``seq`` (a quorum of its replicas has it)."""
        held = self._held.pop((journal, token), None)
        if duplicate:
            self.counters["duplicates"] += 1
        if held is None:
            return []
        if held.letter:
            return [(held.routing_id, P.ok_mailbox(held.request_id, P.MAILBOX_STORED, duplicate=duplicate))]
        return [(held.routing_id, P.ok_journaled(held.request_id, journal, seq, duplicate=duplicate))]

    def failed(self, journal: str, token: int, code: int, reason: str) -> list[Out]:
        """The store did not take proposal ``token`` (``code``: 504 unknown outcome, 507 refused, 429 full,
        413 larger than the store can ever hold).  (Whatever else becomes 507.)"""
        self.counters[f"store_failed_{code}"] += 1
        held = self._held.pop((journal, token), None)
        if held is None:
            return []
        if code not in (Status.DEADLINE, Status.OVER_LIMIT, Status.STORAGE_FAILED, Status.TOO_LARGE):
            code = Status.STORAGE_FAILED
        return [(held.routing_id, P.error(Status(code), f"journal {journal}: {reason}", held.request_id))]

    # ------------------------------------------------------------ what the stream delivers
    def listening(self) -> bool:
        """Anyone here may want what a stream delivers (a subscriber, a queue group, a replay): else the
        shell only fills the local copy and does not hand the records over."""
        return self._listeners.has_subscribers() or self._kept.paging

    def arrived(self, journal: JournalStore, records: Sequence[tuple[Record, str]], now: float) -> list[Out]:
        """Records of ``journal`` the stream delivered (``(record, origin)``, in seq order, already in the
        local copy): to this broker's own subscribers; queue groups and echo at the origin broker."""
        out: list[Out] = []
        kept, listeners = self._kept, self._listeners
        here = self._broker_name()
        for record, origin in records:
            tokens = listeners.tokens_of(record.topic)
            if tokens is None:
                self.counters["replicated_unreadable"] += 1
                continue
            kept_by = kept.journals_of(tokens)
            if not kept_by or primary(kept_by) is not journal:
                continue  # another journal speaks for this topic here (it was delivered with that one's seq)
            parsed = jsw.parse_origin(origin)
            at_origin = parsed is not None and parsed[0] == here
            publisher = self._peers.get(parsed[1]) if at_origin and parsed is not None and parsed[1] else None
            admits = _admits_dead_letter(record) if is_dead_letter(tokens) else None
            headers = {Header.TOPIC: record.topic, **record.headers}
            sender = record.sender.encode()
            held = kept.held_back((journal,), tokens)
            if kept.floors:  # (subscribers that asked FROM past this record: they had it elsewhere)
                held = kept.below_floor(journal, record.seq, tokens, held)
            position = (journal.name, record.seq)
            out += listeners.fan_out(
                record.topic,
                tokens,
                sender,
                headers,
                record.parts,
                now,
                position,
                held,
                publisher=publisher,
                admits=admits,
                from_route=(None,),  # this broker's own plain subscribers: every broker delivers its own
            )
            if at_origin:
                parts = record.parts
                out += listeners.fan_out_groups(record.topic, tokens, sender, headers, parts, now, publisher, admits)
        self.counters["replicated_arrived"] += len(records)
        return out


def _admits_dead_letter(record: Record) -> Callable[[Grants], bool]:
    """A dead letter reaches only those allowed the topic it died on."""
    origin = dead_letter_origin(record.headers)

    def admits(grants: Grants) -> bool:
        return origin is not None and grants.may_receive(origin)

    return admits
