"""The broker's own Python work per RPC call and per published message, without sockets or other processes.

Run: ``python -m benchmarks.core_rpc [--calls 200000] [--window 50] [--profile]``
from the repository root.  One :class:`~mc0.broker.core.dispatch.BrokerCore`
with a :class:`~mc0.broker.sender.Sender` and its
:class:`~mc0.broker.outbox.Outbox` (what the broker's loop runs per message,
less the socket): a batched client sends ``--window`` CALL records in one
``BATCH``, a batched worker (capacity = window) answers every WORK record it
was sent with a FINAL record in one ``BATCH``, and each peer's queue is
taken as a sending loop would take it.  Prints microseconds of CPU per call
(``time.process_time``), and the same for PUT records fanned out to one and
four batched subscribers and to a queue group of three batched members
(each message to one of them), and for PUTs sent as frames, not records, to four
subscribers (the general publish path); ``--profile`` adds cProfile's hottest functions.
This is the floor of the broker's CPU per call the library rows pay for, on
top of the sockets (see scripts/profile_rpc.py for those).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable

from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore
from mc0.broker.outbox import GROUP_SKIP_BYTES, Outbox
from mc0.broker.sender import Sender
from mc0.protocol import batch

SERVICE = b"bench"


def _connect(core: BrokerCore, sender: Sender, routing_id: bytes, now: float) -> None:
    frames = [b"CONNECT", b"VERSION", b"1.0", b"TTL", b"60000", b"BATCH", b"1", b"ID", b"c"]
    sender.apply(core.handle(routing_id, frames, now, fd=len(routing_id)), now)


def taken(outbox: Outbox, routing_id: bytes) -> list[bytes]:
    """Everything queued for ``routing_id``, as the shell's flush would take it: the batches' blobs."""
    blobs = []
    while (message := outbox.next_message(routing_id)) is not None:
        blobs.append(message[-1])
        outbox.sent(routing_id)
    return blobs


def setup(workers_capacity: int) -> tuple[BrokerCore, Sender, Outbox]:
    # As the broker builds them: the core asks the outbox for each peer's backlog (queue groups skip a busy member).
    outbox = Outbox(max_bytes=64 << 20, max_messages=1 << 20, batch_bytes=256 * 1024)
    core = BrokerCore(backlog=outbox.backlog, group_skip_bytes=min((64 << 20) // 4, GROUP_SKIP_BYTES))
    sender = Sender(core, outbox)
    now = 1.0
    for routing_id in (b"client", b"worker", b"sub1", b"sub2", b"sub3", b"sub4", b"pub"):
        _connect(core, sender, routing_id, now)
    ready = [b"READY", b"CAPACITY", str(workers_capacity).encode(), b"ID", b"r", b"", SERVICE]
    sender.apply(core.handle(b"worker", ready, now, fd=len(b"worker")), now)
    for routing_id in (b"client", b"worker", b"sub1", b"sub2", b"sub3", b"sub4", b"pub"):
        taken(outbox, routing_id)
    return core, sender, outbox


def rpc_rounds(calls: int, window: int) -> Callable[[], int]:
    core, sender, outbox = setup(window)
    body = b"x" * 100
    seq = [0]

    def run() -> int:
        done = 0
        now = 2.0
        while done < calls:
            records = []
            for _ in range(window):
                seq[0] += 1
                records.append(batch.call_record(SERVICE, str(seq[0]).encode(), 30_000, body))
            sender.apply(core.handle(b"client", batch.batch_frames(b"".join(records)), now, fd=6), now)
            finals = []
            for blob in taken(outbox, b"worker"):
                for code, start, end in batch.records(blob):
                    assert code == batch.WORK
                    _, bid, _, _, data = batch.work_fields(blob, start, end)
                    finals.append(batch.reply_record(True, bid.encode(), bytes(data)))
            sender.apply(core.handle(b"worker", batch.batch_frames(b"".join(finals)), now, fd=6), now)
            answered = sum(1 for blob in taken(outbox, b"client") for _ in batch.records(blob))
            assert answered == window, answered
            done += window
            now += 0.0001
        return done

    return run


def put_rounds(messages: int, window: int, subscribers: int, group: bytes | None = None) -> Callable[[], int]:
    """PUT records to ``subscribers`` batched peers: each its own copy, or (``group``) one of
    them per message, as members of that queue group."""
    core, sender, outbox = setup(1)
    subs = [b"sub1", b"sub2", b"sub3", b"sub4"][:subscribers]
    sub = [b"SUB", b"ID", b"s"] + ([b"GROUP", group] if group is not None else []) + [b"", b"bench.lib"]
    for routing_id in subs:
        sender.apply(core.handle(routing_id, sub, 1.0, fd=len(routing_id)), 1.0)
        taken(outbox, routing_id)
    record = batch.put_record(b"bench.lib", b"x" * 100)
    blob = record * window

    copies = 1 if group is not None else len(subs)

    def run() -> int:
        done = 0
        now = 2.0
        delivered = core.counters["delivered"]
        while done < messages:
            sender.apply(core.handle(b"pub", batch.batch_frames(blob), now, fd=3), now)
            for routing_id in subs:
                taken(outbox, routing_id)
            done += window
        assert core.counters["delivered"] - delivered == done * copies
        return done

    return run


def put_frames_rounds(messages: int, subscribers: int) -> Callable[[], int]:
    """PUTs as frames (not records) to ``subscribers`` batched peers: the general publish path
    (decode, ``verbs.put``, ``PubSub.fan_out``) that an unbatched publisher takes."""
    core, sender, outbox = setup(1)
    subs = [b"sub1", b"sub2", b"sub3", b"sub4"][:subscribers]
    for routing_id in subs:
        sender.apply(core.handle(routing_id, [b"SUB", b"ID", b"s", b"", b"bench.lib"], 1.0, fd=len(routing_id)), 1.0)
        taken(outbox, routing_id)
    put = [b"PUT", b"TOPIC", b"bench.lib", b"", b"x" * 100]

    def run() -> int:
        delivered = core.counters["delivered"]
        for done in range(1, messages + 1):
            sender.apply(core.handle(b"pub", put, 2.0, fd=3), 2.0)
            if done % 64 == 0:
                for routing_id in subs:
                    taken(outbox, routing_id)
        assert core.counters["delivered"] - delivered == messages * len(subs)
        return messages

    return run


def measure(name: str, run: Callable[[], int], unit: str, profile: bool) -> None:
    run()  # warm the caches
    profiler = cProfile.Profile() if profile else None
    started = time.process_time()
    if profiler is not None:
        profiler.enable()
    count = run()
    if profiler is not None:
        profiler.disable()
    spent = time.process_time() - started
    print(f"{name:<40} {spent / count * 1e6:6.2f} us of CPU per {unit}")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--window", type=int, default=50, help="calls (and PUTs) per batch")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--only", default="", help="run only the figures whose name contains this")
    args = parser.parse_args()
    figures: list[tuple[str, Callable[[], Callable[[], int]], str]] = [
        (f"RPC, {args.window} calls per batch", lambda: rpc_rounds(args.calls, args.window), "call"),
        ("PUT records to 1 subscriber(s)", lambda: put_rounds(args.calls, args.window, 1), "message"),
        ("PUT records to 4 subscriber(s)", lambda: put_rounds(args.calls, args.window, 4), "message"),
        ("PUT records to a queue group of 3", lambda: put_rounds(args.calls, args.window, 3, b"workers"), "message"),
        ("PUT frames to 4 subscriber(s)", lambda: put_frames_rounds(args.calls, 4), "message"),
    ]
    for name, rounds, unit in figures:
        if args.only in name:
            measure(name, rounds(), unit, args.profile)


if __name__ == "__main__":
    P.DEFAULT_LIMITS  # noqa: B018 - (imported for the side effect of loading the model first)
    main()
