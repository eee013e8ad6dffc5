#!/usr/bin/env python3
"""Journal append rate per fsync policy vs plain PUT, and the Spark scan vs a plain Python source.

python scripts/bench_journal.py                      # full run (needs mc0[spark] and Java)
python scripts/bench_journal.py --no-spark --runs 1  # the append rates only
python scripts/bench_journal.py --spark-only         # the Spark scan: 200,000 rows of 100 B, local[2],
                                                     # and the read with a topic filter (--topics PATTERNS)
python scripts/bench_journal.py --jetstream-only --runs 3  # R3 JetStream journal via a broker vs nats-py
python scripts/bench_journal.py --file-vs-jetstream --runs 3  # file journal vs one JetStream node, equal sync
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: benchmarks/ is not installed

from benchmarks.journal import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
