"""StoreCalls: what the core asks of the replicated store (JetStream), and what each answer then does.

Contract: a room asks ``call(request, then)``: ``request`` is a JSON-able dict
naming its ``op`` (see :mod:`.storeops` for the ops), queued
until the shell ``drain``s it to the cluster link, once per loop turn.  The
link answers every call exactly once, a failure too (``{"error": {"code": c,
"description": d}}``: the store refused, or it did not answer in time), and
the shell hands the answer to ``answer(token, data, records, now)``, which
runs ``then(data, records, now)`` and returns what it sends.  ``records`` are
the records an answer carries (a pull, a mailbox read), already decoded by the
shell.  ``abandon`` forgets calls whose asker went (their answers are then
dropped, counted).  A call made for a client (``owner``: its routing id) counts
in ``in_flight(owner)`` until the link answers it (a cancelled request's call
too: it still runs on the link) or the client goes (``abandon``), and in
``in_flight_total`` until the link answers it, whoever went, so a room can
bound what one client, and all clients together, have the store do at once.
Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ...message import Record
from ..core.peers import Out

Then = Callable[[dict[str, Any], Sequence[Record], float], list[Out]]


def failure(data: dict[str, Any]) -> tuple[int, str] | None:
    """(code, description) of an answer that says the call failed, None when it did not."""
    error = data.get("error")
    if not isinstance(error, dict):
        return None
    return int(error.get("code") or 503), str(error.get("description") or "the store failed")


class StoreCalls:
    def __init__(self, counters: Counter[str]) -> None:
        self.counters = counters
        self._next = 0
        self._queued: list[tuple[int, dict[str, Any]]] = []
        self._waiting: dict[int, Then] = {}
        self._owner_of: dict[int, bytes] = {}  # token -> the client it was made for
        self._in_flight: Counter[bytes] = Counter()  # client -> its calls not answered yet
        # Calls made for clients that went (or that were abandoned): they still run on the link, so
        # they count in the total until answered, though no longer against a client.
        self._orphaned: set[int] = set()
        self.in_flight_total = 0  # every client's calls the link has not answered, its orphans' too

    def call(self, request: dict[str, Any], then: Then, owner: bytes | None = None) -> int:
        """Queue ``request``; ``owner``: the routing id of the client it is made for (counted)."""
        self._next += 1
        self._queued.append((self._next, request))
        self._waiting[self._next] = then
        if owner is not None:
            self._owner_of[self._next] = owner
            self._in_flight[owner] += 1
            self.in_flight_total += 1
        self.counters["store_calls"] += 1
        return self._next

    def in_flight(self, owner: bytes) -> int:
        """The calls made for client ``owner`` the link has not answered yet."""
        return self._in_flight.get(owner, 0)

    def _unown(self, token: int) -> bool:
        """The call no longer counts against its client (True: it had one)."""
        owner = self._owner_of.pop(token, None)
        if owner is None:
            return False
        left = self._in_flight[owner] - 1
        if left > 0:
            self._in_flight[owner] = left
        else:
            del self._in_flight[owner]
        return True

    def _release(self, token: int) -> None:
        """The link answered: the call counts nowhere any more."""
        if self._unown(token) or token in self._orphaned:
            self._orphaned.discard(token)
            self.in_flight_total -= 1

    @property
    def queued(self) -> bool:
        return bool(self._queued)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def drain(self) -> list[tuple[int, dict[str, Any]]]:
        """The calls to send to the store now, in order."""
        queued, self._queued = self._queued, []
        return queued

    def answer(self, token: int, data: dict[str, Any], records: Sequence[Record], now: float) -> list[Out]:
        self._release(token)
        then = self._waiting.pop(token, None)
        if then is None:
            self.counters["store_answers_dropped"] += 1
            return []
        return then(data, records, now)

    def forget(self, owner: bytes) -> None:
        """Client ``owner`` went: its calls no longer count against it, only in the total until the link
        answers them (they still run; their answers come to nobody)."""
        if self._in_flight.pop(owner, None) is not None:
            for token in [t for t, o in self._owner_of.items() if o == owner]:
                del self._owner_of[token]
                self._orphaned.add(token)  # (still running: counted in the total until answered)

    def abandon(self, tokens: Sequence[int]) -> None:
        """Nobody wants these calls' answers any more; they still run, so they stay in the total."""
        for token in tokens:
            if self._unown(token):
                self._orphaned.add(token)
            if self._waiting.pop(token, None) is not None:
                self.counters["store_calls_abandoned"] += 1
