"""The batched wire's input: one ``BATCH "" blob`` message, record by record, in slices, with hot paths.

Contract: :class:`BatchedInput` walks batches and owns the PUT records' topic
cache; it drives the rooms (:class:`~mc0.broker.core.rooms.Rooms`, which keep
the walks under way) as the verbs do.  ``batch`` handles each record as if
it came alone, in order; PUT records take ``_put_record`` (every check
``verbs.put`` makes, no Command built: a topic kept by file journals only is appended
and delivered by ``_journaled_record``, as ``verbs.put_journaled`` would) and CALL /
PARTIAL / FINAL records ``_rpc_record``.  A refused record gets its own
ERROR and spoils nothing after it.  Pure: no sockets, no clock.

A batch is walked at most ``batch_slice`` records at a time: a longer one
leaves a :class:`~mc0.broker.core.walks.BatchCursor`, and ``resume`` walks on
(one slice per peer in turn), so the shell serves other peers between slices.
Until a peer's batch is done its later messages wait behind it, in order
(``defer``; ``resume`` hands each back to the dispatcher when its turn
comes), up to ``DEFER_MESSAGES`` messages / twice ``max_batch_bytes``;
beyond that a message is refused 429 and changes nothing.  A batch's
refusals are coalesced: the first ``REFUSALS_ANSWERED`` get their own ERROR
(with the record's ID); the rest are counted and, when the batch is done,
answered by one ERROR that says how many and why the first of them was.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence

from ... import protocol as P
from ...errors import ProtocolError
from ...protocol import Header, Status, Verb, batch
from ..storage.port import JournalStore
from .journaling import primary
from .peers import Out, Peer
from .rooms import Rooms
from .traffic import Tally
from .verbs import Handler, call, put
from .walks import BatchCursor, Waited

_PUT_RECORD = P.batch.PUT
_CALL_RECORD, _FINAL_RECORD = P.batch.CALL, P.batch.FINAL
_RPC_RECORDS = frozenset({P.batch.CALL, P.batch.PARTIAL, P.batch.FINAL})
_PLAIN_TOPICS = 4096  # PUT-record topics known to be valid, unjournaled and not the broker's own
_JOURNALED_TOPICS = 4096  # ... valid, kept by file journals only, not the broker's own
BATCH_SLICE = 2048  # records walked per call before the cursor is kept
REFUSALS_ANSWERED = 16  # refused records of one batch answered one by one; the rest are counted
DEFER_MESSAGES = 1024  # a peer's messages waiting behind its unfinished batch, at most
_SHORT = "batch record too short for its fields"


def _drain(sink: dict[bytes, list[bytes]], out: list[Out], peers: dict[bytes, Peer]) -> None:
    """Move each batched subscriber's collected MESSAGE records to ``out`` as one payload.

    The shell counts each payload it queues as one message to its peer (``Peer.msgs_out``);
    a joined payload holds ``len(records)``, so the rest are counted here (once per subscriber
    and walk, never per record)."""
    for routing_id, records in sink.items():
        if len(records) == 1:
            out.append((routing_id, records[0]))
            continue
        out.append((routing_id, b"".join(records)))
        peer = peers.get(routing_id)
        if peer is not None:
            peer.msgs_out += len(records) - 1
    sink.clear()


_NOT_BATCHED = "BATCH needs CONNECT ... BATCH 1 first"


class JournaledTopic:
    """A PUT-record topic file journals keep (the fast path's cache): its text and tokens, the journals,
    the one a copy names (``primary``) and its name as bytes, and the topic's traffic tally."""

    __slots__ = ("topic", "tokens", "journals", "first", "name", "tally")

    def __init__(
        self,
        topic: str,
        tokens: tuple[str, ...],
        journals: Sequence[JournalStore],
        first: JournalStore,
        name: bytes,
        tally: Tally,
    ) -> None:
        self.topic = topic
        self.tokens = tokens
        self.journals = journals
        self.first = first
        self.name = name
        self.tally = tally


class BatchedInput:
    """The walking of batches and the PUT-record topic cache: the batched wire's input.

    It drives the rooms it is given and answers through them (``reject``, ``internal_error``,
    ``with_finished``), as a verb handler does; ``verbs`` is the dispatcher's verb table, for the
    records that are neither a PUT nor an RPC shortcut.  The walks under way are the rooms'
    (``Rooms.walks``: forgetting a peer cuts its batch).
    """

    def __init__(self, rooms: Rooms, verbs: Mapping[Verb, Handler]) -> None:
        self.rooms = rooms
        self.verbs = verbs
        self.settings = rooms.settings
        self.counters = rooms.counters
        self.pubsub = rooms.pubsub
        self.rpc = rooms.rpc
        self.journaling = rooms.journaling
        self._peers = rooms.peers.by_id  # (who a joined fan-out payload goes to: _drain counts its records)
        self.batch_slice = BATCH_SLICE  # records walked per call before the cursor is kept (the shell may change it)
        # The PUT record fast path's cache: topic -> (topic, tokens, its traffic tally).
        self._plain_topics: dict[bytes, tuple[str, tuple[str, ...], Tally]] = {}
        self._journaled_topics: dict[bytes, JournaledTopic] = {}  # ... and the journals that keep it
        self._traffic = rooms.traffic
        self._traffic_generation = rooms.traffic.generation  # tallies dropped since: the cache starts afresh
        self._max_message_bytes = rooms.settings.limits.max_message_bytes
        self.cursors = rooms.walks  # routing id -> its batch walk, while there is work
        self._scratch_cursor: BatchCursor | None = None  # reused by every batch walked in one slice

    def batch(self, peer: Peer, blob: bytes, now: float) -> list[Out]:
        """``BATCH "" blob``: each record handled as if it came alone, in order; the first
        ``batch_slice`` records now, the rest by ``resume``.

        A refused record is answered with its own ERROR (and ID) and a record
        that raises is one internal error: neither spoils the records after it.
        PUT records take the hot path (``_put_record``): what they deliver to
        batched subscribers collects per subscriber in ``sink`` and leaves as
        one joined payload each, flushed before any other output so that each
        peer's messages keep their order.
        """
        limits = self.settings.limits
        if not peer.batched:
            return self.rooms.reject(peer.routing_id, peer, (), ProtocolError(Status.BAD_REQUEST, _NOT_BATCHED), now)
        if len(blob) > limits.max_batch_bytes:
            reason = f"batch of {len(blob)} bytes, the limit is {limits.max_batch_bytes}"
            return self.rooms.reject(peer.routing_id, peer, (), ProtocolError(Status.TOO_LARGE, reason), now)
        if self._traffic.generation != self._traffic_generation:
            self._plain_topics.clear()
            self._journaled_topics.clear()
            self._traffic_generation = self._traffic.generation
        cursor = self._scratch_cursor  # a batch walked in one slice (the common case) needs no cursor of its own
        if cursor is None:
            cursor = self._scratch_cursor = BatchCursor(peer)
        cursor.peer, cursor.blob, cursor.pos, cursor.refused, cursor.first_refusal = peer, blob, 0, 0, None
        out, _ = self._walk(cursor, self.batch_slice, now)
        if cursor.blob:  # work left: the scratch cursor becomes this peer's
            self._scratch_cursor = BatchCursor(peer)
            earlier = self.cursors.get(peer.routing_id)
            if earlier is not None:  # (never: handle() defers a peer's messages while it has a cursor)
                cursor.deferred.extend(earlier.deferred)
                cursor.deferred_bytes += earlier.deferred_bytes
            self.cursors[peer.routing_id] = cursor
        return out

    @property
    def unfinished(self) -> bool:
        """Batches (or messages waiting behind them) are left for ``resume``."""
        return bool(self.cursors)

    def resume(self, now: float, budget: int, out: list[Out]) -> Iterator[Waited]:
        """Walk on through unfinished batches, one slice per peer in turn, about ``budget`` records
        (a message that waited behind a batch counts one), adding what to send to ``out``.  A message
        that waited is yielded, ``(routing_id, frames, identity, fd)``, when its batch is done and its
        turn comes: the caller handles it (adding its answers to ``out``) before the walk goes on."""
        spent = 0
        unfinished = self.cursors
        while unfinished and spent < budget:
            for routing_id in list(unfinished):
                cursor = unfinished.get(routing_id)
                if cursor is None:
                    continue
                if cursor.blob:
                    more, walked = self._walk(cursor, max(1, min(self.batch_slice, budget - spent)), now)
                    out.extend(more)
                    spent += walked
                    if cursor.blob or cursor.deferred:
                        unfinished[routing_id] = unfinished.pop(routing_id)  # round robin: to the back
                    else:
                        del unfinished[routing_id]
                elif cursor.deferred:  # its batch is done: the next message that waited, as it came
                    frames, identity, fd = cursor.deferred.popleft()
                    cursor.deferred_bytes -= sum(map(len, frames))
                    spent += 1
                    del unfinished[routing_id]  # (so that it is not made to wait again)
                    yield routing_id, frames, identity, fd
                    if cursor.deferred:
                        again = unfinished.get(routing_id)
                        if again is None:
                            unfinished[routing_id] = cursor
                        else:  # that message was a batch with work left: the rest wait behind it too
                            again.deferred.extend(cursor.deferred)
                            again.deferred_bytes += cursor.deferred_bytes
                else:
                    del unfinished[routing_id]
                if spent >= budget:
                    break

    def defer(self, routing_id: bytes, frames: Sequence[bytes], now: float, identity: str, fd: int | None) -> list[Out]:
        """A message from a peer whose batch is still being walked: it waits its turn (bounded)."""
        cursor = self.cursors[routing_id]
        size = sum(map(len, frames))
        limit = 2 * self.settings.limits.max_batch_bytes
        if len(cursor.deferred) >= DEFER_MESSAGES or cursor.deferred_bytes + size > limit:
            self.counters["refused_busy"] += 1
            left = len(cursor.blob) - cursor.pos if cursor.blob else 0
            reason = (
                f"busy: {left} bytes of an earlier batch and {len(cursor.deferred)} messages of yours are still "
                "waiting to be handled; send slower"
            )
            exc = ProtocolError(Status.OVER_LIMIT, reason, P.find_id(frames, self.settings.limits.max_headers))
            return self.rooms.reject(routing_id, None, frames, exc, now)
        cursor.deferred.append((frames, identity, fd))
        cursor.deferred_bytes += size
        cursor.peer.last_recv = now  # heard: waiting here is not silence
        return []

    def _walk(self, cursor: BatchCursor, limit: int, now: float) -> tuple[list[Out], int]:
        """Up to ``limit`` records of the cursor's batch; returns what to send and the records walked."""
        peer, blob = cursor.peer, cursor.blob
        limits = self.settings.limits
        verbs = self.verbs
        out: list[Out] = []
        sink: dict[bytes, list[bytes]] = {}
        published = 0
        walked = 0
        pos = cursor.pos
        done = False
        try:
            for code, start, end in batch.records(blob, pos):
                if walked >= limit:
                    break
                walked += 1
                pos = end
                try:
                    if code == _PUT_RECORD:
                        published += self._put_record(peer, blob, start, end, now, out, sink)
                        continue
                    if sink:
                        _drain(sink, out, self._peers)
                    if code in _RPC_RECORDS:
                        out += self._rpc_record(peer, blob, code, start, end, now)
                        continue
                    command = batch.command_of(blob, code, start, end, limits)
                    verb = command.verb
                    if verb is Verb.CONNECT or verb is Verb.BATCH:
                        raise ProtocolError(Status.BAD_REQUEST, f"{verb} cannot be batched", command.id)
                    out += verbs[verb](self.rooms, peer, command, now)
                    if verb is Verb.DISCONNECT:
                        done = True
                        break
                except ProtocolError as exc:
                    if exc.request_id is None and (cursor.refused < REFUSALS_ANSWERED or cursor.first_refusal is None):
                        exc = ProtocolError(exc.code, exc.reason, batch.id_of(blob, code, start, end))
                    if sink:
                        _drain(sink, out, self._peers)
                    out += self._refused(cursor, exc, now)
                except Exception as exc:  # one record's bug costs that record only
                    if sink:
                        _drain(sink, out, self._peers)
                    cursor.refused += 1
                    record_id = batch.id_of(blob, code, start, end)
                    out += self.rooms.internal_error(peer.routing_id, (), exc, record_id, now=now)
            else:
                done = True
        except ProtocolError as exc:  # the blob stopped splitting into records here
            if sink:
                _drain(sink, out, self._peers)
            out += self.rooms.reject(peer.routing_id, peer, (), exc, now)
            done = True
        if sink:
            _drain(sink, out, self._peers)
        if published:
            self.counters["published"] += published
        peer.msgs_in += walked  # a batch counts as its records (one add per walk, none per record)
        # Its records are what it says: a batch walked over more than liveness x TTL (a long one, a
        # loaded box) is not silence, which counts from the walk's last slice (one store per slice).
        peer.last_recv = now
        cursor.pos = pos
        if done or pos >= len(blob):
            cursor.blob = b""
            if cursor.first_refusal is not None:
                out += self._refusals_summary(cursor, now)
        return self.rooms.with_finished(out, now), walked

    def _refused(self, cursor: BatchCursor, exc: ProtocolError, now: float) -> list[Out]:
        """A refused record: answered on its own while few are; counted once there are many."""
        cursor.refused += 1
        if cursor.refused <= REFUSALS_ANSWERED:
            return self.rooms.reject(cursor.peer.routing_id, cursor.peer, (), exc, now)
        self.counters[f"rejected_{exc.code}"] += 1
        if cursor.first_refusal is None:
            cursor.first_refusal = exc
        return []

    def _refusals_summary(self, cursor: BatchCursor, now: float) -> list[Out]:
        first = cursor.first_refusal
        assert first is not None
        unanswered = cursor.refused - REFUSALS_ANSWERED
        cursor.first_refusal = None
        self.counters["refusals_coalesced"] += unanswered
        where = f" (ID {first.request_id[:64]})" if first.request_id else ""
        reason = (
            f"{unanswered} more records of this batch refused, not answered one by one; "
            f"the first{where}: {first.code} {first.reason[:200]}"
        )
        cursor.peer.last_sent = now
        return [(cursor.peer.routing_id, P.error(first.code, reason))]

    def _put_record(
        self,
        peer: Peer,
        blob: bytes,
        start: int,
        end: int,
        now: float,
        out: list[Out],
        sink: dict[bytes, list[bytes]],
    ) -> int:
        """A PUT shortcut record (TOPIC and one body frame): the publish hot path, with every check
        ``verbs.put`` makes, without building a Command unless a JetStream journal keeps the topic.
        Returns the count of publishes it counted (the caller adds them up)."""
        if end - start > self._max_message_bytes:
            raise ProtocolError(Status.TOO_LARGE, f"{end - start} bytes, the limit is {self._max_message_bytes}")
        topic_b, data_at = batch.put_topic(blob, start, end)
        plain = self._plain_topics.get(topic_b)
        if plain is None:
            kept = self._journaled_topics.get(topic_b)
            if kept is not None:
                return self._journaled_record(peer, kept, blob, start, end, data_at, now, out, sink)
            topic, tokens = self.pubsub.record_topic(topic_b)
            journaling = self.journaling
            journals = journaling.journals_of(tokens) if journaling.has_journals else ()
            if journals or topic.startswith(P.RESERVED_TOPIC_PREFIX):
                kept = self._kept_by_files(topic_b, topic, tokens, journals)
                if kept is not None:
                    return self._journaled_record(peer, kept, blob, start, end, data_at, now, out, sink)
                if sink:
                    _drain(sink, out, self._peers)
                command = P.Command(Verb.PUT, {Header.TOPIC: topic}, (blob[start + data_at : end],))
                out += put(self.rooms, peer, command, now)  # JetStream-journaled (or refused): the general path
                return 0
            if len(self._plain_topics) >= _PLAIN_TOPICS:
                self._plain_topics.clear()
            plain = self._plain_topics[topic_b] = (topic, tokens, self._traffic.tally(topic))
        topic, tokens, tally = plain
        grants = peer.grants
        if not grants.unrestricted and not grants.may_publish(tokens):
            raise ProtocolError(Status.FORBIDDEN, f"{peer.identity} may not publish to {topic}")
        tally.msgs += 1
        tally.bytes += end - start - data_at
        self.pubsub.fan_out_put(topic, tokens, peer, blob[start:end], data_at, now, out, sink)
        return 1

    def _kept_by_files(
        self, topic_b: bytes, topic: str, tokens: tuple[str, ...], journals: Sequence[JournalStore]
    ) -> JournaledTopic | None:
        """The fast path's entry for a topic that file journals keep (cached), else None (no journal,
        a JetStream journal among them, or the broker's own topic: the general path)."""
        if not journals or topic.startswith(P.RESERVED_TOPIC_PREFIX) or not self.journaling.local(journals):
            return None
        if len(self._journaled_topics) >= _JOURNALED_TOPICS:
            self._journaled_topics.clear()
        first = primary(journals)
        kept = JournaledTopic(topic, tokens, journals, first, first.name.encode(), self._traffic.tally(topic))
        self._journaled_topics[topic_b] = kept
        return kept

    def _journaled_record(
        self,
        peer: Peer,
        kept: JournaledTopic,
        blob: bytes,
        start: int,
        end: int,
        data_at: int,
        now: float,
        out: list[Out],
        sink: dict[bytes, list[bytes]],
    ) -> int:
        """A PUT record on a topic file journals keep: what ``verbs.put_journaled`` does for it (no ID,
        so no OK to hold; no MSGID, so no dedup), appended (``Journaling.append_local``) and delivered
        with its position, the batched subscribers' copies collected in ``sink`` as a plain PUT's are."""
        grants = peer.grants
        if not grants.unrestricted and not grants.may_publish(kept.tokens):
            raise ProtocolError(Status.FORBIDDEN, f"{peer.identity} may not publish to {kept.topic}")
        tally = kept.tally
        tally.msgs += 1
        tally.bytes += end - start - data_at
        data = blob[start + data_at : end]
        journaling = self.journaling
        seq = journaling.append_local(kept.journals, kept.first, kept.topic, peer.identity, data)
        if seq is None:
            self.counters["published"] += 1  # (as verbs.put counts it before the append fails)
            raise ProtocolError(Status.STORAGE_FAILED, f"journal {kept.first.name} could not write")
        self.counters["journaled"] += 1
        held = journaling.held_back(kept.journals, kept.tokens)
        self.pubsub.fan_out_journaled(
            kept.tokens, peer, blob[start + 2 : start + data_at], data, (kept.name, seq), held, now, out, sink
        )
        return 1

    def _rpc_record(self, peer: Peer, blob: bytes, code: int, start: int, end: int, now: float) -> list[Out]:
        """A REQUEST (CALL), PARTIAL or FINAL shortcut record: the RPC hot path, the same
        handling as the frames it stands for without decoding them into a Command."""
        if end - start > self._max_message_bytes:
            reason = f"{end - start} bytes, the limit is {self._max_message_bytes}"
            raise ProtocolError(Status.TOO_LARGE, reason, batch.id_of(blob, code, start, end))
        try:
            if code == _CALL_RECORD:
                service, rid, timeout_ms, data = batch.call_fields(blob, start, end)
            else:
                rid, data = batch.reply_fields(blob, start, end)
        except struct.error:  # shorter than its fixed fields
            raise ProtocolError(Status.BAD_REQUEST, _SHORT) from None
        except UnicodeDecodeError:
            raise ProtocolError(Status.BAD_REQUEST, "a header value is not UTF-8") from None
        if code == _CALL_RECORD:
            if timeout_ms < 1:
                raise ProtocolError(Status.BAD_REQUEST, "TIMEOUT must be at least 1, got 0", rid)
            return call(self.rooms, peer, service, rid, timeout_ms, False, {}, (data,), now)
        verb = Verb.FINAL if code == _FINAL_RECORD else Verb.PARTIAL
        return self.rpc.reply(peer, verb, rid, {}, (data,), now)
