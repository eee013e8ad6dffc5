"""The broker core's own work per journaled PUT record, without sockets: a file journal on ``>`` beside no journal.

Run: ``python -m benchmarks.core_journal [--count 100000] [--per 2000] [--runs 3] [--tree NAME=PATH]
[--instructions]`` from the repository root.  One
:class:`~mc0.broker.core.dispatch.BrokerCore` with its
:class:`~mc0.broker.sender.Sender` and :class:`~mc0.broker.outbox.Outbox` (what the
loop runs per message, less the sockets): a batched publisher sends ``BATCH``es of
``--per`` PUT records of 100 bytes on ``jb.load``, a batched subscriber on ``jb.>``
takes what is queued for it, and the core commits after each batch (as a loop turn
ends).  Systems: ``journal`` (a file journal on ``>``, ``fsync = "batch"``, its fsync
on this thread as the core's own commit does it: not counted as CPU, which is what it
costs the loop's CPU; the broker runs it on its sync thread) and ``no journal``.
Figures: microseconds of CPU per message (``time.process_time``, median of
``--runs``), or with ``--instructions`` the instructions per message (valgrind's
callgrind, the difference between a run of ``--count`` and one of twice that: the
same to a fraction of a percent whatever else the machine does, blind to what an
instruction costs).  Each measurement is a fresh process running this file; ``--tree
NAME=PATH`` measures another checkout's mc0 too, interleaved run by run (the
journal's append path before and after a change).  The subscriber's copies and the
journal's records are counted: a run that lost any fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SYSTEMS = ("journal", "no journal")
BODY = b"x" * 100


def one(system: str, count: int, per: int) -> dict[str, Any]:
    """A run in this process: ``count`` PUT records (rounded up to whole batches) after a warm-up batch."""
    import mc0
    from mc0.broker.core.dispatch import BrokerCore
    from mc0.broker.outbox import Outbox
    from mc0.broker.sender import Sender
    from mc0.broker.storage.filestore import Journal
    from mc0.protocol import batch
    from mc0.settings import JournalSettings

    with tempfile.TemporaryDirectory(prefix="mc0-core-journal-") as folder:
        journals = []
        if system == "journal":
            settings = JournalSettings(topics=(">",), folder=folder, max_bytes=0, fsync="batch")
            journals.append(Journal("all", settings).open())
        outbox = Outbox(max_bytes=256 << 20, max_messages=1 << 22, batch_bytes=256 * 1024)
        core = BrokerCore(journals=journals, backlog=outbox.backlog)
        sender = Sender(core, outbox)
        connect = [b"CONNECT", b"VERSION", b"1.0", b"TTL", b"60000", b"BATCH", b"1", b"ID", b"c"]
        for rid in (b"pub", b"sub"):
            sender.apply(core.handle(rid, connect, 1.0, fd=len(rid)), 1.0)
        sender.apply(core.handle(b"sub", [b"SUB", b"ID", b"s", b"", b"jb.>"], 1.0, fd=3), 1.0)
        blob = batch.batch_frames(b"".join(batch.put_record(b"jb.load", BODY) for _ in range(per)))
        delivered = [0]

        def turn(now: float) -> None:
            sender.apply(core.handle(b"pub", blob, now, fd=3), now)
            while core.unfinished:
                sender.apply(core.resume(now, 2048), now)
            sender.apply(core.commit(), now)
            for rid in (b"pub", b"sub"):
                while (message := outbox.next_message(rid)) is not None:
                    if rid == b"sub":
                        delivered[0] += sum(1 for _ in batch.records(message[-1]))
                    outbox.sent(rid)

        for rid in (b"pub", b"sub"):
            while outbox.next_message(rid) is not None:
                outbox.sent(rid)
        turn(2.0)  # warm-up
        turns = -(-count // per)
        started = time.process_time()
        for i in range(turns):
            turn(3.0 + i * 0.001)
        spent = time.process_time() - started
        messages = turns * per
        stored = journals[0].next_seq - 1 if journals else messages + per
        for journal in journals:
            journal.close()
    return {
        "system": system,
        "messages": messages,
        "us_per_msg": spent * 1e6 / messages,
        "lost": messages + per - delivered[0] + (messages + per - stored),
        "mc0": os.path.dirname(os.path.abspath(str(mc0.__file__))),
    }


def run_one(tree: str | None, system: str, count: int, per: int, instructions: bool) -> dict[str, Any]:
    """One measurement in a fresh process running this file with ``tree``'s mc0 first on the path."""
    here = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": tree or here}
    if not instructions:
        command = [sys.executable, os.path.abspath(__file__), "one", system, str(count), str(per)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env, cwd="/")
        if done.returncode != 0:
            raise RuntimeError(f"{system} ({tree or 'this checkout'}): {done.stderr[-2000:]}")
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    collected = []
    result: dict[str, Any] = {}
    for n in (count, 2 * count):
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
        command += [os.path.abspath(__file__), "one", system, str(n), str(per)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=7200, env=env, cwd="/")
        found = [line for line in done.stderr.splitlines() if "Collected :" in line]
        if done.returncode != 0 or not found:
            raise RuntimeError(f"{system} ({tree or 'this checkout'}) under callgrind: {done.stderr[-2000:]}")
        collected.append(int(found[-1].rsplit(":", 1)[1]))
        result = json.loads(done.stdout.strip().splitlines()[-1])
    result["instructions"] = (collected[1] - collected[0]) / (-(-count // per) * per)
    return result


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["one"]:
        print(json.dumps(one(args_in[1], int(args_in[2]), int(args_in[3]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000, help="PUT records per run")
    parser.add_argument("--per", type=int, default=2_000, help="PUT records per BATCH (one loop turn each)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH", help="another checkout's mc0")
    parser.add_argument("--instructions", action="store_true", help="instructions per message (valgrind callgrind)")
    args = parser.parse_args(args_in)
    trees: list[tuple[str, str | None]] = [("this", None)]
    for item in args.tree:
        name, _, path = item.partition("=")
        if not name or not (Path(path) / "mc0" / "__init__.py").is_file():
            parser.error(f"--tree {item!r}: NAME=PATH, PATH a checkout holding mc0/")
        trees.append((name, os.path.abspath(path)))
    runs = 1 if args.instructions else max(1, args.runs)
    got: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in range(runs):
        order = trees if run % 2 == 0 else list(reversed(trees))
        for name, path in order:
            for system in SYSTEMS:
                result = run_one(path, system, args.count, args.per, args.instructions)
                if path is not None and not str(result["mc0"]).startswith(path):
                    raise RuntimeError(f"{system}: ran mc0 from {result['mc0']}, not {path}")
                got.setdefault((name, system), []).append(result)
    load = os.getloadavg()[0]
    unit = "instructions per message (callgrind)" if args.instructions else f"us of CPU per message (median of {runs})"
    print(f"| tree | system | {unit} | lost |  (load average {load:.1f})\n|---|---|---:|---:|")
    failed = False
    for (name, system), results in got.items():
        lost = sum(int(r["lost"]) for r in results)
        failed = failed or lost != 0
        if args.instructions:
            figure = f"{results[0]['instructions']:,.0f}"
        else:
            figure = f"{statistics.median(r['us_per_msg'] for r in results):.2f}"
        print(f"| {name} | {system} | {figure} | {lost} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
