"""mc0's benchmarks (outside the package: nothing here is installed or imported by mc0 itself).

``bench``: mc0 beside NATS, Majordomo and the raw ZeroMQ limit; ``journal``:
journal append rates and the Spark read.  Run them through ``scripts/`` or
``./run bench``.
"""
