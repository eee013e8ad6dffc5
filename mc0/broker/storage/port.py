"""The journal port: what the broker core needs from a journal.

Contract: :class:`JournalStore` is the whole interface between the core and
storage.  ``append`` gives a record the next sequence number (1, 2, ...) and
is durable only after ``commit`` (which may fsync, or have a thread fsync:
then ``durable_mark`` reaches the ``append_mark`` of that moment later); ``read`` (and
``read_columns``, the same records column by column) is deterministic
for a ``[from_seq, to_seq)`` range and filter until retention trims it, then
raises :class:`Trimmed`; ``enforce_retention`` drops the oldest records by
size/age, never a record at or after the seq last given to ``retain_from``
(the mailboxes' oldest kept letter); ``purge`` drops what an operator asks
to (``mc0.admin journal.purge``).  Disk errors surface as ``OSError`` from
``append``/``commit``/``read``; the core turns them into ERROR 507, never
into a crash, whose reason names the journal and, of the fault, only what
``storage_fault`` says (the OS's words, never a file: the log has the path).

The real store is :class:`mc0.broker.storage.filestore.Journal` (segment files, CRC
recovery, fsync policies), opened and closed by the shell; the core only
ever sees this protocol.  :class:`mc0.broker.storage.memstore.MemoryStore` keeps
records in a list: the core's tests use it, so they touch no disk.

``keep`` is how the core hands a store a record, whatever the store: it
answers ``Kept``, ``(seq, token)``: either the record's seq (a local store: the record is
in the journal now, an ``append``, durable at the ``commit`` that follows)
or a token (the replicated store: the seq comes later, with the store's
answer).  The core acts on what it answered (a seq: fan the record out now
and hold its OK to the commit; a token: hold its OK for the store's answer),
not on which store it has.  A local store's ``append`` stays the publish
hot path's (no result object per record).  Three questions the answer
cannot settle still read a journal's ``settings.replicated``, each saying
why: whether the publish hot path may append (``Journaling.local``, once per
topic), a PUT's budget check and origin before anything is kept
(``verbs.put_journaled``), and a replay's ``FROM`` floor
(``Journaling.plan_replay``).

A journal whose settings say ``replicated`` (``store = "jetstream"``) is a
:class:`ReplicatedStore`: ``keep`` proposes the record, which ``commit``
hands to the store; each outcome comes back later through the core's entry
points (``BrokerCore.stored`` / ``store_failed``), with the seq known only
then; past its memory budget (``backlog``) it keeps nothing.  Its ``read``
serves the local copy the shell fills from the stream in seq order (the
same seqs on every broker); ``stored_next_seq`` says how far the store itself
is known to reach, which the local copy may not have caught up with yet, and
``following`` whether that is current.  A local store answers those as a
store that is its own copy: ``backlog`` "", ``following`` true, ``created``
"" (its seqs never start again).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Protocol, cast

from ...errors import Error
from ...message import Record
from ...protocol import PageColumns
from ...settings import JournalSettings


def storage_fault(exc: BaseException) -> str:
    """What a wire reason may say of a store's fault: the OS's own words for it (``No space left on
    device``), never the file or folder it was about (an OSError's ``str`` names it; only the broker's
    log may).  A fault without such words (a segment shorter than its index) is an I/O error."""
    words = exc.strerror if isinstance(exc, OSError) else None
    return words if isinstance(words, str) and words else "an I/O error (the broker's log has the details)"


class Trimmed(Error, LookupError):
    """A read started before the first retained record (the wire answer is 410)."""

    def __init__(self, journal: str, asked: int, first: int) -> None:
        super().__init__(f"journal {journal}: seq {asked} was trimmed by retention; the first kept is {first}")
        self.journal = journal
        self.asked = asked
        self.first = first


class JournalError(Error, OSError):
    """A file journal's folder or a segment cannot be used (a torn tail is not an error: it is truncated).
    Defined here, not in :mod:`.filestore`, which is compiled (a compiled module cannot define an
    exception class that inherits from two bases); that module exports it as its own."""


class StateUnreadable(Error, ValueError):
    """A durable consumer's saved state cannot be read (the broker refuses to start rather than guess)."""


# What ``JournalStore.keep`` answers, ``(seq, token)``: ``(seq, 0)``, the record's seq in the journal now
# (a local store: seqs start at 1), or ``(0, token)``, the proposal its seq comes later with (the
# replicated store: the OK is held for that answer, which names the token); ``NOT_KEPT``, both 0: nothing
# kept (a replicated store past its ``backlog``).  A plain tuple, unpacked where it is read: a compiled
# store builds it without an allocation of a class of its own per record (a NamedTuple's cost ~0.3 µs).
Kept = tuple[int, int]
NOT_KEPT: Kept = (0, 0)


class JournalStore(Hashable, Protocol):
    name: str
    settings: JournalSettings

    @property
    def first_seq(self) -> int: ...

    @property
    def next_seq(self) -> int: ...

    @property
    def stored_next_seq(self) -> int:
        """The seq after the last record the store is known to hold: ``next_seq``, except for a
        replicated store, whose local copy (what ``read`` gives) may lag behind its stream."""
        ...

    @property
    def pending(self) -> bool:
        """Something appended is not yet committed (written, and stored at the policy's level)."""
        ...

    @property
    def append_mark(self) -> int:
        """How many appends the store took so far (a count that only grows): a mark of what was
        appended by now, which an acknowledgement held for those records waits on."""
        ...

    @property
    def durable_mark(self) -> int:
        """Every append up to this ``append_mark`` is stored at the journal's fsync level.  ``commit``
        moves it: at once, or later for a store that syncs in the background (the file journal in the
        broker: its ``pending`` stays true until then)."""
        ...

    def duplicate_of(self, sender: str, msgid: str) -> int | None: ...

    def append(self, topic: str, sender: str, headers: Mapping[str, str], parts: Sequence[bytes]) -> int:
        """Add a record to a local store; its seq (the replicated store refuses: its records are kept)."""
        ...

    def keep(
        self, topic: str, sender: str, headers: Mapping[str, str], parts: Sequence[bytes], *, origin: str = ""
    ) -> Kept:
        """Hand the store a record: a local store appends it (``(seq, 0)``); the replicated store
        proposes it (``(0, token)``; ``NOT_KEPT`` past its ``backlog``), its dedup id made of the
        ``MSGID`` header when the journal has a dedup window.  ``origin``: who published it
        (``mc0.protocol.jetstream.origin``), carried by a store that hands its records back to every
        broker to deliver (a local store keeps no origin).  OSError as ``append``."""
        ...

    @property
    def backlog(self) -> str:
        """Why no more may be kept now ("" when they may): of the replicated store, too many records, or
        too many bytes, wait for its answer (the broker's memory budget for them); a local store: ""."""
        ...

    @property
    def following(self) -> bool:
        """``stored_next_seq`` is as far as the store is known to reach: a local store, always; the
        replicated store while its copy here is filled by a feed that follows the store.  While it is
        not (the feed restarting, or not started yet), the store may hold more than this broker knows
        of: a reader at the copy's end waits."""
        ...

    @property
    def copy_reason(self) -> str:
        """Why this broker's copy does not follow the store now ("" when it does: a local store, always)."""
        ...

    @property
    def created(self) -> str:
        """Which numbering the seqs are of: the replicated store's stream's creation time (another
        stream of that name numbers from the start again); a local store's never starts again: ""."""
        ...

    def commit(self) -> None: ...

    def enforce_retention(self, now: float) -> int: ...

    def retain_from(self, seq: int | None) -> None:
        """Retention keeps every record from ``seq`` on (None: no such floor); kept letters pin here."""
        ...

    def purge(self, upto: int | None = None) -> int:
        """Drop every record before ``upto`` (None: every record kept now); what was appended is
        committed first, and the journal goes on at its next seq (at ``upto`` when that is beyond
        it).  Returns how many records were dropped; a read before the new first seq raises
        :class:`Trimmed`.  OSError on a disk error (what was dropped before it stays dropped)."""
        ...

    def read(
        self,
        from_seq: int,
        to_seq: int | None = None,
        match: Callable[[str], bool] | None = None,
        *,
        max_records: int = 1000,
        max_bytes: int = 1 << 20,
    ) -> tuple[list[Record], int]: ...

    def read_columns(
        self,
        from_seq: int,
        to_seq: int | None = None,
        match: Callable[[str], bool] | None = None,
        *,
        max_records: int = 1000,
        max_bytes: int = 1 << 20,
    ) -> tuple[PageColumns, int]:
        """``read`` as columns (a columns page's input), the same records and ``next_seq``."""
        ...

    def count_matching(
        self, from_seq: int, match: Callable[[str], bool], *, to_seq: int | None = None, max_checked: int = 10_000
    ) -> int | None:
        """How many records ``from_seq <= seq < to_seq`` (from the first kept, if later; to the end)
        pass ``match``, or None when telling would need more than ``max_checked`` records read one
        by one (a count for a monitoring page, never worth a scan of a big journal).  Changes
        nothing but what a read changes (an unreadable record counted as a read counts it)."""
        ...

    def info(self) -> dict[str, object]: ...

    def load_consumers(self) -> dict[str, bytes]:
        """Each durable consumer's saved state (name -> the bytes ``save_consumer`` stored)."""
        ...

    def save_consumer(self, name: str, state: bytes | None) -> None:
        """Store (None: remove) a consumer's state; kept across a broker crash once this
        returns (and across losing the machine under ``fsync = "always"``).  OSError on a disk error."""
        ...

    def load_consumer_changes(self) -> dict[str, list[bytes]]:
        """The changes ``save_consumer_change`` stored after each consumer's state that
        ``load_consumers`` returns, in order (a consumer without any: absent or empty)."""
        ...

    def save_consumer_change(self, name: str, change: bytes) -> None:
        """Store a change to the consumer's state saved before it (the core defines and applies
        changes; the store keeps them in order after that state, until the next ``save_consumer``);
        kept as ``save_consumer`` keeps a state.  OSError on a disk error."""
        ...


class ReplicatedStore(JournalStore, Protocol):
    """A journal kept by a replicated store (JetStream): its records are proposed (``keep`` answers their
    tokens), and stored later; what it adds to the port is the mailboxes' journal's kept letter."""

    def letter(
        self,
        identity: str,
        topic: str,
        sender: str,
        headers: Mapping[str, str],
        parts: Sequence[bytes],
        *,
        msgid: str | None = None,
    ) -> int:
        """Propose a kept letter for ``identity`` (the journal that keeps mailboxes); its token
        (``msgid``: the store's dedup id for it)."""
        ...


def replicated(journal: JournalStore) -> ReplicatedStore | None:
    """``journal`` as a replicated store, or None when it is a local one (the mailboxes ask it: their
    letters are kept in the stream, through ``letter``, or in the room and a local journal)."""
    return cast(ReplicatedStore, journal) if journal.settings.replicated else None
