"""What JetStream (the replicated store) says, handed to the core: the entry points of the shell.

Contract: the cluster link's JetStream part reports four things, and the shell
(:mod:`mc0.broker.listeners`) hands each to one function here, which returns
what to send:

- ``stored(core, journal, token, seq, duplicate, now)``: a proposal is in the
  stream (a quorum of its replicas holds it): its held OK goes out;
- ``failed(core, journal, token, code, reason, now)``: it is not (504: no
  acknowledgement in time, the outcome unknown; 507: refused; 429: a bound);
- ``arrived(core, journal, records, now)``: records the stream delivered, in
  seq order, ``(record, origin)`` each, already in this broker's local copy:
  fanned out to this broker's own subscribers (replays of that journal
  reach them in order: their live copies are held back); ``listening(core)``
  says whether there is anyone to fan out to (else the shell skips it);
- ``answered(core, token, data, records, now)``: the answer to a store call
  (consumers, mailboxes: :mod:`.storecalls`).

``calls(core)`` is what the core asks of the store since the last turn.  Each
function adds what just finished (dead letters a pull found, telemetry), as
every input does.  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...message import Record
from ..core.peers import Out

if TYPE_CHECKING:
    from ..core.dispatch import BrokerCore


def stored(core: BrokerCore, journal: str, token: int, seq: int, duplicate: bool, now: float) -> list[Out]:
    return core.replication.stored(journal, token, seq, duplicate)


def failed(core: BrokerCore, journal: str, token: int, code: int, reason: str, now: float) -> list[Out]:
    return core.replication.failed(journal, token, code, reason)


def listening(core: BrokerCore) -> bool:
    """Whether ``arrived`` has anything to do (else the shell need not decode the records)."""
    return core.replication.listening()


def arrived(core: BrokerCore, journal: str, records: Sequence[tuple[Record, str]], now: float) -> list[Out]:
    kept = core.journaling.journals.get(journal)
    if kept is None:
        core.counters["replicated_unknown_journal"] += len(records)
        return []
    return core.with_finished(core.replication.arrived(kept, records, now), now)


def answered(core: BrokerCore, token: int, data: dict[str, Any], records: Sequence[Record], now: float) -> list[Out]:
    return core.with_finished(core.calls.answer(token, data, records, now), now)


def calls(core: BrokerCore) -> list[tuple[int, dict[str, Any]]]:
    return core.calls.drain()
