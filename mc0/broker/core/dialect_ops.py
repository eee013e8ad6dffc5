"""The broker core as the foreign dialects see it: the operations of ``dialects.base.CoreOps``.

Contract: :class:`DialectOps` wraps the rooms (:class:`~mc0.broker.core.rooms.Rooms`)
and offers exactly what MDP, seed 000, eMQP, DCP and MemoDB may ask of it
(open a peer, forget it, call a service, serve services, reply to a job,
hand a job on, publish what finished), in their terms: a foreign client's
request gets a broker-made request id and the default timeout unless it
brings its own.  Everything else of the core stays out of their reach.  Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ...protocol import Verb
from ...settings import CoreSettings
from . import verbs
from .builtin_services import RESERVED_SERVICES
from .peers import Out, Peer
from .rooms import Rooms


class DialectOps:
    def __init__(self, rooms: Rooms) -> None:
        self._rooms = rooms
        self.settings: CoreSettings = rooms.settings
        self.counters: Counter[str] = rooms.counters

    @property
    def generated_ids_only(self) -> bool:
        return self._rooms.generated_ids_only

    def open_peer(self, peer: Peer, now: float) -> list[Out]:
        return self._rooms.open_peer(peer, now)

    def forget(self, peer: Peer, why: str, now: float) -> list[Out]:
        return self._rooms.forget(peer, why, now)

    def published(self, out: list[Out], now: float) -> list[Out]:
        """``out`` plus the telemetry of what just finished."""
        return self._rooms.with_finished(out, now)

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
    ) -> list[Out]:
        """A request from a foreign client (a broker-made request id unless it brings its own;
        the broker's default timeout unless it asks for one; ``user``: its X- headers;
        ``quiet``: it wants no answer)."""
        rooms = self._rooms
        name = rooms.rpc.pool.service_name(name, rid)
        rid = rid if rid is not None else f"{client.dialect.name}{rooms.rpc.next_id()}"
        timeout_ms = timeout_ms or self.settings.request_timeout_ms
        return verbs.request_for(rooms, client, name, rid, timeout_ms, False, user or {}, body, now, quiet=quiet)

    def serve(self, worker: Peer, names: Sequence[str], capacity: int, now: float) -> list[Out]:
        pool = self._rooms.rpc.pool
        checked = [pool.service_name(n, None) for n in names]
        for name in checked:
            pool.check_serve(worker, name, None, RESERVED_SERVICES)
        return self._rooms.rpc.ready(worker, tuple(dict.fromkeys(checked)), capacity, now)

    def worker_reply(self, worker: Peer, verb: Verb, bid: str, body: Sequence[bytes], now: float) -> list[Out]:
        return self._rooms.rpc.reply(worker, verb, bid, {}, body, now)

    def worker_load(self, worker: Peer) -> tuple[tuple[str, ...], int, int]:
        """What ``worker`` serves, its capacity and the requests it holds (dialects with credit adjust it)."""
        state = self._rooms.rpc.worker_state(worker)
        return (state.services, state.capacity, len(state.jobs)) if state is not None else ((), 0, 0)

    def hand_off(
        self, worker: Peer, bid: str, name: str, user: dict[str, str], body: Sequence[bytes], now: float
    ) -> list[Out] | None:
        """DCP: ``worker`` passes the request it holds as ``bid`` on to service ``name`` (None: it holds none)."""
        rpc = self._rooms.rpc
        return rpc.hand_off(worker, bid, rpc.pool.service_name(name, None), user, body, now)
