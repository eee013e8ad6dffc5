#!/usr/bin/env python3
"""Across brokers: pub/sub 1->1 and 1->4, RPC sequential and 100 in flight, through three mc0 brokers
joined over a three-node NATS cluster, beside one broker and beside that NATS cluster with nats-py.

python scripts/bench_cluster.py                 # 3 runs of each row (a few minutes)
python scripts/bench_cluster.py --quick         # a smoke run
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: benchmarks/ is not installed

from benchmarks.cluster import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
