"""The RPC state machines as tables: every state x every event -> the one allowed outcome."""

from __future__ import annotations

import pytest

from mc0.broker.core.jobs import (
    GATHER_TRANSITIONS,
    JOB_TRANSITIONS,
    TERMINAL_ACTIONS,
    Action,
    GatherEvent,
    GatherState,
    JobEvent,
    JobState,
    gather_transition,
    job_transition,
)

Q, A, S, D = JobState.QUEUED, JobState.ASSIGNED, JobState.FORWARDING, JobState.DONE
E = JobEvent
X = Action

# (state, event) -> (new state, action), written out literally: the whole table.
JOB_TABLE: dict[tuple[JobState, JobEvent], tuple[JobState, Action]] = {
    (Q, E.DISPATCH): (A, X.DISPATCH),
    (Q, E.PARTIAL): (Q, X.IGNORE),
    (Q, E.FINAL): (Q, X.IGNORE),
    (Q, E.WORKER_ERROR): (Q, X.IGNORE),
    (Q, E.WORKER_LOST): (Q, X.IGNORE),
    (Q, E.WORKER_LOST_LAST): (Q, X.IGNORE),
    (Q, E.DEADLINE): (D, X.FAIL_DEADLINE),
    (Q, E.CANCEL): (D, X.FAIL_CANCELLED),
    (Q, E.CLIENT_GONE): (D, X.ABANDON),
    (Q, E.ORPHANED): (D, X.FAIL_LOST),  # put back after its worker was lost, and no worker came
    (A, E.DISPATCH): (A, X.IGNORE),
    (A, E.PARTIAL): (S, X.FORWARD),
    (A, E.FINAL): (D, X.REPLY_FINAL),
    (A, E.WORKER_ERROR): (D, X.REPLY_ERROR),
    (A, E.WORKER_LOST): (Q, X.REQUEUE),
    (A, E.WORKER_LOST_LAST): (D, X.FAIL_LOST),
    (A, E.DEADLINE): (D, X.FAIL_DEADLINE),
    (A, E.CANCEL): (D, X.FAIL_CANCELLED),
    (A, E.CLIENT_GONE): (D, X.ABANDON),
    (A, E.ORPHANED): (A, X.IGNORE),
    (S, E.DISPATCH): (S, X.IGNORE),
    (S, E.PARTIAL): (S, X.FORWARD),
    (S, E.FINAL): (D, X.REPLY_FINAL),
    (S, E.WORKER_ERROR): (D, X.REPLY_ERROR),
    (S, E.WORKER_LOST): (D, X.FAIL_LOST),  # replies were forwarded: never run twice
    (S, E.WORKER_LOST_LAST): (D, X.FAIL_LOST),
    (S, E.DEADLINE): (D, X.FAIL_DEADLINE),
    (S, E.CANCEL): (D, X.FAIL_CANCELLED),
    (S, E.CLIENT_GONE): (D, X.ABANDON),
    (S, E.ORPHANED): (S, X.IGNORE),
    **{(D, event): (D, X.IGNORE) for event in JobEvent},
}

OPEN, G = GatherState.OPEN, GatherState.DONE
GE = GatherEvent
GATHER_TABLE: dict[tuple[GatherState, GatherEvent], tuple[GatherState, Action]] = {
    (OPEN, GE.LEG_DONE): (OPEN, X.IGNORE),
    (OPEN, GE.LAST_LEG_DONE): (G, X.SUMMARY),
    (OPEN, GE.DEADLINE): (G, X.SUMMARY),
    (OPEN, GE.CANCEL): (G, X.FAIL_CANCELLED),
    (OPEN, GE.CLIENT_GONE): (G, X.ABANDON),
    **{(G, event): (G, X.IGNORE) for event in GatherEvent},
}


@pytest.mark.parametrize(("state", "event"), [(s, e) for s in JobState for e in JobEvent])
def test_every_job_state_and_event_has_exactly_the_written_outcome(state: JobState, event: JobEvent) -> None:
    assert job_transition(state, event) == JOB_TABLE[state, event]


@pytest.mark.parametrize(("state", "event"), [(s, e) for s in GatherState for e in GatherEvent])
def test_every_gather_state_and_event_has_exactly_the_written_outcome(state: GatherState, event: GatherEvent) -> None:
    assert gather_transition(state, event) == GATHER_TABLE[state, event]


@pytest.mark.parametrize("table", [JOB_TRANSITIONS, GATHER_TRANSITIONS], ids=["job", "gather"])
def test_a_terminal_action_is_exactly_a_transition_into_done(table: dict) -> None:  # type: ignore[type-arg]
    done = {JobState.DONE, GatherState.DONE}
    for (state, _event), (new, action) in table.items():
        into_done = new in done and state not in done
        assert (action in TERMINAL_ACTIONS) == into_done, (state, _event, new, action)


def test_any_sequence_of_events_yields_at_most_one_terminal_and_nothing_after_it() -> None:
    import itertools

    events = list(JobEvent)
    for length in range(1, 5):
        for sequence in itertools.product(events, repeat=length):
            state, terminals, after = JobState.QUEUED, 0, 0
            for event in sequence:
                state, action = job_transition(state, event)
                if terminals and action is not Action.IGNORE:
                    after += 1
                terminals += action in TERMINAL_ACTIONS
            assert terminals <= 1 and after == 0, sequence
