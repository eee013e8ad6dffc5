"""The end-to-end demo behind ``mc0 demo`` and the README's first command.

Contract: starts a real broker process on a free loopback port, then a
subscriber, a publisher, a worker and a client (library objects), shows
wildcard delivery with the broker-stamped SENDER, a confirmed publish, an RPC
call, a streamed reply, the broker's own stats service, a ping and a rejected
bad input, and stops the broker with SIGTERM.  Prints each step; raises
:class:`mc0.Error` (exit 1 from the CLI) if anything does not happen as shown.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from .client import Client, Worker
from .errors import Error, Forbidden, NoResponders
from .message import Request
from .process import BrokerProcess


def _greet(request: Request) -> bytes:
    return f"hello {request.body.decode()}, you are {request.caller}".encode()


def _count(request: Request) -> Iterator[bytes]:
    for i in range(1, int(request.body or b"3") + 1):
        yield f"step {i}".encode()
    return b"counted"  # type: ignore[return-value]


def run_demo(say: Callable[[str], None]) -> None:
    say("1. starting a broker process on a free loopback port ...")
    with BrokerProcess() as broker:
        endpoint = broker.endpoint
        say(f"   broker listening on {endpoint}")
        with Client(endpoint) as subscriber, Client(endpoint) as publisher:
            say("2. subscriber: SUB 'demo.orders.>' and 'demo.*.audit'")
            subscription = subscriber.subscribe("demo.orders.>", "demo.*.audit")
            say("3. publisher: PUT three messages (the last one confirmed by the broker)")
            publisher.publish("demo.orders.created", b'{"order": 1}', headers={"X-Trace": "t-1"})
            publisher.publish("demo.billing.audit", b"invoice 42 checked")
            publisher.publish("demo.orders.audit", b"matches both patterns, arrives once", confirm=True)
            publisher.publish("demo.other", b"nobody listens here")
            for topic in ["demo.orders.created", "demo.billing.audit", "demo.orders.audit"]:
                message = subscription.next(timeout=5)
                body = message.body.decode()
                say(f"   subscriber got {message.topic} from {message.sender}: {body} {message.headers}")
                if message.topic != topic:
                    raise Error(f"demo: expected {topic}, got {message.topic}")

            say("4. worker: READY for services 'demo.greet' and 'demo.count'")
            worker = Worker(endpoint, capacity=2)
            worker.service("demo.greet")(_greet)
            worker.service("demo.count")(_count)
            with worker:
                say("5. client: REQUEST demo.greet (RPC through the broker)")
                reply = publisher.request("demo.greet", b"demo user", timeout=5)
                say(f"   FINAL: {reply.body.decode()}")
                say("6. client: REQUEST demo.count, a streamed reply (PARTIALs then FINAL)")
                for part in publisher.stream("demo.count", b"3", timeout=5):
                    kind = "FINAL  " if part.final else "PARTIAL"
                    say(f"   {kind} {part.body.decode()}")
                say("7. the broker's own service mc0.broker answers 'services'")
                services = json.loads(publisher.request("mc0.broker", b"services", timeout=5).body)
                for name, row in services.items():
                    say(f"   {name}: {row['workers']} worker(s), served {row['served']}")
            say("8. with the worker gone, a request gets 503 at once")
            try:
                publisher.request("demo.greet", b"anyone?", timeout=5)
                raise Error("demo: a request without workers was answered")
            except NoResponders as exc:
                say(f"   broker answered ERROR {exc.code}: {exc.reason}")
            say(f"9. ping: {publisher.ping() * 1000:.2f} ms round trip")
            say("10. bad input gets a clear answer: PUT to the broker's own topic space")
            try:
                publisher.publish("mc0.sys.fake", b"x", confirm=True)
                raise Error("demo: the broker accepted a PUT to mc0.sys.*")
            except Forbidden as exc:
                say(f"   broker answered ERROR {exc.code}: {exc.reason}")
        say("11. stopping the broker with SIGTERM")
        status = broker.stop()
        if status != 0:
            raise Error(f"demo: broker exited with status {status}")
        say("   broker exited 0")
