"""The broker core's CPU per answered durable-consumer ack, without sockets: a file journal on disk.

Run: ``python -m benchmarks.core_acks [--acks 20000] [--page 100] [--profile]``
from the repository root.  One :class:`~mc0.broker.core.dispatch.BrokerCore` with a
real file :class:`~mc0.broker.storage.filestore.Journal` (fsync at its
default, ``batch``, as the library bench runs it) and a batched client: the
client pulls ``--page`` messages (100), then acks each one alone (one CALL record to
``mc0.consumer`` per ack) and the core commits after each, as the broker's
loop does for an answered ack (``message.ack()``) that arrives alone.
Prints microseconds of CPU per ack (``time.process_time``, including the
consumer state log's write); ``--profile`` adds cProfile's hottest
functions.  scripts/profile_acks.py profiles the same over sockets.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore
from mc0.broker.outbox import Outbox
from mc0.broker.sender import Sender
from mc0.broker.storage.filestore import Journal
from mc0.protocol import batch
from mc0.settings import JournalSettings

from .core_rpc import measure, taken

CLIENT = b"client"
PAGE = 100


class Rig:
    """A core, its delivery and outbox, a file journal of ``count`` records and one consumer."""

    def __init__(self, folder: Path, count: int, page: int) -> None:
        self.page = page
        self.journal = Journal("main", JournalSettings(topics=("jobs.>",), folder=str(folder), max_bytes=0)).open()
        self.core = BrokerCore(journals=[self.journal])
        self.outbox = Outbox(max_bytes=64 << 20, max_messages=1 << 20, batch_bytes=256 * 1024)
        self.sender = Sender(self.core, self.outbox)
        self.rid = 0
        self.now = 1.0
        connect = [b"CONNECT", b"VERSION", b"1.0", b"TTL", b"60000", b"BATCH", b"1", b"ID", b"c"]
        self.send(connect)
        for _ in range(count):
            self.send(batch.batch_frames(batch.put_record(b"jobs.x", b"x" * 100)))
        self.ask({"op": "create", "topics": ["jobs.>"], "max_ack_pending": max(1000, page)})

    def send(self, frames: list[bytes]) -> list[bytes]:
        """One message from the client, then the commit a loop turn ends with; the client's answers."""
        core, now = self.core, self.now
        self.sender.apply(core.handle(CLIENT, frames, now, fd=6), now)
        self.sender.apply(core.commit(), now)
        return taken(self.outbox, CLIENT)

    def ask(self, query: dict[str, object]) -> list[bytes]:
        self.rid += 1
        body = json.dumps({"journal": "main", "name": "bench", **query}).encode()
        return self.send(
            batch.batch_frames(batch.call_record(P.CONSUMER_SERVICE.encode(), str(self.rid).encode(), 30_000, body))
        )

    def pull(self) -> list[int]:
        (blob,) = self.ask({"op": "pull", "max": self.page})
        ((code, start, end),) = list(batch.records(blob))
        frames = batch.frames_of(blob, code, start, end)
        return [r.seq for r in P.parse_journal_page(frames[frames.index(b"") + 1 :][:2])]


def ack_each(folder: Path, acks: int, page: int = PAGE) -> Callable[[], int]:
    rig = Rig(folder, 2 * acks + 2 * page, page)  # the warm-up run and the measured one

    def run() -> int:
        done = 0
        while done < acks:
            for seq in rig.pull():
                answers = rig.ask({"op": "ack", "seqs": [seq]})
                assert len(answers) == 1 and b'{"ack": 1, ' in answers[0], answers  # answered: settled
                done += 1
        return done

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--acks", type=int, default=20_000)
    parser.add_argument("--page", type=int, default=PAGE, help="messages per pull (all held until acked)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mc0-core-acks-") as folder:
        run = ack_each(Path(folder), args.acks, args.page)
        measure(f"answered ack, one per request, {args.page} per pull", run, "ack", args.profile)


if __name__ == "__main__":
    main()
