"""The ``mc0`` PySpark data source and sink (Python Data Source API, pyspark >= 4.2).

Contract: ``spark.read.format("mc0")`` / ``spark.readStream.format("mc0")``
read one journal of a broker through the built-in ``mc0.journal`` service;
``df.write.format("mc0")`` / ``df.writeStream.format("mc0")`` publish rows.
Registered as ``mc0`` without user code through the top-level module
``pyspark_mc0``; ``register(spark)`` does it explicitly.

Offsets are journal sequence numbers (``{"seq": n}``, the next seq to
read); a partition is a range ``[start, end)`` fetched by an executor over
its own connection (CURVE when ``key``/``brokerKey`` are given), so a batch
or micro-batch reads the same records however often it is replayed, which is
what makes a checkpointed query exactly-once end to end with an idempotent
sink.  ``startingOffsets``: ``earliest`` (the oldest record kept, the
default), ``latest`` (what is published after the query starts; resolved by
the first micro-batch and recorded in its checkpoint, so a replay of batch 0
is the same) or a number / ``{"seq": n}``.

Options (read): endpoint, journal (default ``main``), topics (comma-separated
patterns), key, brokerKey, startingOffsets, endingOffsets (batch, default
``latest``), maxRecordsPerTrigger, maxRecordsPerPartition (default 10000),
failOnDataLoss (default true: a range trimmed by retention fails the query;
false skips to the oldest record kept), timeout (seconds).
Options (write): endpoint, key, brokerKey, msgidPrefix, timeout, window
(confirmations in flight).  Rows need ``topic`` and ``body``; ``headers``
(map of ``X-`` headers) and ``msgid`` are optional.  Without ``msgid`` each
row gets a deterministic one (prefix, batch, partition, row index and a digest
of the row), so a replayed batch is acknowledged as duplicates on a
journaled topic instead of being published twice.

Executors import this package: they need mc0 installed and ``PYSPARK_PYTHON``
pointing at that interpreter (``mc0 pipeline`` sets it for local runs).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .source import Mc0DataSource

__all__ = ["Mc0DataSource", "check_workers", "make_session", "register"]


def __getattr__(name: str) -> Any:
    # pyspark loads with the source, not with the package (the report needs no pyspark).
    if name == "Mc0DataSource":
        from .source import Mc0DataSource

        return Mc0DataSource
    if name == "check_workers":
        from .probe import check_workers

        return check_workers
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(spark: Any) -> None:
    """Register ``mc0`` on a session explicitly (auto-registration needs ``pyspark_mc0`` on the path)."""
    from .source import Mc0DataSource

    spark.dataSource.register(Mc0DataSource)


def make_session(
    master: str | None = "local[*]", *, app: str = "mc0", scratch: str | None = None, ui: bool = False
) -> Any:
    """A SparkSession for mc0 jobs.  Local masters bind to 127.0.0.1 with the UI
    off unless asked; executors run this interpreter (where mc0 is installed)
    unless ``PYSPARK_PYTHON`` says otherwise; ``scratch`` holds Spark's local files.
    ``master=None`` leaves it to ``spark-submit``."""
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app)
        .config("spark.ui.enabled", str(ui).lower())
        .config("spark.ui.showConsoleProgress", "false")  # progress is ours to show (mc0 pipeline)
    )
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", "4")
        )
    if scratch is not None:
        builder = builder.config("spark.local.dir", scratch).config(
            "spark.sql.warehouse.dir", os.path.join(scratch, "warehouse")
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
