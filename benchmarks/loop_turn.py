"""The cost of one broker loop turn that carries one message: broker CPU per turn, one message at a time.

Run: ``python -m benchmarks.loop_turn [--seconds 3] [--runs 3] [--compare NAME=PATH ...]`` from the
repository root (or through ``scripts/bench.py --suite turn``).

Contract: a broker process (insecure, defaults; with ``--compare NAME=PATH`` also one
whose ``mc0`` comes from ``PATH`` (a checkout, or a copy of its ``mc0/``), every
system run in turn, the order rotated every run) and a minimal client in this process on the batched wire
(raw pyzmq, blocking: nothing but the broker is measured) that sends one
message, waits for what it causes, and only then sends the next, so every
broker loop turn carries one message in and one out.  Two shapes:

- ``echo``: one socket subscribed to ``turn.echo`` publishes a PUT record to it
  and waits for its own MESSAGE back (one turn: PUT in, MESSAGE out);
- ``rpc``: a client socket sends a CALL record, a worker socket in the same
  process answers the WORK with a FINAL, the client waits for it (two turns
  per call: CALL in / WORK out, FINAL in / FINAL out).

Beside them, ``pyzmq-loop`` (echo only): a minimal pyzmq ROUTER loop that answers
every message with one prebuilt MESSAGE (a blocking poll, a receive, a send: no
protocol), the floor a Python broker on libzmq pays per turn on this machine; and
``native-loop`` (echo only, the compiled build): the same loop through the broker's
own native socket work (``mc0.broker.routerio``: one C call each to poll, receive the
batch and send it), what libzmq, the kernel and a few Python calls cost per turn
without any protocol, the floor of any loop on libzmq here.

Figures per turn (per message the broker received): the broker's CPU time
(user + system, psutil) on its main thread and on its other threads
(libzmq's I/O thread), the voluntary context switches of all its threads
(/proc), and the wall time;
the median of ``runs`` runs of ``seconds`` each.  Every message sent must
come back (a lost one fails the run); every loop is bounded in time.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from mc0.process import BrokerProcess
from mc0.protocol import batch

from .common import CTX, Options, Row, build, free_port
from .wire import CONNECT, ID, OK, READY, SUB, dealer, mc0_connect

TOPIC = b"turn.echo"
SERVICE = b"turn.rpc"
BODY = b"x" * 100
WARMUP = 300
TIMEOUT_MS = 5_000
# The kernel counts a thread's CPU time in clock ticks (10 ms at USER_HZ 100): a run ends only once the
# broker's main thread spent MIN_MAIN_CPU, or its figure is a count of a tick or two (or 0 on a loaded
# box, where a quick run gets few turns); bounded by MAX_SECONDS, past which the run fails saying so.
MIN_MAIN_CPU = 0.05
MAX_SECONDS = 30.0
CHECK_EVERY = 0.05  # (s) how often, past ``seconds``, the main thread's CPU is read
FLOOR_START_LIMIT = 60.0  # (s) for the floor's child process to bind (a spawned interpreter; slow when loaded)
SHAPES = ("echo", "rpc")


@dataclass
class TurnFigures:
    """One run: per turn (a message the broker received), CPU on the main thread and the rest, switches, wall."""

    turns: int
    main_us: float
    other_us: float
    switches: float
    wall_us: float

    @property
    def cpu_us(self) -> float:
        return self.main_us + self.other_us


@dataclass
class TurnRow:
    shape: str
    system: str
    runs: list[TurnFigures] = field(default_factory=list)
    failed: str = ""

    def median(self, name: str) -> float:
        values = [getattr(r, name) for r in self.runs]
        return statistics.median(values) if values else 0.0


def _recv_batch(sock: zmq.Socket[Any]) -> list[bytes]:
    if not sock.poll(TIMEOUT_MS):
        raise RuntimeError("the broker did not answer within 5 s (a lost message)")
    return sock.recv_multipart()


def _records(frames: list[bytes], code: int) -> list[tuple[int, int]]:
    if frames[0] != batch.BATCH:
        return []
    return [(start, end) for c, start, end in batch.records(frames[2]) if c == code]


def _echo(context: zmq.Context[Any], endpoint: str) -> Callable[[], int]:
    sock = dealer(context, endpoint, None)
    mc0_connect(sock, batched=True)
    sock.send_multipart([SUB, ID, b"s", b"", TOPIC])
    _recv_batch(sock)
    message = [*batch.BATCH_MARK, batch.put_record(TOPIC, BODY)]

    def once() -> int:
        sock.send_multipart(message)
        while not _records(_recv_batch(sock), batch.MESSAGE):
            pass
        return 1  # one turn: the PUT in, the MESSAGE out

    return once


def _rpc(context: zmq.Context[Any], endpoint: str) -> Callable[[], int]:
    worker = dealer(context, endpoint, None)
    mc0_connect(worker, batched=True)
    worker.send_multipart([READY, ID, b"r", b"CAPACITY", b"10", b"", SERVICE])
    _recv_batch(worker)
    client = dealer(context, endpoint, None)
    mc0_connect(client, batched=True)
    serial = 0

    def once() -> int:
        nonlocal serial
        serial += 1
        client.send_multipart([*batch.BATCH_MARK, batch.call_record(SERVICE, str(serial).encode(), 30_000, BODY)])
        answered = False
        while not answered:
            frames = _recv_batch(worker)
            for start, end in _records(frames, batch.WORK):
                _service, bid, _caller, _timeout, data = batch.work_fields(frames[2], start, end)
                worker.send_multipart([*batch.BATCH_MARK, batch.reply_record(True, bid.encode(), data)])
                answered = True
        while not _records(_recv_batch(client), batch.FINAL):
            pass
        return 2  # two turns: the CALL in / WORK out, the FINAL in / FINAL out

    return once


SHAPE_CLIENTS = {"echo": _echo, "rpc": _rpc}


def _threads(process: Any) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in process.threads()}


def _switches(pid: int) -> int:
    """Voluntary context switches of every thread of ``pid`` so far (/proc; psutil reads the main
    thread's only)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # (a thread that just ended)
            continue
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def measure(
    endpoint: str,
    pid: int,
    shape: str,
    seconds: float,
    *,
    min_main_cpu: float = MIN_MAIN_CPU,
    max_seconds: float = MAX_SECONDS,
) -> TurnFigures:
    """One run against the broker at ``endpoint`` (process ``pid``): at least ``seconds``, and on until
    the broker's main thread spent ``min_main_cpu`` of CPU (its clock ticks coarsely); past
    ``max_seconds`` without that, RuntimeError says so (a row with no figure says why)."""
    import psutil  # type: ignore[import-untyped]

    process = psutil.Process(pid)
    main_tid = pid  # (the broker loop runs on the process's main thread: its thread id is the pid)
    context: zmq.Context[Any] = zmq.Context()
    try:
        once = SHAPE_CLIENTS[shape](context, endpoint)
        for _ in range(WARMUP):
            once()
        before = _threads(process)
        switches = _switches(pid)
        turns = 0
        started = time.perf_counter()
        check = started + seconds
        limit = started + max(seconds, max_seconds)
        while True:  # bounded by ``limit``
            turns += once()
            now = time.perf_counter()
            if now < check:
                continue
            if _threads(process).get(main_tid, 0.0) - before.get(main_tid, 0.0) >= min_main_cpu or now >= limit:
                break
            check = now + CHECK_EVERY
        wall = time.perf_counter() - started
        after = _threads(process)
        switched = _switches(pid) - switches
    finally:
        context.destroy(linger=0)
    spent = {tid: cpu - before.get(tid, 0.0) for tid, cpu in after.items()}
    main = spent.pop(main_tid, 0.0)
    if main < min_main_cpu:
        raise RuntimeError(
            f"too little broker CPU to measure: its main thread's clock (10 ms ticks) read {main * 1000:.0f} ms"
            f" over {turns:,} turns in {wall:.1f} s (at least {min_main_cpu * 1000:.0f} ms needed)"
        )
    return TurnFigures(
        turns=turns,
        main_us=main / turns * 1e6,
        other_us=sum(spent.values()) / turns * 1e6,
        switches=switched / turns,
        wall_us=wall / turns * 1e6,
    )


FLOOR = "pyzmq-loop"
NATIVE_FLOOR = "native-loop"
FLOORS = (FLOOR, NATIVE_FLOOR)


class _Known:
    """Every routing id is known (the native floor reads no connection's address)."""

    def __contains__(self, item: object) -> bool:
        return True


def native_floor_main(port: int, bound: Any = None) -> None:
    """The native floor: ``floor_main``'s answers through ``mc0.broker.routerio``'s compiled RouterIO (one
    C call each to poll, to receive every ready message and to send the answers).  The compiled build only."""
    from mc0 import native
    from mc0.broker.routerio import RouterIO

    if not native.compiled()["mc0.broker.routerio"]:
        raise SystemExit("the native-loop floor needs the compiled build (./run test or ./run bench builds it)")
    context: zmq.Context[Any] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{port}")
    if bound is not None:
        bound.set()
    io = RouterIO(router, [], curve=False)
    answer = [*batch.BATCH_MARK, batch.message_record(TOPIC, b"anonymous#1", BODY)]
    ok = [OK, ID, b"c"]
    known = _Known()
    while True:
        if io.poll(1000, False):
            io.send([(m[0], ok if m[1][0] in (CONNECT, SUB) else answer) for m in io.receive(512, 1 << 18, known)])


def floor_main(port: int, bound: Any = None) -> None:
    """The floor: a pyzmq ROUTER answering CONNECT and SUB with OK and anything else with one prebuilt
    MESSAGE record, one message at a time (a blocking poll, a receive, a send; no protocol).  ``bound``:
    a multiprocessing Event set once it listens."""
    context: zmq.Context[Any] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{port}")
    if bound is not None:
        bound.set()
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    answer = [*batch.BATCH_MARK, batch.message_record(TOPIC, b"anonymous#1", BODY)]
    noblock, more = int(zmq.NOBLOCK), int(zmq.SNDMORE | zmq.NOBLOCK)
    while True:
        poller.poll(1000)
        while True:
            try:
                first = router.recv(noblock, copy=False)
            except zmq.Again:
                break
            frames = [first.bytes]
            while first.more:
                first = router.recv(noblock, copy=False)
                frames.append(first.bytes)
            reply = [OK, ID, b"c"] if frames[1] in (CONNECT, SUB) else answer
            router.send(frames[0], more)
            for frame in reply[:-1]:
                router.send(frame, more)
            router.send(reply[-1], noblock)


@contextmanager
def broker(system: str, path: str | None) -> Iterator[tuple[str, int]]:
    """(endpoint, pid) of a fresh broker at its defaults; ``path``: a checkout whose mc0 it runs (None:
    this one); the ``pyzmq-loop`` floor is a child process of this one."""
    if system in FLOORS:
        port = free_port()
        bound = CTX.Event()
        main = floor_main if system == FLOOR else native_floor_main
        process = CTX.Process(target=main, args=(port, bound), daemon=True)
        process.start()
        try:
            if not bound.wait(FLOOR_START_LIMIT):
                raise RuntimeError(f"the {system} floor did not listen within {FLOOR_START_LIMIT:g} s")
            assert process.pid is not None
            yield f"tcp://127.0.0.1:{port}", process.pid
        finally:
            process.kill()
            process.join(5)
        return
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory() as folder, BrokerProcess(insecure=True, cwd=folder, env=env) as process:
        assert process.proc is not None
        yield process.endpoint, process.proc.pid


def run(
    *,
    seconds: float,
    runs: int,
    shapes: tuple[str, ...],
    compare: dict[str, str],
    floor: bool = True,
    say: Callable[[str], None] = print,
) -> list[TurnRow]:
    """Every system (``mc0``, then ``compare``'s, then the floor) and shape, ``runs`` times, the order
    rotated every run (a box whose load drifts favours none)."""
    systems: list[tuple[str, str | None]] = [("mc0", None), *compare.items()]
    if floor:
        systems += [(FLOOR, None), (NATIVE_FLOOR, None)]
    rows = {(shape, name): TurnRow(shape, name) for shape in shapes for name, _ in systems}
    for run_index in range(runs):
        order = systems[run_index % len(systems) :] + systems[: run_index % len(systems)]
        for shape in shapes:
            for name, path in order:
                if name in FLOORS and shape != "echo":
                    continue
                row = rows[(shape, name)]
                try:
                    with broker(name, path) as (endpoint, pid):
                        got = measure(endpoint, pid, shape, seconds)
                except Exception as exc:  # a broken run fails its row, the others go on
                    row.failed = f"{type(exc).__name__}: {exc}"[:200]
                    say(f"  turn {shape:<5} {name:<12} FAILED {row.failed}")
                    continue
                row.runs.append(got)
                say(
                    f"  turn {shape:<5} {name:<12} {got.cpu_us:6.1f} us CPU per turn (main {got.main_us:.1f}"
                    f" + I/O {got.other_us:.1f}), {got.switches:.2f} switches, wall {got.wall_us:.0f} us,"
                    f" {got.turns:,} turns"
                )
    return [row for row in rows.values() if row.runs or row.failed]


# py-spy (--native) stages of a turn: a sample goes to the first stage naming one of its frames, leaf first.
SPY_STAGES = (
    ("poll (waiting, and its syscalls)", ("zmq_poll", "Poller.poll")),
    ("core: next_deadline, uncommitted, streaming", ("next_deadline", "uncommitted", "streaming", "has_work")),
    ("zmq send (each wakes libzmq's I/O thread)", ("zmq_msg_send", "send_frames")),
    ("zmq receive (frames, EVENTS)", ("zmq_msg_recv", "zmq_getsockopt", "_recv_rest")),
    (
        "core: handle (dispatch, dialects, batched walk, pub/sub, rpc)",
        ("BrokerCore.", "batched___", "pubsub___", "rpc___", "verbs___", "workers___", "jobs___", "dialects"),
    ),
    ("delivery, outbox", ("Delivery.", "Outbox.", "outbox.py")),
    ("loop bookkeeping (Broker.run, _receive, _timers)", ("Broker.", "server.py")),
)


def spy_stages(name: str, path: str | None, shape: str, seconds: float, rate: int = 250) -> dict[str, float]:
    """One run under py-spy (``--native``, ``rate`` Hz): each stage's share of the broker main thread's
    samples (py-spy samples the wall clock: "poll" is mostly the wait between turns)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory() as folder, broker(name, path) as (endpoint, pid):
        out = Path(folder) / "spy.txt"
        command = [spy, "record", "-p", str(pid), "-o", str(out), "-f", "raw", "-r", str(rate), "--native", "--threads"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)  # (attached before the load starts)
            measure(endpoint, pid, shape, seconds)
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(60)
        counts = dict.fromkeys([stage for stage, _ in SPY_STAGES] + ["other"], 0)
        for line in out.read_text().splitlines() if out.exists() else []:
            stack, _, n = line.rpartition(" ")
            if not n.isdigit() or "MainThread" not in stack.split(";", 1)[0]:
                continue
            counts[_stage_of(stack.split(";"))] += int(n)
    total = sum(counts.values()) or 1
    return {stage: n / total for stage, n in counts.items()}


def _stage_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for stage, needles in SPY_STAGES:
            if any(needle in frame for needle in needles):
                return stage
    return "other"


TURN_SCENARIO = "loop turn carrying one message"
TURN_UNIT = "us CPU/turn"


def turn_rows(options: Options, say: Callable[[str], None] = print) -> list[Row]:
    """The bench harness's rows (``scripts/bench.py``: the broker suite, or ``--suite turn``): per shape,
    mc0 and the pyzmq-loop floor, the broker's CPU per turn (lower is better; main thread, other threads,
    switches and wall time beside it)."""
    shapes = tuple(s for s in SHAPES if options.wants(f"{TURN_SCENARIO} ({s})"))
    systems = [s for s in ("mc0", *FLOORS) if options.wants_system(s)]
    if not shapes or not systems:
        return []
    seconds = 0.3 if options.quick else options.seconds
    measured = run(
        seconds=seconds,
        runs=1 if options.quick else options.runs,
        shapes=shapes,
        compare={},
        floor=any(f in systems for f in FLOORS),
        say=say,
    )
    out = []
    for turn in measured:
        if turn.system not in systems:
            continue
        row = Row(f"{TURN_SCENARIO} ({turn.shape})", turn.system, TURN_UNIT, lower_is_better=True)
        row.values = [r.cpu_us for r in turn.runs]
        for r in turn.runs:
            row.add_extra("main_us", r.main_us)
            row.add_extra("other_us", r.other_us)
            row.add_extra("switches", r.switches)
            row.add_extra("wall_us", r.wall_us)
        if turn.failed:
            row.note = f"FAILING: {turn.failed}"
            row.add_counts(errors=1)
        out.append(row)
    return out


def instructions(system: str, path: str | None, shape: str, turns: int) -> float:
    """User-space instructions per turn (every thread of the broker) counted by valgrind's callgrind:
    the broker starts uninstrumented, the client warms it up, then ``callgrind_control`` instruments
    exactly ``turns`` turns.  Unlike CPU time this does not move with the machine's load (the same
    code counts the same to a fraction of a percent); it leaves out the kernel (wake-ups, syscalls)."""
    port = free_port()
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        server = ["-m", "mc0", "broker", "--insecure", "--bind", f"tcp://127.0.0.1:{port}"]
        if system in FLOORS:
            main = "floor_main" if system == FLOOR else "native_floor_main"
            server = ["-c", f"from benchmarks.loop_turn import {main}; {main}({port})"]
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parent.parent), path or "") if p)
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        process = subprocess.Popen(
            [*command, sys.executable, *server], env=env, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        context: zmq.Context[Any] = zmq.Context()
        try:
            once = _when_up(context, f"tcp://127.0.0.1:{port}", shape)
            for _ in range(WARMUP):
                once()
            control = ["callgrind_control", "--instr=on", str(process.pid)]
            subprocess.run(control, capture_output=True, timeout=60, check=True)
            done = 0
            while done < turns:
                done += once()
            control[1] = "--instr=off"
            subprocess.run(control, capture_output=True, timeout=60, check=True)
        finally:
            context.destroy(linger=0)
            process.terminate()
            process.communicate(timeout=120)
        counted = sum(
            int(n)
            for part in Path(folder).glob("callgrind.out*")
            for n in re.findall(r"^totals:\s+(\d+)", part.read_text(), re.M)
        )
    if not counted:
        raise RuntimeError("callgrind counted nothing (is valgrind's callgrind_control working?)")
    return counted / done


def _when_up(context: zmq.Context[Any], endpoint: str, shape: str, timeout: float = 120.0) -> Callable[[], int]:
    """The shape's client, once the server under valgrind (slow to start) answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return SHAPE_CLIENTS[shape](context, endpoint)
        except RuntimeError:
            if time.monotonic() > deadline:
                raise


def table(rows: list[TurnRow]) -> list[str]:
    lines = [
        "| shape | system | broker CPU µs per turn | main thread | other threads | voluntary switches | wall µs |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        note = f" FAILING: {row.failed}" if row.failed else ""
        lines.append(
            f"| {row.shape} | {row.system}{note} | {row.median('cpu_us'):.1f} | {row.median('main_us'):.1f}"
            f" | {row.median('other_us'):.1f} | {row.median('switches'):.2f} | {row.median('wall_us'):.0f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: echo, rpc")
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="another mc0 (a checkout, or a folder holding a copy of mc0/) measured in turn with this one",
    )
    parser.add_argument("--no-floor", action="store_true", help="leave out the pyzmq-loop floor")
    parser.add_argument(
        "--callgrind",
        type=int,
        default=0,
        metavar="TURNS",
        help="instead: user-space instructions per turn under valgrind's callgrind, over TURNS turns "
        "(load-independent; valgrind needed)",
    )
    parser.add_argument(
        "--spy", action="store_true", help="instead: one run of each under py-spy --native, its stages' shares"
    )
    args = parser.parse_args(argv)
    shapes = tuple(s for s in args.shapes.split(",") if s in SHAPES)
    compare = dict(item.partition("=")[::2] for item in args.compare)
    if args.spy:
        named: list[tuple[str, str | None]] = [("mc0", None), *compare.items()]
        for shape in shapes:
            shares = {name: spy_stages(name, path, shape, min(args.seconds, 60.0)) for name, path in named}
            print(f"\npy-spy, {shape}: share of the broker main thread's samples")
            print("| stage | " + " | ".join(shares) + " |\n|---|" + "---:|" * len(shares))
            for stage in next(iter(shares.values())):
                print(f"| {stage} | " + " | ".join(f"{got[stage]:.1%}" for got in shares.values()) + " |")
        return 0
    if args.callgrind:
        systems: list[tuple[str, str | None]] = [("mc0", None), *compare.items()]
        print("| shape | system | instructions per turn (user space, callgrind) |\n|---|---|---:|")
        for shape in shapes:
            floors: list[tuple[str, str | None]] = [(f, None) for f in FLOORS]
            for name, path in systems + ([] if args.no_floor or shape != "echo" else floors):
                counted = instructions(name, path, shape, args.callgrind)
                print(f"| {shape} | {name} | {counted / 1000:,.1f} k |", flush=True)
        return 0
    load = os.getloadavg()[0]
    rows = run(
        seconds=min(args.seconds, 60.0),
        runs=max(1, args.runs),
        shapes=shapes,
        compare=compare,
        floor=not args.no_floor,
    )
    print(f"\nbroker CPU per loop turn carrying one message (median of {args.runs} runs of {args.seconds:g} s;"
          f" mc0 build: {build()}; load average {load:.1f} -> {os.getloadavg()[0]:.1f})")  # fmt: skip
    print("\n".join(table(rows)))
    return 1 if any(row.failed for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
