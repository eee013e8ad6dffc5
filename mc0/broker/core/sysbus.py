"""SysBus: the broker's own publications on ``mc0.sys.*`` (telemetry records -> journals and subscribers).

Contract: ``wants(topic)`` says whether anyone subscribes to, or a journal
keeps, a telemetry topic (checked before a record is built: the common case
costs two cached trie lookups, and ``wants_rpc`` caches even that until the
subscriptions change); ``publish(record, now)`` appends the record's JSON
body to the journals that keep its topic and fans it out like a PUT from
``mc0.broker``.  It reads its siblings through two narrow protocols:
``Subscribers`` (the pub/sub room) and ``TopicJournals`` (the journaling room).
A dead letter goes only to subscribers allowed the topic it died on
(:mod:`.access`).  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

from ... import protocol as P
from ...message import Record
from ...permissions import Grants
from ...protocol import SYS_PEER_TOPIC, SYS_RPC_TOPIC
from ...protocol import jetstream as jsw
from ...topics import split_topic
from ..storage.port import JournalStore, Kept
from . import telemetry
from .access import dead_letter_origin
from .journaling import primary
from .peers import Out, Peer
from .telemetry import BROKER_SENDER, TelemetryRecord

_SENDER = BROKER_SENDER.encode()


def _standalone() -> str:
    return ""


class Subscribers(Protocol):
    """Who wants a topic, and a message handed to them (the pub/sub room: ``PubSub``)."""

    @property
    def version(self) -> int:
        """Changes whenever a subscription does (what ``wants_rpc`` caches its answer under)."""
        ...

    def wanted(self, tokens: tuple[str, ...]) -> bool: ...

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
        admits: Callable[[Grants], bool] | None = None,
    ) -> list[Out]: ...


class TopicJournals(Protocol):
    """Which journals keep a topic, an append to them, and who waits for it in a replay (the journaling
    room: ``Journaling``)."""

    def journals_of(self, tokens: tuple[str, ...]) -> Sequence[JournalStore]: ...

    def append(
        self,
        journals: Sequence[JournalStore],
        first: JournalStore,
        topic: str,
        sender: str,
        headers: dict[str, str],
        body: Sequence[bytes],
        *,
        origin: str = "",
    ) -> Kept | None: ...

    def held_back(self, appended: Sequence[JournalStore], tokens: tuple[str, ...]) -> set[Peer] | None: ...


class SysBus:
    def __init__(
        self,
        subscribers: Subscribers,
        journals: TopicJournals,
        counters: Counter[str],
        wall_offset: float,
        *,
        broker_name: Callable[[], str] = _standalone,
    ) -> None:
        """``subscribers``: who wants a topic (the pub/sub room); ``journals``: which journals keep it (the
        journaling room); ``broker_name()``: this broker's cluster name ("" standalone): what it publishes
        to a JetStream journal says it comes from here (``origin``)."""
        self._subscribers = subscribers
        self._journals = journals
        self.counters = counters
        self.wall_offset = wall_offset
        self._tokens = {t: split_topic(t) for t in (SYS_RPC_TOPIC, SYS_PEER_TOPIC)}
        self._rpc_interest = (-1, False)  # (subscribers.version, anyone wants mc0.sys.rpc)
        self._broker_name = broker_name

    @property
    def origin(self) -> str:
        """Who publishes, to a JetStream journal (mc0.protocol.jetstream.origin): this broker."""
        name = self._broker_name()
        return jsw.origin(name) if name else ""

    def wants(self, topic: str) -> bool:
        tokens = self._tokens[topic]
        return self._subscribers.wanted(tokens) or bool(self._journals.journals_of(tokens))

    def wants_rpc(self) -> bool:
        """``wants(mc0.sys.rpc)``, asked for every finished request: cached until subscriptions change."""
        version = self._subscribers.version
        if version != self._rpc_interest[0]:
            self._rpc_interest = (version, self.wants(SYS_RPC_TOPIC))
        return self._rpc_interest[1]

    def publish(self, record: TelemetryRecord, now: float) -> list[Out]:
        """Journal and fan out one record (callers checked ``wants`` first)."""
        topic = record.topic
        tokens = self._tokens[topic]
        journals = self._journals.journals_of(tokens)
        body = telemetry.body(record, now + self.wall_offset)
        self.counters["telemetry"] += 1
        position: tuple[str, int] | None = None
        held = None
        if journals:
            first = primary(journals)
            kept = self._journals.append(journals, first, topic, BROKER_SENDER, {}, body, origin=self.origin)
            if kept is not None:
                seq, _ = kept
                if not seq:  # its seq comes later (JetStream's: a token), or never (NOT_KEPT: its budget spent)
                    return []  # delivered when the stream hands it out, by every broker to its own subscribers
                position = (first.name, seq)
                held = self._journals.held_back(journals, tokens)
        return self._subscribers.fan_out(topic, tokens, _SENDER, {}, body, now, position, held)

    def publish_dead_letter(self, topic: str, record: Record, reason: str, deliveries: int, now: float) -> list[Out]:
        """A durable consumer gave up on ``record``: publish it on ``topic`` (mc0.sys.dead.J.C) with
        its body, its user headers (``X-`` and the trace context) and ``X-Dead-*`` headers saying why,
        journaled where a journal keeps it."""
        tokens = split_topic(topic)
        headers = {
            **{k: v for k, v in record.headers.items() if P.carried(k)},
            "X-Dead-Reason": reason,
            P.DEAD_TOPIC_HEADER: record.topic,
            "X-Dead-Seq": str(record.seq),
            "X-Dead-Deliveries": str(deliveries),
            "X-Dead-Sender": record.sender,
        }
        self.counters["dead_letters"] += 1
        journals = self._journals.journals_of(tokens)
        position: tuple[str, int] | None = None
        held = None
        if journals:
            first = primary(journals)
            parts = record.parts
            kept = self._journals.append(journals, first, topic, BROKER_SENDER, headers, parts, origin=self.origin)
            if kept is not None:
                seq, _ = kept
                if not seq:
                    return []  # (as in publish)
                position = (first.name, seq)
                held = self._journals.held_back(journals, tokens)
        origin = dead_letter_origin(headers)  # it reaches only those allowed the topic it died on

        def admits(grants: Grants) -> bool:
            return origin is not None and grants.may_receive(origin)

        return self._subscribers.fan_out(
            topic, tokens, _SENDER, headers, record.parts, now, position, held, admits=admits
        )
