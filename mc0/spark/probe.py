"""A one-row Python data source that proves Spark's Python workers can import mc0.

Contract: ``check_workers(spark)`` reads ``format("mc0probe")`` once on the
given session (a tiny job: planning and one partition run in Spark's Python
workers, the same path ``format("mc0")`` takes) and raises
:class:`mc0.ConfigError` naming the cause and the fix when they cannot.
Spark fixes the workers' interpreter (``PYSPARK_PYTHON``, else ``python3`` from
``PATH``) when the session starts, so a session someone else built cannot be
corrected from here, only refused clearly before a query fails deep inside.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader

from ..errors import ConfigError

PROBE_NAME = "mc0probe"


class ProbeDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return PROBE_NAME

    def schema(self) -> str:
        return "ok string"

    def reader(self, schema: Any) -> DataSourceReader:
        return ProbeReader()


class ProbeReader(DataSourceReader):
    def read(self, partition: Any) -> Iterator[tuple[str]]:
        # Running at all proves it: the worker unpickled this class, so it imported mc0 (and pyzmq).
        yield ("mc0",)


def check_workers(spark: Any) -> None:
    """Raise ConfigError unless this session's Python workers can run the mc0 source."""
    spark.dataSource.register(ProbeDataSource)
    try:
        rows = spark.read.format(PROBE_NAME).load().collect()
    except Exception as exc:  # Spark wraps the worker's failure in its own error types
        raise ConfigError(
            "spark",
            f"Spark's Python workers cannot run the mc0 source ({cause_of(str(exc))}). They run PYSPARK_PYTHON "
            f"(else python3 from PATH), fixed when the session started: set PYSPARK_PYTHON={sys.executable} "
            "before building it, or build it with mc0.spark.make_session()",
        ) from None
    if [tuple(r) for r in rows] != [("mc0",)]:
        raise ConfigError("spark", f"the mc0 probe read {rows!r} instead of one row")


def cause_of(text: str) -> str:
    """The Python exception line inside a Spark error (the part a person needs), else its first line."""
    for line in reversed(text.splitlines()):
        match = re.match(r"^([\w.]+(?:Error|Exception|Timeout|Failed|Gone)): (.+)$", line.strip())
        if match and not match.group(1).startswith(("org.", "java.", "pyspark.")):
            return f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2)}"
    return text.strip().splitlines()[0] if text.strip() else "unknown error"
