#!/usr/bin/env python3
"""Scale beside nats-server, in one invocation: idle peers held (CPU, memory, round trips with and
without them) and connects/s (benchmarks/scale.py says what each row measures).

python scripts/bench_scale.py                         # every row: idle 1,000/5,000/10,000, connects
python scripts/bench_scale.py --only idle --peers 10000 --seconds 10
python scripts/bench_scale.py --only connects --connects 2000 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ (the checkout's)

from benchmarks.scale import ScaleOptions, load_average, run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[1_000, 5_000, 10_000])
    parser.add_argument("--seconds", type=float, default=10.0, help="CPU measured over this with the peers held")
    parser.add_argument("--connects", type=int, default=2_000)
    parser.add_argument("--ttl-ms", type=int, default=ScaleOptions.ttl_ms, help="the TTL mc0's idle peers name")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=[], help="idle, connects")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    options = ScaleOptions(
        peers=tuple(args.peers), seconds=args.seconds, connects=args.connects, ttl_ms=args.ttl_ms,
        runs=args.runs, only=tuple(args.only),
    )  # fmt: skip
    print(f"load average before: {load_average()} ({os.cpu_count()} cores)", flush=True)
    rows = run(options, lambda line: print(line, flush=True))
    print(f"load average after: {load_average()}")
    print()
    print("| row | system | median | unit | p50 / p99 ms (with / none) | memory | note |")
    print("|---|---|---:|---|---|---|---|")
    failing = False
    for row in rows:
        d = row.as_dict()
        failing |= row.failing
        rt = ""
        if "p50_ms" in d:
            rt = f"{d['p50_ms']:.3f} / {d['p99_ms']:.3f} ({d['p50_none_ms']:.3f} / {d['p99_none_ms']:.3f})"
            rt += f": p99 x{d['p99_ratio']:.2f}"
        mem = f"{d['rss_mib']:.0f} MiB, {d['kib_per_peer']:.1f} KiB/peer" if "rss_mib" in d else ""
        if "broker_ms_per_connect" in d:
            mem = f"{d['broker_ms_per_connect']:.3f} ms broker CPU per connect"
        flag = " FAILING" if row.failing else ""
        print(f"| {row.scenario} | {row.system} | {row.median:,.1f} | {row.unit} | {rt} | {mem} | {row.note}{flag} |")
    if args.json:
        Path(args.json).write_text(json.dumps([r.as_dict() | {"counts": r.counts} for r in rows], indent=1))
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
