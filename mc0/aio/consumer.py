"""Durable consumers, client side: pull batches from a named consumer the broker keeps, settle each message.

Contract: :class:`Consumer` talks to the broker's ``mc0.consumer`` service
over its client (one request per pull or per settle: :class:`Requester` is
all it asks of the client, whose module it does not import); it holds no position
of its own, so any number of clients of the identity that created the
consumer may share it (competing consumers) and a restarted client resumes
where the consumer stands.
``fetch`` returns up to ``max`` :class:`ConsumedMessage` (waiting up to
``wait`` for the first); each is settled once with ``ack()``, ``nak(delay)``
or ``term()`` (or in bulk with ``Consumer.ack(*messages)``).  A message not
settled within the consumer's ``ack_wait`` is delivered again, to whichever
client pulls next.  ``ack_nowait()`` is nats-py's ``msg.ack()``: it does not
wait for the broker, and the acks made in one event-loop turn leave as one
request at the end of that turn (a failed one is logged and counted in
``ack_errors``; its messages come back after ``ack_wait``: at least once).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import Error, ProtocolError
from ..message import Message, Reply, new_message
from ..protocol import CONSUMER_SERVICE, Status, carried, parse_journal_page

if TYPE_CHECKING:
    from ..tracing import Held, Tracing
log = logging.getLogger("mc0.client")

# Pulls ask the broker to wait at most this long, so one pull never outlives the request timeout.
PULL_GRACE = 5.0


class Requester(Protocol):
    """What a :class:`Consumer` asks of its client (``mc0.aio.Client`` implements it): requests."""

    async def request(self, service: str, body: bytes | str = b"", *, timeout: float | None = None) -> Reply: ...


@dataclass(frozen=True, slots=True, eq=False)
class ConsumedMessage:
    """One message from a durable consumer: the journal record and how to settle it."""

    message: Message
    seq: int
    deliveries: int  # 1 the first time; more when redelivered
    consumer: Consumer = field(repr=False)

    @property
    def topic(self) -> str:
        return self.message.topic

    @property
    def body(self) -> bytes:
        return self.message.body

    async def ack(self) -> None:
        await self.consumer.ack(self)

    async def nak(self, delay: float = 0.0) -> None:
        await self.consumer.nak(self, delay=delay)

    async def term(self) -> None:
        await self.consumer.term(self)

    def ack_nowait(self) -> None:
        """Ack without waiting for the broker (see :meth:`Consumer.ack_nowait`)."""
        self.consumer.ack_nowait(self)


class Consumer:
    """A durable consumer on a journal (see :meth:`mc0.aio.Client.consume`)."""

    def __init__(self, client: Requester, journal: str, name: str, *, tracing: Tracing | None = None) -> None:
        """``tracing``: the client's (None: off): a span per pull, and per message ``messages`` hands out,
        each linked to the context its record was published with (never its child: it may be hours old)."""
        self.client = client  # the client it talks to the broker through
        self._tracing = tracing
        self._held: Held | None = None  # the span of the message ``messages`` handed out last (until settled)
        self._held_seq = 0
        self.journal = journal
        self.name = name
        self.ack_errors = 0  # ack_nowait requests the broker refused or that failed (their messages come back)
        self._unsent_acks: list[int] = []  # ack_nowait seqs of this loop turn
        self._ack_requests: set[asyncio.Task[None]] = set()

    async def _ask(self, query: dict[str, Any], timeout: float | None = None) -> Any:
        body = json.dumps({"journal": self.journal, "name": self.name, **query})
        reply = await self.client.request(CONSUMER_SERVICE, body, timeout=timeout)
        return reply

    async def fetch(self, max: int = 100, *, wait: float = 1.0) -> list[ConsumedMessage]:
        """Up to ``max`` messages; waits up to ``wait`` seconds for the first (``[]`` if none came)."""
        if max < 1 or wait < 0:
            raise ProtocolError(Status.BAD_REQUEST, "fetch needs max >= 1 and wait >= 0")
        query = {"op": "pull", "max": max, "wait_ms": round(wait * 1000)}
        if self._tracing is None:
            reply = await self._ask(query, timeout=wait + PULL_GRACE)
            records = parse_journal_page(reply.parts[:2])
        else:
            with self._tracing.pulling(self.journal, self.name) as pull:
                reply = await self._ask(query, timeout=wait + PULL_GRACE)
                records = parse_journal_page(reply.parts[:2])
                self._tracing.pulled(pull, records)
        parts = reply.parts
        deliveries = json.loads(parts[2]) if len(parts) > 2 else [1] * len(records)
        return [
            ConsumedMessage(
                new_message(
                    r.topic,
                    r.parts,
                    r.sender,
                    {k: v for k, v in r.headers.items() if carried(k)},
                    self.journal,
                    r.seq,
                    None,
                ),
                r.seq,
                int(d),
                self,
            )
            for r, d in zip(records, deliveries, strict=True)
        ]

    async def messages(self, *, batch: int = 100, wait: float = 1.0) -> AsyncIterator[ConsumedMessage]:
        """Every message, pulled ``batch`` at a time, for as long as the caller iterates.  Traced, each
        message's span is current in the caller's task from when it is handed out until it is settled
        or the next is taken."""
        while True:
            for message in await self.fetch(batch, wait=wait):
                if self._tracing is not None:
                    self._held = self._tracing.consume(
                        message.message, self._held, subscription=self.name, group=self.name, linked=True
                    )
                    self._held_seq = message.seq
                yield message

    def _settled(self, seqs: Sequence[int]) -> None:
        """The message ``messages`` handed out last is settled: its span ends (no longer current)."""
        if self._held is not None and self._held_seq in seqs:
            assert self._tracing is not None
            if self._tracing.release(self._held):
                self._held = None

    async def _settle(self, op: str, messages: Sequence[ConsumedMessage | int], **extra: Any) -> int:
        seqs = [m if isinstance(m, int) else m.seq for m in messages]
        if self._held is not None:
            self._settled(seqs)
        if not seqs:
            return 0
        reply = await self._ask({"op": op, "seqs": seqs, **extra})
        return int(json.loads(reply.body)[op])

    async def ack(self, *messages: ConsumedMessage | int) -> int:
        """Settle these messages (or seqs) for good; returns how many were still unsettled.
        Returns once the consumer's new state is saved by the broker."""
        return await self._settle("ack", messages)

    def ack_nowait(self, *messages: ConsumedMessage | int) -> None:
        """Ack without waiting (nats-py's ``msg.ack()``; ``ack()`` is its ``ack_sync()``).

        The seqs acked in this event-loop turn leave as one request at the end
        of the turn, so acking a batch one message at a time costs one round
        trip.  Nothing waits for the answer: a failure is logged and counted in
        ``ack_errors``, and those messages are delivered again after
        ``ack_wait`` (at least once, never lost).  ``await flush_acks()`` waits
        until every ack made so far is answered.  Must be called on the loop."""
        if not self._unsent_acks:
            asyncio.get_running_loop().call_soon(self._send_acks)
        seqs = [m if isinstance(m, int) else m.seq for m in messages]
        if self._held is not None:
            self._settled(seqs)
        self._unsent_acks += seqs

    def _send_acks(self) -> None:
        seqs, self._unsent_acks = self._unsent_acks, []
        if seqs:
            task = asyncio.get_running_loop().create_task(self._ack_quietly(seqs))
            self._ack_requests.add(task)
            task.add_done_callback(self._ack_requests.discard)

    async def _ack_quietly(self, seqs: list[int]) -> None:
        try:
            await self._settle("ack", seqs)
        except Error as exc:  # not silent: counted and logged; the broker delivers them again
            self.ack_errors += 1
            log.warning("consumer %s/%s: %d acks not taken: %s", self.journal, self.name, len(seqs), exc)

    async def flush_acks(self) -> None:
        """Wait until every ``ack_nowait`` so far has been answered (or failed and been counted)."""
        self._send_acks()
        while self._ack_requests:
            await asyncio.wait(list(self._ack_requests))

    async def nak(self, *messages: ConsumedMessage | int, delay: float = 0.0) -> int:
        """Deliver these again, now or after ``delay`` seconds."""
        return await self._settle("nak", messages, delay_ms=round(delay * 1000))

    async def term(self, *messages: ConsumedMessage | int) -> int:
        """Never deliver these again (not acknowledged as processed: counted as termed)."""
        return await self._settle("term", messages)

    async def info(self) -> dict[str, Any]:
        """The consumer's config and counts: pending, due, acked, redelivered, dead_lettered, lag..."""
        reply = await self._ask({"op": "info"})
        result: dict[str, Any] = json.loads(reply.body)
        return result

    async def delete(self) -> None:
        """Remove the consumer and its saved state from the broker."""
        await self._ask({"op": "delete"})
