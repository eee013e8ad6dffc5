"""Workers: which peer serves which service, with what capacity, and who is free to take a job next.

Contract: owns the services (:class:`Service`: workers, the least-recently-used
list of those with spare capacity, the :class:`FairQueue` the :mod:`.rpc` room
fills) and each worker's :class:`WorkerState`.
A worker is a peer that said READY (one capacity for all it serves) or a
*route*, another broker of the cluster, which announces each service with
the total capacity of its own workers (one count per service).  ``pick``
chooses the worker for a job (least recently used with spare capacity; a
job that came from a route goes to this broker's own workers only: one hop),
``took``/``released`` keep the counts, and what they return are the services
whose queue may now move.  Decides nothing about requests: :mod:`.rpc` does.
Pure: no sockets, no clock.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator

from ...errors import InvalidTopic, ProtocolError
from ...permissions import Grants
from ...protocol import MAX_SERVICE_BYTES, Status
from ...settings import CoreSettings
from ...topics import split_topic
from .histogram import Histogram
from .jobs import Job
from .peers import Peer

log = logging.getLogger("mc0.broker")

SERVICE_CACHE_SIZE = 4096


class WorkerState:
    """What a peer serves and holds as a worker: one capacity for all it serves, or, for a route
    (another broker), a capacity per service (its own workers' total for each)."""

    __slots__ = ("services", "capacity", "jobs", "served", "per_service", "_held")

    def __init__(self) -> None:
        self.services: tuple[str, ...] = ()
        self.capacity = 0
        self.jobs: dict[str, Job] = {}  # bid -> request held
        self.served = 0
        self.per_service: dict[str, int] | None = None  # a route's capacity for each service
        self._held: dict[str, int] = {}  # a route's jobs held per service

    def full(self, service: str) -> bool:
        """No room for another job of ``service``."""
        if self.per_service is None:
            return len(self.jobs) >= self.capacity
        return self._held.get(service, 0) >= self.per_service.get(service, 0)

    def took(self, service: str) -> None:
        if self.per_service is not None:
            self._held[service] = self._held.get(service, 0) + 1

    def released(self, service: str) -> None:
        if self.per_service is not None and self._held.get(service, 0) > 0:
            self._held[service] -= 1


class FairQueue:
    """A service's waiting jobs, served round robin between clients (each client's in its order).

    One client that queues thousands of requests cannot starve another: the
    next job comes from the client whose turn it is, which then goes to the
    back of the rotation.  O(1) per append and pop (dict order is the rotation).
    """

    __slots__ = ("_lanes",)

    def __init__(self, jobs: Iterable[Job] = ()) -> None:
        self._lanes: dict[Peer, deque[Job]] = {}
        for job in jobs:
            self.append(job)

    def append(self, job: Job) -> None:
        lane = self._lanes.get(job.client)
        if lane is None:
            lane = self._lanes[job.client] = deque()
        lane.append(job)

    def appendleft(self, job: Job) -> None:
        """A job to serve next (a retry): first in its client's lane, and that client's turn first."""
        lane = self._lanes.pop(job.client, None) or deque()
        lane.appendleft(job)
        self._lanes = {job.client: lane, **self._lanes}

    def popleft(self) -> Job:
        client, lane = next(iter(self._lanes.items()))
        job = lane.popleft()
        del self._lanes[client]
        if lane:
            self._lanes[client] = lane  # to the back of the rotation
        return job

    def first(self) -> Job:
        """The job ``popleft`` would return (the queue is not empty)."""
        return next(iter(self._lanes.values()))[0]

    def __len__(self) -> int:
        return sum(map(len, self._lanes.values()))

    def __bool__(self) -> bool:
        return bool(self._lanes)

    def __iter__(self) -> Iterator[Job]:
        for lane in list(self._lanes.values()):
            yield from lane


class Service:
    __slots__ = (
        "name",
        "workers",
        "ready",
        "queue",
        "queued",
        "dead",
        "served",
        "errors",
        "timeouts",
        "latency",
        "requests",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.workers: dict[Peer, None] = {}
        # Workers with spare capacity, least recently used first.
        self.ready: dict[Peer, None] = {}
        self.queue = FairQueue()  # QUEUED jobs, and DONE ones not yet swept out; fair between clients
        self.queued = 0  # the QUEUED jobs in ``queue``: what the queue limit counts
        self.dead = 0  # the DONE jobs still in ``queue`` (ended while waiting)
        # Each request taken ends once as one of: served (a FINAL), an error (the worker's ERROR, 502 and
        # the like) or a timeout (504): errors + timeouts are the failed requests, none counted twice.
        self.requests = 0
        self.served = 0
        self.errors = 0
        self.timeouts = 0
        self.latency = Histogram()  # request -> answer, seconds: mc0 stats and /metrics


class Workers:
    def __init__(self, settings: CoreSettings) -> None:
        self.settings = settings
        self._service_names: dict[str, tuple[str, ...]] = {}
        self.services: dict[str, Service] = {}
        self.workers: dict[Peer, WorkerState] = {}
        # Each service's total capacity over this broker's own workers (what routes are told).
        self.local_capacity: Counter[str] = Counter()
        self.capacity_changed: set[str] = set()  # services whose local capacity changed (routeinput.news drains it)

    # ------------------------------------------------------------ names and permissions
    def service_name(self, raw: str | bytes, request_id: str | None) -> str:
        name = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        self.service_tokens(name, request_id)
        return name

    def service_tokens(self, name: str, request_id: str | None) -> tuple[str, ...]:
        tokens = self._service_names.get(name)  # validated once, not per request
        if tokens is None:
            try:
                tokens = split_topic(
                    name, max_bytes=MAX_SERVICE_BYTES, max_tokens=self.settings.limits.max_topic_tokens
                )
            except InvalidTopic as exc:
                raise ProtocolError(Status.BAD_REQUEST, f"service name: {exc}", request_id) from None
            if len(self._service_names) >= SERVICE_CACHE_SIZE:
                self._service_names.clear()
            self._service_names[name] = tokens
        return tokens

    def check_serve(self, peer: Peer, name: str, request_id: str | None, reserved: frozenset[str]) -> None:
        if name in reserved:
            raise ProtocolError(Status.FORBIDDEN, f"service {name} is the broker's own", request_id)
        if not peer.grants.may_serve(self.service_tokens(name, request_id)):
            raise ProtocolError(Status.FORBIDDEN, f"{peer.identity} may not serve {name}", request_id)

    def check_capacity(self, capacity: int, request_id: str | None) -> None:
        if capacity > self.settings.max_capacity:
            raise ProtocolError(
                Status.BAD_REQUEST, f"CAPACITY {capacity} exceeds {self.settings.max_capacity}", request_id
            )

    def service(self, name: str) -> Service:
        service = self.services.get(name)
        if service is None:
            service = self.services[name] = Service(name)
        return service

    def drop_if_idle(self, name: str) -> None:
        service = self.services.get(name)
        if service is not None and not service.workers and not service.queued:
            del self.services[name]

    def has_local(self, service: Service) -> bool:
        """Some worker of ``service`` is this broker's own (a route's job may go there)."""
        return any(not w.route for w in service.workers)

    # ------------------------------------------------------------ capacity as routes see it
    def _count(self, worker: Peer, state: WorkerState, sign: int) -> None:
        if worker.route:
            return
        for name in state.services:
            self.local_capacity[name] += sign * state.capacity
            if self.local_capacity[name] <= 0:
                del self.local_capacity[name]
            self.capacity_changed.add(name)

    # ------------------------------------------------------------ registration
    def ready(self, worker: Peer, names: tuple[str, ...], capacity: int) -> list[Service]:
        """Register (or re-register) a worker for ``names`` with one ``capacity``; the services to pump."""
        state = self.workers.get(worker)
        if state is None:
            state = self.workers[worker] = WorkerState()
        self._count(worker, state, -1)
        for old in state.services:
            if old not in names and old in self.services:
                self.services[old].workers.pop(worker, None)
                self.services[old].ready.pop(worker, None)
                self.drop_if_idle(old)
        state.services = names
        state.capacity = capacity
        self._count(worker, state, +1)
        for name in names:
            service = self.service(name)
            service.workers[worker] = None
            if state.full(name):
                service.ready.pop(worker, None)  # full at its (new) capacity: no more until a slot frees
            elif worker not in service.ready:
                # Never used is least recently used: a new worker goes first.
                service.ready = {worker: None, **service.ready}
            log.info("worker %s serves %s (capacity %d)", worker.name, name, capacity)
        return [self.services[name] for name in names]

    def route_ready(self, route: Peer, name: str, capacity: int) -> list[Service]:
        """Another broker serves ``name`` with ``capacity`` in all (0: no longer); the services to pump."""
        state = self.workers.get(route)
        if state is None:
            state = self.workers[route] = WorkerState()
            state.per_service = {}
        assert state.per_service is not None
        if capacity > 0:
            state.per_service[name] = capacity
        else:
            state.per_service.pop(name, None)
        state.services = tuple(state.per_service)
        service = self.service(name) if capacity > 0 else self.services.get(name)
        if service is None:
            return []
        if capacity <= 0:
            service.workers.pop(route, None)
            service.ready.pop(route, None)
            self.drop_if_idle(name)
            return []
        service.workers[route] = None
        if state.full(name):
            service.ready.pop(route, None)
        elif route not in service.ready:
            service.ready[route] = None  # behind this broker's own idle workers: they answer sooner
        return [service]

    def withdraw_denied(
        self, peer: Peer, grants: Grants, tokens_of: Callable[[str], tuple[str, ...]]
    ) -> tuple[tuple[str, ...], str]:
        """What ``peer`` may still serve under ``grants``, and what it may not (``""``: nothing changes)."""
        state = self.workers.get(peer)
        if state is None or not state.services or peer.route:
            return (), ""
        kept = tuple(n for n in state.services if grants.may_serve(tokens_of(n)))
        if kept == state.services:
            return (), ""
        return kept, ", ".join(n for n in state.services if n not in kept)

    # ------------------------------------------------------------ dispatch bookkeeping
    def pick(self, service: Service, job: Job) -> Peer | None:
        """The worker ``job`` goes to now (None: none may take it)."""
        ready = service.ready
        worker = next(iter(ready), None)
        if worker is not None and worker.route and job.client.route:
            worker = next((w for w in ready if not w.route), None)  # one hop: never on to a third broker
        return worker

    def took(self, worker: Peer, job: Job) -> WorkerState:
        """``worker`` now holds ``job``: it goes to the back of the least-recently-used order, or
        out of it for each service it has no room left for."""
        state = self.workers[worker]
        state.jobs[job.bid] = job
        state.took(job.service)
        for name in state.services:
            ready = self.services[name].ready
            ready.pop(worker, None)
            if not state.full(name):
                ready[worker] = None  # now the most recently used
        return state

    def released(self, worker: Peer, job: Job, current: bool) -> list[Service]:
        """``worker`` no longer holds ``job``; the services whose queues it may now serve, oldest
        waiting request first (none when it is gone, ``current`` False, or still full)."""
        state = self.workers.get(worker)
        if state is None or state.jobs.pop(job.bid, None) is None:
            return []
        state.released(job.service)
        if not current:
            return []
        heads: list[tuple[float, Service]] = []
        for name in state.services:
            if state.full(name):
                continue
            service = self.services[name]
            if worker not in service.ready:
                service.ready[worker] = None
            if service.queued:
                heads.append((service.queue.first().created, service))
        return [service for _, service in sorted(heads, key=lambda h: h[0])]

    def drop(self, peer: Peer) -> WorkerState | None:
        """``peer`` is gone: it serves nothing any more; its state (and the jobs it held) returned."""
        state = self.workers.pop(peer, None)
        if state is None:
            return None
        self._count(peer, state, -1)
        for name in state.services:
            service = self.services.get(name)
            if service is not None:
                service.workers.pop(peer, None)
                service.ready.pop(peer, None)
        return state
