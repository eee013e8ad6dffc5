"""The admin desk: mc0.admin's actions waiting for other brokers' parts, and the answers owed to HTTP requests.

Contract: an action (:class:`Gather`) asked by someone (:class:`Asker`: a bus client, answered in its
dialect, or an HTTP request, answered through ``AdminDesk.http_answers``) collects its parts by
broker: this broker's, JetStream's, and each other broker's it was carried to (``carried``: part id
-> its action); ``expire`` counts a part not answered by the action's deadline as 504, and
``finish`` answers the action from its parts (``summary``).  What each action does is
:mod:`.admin`'s; this room keeps the actions in flight (kept by ``Builtins``, swept by the core's
tick).  Pure: no sockets, no clock.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from ...protocol import Status
from ...protocol import admin as A
from .peers import Out, Peer

BID_PREFIX = "admin."  # the ids of the parts this broker carries (the rpc room's are digits)
Part = dict[str, Any]  # one broker's part of an action: {"status": code, ...} ("error": why, when not 200)


class Asker:
    """Who asked for an action, and where its answer goes: a bus client (answered in its dialect) or
    an HTTP request (``ticket``: answered through ``AdminDesk.http_answers``)."""

    __slots__ = ("who", "client", "rid", "user", "ticket")

    def __init__(
        self, who: str, client: Peer | None = None, rid: str = "", user: dict[str, str] | None = None, ticket: int = 0
    ) -> None:
        self.who = who
        self.client = client
        self.rid = rid
        self.user = user or {}
        self.ticket = ticket


class Gather:
    """One action's parts: this broker's, JetStream's, and those of the brokers it was carried to."""

    __slots__ = ("asker", "op", "args", "parts", "waiting", "deadline")

    def __init__(self, asker: Asker, op: str, args: dict[str, str], deadline: float) -> None:
        self.asker = asker
        self.op = op
        self.args = args
        self.parts: dict[str, Part] = {}  # broker name (or "jetstream") -> its part
        self.waiting: dict[str, str] = {}  # part id -> the broker it was carried to
        self.deadline = deadline


class AdminDesk:
    """The actions waiting for other brokers' parts, and the answers owed to HTTP requests."""

    def __init__(self, counters: Counter[str], *, is_current: Callable[[Peer], bool]) -> None:
        self.counters = counters
        self._is_current = is_current
        self.carried: dict[str, Gather] = {}  # part id -> its action
        self.http_answers: list[tuple[int, int, dict[str, Any]]] = []  # (ticket, status, body), for the shell
        self._serial = 0

    def new_id(self) -> str:
        self._serial += 1
        return f"{BID_PREFIX}{self._serial}"

    @property
    def gathering(self) -> int:
        return len({id(g) for g in self.carried.values()})

    def take_http_answers(self) -> list[tuple[int, int, dict[str, Any]]]:
        taken, self.http_answers = self.http_answers, []
        return taken

    def answer(self, asker: Asker, status: int, data: dict[str, Any]) -> list[Out]:
        """The action's answer to whoever asked (``data["error"]`` is the reason of a status not 200)."""
        if asker.client is None:
            self.http_answers.append((asker.ticket, status, data))
            return []
        client = asker.client
        if not self._is_current(client):
            self.counters["admin_answers_dropped"] += 1  # it went (it may have closed itself)
            return []
        frames: list[bytes] | bytes
        if status != 200:
            frames = client.dialect.error(asker.rid, A.ADMIN_SERVICE, status, str(data.get("error", "")))
        else:
            body = json.dumps(data, sort_keys=True).encode()
            frames = client.dialect.final(asker.rid, A.ADMIN_SERVICE, {}, asker.user, [body])
        return [(client.routing_id, frames)]

    def expire(self, now: float) -> list[Out]:
        """Actions whose deadline passed: the parts not answered count as 504, and each is answered."""
        out: list[Out] = []
        for gather in {id(g): g for g in self.carried.values() if g.deadline <= now}.values():
            for part_id, broker in list(gather.waiting.items()):
                self.carried.pop(part_id, None)
                gather.parts[broker] = {"status": Status.DEADLINE, "error": f"broker {broker} did not answer in time"}
            gather.waiting.clear()
            out += self.finish(gather)
        return out

    def finish(self, gather: Gather) -> list[Out]:
        status, data = summary(gather.op, gather.args, gather.parts)
        return self.answer(gather.asker, status, data)


def summary(op: str, args: dict[str, str], parts: dict[str, Part]) -> tuple[int, dict[str, Any]]:
    """The action's answer from its parts: 200 when it was done (by JetStream, for a journal it
    keeps; else by any broker), each part named; else the first failure's status (404 when no broker
    had the thing) with every part's reason."""
    if op == A.CONSUMER_LS:
        rows = [row for part in parts.values() for row in part.get("consumers", ())]
        brokers = {name: {k: v for k, v in p.items() if k != "consumers"} for name, p in parts.items()}
        return 200, {"consumers": rows, "brokers": brokers}
    if op == A.CONN_CLOSE:
        ((broker, part),) = parts.items()
        if part.get("status") != 200:
            return int(part.get("status", 500)), {"error": str(part.get("error", "failed"))}
        return 200, {"closed": part["closed"], "broker": broker}
    store = parts.get("jetstream")
    deciding = [store] if store is not None else list(parts.values())
    if not any(p.get("status") == 200 for p in deciding):
        failed = {name: p for name, p in parts.items() if p.get("status") != 200}
        status = next((int(p["status"]) for p in failed.values() if p["status"] != Status.NOT_FOUND), 404)
        reasons = "; ".join(f"{name or 'here'}: {p.get('error', 'failed')}" for name, p in failed.items())
        return status, {"error": reasons or "nothing done"}
    data: dict[str, Any] = {"journal": args["journal"], "brokers": {n: p for n, p in parts.items() if n != "jetstream"}}
    if store is not None:
        data["jetstream"] = store
    if op == A.CONSUMER_RM:
        data.update(name=args["name"], removed=True)
    else:
        done = [p for p in deciding if p.get("status") == 200]
        data["purged"] = sum(int(p.get("purged", 0)) for p in done)
    return 200, data
