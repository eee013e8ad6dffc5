"""What each mc0 verb does, across the rooms: the handlers the dispatcher's verb table points at.

Contract: plain functions of ``(rooms, peer, command, now)`` for a command
``decode`` already accepted, as the dialects' handlers are: each validates
the rest of it before changing anything (a ``ProtocolError`` leaves no
trace) and returns what to send, driving the rooms
(:class:`~mc0.broker.core.rooms.Rooms`); they never see the dispatcher.
``VERBS`` is the verb table.  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ... import protocol as P
from ...errors import ProtocolError
from ...protocol import Command, Header, Status, Verb
from ...protocol import jetstream as jsw
from ..storage.port import NOT_KEPT, JournalStore
from . import admin
from .builtin_services import BUILTIN_SERVICES, RESERVED_SERVICES
from .journaling import primary
from .peers import Out, Peer
from .rooms import Rooms


def answer(rooms: Rooms, peer: Peer, command: Command, now: float) -> list[Out]:
    if command.id is None:
        return []
    peer.last_sent = now
    return [(peer.routing_id, P.ok(command.id))]


def ping(rooms: Rooms, peer: Peer, command: Command, now: float) -> list[Out]:
    peer.last_sent = now
    return [(peer.routing_id, P.encode(Verb.PONG, {Header.ID: command.headers[Header.ID]}))]


# ---------------------------------------------------------------- pub/sub
def put(rooms: Rooms, peer: Peer, command: Command, now: float) -> list[Out]:
    headers = command.headers
    topic = headers[Header.TOPIC]
    if peer.legacy:  # an exact string: its 1.0 tokens, or () when opaque (mc0.topics.seed_topic)
        tokens = rooms.pubsub.seed_topic_tokens(topic, command.id)
    else:
        tokens = rooms.pubsub.topic_tokens(topic, command.id)
    if topic.startswith(P.RESERVED_TOPIC_PREFIX):
        raise ProtocolError(Status.FORBIDDEN, f"topics {P.RESERVED_TOPIC_PREFIX}> are the broker's own", command.id)
    if Header.TO in headers:
        return put_to(rooms, peer, command, topic, now)
    if not tokens:
        return put_opaque(rooms, peer, command, topic, now)
    if not peer.grants.may_publish(tokens):
        raise ProtocolError(Status.FORBIDDEN, f"{peer.identity} may not publish to {topic}", command.id)
    rooms.counters["published"] += 1
    rooms.traffic.add(topic, len(command.payload[-1]) if command.payload else 0)
    journals = rooms.journaling.journals_of(tokens) if rooms.journaling.has_journals else ()
    if journals:
        return put_journaled(rooms, peer, command, topic, tokens, journals, now)
    out = rooms.pubsub.fan_out(topic, tokens, peer.sender, headers, command.payload, now, publisher=peer)
    if command.id is not None:
        peer.last_sent = now
        out.append((peer.routing_id, P.ok(command.id)))
    return out


def put_opaque(rooms: Rooms, peer: Peer, command: Command, topic: str, now: float) -> list[Out]:
    """A 0.x PUT on a topic that is not a 1.0 topic: to the 0.x peers that subscribed that exact
    string, never journaled (journals keep 1.0 topics)."""
    if not peer.grants.may_use_opaque("publish"):
        raise ProtocolError(Status.FORBIDDEN, f"{peer.identity} may not publish to {topic[:64]}", command.id)
    rooms.counters["published"] += 1
    rooms.traffic.add(topic, len(command.payload[-1]) if command.payload else 0)
    out = rooms.pubsub.fan_out_opaque(topic, peer.sender, command.headers, command.payload, now)
    return out + answer(rooms, peer, command, now)


def put_to(rooms: Rooms, peer: Peer, command: Command, topic: str, now: float) -> list[Out]:
    """A direct message: to the identity's newest session, else kept in its mailbox (no
    subscriber sees it; only a journal that keeps mailboxes does); the OK says which, and
    ``stored`` waits for the commit when a journal keeps the letter."""
    to = rooms.mailboxes.check(peer, command)
    mailboxes = rooms.mailboxes
    msgid = command.headers.get(Header.MSGID)
    earlier = mailboxes.duplicate(peer.identity, msgid, now) if msgid is not None else None
    if earlier is not None:
        return letter_duplicate(rooms, peer, command, earlier, now)
    user = P.user_header_frames(command.headers)
    body = [bytes(part) for part in command.payload]  # a kept letter must not pin the receive buffer
    frames = P.message(topic.encode(), peer.sender, user, body, to=to.encode())
    record = (topic, peer.identity, command.headers, body)
    out, outcome = mailboxes.send(to, frames, command.id, now, record=record)
    if command.id is not None:
        peer.last_sent = now
        ok = P.ok_mailbox(command.id, outcome)
        keeper = mailboxes.journal
        stored = mailboxes.stored
        if stored is not None and outcome == P.MAILBOX_STORED:  # stored = a quorum of the stream's replicas has it
            token = rooms.mailboxes.proposed
            rooms.replication.hold(stored.journal.name, token, peer.routing_id, command.id, letter=True)
        elif keeper is not None and outcome == P.MAILBOX_STORED:  # stored = committed to the journal
            rooms.journaling.hold_ok(keeper, peer.routing_id, command.id, ok)
        else:
            out.append((peer.routing_id, ok))
    return out


def letter_duplicate(rooms: Rooms, peer: Peer, command: Command, earlier: str, now: float) -> list[Out]:
    """A letter whose MSGID its sender used in the dedup window: taken once, answered as the first
    was (``OK MAILBOX outcome DUPLICATE 1``; ``stored`` in a journal once its record is committed)."""
    rooms.counters["letter_duplicates"] += 1
    if command.id is None:
        return []
    peer.last_sent = now
    ok = P.ok_mailbox(command.id, earlier, duplicate=True)
    keeper = rooms.mailboxes.journal
    if keeper is not None and earlier == P.MAILBOX_STORED:
        rooms.journaling.hold_ok(keeper, peer.routing_id, command.id, ok)
        return []
    return [(peer.routing_id, ok)]


def put_journaled(
    rooms: Rooms,
    peer: Peer,
    command: Command,
    topic: str,
    tokens: tuple[str, ...],
    journals: Sequence[JournalStore],
    now: float,
) -> list[Out]:
    """Keep the record in every journal the topic belongs to; then act on what the primary's store
    answered (``JournalStore.keep``): a seq (the record is in the journal now) is fanned out now and
    the OK held until ``commit``; a token (the record's seq comes later: a journal JetStream keeps) holds
    the OK until the stream acknowledges (a quorum of its replicas holds it), with the stream's SEQ, and
    nothing is delivered now: every broker delivers the record to its own subscribers when the stream
    hands it out (``jetstream.fromstore.arrived``).

    The OK names the first journal (by name) and the record's SEQ there; a
    repeat of an earlier ``(sender, MSGID)`` in that journal's dedup window
    is acknowledged ``DUPLICATE 1`` with the first copy's SEQ and goes nowhere
    (JetStream's duplicate window dedups the MSGID of a journal it keeps, cluster-wide).
    """
    headers = command.headers
    first = primary(journals)
    msgid = headers.get(Header.MSGID)
    if msgid is not None:
        earlier = first.duplicate_of(peer.identity, msgid)  # (None of JetStream's: the stream dedups)
        if earlier is not None:
            rooms.counters["duplicates"] += 1
            if command.id is not None:
                ok = P.ok_journaled(command.id, first.name, earlier, duplicate=True)
                rooms.journaling.hold_ok(first, peer.routing_id, command.id, ok)
            return []
    # Before anything is kept, a PUT that any JetStream journal keeps is checked against the memory
    # budget of what waits for JetStream, and is given who published it: what keep needs before it
    # answers.  (Not only when JetStream keeps the primary: a record one of its journals could not take
    # would be answered OK and be missing there.  After the duplicate check, which changes nothing and
    # answers a file primary's duplicate as before; JetStream's own duplicate_of answers None.)
    origin = "" if rooms.journaling.local(journals) else admit_proposal(rooms, peer, command, topic, journals)
    stored = {k: v for k, v in headers.items() if k != Header.TOPIC and k != Header.ID}
    kept = rooms.journaling.append(journals, first, topic, peer.identity, stored, command.payload, origin=origin)
    if kept is None or kept == NOT_KEPT:  # (past JetStream's budget: refused 429 above, never)
        fault = "could not write" if kept is None else "could not take it"
        raise ProtocolError(Status.STORAGE_FAILED, f"journal {first.name} {fault}", command.id)
    seq, token = kept
    rooms.counters["journaled"] += 1
    if token:  # its seq comes with the stream's answer: the OK waits for it, by the proposal's token
        if command.id is not None:
            peer.last_sent = now
            rooms.replication.hold(first.name, token, peer.routing_id, command.id)
        return []
    held = rooms.journaling.held_back(journals, tokens)
    out = rooms.pubsub.fan_out(
        topic, tokens, peer.sender, headers, command.payload, now, (first.name, seq), held, publisher=peer
    )
    if command.id is not None:
        peer.last_sent = now
        rooms.journaling.hold_ok(first, peer.routing_id, command.id, P.ok_journaled(command.id, first.name, seq))
    return out


def admit_proposal(rooms: Rooms, peer: Peer, command: Command, topic: str, journals: Sequence[JournalStore]) -> str:
    """A PUT that a journal JetStream keeps is among ``journals``: 429 if what waits for a store's answer is
    over its budget in any of them (refused before anything changes); else its origin, which the record carries to
    every broker (who published it matters only for its ECHO 0 and for the queue groups this broker
    picks for; "" when neither applies)."""
    for journal in journals:
        backlog = journal.backlog  # ("" of a local store: nothing of it waits for an answer)
        if backlog:
            rooms.counters["store_backlog_refused"] += 1
            raise ProtocolError(Status.OVER_LIMIT, f"journal {journal.name}: {backlog}", command.id)
    tokens = rooms.pubsub.tokens_of(topic)
    wanted = not peer.echo or (tokens is not None and bool(rooms.pubsub.groups.match(tokens)))
    return jsw.origin(rooms.routes.name, peer.routing_id) if wanted else ""


def subscribe(rooms: Rooms, peer: Peer, command: Command, now: float) -> list[Out]:
    patterns = rooms.pubsub.parse_patterns(command, legacy=peer.legacy)  # all validated before any change
    group = rooms.pubsub.check_group(peer, command)
    new = rooms.pubsub.check_subscribe(peer, patterns, command.id, group)
    if group is not None:
        rooms.pubsub.add(peer, new, group)
        return answer(rooms, peer, command, now)
    replay = rooms.journaling.plan_replay(peer, command, patterns) if Header.FROM in command.headers else None
    rooms.pubsub.add(peer, new)
    if replay is not None:
        rooms.journaling.start_replay(peer, replay)
        if command.id is not None:  # OK JOURNAL j SEQ n: the records before n went out live already (its history)
            peer.last_sent = now
            return [(peer.routing_id, P.ok_journaled(command.id, replay.journal.name, replay.journal.next_seq))]
    return answer(rooms, peer, command, now)


def unsubscribe(rooms: Rooms, peer: Peer, command: Command, now: float) -> list[Out]:
    patterns = rooms.pubsub.parse_patterns(command, legacy=peer.legacy)
    group = rooms.pubsub.check_group(peer, command)
    removed = rooms.pubsub.remove(peer, patterns, group)
    rooms.journaling.unsubscribed(peer, removed)
    return answer(rooms, peer, command, now)


# ---------------------------------------------------------------- RPC
def ready(rooms: Rooms, peer: Peer, command: Command, now: float) -> list[Out]:
    capacity = 1
    if Header.CAPACITY in command.headers:
        capacity = P.parse_int(command, Header.CAPACITY, minimum=1)
        rooms.rpc.pool.check_capacity(capacity, command.id)
    names = [rooms.rpc.pool.service_name(bytes(f), command.id) for f in command.payload]
    for name in names:
        rooms.rpc.pool.check_serve(peer, name, command.id, RESERVED_SERVICES)
    out = rooms.rpc.ready(peer, tuple(dict.fromkeys(names)), capacity, now)
    return out + answer(rooms, peer, command, now)


def request(rooms: Rooms, peer: Peer, command: Command, now: float) -> list[Out]:
    headers = command.headers
    rid = headers[Header.ID]
    timeout_ms = rooms.settings.request_timeout_ms
    if Header.TIMEOUT in headers:
        timeout_ms = P.parse_int(command, Header.TIMEOUT, minimum=1)
    scatter = False
    if Header.ALL in headers:
        if headers[Header.ALL] not in ("0", "1"):
            raise ProtocolError(Status.BAD_REQUEST, "ALL must be 0 or 1", rid)
        scatter = headers[Header.ALL] == "1"
    name = headers[Header.SERVICE]
    return call(rooms, peer, name, rid, timeout_ms, scatter, command.user_headers(), command.payload, now)


def call(
    rooms: Rooms,
    client: Peer,
    name: str,
    rid: str,
    timeout_ms: int,
    scatter: bool,
    user: dict[str, str],
    body: Sequence[bytes],
    now: float,
) -> list[Out]:
    return request_for(rooms, client, name, rid, timeout_ms, scatter, user, body, now, quiet=False)


def request_for(
    rooms: Rooms,
    client: Peer,
    name: str,
    rid: str,
    timeout_ms: int,
    scatter: bool,
    user: dict[str, str],
    body: Sequence[bytes],
    now: float,
    *,
    quiet: bool,
) -> list[Out]:
    """A request admitted and sent on its way; ``quiet``: the client wants no answer (eMQP)."""
    busy = rooms.journaling.fetch_running(client, rid) or (
        name == P.CONSUMER_SERVICE and rooms.consumers.waiting_for(client, rid)
    )
    deadline = rooms.rpc.admit(client, name, rid, timeout_ms, now, busy=busy)
    rooms.counters["requests"] += 1
    client.last_sent = now
    if quiet and (name == P.CONSUMER_SERVICE or name in BUILTIN_SERVICES):
        rooms.counters["answers_unwanted"] += 1  # the broker's own services only answer
        return []
    if name == P.CONSUMER_SERVICE:
        try:
            return rooms.consumers.handle(client, rid, user, body, deadline, now)
        except ProtocolError as exc:
            return [(client.routing_id, client.dialect.error(rid, name, exc.code, exc.reason))]
    if name == P.ADMIN_SERVICE:  # (rpc.admit let only an identity granted it by name this far)
        return admin.call(rooms, client, rid, user, body, deadline, now)
    if name in BUILTIN_SERVICES:
        # Not in mc0.sys.rpc: a journal reader's fetches would otherwise feed the journal it reads.
        return rooms.builtins.answer(client, name, rid, user, body)
    service = rooms.rpc.services.get(name)
    if len(body) > 1 and service is not None and any(w.dialect.one_frame for w in service.workers):
        # An eMQP or MemoDB worker takes one body frame: refused before anything is queued, not run together.
        raise ProtocolError(Status.BAD_REQUEST, f"{name} has workers that take one body frame, not {len(body)}", rid)
    return rooms.rpc.submit(client, name, rid, deadline, scatter, user, body, now, quiet=quiet)


def cancel(rooms: Rooms, peer: Peer, command: Command, now: float) -> list[Out]:
    """CANCEL ID rid: 499 to the client, CANCEL to the worker; unknown ids are ignored."""
    rid = command.headers[Header.ID]
    out = rooms.rpc.cancel(peer, rid, now)
    if out is not None:
        return out
    if rooms.consumers.cancel(peer, rid):
        peer.last_sent = now
        return [(peer.routing_id, peer.dialect.error(rid, P.CONSUMER_SERVICE, Status.CANCELLED, "cancelled"))]
    if rooms.journaling.cancel_fetch(peer, rid):
        peer.last_sent = now
        return [(peer.routing_id, peer.dialect.error(rid, P.JOURNAL_SERVICE, Status.CANCELLED, "cancelled"))]
    rooms.counters["cancel_unknown"] += 1
    return []


def worker_reply(rooms: Rooms, peer: Peer, command: Command, now: float) -> list[Out]:
    bid = command.headers[Header.ID]
    if command.verb is Verb.ERROR:
        code, reason = P.worker_error(command.headers[Header.CODE], command.headers[Header.MESSAGE])
        return rooms.rpc.reply(peer, Verb.ERROR, bid, {}, (), now, code, reason)
    return rooms.rpc.reply(peer, command.verb, bid, command.user_headers(), command.payload, now)


def misframed_batch(rooms: Rooms, peer: Peer, command: Command, now: float) -> list[Out]:
    """BATCH in any other shape than its own three frames (which never reach the verb table)."""
    raise ProtocolError(Status.BAD_REQUEST, 'a BATCH is three frames: BATCH, "", the records', command.id)


Handler = Callable[["Rooms", Peer, Command, float], list[Out]]
# What a connected mc0 peer's command does (CONNECT and DISCONNECT are the dispatcher's: sessions).
VERBS: dict[Verb, Handler] = {
    Verb.PUT: put,
    Verb.REQUEST: request,
    Verb.PARTIAL: worker_reply,
    Verb.FINAL: worker_reply,
    Verb.ERROR: worker_reply,
    Verb.NOOP: answer,
    Verb.SUB: subscribe,
    Verb.UNSUB: unsubscribe,
    Verb.READY: ready,
    Verb.CANCEL: cancel,
    Verb.PING: ping,
    Verb.BATCH: misframed_batch,
}
