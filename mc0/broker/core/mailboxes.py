"""Mailboxes: direct messages to one authenticated identity (``PUT TO identity``).

Contract: owns which sessions each identity has open (mc0 1.0 peers only) and
the letters kept for identities with none.  ``check`` validates a PUT TO whole
(1.0 sender, a well-formed identity, the ``send_to`` grant, the topic's own
rules are the caller's) before ``send`` changes anything.  ``send`` hands the
MESSAGE (with ``TO``) to the identity's most recently connected session, or
keeps it, bounded per identity by count and bytes and overall by bytes,
each letter for at most ``mailbox_ttl_ms``; beyond a bound it raises 429 and
keeps nothing.  A kept letter is one bytes object (its MESSAGE as a batch
FRAMES record, sent as is to a batched session) and counts its length plus
``LETTER_OVERHEAD``; each mailbox counts ``MAILBOX_OVERHEAD`` more: the bounds
count what keeping them costs, not only the bodies.  ``online`` returns the letters kept for a session that just
connected, oldest first; ``expire`` drops letters past their time.

Without a mailbox journal, letters live in memory only: a broker restart
loses what is kept.  With one (``[journals.NAME] mailboxes = true``), reached
only through the :class:`~mc0.broker.storage.port.JournalStore` port: a kept letter
is appended as a ``mc0.sys.mailbox.letter`` record (its topic, sender, ``TO``,
``X-`` headers, body, and its expiry in wall-clock ms), and the caller holds
the ``OK MAILBOX stored`` until the core's commit; which letters were
settled (delivered, expired, dropped) is appended as
``mc0.sys.mailbox.settled`` records.  A letter handed to a session is
recorded delivered only at a commit after the shell's queue for that session
is empty (``sent_all``); a session that goes before that gets its letters
kept again.  So delivery is at least once: a broker killed between the hand-
off and that record delivers the letter again after its restart, and never
loses it.  ``restore(now)`` (after the journal is open) rebuilds the
mailboxes from the journal in seq order; a record it cannot read is logged,
counted (``mailbox_record_unreadable``) and skipped.  Retention keeps the
segments from the oldest kept letter on (``retain_from``).  When a journal
JetStream keeps holds the mailboxes, letters live in its stream instead
(:mod:`.storedletters`: ``stored``; nothing is kept here).  Pure: no
sockets, no clock, no disk.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ... import protocol as P
from ...errors import InvalidTopic, ProtocolError, quoted
from ...message import Record
from ...protocol import Command, Header, Status, batch
from ...settings import CoreSettings, JournalSettings
from ...topics import split_topic
from ..jetstream.storecalls import StoreCalls
from ..jetstream.storedletters import StoredLetters
from ..storage.port import JournalStore, Trimmed, replicated, storage_fault
from .letterids import LetterIds
from .peers import Out, Peer

log = logging.getLogger("mc0.broker")

# Why a kept letter left its mailbox (the keys of a settled record's JSON body).
DELIVERED, EXPIRED, DROPPED = "delivered", "expired", "dropped"
SETTLED_REASONS = (DELIVERED, EXPIRED, DROPPED)
RESTORE_PAGE = 1000  # records read per step when rebuilding from the journal
# What keeping a letter costs besides its record's bytes, and what a mailbox (an identity with
# letters kept) costs besides its letters: counted against the bounds, so that the bounds are
# what the broker's memory pays (measured with tracemalloc by tests/test_mailboxes.py: a Letter,
# its float, its bytes object's header, its list slot; a dict entry, a list, the identity's str).
LETTER_OVERHEAD = 150
MAILBOX_OVERHEAD = 300
FRAMES_START = 5  # a FRAMES record's body starts after its size (u32) and code (u8)


@dataclass(slots=True)
class Letter:
    expires: float
    record: bytes  # the MESSAGE as it will be sent (TOPIC, SENDER, TO, X- headers, body), one FRAMES record
    seq: int = 0  # its record in the mailbox journal (0: not journaled)

    @property
    def size(self) -> int:
        """What it counts against the bounds: its bytes and what keeping it costs."""
        return len(self.record) + LETTER_OVERHEAD

    @property
    def frames(self) -> list[bytes]:
        return batch.frames_of(self.record, batch.FRAMES, FRAMES_START, len(self.record))


def compact(expires: float, frames: Sequence[bytes], seq: int = 0) -> Letter:
    """A letter kept as one bytes object (a list of frames cost a Python object each)."""
    return Letter(expires, batch.frames_record(frames), seq)


# The identities remembered as seen (``Mailboxes.seen``): under CURVE there are no more than allowed keys;
# past this many the broker stops telling (no hint rather than memory without bound).
SEEN_MAX = 65_536


def identity_tokens(identity: str) -> tuple[str, ...]:
    """An identity as ``send_to`` patterns see it: split at dots like a topic."""
    try:
        return split_topic(identity, max_bytes=P.MAX_GROUP_BYTES, max_tokens=64)
    except InvalidTopic:
        return (identity,)


class LetterUnreadable(ValueError):
    """A mailbox journal record that cannot be a letter (logged, counted, skipped)."""


def letter_of(record: Record, wall_offset: float) -> tuple[str, Letter]:
    """A ``mc0.sys.mailbox.letter`` record -> (its identity, the letter as it was kept)."""
    headers = record.headers
    try:
        to, topic, expires_ms = headers[Header.TO], headers[Header.TOPIC], int(headers[P.MAILBOX_EXPIRES])
    except (KeyError, ValueError) as exc:
        raise LetterUnreadable(f"no valid TO, TOPIC and {P.MAILBOX_EXPIRES} ({exc})") from None
    if not P.valid_group(to):
        raise LetterUnreadable(f"TO {to[:64]!r} is not an identity")
    try:
        split_topic(topic)
    except InvalidTopic as exc:
        raise LetterUnreadable(f"TOPIC: {exc}") from None
    user = P.user_header_frames(headers)
    frames = P.message(topic.encode(), record.sender.encode(), user, list(record.parts), to=to.encode())
    return to, compact(expires_ms / 1000.0 - wall_offset, frames, record.seq)


def settled_of(record: Record) -> dict[str, list[int]]:
    """A ``mc0.sys.mailbox.settled`` record -> reason -> the seqs of the letters it settled."""
    try:
        body = json.loads(b"".join(record.parts))
        if not isinstance(body, dict) or not set(body) <= set(SETTLED_REASONS):
            raise ValueError(f"keys must be among {', '.join(SETTLED_REASONS)}")
        out = {str(k): [int(seq) for seq in v] for k, v in body.items()}
    except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise LetterUnreadable(f"settled record: {exc}") from None
    return out


def _sent_all(routing_id: bytes) -> bool:
    return True  # (no figure of the shell's queues: everything leaves at once)


class PresenceListener(Protocol):
    """Told when an identity gets its first session on this broker and loses its last (the routes)."""

    def online(self, identity: str) -> None: ...

    def offline(self, identity: str) -> None: ...


class Mailboxes:
    def __init__(
        self,
        settings: CoreSettings,
        counters: Counter[str],
        keeper: JournalStore | None = None,
        *,
        wall_offset: float = 0.0,
        presence: PresenceListener | None = None,
        backlog: Callable[[bytes], int] | None = None,
        calls: StoreCalls | None = None,
    ) -> None:
        """``keeper``: the journal that keeps mailboxes (None: memory only; one JetStream keeps: its
        letters are kept in the stream, through store ``calls``); ``wall_offset`` turns ``now``
        (monotonic) into wall-clock time, which a letter's record keeps its expiry in; ``presence``:
        told when an identity gets its first session here and when its last one goes (the cluster's
        routes); ``backlog``: what still waits in a routing id's queue (the shell's outbox)."""
        self.settings = settings
        self.counters = counters
        stored = replicated(keeper) if keeper is not None else None
        self.journal = None if stored is not None else keeper
        self.wall_offset = wall_offset
        # "Has everything queued for this routing id left?" (from the shell's backlog); until then a
        # journaled letter handed to a session is not recorded delivered.
        self.sent_all: Callable[[bytes], bool] = (
            _sent_all if backlog is None else (lambda routing_id: backlog(routing_id) == 0)
        )
        # identity -> its 1.0 sessions, most recent last (and the routes, other brokers, that have some)
        self._sessions: dict[str, list[Peer]] = {}
        self._seen: set[str] = set()  # identities that had a session here or at a route since the start
        self.presence = presence
        self._letters: dict[str, list[Letter]] = {}  # oldest first
        self._bytes: dict[str, int] = {}  # each mailbox's letters' sizes (LETTER_OVERHEAD included)
        self.total_bytes = 0  # all mailboxes: their letters' sizes and MAILBOX_OVERHEAD each
        self.next_expiry = float("inf")
        # Journaled only: letters appended since the last commit (withdrawn if it fails), letters
        # handed to a session and not yet recorded delivered, and settlements to record.
        self._fresh: list[tuple[str, Letter]] = []
        self._fresh_ids: list[tuple[str, str]] = []  # their (sender, MSGID), forgotten if the commit fails
        self._handed: list[tuple[Peer, Letter]] = []
        self._settled: dict[str, list[int]] = {}
        self._writing: dict[str, list[int]] = {}  # settlements in the record being committed
        self._floor: int | None = None  # what the journal's retention was last told to keep
        self._floor_stale = False  # a journaled letter left a mailbox since the floor was computed
        # A JetStream journal keeps the mailboxes (then ``journal`` is None: nothing is kept here),
        # and the token of the letter the last ``send`` proposed to it (its OK waits for the stream).
        self.stored: StoredLetters | None = None
        if stored is not None:
            assert calls is not None, "a JetStream journal's letters are kept through store calls"
            self.stored = StoredLetters(
                stored,
                calls,
                counters,
                sessions=self.sessions_of,
                sent_all=self.sent_all,
                letter_of=lambda record: letter_of(record, wall_offset),
                wall_offset=wall_offset,
            )
        self.proposed = 0
        # The MSGIDs of the letters taken: a re-sent letter (after a failover, a lost OK) is taken once,
        # within the mailbox journal's dedup window and bound (a journal's defaults without one).
        dedup = keeper.settings if keeper is not None else JournalSettings()
        self.letter_ids = LetterIds(dedup.dedup_window_s, dedup.dedup_max_ids)

    # ------------------------------------------------------------ sessions
    def online(self, peer: Peer, now: float, identity: str | None = None) -> list[Out]:
        """``peer`` connected: it receives its identity's kept letters (and later ones).  A route (another
        broker) comes ``online`` for each ``identity`` it has sessions of, behind this broker's own."""
        if peer.legacy:
            return []
        identity = identity or peer.identity
        if len(self._seen) < SEEN_MAX:
            self._seen.add(identity)
        sessions = self._sessions.setdefault(identity, [])
        if peer.route:
            sessions.insert(0, peer)
        else:
            first_here = not any(not p.route for p in sessions)
            if self.presence is not None and first_here:
                self.presence.online(identity)
            sessions.append(peer)
            if self.stored is not None and first_here:  # its letters come from the stream
                self.stored.online(identity, now)
        letters = self._letters.get(identity)
        if not letters:
            return []
        self._drop_mailbox(identity)
        self._floor_stale = True
        out = self._hand(peer, letters, now)
        peer.last_sent = now
        return out

    def _hand(self, peer: Peer, letters: Sequence[Letter], now: float) -> list[Out]:
        out: list[Out] = []
        for kept in letters:
            if kept.expires > now:
                out.append(self._to(peer, kept))
                if kept.seq:
                    self._handed.append((peer, kept))
            else:
                self._settle(EXPIRED, kept)
        self.counters["mailbox_delivered"] += len(out)
        self.counters["mailbox_expired"] += len(letters) - len(out)
        return out

    def seen(self, identity: str) -> bool | None:
        """Whether ``identity`` had a session (1.0) here, or at another broker that announced it, since
        this broker started: a letter for one never seen may be misaddressed.  None: past ``SEEN_MAX``
        identities this broker no longer tells."""
        if identity in self._seen:
            return True
        return None if len(self._seen) >= SEEN_MAX else False

    def sessions_of(self, identity: str) -> list[Peer]:
        """``identity``'s sessions here and the routes that have some, newest last."""
        return self._sessions.get(identity, [])

    def connected(self, identity: str) -> bool:
        """``identity`` has a session here, or at another broker that announced it."""
        return bool(self._sessions.get(identity))

    def identities_of(self, route: Peer) -> list[str]:
        """The identities a route (another broker) has sessions of, as it announced them."""
        return sorted(identity for identity, sessions in self._sessions.items() if route in sessions)

    def route_offline(self, route: Peer, identities: Sequence[str] | None = None) -> None:
        """A route no longer has sessions of these identities (None: of any: it is gone)."""
        for identity in list(self._sessions) if identities is None else identities:
            sessions = self._sessions.get(identity)
            if sessions is not None and route in sessions:
                sessions.remove(route)
                if not sessions:
                    del self._sessions[identity]
                elif self.stored is not None:  # (this broker may read its kept letters now)
                    self.stored.sessions_changed(identity)

    def offline(self, peer: Peer, now: float) -> list[Out]:
        """``peer`` went; journaled letters it was handed that may not have left are kept again
        (for its identity's newest other session at once, else until the next connect)."""
        if peer.route:
            self.route_offline(peer)
        if self.stored is not None:
            self.stored.offline(peer)
        sessions = self._sessions.get(peer.identity)
        if sessions is not None and peer in sessions:
            sessions.remove(peer)
            if self.presence is not None and not peer.legacy and not any(not p.route for p in sessions):
                self.presence.offline(peer.identity)
            if not sessions:
                del self._sessions[peer.identity]
        if not self._handed:
            return []
        mine = [letter for holder, letter in self._handed if holder is peer]
        if not mine:
            return []
        self._handed = [(holder, letter) for holder, letter in self._handed if holder is not peer]
        if self.sent_all(peer.routing_id):
            for letter in mine:
                self._settle(DELIVERED, letter)
            return []
        self.counters["mailbox_kept_again"] += len(mine)
        others = self._sessions.get(peer.identity)
        if others:
            return self._hand(others[-1], mine, now)
        for letter in reversed(mine):  # in front of anything kept since, in their order
            self._keep(peer.identity, letter, first=True)
        return []

    # ------------------------------------------------------------ sending
    def check(self, peer: Peer, command: Command) -> str:
        """The TO identity of a PUT, once it may be sent there (400/403 as ProtocolError)."""
        to = command.headers[Header.TO]
        if peer.legacy:
            raise ProtocolError(Status.BAD_REQUEST, f"direct messages need protocol {P.FULL_VERSION}", command.id)
        if not P.valid_group(to):
            reason = f"TO {quoted(to, 64)}: an identity is 1 to {P.MAX_GROUP_BYTES} UTF-8 bytes without whitespace"
            raise ProtocolError(Status.BAD_REQUEST, reason, command.id)
        if not peer.grants.may_send_to(identity_tokens(to)):
            raise ProtocolError(Status.FORBIDDEN, f"{peer.identity} may not send to {to}", command.id)
        return to

    def duplicate(self, sender: str, msgid: str, now: float) -> str | None:
        """The outcome of an earlier letter ``sender`` sent with ``msgid`` inside the dedup window
        (``delivered`` or ``stored``), None for a new one: remembered this run, or kept by the mailbox
        journal (its dedup memory is rebuilt on restart).  A JetStream journal's stream dedups itself."""
        earlier = self.letter_ids.outcome_of(sender, msgid, now)
        if earlier is None and self.journal is not None and self.journal.duplicate_of(sender, msgid) is not None:
            earlier = P.MAILBOX_STORED
        return earlier

    def send(
        self,
        to: str,
        frames: list[bytes],
        request_id: str | None,
        now: float,
        *,
        record: tuple[str, str, Mapping[str, str], Sequence[bytes]] | None = None,
        local_only: bool = False,
    ) -> tuple[list[Out], str]:
        """Deliver to ``to``'s newest session or keep the letter; returns (what to send, outcome).
        ``local_only``: a letter another broker sent here: this broker's own sessions or its mailbox.

        ``record`` is (topic, sender identity, headers, body): what a mailbox
        journal keeps of a letter (needed only when there is one; its ``MSGID`` is
        kept too, and remembered: ``duplicate``; one a stream keeps, the stream
        dedups).  A kept letter is durable only after the core's commit: the caller
        holds its OK (and a commit that fails forgets its MSGID).
        """
        out, outcome = self._send(to, frames, request_id, now, record, local_only)
        if record is not None and Header.MSGID in record[2]:
            sender, msgid = record[1], record[2][Header.MSGID]
            if outcome == P.MAILBOX_DELIVERED or self.stored is None:
                self.letter_ids.remember(sender, msgid, outcome, now)
            if self.journal is not None and outcome == P.MAILBOX_STORED:
                self._fresh_ids.append((sender, msgid))
        return out, outcome

    def _send(
        self,
        to: str,
        frames: list[bytes],
        request_id: str | None,
        now: float,
        record: tuple[str, str, Mapping[str, str], Sequence[bytes]] | None,
        local_only: bool,
    ) -> tuple[list[Out], str]:
        sessions = self._sessions.get(to)
        if sessions and local_only:
            sessions = [p for p in sessions if not p.route]
        if sessions:
            target = sessions[-1]  # the newest of this broker's own sessions, else a route's
            target.last_sent = now
            target.delivered += 1
            self.counters["mailbox_delivered"] += 1
            payload = batch.frames_record(frames) if target.batched else frames
            return [(target.routing_id, payload)], P.MAILBOX_DELIVERED
        expires = now + self.settings.mailbox_ttl_ms / 1000.0
        if self.stored is not None:  # kept in the stream, which bounds the mailboxes itself
            if record is None:
                raise ValueError("a mailbox journal keeps the letter's record: pass record=")
            self.proposed = self.stored.keep(to, record, expires, request_id)
            return [], P.MAILBOX_STORED
        letter = compact(expires, frames)
        self._check_room(to, letter.size, request_id)
        if self.journal is not None:
            if record is None:
                raise ValueError("a mailbox journal keeps the letter's record: pass record=")
            letter.seq = self._append(to, letter, record, request_id)
            self._fresh.append((to, letter))
        self._keep(to, letter)
        self.counters["mailbox_stored"] += 1
        return [], P.MAILBOX_STORED

    def _check_room(self, to: str, size: int, request_id: str | None, *, counted: str = "mailbox_refused") -> None:
        """429 unless ``to``'s mailbox and all mailboxes together have room for ``size`` more bytes
        (counted as ``counted``)."""
        settings = self.settings
        held = self._letters.get(to)
        count, held_bytes = (len(held), self._bytes[to]) if held else (0, 0)
        if count + 1 > settings.mailbox_max_messages or held_bytes + size > settings.mailbox_max_bytes:
            reason = (
                f"mailbox of {to} is full ({count} messages, {held_bytes} bytes; the limits are "
                f"{settings.mailbox_max_messages} messages, {settings.mailbox_max_bytes} bytes)"
            )
            self.counters[counted] += 1
            raise ProtocolError(Status.OVER_LIMIT, reason, request_id)
        if self.total_bytes + size + (0 if held else MAILBOX_OVERHEAD) > settings.mailboxes_max_bytes:
            self.counters[counted] += 1
            reason = f"mailboxes hold {self.total_bytes} bytes, the limit is {settings.mailboxes_max_bytes}"
            raise ProtocolError(Status.OVER_LIMIT, reason, request_id)

    def _keep(self, to: str, letter: Letter, *, first: bool = False) -> None:
        letters = self._letters.get(to)
        if letters is None:
            letters = self._letters[to] = []
            self._bytes[to] = 0
            self.total_bytes += MAILBOX_OVERHEAD
        if first:
            letters.insert(0, letter)  # rare (a session gone before its letters left); at most a mailbox long
        else:
            letters.append(letter)
        self._bytes[to] += letter.size
        self.total_bytes += letter.size
        self.next_expiry = min(self.next_expiry, letter.expires)

    def _drop_mailbox(self, identity: str) -> None:
        """``identity``'s mailbox goes (its letters were handed out or are gone)."""
        del self._letters[identity]
        self.total_bytes -= self._bytes.pop(identity) + MAILBOX_OVERHEAD

    def _append(
        self, to: str, letter: Letter, record: tuple[str, str, Mapping[str, str], Sequence[bytes]], rid: str | None
    ) -> int:
        assert self.journal is not None
        topic, sender, headers, body = record
        kept = {k: v for k, v in headers.items() if P.carried(k) or k == Header.MSGID}
        expires_ms = round((letter.expires + self.wall_offset) * 1000.0)
        kept.update({Header.TO: to, Header.TOPIC: topic, P.MAILBOX_EXPIRES: str(expires_ms)})
        try:
            seq = self.journal.append(P.SYS_MAILBOX_LETTER, sender, kept, body)  # (its MSGID: the journal's dedup)
        except OSError as exc:  # a disk error must not take the broker down; the sender learns it
            self.counters["journal_write_failed"] += 1
            log.error("journal %s: mailbox letter not written: %s", self.journal.name, exc)
            reason = f"journal {self.journal.name} could not keep the letter: {storage_fault(exc)}"
            raise ProtocolError(Status.STORAGE_FAILED, reason, rid) from None
        if self._floor is None:  # retention must keep it from now on (a roll may trim before the next tick)
            self._set_floor(seq)
        return seq

    @staticmethod
    def _to(peer: Peer, letter: Letter) -> Out:
        return (peer.routing_id, letter.record if peer.batched else letter.frames)

    # ------------------------------------------------------------ the mailbox journal
    @property
    def uncommitted(self) -> bool:
        """Settlements to record, or letters handed out and not yet recorded delivered."""
        return bool(self._settled or self._handed or self._fresh) or (
            self.stored is not None and self.stored.uncommitted
        )

    def _settle(self, reason: str, letter: Letter) -> None:
        if letter.seq:
            self._settled.setdefault(reason, []).append(letter.seq)

    def before_commit(self) -> None:
        """Append one settled record (delivered letters whose session's queue is empty, expired,
        dropped) so that the commit about to run writes it with the batch's letters."""
        if self.stored is not None:
            self.stored.settle()
        if self.journal is None:
            return
        if self._handed:
            waiting: list[tuple[Peer, Letter]] = []
            for holder, letter in self._handed:
                if self.sent_all(holder.routing_id):
                    self._settle(DELIVERED, letter)
                else:
                    waiting.append((holder, letter))
            self._floor_stale |= len(waiting) < len(self._handed)
            self._handed = waiting
        if not self._settled:
            return
        body = json.dumps(self._settled, separators=(",", ":")).encode()
        try:
            self.journal.append(P.SYS_MAILBOX_SETTLED, "", {}, [body])
        except OSError as exc:  # kept for the next commit; meanwhile a restart may deliver again
            self.counters["journal_write_failed"] += 1
            log.error("journal %s: mailbox settlements not written: %s", self.journal.name, exc)
            return
        self._writing, self._settled = self._settled, {}

    def after_commit(self, failed: bool) -> None:
        """The commit ran: on failure, letters kept this turn are withdrawn (their senders get
        507, their records are gone) and the settlements are written again next time."""
        if failed and self.journal is not None:
            end = self.journal.next_seq  # the records from here on were withdrawn (their seqs are reused)
            for to, letter in self._fresh:
                letters = self._letters.get(to)
                if letters is not None and letter in letters:
                    letters.remove(letter)
                    self._bytes[to] -= letter.size
                    self.total_bytes -= letter.size
                    if not letters:
                        self._drop_mailbox(to)
                    self.counters["mailbox_withdrawn"] += 1
                if letter.seq >= end:
                    letter.seq = 0  # handed out already: no record of it to settle
            for reason, seqs in self._writing.items():
                still = [seq for seq in seqs if seq < end]
                if still:
                    self._settled.setdefault(reason, [])[:0] = still
            for sender, msgid in self._fresh_ids:  # (not kept: a re-send must be taken)
                self.letter_ids.forget(sender, msgid)
        self._fresh.clear()
        self._fresh_ids.clear()
        self._writing = {}

    def _set_floor(self, seq: int | None) -> None:
        if self.journal is not None and seq != self._floor:
            self._floor = seq
            self.journal.retain_from(seq)

    def _oldest_seq(self) -> int | None:
        seqs = [letters[0].seq for letters in self._letters.values() if letters[0].seq]
        seqs += [letter.seq for _, letter in self._handed]
        return min(seqs, default=None)

    def restore(self, now: float) -> None:
        """Rebuild the mailboxes from the journal (call once, after it is open, before any peer).

        Letters come back in seq order with their sender, headers and expiry;
        settled ones do not; expired ones, and any beyond today's bounds, are
        dropped (and that is recorded at the next commit).
        """
        journal = self.journal
        if journal is None:
            return
        kept: dict[int, tuple[str, Letter]] = {}
        cursor, end = journal.first_seq, journal.next_seq
        while cursor < end:  # each read advances at least one record
            try:
                records, following = journal.read(cursor, end, max_records=RESTORE_PAGE)
            except (Trimmed, OSError) as exc:
                self.counters["mailbox_restore_failed"] += 1
                log.error("journal %s: mailboxes: cannot read from seq %d: %s", journal.name, cursor, exc)
                break
            for record in records:
                self._restore_record(journal, record, kept)
            if following <= cursor:
                break
            cursor = following
        for to, letter in kept.values():
            if letter.expires <= now:
                self.counters["mailbox_expired"] += 1
                self._settle(EXPIRED, letter)
                continue
            try:
                self._check_room(to, letter.size, None, counted="mailbox_restore_dropped")
            except ProtocolError as exc:
                log.warning("journal %s: mailboxes: letter %d dropped: %s", journal.name, letter.seq, exc.reason)
                self._settle(DROPPED, letter)
                continue
            self._keep(to, letter)
            self.counters["mailbox_restored"] += 1
        self._set_floor(self._oldest_seq())
        if kept:
            restored = sum(map(len, self._letters.values()))
            identities = len(self._letters)
            log.info("journal %s: mailboxes: %d letters restored for %d identities", journal.name, restored, identities)

    def _restore_record(self, journal: JournalStore, record: Record, kept: dict[int, tuple[str, Letter]]) -> None:
        try:
            if record.topic == P.SYS_MAILBOX_LETTER:
                kept[record.seq] = letter_of(record, self.wall_offset)
            elif record.topic == P.SYS_MAILBOX_SETTLED:
                for seqs in settled_of(record).values():
                    for seq in seqs:
                        kept.pop(seq, None)
            else:
                raise LetterUnreadable(f"topic {record.topic[:64]!r} is not a mailbox record")
        except LetterUnreadable as exc:
            self.counters["mailbox_record_unreadable"] += 1
            log.error("journal %s: mailboxes: record %d unreadable, skipped: %s", journal.name, record.seq, exc)

    # ------------------------------------------------------------ time and reports
    def expire(self, now: float) -> None:
        """Drop letters past their time (letters of one mailbox expire in order: FIFO, one TTL);
        then tell the journal's retention where the oldest kept letter is."""
        if self.stored is not None:
            self.stored.tick(now)
        if now >= self.next_expiry:
            earliest = float("inf")
            for identity in list(self._letters):
                letters = self._letters[identity]
                gone = 0
                while gone < len(letters) and letters[gone].expires <= now:
                    letter = letters[gone]
                    gone += 1
                    self._bytes[identity] -= letter.size
                    self.total_bytes -= letter.size
                    self.counters["mailbox_expired"] += 1
                    self._settle(EXPIRED, letter)
                    self._floor_stale = True
                del letters[:gone]  # one shift for all that expired
                if letters:
                    earliest = min(earliest, letters[0].expires)
                else:
                    self._drop_mailbox(identity)
            self.next_expiry = earliest
        if self._floor_stale:  # O(identities): only after a kept letter left
            self._floor_stale = False
            self._set_floor(self._oldest_seq())

    def report(self) -> dict[str, dict[str, int]]:
        """Kept letters per identity (identities with a session connected hold none)."""
        return {
            identity: {"messages": len(letters), "bytes": self._bytes[identity]}
            for identity, letters in sorted(self._letters.items())
        }

    def summary(self) -> dict[str, object]:
        """All kept letters (for ``stats``), and the journal that keeps them (None: memory only)."""
        return {
            "identities": len(self._letters),
            "messages": sum(map(len, self._letters.values())),
            "bytes": self.total_bytes,
            "journal": self.journal.name if self.journal is not None else self.stored and self.stored.journal.name,
        }
