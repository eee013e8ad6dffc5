"""Route traffic out: the cluster link thread's side of what the broker loop hands it for the other brokers.

Contract (runs on the link thread's asyncio loop): ``RouteSender.send(target,
blob)`` publishes one blob the loop handed over (``ClusterLink.send``) to
broker ``target``'s inbox, in order, in as many NATS messages as the
server's ``max_payload`` asks (:func:`mc0.protocol.routes.route_messages`:
split at record boundaries, a record too big for one message chunked).

Memory: it never lets more than ``PENDING_BYTES`` wait in nats-py's buffer.
While the connection is up and that much waits (a slow or frozen server),
it waits for the buffer to drain, so what a stalled server holds back stays
within the link's own budget (the loop hands over at most
``SEND_BUDGET_BYTES`` not yet sent, ``ClusterLink.backlog``, and keeps the
rest in the route's queue, bounded by that queue's budget).  While NATS is
reconnecting, nats-py keeps what fits in that much and sends it once back.

A blob that cannot be sent whole (a publish that fails, no room while
reconnecting, a record too big to chunk) is counted (``route_send_failed``)
and its route resynced (``RouteResync``: the loop opens it afresh), never
only counted.  ``finished(size)`` is told of every blob done with, sent or
not (the loop's backlog is what it handed over minus that).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ...protocol import routes as wire

log = logging.getLogger("mc0.broker")

SEND_BUDGET_BYTES = 16 * 1024 * 1024  # handed over by the loop and not yet published (or failed)
PENDING_BYTES = 8 * 1024 * 1024  # waiting in nats-py's buffer for the server, at most (one message beyond)
DRAIN_POLL_FIRST_S = 0.001  # while the buffer is full: looked at again after this, then ever less often
DRAIN_POLL_MAX_S = 0.05


class NoRoom(Exception):
    """NATS is reconnecting and nats-py's buffer holds all it may: the message cannot be kept."""


class RouteSender:
    def __init__(
        self,
        nc: Any,
        name: str,
        epoch: int,
        counters: dict[str, int],
        *,
        resync: Callable[[str], None],
        finished: Callable[[int], None],
        stopping: asyncio.Event,
        pending_bytes: int = PENDING_BYTES,
    ) -> None:
        self.nc = nc
        self.name = name
        self.epoch = epoch
        self.counters = counters
        self.resync = resync
        self.finished = finished
        self.stopping = stopping
        self.pending_bytes = pending_bytes

    async def send(self, target: str, blob: bytes) -> None:
        """Publish ``blob`` (records) to broker ``target``; counted and resynced if it cannot be."""
        nc = self.nc
        try:
            if not nc.is_connected and not nc.is_reconnecting:
                return  # never connected yet: no route exists, nothing to deliver
            subject = wire.inbox(target)
            for message in wire.route_messages(self.name, self.epoch, blob, nc.max_payload):
                await self._room(len(message))
                await nc.publish(subject, message)
                self.counters["route_messages_out"] += 1
                if wire.is_chunk(message):
                    self.counters["route_chunks"] += 1
        except Exception as exc:  # lost on the way: counted, and the route opened afresh
            self.counters["route_send_failed"] += 1
            log.debug("cluster: a route message to %s was not sent: %r", target, exc)
            self.resync(target)
        finally:
            self.finished(len(blob))

    async def _room(self, size: int) -> None:
        """Wait while nats-py's buffer is full and the connection up (NoRoom while it is down)."""
        nc = self.nc
        wait = DRAIN_POLL_FIRST_S
        waited = False
        while nc.pending_data_size and nc.pending_data_size + size > self.pending_bytes:
            if not nc.is_connected:
                raise NoRoom(f"NATS is reconnecting and {nc.pending_data_size} bytes wait for it already")
            if self.stopping.is_set():
                return
            if not waited:
                self.counters["route_send_waits"] += 1
                waited = True
            await asyncio.sleep(wait)
            wait = min(DRAIN_POLL_MAX_S, wait * 2)
