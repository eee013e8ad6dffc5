"""SysBus: the broker's own publications on ``mc0.sys.*`` (telemetry records -> journals and subscribers).

Contract: ``wants(topic)`` says whether anyone subscribes to, or a journal
keeps, a telemetry topic (checked before a record is built: the common case
costs two cached trie lookups, and ``wants_rpc`` caches even that until the
subscriptions change); ``publish(record, now)`` appends the record's JSON
body to the journals that keep its topic and fans it out like a PUT from
``mc0.broker``.  A dead letter goes only to subscribers allowed the topic it died on
(:mod:`.access`).  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from ... import protocol as P
from ...message import Record
from ...permissions import Grants
from ...protocol import SYS_PEER_TOPIC, SYS_RPC_TOPIC
from ...protocol import jetstream as jsw
from ...topics import split_topic
from . import telemetry
from .access import dead_letter_origin
from .journaling import Journaling, primary
from .peers import Out
from .pubsub import PubSub
from .telemetry import BROKER_SENDER, TelemetryRecord

_SENDER = BROKER_SENDER.encode()


def _standalone() -> str:
    return ""


class SysBus:
    def __init__(
        self,
        pubsub: PubSub,
        journaling: Journaling,
        counters: Counter[str],
        wall_offset: float,
        *,
        broker_name: Callable[[], str] = _standalone,
    ) -> None:
        """``broker_name()``: this broker's cluster name ("" standalone): what it publishes to a JetStream
        journal says it comes from here (``origin``)."""
        self.pubsub = pubsub
        self.journaling = journaling
        self.counters = counters
        self.wall_offset = wall_offset
        self._tokens = {t: split_topic(t) for t in (SYS_RPC_TOPIC, SYS_PEER_TOPIC)}
        self._rpc_interest = (-1, False)  # (pubsub.version, anyone wants mc0.sys.rpc)
        self._broker_name = broker_name

    @property
    def origin(self) -> str:
        """Who publishes, to a JetStream journal (mc0.protocol.jetstream.origin): this broker."""
        name = self._broker_name()
        return jsw.origin(name) if name else ""

    def wants(self, topic: str) -> bool:
        tokens = self._tokens[topic]
        return self.pubsub.wanted(tokens) or bool(self.journaling.journals_of(tokens))

    def wants_rpc(self) -> bool:
        """``wants(mc0.sys.rpc)``, asked for every finished request: cached until subscriptions change."""
        version = self.pubsub.version
        if version != self._rpc_interest[0]:
            self._rpc_interest = (version, self.wants(SYS_RPC_TOPIC))
        return self._rpc_interest[1]

    def publish(self, record: TelemetryRecord, now: float) -> list[Out]:
        """Journal and fan out one record (callers checked ``wants`` first)."""
        topic = record.topic
        tokens = self._tokens[topic]
        journals = self.journaling.journals_of(tokens)
        body = telemetry.body(record, now + self.wall_offset)
        self.counters["telemetry"] += 1
        position: tuple[str, int] | None = None
        held = None
        if journals:
            first = primary(journals)
            seq = self.journaling.append(journals, first, topic, BROKER_SENDER, {}, body, origin=self.origin)
            if first.settings.replicated:
                return []  # delivered when the stream hands it out, by every broker to its own subscribers
            if seq is not None:
                position = (first.name, seq)
                held = self.journaling.held_back(journals, tokens)
        return self.pubsub.fan_out(topic, tokens, _SENDER, {}, body, now, position, held)

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
        journals = self.journaling.journals_of(tokens)
        position: tuple[str, int] | None = None
        held = None
        if journals:
            first = primary(journals)
            parts = record.parts
            seq = self.journaling.append(journals, first, topic, BROKER_SENDER, headers, parts, origin=self.origin)
            if first.settings.replicated:
                return []  # (as in publish)
            if seq is not None:
                position = (first.name, seq)
                held = self.journaling.held_back(journals, tokens)
        origin = dead_letter_origin(headers)  # it reaches only those allowed the topic it died on

        def admits(grants: Grants) -> bool:
            return origin is not None and grants.may_receive(origin)

        return self.pubsub.fan_out(topic, tokens, _SENDER, headers, record.parts, now, position, held, admits=admits)
