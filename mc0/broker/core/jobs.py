"""The life of an RPC request: two explicit state machines (after h11's ``_state.py``) and the records they move.

Contract: ``job_transition(state, event)`` and ``gather_transition(state,
event)`` are total functions over their enums: every (state, event) pair
has exactly one outcome, a new state and one :class:`Action` for the RPC
room (:mod:`mc0.broker.core.rpc`) to carry out.  "Exactly one terminal reply
per request" is visible here: only a transition *into* ``DONE`` carries a
terminal action, and ``DONE`` absorbs every later event as ``IGNORE`` (a
late or forged reply is dropped and counted).  Pure: no I/O, no time.

A *job* is one request to one worker (a plain REQUEST, or one leg of a
scatter).  A *gather* is the scatter itself: it ends with one FINAL
(``COUNT n MISSING m``) once every leg is done or its deadline passes.
:class:`Job` and :class:`Scatter` are the records these machines move (plain
data; the RPC room changes them); the services and worker states they are
queued in and held by are :mod:`.workers`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .peers import Peer


class JobState(Enum):
    __hash__ = object.__hash__  # members are singletons; Enum's own __hash__ is Python code (hot path)

    QUEUED = "queued"  # waiting in its service's queue for a worker
    ASSIGNED = "assigned"  # held by a worker; nothing forwarded to the client yet (may be retried)
    FORWARDING = "forwarding"  # a PARTIAL was forwarded to the client: never retried after this
    DONE = "done"  # its one terminal reply was sent (or nobody is left to receive it)


class JobEvent(Enum):
    __hash__ = object.__hash__  # members are singletons; Enum's own __hash__ is Python code (hot path)

    DISPATCH = "dispatch"  # a worker with spare capacity takes it
    PARTIAL = "partial"  # the worker sent a PARTIAL
    FINAL = "final"  # the worker sent its FINAL
    WORKER_ERROR = "worker_error"  # the worker sent ERROR (its handler failed)
    WORKER_LOST = "worker_lost"  # the worker vanished; attempts are left
    WORKER_LOST_LAST = "worker_lost_last"  # the worker vanished; no attempt is left (or a scatter leg)
    DEADLINE = "deadline"  # the request's deadline passed
    CANCEL = "cancel"  # the client sent CANCEL
    CLIENT_GONE = "client_gone"  # the client vanished: nobody to answer
    # Put back in the queue when its worker was lost, it waited a grace period for another worker
    # (a worker restarting, another broker's route coming back) and none serves its service.
    ORPHANED = "orphaned"


class Action(Enum):
    __hash__ = object.__hash__  # members are singletons; Enum's own __hash__ is Python code (hot path)

    DISPATCH = "dispatch"  # send the REQUEST to the worker
    FORWARD = "forward"  # forward the PARTIAL to the client
    REPLY_FINAL = "reply_final"  # terminal: the worker's FINAL to the client
    REPLY_ERROR = "reply_error"  # terminal: the worker's ERROR to the client
    REQUEUE = "requeue"  # back to the front of its service's queue
    FAIL_LOST = "fail_lost"  # terminal: 502 to the client
    FAIL_DEADLINE = "fail_deadline"  # terminal: 504 to the client (CANCEL to a worker holding it)
    FAIL_CANCELLED = "fail_cancelled"  # terminal: 499 to the client (CANCEL to a worker holding it)
    ABANDON = "abandon"  # terminal, silent: CANCEL to a worker holding it
    SUMMARY = "summary"  # terminal (gather): FINAL COUNT n MISSING m, remaining legs cancelled
    IGNORE = "ignore"  # nothing to do (a late or unexpected event)


TERMINAL_ACTIONS = frozenset(
    {
        Action.REPLY_FINAL,
        Action.REPLY_ERROR,
        Action.FAIL_LOST,
        Action.FAIL_DEADLINE,
        Action.FAIL_CANCELLED,
        Action.ABANDON,
        Action.SUMMARY,
    }
)

_HELD = (JobState.ASSIGNED, JobState.FORWARDING)


def _job_table() -> dict[tuple[JobState, JobEvent], tuple[JobState, Action]]:
    table: dict[tuple[JobState, JobEvent], tuple[JobState, Action]] = {}
    for state in JobState:
        for event in JobEvent:
            table[state, event] = (state, Action.IGNORE)
    table[JobState.QUEUED, JobEvent.DISPATCH] = (JobState.ASSIGNED, Action.DISPATCH)
    for state in _HELD:
        table[state, JobEvent.PARTIAL] = (JobState.FORWARDING, Action.FORWARD)
        table[state, JobEvent.FINAL] = (JobState.DONE, Action.REPLY_FINAL)
        table[state, JobEvent.WORKER_ERROR] = (JobState.DONE, Action.REPLY_ERROR)
        table[state, JobEvent.WORKER_LOST_LAST] = (JobState.DONE, Action.FAIL_LOST)
    table[JobState.ASSIGNED, JobEvent.WORKER_LOST] = (JobState.QUEUED, Action.REQUEUE)
    table[JobState.QUEUED, JobEvent.ORPHANED] = (JobState.DONE, Action.FAIL_LOST)
    # Replies were forwarded: running it again could repeat them.
    table[JobState.FORWARDING, JobEvent.WORKER_LOST] = (JobState.DONE, Action.FAIL_LOST)
    for state in (JobState.QUEUED, *_HELD):
        table[state, JobEvent.DEADLINE] = (JobState.DONE, Action.FAIL_DEADLINE)
        table[state, JobEvent.CANCEL] = (JobState.DONE, Action.FAIL_CANCELLED)
        table[state, JobEvent.CLIENT_GONE] = (JobState.DONE, Action.ABANDON)
    return table


JOB_TRANSITIONS = _job_table()


def job_transition(state: JobState, event: JobEvent) -> tuple[JobState, Action]:
    return JOB_TRANSITIONS[state, event]


class GatherState(Enum):
    __hash__ = object.__hash__  # members are singletons; Enum's own __hash__ is Python code (hot path)

    OPEN = "open"  # legs outstanding
    DONE = "done"


class GatherEvent(Enum):
    __hash__ = object.__hash__  # members are singletons; Enum's own __hash__ is Python code (hot path)

    LEG_DONE = "leg_done"  # a leg answered (FINAL or ERROR) or lost its worker; others remain
    LAST_LEG_DONE = "last_leg_done"  # ... and it was the last outstanding leg
    DEADLINE = "deadline"
    CANCEL = "cancel"
    CLIENT_GONE = "client_gone"


def _gather_table() -> dict[tuple[GatherState, GatherEvent], tuple[GatherState, Action]]:
    table = {(GatherState.DONE, event): (GatherState.DONE, Action.IGNORE) for event in GatherEvent}
    table[GatherState.OPEN, GatherEvent.LEG_DONE] = (GatherState.OPEN, Action.IGNORE)
    table[GatherState.OPEN, GatherEvent.LAST_LEG_DONE] = (GatherState.DONE, Action.SUMMARY)
    # A scatter's deadline is not a failure: what arrived is the answer, the rest is MISSING.
    table[GatherState.OPEN, GatherEvent.DEADLINE] = (GatherState.DONE, Action.SUMMARY)
    table[GatherState.OPEN, GatherEvent.CANCEL] = (GatherState.DONE, Action.FAIL_CANCELLED)
    table[GatherState.OPEN, GatherEvent.CLIENT_GONE] = (GatherState.DONE, Action.ABANDON)
    return table


GATHER_TRANSITIONS = _gather_table()


def gather_transition(state: GatherState, event: GatherEvent) -> tuple[GatherState, Action]:
    return GATHER_TRANSITIONS[state, event]


# ---------------------------------------------------------------- records


class Job:
    """One request to one worker (a plain REQUEST, or one leg of a scatter)."""

    __slots__ = (
        "bid",
        "client",
        "rid",
        "service",
        "user",
        "body",
        "created",
        "deadline",
        "attempts",
        "worker",
        "state",
        "parent",
        "size",
        "bytes_out",
        "quiet",
        "caller",
    )

    def __init__(
        self,
        bid: str,
        client: Peer,
        rid: str,
        service: str,
        user: dict[str, str],
        body: Sequence[bytes],
        now: float,
        deadline: float,
        parent: Scatter | None = None,
        *,
        quiet: bool = False,
        caller: str | None = None,
    ) -> None:
        self.bid = bid
        self.client = client
        self.rid = rid
        self.service = service
        self.user = user
        self.body = body
        self.created = now
        self.deadline = deadline
        self.attempts = 0
        self.worker: Peer | None = None
        self.state = JobState.QUEUED
        self.parent = parent
        self.size = sum(map(len, body))
        self.bytes_out = 0
        self.quiet = quiet  # the client wants no answer (eMQP without reply-requested): none is sent
        self.caller = caller  # who asked, when the client is a route (another broker): its client's identity

    @property
    def done(self) -> bool:
        return self.state is JobState.DONE


class Scatter:
    """A REQUEST ... ALL 1: one Job leg per worker, then FINAL COUNT n MISSING m."""

    __slots__ = ("client", "rid", "service", "user", "deadline", "legs", "total", "answered", "state", "created")

    def __init__(self, client: Peer, rid: str, service: str, user: dict[str, str], now: float, deadline: float):
        self.client = client
        self.rid = rid
        self.service = service
        self.user = user
        self.created = now
        self.deadline = deadline
        self.legs: dict[str, Job] = {}  # bid -> leg still outstanding
        self.total = 0
        self.answered = 0
        self.state = GatherState.OPEN

    @property
    def done(self) -> bool:
        return self.state is GatherState.DONE


Request = Job | Scatter
