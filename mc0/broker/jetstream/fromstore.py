"""What JetStream (the replicated store) says, handed to the core: the entry points of the shell.

Contract: the cluster link's JetStream part reports four things, and the shell
(:mod:`mc0.broker.listeners`) hands each to one function here, which returns
what to send:

- ``stored(rooms, journal, token, seq, duplicate, now)``: a proposal is in the
  stream (a quorum of its replicas holds it): its held OK goes out;
- ``failed(rooms, journal, token, code, reason, now)``: it is not (504: no
  acknowledgement in time, the outcome unknown; 507: refused; 429: a bound);
- ``arrived(rooms, journal, records, now)``: records the stream delivered, in
  seq order, ``(record, origin)`` each, already in this broker's local copy:
  fanned out to this broker's own subscribers (replays of that journal
  reach them in order: their live copies are held back); ``listening(rooms)``
  says whether there is anyone to fan out to (else the shell skips it);
- ``answered(rooms, token, data, records, now)``: the answer to a store call
  (consumers, mailboxes: :mod:`.storecalls`).

``calls(rooms)`` is what the core asks of the store since the last turn.  Each
function adds what just finished (dead letters a pull found, telemetry), as
every input does.  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...message import Record
from ..core.peers import Out
from ..core.rooms import Rooms


def stored(rooms: Rooms, journal: str, token: int, seq: int, duplicate: bool, now: float) -> list[Out]:
    return rooms.replication.stored(journal, token, seq, duplicate)


def failed(rooms: Rooms, journal: str, token: int, code: int, reason: str, now: float) -> list[Out]:
    return rooms.replication.failed(journal, token, code, reason)


def listening(rooms: Rooms) -> bool:
    """Whether ``arrived`` has anything to do (else the shell need not decode the records)."""
    return rooms.replication.listening()


def arrived(rooms: Rooms, journal: str, records: Sequence[tuple[Record, str]], now: float) -> list[Out]:
    kept = rooms.journaling.journal(journal)
    if kept is None:
        rooms.counters["replicated_unknown_journal"] += len(records)
        return []
    return rooms.with_finished(rooms.replication.arrived(kept, records, now), now)


def answered(rooms: Rooms, token: int, data: dict[str, Any], records: Sequence[Record], now: float) -> list[Out]:
    return rooms.with_finished(rooms.calls.answer(token, data, records, now), now)


def calls(rooms: Rooms) -> list[tuple[int, dict[str, Any]]]:
    return rooms.calls.drain()
