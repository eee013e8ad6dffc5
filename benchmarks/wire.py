"""mc0 frames on bare pyzmq sockets: what every raw-frame load generator shares.

Contract: the verbs and headers as bytes (spelled by ``mc0.protocol``), a
DEALER socket set up for load (``dealer``), CONNECT on it (``mc0_connect``,
plain or batched) and ``PACE``.  ``frames`` (the broker-alone suite) and
``frames_batched`` (its batched-wire row) both import it; neither imports the
other's load generators back (``frames`` -> ``frames_batched`` -> ``wire``).
"""

from __future__ import annotations

from typing import Any

import zmq

from mc0.protocol import Header, Verb, batch

# mc0 frames, spelled by protocol.py: the load generators and the raw baseline
# speak them over bare sockets, so that only the broker differs between rows.
CONNECT, OK, PUT, SUB, MESSAGE, NOOP, READY, REQUEST, FINAL = (
    verb.value.encode()
    for verb in (
        Verb.CONNECT,
        Verb.OK,
        Verb.PUT,
        Verb.SUB,
        Verb.MESSAGE,
        Verb.NOOP,
        Verb.READY,
        Verb.REQUEST,
        Verb.FINAL,
    )
)
ID, VERSION, TTL, TOPIC, CAPACITY, SERVICE, TIMEOUT, ALL = (
    header.value.encode()
    for header in (
        Header.ID,
        Header.VERSION,
        Header.TTL,
        Header.TOPIC,
        Header.CAPACITY,
        Header.SERVICE,
        Header.TIMEOUT,
        Header.ALL,
    )
)


def dealer(context: zmq.Context[Any], endpoint: str, curve: dict[str, Any] | None) -> zmq.Socket[Any]:
    sock: zmq.Socket[Any] = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.setsockopt(zmq.RCVHWM, 0)
    if curve:
        sock.curve_serverkey = curve["server"]
        sock.curve_publickey = curve["public"]
        sock.curve_secretkey = curve["secret"]
    sock.connect(endpoint)
    return sock


def mc0_connect(sock: zmq.Socket[Any], *, batched: bool = False) -> None:
    extra = [Header.BATCH.value.encode(), b"1"] if batched else []
    sock.send_multipart([CONNECT, VERSION, b"1.0", TTL, b"60000", *extra, ID, b"c"])
    if not sock.poll(10_000):
        raise RuntimeError("no answer to CONNECT")
    reply = sock.recv_multipart()
    if batched and reply[0] == batch.BATCH:  # the OK may already come as a batch record
        ((code, start, end), *_) = batch.records(reply[2])
        reply = batch.frames_of(reply[2], code, start, end)
    if reply[0] != OK:
        raise RuntimeError(f"CONNECT refused: {reply}")


PACE = 500  # a confirmed PUT every PACE messages: the broker, not the publisher, sets the pace
