#!/usr/bin/env python3
"""Journal append rate per fsync policy vs plain PUT, and rows/s read into Spark vs the client's fetch.

python scripts/bench_journal.py                      # full run (needs mc0[spark] and Java)
python scripts/bench_journal.py --no-spark --runs 1  # the append rates only
"""

import sys

from mc0.bench_journal import main

if __name__ == "__main__":
    sys.exit(main())
