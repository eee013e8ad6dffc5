#!/usr/bin/env python3
"""mc0 beside NATS, Majordomo and the raw ZeroMQ limit (the same code as `mc0 bench`).

./run bench                          # installs the bench group and mc0[spark], runs everything, writes var/bench.json
python scripts/bench.py --quick      # a smoke run (seconds)
python scripts/bench.py --only RPC --runs 5 --json out.json
python scripts/bench.py --suite library --runs 3 --json lib.json --markdown lib.md   # the client libraries
PYTHONPATH=/path/to/other/checkout python scripts/bench.py ...   # this harness, that checkout's mc0
python scripts/bench.py --suite library --pure --runs 3   # each mc0 row also on the pure build (+pure), interleaved
pip install --target /tmp/site dist/mc0-*.whl && PYTHONPATH=/tmp/site python scripts/bench.py ...   # an installed wheel
"""

import os
import sys
from pathlib import Path

# The checkout holds benchmarks/ (not installed): this harness is imported from here whatever
# PYTHONPATH says.  The checkout then goes after PYTHONPATH's entries, so that PYTHONPATH can name
# another checkout whose mc0 is measured (the spawned load processes run this file first, and the
# broker, `python -m mc0` with PYTHONPATH inherited, imports the same mc0).
root = str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, root)
import benchmarks  # noqa: E402, F401

sys.path.remove(root)
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]), root)

from benchmarks.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
