"""RPC: services, their workers and queues, and every request's way to its one terminal reply.

Contract: owns the services (workers, the LRU list of those with spare
capacity, a bounded FIFO queue), each worker's held jobs and each client's
outstanding requests, and the deadline heap.  Every change of a request's
state goes through :mod:`mc0.broker.core.jobs` (one transition table), so each
REQUEST ends in exactly one terminal message to its client: FINAL, or ERROR
499/500/502/503/504.  Requests whose worker dies before anything was
forwarded go back to the front of their queue, up to ``max_attempts``
dispatches.  Finished requests are described as :class:`RpcDone` records (when
``wants_telemetry()``), handed over by ``take_finished`` to the rooms, which
publish them (``Rooms.with_finished``).  The services' figures are read through
calls (``serves``, ``services_report``, ``service_totals``, ``worker_figures``,
``route_capacity``), never through the containers.
Messages are rendered by each peer's dialect.  Pure: no sockets, no clock.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable, Sequence

from ...deadlines import Deadlines
from ...errors import ProtocolError, quoted
from ...permissions import Grants
from ...protocol import Header, Status, Verb, decimal, reply_headers, request_to_worker, trace_frames
from ...settings import CoreSettings
from .jobs import (
    JOB_TRANSITIONS,
    Action,
    GatherEvent,
    GatherState,
    Job,
    JobEvent,
    JobState,
    Request,
    Scatter,
    gather_transition,
)
from .peers import Out, Peer
from .telemetry import RpcDone
from .workers import FairQueue, Service, Workers, WorkerState

log = logging.getLogger("mc0.broker")

# How long a request put back after its worker was lost waits for a worker of its service to appear
# (one restarting, another broker's route coming back) when none is left, before it fails 502.
ORPHAN_GRACE = 1.0


class Rpc:
    def __init__(
        self,
        settings: CoreSettings,
        counters: Counter[str],
        *,
        is_current: Callable[[Peer], bool],
        wants_telemetry: Callable[[], bool],
    ) -> None:
        self.settings = settings
        self.counters = counters
        self.pool = Workers(settings)
        self.services: dict[str, Service] = self.pool.services
        self.workers: dict[Peer, WorkerState] = self.pool.workers
        self.requests: dict[Peer, dict[str, Request]] = {}
        self._done: list[RpcDone] = []  # mc0.sys.rpc records not yet taken (take_finished)
        self._is_current = is_current
        self._wants_telemetry = wants_telemetry
        self._deadlines: Deadlines[Request] = Deadlines()  # a finished request leaves at once
        self._orphans: Deadlines[Job] = Deadlines()  # requeued after a worker was lost (see _requeue)
        self._seq = itertools.count(1)

    def next_id(self) -> int:
        return next(self._seq)

    def _fire(self, job: Job, event: JobEvent) -> Action:
        """Apply ``event`` to ``job`` through the transition table; the action to carry out.

        Keeps each service's count of waiting jobs exact: a job that ends while
        queued stops counting toward ``max_queue`` at once, and the queue is
        swept of such jobs once they outnumber the live ones.
        """
        was = job.state
        job.state, action = JOB_TRANSITIONS[was, event]
        if was is JobState.QUEUED and job.state is not JobState.QUEUED and job.parent is None:
            service = self.services.get(job.service)
            if service is not None:
                service.queued -= 1
                if job.state is JobState.DONE:  # it is still in the queue
                    service.dead += 1
                    if service.dead > 64 and service.dead > service.queued:
                        service.queue = FairQueue(j for j in service.queue if j.state is JobState.QUEUED)
                        service.dead = 0
        return action

    def _enqueue(self, service: Service, job: Job, *, front: bool = False) -> None:
        if front:
            service.queue.appendleft(job)
        else:
            service.queue.append(job)
        service.queued += 1

    # ================================================================ workers
    def ready(self, worker: Peer, names: tuple[str, ...], capacity: int, now: float) -> list[Out]:
        """Register (or re-register) a worker for services with a capacity."""
        out: list[Out] = []
        for service in self.pool.ready(worker, names, capacity):
            out += self._pump(service, now)
        return out

    def route_ready(self, route: Peer, name: str, capacity: int, now: float) -> list[Out]:
        """Another broker serves ``name`` with ``capacity`` in all (0: no longer)."""
        out: list[Out] = []
        for service in self.pool.route_ready(route, name, capacity):
            out += self._pump(service, now)
        return out

    def withdraw_denied(self, peer: Peer, grants: Grants, now: float) -> tuple[list[Out], str]:
        """A new policy: stop ``peer`` serving what it may no longer serve; returns what, if anything."""
        pool = self.pool
        kept, dropped = pool.withdraw_denied(peer, grants, lambda name: pool.service_tokens(name, None))
        if not dropped:
            return [], ""
        return self.ready(peer, kept, self.pool.workers[peer].capacity, now), dropped

    def _assign(self, worker: Peer, job: Job, now: float) -> Out:
        self._fire(job, JobEvent.DISPATCH)
        job.worker = worker
        job.attempts += 1
        self.pool.took(worker, job)
        remaining = max(1, round((job.deadline - now) * 1000))
        worker.last_sent = now
        caller = job.caller or job.client.identity
        if worker.route and job.parent is not None:
            # A scatter leg: that broker scatters to its own workers, and its summary (COUNT, MISSING) must
            # arrive before this broker's own deadline: it gets a tenth (at most half a second) less.
            remaining = max(1, remaining - min(remaining // 10, 500))
            frames: list[bytes] | bytes = request_to_worker(
                job.bid, job.service, caller, remaining, job.user, job.body, every_worker=True
            )
        else:
            frames = worker.dialect.to_worker(job.bid, job.service, caller, remaining, job.user, job.body)
        return (worker.routing_id, frames)

    def _pump(self, service: Service, now: float) -> list[Out]:
        """Dispatch queued requests while some worker has spare capacity (a route's request waits for
        one of this broker's own workers)."""
        out: list[Out] = []
        queue, ready = service.queue, service.ready
        waiting: list[Job] = []
        while queue and ready:
            job = queue.popleft()
            if job.state is not JobState.QUEUED:
                service.dead -= 1  # ended while it waited (deadline, cancel, client gone)
                continue
            worker = self.pool.pick(service, job)
            if worker is None:
                waiting.append(job)
                continue
            out.append(self._assign(worker, job, now))
        for job in reversed(waiting):
            queue.appendleft(job)
        return out

    def _release(self, worker: Peer, job: Job, now: float) -> list[Out]:
        """A worker finished (or lost) a job: free its slot and give it more work."""
        job.worker = None
        out: list[Out] = []
        for service in self.pool.released(worker, job, self._is_current(worker)):
            out += self._pump(service, now)
        return out

    # ================================================================ requests
    def admit(self, client: Peer, name: str, rid: str, timeout_ms: int, now: float, *, busy: bool) -> float:
        """Check a REQUEST before anything changes; returns its deadline.

        ``busy``: the client has another exchange under this id (a fetch).
        """
        held = self.requests.get(client)
        if busy or (held is not None and rid in held):
            raise ProtocolError(Status.CONFLICT, f"request id {quoted(rid)} is already outstanding", rid)
        tokens = self.pool.service_tokens(name, rid)
        if not client.grants.may_call(tokens):
            raise ProtocolError(Status.FORBIDDEN, f"{client.identity} may not call {name}", rid)
        outstanding = len(held) if held is not None else 0
        # (A route carries many clients' requests: their own brokers bounded them.)
        if outstanding >= self.settings.max_requests and not client.route:
            reason = f"{outstanding} requests outstanding, the limit (broker.max_requests)"
            raise ProtocolError(Status.OVER_LIMIT, reason, rid)
        return now + min(timeout_ms, self.settings.max_request_timeout_ms) / 1000.0

    def submit(
        self,
        client: Peer,
        name: str,
        rid: str,
        deadline: float,
        scatter: bool,
        user: dict[str, str],
        body: Sequence[bytes],
        now: float,
        *,
        quiet: bool = False,
        caller: str | None = None,
    ) -> list[Out]:
        """Queue an admitted request (or answer 503 at once when nobody serves ``name``).

        ``quiet``: answer nothing; ``caller``: who asked, when ``client`` is a route (then only this
        broker's own workers serve).
        """
        service = self.services.get(name)
        if service is None or not service.workers or (client.route and not self.pool.has_local(service)):
            self.counters["no_worker"] += 1
            self._finished(name, client, None, now, Status.NO_WORKER, sum(map(len, body)), 0, now)
            self.counters["answers_unwanted"] += quiet
            answer = _error(client, rid, name, Status.NO_WORKER, f"no worker for {name}", user)
            return [] if quiet else [(client.routing_id, answer)]

        if scatter:
            service.requests += 1
            return self._scatter(client, service, rid, user, body, now, deadline, caller)
        max_queue = self.settings.max_queue
        if service.queued >= max_queue and not service.ready:
            raise ProtocolError(Status.OVER_LIMIT, f"queue for {name} is full ({max_queue}: broker.max_queue)", rid)
        service.requests += 1
        bid = str(next(self._seq))
        job = Job(bid, client, rid, name, user, body, now, deadline, quiet=quiet, caller=caller)
        self._hold(client, rid, job)
        self._deadlines.add(deadline, job)

        if not service.queue and service.ready:  # nobody waits before it: no round of the queue
            worker = self.pool.pick(service, job)
            if worker is not None:
                service.queued += 1  # (counted as queued: the dispatch counts it out)
                return [self._assign(worker, job, now)]
        self._enqueue(service, job)
        return self._pump(service, now)

    def _scatter(
        self,
        client: Peer,
        service: Service,
        rid: str,
        user: dict[str, str],
        body: Sequence[bytes],
        now: float,
        deadline: float,
        caller: str | None,
    ) -> list[Out]:
        """Every worker of the service gets its own leg at once, regardless of capacity (another
        broker's leg: to each of its workers; a leg from another broker: this broker's own workers)."""
        gather = Scatter(client, rid, service.name, user, now, deadline)
        self._hold(client, rid, gather)
        self._deadlines.add(deadline, gather)
        out: list[Out] = []
        for worker in [w for w in service.workers if not (client.route and w.route)]:
            bid = str(next(self._seq))
            leg = Job(bid, client, rid, service.name, user, body, now, deadline, parent=gather, caller=caller)
            gather.legs[leg.bid] = leg
            gather.total += 1
            out.append(self._assign(worker, leg, now))
        return out

    def cancel(self, client: Peer, rid: str, now: float) -> list[Out] | None:
        """CANCEL ID rid: 499 to the client, CANCEL to the worker; None if no such request."""
        held = self.requests.get(client)
        request = held.get(rid) if held is not None else None
        if request is None:
            return None
        self.counters["cancelled"] += 1
        if isinstance(request, Scatter):
            _, action = gather_transition(request.state, GatherEvent.CANCEL)
            request.state = GatherState.DONE
            worker = None
            size = bytes_out = 0
        else:
            worker = request.worker
            action = self._fire(request, JobEvent.CANCEL)
            size, bytes_out = request.size, request.bytes_out
        assert action is Action.FAIL_CANCELLED

        self._forget_request(client, rid)
        out = self._stop_work(request, now)
        client.last_sent = now
        service = request.service
        out.append((client.routing_id, _error(client, rid, service, Status.CANCELLED, "cancelled", request.user)))
        self._finished(service, client, worker, request.created, Status.CANCELLED, size, bytes_out, now)
        return out

    def _hold(self, client: Peer, rid: str, request: Request) -> None:
        held = self.requests.get(client)
        if held is None:
            held = self.requests[client] = {}
        held[rid] = request

    def _forget_request(self, client: Peer, rid: str) -> None:
        held = self.requests.get(client)
        if held is not None:
            # The (maybe empty) dict stays until the client goes: no churn per request.
            request = held.pop(rid, None)
            if request is not None:
                self._deadlines.discard(request)

    def _stop_work(self, request: Request, now: float) -> list[Out]:
        """Tell each worker still holding (a leg of) ``request`` to stop, and free its slot."""
        legs = list(request.legs.values()) if isinstance(request, Scatter) else [request]
        out: list[Out] = []
        for job in legs:
            if job.state is not JobState.DONE:
                self._fire(job, JobEvent.CLIENT_GONE)
            worker = job.worker
            if worker is not None:
                notice = worker.dialect.cancel(job.bid)
                if notice is not None:
                    out.append((worker.routing_id, notice))
                out += self._release(worker, job, now)
        return out

    # ================================================================ replies
    def reply(
        self,
        worker: Peer,
        verb: Verb,
        bid: str,
        user: dict[str, str],
        body: Sequence[bytes],
        now: float,
        code: int = 0,
        reason: str = "",
    ) -> list[Out]:
        """PARTIAL / FINAL / ERROR ID bid from a worker, for a job it holds (anything else is dropped)."""
        state = self.workers.get(worker)
        job = state.jobs.get(bid) if state is not None else None
        if job is None or state is None:
            # Late (after deadline/cancel), forged, or never given to this worker.
            self.counters["replies_dropped"] += 1
            return []
        user = reply_headers(user, job.user)  # the request's user headers unless the worker set its own
        client = job.client
        client.last_sent = now
        action = self._fire(job, _REPLY_EVENTS[verb])
        if job.parent is not None:
            return self._leg_reply(state, job, action, user, body, now, code, reason)
        if action is Action.FORWARD:
            job.bytes_out += sum(map(len, body))
            partial = None if job.quiet else client.dialect.partial(job.rid, job.service, {}, user, body)
            self.counters["partials_unsent"] += partial is None  # unwanted, or the dialect has no partials
            return [(client.routing_id, partial)] if partial is not None else []

        self._forget_request(client, job.rid)
        service = self.services.get(job.service)
        state.served += 1
        if service is not None:
            service.latency.observe(now - job.created)
            if action is Action.REPLY_FINAL:
                service.served += 1
            else:
                service.errors += 1
        if action is Action.REPLY_FINAL:
            frames = client.dialect.final(job.rid, job.service, {}, user, body)
        else:
            frames = _error(client, job.rid, job.service, code, reason, job.user)
        if job.quiet:
            self.counters["answers_unwanted"] += 1
        out: list[Out] = [] if job.quiet else [(client.routing_id, frames)]

        out += self._release(worker, job, now)
        status = 200 if action is Action.REPLY_FINAL else code
        bytes_out = job.bytes_out + sum(map(len, body))
        self._finished(job.service, client, worker, job.created, status, job.size, bytes_out, now)
        return out

    def hand_off(
        self, worker: Peer, bid: str, name: str, user: dict[str, str], body: Sequence[bytes], now: float
    ) -> list[Out] | None:
        """``worker`` passes the job it holds as ``bid`` on to service ``name`` (DCP): its slot frees,
        the same client and request id wait on a new job (same deadline).  None: it holds no such job."""
        state = self.workers.get(worker)
        job = state.jobs.get(bid) if state is not None else None
        if job is None or state is None or job.parent is not None:
            return None
        tokens = self.pool.service_tokens(name, job.rid)  # checked before anything changes
        service = self.services.get(name)
        if not worker.grants.may_call(tokens):
            refusal = f"hand-off to {name} forbidden"
            return self.reply(worker, Verb.ERROR, bid, {}, (), now, Status.FORBIDDEN, refusal)
        if service is None or not service.workers:
            refusal = f"hand-off: no worker for {name}"
            return self.reply(worker, Verb.ERROR, bid, {}, (), now, Status.NO_WORKER, refusal)

        self._fire(job, JobEvent.FINAL)
        state.served += 1
        out = self._release(worker, job, now)
        user = {**job.user, **user}
        handed = Job(str(next(self._seq)), job.client, job.rid, name, user, body, now, job.deadline)
        handed.quiet = job.quiet
        self._deadlines.discard(job)
        self._hold(job.client, job.rid, handed)
        self._deadlines.add(job.deadline, handed)
        service.requests += 1
        self._enqueue(service, handed)
        self.counters["handed_off"] += 1
        return out + self._pump(service, now)

    def _leg_reply(
        self,
        state: WorkerState,
        job: Job,
        action: Action,
        user: dict[str, str],
        body: Sequence[bytes],
        now: float,
        code: int,
        reason: str,
    ) -> list[Out]:
        worker = job.worker
        assert worker is not None
        fields: dict[str, str] = {Header.WORKER: worker.name}
        if action is Action.REPLY_ERROR:
            fields[Header.CODE] = str(code)
            fields[Header.MESSAGE] = reason
        client = job.client
        partial = client.dialect.partial(job.rid, job.service, fields, user, body)
        out: list[Out] = [(client.routing_id, partial)] if partial is not None else []
        if action is Action.FORWARD:
            return out
        state.served += 1
        out += self._release(worker, job, now)
        out += self._leg_done(job, answered=True, now=now)
        return out

    def route_reply(
        self,
        route: Peer,
        verb: Verb,
        bid: str,
        fields: dict[str, str],
        user: dict[str, str],
        body: Sequence[bytes],
        now: float,
    ) -> list[Out]:
        """PARTIAL / FINAL from another broker for a job it holds: a scatter leg's PARTIALs keep the
        WORKER (CODE, MESSAGE) it named, and its FINAL's COUNT n MISSING m count n + m workers."""
        state = self.workers.get(route)
        job = state.jobs.get(bid) if state is not None else None
        if job is None or state is None or job.parent is None:
            return self.reply(route, verb, bid, user, body, now)
        if verb is Verb.PARTIAL:
            self._fire(job, JobEvent.PARTIAL)
            partial = job.client.dialect.partial(job.rid, job.service, fields, user, body)
            return [(job.client.routing_id, partial)] if partial is not None else []
        self._fire(job, JobEvent.FINAL)
        gather = job.parent
        count, missing = (decimal(fields.get(h, "0")) or 0 for h in (Header.COUNT, Header.MISSING))
        gather.total += count + missing - 1
        gather.answered += count
        state.served += 1
        return self._release(route, job, now) + self._leg_done(job, answered=False, now=now)

    def route_error(self, route: Peer, bid: str, code: int, reason: str, now: float) -> list[Out]:
        """ERROR from another broker for a job it holds: its verdict as it is (no mapping to 500: it is a
        broker, not a worker); 503 (it has no worker for it any more) puts the job back in the queue
        for another worker while attempts remain."""
        state = self.workers.get(route)
        job = state.jobs.get(bid) if state is not None else None
        retry = job is not None and job.parent is None and job.attempts < self.settings.max_attempts
        if job is None or not retry or code != Status.NO_WORKER or job.state is not JobState.ASSIGNED:
            return self.reply(route, Verb.ERROR, bid, {}, (), now, code, reason)
        self._fire(job, JobEvent.WORKER_LOST)
        self.pool.released(route, job, False)
        job.worker = None
        self._requeue(job, now)
        return self._pump(self.pool.service(job.service), now)

    def _requeue(self, job: Job, now: float) -> None:
        """Back to the front of its queue after its worker was lost; if no worker serves it when
        ``ORPHAN_GRACE`` has passed (none restarted, no broker's route came back), 502 then."""
        self.counters["requests_requeued"] += 1
        self._enqueue(self.pool.service(job.service), job, front=True)
        self._orphans.add(now + ORPHAN_GRACE, job)

    def _leg_done(self, job: Job, *, answered: bool, now: float) -> list[Out]:
        """A scatter leg finished (``answered``) or lost its worker."""
        gather = job.parent
        assert gather is not None
        gather.legs.pop(job.bid, None)
        if answered:
            gather.answered += 1
        event = GatherEvent.LEG_DONE if gather.legs else GatherEvent.LAST_LEG_DONE
        gather.state, action = gather_transition(gather.state, event)
        return self._summary(gather, now) if action is Action.SUMMARY else []

    def _summary(self, gather: Scatter, now: float) -> list[Out]:
        client = gather.client
        self._forget_request(client, gather.rid)
        out = self._stop_work(gather, now)  # legs still out: cancelled, counted missing
        missing = gather.total - gather.answered
        fields: dict[str, str] = {Header.COUNT: str(gather.answered), Header.MISSING: str(missing)}
        service = self.services.get(gather.service)
        if service is not None:
            service.served += 1
            service.latency.observe(now - gather.created)
        final = client.dialect.final(gather.rid, gather.service, fields, gather.user, ())
        out.append((client.routing_id, final))
        self._finished(gather.service, client, None, gather.created, 200, 0, 0, now)
        return out

    def _fail(self, job: Job, code: int, reason: str, now: float) -> list[Out]:
        """The terminal ERROR for a job the broker gave up on (502, 504)."""
        client = job.client
        held = self.requests.get(client)
        if held is not None and held.get(job.rid) is job:
            self._forget_request(client, job.rid)
        self._deadlines.discard(job)
        service = self.services.get(job.service)
        if service is not None:  # each failed request counts once: a 504 as a timeout, anything else an error
            if code == Status.DEADLINE:
                service.timeouts += 1
            else:
                service.errors += 1
        self.counters[f"requests_failed_{code}"] += 1
        self._finished(job.service, client, job.worker, job.created, code, job.size, job.bytes_out, now)
        if not self._is_current(client) or job.quiet:
            return []
        client.last_sent = now
        return [(client.routing_id, _error(client, job.rid, job.service, code, reason, job.user))]

    # ================================================================ peers going away, time
    def drop_peer(self, peer: Peer, now: float) -> list[Out]:
        """``peer`` is gone: its requests are dropped (workers told to stop); its jobs requeued or failed."""
        out: list[Out] = []
        for request in list(self.requests.pop(peer, {}).values()):
            self._deadlines.discard(request)
            if isinstance(request, Scatter):
                request.state, _ = gather_transition(request.state, GatherEvent.CLIENT_GONE)
            out += self._stop_work(request, now)
        state = self.pool.drop(peer)
        if state is None:
            return out

        held = list(state.jobs.values())
        state.jobs.clear()
        touched: dict[str, None] = {}
        for job in held:
            job.worker = None
            if job.parent is not None:
                self._fire(job, JobEvent.WORKER_LOST_LAST)
                out += self._leg_done(job, answered=False, now=now)
                continue
            forwarded = job.state is JobState.FORWARDING
            retry = job.attempts < self.settings.max_attempts
            action = self._fire(job, JobEvent.WORKER_LOST if retry else JobEvent.WORKER_LOST_LAST)
            if action is Action.REQUEUE:
                self._requeue(job, now)
                touched[job.service] = None
            else:
                why = "after replies were forwarded" if forwarded else f"after {job.attempts} attempts"
                out += self._fail(job, Status.WORKER_LOST, f"worker lost {why}", now)
        for name in touched:
            out += self._pump(self.pool.service(name), now)
        for name in list(self.services):
            self.pool.drop_if_idle(name)
        return out

    def expire(self, now: float) -> list[Out]:
        """Requests whose deadline passed: 504 (a scatter: its FINAL with what arrived)."""
        out: list[Out] = []
        for job in self._orphans.pop_due(now):
            service = self.services.get(job.service)
            if job.state is JobState.QUEUED and (service is None or not service.workers):
                self._fire(job, JobEvent.ORPHANED)
                reason = f"worker lost; no other serves {job.service} ({ORPHAN_GRACE:g} s)"
                out += self._fail(job, Status.WORKER_LOST, reason, now)

        for request in self._deadlines.pop_due(now):
            if request.done:
                continue
            if isinstance(request, Scatter):
                request.state, action = gather_transition(request.state, GatherEvent.DEADLINE)
                out += self._summary(request, now)
                continue
            action = self._fire(request, JobEvent.DEADLINE)
            assert action is Action.FAIL_DEADLINE
            out += self._stop_work(request, now)  # the worker, if any, is told CANCEL
            self.counters["deadline_expired"] += 1
            ms = round((request.deadline - request.created) * 1000)
            out += self._fail(request, Status.DEADLINE, f"deadline of {ms} ms passed", now)
        return out

    def next_deadline(self) -> float | None:
        due = [d for d in (self._deadlines.next_due(), self._orphans.next_due()) if d is not None]
        return min(due, default=None)

    # ================================================================ telemetry and reports
    def _finished(
        self,
        service: str,
        client: Peer,
        worker: Peer | None,
        created: float,
        status: int,
        bytes_in: int,
        bytes_out: int,
        now: float,
    ) -> None:
        if self._wants_telemetry():  # the common case: one cached lookup per finished request
            name = worker.name if worker is not None else None
            latency_ms = round((now - created) * 1000.0, 3)
            record = RpcDone(service, client.identity, name, latency_ms, status, bytes_in, bytes_out)
            self._done.append(record)

    def take_finished(self) -> list[RpcDone]:
        """The mc0.sys.rpc records of the requests finished since the last call, handed over (oldest
        first); the room starts a new list."""
        done = self._done
        if done:
            self._done = []
        return done

    def has_requests(self, peer: Peer) -> bool:
        return bool(self.requests.get(peer))

    def worker_state(self, peer: Peer) -> WorkerState | None:
        return self.workers.get(peer)

    # What mc0.broker's reports and MMI read (builtin_services.ServiceBoard): figures, never the containers.
    def serves(self, service: str) -> bool:
        """``service`` has a worker (here or a route)."""
        known = self.services.get(service)
        return known is not None and bool(known.workers)

    def services_report(self) -> dict[str, dict[str, object]]:
        """Each service's figures (``service_report``), by name."""
        return {name: self.service_report(s) for name, s in sorted(self.services.items())}

    def service_report(self, service: Service) -> dict[str, object]:
        return {
            "workers": len(service.workers),
            "idle": len(service.ready),
            "queued": service.queued,
            "in_flight": self._in_flight(service),
            "requests": service.requests,
            "served": service.served,
            "errors": service.errors,
            "timeouts": service.timeouts,
            # From the latency histogram's buckets, as PromQL's histogram_quantile (one definition).
            "latency_ms": service.latency.percentiles_ms(),
        }

    def _in_flight(self, service: Service) -> int:
        workers = self.workers
        return sum(1 for w in service.workers for j in workers[w].jobs.values() if j.service == service.name)

    def service_totals(self) -> dict[str, int]:
        """How many services, requests queued and requests held by workers, in all."""
        return {
            "services": len(self.services),
            "queued": sum(s.queued for s in self.services.values()),
            "in_flight": sum(len(w.jobs) for w in self.workers.values()),
        }

    def worker_figures(self, peer: Peer) -> dict[str, object]:
        """``peer`` as a worker (what it serves, its capacity, requests held and served) and as a client
        (its requests outstanding): zeros for a peer that is neither."""
        state = self.workers.get(peer)
        return {
            "services": list(state.services) if state else [],
            "capacity": state.capacity if state else 0,
            "in_flight": len(state.jobs) if state else 0,
            "served": state.served if state else 0,
            "requests_outstanding": len(self.requests.get(peer, ())),
        }

    def route_capacity(self, route: Peer) -> dict[str, int]:
        """A route's (another broker's) capacity per service, as it announced it (a copy)."""
        state = self.workers.get(route)
        return dict(state.per_service or {}) if state is not None else {}


_REPLY_EVENTS = {
    Verb.PARTIAL: JobEvent.PARTIAL,
    Verb.FINAL: JobEvent.FINAL,
    Verb.ERROR: JobEvent.WORKER_ERROR,
}


def _error(client: Peer, rid: str, service: str, code: int, reason: str, user: dict[str, str]) -> list[bytes]:
    """The ERROR answering a request, with the request's trace context for an mc0 client (a
    foreign dialect's error has no headers; a route's broker adds it for its own client)."""
    frames = client.dialect.error(rid, service, code, reason)
    if user and client.dialect.name == "mc0":
        frames += trace_frames(user)
    return frames
