"""CopyState: whether a JetStream journal's local copy follows its stream, and how far behind it is.

Contract: pure (``now`` is passed in; no I/O besides its log lines).  The
shell tells it what the copy's feed says (``feed``: its consumer runs, or
not and why), that the copy learnt the stream's state (``learnt``), and
calls ``watch`` with the copy's and the stream's ends once a loop turn.  A
copy is in one of these states (``state``, with ``reason`` when it is not
following):

- ``starting``: it has not learnt the stream's state since the broker
  started (its feed has not reached the stream yet; ``reason`` says why);
- ``following``: its feed's consumer runs and it holds what the stream is
  known to hold;
- ``catching_up``: its feed's consumer runs; the stream is known to hold
  ``lag`` records past it;
- ``restarting``: its feed makes its consumer again (``reason``: why it
  stopped, or why it cannot start again: no leader, no answer ...);
- ``stuck``: starting or restarting for ``STUCK_AFTER_S``, or catching up
  with no record arriving for as long.  Entering it is logged once (a
  warning naming the reason), and leaving it once;
- ``broken``: the copy cannot be written (``ReplicatedJournal.broken``)
  until a restart rebuilds it.

``lag`` is measured against what the broker knows of the stream (what it
acknowledged, what the feed reported): a copy whose feed cannot reach the
stream may be further behind than it says, and its state says so.
"""

from __future__ import annotations

import logging

from ...protocol import jetstream as jsw

log = logging.getLogger("mc0.journal")

# A copy that does not follow its stream (or follows it and gets nothing while behind) for this long is
# stuck: logged, shown, /healthz degraded.  A feed's consumer made again after a gap, a failover or a stall
# follows again well within it (a stall is found within 2 x feed.STALL_CHECK_S).
STUCK_AFTER_S = 10.0

STARTING, FOLLOWING, CATCHING_UP, RESTARTING, STUCK, BROKEN = (
    jsw.COPY_STARTING, jsw.COPY_FOLLOWING, jsw.COPY_CATCHING_UP, jsw.COPY_RESTARTING, jsw.COPY_STUCK, jsw.COPY_BROKEN
)  # fmt: skip


class CopyState:
    def __init__(self, journal: str, stream: str) -> None:
        self.journal = journal
        self.stream = stream
        self.state = STARTING
        self.reason = "the broker has not reached the stream yet"
        self.following = False  # the feed's consumer runs (what it said last)
        self.stuck_times = 0  # how often the copy got stuck
        self._learnt = False  # the copy learnt the stream's state since the broker started
        self._feed_reason = self.reason
        self._since: float | None = None  # since when it does not follow (None: not watched yet)
        self._moved_at: float | None = None  # when the copy last held all it knew of, or took a record
        self._copy_next = 0
        self._stuck_at = 0.0

    def feed(self, following: bool, reason: str, now: float) -> None:
        """What the copy's feed says: its consumer runs (``following``), or not, and why."""
        if following and not self.following:
            self._moved_at = now  # (the new consumer gets its time to deliver)
        if not following and (self.following or self._since is None):
            self._since = now
        self.following = following
        self._feed_reason = reason

    def learnt(self) -> None:
        """The copy was told the stream's state (by a stream that has a leader)."""
        self._learnt = True

    def watch(self, now: float, copy_next: int, stream_next: int, broken: str) -> None:
        """The state as of ``now``: the copy holds seqs before ``copy_next``, the stream is known to hold
        those before ``stream_next``; ``broken``: why the copy cannot be written ("" when it can)."""
        if self._since is None:
            self._since = now
        lag = max(0, stream_next - copy_next)
        if copy_next != self._copy_next or lag == 0 or self._moved_at is None:
            self._copy_next, self._moved_at = copy_next, now
        if broken:
            state, reason = BROKEN, f"the local copy cannot be written ({broken})"
        elif not self.following:
            state, reason = (RESTARTING if self._learnt else STARTING), self._feed_reason
            if now - self._since >= STUCK_AFTER_S:
                state = STUCK
        elif lag:
            state, reason = CATCHING_UP, ""
            if now - self._moved_at >= STUCK_AFTER_S:
                state = STUCK
                reason = (
                    f"its feed delivered nothing for {now - self._moved_at:.0f} s while the stream holds "
                    f"seq {stream_next - 1} and the copy ends at seq {copy_next - 1}"
                )
        else:
            state, reason = FOLLOWING, ""
        self._moved(state, reason, now, copy_next, lag)

    def _moved(self, state: str, reason: str, now: float, copy_next: int, lag: int) -> None:
        """Take the new state; entering or leaving ``stuck`` is logged, once each."""
        if state == STUCK and self.state != STUCK:
            self.stuck_times += 1
            self._stuck_at = now
            log.warning(
                "journal %s: the local copy of stream %s is stuck at seq %d (%d records behind what the broker "
                "knows the stream holds): %s; a replay or fetch here that reaches its end waits for it, then "
                "ends with 504",
                self.journal,
                self.stream,
                copy_next - 1,
                lag,
                reason,
            )
        elif self.state == STUCK and state != STUCK:  # (a warning too: seen beside the one it ends)
            log.warning(
                "journal %s: the local copy of stream %s is %s again, after %.1f s stuck",
                self.journal,
                self.stream,
                state.replace("_", " "),
                now - self._stuck_at,
            )
        self.state, self.reason = state, reason
