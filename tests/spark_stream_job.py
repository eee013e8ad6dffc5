"""A streaming query run as its own process (so a test can kill -9 it mid-batch):
journal -> Parquet with a checkpoint, availableNow, small micro-batches.

usage: python -m tests.spark_stream_job ENDPOINT CHECKPOINT OUTPUT MAX_PER_TRIGGER
"""

from __future__ import annotations

import sys

from mc0.spark import make_session


def main(endpoint: str, checkpoint: str, output: str, per_trigger: str) -> None:
    spark = make_session("local[2]", app="mc0-test-job", scratch=checkpoint + ".local")
    stream = (
        spark.readStream.format("mc0")
        .option("endpoint", endpoint)
        .option("topics", "orders.>")
        .option("maxRecordsPerTrigger", per_trigger)
        .option("maxRecordsPerPartition", "25")
        .load()
    )
    query = (
        stream.select("seq", "topic", "body")
        .writeStream.format("parquet")
        .option("checkpointLocation", checkpoint)
        .option("path", output)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
