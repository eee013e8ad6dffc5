#!/usr/bin/env python3
"""mc0 beside NATS, Majordomo and the raw ZeroMQ limit (the same code as `mc0 bench`).

./run bench                          # installs mc0[bench], runs everything, writes var/bench.json
python scripts/bench.py --quick      # a smoke run (seconds)
python scripts/bench.py --only RPC --runs 5 --json out.json
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: benchmarks/ is not installed

from benchmarks.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
