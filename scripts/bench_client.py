#!/usr/bin/env python3
"""The client library's own CPU per message and per call (benchmarks/client_cpu.py), against a scripted broker.

python scripts/bench_client.py                                  # sub, group, pub, rpc, seq, worker; 3 runs
python scripts/bench_client.py --only sub,rpc --runs 5 --tree base=/tmp/mc0-main   # beside another checkout's mc0
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: benchmarks/ is not installed

from benchmarks.client_cpu import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
