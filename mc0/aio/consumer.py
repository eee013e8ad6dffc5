"""Durable consumers, client side: pull batches from a named consumer the broker keeps, settle each message.

Contract: :class:`Consumer` talks to the broker's ``mc0.consumer`` service
over its client (one request per pull or per settle); it holds no position
of its own, so any number of clients may share one consumer (competing
consumers) and a restarted client resumes where the consumer stands.
``fetch`` returns up to ``max`` :class:`ConsumedMessage` (waiting up to
``wait`` for the first); each is settled once with ``ack()``, ``nak(delay)``
or ``term()`` (or in bulk with ``Consumer.ack(*messages)``).  A message not
settled within the consumer's ``ack_wait`` is delivered again, to whichever
client pulls next.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ProtocolError
from ..message import Message
from ..protocol import CONSUMER_SERVICE, Status, parse_journal_page

if TYPE_CHECKING:
    from .client import Client

# Pulls ask the broker to wait at most this long, so one pull never outlives the request timeout.
PULL_GRACE = 5.0


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


class Consumer:
    """A durable consumer on a journal (see :meth:`mc0.aio.Client.consume`)."""

    def __init__(self, client: Client, journal: str, name: str) -> None:
        self.client = client
        self.journal = journal
        self.name = name

    async def _ask(self, query: dict[str, Any], timeout: float | None = None) -> Any:
        body = json.dumps({"journal": self.journal, "name": self.name, **query})
        reply = await self.client.request(CONSUMER_SERVICE, body, timeout=timeout)
        return reply

    async def fetch(self, max: int = 100, *, wait: float = 1.0) -> list[ConsumedMessage]:
        """Up to ``max`` messages; waits up to ``wait`` seconds for the first (``[]`` if none came)."""
        if max < 1 or wait < 0:
            raise ProtocolError(Status.BAD_REQUEST, "fetch needs max >= 1 and wait >= 0")
        query = {"op": "pull", "max": max, "wait_ms": round(wait * 1000)}
        reply = await self._ask(query, timeout=wait + PULL_GRACE)
        parts = reply.parts
        records = parse_journal_page(parts[:2])
        deliveries = json.loads(parts[2]) if len(parts) > 2 else [1] * len(records)
        return [
            ConsumedMessage(
                Message(
                    r.topic,
                    r.parts,
                    r.sender,
                    {k: v for k, v in r.headers.items() if k.startswith("X-")},
                    self.journal,
                    r.seq,
                ),
                r.seq,
                int(d),
                self,
            )
            for r, d in zip(records, deliveries, strict=True)
        ]

    async def messages(self, *, batch: int = 100, wait: float = 1.0) -> AsyncIterator[ConsumedMessage]:
        """Every message, pulled ``batch`` at a time, for as long as the caller iterates."""
        while True:
            for message in await self.fetch(batch, wait=wait):
                yield message

    async def _settle(self, op: str, messages: Sequence[ConsumedMessage | int], **extra: Any) -> int:
        seqs = [m if isinstance(m, int) else m.seq for m in messages]
        if not seqs:
            return 0
        reply = await self._ask({"op": op, "seqs": seqs, **extra})
        return int(json.loads(reply.body)[op])

    async def ack(self, *messages: ConsumedMessage | int) -> int:
        """Settle these messages (or seqs) for good; returns how many were still unsettled.
        Returns once the consumer's new state is saved by the broker."""
        return await self._settle("ack", messages)

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
