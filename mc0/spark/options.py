"""Options of the ``mc0`` data source and sink, and how an executor reaches the broker.

Contract: pure parsing of Spark's string options into :class:`ReadSettings`
and :class:`Connection` (picklable: an executor opens its own client); a bad
option is a ``ConfigError`` naming it.  Imports no pyspark.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..endpoints import parse_endpoints
from ..errors import ConfigError, InvalidTopic
from ..topics import split_pattern

SOURCE_NAME = "mc0"
# trace_id: the record's trace id (of its W3C traceparent header), null without one: a pipeline joins on it.
SCHEMA = "seq long, ts timestamp, topic string, sender string, headers map<string,string>, body binary, trace_id string"
DEFAULT_JOURNAL = "main"
# Seqs per partition: a Spark task costs tens of ms of JVM and Python worker CPU whatever it reads
# (measured: 10,000-row partitions spent 7 us per row in the JVM, 100,000-row ones 2.4 us).
DEFAULT_PARTITION_RECORDS = 100_000
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by Spark's micro-batch engine on every task


def int_option(options: Mapping[str, str], name: str, default: int | None, minimum: int = 1) -> int | None:
    """A Spark option as an integer of at least ``minimum`` (``default`` when unset; ConfigError otherwise)."""
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw))
    except ValueError:
        raise ConfigError(f"option {name}", f"must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"option {name}", f"must be at least {minimum}, got {value}")
    return value


def _bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = str(options.get(name, default)).lower()
    if raw not in ("true", "false"):
        raise ConfigError(f"option {name}", f"must be true or false, got {raw!r}")
    return raw == "true"


def parse_offset(raw: str, name: str) -> int:
    """``earliest`` -> 0, ``latest`` -> -1, ``n`` or ``{"seq": n}`` -> n (>= 1)."""
    text = raw.strip()
    if text == "earliest":
        return 0
    if text == "latest":
        return -1
    try:
        value = json.loads(text)
    except ValueError:
        raise ConfigError(f"option {name}", f'must be earliest, latest, a seq or {{"seq": n}}, got {raw!r}') from None
    if isinstance(value, dict):
        value = value.get("seq")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"option {name}", f"a seq must be an integer >= 1, got {raw!r}")
    return value


@dataclass(frozen=True)
class Connection:
    """What an executor needs to reach the broker (picklable; no sockets)."""

    endpoint: str | None
    key: str | None
    broker_key: str | None
    timeout: float

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Connection:
        timeout = int_option(options, "timeout", 30) or 30
        endpoint = options.get("endpoint")
        if endpoint is not None:  # one, or a comma-separated list to fail over between: checked here, in the driver
            parse_endpoints(endpoint, where="option endpoint")
        return cls(endpoint, options.get("key"), options.get("brokerKey"), float(timeout))

    def client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"timeout": self.timeout}
        if self.key:
            options["key"] = self.key
        if self.broker_key:
            options["broker_key"] = self.broker_key
        return options

    def client(self) -> Any:
        from ..client import Client

        return Client(self.endpoint, **self.client_options()).connect()

    def rotated(self, index: int) -> Connection:
        """This connection with its endpoint list turned so that entry ``index`` (mod its length) comes
        first: partition k of a journal every broker serves reads at broker k, and fails over to the next."""
        if not self.endpoint:
            return self
        endpoints = parse_endpoints(self.endpoint, where="option endpoint")
        turn = index % len(endpoints)
        return dataclasses.replace(self, endpoint=",".join(endpoints[turn:] + endpoints[:turn]))


@dataclass(frozen=True)
class ReadSettings:
    connection: Connection
    journal: str
    topics: tuple[str, ...]
    starting: int
    ending: int
    max_per_trigger: int | None
    max_per_partition: int
    fail_on_data_loss: bool
    min_partitions: int = 1

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ReadSettings:
        topics = tuple(t.strip() for t in str(options.get("topics", "")).split(",") if t.strip())
        for pattern in topics:  # checked here, in the driver: not by every task's fetch (a 400 each)
            try:
                split_pattern(pattern)
            except InvalidTopic as exc:
                raise ConfigError("option topics", f"{pattern[:80]!r} is not a topic pattern: {exc.reason}") from None
        return cls(
            Connection.from_options(options),
            str(options.get("journal", DEFAULT_JOURNAL)),
            topics,
            parse_offset(str(options.get("startingOffsets", "earliest")), "startingOffsets"),
            parse_offset(str(options.get("endingOffsets", "latest")), "endingOffsets"),
            int_option(options, "maxRecordsPerTrigger", None),
            int_option(options, "maxRecordsPerPartition", DEFAULT_PARTITION_RECORDS) or DEFAULT_PARTITION_RECORDS,
            _bool_option(options, "failOnDataLoss", True),
            int_option(options, "minPartitions", 1) or 1,
        )

    def journal_info(self) -> dict[str, Any]:
        """The journal's ``mc0.journal info`` now (ConfigError if there is no such journal)."""
        with self.connection.client() as client:
            info = client.journal_info(timeout=self.connection.timeout)
        if self.journal not in info:
            known = ", ".join(sorted(info)) or "none"
            raise ConfigError("option journal", f"the broker has no journal {self.journal!r} (journals: {known})")
        journal: dict[str, Any] = info[self.journal]
        return journal

    def head(self) -> tuple[int, int]:
        """``(first_seq, next_seq)`` of the journal now (ConfigError if there is no such journal)."""
        journal = self.journal_info()
        return int(journal["first_seq"]), int(journal["next_seq"])


def every_broker_serves(journal: Mapping[str, Any]) -> bool:
    """The journal is kept by JetStream: every broker of the cluster reads it alike (same seqs)."""
    return journal.get("store") == "jetstream"
