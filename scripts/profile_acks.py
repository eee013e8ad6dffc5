#!/usr/bin/env python3
"""Where does a broker spend its time when a durable consumer's messages are acked one by one?

Loads ``--count`` messages into a journal, then fetches them 100 at a time and
awaits one answered ``ack()`` per message, printing acks/s; with ``--profile``
py-spy samples the broker process meanwhile and the hottest functions are
printed (self and inclusive share of samples).  py-spy comes with the bench
group (``pip install --group bench``) and needs ptrace rights over the broker.

python scripts/profile_acks.py --count 2000 --profile
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import mc0.aio
from mc0.process import BrokerProcess

CONFIG = '[journals.main]\ntopics = ["jobs.>"]\n'


async def acks(endpoint: str, count: int, spy_pid: int | None, out: Path) -> float:
    async with mc0.aio.Client(endpoint) as client:
        for _ in range(count):
            await client.publish("jobs.x", b"x" * 100)
        await client.publish("jobs.x", b"last", confirm=True)  # everything before it is stored
        consumer = await client.consume("main", "work", topics=["jobs.>"])
        spy = None
        if spy_pid is not None:
            command = ["py-spy", "record", "-p", str(spy_pid), "-o", str(out), "-f", "raw", "-r", "200"]
            spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await asyncio.sleep(1)  # py-spy attaches (a profile of the start is not what we want)
        started = time.monotonic()
        got = 0
        for _ in range(count):  # bounded: at least one message per fetch until all are in
            batch = await consumer.fetch(100, wait=1)
            for message in batch:
                await message.ack()
            got += len(batch)
            if got > count or not batch:
                break
        rate = got / (time.monotonic() - started)
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
        return rate


def hottest(path: Path, top: int) -> None:
    own: Counter[str] = Counter()
    within: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        samples = int(n)
        total += samples
        frames = stack.split(";")
        own[frames[-1]] += samples
        for frame in set(frames):
            within[frame] += samples
    print(f"{total} samples")
    for frame, n in own.most_common(top):
        print(f"{n / total:6.1%} self   {frame}")
    for frame, n in within.most_common(top + 10)[10:]:  # past the entry points every sample shares
        print(f"{n / total:6.1%} within {frame}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--profile", action="store_true", help="sample the broker with py-spy")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    if args.profile and shutil.which("py-spy") is None:
        print("profile_acks: py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "mc0.toml"
        config.write_text(CONFIG)
        out = Path(folder) / "profile.txt"
        with BrokerProcess(config=str(config), insecure=True, cwd=folder) as broker:
            assert broker.proc is not None
            pid = broker.proc.pid if args.profile else None
            rate = asyncio.run(acks(broker.endpoint, args.count, pid, out))
        print(f"{rate:,.0f} answered acks/s (pid {os.getpid()})")
        if args.profile and out.exists():
            hottest(out, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
