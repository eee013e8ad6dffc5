"""mc0.admin: an operator's actions (close a session, remove a durable consumer, purge a journal), done
where the thing lives.

Contract: ``call(rooms, client, rid, user, body, deadline, now)`` answers one request of a bus client
whose grant ``rpc.admit`` checked (only ``call = ["mc0.admin"]`` by name reaches here);
``http_call(rooms, ticket, op, args, who, now)`` does one action the monitoring listener took (its
token checked there), answered through ``AdminDesk.http_answers``; ``from_route(rooms, route, rid,
who, body, now)`` does the part of an action another broker carried here (this broker's part only,
never carried on: one hop, as every route request) and answers it FINAL with the part's JSON;
``route_answer`` takes the answer to a part this broker carried.  What each op does:

- ``conn.close``: at the broker the id names (this one when it names none), the session is
  forgotten (``rooms.forget``, reason "closed by WHO") and told why, as a revoked one is: ERROR 401
  naming who closed it, then DISCONNECT (a client library reconnects as a new session);
- ``consumer.rm`` / ``journal.purge`` on a journal JetStream keeps: once in JetStream (a store
  call), then every broker's part: its view of the consumer forgotten, its local copy purged to the
  stream's new first seq;
- on a file journal: every broker's part, each on its own journal of that name (404 where none);
- ``consumer.ls``: this broker's file consumers, JetStream's (a store call), every other broker's.

An answer names each broker's part (``brokers``: name -> ``{"status": code, ...}``; "" for a
standalone broker).  A part carried to another broker waits at most until the action's deadline (the
caller's, at most ``MAX_WAIT_S``; looked at by the core's sweep, at least once a second), then
counts as unanswered (504).  Every action is logged at WARNING, naming who asked (an audit line).
The actions in flight are the admin desk's (:mod:`.admindesk`, kept by ``Builtins``); these
functions drive the rooms (:class:`~mc0.broker.core.rooms.Rooms`).  Pure: no sockets, no clock.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from ... import protocol as P
from ...errors import ProtocolError, quoted
from ...protocol import Status
from ...protocol import admin as A
from ...protocol.consumerrequests import CONSUMER_NAME
from ...protocol.peernames import parse_peer_name, peer_name
from ..jetstream.storecalls import failure
from ..storage.port import storage_fault
from .admindesk import BID_PREFIX, AdminDesk, Asker, Gather, Part
from .peers import Out, Peer
from .rooms import Rooms
from .routes import ROUTE_IDENTITY_PREFIX

log = logging.getLogger("mc0.broker.admin")

MAX_WAIT_S = 10.0  # the longest a part carried to another broker is waited for
HTTP_WAIT_S = 5.0  # ... for an action the monitoring listener took
MAX_GATHERS = 64  # actions waiting for other brokers at once (429 beyond)
MAX_WHO_BYTES = 200  # who asked, as carried to another broker (the CALLER of its part)


# ---------------------------------------------------------------- entry points
def call(
    rooms: Rooms, client: Peer, rid: str, user: dict[str, str], body: Sequence[bytes], deadline: float, now: float
) -> list[Out]:
    """One ``mc0.admin`` request of a bus client."""
    desk = rooms.builtins.admin
    text = b"".join(bytes(b) for b in body).decode("utf-8", "replace").strip()
    try:
        op, args = A.parse_request(P.json_body(text, rid), rid)
    except ProtocolError as exc:
        return [(client.routing_id, client.dialect.error(rid, A.ADMIN_SERVICE, exc.code, exc.reason))]
    asker = Asker(client.identity, client, rid, user)
    wait = min(MAX_WAIT_S, max(0.05, (deadline - now) * 0.8))  # answered before the caller gives up
    return act(rooms, desk, asker, op, args, now + wait, now)


def http_call(rooms: Rooms, ticket: int, op: str, args: dict[str, Any], who: str, now: float) -> list[Out]:
    """One action the monitoring listener took (``POST /admin/OP``), answered through ``http_answers``."""
    desk = rooms.builtins.admin
    asker = Asker(who, ticket=ticket)
    try:
        if op not in A.ACTIONS:
            raise ProtocolError(Status.NOT_FOUND, f"no action {quoted(op)}; actions: {', '.join(A.ACTIONS)}")
        checked = A.parse_arguments(op, args, None)
    except ProtocolError as exc:
        return desk.answer(asker, exc.code, {"error": exc.reason})
    return act(rooms, desk, asker, op, checked, now + HTTP_WAIT_S, now)


def act(
    rooms: Rooms, desk: AdminDesk, asker: Asker, op: str, args: dict[str, str], deadline: float, now: float
) -> list[Out]:
    """Do ``op`` (its arguments checked) for ``asker``: here, in JetStream, and at the other brokers."""
    if desk.gathering >= MAX_GATHERS:
        reason = f"{MAX_GATHERS} actions are waiting for other brokers' answers: try again shortly"
        return desk.answer(asker, Status.OVER_LIMIT, {"error": reason})
    gather = Gather(asker, op, args, deadline)
    if op == A.CONN_CLOSE:
        return _conn_close(rooms, desk, gather, now)
    if op in (A.CONSUMER_RM, A.JOURNAL_PURGE) and _kept_by_jetstream(rooms, args["journal"]):
        return _in_jetstream(rooms, desk, gather, now)
    if op == A.CONSUMER_LS:
        return _list(rooms, desk, gather, now)
    part, out = here(rooms, op, args, asker.who, now)
    gather.parts[rooms.routes.name] = part
    return out + _carry(rooms, desk, gather, {"op": op, **args}, now)


def from_route(rooms: Rooms, route: Peer, rid: str, who: str, data: bytes, now: float) -> list[Out]:
    """The part of an action another broker carried here: done here, answered FINAL with its JSON."""
    try:
        query = P.json_body(data.decode("utf-8", "replace"), None)  # (bounded: size and depth)
        if not isinstance(query, dict):
            raise TypeError(type(query).__name__)
        op, args = query["op"], {k: v for k, v in query.items() if k not in ("op", "jetstream", "first_seq")}
        if op not in A.OPS or not all(isinstance(v, str) for v in args.values()):
            raise ValueError(op)
        first_seq = query.get("first_seq")
        if first_seq is not None and (not isinstance(first_seq, int) or first_seq < 1):
            raise ValueError(first_seq)
        jetstream = query.get("jetstream") is True
    except (ProtocolError, ValueError, TypeError, KeyError) as exc:
        rooms.counters["route_records_refused"] += 1
        part: Part = {"status": Status.BAD_REQUEST, "error": f"not an mc0.admin part: {type(exc).__name__}"}
        out: list[Out] = []
    else:
        asked = f"{who} (at broker {_broker_of(route)})"
        part, out = here(rooms, op, args, asked, now, jetstream=jetstream, first_seq=first_seq)
    body = json.dumps(part, sort_keys=True).encode()
    return out + [(route.routing_id, route.dialect.final(rid, A.ADMIN_SERVICE, {}, {}, [body]))]


def carried(rid: str) -> bool:
    """``rid`` names a part this broker carried to another (its answer is ``route_answer``'s)."""
    return rid.startswith(BID_PREFIX)


def route_answer(rooms: Rooms, route: Peer, rid: str, status: int, data: bytes, now: float) -> list[Out]:
    """Another broker's answer to a part this broker carried (FINAL: its JSON; else ERROR ``status``)."""
    desk = rooms.builtins.admin
    gather = desk.carried.get(rid)
    broker = _broker_of(route)
    if gather is None or gather.waiting.get(rid) != broker:
        rooms.counters["admin_answers_dropped"] += 1  # late (after its deadline), or not ours
        return []
    del desk.carried[rid]
    del gather.waiting[rid]
    part: Part
    try:
        text = data.decode("utf-8", "replace")
        if status == 200:
            loaded = P.json_body(text, None)
            if not isinstance(loaded, dict) or not isinstance(loaded.get("status"), int):
                raise ValueError("no status")
            part = loaded
        else:
            part = {"status": status, "error": text[:1000]}
    except (ProtocolError, ValueError):
        part = {"status": Status.WORKER_LOST, "error": f"broker {broker} answered something that is not a part"}
    gather.parts[broker] = part
    return desk.finish(gather) if not gather.waiting else []


# ---------------------------------------------------------------- the ops
def _conn_close(rooms: Rooms, desk: AdminDesk, gather: Gather, now: float) -> list[Out]:
    """At the broker the id names: here, or carried to that one broker."""
    peer_id = parse_peer_name(gather.args["id"])
    assert peer_id is not None  # (parse_arguments checked it)
    routes = rooms.routes
    if not peer_id.broker or peer_id.broker == routes.name:
        part, out = here(rooms, A.CONN_CLOSE, gather.args, gather.asker.who, now)
        gather.parts[routes.name] = part
        return out + desk.finish(gather)
    route = routes.by_name.get(peer_id.broker)
    if route is None:
        known = ", ".join(sorted({routes.name, *routes.by_name})) if routes.enabled else "none: this broker is alone"
        error = f"no broker {peer_id.broker} in this cluster (brokers: {known})"
        gather.parts[peer_id.broker] = {"status": Status.NOT_FOUND, "error": error}
        return desk.finish(gather)
    return _carry(rooms, desk, gather, {"op": A.CONN_CLOSE, **gather.args}, now, only=route)


def _in_jetstream(rooms: Rooms, desk: AdminDesk, gather: Gather, now: float) -> list[Out]:
    """consumer.rm / journal.purge of a journal JetStream keeps: once in JetStream, then every broker's view."""
    journal, op = gather.args["journal"], gather.op
    if op == A.CONSUMER_RM and not CONSUMER_NAME.match(gather.args["name"]):
        gather.parts["jetstream"] = {"status": Status.NOT_FOUND, "error": _no_consumer(gather.args)}
        return desk.finish(gather)
    kept = rooms.journaling.journal(journal)  # (there is one: _kept_by_jetstream)
    if op == A.JOURNAL_PURGE and kept is not None and kept.settings.mailboxes:
        gather.parts[rooms.routes.name] = _keeps_mailboxes(journal)
        return desk.finish(gather)
    if op == A.CONSUMER_RM:
        request: dict[str, Any] = {"op": "consumer_delete", "journal": journal, "name": gather.args["name"]}
    else:
        request = {"op": "stream_purge", "journal": journal}

    def done(data: dict[str, Any], records: Any, now: float) -> list[Out]:
        failed = failure(data)
        if failed is not None:
            code, description = failed
            error = _no_consumer(gather.args) if code == Status.NOT_FOUND and op == A.CONSUMER_RM else description
            gather.parts["jetstream"] = {"status": code, "error": error}
            return desk.finish(gather)
        carry: dict[str, Any] = {"op": op, **gather.args, "jetstream": True}
        who = gather.asker.who
        if op == A.JOURNAL_PURGE:
            first_seq, purged = int(data.get("first_seq", 0)), int(data.get("purged", 0))
            gather.parts["jetstream"] = {"status": 200, "purged": purged, "first_seq": first_seq}
            carry["first_seq"] = first_seq
            log.warning("admin: %s purged journal %s in JetStream: %d records dropped", who, journal, purged)
        else:
            gather.parts["jetstream"] = {"status": 200, "removed": True}
            rooms.counters["consumers_removed"] += 1
            log.warning("admin: %s removed consumer %s of journal %s in JetStream", who, gather.args["name"], journal)
        part, out = here(rooms, op, gather.args, who, now, jetstream=True, first_seq=carry.get("first_seq"))
        gather.parts[rooms.routes.name] = part
        return out + _carry(rooms, desk, gather, carry, now)

    rooms.calls.call(request, done)
    return []


def _list(rooms: Rooms, desk: AdminDesk, gather: Gather, now: float) -> list[Out]:
    """consumer.ls: this broker's file consumers, JetStream's, every other broker's file consumers."""
    part, _ = here(rooms, A.CONSUMER_LS, gather.args, gather.asker.who, now)
    gather.parts[rooms.routes.name] = part
    wanted = gather.args.get("journal")
    kept = sorted(
        journal.name
        for journal in rooms.journaling.every_journal()
        if journal.settings.replicated and not journal.settings.mailboxes and wanted in (None, journal.name)
    )
    carry = {"op": A.CONSUMER_LS, **gather.args}
    if not kept:
        return _carry(rooms, desk, gather, carry, now)

    def listed(data: dict[str, Any], records: Any, now: float) -> list[Out]:
        failed = failure(data)
        if failed is not None:
            gather.parts["jetstream"] = {"status": failed[0], "error": failed[1]}
        else:
            rows = [_store_row(j, n, info) for j, n, info in data.get("consumers", [])]
            gather.parts["jetstream"] = {"status": 200, "consumers": rows}
        return _carry(rooms, desk, gather, carry, now)

    rooms.calls.call({"op": "consumer_list_all", "journals": kept}, listed)
    return []


def _carry(
    rooms: Rooms, desk: AdminDesk, gather: Gather, body: dict[str, Any], now: float, only: Peer | None = None
) -> list[Out]:
    """The action's part at every other broker (or ``only`` that one): one request to each route's
    ``mc0.admin``; answered now when there are none."""
    routes = [only] if only is not None else list(rooms.routes.by_name.values())
    if not routes:
        return desk.finish(gather)
    data = json.dumps(body, sort_keys=True).encode()
    who = gather.asker.who.encode()[:MAX_WHO_BYTES].decode("utf-8", "ignore")
    timeout_ms = max(1, round((gather.deadline - now) * 1000))
    out: list[Out] = []
    for route in routes:
        part_id = desk.new_id()
        gather.waiting[part_id] = _broker_of(route)
        desk.carried[part_id] = gather
        out.append((route.routing_id, route.dialect.to_worker(part_id, A.ADMIN_SERVICE, who, timeout_ms, {}, [data])))
    return out


# ---------------------------------------------------------------- this broker's part
def here(
    rooms: Rooms,
    op: str,
    args: dict[str, str],
    who: str,
    now: float,
    *,
    jetstream: bool = False,
    first_seq: int | None = None,
) -> tuple[Part, list[Out]]:
    """This broker's part of ``op``; ``jetstream``: JetStream already did the action (the part is this
    broker's view of it: a consumer forgotten, the local copy purged to ``first_seq``)."""
    if op == A.CONN_CLOSE:
        return _close_here(rooms, args["id"], who, now)
    if op == A.CONSUMER_LS:
        return _list_here(rooms, args.get("journal")), []
    journal = rooms.journaling.journal(args["journal"])
    if journal is None:
        return {"status": Status.NOT_FOUND, "error": f"no journal {quoted(args['journal'], 64)}"}, []
    if journal.settings.replicated != jetstream:
        kept = "JetStream" if journal.settings.replicated else "a file journal"
        error = f"journal {journal.name} is {kept} here, not at the broker that was asked: configure it alike"
        return {"status": Status.CONFLICT, "error": error}, []
    if op == A.CONSUMER_RM:
        return _remove_here(rooms, journal.name, args["name"], who, jetstream)
    if journal.settings.mailboxes:
        return _keeps_mailboxes(journal.name), []
    try:
        dropped = journal.purge(first_seq)
    except OSError as exc:  # (the file is named in the log, never in the answer)
        log.error("admin: journal %s: purge failed: %s", journal.name, exc)
        return {"status": Status.STORAGE_FAILED, "error": f"journal {journal.name}: {storage_fault(exc)}"}, []
    log.warning("admin: %s purged journal %s here: %d records dropped", who, journal.name, dropped)
    rooms.counters["journals_purged"] += 1
    settled = rooms.consumers.purged(journal.name, now)  # (its consumers' purged un-acked records: settled now)
    return {"status": 200, "purged": dropped, "first_seq": journal.first_seq}, settled


def _close_here(rooms: Rooms, text: str, who: str, now: float) -> tuple[Part, list[Out]]:
    peer_id = parse_peer_name(text)
    if peer_id is None:
        return {"status": Status.BAD_REQUEST, "error": f"{quoted(text, 80)} is not a session's name"}, []
    here_name = rooms.routes.name
    local = peer_name(peer_id.identity, peer_id.serial)
    names = {text, local, peer_name(peer_id.identity, peer_id.serial, here_name) if here_name else local}
    peer = next((p for p in rooms.peers.by_id.values() if p.name in names and not p.route), None)
    if peer is None:
        where = f" at broker {here_name}" if here_name else ""
        return {"status": Status.NOT_FOUND, "error": f"no session {quoted(text, 80)}{where}"}, []
    reason = f"closed by {who}"
    log.warning("admin: session %s (identity %s) %s", peer.name, peer.identity, reason)
    out = rooms.forget(peer, "closed_by_admin", now, reason=reason)
    told = peer.dialect.error(None, "", Status.NOT_CONNECTED, f"session {peer.name} {reason}")
    out.append((peer.routing_id, peer.framed(told)))
    bye = peer.dialect.disconnect()
    if bye is not None:
        out.append((peer.routing_id, peer.framed(bye)))
    return {"status": 200, "closed": peer.name}, rooms.with_finished(out, now)


def _remove_here(rooms: Rooms, journal: str, name: str, who: str, jetstream: bool) -> tuple[Part, list[Out]]:
    if jetstream:  # JetStream removed it: what this broker knew of it goes
        return {"status": 200, "forgot": rooms.store_consumers.forget(journal, name)}, []
    out = rooms.consumers.remove(journal, name, f"removed by {who}")
    if out is None:
        return {"status": Status.NOT_FOUND, "error": _no_consumer({"journal": journal, "name": name})}, []
    log.warning("admin: %s removed consumer %s of journal %s here", who, name, journal)
    return {"status": 200, "removed": True}, out


def _list_here(rooms: Rooms, wanted: str | None) -> Part:
    consumers = rooms.consumers
    rows = []
    for (journal, name), consumer in sorted(consumers.consumers.items()):
        if wanted in (None, journal):
            info = consumers.info(consumer)
            rows.append(
                {
                    "journal": journal,
                    "name": name,
                    "owner": info["owner"],
                    "store": "file",
                    "broker": rooms.routes.name,
                    "num_pending": info["lag"],
                    "num_ack_pending": info["pending"],
                    "ack_floor": info["ack_floor"],
                    "redelivered": info["redelivered"],
                    "dead_lettered": info["dead_lettered"],
                }
            )
    return {"status": 200, "consumers": rows}


def _store_row(journal: str, name: str, info: dict[str, Any]) -> dict[str, Any]:
    """A JetStream consumer's row (JetStream counts no dead letters: mc0 does, per broker, in its stats)."""
    metadata = info.get("metadata") or {}
    return {
        "journal": journal,
        "name": name,
        "owner": str(metadata.get("mc0_owner", "")),
        "store": "jetstream",
        "broker": "",
        "num_pending": int(info.get("num_pending", 0)),
        "num_ack_pending": int(info.get("num_ack_pending", 0)),
        "ack_floor": int(info.get("ack_floor", 0)),
        "redelivered": int(info.get("num_redelivered", 0)),
        "dead_lettered": None,
    }


def _broker_of(route: Peer) -> str:
    return route.identity[len(ROUTE_IDENTITY_PREFIX) :]


def _kept_by_jetstream(rooms: Rooms, journal: str) -> bool:
    kept = rooms.journaling.journal(journal)
    return kept is not None and kept.settings.replicated


def _keeps_mailboxes(journal: str) -> Part:
    error = f"journal {journal} keeps mailboxes: purging it would drop letters kept for offline identities"
    return {"status": Status.CONFLICT, "error": error}


def _no_consumer(args: dict[str, str]) -> str:
    return f"no consumer {quoted(args['name'], 64)} on journal {quoted(args['journal'], 64)}"
