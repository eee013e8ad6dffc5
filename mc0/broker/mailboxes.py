"""Mailboxes: direct messages to one authenticated identity (``PUT TO identity``).

Contract: owns which sessions each identity has open (mc0 1.0 peers only) and
the letters kept for identities with none.  ``check`` validates a PUT TO whole
(1.0 sender, a well-formed identity, the ``send_to`` grant, the topic's own
rules are the caller's) before ``send`` changes anything.  ``send`` hands the
MESSAGE (with ``TO``) to the identity's most recently connected session, or
keeps it, bounded per identity by count and bytes and overall by bytes,
each letter for at most ``mailbox_ttl_ms``; beyond a bound it raises 429 and
keeps nothing.  ``online`` returns the letters kept for a session that just
connected, oldest first; ``expire`` drops letters past their time.  Letters
live in memory only: a broker restart loses what is kept (docs/PROTOCOL.md).
Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from .. import protocol as P
from ..errors import InvalidTopic, ProtocolError
from ..protocol import Command, Header, Status, batch
from ..settings import CoreSettings
from ..topics import split_topic
from .peers import Out, Peer


@dataclass(slots=True)
class Letter:
    expires: float
    frames: list[bytes]  # the MESSAGE as it will be sent (TOPIC, SENDER, TO, X- headers, body)
    size: int


def identity_tokens(identity: str) -> tuple[str, ...]:
    """An identity as ``send_to`` patterns see it: split at dots like a topic."""
    try:
        return split_topic(identity, max_bytes=P.MAX_GROUP_BYTES, max_tokens=64)
    except InvalidTopic:
        return (identity,)


class Mailboxes:
    def __init__(self, settings: CoreSettings, counters: Counter[str]) -> None:
        self.settings = settings
        self.counters = counters
        self._sessions: dict[str, list[Peer]] = {}  # identity -> its 1.0 sessions, most recent last
        self._letters: dict[str, deque[Letter]] = {}
        self._bytes: dict[str, int] = {}
        self.total_bytes = 0
        self.next_expiry = float("inf")

    # ------------------------------------------------------------ sessions
    def online(self, peer: Peer, now: float) -> list[Out]:
        """``peer`` connected: it receives its identity's kept letters (and later ones)."""
        if peer.legacy:
            return []
        self._sessions.setdefault(peer.identity, []).append(peer)
        letters = self._letters.pop(peer.identity, None)
        if not letters:
            return []
        self.total_bytes -= self._bytes.pop(peer.identity, 0)
        out = [self._to(peer, letter.frames) for letter in letters if letter.expires > now]
        self.counters["mailbox_delivered"] += len(out)
        self.counters["mailbox_expired"] += len(letters) - len(out)
        peer.last_sent = now
        return out

    def offline(self, peer: Peer) -> None:
        sessions = self._sessions.get(peer.identity)
        if sessions is not None and peer in sessions:
            sessions.remove(peer)
            if not sessions:
                del self._sessions[peer.identity]

    # ------------------------------------------------------------ sending
    def check(self, peer: Peer, command: Command) -> str:
        """The TO identity of a PUT, once it may be sent there (400/403 as ProtocolError)."""
        to = command.headers[Header.TO]
        if peer.legacy:
            raise ProtocolError(Status.BAD_REQUEST, f"direct messages need protocol {P.FULL_VERSION}", command.id)
        if not P.valid_group(to):
            reason = f"TO {to[:64]!r}: an identity is 1 to {P.MAX_GROUP_BYTES} UTF-8 bytes without whitespace"
            raise ProtocolError(Status.BAD_REQUEST, reason, command.id)
        if Header.MSGID in command.headers:
            raise ProtocolError(Status.BAD_REQUEST, "MSGID is for journaled topics, not for TO", command.id)
        if not peer.grants.may_send_to(identity_tokens(to)):
            raise ProtocolError(Status.FORBIDDEN, f"{peer.identity} may not send to {to}", command.id)
        return to

    def send(self, to: str, frames: list[bytes], request_id: str | None, now: float) -> tuple[list[Out], str]:
        """Deliver to ``to``'s newest session or keep the letter; returns (what to send, outcome)."""
        sessions = self._sessions.get(to)
        if sessions:
            target = sessions[-1]
            target.last_sent = now
            target.delivered += 1
            self.counters["mailbox_delivered"] += 1
            return [self._to(target, frames)], P.MAILBOX_DELIVERED
        settings = self.settings
        size = sum(map(len, frames))
        held = self._letters.get(to)
        count, held_bytes = (len(held), self._bytes[to]) if held else (0, 0)
        if count + 1 > settings.mailbox_max_messages or held_bytes + size > settings.mailbox_max_bytes:
            reason = (
                f"mailbox of {to} is full ({count} messages, {held_bytes} bytes; the limits are "
                f"{settings.mailbox_max_messages} messages, {settings.mailbox_max_bytes} bytes)"
            )
            self.counters["mailbox_refused"] += 1
            raise ProtocolError(Status.OVER_LIMIT, reason, request_id)
        if self.total_bytes + size > settings.mailboxes_max_bytes:
            self.counters["mailbox_refused"] += 1
            reason = f"mailboxes hold {self.total_bytes} bytes, the limit is {settings.mailboxes_max_bytes}"
            raise ProtocolError(Status.OVER_LIMIT, reason, request_id)
        expires = now + settings.mailbox_ttl_ms / 1000.0
        self._letters.setdefault(to, deque()).append(Letter(expires, frames, size))
        self._bytes[to] = held_bytes + size
        self.total_bytes += size
        self.next_expiry = min(self.next_expiry, expires)
        self.counters["mailbox_stored"] += 1
        return [], P.MAILBOX_STORED

    @staticmethod
    def _to(peer: Peer, frames: Sequence[bytes]) -> Out:
        return (peer.routing_id, batch.frames_record(frames) if peer.batched else frames)

    # ------------------------------------------------------------ time and reports
    def expire(self, now: float) -> None:
        """Drop letters past their time (letters of one mailbox expire in order: FIFO, one TTL)."""
        if now < self.next_expiry:
            return
        earliest = float("inf")
        for identity in list(self._letters):
            letters = self._letters[identity]
            while letters and letters[0].expires <= now:
                letter = letters.popleft()
                self._bytes[identity] -= letter.size
                self.total_bytes -= letter.size
                self.counters["mailbox_expired"] += 1
            if letters:
                earliest = min(earliest, letters[0].expires)
            else:
                del self._letters[identity]
                del self._bytes[identity]
        self.next_expiry = earliest

    def report(self) -> dict[str, dict[str, int]]:
        """Kept letters per identity (identities with a session connected hold none)."""
        return {
            identity: {"messages": len(letters), "bytes": self._bytes[identity]}
            for identity, letters in sorted(self._letters.items())
        }
