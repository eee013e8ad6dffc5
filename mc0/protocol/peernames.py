"""A peer's name: how clients and operators see and name a connection (never its routing id).

Contract: pure functions, no I/O.  A standalone broker names each peer
``identity#n`` (its authenticated identity, ``anonymous`` without CURVE,
and a serial the broker counts up from where its run starts, so that no
run repeats a name an earlier run of it gave: :func:`first_serial`); a broker of a cluster names it
``identity#n@BROKER`` (its own cluster name), so a name is unique in the
whole cluster and says where the peer lives.  The name is what the scatter
``WORKER`` header, ``/connz``, ``mc0 stats`` (``mc0.broker peers``), the
peer events and the logs show, and what an operator hands back to act on a
connection.

Grammar: ``name = identity "#" serial [ "@" broker ]`` with ``serial`` 1*DIGIT
(no leading zero) and ``broker`` a broker name (:func:`mc0.protocol.routes.is_name`:
no ``#`` or ``@`` in it).  An identity may hold any character, ``#`` and ``@``
included: the last ``#`` of a name is the serial's, so every name has exactly
one reading.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from . import routes

SERIAL_MARK = "#"
# Serials of a run start at the milliseconds from this moment (2025-01-01 UTC, in Unix seconds) to its start.
SERIAL_ORIGIN = 1_735_689_600
BROKER_MARK = "@"
# (the identity is greedy: the serial's '#' is the last one of the name; a broker name holds no '#')
_NAME = re.compile(r"(?P<identity>.+)#(?P<serial>[1-9][0-9]{0,18})(?:@(?P<broker>[^#@]+))?", re.DOTALL)


class PeerName(NamedTuple):
    identity: str
    serial: int
    broker: str  # "" on a standalone broker


def peer_name(identity: str, serial: int, broker: str = "") -> str:
    """The name of the ``serial``-th peer of ``broker`` ("" standalone), authenticated as ``identity``
    (never empty at a broker: ``anonymous`` without CURVE).  A serial below 1 or a ``broker`` that is
    not a broker name is a caller's mistake (ValueError): the broker's name was checked at start."""
    if serial < 1 or (broker and not routes.is_name(broker)):
        raise ValueError(f"no peer name for serial {serial} at broker {broker!r}")
    name = f"{identity}{SERIAL_MARK}{serial}"
    return f"{name}{BROKER_MARK}{broker}" if broker else name


def first_serial(wall: float) -> int:
    """The first serial of a broker run that starts at ``wall`` (Unix seconds): the milliseconds since
    ``SERIAL_ORIGIN`` (11 digits for three centuries), at least 1.  A later run starts past every serial an
    earlier one gave unless that run averaged more than one new session per millisecond, or the clock
    went back: so an operator's name from before a restart (``conn close bob#41234567@b1``) finds no
    session of the new run, where serials from 1 would have found a new session of the same identity."""
    return max(1, int((wall - SERIAL_ORIGIN) * 1000))


def parse_peer_name(text: str) -> PeerName | None:
    """What a peer name says (identity, serial, broker or ""); None if ``text`` is not one."""
    match = _NAME.fullmatch(text)
    if match is None:
        return None
    broker = match["broker"] or ""
    if broker and not routes.is_name(broker):
        return None
    return PeerName(match["identity"], int(match["serial"]), broker)


__all__ = ["BROKER_MARK", "SERIAL_MARK", "SERIAL_ORIGIN", "PeerName", "first_serial", "parse_peer_name", "peer_name"]
