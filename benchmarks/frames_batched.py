"""The broker alone, on the batched wire: raw-socket load generators that speak ``BATCH 1``.

Contract: the ``mc0-batched`` system of the broker-alone suite.  Like the
other raw-frame generators (``frames.py``; the frames both speak are ``wire.py``) these are minimal pyzmq loops, so
the row measures the broker, not a client library; they negotiate batched
framing at CONNECT and put many commands in one ZeroMQ message, as the mc0
libraries do under load: publishers send ``PUBLISH_BATCH`` PUT records per
message (paced by a confirmed PUT every ``PACE`` messages, as the other
rows), RPC clients send each window's CALL records together and workers
answer each batch of WORK records with one batch of FINAL records.  Counts
are per command (records), not per ZeroMQ message.  Every loop is bounded in
count and time.
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from mc0.protocol import batch

from .wire import ID, OK, PACE, PUT, READY, SUB, TOPIC, dealer, mc0_connect

PUBLISH_BATCH = 100  # PUT records per message from a publisher
TOPIC_B = b"bench"
BATCH_MARK = [batch.BATCH, b""]


def _connect(sock: zmq.Socket[Any]) -> None:
    mc0_connect(sock, batched=True)


def _spans(frames: list[bytes], code: int) -> list[tuple[int, int]]:
    """The (start, end) of each record of ``code`` in a BATCH message (or the message itself)."""
    if frames[0] != batch.BATCH:
        return []
    blob = frames[2]
    return [(start, end) for c, start, end in batch.records(blob) if c == code]


def _has_ok(frames: list[bytes]) -> bool:
    """An OK, alone or in a batch (as an OK record or a FRAMES record)."""
    if frames[0] != batch.BATCH:
        return frames[0] == OK
    blob = frames[2]
    for code, start, end in batch.records(blob):
        if code == batch.OK or (code == batch.FRAMES and batch.frames_of(blob, code, start, end)[0] == OK):
            return True
    return False


def subscribers(endpoint: str, n: int, curve: Any, ready: Any, results: Any, seconds: float) -> None:
    """n batched subscriber sockets in one process; reports (deliveries, seconds from first to last)."""
    context: zmq.Context[Any] = zmq.Context()
    sockets = []
    for _ in range(n):
        sock = dealer(context, endpoint, curve)
        _connect(sock)
        sock.send_multipart([SUB, ID, b"s", b"", TOPIC_B])
        sock.poll(10_000) and sock.recv_multipart()
        sockets.append(sock)
    time.sleep(0.3)  # subscriptions propagate
    ready.set()
    poller = zmq.Poller()
    for sock in sockets:
        poller.register(sock, zmq.POLLIN)
    count, first, last = 0, 0.0, 0.0
    idle_until = time.monotonic() + seconds + 10
    while time.monotonic() < idle_until:
        events = poller.poll(500)
        if not events:
            if count:
                break  # the stream ended
            continue
        for sock, _ in events:
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                got = len(_spans(frames, batch.MESSAGE))
                if got:
                    count += got
                    last = time.perf_counter()
                    if count == got:
                        first = last
    results.put((count, max(last - first, 1e-9)))


def publisher(endpoint: str, size: int, seconds: float, curve: Any, go: Any) -> None:
    context: zmq.Context[Any] = zmq.Context()
    sock = dealer(context, endpoint, curve)
    _connect(sock)
    record = batch.put_record(TOPIC_B, b"x" * size)
    per_message = max(1, min(PUBLISH_BATCH, (256 * 1024) // len(record)))
    message = [*BATCH_MARK, record * per_message]
    go.wait(30)
    time.sleep(0.2)
    end = time.monotonic() + seconds
    paced = 0
    while time.monotonic() < end:
        for _ in range(max(1, PACE // per_message)):
            sock.send_multipart(message)
        paced += 1
        sock.send_multipart([PUT, TOPIC, TOPIC_B, ID, str(paced).encode(), b"", b"x" * size])
        while sock.poll(10_000):
            if _has_ok(sock.recv_multipart()):
                break
    time.sleep(0.5)
    sock.close(linger=5000)


def workers(endpoint: str, n: int, curve: Any, ready: Any) -> None:
    """n batched echo workers (one socket each) in one process: a batch of WORK, one batch of FINAL."""
    context: zmq.Context[Any] = zmq.Context()
    sockets = []
    for _ in range(n):
        sock = dealer(context, endpoint, curve)
        _connect(sock)
        sock.send_multipart([READY, ID, b"r", b"CAPACITY", b"1000", b"", TOPIC_B])
        sock.poll(10_000) and sock.recv_multipart()
        sockets.append(sock)
    ready.set()
    poller = zmq.Poller()
    for sock in sockets:
        poller.register(sock, zmq.POLLIN)
    while True:
        for sock, _ in poller.poll():
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if frames[0] != batch.BATCH:
                    continue
                blob = frames[2]
                replies = []
                for start, end in _spans(frames, batch.WORK):
                    _service, bid, _caller, _timeout, data = batch.work_fields(blob, start, end)
                    replies.append(batch.reply_record(True, bid.encode(), data))
                if replies:
                    sock.send_multipart([*BATCH_MARK, b"".join(replies)])


def rpc_client(endpoint: str, window: int, seconds: float, curve: Any, body_size: int, results: Any) -> None:
    context: zmq.Context[Any] = zmq.Context()
    sock = dealer(context, endpoint, curve)
    _connect(sock)
    body = b"x" * body_size
    sent: dict[str, float] = {}
    latencies: list[float] = []
    seq = 0

    def call() -> bytes:
        nonlocal seq
        seq += 1
        rid = str(seq)
        sent[rid] = time.perf_counter()
        return batch.call_record(TOPIC_B, rid.encode(), 30_000, body)

    started = time.perf_counter()
    end = time.monotonic() + seconds
    sock.send_multipart([*BATCH_MARK, b"".join(call() for _ in range(window))])
    while sent:
        if not sock.poll(10_000):
            break
        frames = sock.recv_multipart()
        more = []
        for start, stop in _spans(frames, batch.FINAL):
            rid, _data = batch.reply_fields(frames[2], start, stop)
            latencies.append(time.perf_counter() - sent.pop(rid))
            if time.monotonic() < end:
                more.append(call())
        if more:
            sock.send_multipart([*BATCH_MARK, b"".join(more)])
    results.put((len(latencies), latencies, time.perf_counter() - started))
