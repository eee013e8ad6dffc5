"""A worker's batch service, its state: the requests waiting for the handler's next call, and the call's.

Contract: :class:`RequestBatches` holds one batch service's requests (no I/O, no clock, no task):
those waiting for the handler's next call, in arrival order, and those of the call running now.
``take`` hands the next call up to ``max`` waiting requests (one call at a time: the requests that
arrive while it runs wait for the next one, as a subscriber's ``batches(max=...)`` gets what waited).
``drop`` forgets a request the broker has answered already (its CANCEL, its deadline): a waiting one
is never handed to the handler; a running one gets no reply from this worker, and when no request
of the running call is left to answer ``drop`` says so (the worker then cancels the call).
``finish`` ends the running call and names the requests it must still answer.
"""

from __future__ import annotations

from ..message import Request


class RequestBatches:
    """One batch service's requests, waiting or in the running call."""

    def __init__(self, service: str, max: int) -> None:
        if max < 1:
            raise ValueError("max must be at least 1")
        self.service = service
        self.max = max
        self.waiting: dict[str, Request] = {}  # by id, in arrival order
        self.running: dict[str, Request] = {}  # the running call's requests not yet dropped
        self._call_size = 0  # how many requests the running call was handed (0: none runs)

    @property
    def busy(self) -> bool:
        """Whether any request waits, or a call runs."""
        return bool(self.waiting) or self._call_size > 0

    def add(self, request: Request) -> None:
        self.waiting[request.id] = request

    def take(self) -> list[Request]:
        """The next call's requests: up to ``max`` of those waiting, oldest first (empty: none wait).
        Called once the previous call finished."""
        if self._call_size:
            raise RuntimeError("a batch call is still running")
        ids = list(self.waiting)[: self.max]
        taken = [self.waiting.pop(bid) for bid in ids]
        self.running = {request.id: request for request in taken}
        self._call_size = len(taken)
        return taken

    def drop(self, bid: str) -> bool:
        """Forget ``bid`` (answered by the broker); True when the running call has nothing left to answer."""
        if self.waiting.pop(bid, None) is not None:
            return False
        if self.running.pop(bid, None) is None:
            return False
        return self._call_size > 0 and not self.running

    def finish(self) -> dict[str, Request]:
        """End the running call: its requests still owed an answer, by id."""
        owed, self.running = self.running, {}
        self._call_size = 0
        return owed

    def clear(self) -> list[str]:
        """Forget everything (the worker closed): the ids it held."""
        ids = [*self.waiting, *self.running]
        self.waiting.clear()
        self.running.clear()
        self._call_size = 0
        return ids
