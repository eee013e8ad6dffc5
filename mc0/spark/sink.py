"""The ``mc0`` sink: ``df.write.format("mc0")`` and ``df.writeStream.format("mc0")`` publish rows.

Contract: each task publishes its rows with confirmations (``window`` in
flight) and a deterministic MSGID per row (prefix, batch, partition, index,
digest) unless the row has one, so a replayed batch is acknowledged as
duplicates on a journaled topic instead of being published twice.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from ..errors import ConfigError
from .options import BATCH_ID_PROPERTY, Connection, int_option


@dataclass(frozen=True)
class Published(WriterCommitMessage):
    partition: int
    rows: int
    duplicates: int


def row_msgid(prefix: str, batch: str, partition: int, index: int, topic: str, body: bytes) -> str:
    digest = hashlib.blake2b(f"{topic}\0".encode() + body, digest_size=8).hexdigest()
    return f"{prefix}:{batch}:{partition}:{index}:{digest}"


def _body_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise ConfigError("column body", f"must be binary or string, got {type(value).__name__}")


async def _publish_rows(
    connection: Connection, rows: Iterator[Any], prefix: str, batch: str, partition: int, window: int
) -> Published:
    from ..aio import Client

    published = duplicates = 0
    pending: list[asyncio.Task[Any]] = []

    async def drain() -> None:
        nonlocal published, duplicates
        acks = await asyncio.gather(*pending)
        pending.clear()
        published += len(acks)
        duplicates += sum(1 for ack in acks if ack is not None and ack.duplicate)

    async with Client(connection.endpoint, **connection.client_options()) as client:
        for index, row in enumerate(rows):
            fields = row.asDict() if hasattr(row, "asDict") else dict(row)
            topic = fields.get("topic")
            if not isinstance(topic, str):
                raise ConfigError("column topic", f"row {index}: must be a string, got {topic!r}")
            body = _body_bytes(fields.get("body"))
            headers = fields.get("headers") or None
            msgid = fields.get("msgid") or row_msgid(prefix, batch, partition, index, topic, body)
            pending.append(
                asyncio.ensure_future(client.publish(topic, body, headers=headers, confirm=True, msgid=msgid))
            )
            if len(pending) >= window:
                await drain()
        await drain()
    return Published(partition, published, duplicates)


def _task_identity() -> tuple[int, str | None]:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # pragma: no cover - write() always runs in a task
        return 0, None
    return context.partitionId(), context.getLocalProperty(BATCH_ID_PROPERTY)


class _RowPublisher:
    """What the batch and the streaming sink share: options, and publishing one task's rows."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.connection = Connection.from_options(options)
        self.prefix = str(options.get("msgidPrefix", "spark"))
        self.window = int_option(options, "window", 256) or 256

    def _publish(self, iterator: Iterator[Any], batch: str, partition: int) -> Published:
        return asyncio.run(_publish_rows(self.connection, iterator, self.prefix, batch, partition, self.window))


class Mc0Writer(_RowPublisher, DataSourceWriter):
    def write(self, iterator: Iterator[Any]) -> Published:
        partition, batch = _task_identity()
        return self._publish(iterator, batch or "batch", partition)


class Mc0StreamWriter(_RowPublisher, DataSourceStreamWriter):
    def write(self, iterator: Iterator[Any]) -> Published:
        partition, batch = _task_identity()
        if batch is None:  # without it, rows of different micro-batches would share MSGIDs
            raise RuntimeError(f"Spark did not set {BATCH_ID_PROPERTY} on this streaming task")
        return self._publish(iterator, batch, partition)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every row was acknowledged by the broker before its task ended; nothing left to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Rows already acknowledged stay published; a retry's MSGIDs make them duplicates."""
