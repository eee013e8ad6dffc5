"""Builds tests/fuzz/corpus from the grammar tables: one seed per verb a peer may send (every
required and optional header), boundary values in every numeric header, oversized and deeply
nested bodies for the built-in services, MDP client/worker frames, and a few whole sessions.
Files named regression-* (inputs that once crashed) are kept.

    python tests/fuzz/make_corpus.py     (the seeds are checked in; rerun when the grammar changes)
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import cbor2

from mc0 import protocol as P
from mc0.protocol import Header, Verb, batch

HERE = Path(__file__).parent
VALUES = {
    Header.ID: "1",
    Header.VERSION: "1.0",
    Header.TTL: "1000",
    Header.TOPIC: "j.a",
    Header.SERVICE: "svc",
    Header.TIMEOUT: "100",
    Header.ALL: "1",
    Header.CAPACITY: "2",
    Header.CODE: "500",
    Header.MESSAGE: "m",
    Header.MSGID: "m1",
    Header.FROM: "0",
    Header.JOURNAL: "main",
}
NUMERIC = (Header.TTL, Header.TIMEOUT, Header.CAPACITY, Header.CODE, Header.FROM, Header.ALL)
# Boundary values tried in every numeric header: what int() and isdigit() disagree on, overflow, signs.
TRICKY_NUMBERS = ("0", "-1", "", " 7", "²", "١٢٣", "9" * 20, "9" * 5000, "1e3", "0x10")
TRICKY_BODIES = (
    b"[" * 3000,
    b'{"op":' + b"[" * 3000,
    b'{"op":"fetch","journal":"main","from_seq":' + b"9" * 400 + b"}",
)
PAYLOAD = {Verb.SUB: [b"j.>"], Verb.UNSUB: [b"j.>"], Verb.READY: [b"svc"], Verb.PUT: [b"body"]}


def step(op: int, peer: int, frames: list[bytes]) -> bytes:
    """One step in fuzz_core.py's input format (steps end with \\xff\\xff, frames are split by \\xfe\\xfe)."""
    return bytes([op, peer]) + b"\xfe\xfe".join(frames) + b"\xff\xff"


def command(verb: Verb, *, optional: bool) -> list[bytes]:
    grammar = P.PEER_GRAMMAR[verb]
    headers = {h: VALUES.get(h, "x") for h in grammar.required}
    if optional:
        headers.update({h: VALUES.get(h, "x") for h in grammar.optional})
    if grammar.user_headers:
        headers["X-k"] = "v"
    return P.encode(verb, headers, PAYLOAD.get(verb, [b"body"] if grammar.payload is not P.Payload.NONE else []))


def seeds() -> list[bytes]:
    connect = step(0, 0, command(Verb.CONNECT, optional=True))
    worker = step(0, 1, command(Verb.CONNECT, optional=True)) + step(0, 1, command(Verb.READY, optional=True))
    out = []
    for verb in P.PEER_GRAMMAR:
        for optional in (False, True):
            out.append(connect + step(0, 0, command(verb, optional=optional)))
    out.append(
        connect
        + worker
        + step(0, 0, P.encode(Verb.REQUEST, {Header.SERVICE: "svc", Header.ID: "r"}, [b"x"]))
        + step(0, 1, P.encode(Verb.PARTIAL, {Header.ID: "1"}, [b"p"]))
        + step(0, 1, P.encode(Verb.FINAL, {Header.ID: "1"}, [b"f"]))
        + step(4, 0x30, [])
    )
    out.append(
        connect
        + step(0, 0, P.encode(Verb.SUB, {Header.FROM: "0"}, [b"j.>"]))
        + step(0, 0, P.encode(Verb.PUT, {Header.TOPIC: "j.a", Header.ID: "p"}, [b"x"]))
        + step(6, 0, [])
        + step(
            0,
            0,
            P.encode(
                Verb.REQUEST, {Header.SERVICE: "mc0.journal", Header.ID: "f"}, [b'{"op":"fetch","journal":"main"}']
            ),
        )
        + step(6, 0x40, [])
    )
    columns_fetch = b'{"op":"fetch","journal":"main","page":"columns/1","max_records":2}'
    out.append(
        connect
        + step(0, 0, P.encode(Verb.PUT, {Header.TOPIC: "j.a", Header.ID: "p", "X-k": "v"}, [b"x", b"y"]))
        + step(0, 0, P.encode(Verb.PUT, {Header.TOPIC: "j.b"}, [b"z"]))
        + step(6, 0, [])
        + step(0, 0, P.encode(Verb.REQUEST, {Header.SERVICE: "mc0.journal", Header.ID: "c"}, [columns_fetch]))
        + step(6, 0x40, [])
        + step(6, 0, [])
    )
    records = [P.Record(1, 1.5, "j.a", "alice", {"X-k": "v"}, (b"x", b"y")), P.Record(3, 2.0, "j.b", "bob", {}, ())]
    out.append(step(0x24, 0, [P.columns_page(P.page_columns(records), 4)]))  # a columns page for the parser
    for verb, grammar in P.PEER_GRAMMAR.items():
        for header in NUMERIC:
            if header in grammar.required or header in grammar.optional:
                for value in TRICKY_NUMBERS:
                    frames = command(verb, optional=True)
                    frames[frames.index(header.value.encode()) + 1] = value.encode()
                    out.append(connect + worker + step(0, 0, frames))
    for body in TRICKY_BODIES:
        for service in (b"mc0.broker", b"mc0.journal"):
            out.append(connect + step(0, 0, [b"REQUEST", b"SERVICE", service, b"ID", b"r", b"", body]))
            out.append(step(0, 2, [b"MDPC02", b"\x02", service, body]))
    out.append(step(0, 2, [b"", b"MDPC02", b"\x02", b"mc0.broker", b"stats"]))
    # Seed 000 (MDPXC01 / MDPXW01): a worker, a client with two requests in flight, the replies, PING.
    s0_worker = step(1, 2, [b"MDPXW01", b"\x01", b"s0"])
    out.append(s0_worker + step(0, 0, [b"MDPXC01", b"\x01", b"s0", b"r1", b"x"]) + step(1, 0, [b"MDPXW01", b"PING"]))
    out.append(s0_worker + step(1, 0, [b"MDPXW01", b"\x04", b"1", b"", b"1", b"y"]) + step(1, 0, [b"MDPW02", b"\x06"]))
    for body in TRICKY_BODIES:
        out.append(step(0, 2, [b"MDPXC01", b"\x01", b"mc0.broker", b"r", body]))
    # eMQP/1.0: eventmq's INFORM and the seed's, READY, a REQUEST, both REPLY forms, KBYE.
    e = [b"", b"eMQP/1.0"]
    e_worker = step(1, 2, [*e, b"INFORM", b"i", b'[[10, "eq"]]', b"worker"]) + step(1, 0, [*e, b"READY", b"r"])
    out.append(e_worker + step(0, 0, [*e, b"REQUEST", b"m", b"eq", b"timeout:1", b"x"]))
    out.append(e_worker + step(1, 0, [*e, b"REPLY", b"o", b"y", b"1"]) + step(1, 0, [*e, b"KBYE", b"k"]))
    out.append(step(1, 2, [*e, b"INFORM", b"i", b"a,b"]) + step(1, 0, [*e, b"REPLY", b"1", b"y"]))
    for body in TRICKY_BODIES:
        out.append(step(0, 2, [*e, b"REQUEST", b"m", b"mc0.broker", b"", body]))
    # DCP v1: register, ping, a request with metadata, the reply, a hand-off.
    d = [b"", b"DGBX\x01"]
    d_worker = step(1, 2, [*d, b"\x01", b"s v"]) + step(1, 0, [*d, b"\x02"])
    out.append(d_worker + step(0, 0, [*d, b"\x04", b"s v", b"", b"m", b"", b"x"]))
    out.append(d_worker + step(1, 0, [*d, b"\x05", b"1", b"", b"m", b"", b"y"]))
    out.append(d_worker + step(1, 0, [*d, b"\x04", b"other", b"1", b"", b"m", b"", b"z"]))
    for body in TRICKY_BODIES:
        out.append(step(0, 2, [*d, b"\x04", b"mc0.broker", b"", b"", body]))

    # MemoDB (seed 003, NNG): [b"NNG", one NNG message]; worker IDs in the harness are b"fuzzfuzz" + counter.
    def memo(kind: int, wid: bytes, *fields: object, payload: bytes = b"") -> list[bytes]:
        return [b"NNG", cbor2.dumps(["memo01", kind, wid, *fields], canonical=True) + payload]

    w1 = b"fuzzfuzz" + (1).to_bytes(8, "big")
    m_worker = step(0, 2, memo(1, b"", ["ms", "m0"]))
    out.append(m_worker + step(0, 0, memo(2, b"", "ms", 100, payload=b"q")) + step(0, 0, memo(3, w1, payload=b"a")))
    out.append(m_worker + step(4, 0x30, []) + step(0, 0, memo(4, w1)) + step(0, 0, memo(3, w1, True)))
    out.append(m_worker + step(0, 0, memo(2, b"", "ms", 1, payload=b"q")) + step(4, 0x10, []) + step(0, 0, memo(3, w1)))
    out.append(step(1, 2, [b"MDPW02", b"\x01", b"m0"]) + step(0, 0, memo(2, b"", "m0", 50)) + m_worker)
    out.append(
        step(0, 0, memo(5, b"x")) + step(0, 0, [b"NNG", b"\x9f\xff"]) + step(0, 0, memo(2, b"", "mc0.broker", 9))
    )
    out.append(step(0, 2, [b"MDPW02", b"\x01", b"svc"]) + step(0, 0, [b"MDPC02", b"\x02", b"svc", b"x"]))
    out.append(
        connect
        + step(0, 0, P.encode(Verb.REQUEST, {Header.SERVICE: "mc0.broker", Header.ID: "s"}, [b'{"op":"peers"}']))
    )
    # The original mc0d peers (seed 004): enveloped sessions, CONNECT without VERSION/TTL, exact-string
    # topics (opaque ones with spaces, and 1.0 ones meeting 1.0 wildcards), a framing switch, a chosen id.
    old = step(0, 3, [b"", b"CONNECT", b"ID", b"chattyClient 0"])
    opaque = [b"", b"SUB", b"ID", b"s", b"", b"mcollective discovery", b"a.*", b"j.a"]
    put = [b"", b"PUT", b"TOPIC", b"mcollective discovery", b"X-REPLY-TO", b"mcollective reply c 1", b"", b"x"]
    out.append(old + step(0, 3, opaque) + step(0, 3, put) + step(4, 0x80, []) + step(0, 3, [b"", b"NOOP", b"ID", b"n"]))
    out.append(
        old
        + connect
        + step(0, 3, opaque)
        + step(0, 0, P.encode(Verb.SUB, {}, [b"j.*"]))
        + step(0, 3, [b"", b"PUT", b"TOPIC", b"j.a", b"", b"y"])
        + step(0, 0, P.encode(Verb.PUT, {Header.TOPIC: "j.a"}, [b"z"]))
    )
    out.append(old + step(0, 3, [b"NOOP", b"ID", b"bare"]) + step(0, 3, [b"CONNECT", b"VERSION", b"0.2"]))
    out.append(step(0, 1, [b"", b"CONNECT", b"VERSION", b"1.0", b"TTL", b"100", b"BATCH", b"1"]) + step(5, 1, []))
    out.append(e_worker + step(0, 0, [*e, b"REQUEST", b"m", b"eq", b"reply-requested,guarantee,retry-count:3", b"x"]))
    out.append(s0_worker + step(0, 0, [b"MDPXC01", b"\x01", b"s0", b"r1"]))
    return out + batched_seeds()


BATCHED = 0x08  # fuzz_core.py: a handle step whose frames are raw batch records, sent as one BATCH


def batched_seeds() -> list[bytes]:
    """Batched input: every record shape, short records, a batch longer than the harness's slice
    with a message waiting behind it, refusals, and a loop turn (tick) to send what accumulated."""
    connect = step(0, 0, [b"CONNECT", b"VERSION", b"1.0", b"TTL", b"1000", b"BATCH", b"1", b"ID", b"c"])
    worker = step(0, 1, [b"CONNECT", b"VERSION", b"1.0", b"TTL", b"1000", b"BATCH", b"1"]) + step(
        BATCHED, 1, [batch.record_of([b"READY", b"", b"svc"])]
    )
    records = [
        batch.record_of([b"SUB", b"ID", b"s", b"", b"t.>"]),
        batch.put_record(b"t.a", b"x"),
        batch.call_record(b"svc", b"r1", 100, b"q"),
        batch.reply_record(False, b"1", b"p"),
        batch.reply_record(True, b"1", b"f"),
        batch.record_of([b"PING", b"ID", b"p"]),
        batch.record_of([b"NOOP"]),
    ]
    tick = step(4, 0x10, [])
    out = [connect + worker + step(BATCHED, 0, records) + step(BATCHED, 1, records[3:5]) + tick]
    for code in (batch.PUT, batch.CALL, batch.PARTIAL, batch.FINAL, batch.FRAMES):
        for body in (b"", b"x", b"\x01\x00\x01\x00\x05"):
            short = struct.pack("<IB", 1 + len(body), code) + body
            out.append(connect + step(BATCHED, 0, [short, records[5]]) + tick)
    noops = [batch.record_of([b"NOOP"])] * 20
    out.append(connect + step(BATCHED, 0, [*noops, records[5]]) + step(0, 0, [b"PING", b"ID", b"behind"]) + tick)
    out.append(connect + step(BATCHED, 0, noops) + step(6, 0x13, []) + step(0, 0, [b"DISCONNECT"]) + tick)
    refused = [batch.record_of([b"PUT", b"TOPIC", b"bad..t", b"ID", b"r%d" % i, b"", b"x"]) for i in range(20)]
    out.append(connect + step(BATCHED, 0, refused) + step(6, 0x1F, []) + tick)
    return out


def regressions() -> dict[str, bytes]:
    """Inputs that crashed the broker (issue 18): kept as regression-* seeds."""
    connect_batched = [b"CONNECT", b"VERSION", b"1.0", b"TTL", b"1000", b"BATCH", b"1", b"ID", b"c"]
    tick = step(4, 0x10, [])
    return {
        # A 401 made the routing id's queue unbatched; CONNECT BATCH 1, then a record for it.
        "regression-401-then-batched": step(0, 0, [b"NOOP"])
        + step(0, 0, connect_batched)
        + step(0, 0, [b"REQUEST", b"SERVICE", b"mc0.broker", b"ID", b"r", b"", b"stats"])
        + tick,
        # A letter kept for bob; bob's NOOP and CONNECT BATCH 1 in one loop turn.
        "regression-letter-then-batched": step(0, 1, [b"CONNECT", b"VERSION", b"1.0", b"TTL", b"1000"])
        + step(0, 1, [b"PUT", b"TOPIC", b"cmd.x", b"TO", b"bob", b"ID", b"m", b"", b"hi"])
        + step(0, 2, [b"NOOP"])
        + step(0, 2, connect_batched)
        + tick,
    }


def main() -> None:
    corpus = HERE / "corpus"
    corpus.mkdir(exist_ok=True)
    for old in corpus.iterdir():
        if not old.name.startswith("regression-"):  # inputs that once crashed stay
            old.unlink()
    for seed in seeds():
        (corpus / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    for name, seed in regressions().items():
        (corpus / name).write_bytes(seed)


if __name__ == "__main__":
    main()
