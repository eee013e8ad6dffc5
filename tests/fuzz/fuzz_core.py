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

Batched input: a handle step with bit 0x08 of ``op`` set sends its frames
joined as one ``BATCH`` blob (each frame is raw records, so mutations reach
the record parser); the core walks batches ``SLICE`` records at a time, the
commit step also walks on (``resume``) and says the shell caught up, and the
run ends by walking every batch to its end.  Everything the core returns goes
through an ``Outbox`` the way the shell queues it (forgotten peers' queues
discarded first) and is sent at each tick step (a loop turn's end) and at
the end: taking each message must not raise, and a peer that is not
batched must never be handed a ``BATCH``.

MemoDB (seed 003, NNG, not the ROUTER): a handle step whose first frame is
``NNG`` hands the second frame to ``MemoDB.handle`` as one NNG request, and
every step's output for MemoDB routing ids is delivered as nngbridge does.
Each NNG request must be answered at most once, and at the end each one is
answered or still waiting at the broker (a token lost is a leaked context).
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from mc0 import protocol as P
    from mc0.broker.core.dispatch import BrokerCore
    from mc0.broker.dialects import recognise
    from mc0.broker.dialects.memodb import MemoDB, with_memodb_identity
    from mc0.broker.outbox import Outbox
    from mc0.broker.storage.memstore import MemoryStore
    from mc0.errors import ProtocolError
    from mc0.permissions import Permissions
    from mc0.settings import CoreSettings, JournalSettings

PEERS = (b"\x00\x00\x00\x00\x01", b"\x00\x00\x00\x00\x02", b"\x00\x00\x00\x00\x03", b"chosen")
IDENTITIES = ("anonymous", "alice", "bob", "anonymous")
MAX_STEPS = 64
SLICE = 3  # records of a batch walked per call: small, so that cursors, waiting and resuming are reached


MEMO_MARK = b"NNG"
MEMO_PERMISSIONS = with_memodb_identity(Permissions.from_table({"identity": {"memodb": {}}}), "memodb")
STEP = b"\xff\xff"
FRAME = b"\xfe\xfe"


def steps(data: bytes):  # type: ignore[no-untyped-def]
    for chunk in data.split(STEP)[:MAX_STEPS]:
        if len(chunk) < 2:
            continue
        frames = chunk[2:].split(FRAME)[:1100] if len(chunk) > 2 else []
        yield chunk[0], chunk[1], frames


class Memo:
    """MemoDB beside the core, routed as mc0.broker.nngbridge routes it."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core
        self.outbox = Outbox(max_bytes=1 << 24, max_messages=1 << 16, batch_bytes=4096)
        self.memo = MemoDB(identity="memodb", nonce=b"fuzzfuzz", heartbeat_ms=100, max_workers=4, max_payload=4096)
        self.issued = 0
        self.answered: set[bytes] = set()

    def replies(self, replies) -> None:  # type: ignore[no-untyped-def]
        for token, _ in replies:
            if token in self.answered:
                raise AssertionError(f"NNG request {token!r} answered twice")
            self.answered.add(token)

    def route(self, out, now: float) -> None:  # type: ignore[no-untyped-def]
        for _ in range(64):
            for routing_id in self.core.take_forgotten():
                self.replies(self.memo.forgotten(routing_id))
                self.outbox.discard(routing_id)
            more = []
            for routing_id, frames in out:
                if self.memo.owns(routing_id) and not isinstance(frames, bytes):
                    follow, replies = self.memo.deliver(self.core.dialect_ops, routing_id, frames, now)
                    self.replies(replies)
                    more += follow
                else:
                    peer = self.core.sessions.get(routing_id)
                    batched = peer is not None and peer.batched
                    self.outbox.put(routing_id, frames, batched=batched, known=peer is not None, now=now)
            if not more and not self.core.forgotten:
                return
            out = more

    def send(self, now: float) -> None:
        """What the shell's flush does with each queue (the socket takes everything)."""
        outbox = self.outbox
        for routing_id in outbox.ready(now):
            peer = self.core.sessions.get(routing_id)
            for _ in range(10_000):
                message = outbox.next_message(routing_id)
                if message is None:
                    break
                if P.batch.is_batch(message) and (peer is None or not peer.batched):
                    raise AssertionError(f"a BATCH handed to {routing_id!r}, which is not batched")
                outbox.sent(routing_id, now)

    def handle(self, data: bytes, now: float) -> None:
        self.issued += 1
        out, replies = self.memo.handle(self.core.dialect_ops, b"%d" % self.issued, data, now)
        self.replies(replies)
        self.route(out, now)

    def check(self) -> None:
        waiting = {w.token for w in self.memo.workers.values() if w.token is not None}
        waiting |= {token for token, _ in self.memo.clients.values()}
        lost = {b"%d" % n for n in range(1, self.issued + 1)} - self.answered - waiting
        if lost:
            raise AssertionError(f"NNG requests never answered nor waiting: {sorted(lost)}")


def one_input(data: bytes) -> None:
    journal = MemoryStore("main", JournalSettings(topics=("j.>", "mc0.sys.>"), max_bytes=4096))
    core = BrokerCore(
        CoreSettings(min_ttl_ms=1, max_queue=4, max_requests=8),
        MEMO_PERMISSIONS,
        journals=[journal],
        dialects=recognise,
    )
    core.batched.batch_slice = SLICE
    memo = Memo(core)
    now = 0.0
    for op, peer, frames in steps(data):
        routing_id = PEERS[peer % len(PEERS)]
        identity = IDENTITIES[peer % len(IDENTITIES)]
        now += (peer >> 4) * 0.05
        kind = op % 8
        out = []
        if kind <= 3 and len(frames) == 2 and frames[0] == MEMO_MARK:
            memo.handle(frames[1], now)
        elif kind <= 3:
            if op & 0x08:  # batched input: the frames are raw records
                frames = P.batch.batch_frames(b"".join(frames))
            for side in (P.Side.PEER, P.Side.BROKER):
                try:
                    P.decode(frames, sender=side)
                except ProtocolError:
                    pass
            out = core.handle(routing_id, frames, now, identity, fd=peer % 3)
        elif kind == 4:
            memo.route(core.tick(now), now)  # (the shell queues the tick's output, then flushes)
            memo.send(now)  # a loop turn ends: what accumulated is sent (batches, mixed modes)
        elif kind == 5:
            out = core.send_failed(routing_id, now, unreachable=bool(op & 0x80))
        elif kind == 6:
            journal.fail_writes = bool(op & 0x80)
            if op & 0x10:
                core.caught_up(now)
            out = core.resume(now, 1 + (peer & 0x0F)) + core.commit()
            for item in core.pages(now):
                if op & 0x40:
                    core.page_blocked(item, now)
        else:
            core.connection_closed(peer % 3, now)
            out = core.forget_closed(now, drained=bool(op & 0x80))
        memo.route(out, now)
        if op & 0x20:
            try:
                P.parse_journal_page(frames)
            except ValueError:
                pass
            for frame in frames:
                try:
                    P.parse_columns_page(frame).records()
                except ValueError:
                    pass
    for _ in range(10_000):  # every batch walked to its end (each call walks at least one record)
        if not core.unfinished:
            break
        memo.route(core.resume(now, 64), now)
    if core.unfinished:
        raise AssertionError("batches never walked to their end")
    memo.route(core.shutdown(now), now)
    memo.send(now)
    memo.check()


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
