"""Lets Spark find the ``mc0`` data source by itself: pyspark registers the
``DefaultSource`` of every top-level module named ``pyspark_*`` on its path."""

from mc0.spark.source import Mc0DataSource as DefaultSource

__all__ = ["DefaultSource"]
