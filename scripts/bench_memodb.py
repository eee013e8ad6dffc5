"""A short MemoDB round-trip measurement on a real broker process (seed 003 peers: raw pynng + cbor2).

    .venv/bin/python scripts/bench_memodb.py [CALLS]     (default 2000; a few seconds)

Sequential calls, one at a time, with a 100-byte body: a MemoDB client to a MemoDB
worker and to an mc0 worker, an mc0 client to a MemoDB worker, and mc0 to mc0 as the
baseline on the same broker.  Loopback only; every wait is bounded.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import cbor2
import pynng

import mc0
from mc0 import ports
from mc0.process import BrokerProcess

READY, JOB, RESULT, HEARTBEAT = 1, 2, 3, 4
BODY = b"x" * 100


def msg(kind: int, wid: bytes, *fields: object, payload: bytes = b"") -> bytes:
    return cbor2.dumps(["memo01", kind, wid, *fields], canonical=True) + payload


def split(data: bytes) -> tuple[list[Any], bytes]:
    head = cbor2.loads(data)
    return head, data[len(cbor2.dumps(head, canonical=True)) :]


def memo_worker(address: str, stop: threading.Event) -> None:
    """Echo worker from the seed text; ends when ``stop`` is set (checked at each HEARTBEAT, every
    0.5 s: its NNG receive timeout must exceed the heartbeat, as NNG abandons a timed-out request)."""
    sock = pynng.Req0(recv_timeout=5000)
    sock.dial(address, block=False)
    ctx = sock.new_context()
    try:
        ctx.send(msg(READY, b"", ["memo-echo"]))
        while not stop.is_set():
            head, payload = split(ctx.recv())
            if head[1] == JOB:
                ctx.send(msg(RESULT, head[2], payload=payload))
            elif head[1] == HEARTBEAT:
                ctx.send(msg(HEARTBEAT, head[2]))
            else:
                ctx.send(msg(READY, b"", ["memo-echo"]))
    finally:
        ctx.close()
        sock.close()


def rate(label: str, calls: int, call: Any) -> None:
    for _ in range(min(50, calls)):  # warm-up
        call()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    took = time.perf_counter() - started
    print(f"{label:34s} {calls / took:7.0f} calls/s  {took / calls * 1e6:6.0f} us/call")


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    port = ports.free_port()
    folder = Path(tempfile.mkdtemp())
    config = folder / "mc0.toml"
    config.write_text(
        f'[memodb]\nenabled = true\nlisten = "tcp://127.0.0.1:{port}"\nheartbeat_ms = 500\n'
        "[permissions.identity.memodb]\n"
    )
    address = f"tcp://127.0.0.1:{port}"
    stop = threading.Event()
    with BrokerProcess(config=str(config), insecure=True, cwd=str(folder)) as broker:
        worker_thread = threading.Thread(target=memo_worker, args=(address, stop), daemon=True)
        worker_thread.start()
        worker = mc0.Worker(broker.endpoint)
        worker.service("mc0-echo")(lambda request: request.body)
        client_sock = pynng.Req0(recv_timeout=10_000)
        client_sock.dial(address, block=False)
        ctx = client_sock.new_context()
        try:
            with worker, mc0.Client(broker.endpoint) as client:
                deadline = time.monotonic() + 10
                while client.request("mmi.service", b"memo-echo", timeout=2).body != b"200":
                    assert time.monotonic() < deadline, "the MemoDB worker never registered"
                    time.sleep(0.05)

                def memo_call(service: str) -> None:
                    ctx.send(msg(JOB, b"", service, 5000, payload=BODY))
                    assert split(ctx.recv())[1] == BODY

                rate("memodb client -> memodb worker", calls, lambda: memo_call("memo-echo"))
                rate("memodb client -> mc0 worker", calls, lambda: memo_call("mc0-echo"))
                rate("mc0 client -> memodb worker", calls, lambda: client.request("memo-echo", BODY, timeout=5))
                rate("mc0 client -> mc0 worker (baseline)", calls, lambda: client.request("mc0-echo", BODY, timeout=5))
        finally:
            stop.set()
            worker_thread.join(5)
            ctx.close()
            client_sock.close()


if __name__ == "__main__":
    main()
