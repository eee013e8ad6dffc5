"""What every foreign dialect shares: the interface it drives the broker core through.

Contract: :class:`CoreOps` is the narrow set of operations a dialect may ask
of the core (open a peer, forget it, call a service, serve services, reply
to a job, hand a job on, publish what finished); ``BrokerCore`` implements
it.  A dialect's ``handle`` has the signature of :data:`Handler`.  Dialects
import the core's rooms (peers, protocol) and this module, never the
dispatcher itself: the shell hands the dialect router to the core.  Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

from ...protocol import Verb
from ...settings import CoreSettings
from ..core.peers import Out, Peer


class CoreOps(Protocol):
    """What a foreign dialect may ask of the broker core (implemented by BrokerCore)."""

    settings: CoreSettings
    counters: Counter[str]

    @property
    def generated_ids_only(self) -> bool: ...

    def open_peer(self, peer: Peer, now: float) -> list[Out]: ...

    def forget(self, peer: Peer, why: str, now: float) -> list[Out]: ...

    def call(
        self,
        client: Peer,
        name: str,
        body: Sequence[bytes],
        now: float,
        *,
        rid: str | None = None,
        timeout_ms: int | None = None,
        user: dict[str, str] | None = None,
        quiet: bool = False,
    ) -> list[Out]: ...

    def serve(self, worker: Peer, names: Sequence[str], capacity: int, now: float) -> list[Out]: ...

    def worker_reply(self, worker: Peer, verb: Verb, bid: str, body: Sequence[bytes], now: float) -> list[Out]: ...

    def worker_load(self, worker: Peer) -> tuple[tuple[str, ...], int, int]: ...

    def hand_off(
        self, worker: Peer, bid: str, name: str, user: dict[str, str], body: Sequence[bytes], now: float
    ) -> list[Out] | None: ...

    def published(self, out: list[Out], now: float) -> list[Out]: ...


# handle(core, peer or None, routing id, frames, now, identity, connection fd) -> what to send
Handler = Callable[[CoreOps, "Peer | None", bytes, Sequence[bytes], float, str, "int | None"], list[Out]]
