"""What every foreign dialect shares: the interface it drives the broker core through, and its admission.

Contract: :class:`CoreOps` is the narrow set of operations a dialect may ask
of the core (open a peer, forget it, call a service, serve services, reply
to a job, hand a job on, publish what finished); ``BrokerCore`` implements
it (through ``DialectOps``).  A dialect's ``handle`` has the signature of
:data:`Handler`; :class:`Admission` writes the skeleton every ZeroMQ
dialect's ``handle`` shares once (decode or drop, a peer speaking another
dialect dropped, a newcomer admitted, the command acted on, a refusal
answered as the dialect can, the telemetry of what finished), and each
dialect fills in its own steps.  Dialects import the core's rooms (peers,
protocol) and this module, never the dispatcher itself: the shell hands the
dialect router to the core.  Pure.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from ...errors import ProtocolError
from ...protocol import Dialect, Verb
from ...settings import CoreSettings
from ..core.peers import Out, Peer, generated_routing_id

log = logging.getLogger("mc0.broker")
C = TypeVar("C")  # a dialect's decoded command


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


class Admission(Generic[C]):
    """The one ``handle`` of a ZeroMQ dialect; a dialect fills in the steps.

    ``name`` prefixes its counters (``NAME_malformed``, ``_mismatch``,
    ``_chosen_routing_id``, ``_rejected``) and is the protocol version its
    peers are shown with.  Steps: ``decode`` (ProtocolError: dropped, and
    ``malformed`` says what else), ``owns`` (a peer of another dialect on this
    routing id: dropped), ``early`` (answer at once, or None to go on: a
    newcomer that may not start with this command, a known peer's wrong
    move), ``newcomer`` (its dialect object), ``act``, ``refused`` (what the
    dialect answers a ProtocolError with: it may have no error reply).
    """

    name = "foreign"

    def decode(self, frames: Sequence[bytes]) -> C:
        raise NotImplementedError

    def owns(self, dialect: Dialect) -> bool:
        raise NotImplementedError

    def newcomer(self, command: C) -> Dialect:
        raise NotImplementedError

    def act(self, core: CoreOps, peer: Peer, routing_id: bytes, command: C, now: float) -> list[Out]:
        raise NotImplementedError

    def refused(
        self, core: CoreOps, peer: Peer, routing_id: bytes, command: C, exc: ProtocolError, now: float
    ) -> list[Out]:
        return []

    def malformed(self, core: CoreOps, peer: Peer | None, now: float) -> list[Out]:
        return []

    def early(self, core: CoreOps, peer: Peer | None, routing_id: bytes, command: C, now: float) -> list[Out] | None:
        return None

    def handle(
        self,
        core: CoreOps,
        peer: Peer | None,
        routing_id: bytes,
        frames: Sequence[bytes],
        now: float,
        identity: str,
        fd: int | None,
    ) -> list[Out]:
        """One message of this dialect from ``peer`` (None: not known yet) -> what to send."""
        name = self.name
        try:
            command = self.decode(frames)
        except ProtocolError as exc:
            core.counters[f"{name}_malformed"] += 1
            log.debug("a %s peer: %s", name, exc.reason)
            return core.published(self.malformed(core, peer, now), now)
        if peer is not None and not self.owns(peer.dialect):
            core.counters[f"{name}_mismatch"] += 1
            return []
        early = self.early(core, peer, routing_id, command, now)
        if early is not None:
            return core.published(early, now)
        out: list[Out] = []
        if peer is None:
            if core.generated_ids_only and not generated_routing_id(routing_id):
                core.counters[f"{name}_chosen_routing_id"] += 1
                return []
            ttl = core.settings.foreign_ttl_ms / 1000.0
            peer = Peer(routing_id, identity, name, ttl, now, self.newcomer(command), fd)
            out = core.open_peer(peer, now)
        peer.last_recv = now
        try:
            out += self.act(core, peer, routing_id, command, now)
        except ProtocolError as exc:
            core.counters[f"{name}_rejected"] += 1
            out += self.refused(core, peer, routing_id, command, exc, now)
        return core.published(out, now)
