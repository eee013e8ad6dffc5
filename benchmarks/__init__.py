"""mc0's benchmarks (outside the package: nothing here is installed or imported by mc0 itself).

``bench``: the harness and its report (``scripts/bench.py``): mc0 beside NATS,
Majordomo and the raw ZeroMQ limit, in two suites: ``frames`` (the broker
alone, loaded with raw frames) and ``library`` (what a user runs: ``mc0.aio``
and ``mc0`` beside nats-py and majortomo; load processes in ``library_mc0``,
``library_nats``, queue groups and durable consumers for both in
``library_queues``, shared child-side parts in ``library_load``); ``common``:
rows, options, keys, child processes.  ``journal``: journal append rates and
the Spark read.  Run them through ``scripts/`` or ``./run bench``.
"""
