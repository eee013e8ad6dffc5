"""The client side of the batched wire: one ``BATCH`` message from the broker, decoded in one pass.

Contract: a mixin of :class:`mc0.session.ClientSession` (which owns the
state it reads).  MESSAGE records are handed to ``deliver`` as they are
decoded (no event object per message); WORK and PARTIAL/FINAL records become
events; any other record is handled as if it came alone.  A blob that stops
splitting into records is counted as malformed from there on.  No sockets,
no clock.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence

from .errors import InvalidTopic, ProtocolError
from .events import Answer, Delivery, Event, Work
from .message import Message, new_message
from .protocol import Command, Header, Status, Verb, batch
from .topics import split_topic
from .trie import TopicTrie

log = logging.getLogger("mc0.client")

Frames = list[bytes]
CACHE_SIZE = 4096  # topics and senders remembered as already decoded


class BatchedReceive:
    last_recv: float
    malformed: int
    _routed: dict[bytes, tuple[str, tuple[str, ...]]]
    _senders: dict[bytes, str]
    _routes: TopicTrie[str]
    _group_routes: dict[str, TopicTrie[str]]
    _group_routed: dict[tuple[bytes, bytes], tuple[str, str, tuple[str, ...]]]
    _requests: set[str]
    receive: Callable[[Sequence[bytes], float], tuple[list[Event], list[Frames]]]

    def receive_batch(
        self,
        blob: bytes,
        now: float,
        deliver: Callable[[Message, tuple[str, ...]], None],
        final: Callable[[str, bytes], bool] | None = None,
    ) -> tuple[list[Event], list[Frames]]:
        """A BATCH message from the broker -> (events, frames to send), decoded in one pass.

        Each MESSAGE shortcut is handed to ``deliver(message, local patterns)``
        as it is decoded (no event object per message); so is each FINAL shortcut
        to ``final(request id, body)`` when given, which says whether it took it
        (else it becomes an ``Answer`` as any other reply); anything else is
        handled as if it came alone and becomes events.  A blob that stops
        splitting into records is counted as malformed from there.
        """
        self.last_recv = now
        events: list[Event] = []
        replies: list[Frames] = []
        routed = self._routed
        senders = self._senders
        unpack_u16 = batch.U16.unpack_from
        try:
            for code, start, end in batch.records(blob):
                if code == batch.MESSAGE:
                    (sl,) = unpack_u16(blob, start)
                    s = start + 2 + sl
                    (tl,) = unpack_u16(blob, s)
                    t = s + 2 + tl
                    if t > end:
                        raise ProtocolError(Status.BAD_REQUEST, "MESSAGE record fields run past its end")
                    sender_b = blob[start + 2 : s]
                    sender = senders.get(sender_b)
                    if sender is None:
                        sender = self._sender(sender_b)
                    topic_b = blob[s + 2 : t]
                    route = routed.get(topic_b)
                    if route is None:
                        route = self._route(topic_b)
                    deliver(new_message(route[0], blob[t:end], sender), route[1])
                    continue
                if code == batch.WORK:
                    events.append(self._work_record(blob, start, end))
                    continue
                if code == batch.FRAMES and (fields := batch.group_message_fields(blob, start, end)) is not None:
                    topic_b, sender_b, group_b, data = fields  # a queue-group copy: its own shortcut
                    sender = senders.get(sender_b)
                    if sender is None:
                        sender = self._sender(sender_b)
                    group_route = self._group_routed.get((group_b, topic_b))
                    if group_route is None:
                        group_route = self._group_route(group_b, topic_b)
                    deliver(new_message(group_route[0], data, sender, group_route[1]), group_route[2])
                    continue
                if code == batch.FINAL or code == batch.PARTIAL:
                    request_id, data = batch.reply_fields(blob, start, end)
                    if code == batch.FINAL:
                        self._requests.discard(request_id)
                        if final is not None and final(request_id, data):
                            continue
                    verb = Verb.FINAL if code == batch.FINAL else Verb.PARTIAL
                    events.append(Answer(request_id, Command(verb, {Header.ID: request_id}, (data,))))
                    continue
                more, answers = self.receive(batch.frames_of(blob, code, start, end), now)
                for event in more:  # a MESSAGE with headers is delivered in its place, in order
                    if type(event) is Delivery:
                        deliver(event.message, event.patterns)
                    else:
                        events.append(event)
                replies += answers
        except (ProtocolError, UnicodeDecodeError, struct.error) as exc:
            self.malformed += 1
            log.warning("malformed batch from broker, the rest dropped: %s", exc)
        return events, replies

    @staticmethod
    def _work_record(blob: bytes, start: int, end: int) -> Work:
        service, bid, caller, timeout_ms, data = batch.work_fields(blob, start, end)
        return Work(bid, service, caller, timeout_ms, {}, (data,))

    def _route(self, topic_b: bytes) -> tuple[str, tuple[str, ...]]:
        topic = topic_b.decode()
        try:
            tokens = split_topic(topic, max_bytes=1 << 30, max_tokens=1 << 30)
        except InvalidTopic:
            tokens = ()
        route = (topic, self._routes.match(tokens) if tokens else ())
        if len(self._routed) >= CACHE_SIZE:
            self._routed.clear()
        self._routed[topic_b] = route
        return route

    def _group_route(self, group_b: bytes, topic_b: bytes) -> tuple[str, str, tuple[str, ...]]:
        """(topic, group, the group's local subscriptions matching it), cached until they change."""
        topic, group = topic_b.decode(), group_b.decode()
        try:
            tokens = split_topic(topic, max_bytes=1 << 30, max_tokens=1 << 30)
        except InvalidTopic:
            tokens = ()
        routes = self._group_routes.get(group)
        route = (topic, group, routes.match(tokens) if routes is not None and tokens else ())
        if len(self._group_routed) >= CACHE_SIZE:
            self._group_routed.clear()
        self._group_routed[group_b, topic_b] = route
        return route

    def _sender(self, sender_b: bytes) -> str:
        sender = sender_b.decode()
        if len(self._senders) >= CACHE_SIZE:
            self._senders.clear()
        self._senders[sender_b] = sender
        return sender
