"""ClientSession: the client side of the protocol with no sockets and no clock.

Contract: the shells (:mod:`mc0.aio`, :mod:`mc0.client`) feed it received
frames and the time, send the frames it returns, and act on the events it
reports.  It owns everything a client must get right by itself:

* request ids, and which answer belongs to the CONNECT in flight;
* heartbeats (NOOP after ``HEARTBEAT_FRACTION`` x TTL of silence on our side:
  a broker may consider us gone at TTL) and broker liveness
  (``liveness x TTL`` without hearing from it -> CONNECT again);
* healing: on ``ERROR 401`` or ``DISCONNECT`` from the broker, on the
  socket reporting its connection lost then back (``link_lost``/``link_up``)
  or after ``liveness x TTL`` of silence it CONNECTs again and, once
  accepted, re-sends SUB for every pattern it holds;
* with ``failover`` (the shell has several endpoints) a broker that is gone
  (DISCONNECT, silence, the link lost) is reported as ``Reconnecting(lost=True)``
  with no CONNECT: the shell opens a link to another endpoint and calls
  ``connect``; the answer restores the session there as above;
* decoding what the broker sends, a ``BATCH`` in one pass: every MESSAGE,
  whatever its shape, becomes a :class:`~mc0.message.Message` the one way
  (:func:`~mc0.message.new_message`) for the local subscriptions the
  :class:`~mc0.pattern_table.PatternTable` matches it to, so overlapping
  subscriptions of one client each see it once;
* local validation of what the user asks to send (misuse raises here).

A replay's history (the records before the seq the OK to its ``SUB FROM``
names) goes to the replaying subscription alone (:func:`~mc0.events.replay_key`).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Mapping, Sequence

from . import protocol as P
from .errors import ProtocolError
from .events import (
    MAILBOX_KEY,
    MAILBOX_KEYS,
    Answer,
    CancelWork,
    Connected,
    ConnectRefused,
    Event,
    Fault,
    Received,
    Reconnecting,
    ReplayEnded,
    answer_error,
    group_key,
    replay_key,
    split_key,
)
from .message import Message, Request, new_message, new_request
from .pattern_table import PatternTable, Remembered
from .protocol import Command, Header, Limits, Side, Status, Verb, batch
from .topics import split_pattern, split_topic

log = logging.getLogger("mc0.client")

Frames = list[bytes]
# Patterns per SUB sent while healing (keeps each message well under max_frames).
RESUBSCRIBE_CHUNK = 256
CACHE_SIZE = 4096  # topics, senders and services remembered as already validated / decoded


# The events this session reports live in mc0.events (re-exported here for the shells).


__all__ = [
    "MAILBOX_KEY",
    "Answer",
    "CancelWork",
    "ClientSession",
    "ConnectRefused",
    "Connected",
    "Received",
    "Event",
    "Fault",
    "Frames",
    "Reconnecting",
    "ReplayEnded",
    "answer_error",
    "group_key",
    "replay_key",
]


class ClientSession:
    def __init__(
        self,
        *,
        ttl_ms: int = 5_000,
        liveness: int = 3,
        limits: Limits = P.DEFAULT_LIMITS,
        version: str = P.FULL_VERSION,
        batch: bool = True,
        echo: bool = True,
        failover: bool = False,
    ) -> None:
        if ttl_ms < 1:
            raise ValueError("ttl_ms must be at least 1")
        self.requested_ttl_ms = ttl_ms
        self.ttl = ttl_ms / 1000.0
        self.liveness = liveness
        self.limits = limits
        self.version = version
        self.connected = False
        self.ever_connected = False
        self.last_sent = 0.0
        self.last_recv = 0.0
        self._connect_id: str | None = None
        self._connect_sent = 0.0
        self._seq = 0
        self._pattern_refs: dict[str, int] = {}
        # Patterns subscribed FROM a seq: (journal, next seq to ask for) so that
        # healing resumes the replay where delivery stopped instead of going live only.
        self._resume: dict[str, tuple[str | None, int]] = {}
        self._replayer: dict[str, str] = {}  # such a pattern -> the ID of the SUB FROM that asked (its history's key)
        self._pattern_table = PatternTable()  # the local subscriptions a received MESSAGE is for
        # SUB FROM ids awaiting their OK (-> their patterns, the ID of the subscription's first SUB FROM: a
        # resumed one after a reconnect has an ID of its own), then per journal where that replay's history
        # ends (its OK's SEQ: the records before it went out live already), its first ID and patterns: a
        # record of its history is for the replaying subscription alone (``replay_key``), not for the others.
        self._replay_oks: dict[str, tuple[tuple[str, ...], str]] = {}
        self._resumed: set[str] = set()  # the IDs of resumed SUB FROMs (no call waits for their answers)
        self._histories: dict[str, tuple[int, str, tuple[str, ...]]] = {}
        self.malformed = 0
        self._requests: set[str] = set()  # REQUEST ids sent and not yet answered with a terminal
        self.services: tuple[str, ...] = ()  # served as a worker (READY after every CONNECT)
        self.capacity = 1
        self.batch_wanted = batch and version == P.FULL_VERSION
        self.echo = echo  # False: CONNECT ECHO 0 (the broker never hands us our own publishes)
        self.failover = failover  # a lost broker is left to the shell, which moves to another endpoint
        self.batched = False  # the broker granted BATCH 1: commands go out (and come in) as batch records
        self._topics: dict[str, bytes] = {}  # validated topics -> their bytes
        self._services: dict[str, bytes] = {}
        self._senders: Remembered[bytes, str] = Remembered(bytes.decode)  # received senders -> their text
        self._journal_names: Remembered[bytes, str] = Remembered(bytes.decode)  # received journal names -> text

    # ------------------------------------------------------------ ids and state
    def new_id(self) -> str:
        self._seq += 1
        return str(self._seq)

    @property
    def patterns(self) -> list[str]:
        return list(self._pattern_refs)

    def connect(self, now: float) -> Frames:
        """CONNECT frames; a new call supersedes an earlier CONNECT in flight."""
        self.connected = False
        self.batched = False  # until the broker grants it again
        self._requests.clear()  # a new session: the broker forgot them (the shell fails them)
        self._connect_id = self.new_id()
        self._connect_sent = now
        self.last_recv = now
        fields: dict[str, str] = {Header.VERSION: self.version, Header.TTL: str(self.requested_ttl_ms)}
        if self.batch_wanted:
            fields[Header.BATCH] = "1"
        if not self.echo:
            fields[Header.ECHO] = P.ECHO_OFF
        fields[Header.ID] = self._connect_id
        return P.encode(Verb.CONNECT, fields)

    def sent(self, now: float) -> None:
        """The shell sent something at ``now`` (heartbeats are skipped while busy)."""
        self.last_sent = now

    # ------------------------------------------------------------ building commands
    def publish(
        self,
        topic: str,
        body: bytes | Sequence[bytes],
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
        msgid: str | None = None,
        to: str | None = None,
    ) -> Frames:
        """PUT frames, validated locally (bad input raises, nothing is sent); ``to``: a direct message."""
        limits = self.limits
        split_topic(topic, max_bytes=limits.max_topic_bytes, max_tokens=limits.max_topic_tokens)
        parts = _parts(body)
        if not parts:
            raise ProtocolError(Status.BAD_REQUEST, "a message needs at least one body frame")
        fields: dict[str, str] = {Header.TOPIC: topic}
        if request_id is not None:
            fields[Header.ID] = request_id
        if msgid is not None:
            if not msgid:
                raise ProtocolError(Status.BAD_REQUEST, "msgid must not be empty")
            fields[Header.MSGID] = msgid
        if to is not None:
            if not P.valid_group(to):
                raise ProtocolError(Status.BAD_REQUEST, f"to {to!r}: an identity without whitespace, 1 to 255 bytes")
            fields[Header.TO] = to
        self._user_fields(fields, headers)
        if len(fields) > limits.max_headers:
            raise ProtocolError(Status.TOO_LARGE, f"more than {limits.max_headers} headers")
        return self._checked(P.encode(Verb.PUT, fields, parts))

    def _user_fields(self, fields: dict[str, str], headers: Mapping[str, str] | None) -> None:
        if headers:
            for key, value in headers.items():
                if not P.is_user_header(key):
                    raise ProtocolError(Status.BAD_REQUEST, f"user header {key!r} must be ASCII and start with X-")
                fields[key] = value

    def _checked(self, frames: Frames) -> Frames:
        limits = self.limits
        if len(frames) > limits.max_frames:
            raise ProtocolError(Status.TOO_LARGE, f"{len(frames)} frames, the limit is {limits.max_frames}")
        size = sum(map(len, frames))
        if size > limits.max_message_bytes:
            raise ProtocolError(Status.TOO_LARGE, f"{size} bytes, the limit is {limits.max_message_bytes}")
        return frames

    def request(
        self,
        service: str,
        body: bytes | Sequence[bytes],
        request_id: str,
        timeout_ms: int,
        headers: Mapping[str, str] | None = None,
        scatter: bool = False,
    ) -> Frames:
        """REQUEST frames, validated locally."""
        split_topic(service, max_bytes=P.MAX_SERVICE_BYTES, max_tokens=self.limits.max_topic_tokens)
        if timeout_ms < 1:
            raise ValueError("timeout must be positive")
        fields: dict[str, str] = {Header.SERVICE: service, Header.ID: request_id, Header.TIMEOUT: str(timeout_ms)}
        if scatter:
            fields[Header.ALL] = "1"
        self._user_fields(fields, headers)
        parts = _parts(body)
        frames = self._checked(P.encode(Verb.REQUEST, fields, parts))
        self._requests.add(request_id)
        return frames

    def cancel(self, request_id: str) -> Frames:
        return P.cancel(request_id)

    def serve(self, services: Sequence[str], capacity: int, request_id: str | None = None) -> Frames | None:
        """Record what we serve; READY frames (with ``request_id``, to be confirmed) if connected."""
        for name in services:
            split_topic(name, max_bytes=P.MAX_SERVICE_BYTES, max_tokens=self.limits.max_topic_tokens)
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.services = tuple(dict.fromkeys(services))
        self.capacity = capacity
        return self._ready(request_id) if self.connected else None

    def withdraw(self, request_id: str) -> Frames:
        """READY with no services (to be confirmed): the broker sends no more work, while the
        replies to what we hold are still taken.  Nothing is re-registered after a reconnect."""
        self.services = ()
        return P.encode(Verb.READY, {Header.ID: request_id}, [])

    def _ready(self, request_id: str | None = None) -> Frames | None:
        if not self.services:
            return None
        fields: dict[str, str] = {Header.CAPACITY: str(self.capacity)}
        if request_id is not None:
            fields[Header.ID] = request_id
        return P.encode(Verb.READY, fields, [s.encode() for s in self.services])

    def reply(
        self, verb: Verb, bid: str, body: bytes | Sequence[bytes], headers: Mapping[str, str] | None = None
    ) -> Frames:
        """PARTIAL or FINAL frames for a request we were given."""
        fields: dict[str, str] = {Header.ID: bid}
        self._user_fields(fields, headers)
        return self._checked(P.encode(verb, fields, _parts(body)))

    def fail(self, bid: str, code: int, message: str) -> Frames:
        return P.encode(Verb.ERROR, {Header.ID: bid, Header.CODE: str(code), Header.MESSAGE: message[:2000]})

    def add_pattern(self, pattern: str, request_id: str | None = None, group: str | None = None) -> Frames | None:
        """Count a local subscription (in a queue ``group``); SUB frames when the broker must be told."""
        tokens = split_pattern(pattern, max_bytes=self.limits.max_topic_bytes, max_tokens=self.limits.max_topic_tokens)
        if group is not None and not P.valid_group(group):
            reason = f"group {group!r}: 1 to {P.MAX_GROUP_BYTES} UTF-8 bytes without whitespace"
            raise ProtocolError(Status.BAD_REQUEST, reason)
        key = group_key(pattern, group)
        refs = self._pattern_refs.get(key, 0)
        self._pattern_refs[key] = refs + 1
        if refs:
            return None
        self._pattern_table.add(tokens, key, group)
        return self._sub(group, [pattern.encode()], request_id)

    @staticmethod
    def _sub(group: str | None, patterns: list[bytes], request_id: str | None = None, verb: Verb = Verb.SUB) -> Frames:
        fields: dict[str, str] = {}
        if request_id is not None:
            fields[Header.ID] = request_id
        if group is not None:
            fields[Header.GROUP] = group
        return P.encode(verb, fields or None, patterns)

    def replay_patterns(self, patterns: Sequence[str], from_seq: int, journal: str | None, request_id: str) -> Frames:
        """Count local subscriptions and build ``SUB FROM``: history for every
        pattern (even one already subscribed), then live."""
        if from_seq < 0:
            raise ProtocolError(Status.BAD_REQUEST, f"from_seq must be >= 0, got {from_seq}")
        for pattern in patterns:
            self.add_pattern(pattern)
            self._resume[pattern] = (journal, from_seq)
            self._replayer[pattern] = request_id
        self._replay_oks[request_id] = (tuple(patterns), request_id)
        return self._sub_from(patterns, journal, from_seq, request_id)

    def end_replay(self, key: str) -> None:
        """The subscription whose history goes to ``key`` (its ``replay_key``) ended: its patterns are
        no longer resumed FROM a seq (another subscription holding one is re-subscribed live)."""
        for pattern in [p for p, rid in self._replayer.items() if replay_key(rid) == key]:
            del self._replayer[pattern]
            self._resume.pop(pattern, None)

    def _history_begins(self, request_id: str, command: Command) -> None:
        """The answer to a SUB FROM: an ``OK JOURNAL j SEQ n`` (a broker from before says neither) names
        the journal replayed and where its history ends."""
        patterns, first_id = self._replay_oks.pop(request_id)
        journal = command.headers.get(Header.JOURNAL)
        end = P.decimal(command.headers.get(Header.SEQ, ""))
        if command.verb is Verb.OK and journal is not None and end is not None:
            self._histories[journal] = (end, first_id, patterns)

    def _history_keys(self, journal: str, seq: int, keys: tuple[str, ...]) -> tuple[str, ...]:
        """The local keys of a record of a journal being replayed: before where its history ends, only the
        replaying subscription's; the first at or past it on the replay's patterns ends the history (the
        replay reached what was new when it began, which every subscription gets)."""
        end, request_id, patterns = self._histories[journal]
        if not any(pattern in keys for pattern in patterns):
            return keys
        if seq < end:
            return (replay_key(request_id),)
        del self._histories[journal]
        return keys

    @staticmethod
    def _sub_from(patterns: Sequence[str], journal: str | None, from_seq: int, request_id: str | None) -> Frames:
        fields: dict[str, str] = {Header.FROM: str(from_seq)}
        if request_id is not None:
            fields[Header.ID] = request_id
        if journal is not None:
            fields[Header.JOURNAL] = journal
        return P.encode(Verb.SUB, fields, [p.encode() for p in patterns])

    def drop_pattern(self, pattern: str, group: str | None = None) -> Frames | None:
        """Release one local subscription; UNSUB frames when it was the last."""
        key = group_key(pattern, group)
        refs = self._pattern_refs.get(key, 0)
        if refs == 0:
            return None
        if refs > 1:
            self._pattern_refs[key] = refs - 1
            return None
        del self._pattern_refs[key]
        self._resume.pop(key, None)
        self._replayer.pop(key, None)
        tokens = split_pattern(pattern, max_bytes=1 << 30, max_tokens=1 << 30)
        self._pattern_table.remove(tokens, key, group)
        return self._sub(group, [pattern.encode()], verb=Verb.UNSUB)

    def unsub_frames(self, pattern: str, group: str | None = None) -> Frames:
        """UNSUB for a pattern still held locally (``drain``: routing stays until the broker confirms)."""
        return self._sub(group, [pattern.encode()], verb=Verb.UNSUB)

    def ping(self, request_id: str) -> Frames:
        return P.encode(Verb.PING, {Header.ID: request_id})

    def disconnect(self, request_id: str | None = None) -> Frames:
        """DISCONNECT frames (with an ID when the caller wants the broker's OK)."""
        return P.encode(Verb.DISCONNECT, {Header.ID: request_id} if request_id else None)

    # ------------------------------------------------------------ batched framing
    def topic_bytes(self, topic: str) -> bytes:
        """A topic to publish on, validated once (InvalidTopic for a bad one)."""
        encoded = self._topics.get(topic)
        if encoded is None:
            limits = self.limits
            split_topic(topic, max_bytes=limits.max_topic_bytes, max_tokens=limits.max_topic_tokens)
            if len(self._topics) >= CACHE_SIZE:
                self._topics.clear()
            encoded = self._topics[topic] = topic.encode()
        return encoded

    def publish_record(self, topic: str, data: bytes) -> bytes:
        """``PUT TOPIC topic "" data`` as a batch record (the fire-and-forget hot path)."""
        topic_b = self.topic_bytes(topic)
        if len(data) > self.limits.max_message_bytes:
            raise ProtocolError(Status.TOO_LARGE, f"{len(data)} bytes, the limit is {self.limits.max_message_bytes}")
        return batch.put_record(topic_b, data)

    def call_record(self, service: str, data: bytes, request_id: str, timeout_ms: int) -> bytes:
        """``REQUEST SERVICE s ID id TIMEOUT ms "" data`` as a batch record."""
        service_b = self._services.get(service)
        if service_b is None:
            split_topic(service, max_bytes=P.MAX_SERVICE_BYTES, max_tokens=self.limits.max_topic_tokens)
            if len(self._services) >= CACHE_SIZE:
                self._services.clear()
            service_b = self._services[service] = service.encode()
        if not 1 <= timeout_ms < 1 << 32:
            raise ValueError("timeout must be positive")
        if len(data) > self.limits.max_message_bytes:
            raise ProtocolError(Status.TOO_LARGE, f"{len(data)} bytes, the limit is {self.limits.max_message_bytes}")
        self._requests.add(request_id)
        return batch.call_record(service_b, request_id.encode(), timeout_ms, data)

    def to_send(self, frames: Frames) -> bytes:
        """Any command as a batch record (for a batched session's outgoing buffer)."""
        return batch.record_of(frames)

    # ------------------------------------------------------------ input
    def receive(self, frames: Sequence[bytes], now: float) -> tuple[list[Event], list[Frames]]:
        """Broker frames -> (events for the shell, frames to send now)."""
        self.last_recv = now
        try:
            command = P.decode(frames, sender=Side.BROKER, limits=self.limits)
        except ProtocolError as exc:
            self.malformed += 1
            log.warning("malformed message from broker dropped: %s", exc)
            return [], []
        verb = command.verb
        if verb is Verb.MESSAGE:
            return [self._received(command)], []
        if verb is Verb.REQUEST:
            return [self._work(command, now)], []
        if verb is Verb.CANCEL:
            return [CancelWork(command.headers[Header.ID])], []
        if verb is Verb.NOOP:
            return [], []
        request_id = command.id
        if request_id is not None and request_id == self._connect_id:
            return self._connect_answer(command)
        if request_id is not None and (verb is Verb.FINAL or verb is Verb.ERROR):
            if request_id in self._requests:
                self._requests.discard(request_id)
                if verb is Verb.ERROR and answer_error(command).code == Status.NOT_CONNECTED:
                    # An answer to a request never resets the connection by itself (a worker
                    # must not be able to make its callers reconnect): probe the broker instead;
                    # a 401 to the probe heals.
                    return [Answer(request_id, command)], [self.ping(self.new_id())]
                return [Answer(request_id, command)], []
        if verb is Verb.ERROR:
            error = answer_error(command)
            if error.code == Status.NOT_CONNECTED:
                events: list[Event] = [Reconnecting(f"broker does not know us: {error.reason}")]
                if request_id is not None:
                    events.append(Answer(request_id, command))
                else:
                    events.insert(0, Fault(error))  # volunteered (e.g. "key revoked"): worth recording
                return events, [self.connect(now)]
            if request_id is None:
                journal = command.headers.get(Header.JOURNAL)
                if journal is not None:  # a replay ended, its SUB stays: nothing withdrawn
                    history = self._histories.pop(journal, None)
                    key = replay_key(history[1]) if history is not None else None
                    return [ReplayEnded(error, journal, command.headers.get(Header.TOPIC, ""), key)], []
                withdrawn = command.headers.get(Header.TOPIC)
                if withdrawn is not None:
                    group = command.headers.get(Header.GROUP)
                    withdrawn = group_key(withdrawn, group)
                    if withdrawn in self._pattern_refs:
                        self._pattern_refs[withdrawn] = 1
                        self.drop_pattern(*split_key(withdrawn))  # the broker already forgot it: no UNSUB
                return [Fault(error, withdrawn)], []
        if request_id is not None and self._replay_oks and request_id in self._replay_oks:
            if request_id in self._resumed:
                self._resumed.discard(request_id)
                if verb is Verb.ERROR:  # no call waits: the replaying subscription ends with the reason
                    return self._resume_refused(request_id, command)
            self._history_begins(request_id, command)  # (in order: before any record of its replay)
        if verb is Verb.DISCONNECT:
            if self.failover:
                return self._lost("broker sent DISCONNECT", now), []
            return [Reconnecting("broker sent DISCONNECT", lost=True)], [self.connect(now)]
        if request_id is not None:
            return [Answer(request_id, command)], []
        return [], []  # pragma: no cover - decode guarantees an ID for OK/PONG

    def _connect_answer(self, command: Command) -> tuple[list[Event], list[Frames]]:
        self._connect_id = None
        if command.verb is not Verb.OK:
            return [ConnectRefused(answer_error(command))], []
        ttl_ms = P.decimal(command.headers.get(Header.TTL, "")) or self.requested_ttl_ms
        self.ttl = ttl_ms / 1000.0
        self.batched = self.batch_wanted and command.headers.get(Header.BATCH) == "1"
        healed = self.ever_connected
        self.connected = self.ever_connected = True
        self._replay_oks.clear()
        self._resumed.clear()
        self._histories.clear()  # (the broker forgot them; each resumed replay's OK says where its history ends)
        by_group: dict[str | None, list[bytes]] = {}
        for key in self._pattern_refs:
            if key not in self._resume:
                pattern, group = split_key(key)
                by_group.setdefault(group, []).append(pattern.encode())
        resubscribe = [
            self._sub(group, patterns[i : i + RESUBSCRIBE_CHUNK])
            for group, patterns in by_group.items()
            for i in range(0, len(patterns), RESUBSCRIBE_CHUNK)
        ]
        # Each replaying subscription resumes with an ID of its own: its OK says where this history ends,
        # and the history goes to that subscription alone (by its first ID's key), as the first one did.
        resumed: dict[tuple[str | None, int, str], list[str]] = {}
        for pattern, (journal, next_seq) in self._resume.items():
            resumed.setdefault((journal, next_seq, self._replayer.get(pattern, "")), []).append(pattern)
        for (journal, next_seq, first_id), replayed in resumed.items():
            request_id = self.new_id()
            self._replay_oks[request_id] = (tuple(replayed), first_id or request_id)
            self._resumed.add(request_id)
            resubscribe.append(self._sub_from(replayed, journal, next_seq, request_id))
        ready = self._ready()
        if ready is not None:
            resubscribe.append(ready)
        return [Connected(ttl_ms, healed)], resubscribe

    def _resume_refused(self, request_id: str, command: Command) -> tuple[list[Event], list[Frames]]:
        """A resumed SUB FROM was refused (410: retention passed where it stood): the broker subscribed
        nothing, so its patterns are subscribed live again (for the other subscriptions that hold them;
        the replaying one's release UNSUBs those no other holds) and the replaying subscription ends with
        the reason, as when a replay ends."""
        patterns, first_id = self._replay_oks.pop(request_id)
        journal = self._resume.get(patterns[0], (None, 0))[0]
        frames = [self._sub(None, [p.encode() for p in patterns])]
        ended = ReplayEnded(answer_error(command), journal or "", patterns[0], replay_key(first_id))
        return [ended], frames

    def _work(self, command: Command, now: float) -> Request:
        """A REQUEST given to us as a worker: the Request its handler gets, due TIMEOUT after ``now``."""
        headers = command.headers
        timeout_ms = P.decimal(headers[Header.TIMEOUT]) or 0
        parts = tuple(bytes(p) for p in command.payload)
        return new_request(
            headers[Header.ID],
            headers[Header.SERVICE],
            parts,
            command.user_headers(),
            headers[Header.CALLER],
            now + timeout_ms / 1000,
        )

    def _received(self, command: Command) -> Received:
        """A MESSAGE the general way (any headers, any number of body frames)."""
        headers = command.headers
        topic = headers[Header.TOPIC]
        seq_text = headers.get(Header.SEQ)
        seq = P.decimal(seq_text) if seq_text is not None else None
        journal = headers.get(Header.JOURNAL)
        group = headers.get(Header.GROUP)
        parts = tuple(bytes(p) for p in command.payload)
        message = new_message(topic, parts, headers.get(Header.SENDER), command.user_headers(), journal, seq, group)
        if Header.TO in headers:  # a direct message: the mailbox gets it
            return Received(message, MAILBOX_KEYS)
        # A queue group's copy is for that group's subscriptions only.
        _, _, keys = self._pattern_table.match(topic.encode(), group.encode() if group is not None else None)
        if seq is not None and group is None and self._resume:
            for pattern in keys:
                if pattern in self._resume:
                    self._resume[pattern] = (journal, seq + 1)
        if self._histories and seq is not None and journal in self._histories:
            keys = self._history_keys(journal, seq, keys)
        return Received(message, keys)

    def _journaled(
        self, topic_b: bytes, sender_b: bytes, journal_b: bytes, seq: int, data: bytes
    ) -> tuple[Message, tuple[str, ...]]:
        """A journaled PUT's live copy read from its record (``batch.journaled_message_fields``): the
        Message and local keys ``_received`` makes of the same frames, without decoding them."""
        topic, _, keys = self._pattern_table.matches[topic_b]
        journal = self._journal_names[journal_b]
        message = new_message(topic, (data,), self._senders[sender_b], {}, journal, seq, None)
        if self._resume:
            for pattern in keys:
                if pattern in self._resume:
                    self._resume[pattern] = (journal, seq + 1)
        if self._histories and journal in self._histories:
            keys = self._history_keys(journal, seq, keys)
        return message, keys

    # ------------------------------------------------------------ batched input
    def receive_batch(
        self,
        blob: bytes,
        now: float,
        deliver: Callable[[list[Message], tuple[str, ...]], None],
        final: Callable[[str, bytes], bool] | None = None,
    ) -> tuple[list[Event], list[Frames]]:
        """A BATCH message from the broker -> (events, frames to send), decoded in one pass.

        The MESSAGEs are handed to ``deliver(messages, local keys)`` in order, each
        run of them for the same local keys in one call (no event object per
        message, one call into the shell per run rather than per message;
        the list is the callee's to read, not to keep): the shortcut shapes
        read by :func:`mc0.protocol.batch.received` and a journaled PUT's live
        copy (:func:`mc0.protocol.batch.journaled_message_fields`), any other
        (headers, several body frames) through :meth:`receive` as if it came alone.  Each FINAL
        shortcut goes to ``final(request id, body)`` when given, which says
        whether it took it (else it becomes an ``Answer`` as any other reply);
        anything else is handled as if it came alone and becomes events.  A
        blob that stops splitting into records is counted as malformed from there.
        """
        self.last_recv = now
        events: list[Event] = []
        replies: list[Frames] = []
        senders = self._senders
        matches, group_matches = self._pattern_table.matches, self._pattern_table.group_matches
        run: list[Message] = []  # the messages decoded for run_keys, not handed over yet
        run_keys: tuple[str, ...] = ()
        try:
            for code, start, end, sender_b, topic_b, group_b, data in batch.received(blob):
                if code == batch.MESSAGE:  # (PatternTable.match, as dict lookups: once per message)
                    topic, group, keys = matches[topic_b] if group_b is None else group_matches[group_b, topic_b]
                    if keys is not run_keys:  # (the same topic's keys are the same tuple: a cached match)
                        if run:
                            deliver(run, run_keys)
                            run = []
                        run_keys = keys
                    run.append(new_message(topic, (data,), senders[sender_b], {}, None, None, group))
                    continue
                if code == batch.FRAMES and (journaled := batch.journaled_message_fields(blob, start, end)):
                    message, keys = self._journaled(*journaled)  # a journaled PUT's live copy
                    if keys is not run_keys:
                        if run:
                            deliver(run, run_keys)
                            run = []
                        run_keys = keys
                    run.append(message)
                    continue
                if code == batch.WORK:
                    service, bid, caller, timeout_ms, data = batch.work_fields(blob, start, end)
                    events.append(new_request(bid, service, (data,), {}, caller, now + timeout_ms / 1000))
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
                    if type(event) is Received:
                        if event.keys != run_keys:
                            if run:
                                deliver(run, run_keys)
                                run = []
                            run_keys = event.keys
                        run.append(event.message)
                    else:
                        events.append(event)
                replies += answers
        except (ProtocolError, UnicodeDecodeError, struct.error) as exc:
            self.malformed += 1
            log.warning("malformed batch from broker, the rest dropped: %s", exc)
        if run:  # (what was decoded before a malformed record is delivered too)
            deliver(run, run_keys)
        return events, replies

    # ------------------------------------------------------------ the link under the session
    def link_lost(self) -> list[Event]:
        """The socket reported its connection closed.  Whatever broker answers next has
        forgotten this session (a restart, or the broker dropped a closed connection's
        session), so stop sending through it: what is published now waits in the shell's
        buffer, and requests in flight are failed by the shell."""
        if not self.connected:
            return []
        self.connected = False
        self._requests.clear()
        return [Reconnecting("connection to the broker lost", lost=True)]

    def _lost(self, reason: str, now: float) -> list[Event]:
        """``failover``: the broker is gone; the shell moves to another (and calls ``connect``).
        The silence clock restarts so the next tick does not report it again at once."""
        self.connected = False
        self._requests.clear()
        self.last_recv = now
        return [Reconnecting(reason, lost=True)]

    def link_up(self, now: float) -> Frames | None:
        """The socket (re)connected: CONNECT at once rather than after ``liveness x TTL``
        of silence (None when this session needs no CONNECT: the first one is in flight,
        or nothing was lost)."""
        if not self.ever_connected or self.connected:
            return None
        return self.connect(now)

    # ------------------------------------------------------------ time
    def tick(self, now: float) -> tuple[list[Event], list[Frames]]:
        """Heartbeat or heal, depending on how long each side has been quiet."""
        silent_for = now - self.last_recv
        if silent_for >= self.ttl * self.liveness:
            reason = "broker silent" if self.connected else "no answer to CONNECT"
            if self.failover:
                return self._lost(f"{reason} for {silent_for:.1f}s", now), []
            return [Reconnecting(f"{reason} for {silent_for:.1f}s", lost=True)], [self.connect(now)]
        if self.connected and now - self.last_sent >= self.ttl * P.HEARTBEAT_FRACTION:
            return [], [list(P.NOOP_FRAMES)]
        return [], []

    def next_deadline(self) -> float:
        heal = self.last_recv + self.ttl * self.liveness
        if not self.connected:
            return heal
        return min(heal, self.last_sent + self.ttl * P.HEARTBEAT_FRACTION)


def _parts(body: bytes | str | Sequence[bytes] | None) -> list[bytes]:
    if body is None:
        return []
    if isinstance(body, str):
        return [body.encode()]
    if isinstance(body, bytes | bytearray | memoryview):
        return [bytes(body)]
    return [bytes(p) for p in body]
