"""Durable consumers: a named, server-side position on a journal, with acks; the front of their backends.

Contract: a journal's durable consumers are kept by one backend, a
:class:`ConsumerBackend`: this broker's own (:class:`~.localconsumers.LocalConsumers`:
on its file journals, saved through the journal port) or JetStream's
(:class:`~mc0.broker.jetstream.storeconsumers.StoreConsumers`, handed in by
``Rooms``: shared cluster-wide).  Which one keeps a journal's consumers is
decided once, when this front is built (each backend asked ``keeps``, this
broker's own last), never again per request.  ``handle`` reads an
``mc0.consumer`` request's JSON object (:mod:`mc0.protocol.consumerrequests`)
and hands it to its journal's backend, the same call on either; ``list``
gathers the caller's consumers at both; a peer's cancel, its going, the dead
letters and the /consumerz rows are asked of every backend that keeps a journal's
consumers.  The turn's work
(timers, waiting pulls, the commit that saves state and releases held
answers) and the operator's actions are this broker's own consumers': JetStream
keeps its consumers' clocks and state itself.  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ...protocol.consumerrequests import consumer_query
from ..storage.port import JournalStore
from .consumerstate import Consumer, DeadLetter
from .localconsumers import JournalShelf, LocalConsumers
from .peers import Out, Peer

# The ops a backend answers (``create`` and the ops on one consumer).  A tuple: ``op in`` compares, never
# hashes (an op sent as a JSON list or object is unhashable).  Any other op (``list`` aside) is this
# broker's own consumers' to refuse, whatever keeps the journal: 404 when it keeps no such consumer.
_BACKEND_OPS = ("create", "info", "pull", "ack", "nak", "term", "delete")


class ConsumerBackend(Protocol):
    """What keeps some journals' durable consumers and answers their ``mc0.consumer`` requests
    (as nats-server's ``ConsumerStore``, which its file and memory stores implement): the same
    calls whichever keeps them.  ``query`` is the request's JSON object, unparsed past its op: a
    backend checks what it must in its own order (this broker's own checks the caller's grants
    between the op and its arguments).  A request it refuses is a ``ProtocolError`` and changes
    nothing; an answer it gives later (a held answer, a store call's) is in the output of a later
    call."""

    def keeps(self, journal: JournalStore) -> bool:
        """It keeps ``journal``'s consumers (asked once per journal, when the front is built)."""
        ...

    def create(self, client: Peer, rid: str, user: dict[str, str], query: dict[str, Any], now: float) -> list[Out]:
        """``create`` on a journal it keeps."""
        ...

    def handle(
        self, client: Peer, rid: str, user: dict[str, str], query: dict[str, Any], deadline: float, now: float
    ) -> list[Out]:
        """Any other op on one consumer of a journal it keeps (a pull's answer due by ``deadline``)."""
        ...

    def list_with(self, client: Peer, rid: str, user: dict[str, str], names: list[str]) -> list[Out]:
        """``list``: ``names`` (the caller's consumers elsewhere) and the caller's own here, sorted."""
        ...

    def cancel(self, peer: Peer, rid: str) -> bool:
        """``peer``'s request ``rid`` under way here is dropped (True: there was one)."""
        ...

    def waiting_for(self, peer: Peer, rid: str) -> bool:
        """``peer``'s request ``rid`` is under way here."""
        ...

    def drop_peer(self, peer: Peer) -> None:
        """``peer`` went: what it waits for here goes."""
        ...

    def take_dead_letters(self) -> list[DeadLetter]:
        """The dead letters found since the last call, oldest first; a new list starts."""
        ...

    def monitor_rows(self) -> list[dict[str, object]]:
        """Its consumers' /consumerz rows."""
        ...


class Consumers:
    def __init__(self, journals: JournalShelf, local: LocalConsumers, *, store: ConsumerBackend | None = None) -> None:
        """``local``: this broker's own consumers (:class:`LocalConsumers`, of ``journals``); ``store``: the
        backend of the journals JetStream keeps (their consumers are JetStream's)."""
        self.local = local
        # Who keeps each journal's consumers: each backend asked in turn, this broker's own last, as it
        # keeps whatever no other does.
        candidates: tuple[ConsumerBackend, ...] = () if store is None else (store,)
        self._backend_of: dict[str, ConsumerBackend] = {
            journal.name: next(b for b in (*candidates, local) if b.keeps(journal))
            for journal in journals.every_journal()
        }
        # The other backends that keep a journal's consumers (a store that keeps none has nothing to
        # cancel, drop or hand over: it is never asked), then every backend in the order each is asked.
        self._others = tuple(b for b in candidates if any(k is b for k in self._backend_of.values()))
        self._backends: tuple[ConsumerBackend, ...] = (*self._others, local)
        # The backend a ``list`` asks last, handing it the caller's consumers here: one that keeps a journal.
        self._store = self._others[0] if self._others else None

    def backend_of(self, journal: str) -> ConsumerBackend:
        """The backend of the consumers of ``journal`` (this broker's own for a journal it does not know)."""
        return self._backend_of.get(journal, self.local)

    # ------------------------------------------------------------ requests
    def handle(
        self, client: Peer, rid: str, user: dict[str, str], body: Sequence[bytes], deadline: float, now: float
    ) -> list[Out]:
        """One ``mc0.consumer`` request: an answer now, a held answer, a waiting pull or a store call."""
        query = consumer_query(body, rid)
        op = query.get("op")
        if op == "list":  # the caller's own
            if self._store is None:
                return self.local.list_with(client, rid, user, [])
            return self._store.list_with(client, rid, user, self.local.owned_by(client.identity))
        backend = self.backend_of(str(query.get("journal", ""))) if op in _BACKEND_OPS else self.local
        if op == "create":
            return backend.create(client, rid, user, query, now)
        return backend.handle(client, rid, user, query, deadline, now)

    def cancel(self, peer: Peer, rid: str) -> bool:
        return any(backend.cancel(peer, rid) for backend in self._backends)

    def waiting_for(self, peer: Peer, rid: str) -> bool:
        return any(backend.waiting_for(peer, rid) for backend in self._backends)

    def drop_peer(self, peer: Peer) -> None:
        """Its waiting pulls and store calls go; what it was delivered stays unacked until ack_wait."""
        for backend in self._backends:
            backend.drop_peer(peer)

    def take_dead_letters(self) -> list[DeadLetter]:
        """The dead letters found since the last call (``(topic, record, reason, deliveries)``), this
        broker's then the other backends'; each starts a new list."""
        if not self._others:  # (once per command and per turn: the common case in one call)
            return self.local.take_dead_letters()
        letters = self.local.take_dead_letters()
        for other in self._others:
            more = other.take_dead_letters()
            if more:
                letters = letters + more if letters else more
        return letters

    def monitor_rows(self) -> list[dict[str, object]]:
        """/consumerz: every consumer, this broker's then JetStream's (as JetStream last said)."""
        return [row for backend in (self.local, *self._others) for row in backend.monitor_rows()]

    # ------------------------------------------------------------ this broker's own: the turn, reports, actions
    @property
    def uncommitted(self) -> bool:
        return self.local.uncommitted

    def commit(self) -> list[Out]:
        """Save what changed; the answers now due (see :meth:`LocalConsumers.commit`)."""
        return self.local.commit()

    def has_work(self) -> bool:
        return self.local.has_work()

    def next_deadline(self, earliest: float) -> float:
        return self.local.next_deadline(earliest)

    def tick(self, now: float) -> list[Out]:
        return self.local.tick(now)

    def withdraw_denied(self) -> list[Out]:
        return self.local.withdraw_denied()

    @property
    def watched(self) -> int:
        return self.local.watched

    @property
    def consumers(self) -> dict[tuple[str, str], Consumer]:
        """This broker's own consumers by ``(journal, name)``."""
        return self.local.consumers

    def info(self, consumer: Consumer) -> dict[str, object]:
        return self.local.info(consumer)

    def report(self) -> dict[str, object]:
        """``mc0.broker consumers``: this broker's own consumers' info."""
        return self.local.report()

    def remove(self, journal: str, name: str, reason: str) -> list[Out] | None:
        return self.local.remove(journal, name, reason)

    def purged(self, journal: str, now: float) -> list[Out]:
        return self.local.purged(journal, now)
