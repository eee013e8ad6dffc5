"""The client library's own CPU per message and per call, against a scripted broker that costs it nothing.

Run: ``python scripts/bench_client.py [--count 200000] [--runs 5] [--tree base=/path/to/checkout]``.
Each measurement is a fresh pair of processes: a *scripted broker* (a plain
pyzmq ROUTER that speaks just enough of the batched wire: OK to CONNECT, SUB,
READY and confirmed PUTs, a FINAL record per CALL, batches of MESSAGE or WORK
records as fast as the client takes them) and a *client* process running the
library as a user does (``mc0.aio`` or the sync ``mc0``), which reports the CPU
time it spent (``time.process_time``: every thread, libzmq's I/O thread
included; and its event loop thread alone for ``mc0.aio``) over the measured
part.  So the figures are the client's own cost, not the broker's or the
machine's: steadier than a rate on a shared box.  Steadier still,
``--instructions`` runs the client process under valgrind's callgrind (the
scripted broker outside it) twice, at ``--count`` and twice that, and reports
the instructions per message or call from the difference: repeatable to a
fraction of a percent whatever else the machine does (the same runs gave
23,950 and 23,958 per delivered message), though blind to what an instruction
costs (syscalls, cache misses, waiting for the GIL).  With ``--tree NAME=PATH``
each scenario runs again with the client process importing the mc0 of the
checkout at PATH (another commit's code), interleaved run by run.

Scenarios (``--only``): ``sub`` (``async for message in subscription``, one
subscriber, batches of ``--per`` MESSAGE records), ``group`` (the same as a
queue group's copies), ``pub`` (``await client.publish`` fire-and-forget, then
a confirmed one), ``rpc`` (``--window`` lanes of ``await client.request``),
``seq`` (one request at a time), ``worker`` (an async echo handler, ``--window``
requests in flight); ``sync-sub``, ``sync-pub``, ``sync-rpc`` (the sync API:
``for message in sub``, ``client.publish``, ``client.request`` one at a time);
``batches``, ``sync-batches`` (``sub`` read as ``for batch in sub.batches(max=1000)``,
each message's body read: its own rows, never in place of ``sub``'s; a checkout
without ``batches`` cannot run them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import zmq

TOPIC = "bench.client"
SERVICE = "bench"
GROUP = "g"
BODY = b"x" * 100
SCENARIOS = (
    *("sub", "group", "pub", "rpc", "seq", "worker", "sync-sub", "sync-pub", "sync-rpc"),
    *("batches", "sync-batches"),
)


# ============================================================== the scripted broker


class ScriptedBroker:
    """Answers what a client sends, as little work as the wire allows; ``feed`` pushes deliveries."""

    def __init__(self, endpoint: str) -> None:
        from mc0.protocol import batch

        self.batch = batch
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.SNDHWM, 1000)
        self.sock.setsockopt(zmq.RCVHWM, 1000)
        self.sock.bind(endpoint)
        self.peer: bytes | None = None
        self.subscribed = False
        self.ready = False
        self.finals = 0

    def send(self, frames: list[bytes]) -> None:
        assert self.peer is not None
        while True:
            try:
                self.sock.send_multipart([self.peer, *frames], zmq.NOBLOCK)
                return
            except zmq.Again:
                self.poll(0.001, write=True)

    def poll(self, seconds: float, write: bool = False) -> None:
        """Handle what arrived within ``seconds`` (when ``write``, return as soon as sending may go on)."""
        events = self.sock.poll(int(seconds * 1000), zmq.POLLIN | (zmq.POLLOUT if write else 0))
        while events & zmq.POLLIN:
            self.handle(self.sock.recv_multipart(zmq.NOBLOCK))
            events = self.sock.getsockopt(zmq.EVENTS)

    def handle(self, message: list[bytes]) -> None:
        batch = self.batch
        self.peer, frames = message[0], message[1:]
        if not batch.is_batch(frames):
            self.command(frames)
            return
        blob = frames[2]
        replies = []
        for code, start, end in batch.records(blob):
            if code == batch.CALL:
                _, request_id, _, data = batch.call_fields(blob, start, end)
                replies.append(batch.reply_record(True, request_id.encode(), data))
            elif code == batch.FINAL:
                self.finals += 1
            elif code != batch.PUT:
                reply = self.command(batch.frames_of(blob, code, start, end), batched=True)
                if reply is not None:
                    replies.append(reply)
        if replies:
            self.send(batch.batch_frames(b"".join(replies)))

    def command(self, frames: list[bytes], batched: bool = False) -> bytes | None:
        verb = frames[0]
        fields = dict(zip(frames[1:-1:2], frames[2::2], strict=False))
        request_id = fields.get(b"ID")
        if verb == b"CONNECT":
            self.send([b"OK", b"TTL", b"60000", b"BATCH", b"1", b"ID", request_id or b""])
            return None
        if verb == b"SUB":
            self.subscribed = True
        if verb == b"READY":
            self.ready = True
        if verb == b"FINAL":
            self.finals += 1
            return None
        if request_id is None:
            return None
        if verb == b"PING":
            reply = [b"PONG", b"ID", request_id]
        else:
            reply = [b"OK", b"ID", request_id]
        if batched:
            return self.batch.record_of(reply)
        self.send(reply)
        return None

    def close(self) -> None:
        self.sock.close(0)
        self.context.term()


def broker_main(endpoint: str, scenario: str, count: int, per: int, window: int) -> None:
    """The scripted broker's process: says ``ready`` on stdout once bound, runs until killed (or 300 s)."""
    broker = ScriptedBroker(endpoint)
    batch = broker.batch
    print("ready", flush=True)
    try:
        deadline = time.monotonic() + 300
        if scenario in ("sub", "group", "sync-sub", "batches", "sync-batches"):
            while not broker.subscribed and time.monotonic() < deadline:
                broker.poll(0.05)
            time.sleep(0.2)  # the client's SUB is answered and its loop is idle before the clock starts
            if scenario == "group":
                record = batch.group_message_record(TOPIC.encode(), b"anonymous", GROUP.encode(), BODY)
            else:
                record = batch.message_record(TOPIC.encode(), b"anonymous", BODY)
            frames = batch.batch_frames(record * per)
            for _ in range(count // per):
                broker.send(frames)
                broker.poll(0)
        elif scenario == "worker":
            while not broker.ready and time.monotonic() < deadline:
                broker.poll(0.05)
            sent = 0
            while broker.finals < count and time.monotonic() < deadline:
                while sent < count and sent - broker.finals < window:
                    n = min(window - (sent - broker.finals), count - sent, per)
                    ids = [b"%d" % i for i in range(sent, sent + n)]
                    works = [batch.work_record(SERVICE.encode(), bid, b"c", 30_000, BODY) for bid in ids]
                    broker.send(batch.batch_frames(b"".join(works)))
                    sent += n
                broker.poll(0.05)
        while time.monotonic() < deadline:
            broker.poll(0.05)
    finally:
        broker.close()


# ============================================================== the client side


def _cpu() -> tuple[float, float]:
    return time.process_time(), time.thread_time()


def _spent(before: tuple[float, float]) -> tuple[float, float]:
    after = _cpu()
    return after[0] - before[0], after[1] - before[1]


async def aio_client(endpoint: str, scenario: str, count: int, window: int) -> dict[str, Any]:
    import mc0.aio

    if scenario == "worker":
        worker = mc0.aio.Worker(endpoint, capacity=window)

        @worker.service(SERVICE)
        async def echo(request: Any) -> bytes:
            return bytes(request.body)

        await worker.connect()
        before = _cpu()
        while worker.handled < count:
            await asyncio.sleep(0.005)
        spent = _spent(before)
        await worker.close()
        return {"cpu": spent, "n": count}
    async with mc0.aio.Client(endpoint) as client:
        if scenario in ("sub", "group"):
            sub = await client.subscribe(TOPIC, group=GROUP if scenario == "group" else None)
            got = 0
            before = _cpu()
            async for message in sub:
                message.body  # noqa: B018 - what an application reads
                got += 1
                if got >= count:
                    break
            return {"cpu": _spent(before), "n": got}
        if scenario == "batches":
            sub = await client.subscribe(TOPIC)
            got = 0
            before = _cpu()
            async for batch in sub.batches(max=1000):
                for message in batch:
                    message.body  # noqa: B018 - what an application reads
                got += len(batch)
                if got >= count:
                    break
            return {"cpu": _spent(before), "n": got}
        if scenario == "pub":
            before = _cpu()
            for _ in range(count):
                await client.publish(TOPIC, BODY)
            await client.publish(TOPIC, BODY, confirm=True)
            return {"cpu": _spent(before), "n": count}
        lanes = 1 if scenario == "seq" else window
        each = count // lanes

        async def lane() -> None:
            for _ in range(each):
                await client.request(SERVICE, BODY)

        before = _cpu()
        await asyncio.gather(*(lane() for _ in range(lanes)))
        return {"cpu": _spent(before), "n": each * lanes}


def sync_client(endpoint: str, scenario: str, count: int) -> dict[str, Any]:
    import mc0

    with mc0.Client(endpoint) as client:
        if scenario == "sync-sub":
            sub = client.subscribe(TOPIC)
            got = 0
            before = _cpu()
            for message in sub:
                message.body  # noqa: B018 - what an application reads
                got += 1
                if got >= count:
                    break
            return {"cpu": _spent(before), "n": got}
        if scenario == "sync-batches":
            sub = client.subscribe(TOPIC)
            got = 0
            before = _cpu()
            for batch in sub.batches(max=1000):
                for message in batch:
                    message.body  # noqa: B018 - what an application reads
                got += len(batch)
                if got >= count:
                    break
            return {"cpu": _spent(before), "n": got}
        if scenario == "sync-pub":
            before = _cpu()
            for _ in range(count):
                client.publish(TOPIC, BODY)
            client.publish(TOPIC, BODY, confirm=True)
            return {"cpu": _spent(before), "n": count}
        before = _cpu()
        for _ in range(count):
            client.request(SERVICE, BODY)
        return {"cpu": _spent(before), "n": count}


def measure(scenario: str, count: int, per: int, window: int) -> dict[str, Any]:
    """One measurement in this process (the client) beside a scripted broker process."""
    from mc0 import native, ports

    endpoint = f"tcp://127.0.0.1:{ports.free_port()}"
    here = os.path.abspath(__file__)
    command = [sys.executable, here, "broker", endpoint, scenario, str(count), str(per), str(window)]
    broker = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert broker.stdout is not None
        if broker.stdout.readline().strip() != "ready":
            raise RuntimeError("the scripted broker did not start")
        if scenario.startswith("sync-"):
            got = sync_client(endpoint, scenario, count)
        else:
            got = asyncio.run(aio_client(endpoint, scenario, count, window))
    finally:
        broker.kill()
        broker.wait(10)
    process_s, thread_s = got["cpu"]
    import mc0

    return {
        "scenario": scenario,
        "n": got["n"],
        "process_us": process_s * 1e6 / got["n"],
        "loop_us": thread_s * 1e6 / got["n"] if not scenario.startswith("sync-") and scenario != "worker" else None,
        "compiled": sum(native.compiled().values()) if hasattr(native, "compiled") else 0,
        "mc0": os.path.dirname(os.path.abspath(str(mc0.__file__))),
    }


# ============================================================== the harness


def run_one(tree: str | None, scenario: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in a fresh process running this file, importing ``tree``'s mc0 when given (this
    file is run by path, and imports nothing of ``benchmarks``: a tree's own benchmarks are not used)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": tree or here}
    count = args.count // 10 if scenario in ("seq", "sync-rpc") else args.count
    command = [sys.executable, os.path.abspath(__file__), "client", scenario, str(count), str(args.per)]
    command.append(str(args.window))
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd="/")
    if done.returncode != 0:
        raise RuntimeError(f"{scenario} ({tree or 'this checkout'}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if tree is not None and not result["mc0"].startswith(tree):
        raise RuntimeError(f"{scenario}: ran mc0 from {result['mc0']}, not {tree}")
    return result


def instructions_one(tree: str | None, scenario: str, args: argparse.Namespace) -> dict[str, Any]:
    """Instructions per message / call of the client process (every thread), from two callgrind runs."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": tree or here}
    count = max(1, args.count // 10) if scenario in ("seq", "sync-rpc") else args.count
    collected = []
    for n in (count, 2 * count):
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
        command += [os.path.abspath(__file__), "client", scenario, str(n), str(args.per), str(args.window)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env, cwd="/")
        found = [line for line in done.stderr.splitlines() if "Collected :" in line]
        if done.returncode != 0 or not found:
            raise RuntimeError(f"{scenario} ({tree or 'this checkout'}) under callgrind: {done.stderr[-2000:]}")
        collected.append(int(found[-1].rsplit(":", 1)[1]))
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["instructions"] = (collected[1] - collected[0]) / count
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=200_000, help="messages or calls per measurement (seq: 1/10)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per", type=int, default=100, help="records per batch the scripted broker sends")
    parser.add_argument("--window", type=int, default=100, help="rpc, worker: requests in flight")
    parser.add_argument("--only", default=",".join(SCENARIOS[:6]), help=f"comma-separated of {', '.join(SCENARIOS)}")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH", help="another checkout's mc0")
    parser.add_argument(
        "--instructions", action="store_true", help="instructions per message under callgrind (one run each)"
    )
    args = parser.parse_args(argv)
    trees: list[tuple[str, str | None]] = [("this", None)]
    for item in args.tree:
        name, _, path = item.partition("=")
        trees.append((name, os.path.abspath(path)))
    if args.instructions:
        print(f"instructions per message / call of the client process (callgrind, --count {args.count} and twice)")
        for scenario in [s for s in args.only.split(",") if s]:
            for name, path in trees:
                got_one = instructions_one(path, scenario, args)
                print(f"  {scenario:<9} {name:<8} {got_one['instructions']:10,.0f}  [{got_one['mc0']}]")
        return 0
    from .common import build  # (here: a --tree child imports this module before its mc0 is chosen)

    print(f"mc0 build: {build()}; load average {os.getloadavg()[0]:.1f}; {args.runs} runs, interleaved;"
          " CPU us per message / call")  # fmt: skip
    for scenario in [s for s in args.only.split(",") if s]:
        got: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
        for run in range(args.runs):
            for name, path in trees if run % 2 == 0 else list(reversed(trees)):
                got[name].append(run_one(path, scenario, args))
        for name, results in got.items():
            process = statistics.median(r["process_us"] for r in results)
            spread = f"{min(r['process_us'] for r in results):.2f}-{max(r['process_us'] for r in results):.2f}"
            loops = [r["loop_us"] for r in results if r["loop_us"] is not None]
            loop = f", loop thread {statistics.median(loops):.2f}" if loops else ""
            compiled = results[0]["compiled"]
            print(
                f"  {scenario:<9} {name:<8} process {process:6.2f} ({spread}){loop}"
                f"  [{compiled} modules compiled, {results[0]['mc0']}]"
            )
    return 0


if __name__ == "__main__":  # run by path (run_one, measure): the client or the scripted broker of one measurement
    role, *rest = sys.argv[1:]
    if role == "broker":
        broker_main(rest[0], rest[1], int(rest[2]), int(rest[3]), int(rest[4]))
    else:
        print(json.dumps(measure(rest[0], int(rest[1]), int(rest[2]), int(rest[3]))))
