"""StoredLetters: mailboxes kept in a JetStream journal (``mailboxes = true``, ``store = "jetstream"``).

Contract: a letter for an identity with no session anywhere in the cluster is
proposed to the stream on that identity's own subject (``keep``: its token;
the sender's ``OK MAILBOX stored`` waits for the stream's acknowledgement,
``mc0.broker.jetstream.replication``).  One broker reads an identity's letters: the
one where it got a session while no other broker had one (as far as this
one knew: a route's sessions of it), or, once every other broker's went
(``sessions_changed``), each broker left with its sessions.  That broker
reads its letters from the stream in order (a store call), hands each one not expired to the identity's newest
session here, and once the shell says that session's queue is empty
(``sent_all``, looked at by ``settle`` each commit) removes them from the
stream (purges the subject up to the last one handed).  A session that goes
before that leaves them in the stream: they are delivered again at the next
connect.  So delivery is at least once and in order, from any broker, and an
identity with sessions at two brokers gets each letter once (twice only if
both got their first sessions before either heard of the other's).  A
letter another broker kept a moment after this read (before it knew of the
session here) is found by a second read ``REREAD_S`` later, which starts
after the last letter already handed here (``after``, kept per identity
while it has a session here or a purge of its letters is under way): a
session still draining its letters when the second read comes (or a purge a
read overtakes, or a replica behind the purge) never gets one twice.  The stream
bounds the mailboxes itself (per subject: ``mailbox_max_messages``; its age:
``mailbox_ttl_ms``; its bytes: ``mailboxes_max_bytes``): beyond them the
PUT gets 429.  Pure: no sockets, no clock.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ... import protocol as P
from ...errors import ProtocolError
from ...message import Record
from ...protocol import Header, Status
from ...protocol import jetstream as jsw
from ..core.peers import Out, Peer
from ..storage.port import ReplicatedStore
from .storecalls import StoreCalls, failure

log = logging.getLogger("mc0.broker")

REREAD_S = 1.0  # a second look at a mailbox after its identity came online here


class StoredLetters:
    def __init__(
        self,
        journal: ReplicatedStore,
        calls: StoreCalls,
        counters: Counter[str],
        *,
        sessions: Callable[[str], list[Peer]],
        sent_all: Callable[[bytes], bool],
        letter_of: Callable[[Record], tuple[str, Any]],
        wall_offset: float,
    ) -> None:
        """``sessions(identity)``: its sessions here and at routes, newest last; ``letter_of``: a
        letter record -> (its identity, its Letter) (:func:`mc0.broker.core.mailboxes.letter_of`)."""
        self.journal = journal
        self.calls = calls
        self.counters = counters
        self._sessions = sessions
        self.sent_all = sent_all
        self._letter_of = letter_of
        self.wall_offset = wall_offset
        # (session, identity, the first and the last seq it was handed), until they left
        self._handed: list[tuple[Peer, str, int, int]] = []
        self._reread: dict[str, float] = {}  # identity -> when to look at its mailbox again
        self._reading: set[str] = set()  # identities whose mailbox is being read
        self._after: dict[str, int] = {}  # identity -> its next read starts after this seq
        self._purging: Counter[str] = Counter()  # identity -> its purges under way
        self._reader: set[str] = set()  # identities whose letters this broker reads (not another broker)

    def keep(
        self, to: str, record: tuple[str, str, Mapping[str, str], Sequence[bytes]], expires: float,
        request_id: str | None = None,
    ) -> int:  # fmt: skip
        """Propose ``to``'s letter to the stream; its token (the OK waits for the stream).  429 (a
        ProtocolError) while too much waits for the stream's answer."""
        if self.journal.backlog:
            self.counters["mailbox_refused"] += 1
            raise ProtocolError(Status.OVER_LIMIT, f"journal {self.journal.name}: {self.journal.backlog}", request_id)
        topic, sender, headers, body = record
        kept = {k: v for k, v in headers.items() if P.carried(k)}
        expires_ms = round((expires + self.wall_offset) * 1000.0)
        kept.update({Header.TO: to, Header.TOPIC: topic, P.MAILBOX_EXPIRES: str(expires_ms)})
        self.counters["mailbox_stored"] += 1
        msgid = headers.get(Header.MSGID)  # (the stream's duplicate window dedups it, cluster-wide)
        store_id = jsw.msg_id(sender, msgid) if msgid is not None and self.journal.settings.dedup_window_s else None
        return self.journal.letter(to, P.SYS_MAILBOX_LETTER, sender, kept, body, msgid=store_id)

    def online(self, identity: str, now: float) -> None:
        """``identity`` has its first session at this broker: its letters are read from the stream, unless
        another broker has sessions of it (that one reads them; this one does once they all went)."""
        if any(p.route for p in self._sessions(identity)):
            self.counters["mailbox_read_elsewhere"] += 1
            return
        self._reader.add(identity)
        self._read(identity)
        self._reread[identity] = now + REREAD_S

    def sessions_changed(self, identity: str) -> None:
        """Another broker's sessions of ``identity`` went: if none is left elsewhere and it has one here,
        this broker reads its letters from now on (at once)."""
        if identity in self._reader or self._own(identity) is None:
            return
        if not any(p.route for p in self._sessions(identity)):
            self._reader.add(identity)
            self._reread[identity] = 0.0  # (due: the next tick reads)

    def _own(self, identity: str) -> Peer | None:
        own = [p for p in self._sessions(identity) if not p.route]
        return own[-1] if own else None

    def _read(self, identity: str) -> None:
        if identity in self._reading:
            return
        self._reading.add(identity)
        after = self._after.get(identity, 0)
        request = {"op": "letters_read", "journal": self.journal.name, "identity": identity, "after": after}
        self.calls.call(request, lambda data, records, now: self._deliver(identity, data, records, now))

    def _deliver(self, identity: str, data: dict[str, Any], records: Sequence[Record], now: float) -> list[Out]:
        self._reading.discard(identity)
        problem = failure(data)
        if problem is not None:
            self.counters["mailbox_read_failed"] += 1
            log.warning("journal %s: mailbox of %s not read: %s", self.journal.name, identity, problem[1])
            self._reread[identity] = now + REREAD_S  # try again while it stays connected
            return []
        session = self._own(identity)
        after = self._after.get(identity, 0)
        records = [r for r in records if r.seq > after]  # (what was handed here already: never again)
        if session is None or not records:
            self._forget_if_idle(identity)
            return []
        out: list[Out] = []
        first, last = records[0].seq, 0
        for record in records:
            last = max(last, record.seq)
            try:
                to, letter = self._letter_of(record)
            except ValueError as exc:
                self.counters["mailbox_record_unreadable"] += 1
                log.error("journal %s: letter %d unreadable, removed: %s", self.journal.name, record.seq, exc)
                continue
            if to != identity or letter.expires <= now:
                self.counters["mailbox_expired"] += 1
                continue
            out.append((session.routing_id, letter.record if session.batched else letter.frames))
        self.counters["mailbox_delivered"] += len(out)
        session.last_sent = now
        self._handed.append((session, identity, first, last))
        self._after[identity] = last
        return out

    def offline(self, peer: Peer) -> None:
        """``peer`` went: what it was handed and may not have received stays in the stream (the next
        read of its identity starts before it again)."""
        if self._handed:
            kept = []
            for handed in self._handed:
                if handed[0] is not peer:
                    kept.append(handed)
                else:
                    _, identity, first, _ = handed
                    self._after[identity] = min(self._after.get(identity, 0), first - 1)
            self.counters["mailbox_kept_again"] += len(self._handed) - len(kept)
            self._handed = kept
        if not peer.route:
            if not any(not p.route and p is not peer for p in self._sessions(peer.identity)):
                self._reader.discard(peer.identity)
            self._forget_if_idle(peer.identity, gone=peer)

    def _forget_if_idle(self, identity: str, gone: Peer | None = None) -> None:
        """Forget where ``identity``'s reads start once nothing of it is under way here (no session,
        no read, no purge, nothing handed): its next session reads its mailbox from the start."""
        if identity not in self._after or identity in self._reading or self._purging[identity] > 0:
            return
        if any(not p.route and p is not gone for p in self._sessions(identity)):
            return
        if any(h[1] == identity for h in self._handed):
            return
        del self._after[identity]

    def settle(self) -> None:
        """Remove from the stream the letters whose session's queue has emptied (they left)."""
        if not self._handed:
            return
        waiting = []
        for handed in self._handed:
            session, identity, _, last = handed
            if self.sent_all(session.routing_id):
                request = {"op": "letters_purge", "journal": self.journal.name, "identity": identity, "upto": last}
                self._purging[identity] += 1
                self.calls.call(request, self._purged_of(identity))
            else:
                waiting.append(handed)
        self._handed = waiting

    def _purged_of(self, identity: str) -> Callable[[dict[str, Any], Sequence[Record], float], list[Out]]:
        return lambda data, records, now: self._purged(identity, data)

    def _purged(self, identity: str, data: dict[str, Any]) -> list[Out]:
        self._purging[identity] -= 1
        if self._purging[identity] <= 0:
            del self._purging[identity]
        problem = failure(data)
        if problem is not None:  # delivered again at the next connect: at least once
            self.counters["mailbox_purge_failed"] += 1
            log.warning("journal %s: delivered letters not removed: %s", self.journal.name, problem[1])
        self._forget_if_idle(identity)
        return []

    @property
    def uncommitted(self) -> bool:
        return bool(self._handed)

    def tick(self, now: float) -> None:
        """A second look at the mailboxes of identities that came online here a moment ago."""
        for identity, when in list(self._reread.items()):
            if when <= now:
                del self._reread[identity]
                if identity in self._reading:  # the last read is still under way: look again after it
                    self._reread[identity] = now + REREAD_S
                elif identity in self._reader and self._own(identity) is not None:
                    self._read(identity)

    def next_deadline(self, earliest: float) -> float:
        return min([earliest, *self._reread.values()])
