"""Coverage-guided fuzzing (atheris) of the wire decoders and of BrokerCore.handle sequences.

Run:  python tests/fuzz/fuzz_core.py [libFuzzer options] [corpus dirs]
      (tests/test_fuzz.py runs it for a bounded time on a copy of tests/fuzz/corpus)

Input format (so that the checked-in seeds, built from the grammar tables by
make_corpus.py, are meaningful and a mutation inside a frame does not
unframe everything after it): steps separated by ``\\xff\\xff``, each
``op peer`` then its frames separated by ``\\xfe\\xfe``.
``op`` picks handle / tick / send failure / commit / stream / close; time
moves by ``peer``'s high bits.  Any exception other than the protocol's own
from a decoder, or any exception at all out of the core, is a crash.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from mc0 import protocol as P
    from mc0.broker.core import BrokerCore
    from mc0.broker.store import MemoryStore
    from mc0.errors import ProtocolError
    from mc0.settings import CoreSettings, JournalSettings

PEERS = (b"\x00\x00\x00\x00\x01", b"\x00\x00\x00\x00\x02", b"\x00\x00\x00\x00\x03", b"chosen")
IDENTITIES = ("anonymous", "alice", "bob", "anonymous")
MAX_STEPS = 64


STEP = b"\xff\xff"
FRAME = b"\xfe\xfe"


def steps(data: bytes):  # type: ignore[no-untyped-def]
    for chunk in data.split(STEP)[:MAX_STEPS]:
        if len(chunk) < 2:
            continue
        frames = chunk[2:].split(FRAME)[:1100] if len(chunk) > 2 else []
        yield chunk[0], chunk[1], frames


def one_input(data: bytes) -> None:
    journal = MemoryStore("main", JournalSettings(topics=("j.>", "mc0.sys.>"), max_bytes=4096))
    core = BrokerCore(CoreSettings(min_ttl_ms=1, max_queue=4, max_requests=8), journals=[journal])
    now = 0.0
    for op, peer, frames in steps(data):
        routing_id = PEERS[peer % len(PEERS)]
        identity = IDENTITIES[peer % len(IDENTITIES)]
        now += (peer >> 4) * 0.05
        kind = op % 8
        if kind <= 3:
            for side in (P.Side.PEER, P.Side.BROKER):
                try:
                    P.decode(frames, sender=side)
                except ProtocolError:
                    pass
            core.handle(routing_id, frames, now, identity, fd=peer % 3)
        elif kind == 4:
            core.tick(now)
        elif kind == 5:
            core.send_failed(routing_id, now, unreachable=bool(op & 0x80))
        elif kind == 6:
            journal.fail_writes = bool(op & 0x80)
            core.commit()
            for item in core.stream(now):
                if op & 0x40:
                    core.stream_blocked(item, now)
        else:
            core.connection_closed(peer % 3, now)
            core.forget_closed(now, drained=bool(op & 0x80))
        if op & 0x20:
            try:
                P.parse_journal_page(frames)
            except ValueError:
                pass


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
