"""The batched wire's input: one ``BATCH "" blob`` message, record by record, with hot paths.

Contract: a mixin of :class:`~mc0.broker.core.dispatch.BrokerCore` (which creates
the rooms and the verb table it uses).  ``_batch`` handles each record as if
it came alone, in order; PUT records take ``_put_record`` (every check
``_put`` makes, no Command built unless a journal keeps the topic) and CALL /
PARTIAL / FINAL records ``_rpc_record``.  A refused record gets its own
ERROR and spoils nothing after it.  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from ... import protocol as P
from ...errors import ProtocolError
from ...protocol import Command, Header, Status, Verb, batch
from ...settings import CoreSettings
from .journaling import Streams
from .peers import Out, Peer
from .pubsub import PubSub
from .rpc import Rpc

_PUT_RECORD = P.batch.PUT
_U16 = P.batch.U16
_CALL_RECORD, _FINAL_RECORD = P.batch.CALL, P.batch.FINAL
_RPC_RECORDS = frozenset({P.batch.CALL, P.batch.PARTIAL, P.batch.FINAL})
_PLAIN_TOPICS = 4096  # PUT-record topics known to be valid, unjournaled and not the broker's own


def _drain(sink: dict[bytes, list[bytes]], out: list[Out]) -> None:
    """Move each batched subscriber's collected MESSAGE records to ``out`` as one payload."""
    for routing_id, records in sink.items():
        out.append((routing_id, records[0] if len(records) == 1 else b"".join(records)))
    sink.clear()


_NOT_BATCHED = "BATCH needs CONNECT ... BATCH 1 first"


class BatchedInput:
    settings: CoreSettings
    counters: Counter[str]
    pubsub: PubSub
    rpc: Rpc
    streams: Streams
    _verbs: dict[Verb, Callable[[Peer, Command, float], list[Out]]]
    _plain_topics: dict[bytes, tuple[str, tuple[str, ...]]]
    _max_message_bytes: int

    # Provided by the dispatcher and the verb handlers (annotations only: nothing is shadowed).
    _reject: Callable[[bytes, Peer | None, Sequence[bytes], ProtocolError, float], list[Out]]
    internal_error: Callable[..., list[Out]]
    _with_finished: Callable[[list[Out], float], list[Out]]
    _put: Callable[[Peer, Command, float], list[Out]]
    _call: Callable[[Peer, str, str, int, bool, dict[str, str], Sequence[bytes], float], list[Out]]

    def _batch(self, peer: Peer, blob: bytes, now: float) -> list[Out]:
        """``BATCH "" blob``: each record handled as if it came alone, in order.

        A refused record is answered with its own ERROR (and ID) and a record
        that raises is one internal error: neither spoils the records after it.
        PUT records take the hot path (``_put_record``): what they deliver to
        batched subscribers collects per subscriber in ``sink`` and leaves as
        one joined payload each, flushed before any other output so that each
        peer's messages keep their order.
        """
        limits = self.settings.limits
        if not peer.batched:
            return self._reject(peer.routing_id, peer, (), ProtocolError(Status.BAD_REQUEST, _NOT_BATCHED), now)
        if len(blob) > limits.max_batch_bytes:
            reason = f"batch of {len(blob)} bytes, the limit is {limits.max_batch_bytes}"
            return self._reject(peer.routing_id, peer, (), ProtocolError(Status.TOO_LARGE, reason), now)
        verbs = self._verbs
        out: list[Out] = []
        sink: dict[bytes, list[bytes]] = {}
        published = 0
        try:
            for code, start, end in batch.records(blob):
                try:
                    if code == _PUT_RECORD:
                        published += self._put_record(peer, blob, start, end, now, out, sink)
                        continue
                    if sink:
                        _drain(sink, out)
                    if code in _RPC_RECORDS:
                        out += self._rpc_record(peer, blob, code, start, end, now)
                        continue
                    command = batch.command_of(blob, code, start, end, limits)
                    verb = command.verb
                    if verb is Verb.CONNECT or verb is Verb.BATCH:
                        raise ProtocolError(Status.BAD_REQUEST, f"{verb} cannot be batched", command.id)
                    out += verbs[verb](peer, command, now)
                    if verb is Verb.DISCONNECT:
                        break
                except ProtocolError as exc:
                    if exc.request_id is None:
                        exc = ProtocolError(exc.code, exc.reason, batch.id_of(blob, code, start, end))
                    if sink:
                        _drain(sink, out)
                    out += self._reject(peer.routing_id, peer, (), exc, now)
                except Exception as exc:  # one record's bug costs that record only
                    if sink:
                        _drain(sink, out)
                    out += self.internal_error(peer.routing_id, (), exc, batch.id_of(blob, code, start, end))
        except ProtocolError as exc:  # the blob stopped splitting into records here
            if sink:
                _drain(sink, out)
            out += self._reject(peer.routing_id, peer, (), exc, now)
        if sink:
            _drain(sink, out)
        if published:
            self.counters["published"] += published
        return self._with_finished(out, now)

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
        ``_put`` makes, without building a Command unless a journal keeps the topic.  Returns
        the count of plain publishes (the caller adds them up)."""
        if end - start > self._max_message_bytes:
            raise ProtocolError(Status.TOO_LARGE, f"{end - start} bytes, the limit is {self._max_message_bytes}")
        (tl,) = _U16.unpack_from(blob, start)
        data_at = 2 + tl
        if start + data_at > end:
            raise ProtocolError(Status.BAD_REQUEST, "PUT record fields run past its end")
        topic_b = blob[start + 2 : start + data_at]
        plain = self._plain_topics.get(topic_b)
        if plain is None:
            topic, tokens = self.pubsub.route_of(topic_b)
            if (self.streams.journals and self.streams.routes(tokens)) or topic.startswith(P.RESERVED_TOPIC_PREFIX):
                if sink:
                    _drain(sink, out)
                command = P.Command(Verb.PUT, {Header.TOPIC: topic}, (blob[start + data_at : end],))
                out += self._put(peer, command, now)  # journaled (or refused): the general path
                return 0
            if len(self._plain_topics) >= _PLAIN_TOPICS:
                self._plain_topics.clear()
            plain = self._plain_topics[topic_b] = (topic, tokens)
        topic, tokens = plain
        grants = peer.grants
        if not grants.unrestricted and not grants.may_publish(tokens):
            raise ProtocolError(Status.FORBIDDEN, f"{peer.identity} may not publish to {topic}")
        self.pubsub.fan_out_put(topic, tokens, peer, blob[start:end], data_at, now, out, sink)
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
                if timeout_ms < 1:
                    raise ProtocolError(Status.BAD_REQUEST, "TIMEOUT must be at least 1, got 0", rid)
                return self._call(peer, service, rid, timeout_ms, False, {}, (data,), now)
            rid, data = batch.reply_fields(blob, start, end)
            verb = Verb.FINAL if code == _FINAL_RECORD else Verb.PARTIAL
            return self.rpc.reply(peer, verb, rid, {}, (data,), now)
        except UnicodeDecodeError:
            raise ProtocolError(Status.BAD_REQUEST, "a header value is not UTF-8") from None
