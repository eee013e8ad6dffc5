"""Beacons: discovery and liveness of the brokers of a cluster, on ``mc0.cl.hello``.

Contract (runs on the cluster link thread's asyncio loop): ``run()``
publishes this broker's beacon (name, epoch) every ``every_s`` while NATS is
connected (one not sent while reconnecting is no loss: the next one goes)
and calls ``tick`` each time (the link's other periodic work);
``on_hello`` is the beacon subscription's callback: another broker's beacon
is posted to the loop as ``Hello``, a malformed one counted, this broker's
own never (NATS ``no_echo`` too); one under this broker's name and another
epoch is posted too: another broker is named alike, which the loop says
(``routeinput.hello``).  A beacon nats-py drops is only counted
(``beacons_dropped``): the next one says the same.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ...protocol import routes as wire
from . import posts

log = logging.getLogger("mc0.broker")

PENDING_MSGS = 4096  # beacons waiting in nats-py's subscription; one dropped costs nothing


class Beacons:
    def __init__(
        self,
        nc: Any,
        name: str,
        epoch: int,
        every_s: float,
        post: Callable[[Sequence[bytes]], None],
        counters: dict[str, int],
        *,
        stopping: asyncio.Event,
        tick: Callable[[], None],
    ) -> None:
        self.nc = nc
        self.name = name
        self.epoch = epoch
        self.beacon = wire.hello(name, epoch)
        self.every_s = every_s
        self.post = post
        self.counters = counters
        self.stopping = stopping
        self.tick = tick
        self.subscription: Any = None

    async def subscribe(self) -> None:
        subject, limit = wire.HELLO_SUBJECT, PENDING_MSGS
        self.subscription = await self.nc.subscribe(subject, cb=self.on_hello, pending_msgs_limit=limit)

    async def on_hello(self, msg: Any) -> None:
        parsed = wire.parse_hello(msg.data)
        if parsed is None:
            self.counters["malformed"] += 1
            return
        name, epoch = parsed
        if name != self.name or epoch != self.epoch:  # (one under our name and another epoch: a namesake)
            self.post(posts.hello(name, epoch))

    def dropped(self) -> None:
        self.counters["beacons_dropped"] += 1

    async def run(self) -> None:
        while not self.stopping.is_set():
            if self.nc.is_connected:
                try:
                    await self.nc.publish(wire.HELLO_SUBJECT, self.beacon)
                except Exception as exc:  # reconnecting: the next beacon will go
                    log.debug("cluster: beacon not sent: %s", exc)
            self.tick()
            try:
                await asyncio.wait_for(self.stopping.wait(), self.every_s)
            except TimeoutError:
                pass
