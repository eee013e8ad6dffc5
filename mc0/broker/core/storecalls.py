"""StoreCalls: what the core asks of the replicated store (JetStream), and what each answer then does.

Contract: a room asks ``call(request, then)``: ``request`` is a JSON-able dict
naming its ``op`` (see :mod:`mc0.broker.cluster.jetstream` for the ops), queued
until the shell ``drain``s it to the cluster link, once per loop turn.  The
link answers every call exactly once, a failure too (``{"error": {"code": c,
"description": d}}``: the store refused, or it did not answer in time), and
the shell hands the answer to ``answer(token, data, records, now)``, which
runs ``then(data, records, now)`` and returns what it sends.  ``records`` are
the records an answer carries (a pull, a mailbox read), already decoded by the
shell.  ``abandon`` forgets calls whose asker went (their answers are then
dropped, counted).  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ...message import Record
from .peers import Out

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

    def call(self, request: dict[str, Any], then: Then) -> int:
        self._next += 1
        self._queued.append((self._next, request))
        self._waiting[self._next] = then
        self.counters["store_calls"] += 1
        return self._next

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
        then = self._waiting.pop(token, None)
        if then is None:
            self.counters["store_answers_dropped"] += 1
            return []
        return then(data, records, now)

    def abandon(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            if self._waiting.pop(token, None) is not None:
                self.counters["store_calls_abandoned"] += 1
