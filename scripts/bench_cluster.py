#!/usr/bin/env python3
"""Across brokers: pub/sub 1->1 and 1->4, RPC sequential and 100 in flight, through three mc0 brokers
joined over a three-node NATS cluster, beside one broker and beside that NATS cluster with nats-py.

python scripts/bench_cluster.py                 # 3 runs of each row (a few minutes)
python scripts/bench_cluster.py --quick         # a smoke run
python scripts/bench_cluster.py --compare before=/path/to/other/checkout   # its brokers too, runs interleaved
PYTHONPATH=/path/to/other/checkout python scripts/bench_cluster.py ...     # this harness, that checkout's mc0
"""

import os
import sys
from pathlib import Path

# The checkout holds benchmarks/ (not installed): imported from here whatever PYTHONPATH says, which then
# comes first, so that it can name another checkout whose mc0 is measured (as scripts/bench.py does).
root = str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, root)
import benchmarks  # noqa: E402, F401

sys.path.remove(root)
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]), root)

from benchmarks.cluster import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
