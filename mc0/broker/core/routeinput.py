"""Route traffic: what another broker of the cluster sends this one, handled (``ROUTE_GRAMMAR``).

Contract: ``receive(rooms, route, blob, now)`` takes one route message (a
batched-wire blob from the broker ``route`` stands for) record by record and
returns what to send, driving the rooms (:class:`~mc0.broker.core.rooms.Rooms`)
as the verbs do; the shell's cluster listener hands it what the link
received (``received``, ``hello``, ``lost``, ``reopen`` ...).  The rules that keep a cluster one hop deep and
exactly once: a route's ``MESSAGE`` reaches this broker's *own* peers only
(its plain copy the plain subscribers, its ``GROUP g`` copy one own member
of g, or back to the route with ``REFUSED`` when none may take it, and a copy
of ours handed back that way is chosen again, here or for another route: one
hop each way, never onward; its ``TO x`` letter x's own session or x's
mailbox here); a route's
``REQUEST`` goes to this broker's own workers only; what a route announces
(``SUB``, ``READY``, ``SUB TO``) makes it a subscriber, a worker and an
identity's session holder here, like any peer, so this broker's own traffic
reaches it once.  A route is trusted (only brokers reach the cluster's NATS
subjects; it checked its own peers' rights), so nothing it announces is held
to a peer's limits, only to a memory budget: at most ``max_route_patterns``
patterns per route (the rest refused, counted, said once).  A record this broker cannot take (one the route
grammar has no place for, or malformed) is counted and dropped, never
answered: an answer to another broker's mistake would only echo between
them.  Each record costs itself only, as on the client wire: what the
records before and after it did and said stands, even when one raises (a
bug: counted with the internal errors).  Pure: no sockets, no clock.
"""

from __future__ import annotations

import itertools
import logging
import struct
from collections.abc import Callable, Sequence

from ... import protocol as P
from ...errors import InvalidTopic, ProtocolError
from ...permissions import Grants
from ...protocol import Command, Header, Side, Status, Verb, batch
from ...protocol import routes as route_wire
from ...settings import MAX_ROUTE_PATTERNS
from ...topics import seed_topic, split_pattern
from . import admin
from .access import dead_letter_origin, is_dead_letter
from .groups import HandedBack
from .peers import Out, Peer
from .rooms import Rooms
from .routes import ADMITTED, HEARD_ONCE, MAX_ROUTES, ROUTE_IDENTITY_PREFIX, TOO_MANY

log = logging.getLogger("mc0.broker")

_RECORD_HEAD = 5  # a record's size:u32 and code:u8, in front of its body


# ---------------------------------------------------------------- the sessions with other brokers
def join(rooms: Rooms, name: str, route_ttl: float, max_patterns: int = MAX_ROUTE_PATTERNS) -> None:
    """This broker is ``name`` in a cluster: from now on its own peers' interest, services and
    identities are announced to the other brokers (call before any peer connects).  The rooms that
    name this broker ask the routes for its name: its peers are ``identity#n@name``, what it
    publishes to a JetStream journal comes from ``name``.  ``max_patterns``: the patterns one route
    may announce here (``[cluster] max_route_patterns``)."""
    rooms.routes.join(name, route_ttl, max_patterns)


def hello(rooms: Rooms, name: str, epoch: int, now: float) -> list[Out]:
    """Broker ``name``'s beacon: it is alive; a new broker (or a new start of one) gets a session once
    it is heard twice, within the routes' bounds (``Routes.admit``).  One under this broker's own name
    (never its own: the link passes none of those) is another broker named alike: said, never a route."""
    if name == rooms.routes.name:
        _name_collision(rooms, epoch, now)
        return []
    route = rooms.routes.known(name, epoch)
    if route is not None:
        route.last_recv = now
        return []
    if epoch < rooms.routes.epochs.get(name, -1):
        rooms.counters["route_stale_epoch"] += 1  # a beacon of a run that has since restarted
        return []
    if not _admitted(rooms, name, epoch, now):
        return []
    return _open(rooms, name, epoch, now)


def _admitted(rooms: Rooms, name: str, epoch: int, now: float) -> bool:
    """Broker ``name``, with no route here under ``epoch``, gets one now (else counted; a refusal logged
    within the log's bound)."""
    verdict = rooms.routes.admit(name, epoch, now)
    if verdict == ADMITTED:
        return True
    rooms.counters[f"route_{verdict}"] += 1
    if verdict != HEARD_ONCE:  # (one key for every name: a flood of made-up names writes a few lines a minute)
        if rooms.log_limit.allow("cluster", f"route {verdict}", now):
            why = f"{MAX_ROUTES} routes already" if verdict == TOO_MANY else "new routes are opening too fast"
            log.warning("cluster: no route to broker %s yet: %s (it is tried again at its next beacon)", name, why)
        else:
            rooms.counters["log_lines_left_out"] += 1
    return False


def _name_collision(rooms: Rooms, epoch: int, now: float) -> None:
    """Another broker is named as this one (started under ``epoch``): counted, said at ERROR (at once,
    then once a minute while it lasts, within the log's bound), shown by /healthz
    (``Routes.name_collision``).  Nothing else can be done here: both get the route traffic sent to
    the name, and the others keep a route to one of them at a time."""
    if not rooms.routes.collided(epoch, now):
        return
    if not rooms.log_limit.allow("cluster", "name collision", now):  # (epochs made up by the hundred)
        rooms.counters["log_lines_left_out"] += 1
        return
    name = rooms.routes.name
    log.error(
        "cluster: another broker is also named %s (epoch %016x): broker names must be unique in a cluster"
        " ([cluster] name, mc0 broker --name); route traffic for %s reaches either one, so clients of"
        " both lose messages and requests until one is renamed",
        name, epoch, name,
    )  # fmt: skip


def _open(rooms: Rooms, name: str, epoch: int, now: float) -> list[Out]:
    out: list[Out] = []
    old = rooms.routes.by_name.get(name)
    if old is not None:
        out += rooms.forget(old, "route_restarted", now)
    route = rooms.routes.make_peer(name, epoch, now)
    rooms.peers.add(route, now)
    log.info("cluster: route to broker %s open", name)
    out.append((route.routing_id, rooms.routes.hello()))  # (the same bytes for every route opened meanwhile)
    return rooms.with_finished(out, now)


def received(rooms: Rooms, name: str, epoch: int, blob: bytes, now: float) -> list[Out]:
    """A route message from broker ``name`` (started under ``epoch``), every record of it."""
    out, _ = received_slice(rooms, name, epoch, blob, 0, None, now)
    return out


def received_slice(
    rooms: Rooms, name: str, epoch: int, blob: bytes, start: int, limit: int | None, now: float
) -> tuple[list[Out], int | None]:
    """At most ``limit`` records (None: all) of a route message from broker ``name`` (started under
    ``epoch``), from the record at ``start`` (0: the message is new); what to send, and where the next
    slice starts (None: the message is done).  The shell walks a long message a slice at a time, within
    a time budget per loop turn, so that its own peers are served between slices."""
    if start == 0:
        rooms.counters["route_messages_in"] += 1
    out: list[Out] = []
    route = rooms.routes.known(name, epoch)
    if route is None:
        if name == rooms.routes.name:  # (another broker named as this one: never a route to ourselves)
            rooms.counters["route_messages_unrouted"] += 1
            _name_collision(rooms, epoch, now)
            return [], None
        if epoch < rooms.routes.epochs.get(name, -1):
            rooms.counters["route_stale_epoch"] += 1
            return [], None
        if not _admitted(rooms, name, epoch, now):  # (a hearing: its beacon may not have reached us yet)
            rooms.counters["route_messages_unrouted"] += 1
            return [], None
        out += _open(rooms, name, epoch, now)  # it spoke before its second beacon reached us
        route = rooms.routes.known(name, epoch)
        assert route is not None
    route.last_recv = now
    more, next_start = _walk(rooms, route, blob, start, limit, now)
    return rooms.with_finished(out + more, now), next_start


def behind(rooms: Rooms, now: float) -> None:
    """Route traffic waits unread (the shell walks it a budget at a time): the other brokers' beacons
    may be behind it, so no route's silence is measured meanwhile (as a peer's silence is measured up
    to the last time its socket was read empty)."""
    for route in rooms.routes.by_name.values():
        route.last_recv = now


def resync(rooms: Rooms, route: Peer, now: float) -> list[Out]:
    """The route (re)opened its side: what it knew of us is gone, and what it told us before is
    stale (it follows with all of it again): a fresh route, and all we have to say to it."""
    name = route.identity[len(ROUTE_IDENTITY_PREFIX) :]
    epoch = rooms.routes.epochs[name]
    out = rooms.forget(route, "route_resync", now)
    fresh = rooms.routes.make_peer(name, epoch, now)
    rooms.peers.add(fresh, now)
    state = rooms.routes.state_blob()
    if state:
        out.append((fresh.routing_id, state))
    return out


def reopen(rooms: Rooms, now: float) -> list[Out]:
    """Route traffic to this broker was dropped (it fell behind): what the others announced may be
    lost, so every route is opened afresh, as if it had restarted: forgotten (its jobs requeued or
    failed), then CONNECT and this broker's whole state, to which each answers with its whole state."""
    out: list[Out] = []
    for name in list(rooms.routes.by_name):
        out += _open(rooms, name, rooms.routes.epochs[name], now)
    rooms.counters["route_reopened"] += 1
    return out


def reopen_route(rooms: Rooms, name: str, now: float) -> list[Out]:
    """A message between this broker and broker ``name`` was lost on the way (the link counted it):
    that route is opened afresh, as ``reopen`` does for all (nothing if there is none)."""
    if name not in rooms.routes.by_name:
        return []
    rooms.counters["route_resynced"] += 1
    return _open(rooms, name, rooms.routes.epochs[name], now)


def resync_overflowed(rooms: Rooms, now: float) -> list[Out]:
    """The routes whose queue went over its budget since the last call (``Routes.overflowed``): each
    opened afresh (forgotten, its queue freed; CONNECT and this broker's whole state, which the other
    answers with its own), so what they lost cannot leave interest, services or requests wrong."""
    out: list[Out] = []
    for name in rooms.routes.take_overflowed():
        out += reopen_route(rooms, name, now)
    return out


def lost(rooms: Rooms, now: float) -> list[Out]:
    """The link to the other brokers is down: every route goes (their jobs requeued or failed)."""
    out: list[Out] = []
    for route in list(rooms.routes.by_name.values()):
        out += rooms.forget(route, "route_link_down", now)
    return rooms.with_finished(out, now)


def news(rooms: Rooms) -> list[Out]:
    """What the other brokers must hear of this one since the last call (its own peers' changes)."""
    routes = rooms.routes
    pool = rooms.rpc.pool
    if pool.capacity_changed:
        for service in sorted(pool.capacity_changed):
            routes.capacity(service, pool.local_capacity.get(service, 0))
        pool.capacity_changed.clear()
    return routes.drain()


# ---------------------------------------------------------------- one route message
def receive(rooms: Rooms, route: Peer, blob: bytes, now: float) -> list[Out]:
    """One route message, every record in order; a record it cannot take spoils none after it."""
    out, _ = _walk(rooms, route, blob, 0, None, now)
    return out


def _walk(
    rooms: Rooms, route: Peer, blob: bytes, pos: int, limit: int | None, now: float
) -> tuple[list[Out], int | None]:
    """The records of ``blob`` from the one at ``pos``, at most ``limit`` (None: all), in order; what to
    send, and where the next one starts (None: no record left, or the blob stopped splitting)."""
    limits = rooms.settings.limits
    out: list[Out] = []
    left = limit
    try:
        for code, start, end in batch.records(blob, pos):
            if left is not None:
                if left == 0:
                    return out, start - _RECORD_HEAD
                left -= 1
            try:
                if code == batch.MESSAGE:
                    out += _message_record(rooms, blob, start, end, now)
                elif code == batch.WORK:  # a request of one of its clients, the common shape: no Command built
                    service, rid, caller, timeout_ms, data = batch.work_fields(blob, start, end)
                    out += _call(rooms, route, service, rid, caller, timeout_ms, False, {}, (data,), now)
                elif code == batch.PARTIAL or code == batch.FINAL:
                    rid, data = batch.reply_fields(blob, start, end)
                    verb = Verb.FINAL if code == batch.FINAL else Verb.PARTIAL
                    if admin.carried(rid):  # an mc0.admin part this broker carried there: its answer
                        out += admin.route_answer(rooms, route, rid, 200, bytes(data), now)
                    else:
                        out += rooms.rpc.route_reply(route, verb, rid, {}, {}, (data,), now)
                else:
                    command = batch.command_of(blob, code, start, end, limits, Side.ROUTE)
                    out += _VERBS[command.verb](rooms, route, command, now)
                    if command.verb is Verb.CONNECT:  # its records that follow go to the fresh route
                        route = rooms.routes.by_name.get(route.identity[len(ROUTE_IDENTITY_PREFIX) :], route)
            except (ProtocolError, ValueError, struct.error) as exc:  # (UnicodeDecodeError is a ValueError)
                rooms.counters["route_records_refused"] += 1
                log.debug("route %s: record refused: %s", route.name, exc)
            except Exception as exc:  # a bug: it costs this record only (what the others did stands)
                _failed(rooms, route, exc, now)
    except ProtocolError as exc:  # the blob stopped splitting into records here
        rooms.counters["route_records_refused"] += 1
        log.debug("route %s: message damaged: %s", route.name, exc)
    return out, None


def _failed(rooms: Rooms, route: Peer, exc: Exception, now: float) -> None:
    """A route record raised (a bug): counted, logged within the log's bound, never answered."""
    rooms.counters["internal_errors"] += 1
    rooms.counters["route_records_failed"] += 1
    if rooms.log_limit.allow(route.identity, f"route record:{type(exc).__name__}", now):
        log.error("internal error handling a record from %s", route.name, exc_info=exc)
    else:
        rooms.counters["log_lines_left_out"] += 1


# ---------------------------------------------------------------- publications
def _tokens(topic: str) -> tuple[str, ...]:
    """A route message's topic: its 1.0 tokens, or () for a 0.x peer's opaque topic."""
    return seed_topic(topic)


def _message_record(rooms: Rooms, blob: bytes, start: int, end: int, now: float) -> list[Out]:
    """A plain MESSAGE record (topic, sender, one body frame): to this broker's own subscribers,
    the record itself to the batched ones (it is already what they are sent)."""
    sender, topic_b, data = batch.message_fields(blob, start, end)
    topic = bytes(topic_b).decode()
    tokens = _tokens(topic)
    if not tokens or topic.startswith(P.RESERVED_TOPIC_PREFIX):  # opaque, or the broker's own: the general path
        return _publication(rooms, topic, tokens, bytes(sender), {}, (bytes(data),), now, None, None)
    record: bytes | None = None
    frames: list[bytes] | None = None
    seed_frames: list[bytes] | None = None
    out: list[Out] = []
    for target in rooms.pubsub.subscriptions.match(tokens):
        if target.route or (target.grants.deny_subscribe and not target.grants.delivers(tokens)):
            continue
        if target.batched:
            record = record or blob[start - _RECORD_HEAD : end]
            out.append((target.routing_id, record))
        elif target.legacy:
            seed_frames = seed_frames or P.message(topic_b, None, (), (bytes(data),))
            out.append((target.routing_id, seed_frames))
        else:
            frames = frames or P.message(topic_b, bytes(sender), (), (bytes(data),))
            out.append((target.routing_id, frames))
        target.last_sent = now
        target.delivered += 1
    rooms.counters["delivered"] += len(out)
    return out


def _message(rooms: Rooms, route: Peer, command: Command, now: float) -> list[Out]:
    headers = command.headers
    topic = headers[Header.TOPIC]
    tokens = _tokens(topic)
    sender = headers[Header.SENDER].encode()
    body = [bytes(part) for part in command.payload]
    to = headers.get(Header.TO)
    if to is not None:
        frames = P.message(topic.encode(), sender, P.user_header_frames(headers), body, to=to.encode())
        record = (topic, headers[Header.SENDER], headers, body)
        out, _ = rooms.mailboxes.send(to, frames, None, now, record=record, local_only=True)
        return out
    position = None
    if Header.JOURNAL in headers:
        seq = P.decimal(headers.get(Header.SEQ, ""))
        if seq is None:
            raise ProtocolError(Status.BAD_REQUEST, "SEQ must be a decimal integer")
        position = (headers[Header.JOURNAL], seq)
    group = headers.get(Header.GROUP)
    if group is None:
        if Header.TRIED in headers or Header.REFUSED in headers:
            raise ProtocolError(Status.BAD_REQUEST, "TRIED and REFUSED go with GROUP only")
        return _publication(rooms, topic, tokens, sender, headers, body, now, position, None)
    if not tokens:
        raise ProtocolError(Status.BAD_REQUEST, "a queue group's copy needs a 1.0 topic")
    tried = _broker_list(headers, Header.TRIED)
    refused = _broker_list(headers, Header.REFUSED)
    if refused is not None:  # our own copy, handed back: choose again
        return _handed_back(rooms, route, topic, tokens, sender, headers, body, now, group, (*refused, _name_of(route)))
    out = _publication(rooms, topic, tokens, sender, headers, body, now, position, group)
    if not out:  # (only a group copy can come of it) no own member of the group could take it
        out.append(_hand_back(rooms, route, topic, sender, headers, body, group, tried or ()))
    return out


# ---------------------------------------------------------------- queue-group copies handed back
def _name_of(route: Peer) -> str:
    return route.identity[len(ROUTE_IDENTITY_PREFIX) :]


def _broker_list(headers: dict[str, str], header: Header) -> tuple[str, ...] | None:
    text = headers.get(header)
    if text is None:
        return None
    names = route_wire.parse_broker_list(text)
    if names is None:
        raise ProtocolError(Status.BAD_REQUEST, f"{header} must name brokers")
    return names


_REFUSED = Header.REFUSED.encode()


def _hand_back(
    rooms: Rooms,
    route: Peer,
    topic: str,
    sender: bytes,
    headers: dict[str, str],
    body: Sequence[bytes],
    group: str,
    tried: tuple[str, ...],
) -> Out:
    """A copy for queue group ``group`` that ``route`` chose this broker for, and that none of its
    own members may take (its deny lists, the grants a dead letter needs, or it just left): back to
    the broker that chose (one hop: never onward to a third), naming every broker that could not."""
    refused = route_wire.broker_list((*[n for n in tried if n != rooms.routes.name], rooms.routes.name))
    frames = P.message(
        topic.encode(), sender, P.user_header_frames(headers), body, group=group.encode(), passed=(_REFUSED, refused)
    )
    rooms.counters["route_group_handed_back"] += 1
    return route.routing_id, batch.frames_record(frames)


def _handed_back(
    rooms: Rooms,
    route: Peer,
    topic: str,
    tokens: tuple[str, ...],
    sender: bytes,
    headers: dict[str, str],
    body: Sequence[bytes],
    now: float,
    group: str,
    refused: tuple[str, ...],
) -> list[Out]:
    """This broker's copy for ``group``, handed back by ``route`` (``refused``: every broker that could
    not place it, the route last): to another member, an own one or one behind a route that has not
    refused it (told who did, ``TRIED``); none left: nobody in the cluster may take it (counted)."""
    rooms.pubsub.handed_back(tokens, group, route)
    names = tuple(dict.fromkeys(refused))
    passed_over = {peer for name in names if (peer := rooms.routes.by_name.get(name)) is not None}
    back = HandedBack(passed_over, sender, route_wire.broker_list(names))
    admits = _dead_letter_admits(tokens, headers)
    out = rooms.pubsub.fan_out(topic, tokens, sender, headers, body, now, admits=admits, from_route=(group,), back=back)
    if not out:
        rooms.counters["route_group_unplaced"] += 1
    return out


def _publication(
    rooms: Rooms,
    topic: str,
    tokens: tuple[str, ...],
    sender: bytes,
    headers: dict[str, str],
    body: Sequence[bytes],
    now: float,
    position: tuple[str, int] | None,
    group: str | None,
) -> list[Out]:
    if not tokens:
        return rooms.pubsub.fan_out_opaque(topic, sender, headers, body, now, from_route=True)
    admits = _dead_letter_admits(tokens, headers)
    return rooms.pubsub.fan_out(topic, tokens, sender, headers, body, now, position, admits=admits, from_route=(group,))


def _dead_letter_admits(tokens: tuple[str, ...], headers: dict[str, str]) -> Callable[[Grants], bool] | None:
    """A dead letter reaches only those allowed the topic it died on, here as there (None: not one)."""
    if not is_dead_letter(tokens):
        return None
    origin = dead_letter_origin(headers)

    def admits(grants: Grants) -> bool:
        return origin is not None and grants.may_receive(origin)

    return admits


# ---------------------------------------------------------------- what a route announces
def _patterns(command: Command) -> list[tuple[str, tuple[str, ...]]]:
    exact = command.headers.get(Header.EXACT) == "1"
    found = []
    for frame in command.payload:
        pattern = bytes(frame).decode()
        try:
            found.append((pattern, () if exact else split_pattern(pattern)))
        except InvalidTopic as exc:
            raise ProtocolError(Status.BAD_REQUEST, str(exc)) from None
    return found


def _subscribe(rooms: Rooms, route: Peer, command: Command, now: float) -> list[Out]:
    to = command.headers.get(Header.TO)
    if to is not None:  # it has a session of this identity: letters for it may go there
        return rooms.mailboxes.online(route, now, to)
    group = command.headers.get(Header.GROUP)
    patterns = _patterns(command)
    held = rooms.pubsub.held(route, group)
    new = {p: t for p, t in patterns if p not in held}
    room = rooms.routes.max_patterns - rooms.pubsub.count(route)
    if len(new) > room:
        new = _within_budget(rooms, route, new, max(room, 0), now)
    rooms.pubsub.add(route, new, group)
    return []


def _within_budget(
    rooms: Rooms, route: Peer, new: dict[str, tuple[str, ...]], room: int, now: float
) -> dict[str, tuple[str, ...]]:
    """The first ``room`` of the patterns ``route`` announced: the rest are refused (counted, said once
    while the route lasts), so no route costs more than ``max_patterns`` here.  Messages on a refused
    pattern do not reach that broker's subscribers: the budget is an operator's to raise."""
    refused = len(new) - room
    rooms.counters["route_patterns_refused"] += refused
    name = _name_of(route)
    if name not in rooms.routes.over_budget:
        rooms.routes.over_budget.add(name)
        log.error(
            "cluster: broker %s announced more than %d patterns ([cluster] max_route_patterns): %d refused"
            " (counted in route_patterns_refused); messages on them do not reach its subscribers",
            name, rooms.routes.max_patterns, refused,
        )  # fmt: skip
    return dict(itertools.islice(new.items(), room))


def _unsubscribe(rooms: Rooms, route: Peer, command: Command, now: float) -> list[Out]:
    to = command.headers.get(Header.TO)
    if to is not None:
        rooms.mailboxes.route_offline(route, (to,))
        return []
    rooms.pubsub.remove(route, _patterns(command), command.headers.get(Header.GROUP))
    return []


def _ready(rooms: Rooms, route: Peer, command: Command, now: float) -> list[Out]:
    capacity = P.parse_int(command, Header.CAPACITY)
    (name,) = (rooms.rpc.pool.service_name(bytes(f), None) for f in command.payload[:1])
    return rooms.rpc.route_ready(route, name, min(capacity, 1 << 30), now)


# ---------------------------------------------------------------- requests and replies
def _request(rooms: Rooms, route: Peer, command: Command, now: float) -> list[Out]:
    """A request of one of the route's clients: to this broker's own workers, as its CALLER."""
    headers = command.headers
    rid, name, caller = headers[Header.ID], headers[Header.SERVICE], headers[Header.CALLER]
    timeout_ms = P.parse_int(command, Header.TIMEOUT, minimum=1)
    scatter = headers.get(Header.ALL) == "1"
    return _call(rooms, route, name, rid, caller, timeout_ms, scatter, command.user_headers(), command.payload, now)


def _call(
    rooms: Rooms,
    route: Peer,
    name: str,
    rid: str,
    caller: str,
    timeout_ms: int,
    scatter: bool,
    user: dict[str, str],
    body: Sequence[bytes],
    now: float,
) -> list[Out]:
    if name == P.ADMIN_SERVICE:  # this broker's part of an operator's action (the caller's broker checked its grant)
        return admin.from_route(rooms, route, rid, caller, b"".join(bytes(b) for b in body), now)
    rooms.rpc.pool.service_tokens(name, rid)  # a service name (400 otherwise: counted, dropped)
    if timeout_ms < 1:
        raise ProtocolError(Status.BAD_REQUEST, "TIMEOUT must be at least 1")
    deadline = rooms.rpc.admit(route, name, rid, timeout_ms, now, busy=False)
    rooms.counters["route_requests"] += 1
    return rooms.rpc.submit(route, name, rid, deadline, scatter, user, body, now, caller=caller)


def _cancel(rooms: Rooms, route: Peer, command: Command, now: float) -> list[Out]:
    out = rooms.rpc.cancel(route, command.headers[Header.ID], now)
    return [o for o in out if o[0] != route.routing_id] if out is not None else []  # it asked: no 499 back


def _reply(rooms: Rooms, route: Peer, command: Command, now: float) -> list[Out]:
    headers = command.headers
    bid = headers[Header.ID]
    if admin.carried(bid):  # the answer to an mc0.admin part this broker carried there
        status = P.decimal(headers.get(Header.CODE, "200")) or 500
        text = headers[Header.MESSAGE].encode() if command.verb is Verb.ERROR else b"".join(command.payload)
        return admin.route_answer(rooms, route, bid, status, text, now)
    if command.verb is Verb.ERROR:
        # The other broker's verdict on the request (503, 504, 499 ... or its worker's own code): kept.
        code = P.decimal(headers[Header.CODE])
        if code is None or not 400 <= code <= 599:
            raise ProtocolError(Status.BAD_REQUEST, "CODE must be a status code")
        return rooms.rpc.route_error(route, bid, code, headers[Header.MESSAGE], now)
    fields = {h: v for h, v in headers.items() if h in _REPLY_FIELDS}
    return rooms.rpc.route_reply(route, command.verb, bid, fields, command.user_headers(), command.payload, now)


_REPLY_FIELDS = frozenset({Header.WORKER, Header.CODE, Header.MESSAGE, Header.COUNT, Header.MISSING})


# ---------------------------------------------------------------- the session
def _connect(rooms: Rooms, route: Peer, command: Command, now: float) -> list[Out]:
    """It (re)opened its side: what it knew of us is gone, so it gets all of it again."""
    return resync(rooms, route, now)


def _disconnect(rooms: Rooms, route: Peer, command: Command, now: float) -> list[Out]:
    return rooms.forget(route, "route_disconnected", now)


def _nothing(rooms: Rooms, route: Peer, command: Command, now: float) -> list[Out]:
    return []


_VERBS: dict[Verb, Callable[[Rooms, Peer, Command, float], list[Out]]] = {
    Verb.CONNECT: _connect,
    Verb.DISCONNECT: _disconnect,
    Verb.NOOP: _nothing,
    Verb.SUB: _subscribe,
    Verb.UNSUB: _unsubscribe,
    Verb.READY: _ready,
    Verb.REQUEST: _request,
    Verb.CANCEL: _cancel,
    Verb.PARTIAL: _reply,
    Verb.FINAL: _reply,
    Verb.ERROR: _reply,
    Verb.MESSAGE: _message,
    Verb.BATCH: _nothing,
}
