"""The end-to-end demo behind ``mc0 demo`` and the README's first command.

Contract: starts a real broker process on a free loopback port, then a
subscriber and a publisher (library clients), shows wildcard delivery with
the broker-stamped SENDER, a confirmed publish, a ping and a rejected bad
input, and stops the broker with SIGTERM.  Prints each step; raises
:class:`mc0.Error` (exit 1 from the CLI) if anything does not happen as shown.
"""

from __future__ import annotations

from collections.abc import Callable

from .client import Client
from .errors import Error, Forbidden
from .process import BrokerProcess


def run_demo(say: Callable[[str], None]) -> None:
    say("1. starting a broker process on a free loopback port ...")
    with BrokerProcess() as broker:
        say(f"   broker listening on {broker.endpoint}")
        with Client(broker.endpoint) as subscriber, Client(broker.endpoint) as publisher:
            say("2. subscriber: SUB 'demo.orders.>' and 'demo.*.audit'")
            subscription = subscriber.subscribe("demo.orders.>", "demo.*.audit")
            say("3. publisher: PUT three messages (the last one confirmed by the broker)")
            publisher.publish("demo.orders.created", b'{"order": 1}', headers={"X-Trace": "t-1"})
            publisher.publish("demo.billing.audit", b"invoice 42 checked")
            publisher.publish("demo.orders.audit", b"matches both patterns, arrives once", confirm=True)
            publisher.publish("demo.other", b"nobody listens here")
            expected = ["demo.orders.created", "demo.billing.audit", "demo.orders.audit"]
            for topic in expected:
                message = subscription.next(timeout=5)
                body = message.body.decode()
                say(f"   subscriber got {message.topic} from {message.sender}: {body} {message.headers}")
                if message.topic != topic:
                    raise Error(f"demo: expected {topic}, got {message.topic}")
            say(f"4. ping: {publisher.ping() * 1000:.2f} ms round trip")
            say("5. bad input gets a clear answer: PUT to the broker's own topic space")
            try:
                publisher.publish("mc0.sys.fake", b"x", confirm=True)
                raise Error("demo: the broker accepted a PUT to mc0.sys.*")
            except Forbidden as exc:
                say(f"   broker answered ERROR {exc.code}: {exc.reason}")
        say("6. stopping the broker with SIGTERM")
        status = broker.stop()
        if status != 0:
            raise Error(f"demo: broker exited with status {status}")
        say("   broker exited 0")
