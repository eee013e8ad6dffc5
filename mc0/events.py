"""What a ClientSession reports to its shell: one small value per thing that happened.

Contract: values only (frozen dataclasses and NamedTuples), built by
:class:`mc0.session.ClientSession` and consumed by the asyncio shell; no
behaviour beyond reading themselves.  ``answer_error`` maps an ERROR command
to the matching :class:`mc0.RemoteError` subclass.  A :class:`Received`
names the local subscriptions it is for by key: a plain pattern, ``group_key``
for a queue-group subscription, ``MAILBOX_KEY`` for the mailbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from . import protocol as P
from .errors import RemoteError
from .message import Message, Request
from .protocol import Command, Header, Verb

__all__ = [
    "MAILBOX_KEY",
    "MAILBOX_KEYS",
    "group_key",
    "replay_key",
    "split_key",
    "Answer",
    "CancelWork",
    "ConnectRefused",
    "Connected",
    "Received",
    "Event",
    "Fault",
    "Reconnecting",
    "ReplayEnded",
    "answer_error",
]


@dataclass(frozen=True, slots=True)
class Answer:
    """OK / ERROR / PONG carrying the ID of a command we sent."""

    request_id: str
    command: Command

    def error(self) -> RemoteError | None:
        if self.command.verb is Verb.ERROR:
            return answer_error(self.command)
        return None


MAILBOX_KEY = ""  # the local key of a client's mailbox (no pattern is empty)
MAILBOX_KEYS = (MAILBOX_KEY,)


def replay_key(request_id: str) -> str:
    """The local name of the subscription a ``SUB FROM`` with this ID made, for the records of its
    replay's history (a space first: no pattern or group key starts with one)."""
    return f" replay {request_id}"


def group_key(pattern: str, group: str | None) -> str:
    """The local name of a subscription: its pattern, or ``"pattern group"`` in a queue group
    (neither may contain whitespace, so the two never collide)."""
    return pattern if group is None else f"{pattern} {group}"


def split_key(key: str) -> tuple[str, str | None]:
    pattern, _, group = key.partition(" ")
    return pattern, group or None


class Received(NamedTuple):
    """A MESSAGE received, and the local keys of the subscriptions it is for (a tuple: one is
    built per message received the general way)."""

    message: Message
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Fault:
    """Something exceptional the broker reported without an ID.

    ``withdrawn`` names a subscription pattern the broker dropped (policy
    change); the session has already forgotten it.
    """

    error: RemoteError
    withdrawn: str | None = None


@dataclass(frozen=True, slots=True)
class ReplayEnded:
    """The broker ended the replay of ``journal`` that a ``SUB FROM`` of ``pattern`` started (``error``:
    its status and why); the SUB itself stays, so the session still holds the pattern."""

    error: RemoteError
    journal: str
    pattern: str
    key: str | None = None  # the replaying subscription's ``replay_key``, when its OK named the journal


@dataclass(frozen=True, slots=True)
class Connected:
    ttl_ms: int
    healed: bool  # True when this was a reconnect


@dataclass(frozen=True, slots=True)
class ConnectRefused:
    error: RemoteError


@dataclass(frozen=True, slots=True)
class Reconnecting:
    reason: str
    # The broker is gone or going (the link closed, it said DISCONNECT, it fell silent), as opposed
    # to one that answered but forgot us (401): a shell with other endpoints moves to one of them.
    lost: bool = False


@dataclass(frozen=True, slots=True)
class CancelWork:
    bid: str


# A REQUEST the broker gave us as a worker is reported as the Request its handler gets (built once).
Event = Answer | Received | Fault | ReplayEnded | Connected | ConnectRefused | Reconnecting | Request | CancelWork


def answer_error(command: Command) -> RemoteError:
    code = P.decimal(command.headers.get(Header.CODE, ""), 3) or 0
    return P.remote_error(code, command.headers.get(Header.MESSAGE, ""))
