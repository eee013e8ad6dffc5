"""``mc0 bench --endpoint URL``: load an existing broker the way ``nats bench`` does.

Contract: ``run(args)`` parses its own options (``--pub``, ``--sub``,
``--msgs``, ``--size``, ``--topic``, ``--timeout``), connects ``--sub``
subscribers then ``--pub`` publishers (keys from ``MC0_KEY`` /
``MC0_BROKER_KEY`` as every client), publishes ``--msgs`` messages split
among the publishers while a progress bar shows what was sent and
received, and prints publish and delivery rates.  Every wait is bounded:
the run gives up (an mc0 error, one line) when subscribers stop receiving
for ``--timeout`` seconds.  Returns the exit status.
"""

from __future__ import annotations

import argparse
import threading
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..client import Client
from ..errors import Error, Timeout


def parse(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mc0 bench --endpoint URL", description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="The broker to load (e.g. tcp://127.0.0.1:61616).")
    parser.add_argument("--pub", type=int, default=1, help="Publishers (default 1).")
    parser.add_argument("--sub", type=int, default=1, help="Subscribers (default 1; 0 = publish only).")
    parser.add_argument("--msgs", type=int, default=100_000, help="Messages in all (default 100,000).")
    parser.add_argument("--size", type=int, default=128, help="Body bytes (default 128).")
    parser.add_argument("--topic", default="bench.load", help="Topic (default bench.load).")
    parser.add_argument("--timeout", type=float, default=10.0, help="Give up after this long with nothing received.")
    options = parser.parse_args(args)
    for name in ("pub", "msgs"):
        if getattr(options, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if options.sub < 0 or options.size < 0 or options.timeout <= 0:
        parser.error("--sub and --size must be >= 0, --timeout > 0")
    return options


def run(args: list[str]) -> int:
    options = parse(args)
    console = Console(stderr=True)
    total = options.msgs
    expected = total * options.sub
    received = [0] * options.sub
    sent = [0] * options.pub
    body = b"x" * options.size
    subscribers = [Client(options.endpoint).connect() for _ in range(options.sub)]
    publishers: list[Client] = []
    try:
        subscriptions = [client.subscribe(options.topic) for client in subscribers]
        for client in subscribers:
            client.ping()  # the SUB is in place before anything is published
        publishers = [Client(options.endpoint).connect() for _ in range(options.pub)]
        failures: list[BaseException] = []

        def consume(i: int) -> None:
            try:
                while received[i] < total:
                    received[i] += len(subscriptions[i].next_batch(10_000, timeout=options.timeout))
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)

        def produce(i: int) -> None:
            share = total // options.pub + (1 if i < total % options.pub else 0)
            try:
                client = publishers[i]
                for _ in range(share):
                    client.publish(options.topic, body)
                    sent[i] += 1
                client.ping()  # everything before it reached the broker
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(options.sub)]
        threads += [threading.Thread(target=produce, args=(i,), daemon=True) for i in range(options.pub)]
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        start = time.perf_counter()
        with Progress(*columns, console=console, transient=False) as progress:
            published = progress.add_task("published", total=total)
            delivered = progress.add_task("delivered", total=max(expected, 1)) if options.sub else None
            for thread in threads:
                thread.start()
            last_change, last_seen = time.monotonic(), -1
            while any(t.is_alive() for t in threads) and not failures:
                time.sleep(0.1)  # the bar's refresh rate; the loop ends by the stall rule below
                seen = sum(sent) + sum(received)
                progress.update(published, completed=sum(sent))
                if delivered is not None:
                    progress.update(delivered, completed=sum(received))
                if seen != last_seen:
                    last_change, last_seen = time.monotonic(), seen
                elif time.monotonic() - last_change > options.timeout + 1:
                    raise Timeout("mc0 bench: progress", options.timeout)
            progress.update(published, completed=sum(sent))
            if delivered is not None:
                progress.update(delivered, completed=sum(received))
        elapsed = time.perf_counter() - start
        if failures:
            raise failures[0] if isinstance(failures[0], Error) else Error(f"mc0 bench: {failures[0]}")
        size = options.size
        print(
            f"pub: {options.pub} publisher(s), {sum(sent):,} msgs of {size} B in {elapsed:.2f}s: "
            f"{sum(sent) / elapsed:,.0f} msg/s, {sum(sent) * size / elapsed / 1e6:,.1f} MB/s"
        )
        if options.sub:
            print(
                f"sub: {options.sub} subscriber(s), {sum(received):,} msgs delivered: "
                f"{sum(received) / elapsed:,.0f} msg/s in all"
            )
        return 0
    finally:
        for client in (*publishers, *subscribers):
            client.close()
