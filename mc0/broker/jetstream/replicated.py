"""ReplicatedJournal: a journal kept by JetStream, seen by this broker through a local copy.

Implements :class:`mc0.broker.storage.port.ReplicatedStore`.  Contract: the
constructor does no I/O; ``open()`` opens the local copy (a file
:class:`~mc0.broker.storage.filestore.Journal` in the journal's ``folder``, at the stream's own
seqs).  The core ``keep``s records (proposals); ``commit`` hands what was proposed to
``sink`` (the shell hands it in: the cluster link, which publishes to the stream)
and the outcome of each comes back to the core by its token.  The shell fills
the copy as the stream grows (``arrived`` in seq order, then ``flush``) and
tells it the stream's state (``stream_state``: where it starts, where it
ends, and whether it is a stream the copy was not made from, which empties
the copy).  A message of the stream that is no mc0 record (published there
by something else than a broker) is a hole in the copy: skipped by every
read, counted ``unreadable`` and logged once.  ``read``/``read_columns``/``first_seq``/``next_seq`` are the
copy's; ``stored_next_seq`` is how far the stream is known to reach (the
copy may lag it by the time the stream takes to deliver).

Losing the copy loses nothing: it is rebuilt from the stream.  So it is
written without fsync, and a torn tail after a crash is truncated and
fetched again.  A copy filled from scratch (no marker: a new broker, its data
folder lost) takes the stream's history without handing it to live
subscribers as new: live delivery starts past the stream's end as its first
``stream_state`` found it (``live_from``, kept in the marker with the stream's
creation time, and moved to the copy's end at ``close``).  A copy that cannot be written (disk full, I/O error) stops
growing where it is (``broken``, logged once): live delivery goes on from
the stream, never a silent gap in the copy; replays and fetches at this
broker stop there (504) until a restart rebuilds it.  Where the copy
stands (``copy``: :class:`~.copystate.CopyState`) comes from what its feed
says (``feed_status``), the stream's state and the copy's end, looked at by
the shell once a loop turn (``watch``): ``following`` (the port's: whether
``stored_next_seq`` is current), ``copy_reason``, and ``copy_state``,
``copy_lag`` in ``info``.  Consumers of such a journal are JetStream's
(``load_consumers`` is empty and ``save_consumer`` is not used).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from ...message import Record
from ...protocol import Header, PageColumns
from ...protocol import jetstream as jsw
from ...protocol.journalrecords import decode_payload, encode_payload
from ...settings import JournalSettings
from ..storage.filestore import Journal
from ..storage.port import NOT_KEPT, Kept, Trimmed
from .copystate import CopyState

log = logging.getLogger("mc0.journal")

MARKER = "stream.json"  # which stream the copy was made from (its creation time), and where live delivery starts
# Proposed and not yet answered by JetStream, at most (beyond: PUTs refused 429 until it catches up).
MAX_WAITING = 100_000
MAX_WAITING_BYTES = 64 << 20


class Proposal(NamedTuple):
    token: int
    subject: str
    msgid: str  # "" = none: no Nats-Msg-Id, so after a failover it is not sent again (504: outcome unknown)
    origin: str
    payload: bytes


class ReplicatedJournal:
    def __init__(
        self,
        name: str,
        settings: JournalSettings,
        *,
        sink: Callable[[str, list[Proposal]], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``sink(name, proposals)``: where ``commit`` hands what was proposed (the cluster link, which
        publishes to the stream; None: nowhere, a copy read alone)."""
        self.name = name
        self.settings = settings
        self.stream = jsw.stream_name(name)
        # The copy: no fsync (the stream is the truth), no dedup memory (the stream dedups).
        copy_settings = dataclasses.replace(settings, fsync="never", dedup_window_s=0)
        self.cache = Journal(name, copy_settings, clock=clock)
        self.folder = self.cache.folder
        self.sink = sink
        self._proposals: list[Proposal] = []
        self._tokens = itertools.count(1)
        self._stored_next = 0  # the seq after the highest the stream acknowledged or reported
        self.stream_first = 0  # the stream's first seq, as last reported
        self._waiting: dict[int, int] = {}  # token -> payload bytes, proposed and not yet answered
        self._waiting_bytes = 0
        self.created = ""  # the stream's creation time the copy belongs to
        self.counters = {"proposed": 0, "arrived": 0, "resets": 0, "copy_write_failed": 0, "unreadable": 0}
        self.broken = ""  # why the copy cannot be written ("" = it can)
        self._next_live = 0  # the seq after the last the stream delivered (duplicates are dropped by it)
        # Records before this seq only fill the copy: a copy filled from scratch (a new broker, its data
        # folder lost) takes the stream's history without handing it to live subscribers as new.
        self._live_from = 0
        self.copy = CopyState(name, self.stream)  # whether the copy follows the stream (not for letters: no copy)

    def __hash__(self) -> int:
        return id(self)

    # ------------------------------------------------------------ lifecycle (the shell)
    def open(self) -> ReplicatedJournal:
        self.cache.open()
        try:
            saved = json.loads((self.folder / MARKER).read_text())
            self.created = str(saved.get("created", ""))
            self._live_from = int(saved.get("live_from", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            self.created, self._live_from = "", 0
        return self

    def close(self) -> None:
        try:
            if self.created and not self.broken:  # (what was delivered live: not again if the copy is lost)
                self._mark(max(self._live_from, self.cache.next_seq))
        finally:
            self.cache.close()

    def _mark(self, live_from: int) -> None:
        """Write the marker: the stream the copy was made from, and where its live delivery starts."""
        self._live_from = live_from
        marker = {"stream": self.stream, "created": self.created, "live_from": live_from}
        (self.folder / MARKER).write_text(json.dumps(marker))

    # ------------------------------------------------------------ the port
    @property
    def first_seq(self) -> int:
        """The first seq a reader may ask for: the copy's, or the stream's when the stream dropped more
        (a purge or its retention this copy has not followed yet)."""
        return max(self.cache.first_seq, self.stream_first)

    @property
    def next_seq(self) -> int:
        return self.cache.next_seq

    @property
    def stored_next_seq(self) -> int:
        return max(self.cache.next_seq, self._stored_next)

    @property
    def following(self) -> bool:
        """The copy's feed follows the stream (its consumer runs), so ``stored_next_seq`` is as far as the
        stream is known to reach; while it does not, the stream may hold more than anyone here knows."""
        return self.copy.following or self.settings.mailboxes  # (letters are read from the stream: no feed)

    @property
    def copy_reason(self) -> str:
        """Why the copy does not follow its stream now ("" when it does)."""
        return self.copy.reason

    @property
    def pending(self) -> bool:
        return bool(self._proposals)

    @property
    def append_mark(self) -> int:
        return 0  # (nothing is appended: an OK waits for JetStream's answer, held by the core's replication room)

    @property
    def durable_mark(self) -> int:
        return 0

    def duplicate_of(self, sender: str, msgid: str) -> int | None:
        return None  # the stream dedups (its duplicate window)

    def append(self, topic: str, sender: str, headers: Mapping[str, str], parts: Sequence[bytes]) -> int:
        raise TypeError(f"journal {self.name} is kept by JetStream: its records are proposed, not appended")

    def keep(
        self, topic: str, sender: str, headers: Mapping[str, str], parts: Sequence[bytes], *, origin: str = ""
    ) -> Kept:
        """Propose a record (sent at ``commit``): its token, which the outcome names (``NOT_KEPT`` past
        the ``backlog``).  Its dedup id (Nats-Msg-Id) is made of its MSGID when the journal has a dedup
        window (without one, it is never sent twice, so after a failover before its acknowledgement its
        outcome is unknown: 504)."""
        if self.backlog:
            return NOT_KEPT
        msgid = headers.get(Header.MSGID)
        store_id = jsw.msg_id(sender, msgid) if msgid is not None and self.settings.dedup_window_s else ""
        token = next(self._tokens)
        payload = encode_payload(topic, sender, headers, parts)
        self._proposals.append(Proposal(token, jsw.subject(self.name, topic), store_id, origin, payload))
        self._wait(token, len(payload))
        return (0, token)

    def _wait(self, token: int, size: int) -> None:
        self._waiting[token] = size
        self._waiting_bytes += size
        self.counters["proposed"] += 1

    @property
    def backlog(self) -> str:
        if len(self._waiting) >= MAX_WAITING or self._waiting_bytes >= MAX_WAITING_BYTES:
            return (
                f"{len(self._waiting)} records ({self._waiting_bytes} bytes) wait for JetStream's answer, "
                f"the broker's budget ({MAX_WAITING} records, {MAX_WAITING_BYTES} bytes): send again later"
            )
        return ""

    def answered(self, token: int) -> None:
        """JetStream answered proposal ``token`` (stored or not): it no longer counts against the budget."""
        size = self._waiting.pop(token, None)
        if size is not None:
            self._waiting_bytes -= size

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
        """Propose a kept letter for ``identity`` (the journal that keeps mailboxes): on its own subject
        (``msgid``: its Nats-Msg-Id, the stream's dedup)."""
        token = next(self._tokens)
        payload = encode_payload(topic, sender, headers, parts)
        self._proposals.append(Proposal(token, jsw.letter_subject(self.name, identity), msgid or "", "", payload))
        self._wait(token, len(payload))
        return token

    def commit(self) -> None:
        proposals, self._proposals = self._proposals, []
        if proposals and self.sink is not None:
            self.sink(self.name, proposals)

    def enforce_retention(self, now: float) -> int:
        """The copy keeps no more than the stream (and no more than its own size and age bounds)."""
        removed = self.cache.enforce_retention(now)
        if self.stream_first:
            removed += self.cache.trim_before(self.stream_first)
        return removed

    def retain_from(self, seq: int | None) -> None:
        """Nothing to pin: letters live in the stream until they are delivered."""

    def purge(self, upto: int | None = None) -> int:
        """The stream was purged before ``upto`` (the operator's purge, done by one broker for the
        cluster): the copy drops the same records, and what the stream delivers of them later is
        skipped (None: every record the stream is known to hold)."""
        end = self.stored_next_seq if upto is None else upto
        self.stream_first = max(self.stream_first, end)
        self.acknowledged(end - 1)
        self._next_live = max(self._next_live, end)
        if self.broken:
            return 0
        try:
            return self.cache.purge(end)
        except OSError as exc:
            self._break(exc)
            return 0

    def read(
        self,
        from_seq: int,
        to_seq: int | None = None,
        match: Callable[[str], bool] | None = None,
        *,
        max_records: int = 1000,
        max_bytes: int = 1 << 20,
    ) -> tuple[list[Record], int]:
        self._readable_from(from_seq)
        return self.cache.read(from_seq, to_seq, match, max_records=max_records, max_bytes=max_bytes)

    def count_matching(
        self, from_seq: int, match: Callable[[str], bool], *, to_seq: int | None = None, max_checked: int = 10_000
    ) -> int | None:
        """Of the local copy (what ``read`` gives): records of the stream it has not yet are not counted."""
        from_seq = max(from_seq, self.stream_first)
        return self.cache.count_matching(from_seq, match, to_seq=to_seq, max_checked=max_checked)

    def read_columns(
        self,
        from_seq: int,
        to_seq: int | None = None,
        match: Callable[[str], bool] | None = None,
        *,
        max_records: int = 1000,
        max_bytes: int = 1 << 20,
    ) -> tuple[PageColumns, int]:
        self._readable_from(from_seq)
        return self.cache.read_columns(from_seq, to_seq, match, max_records=max_records, max_bytes=max_bytes)

    def _readable_from(self, from_seq: int) -> None:
        """A read before the stream's first seq is of records the stream no longer holds: 410 (Trimmed),
        whatever the copy still has (a purge it was not told of, before it follows it)."""
        if from_seq < self.stream_first:
            raise Trimmed(self.name, from_seq, self.stream_first)

    def info(self) -> dict[str, object]:
        copy = self.cache.info()
        return {
            **copy,
            "first_seq": self.first_seq,
            "next_seq": self.stored_next_seq,  # what a reader may ask for (a fetch waits for the copy)
            "records": max(0, self.stored_next_seq - self.first_seq),
            "fsync": self.settings.fsync,
            "store": self.settings.store,
            "stream": self.stream,
            "replicas": self.settings.replicas,
            "copy_next_seq": self.cache.next_seq,
            **self._copy_info(),
            "dedup_window_s": self.settings.dedup_window_s,
            # Messages of the stream that are no mc0 record: skipped (holes in the copy).
            "unreadable": self.counters["unreadable"] + self.cache.counters["unreadable"],
        }

    def _copy_info(self) -> dict[str, object]:
        """Where the local copy stands: its state (``copystate``), the records the stream is known to hold
        past it, why it does not follow (""), how often it got stuck.  None for letters: no copy."""
        if self.settings.mailboxes:
            return {}
        return {
            "copy_state": self.copy.state,
            "copy_lag": max(0, self.stored_next_seq - self.cache.next_seq),
            "copy_reason": self.copy.reason,
            "copy_stuck_times": self.copy.stuck_times,
        }

    def load_consumers(self) -> dict[str, bytes]:
        return {}  # JetStream keeps them

    def save_consumer(self, name: str, state: bytes | None) -> None:
        raise TypeError(f"journal {self.name} is kept by JetStream: its consumers are JetStream's")

    def load_consumer_changes(self) -> dict[str, list[bytes]]:
        return {}  # JetStream keeps them

    def save_consumer_change(self, name: str, change: bytes) -> None:
        raise TypeError(f"journal {self.name} is kept by JetStream: its consumers are JetStream's")

    # ------------------------------------------------------------ filled by the shell
    def acknowledged(self, seq: int) -> None:
        """The stream acknowledged a record at ``seq`` (readers may ask for it: the copy will follow)."""
        if seq >= self._stored_next:
            self._stored_next = seq + 1

    def arrived(self, seq: int, ts: float, payload: bytes) -> Record | None:
        """A record the stream delivered, in seq order: the record, if it is new (None if the copy,
        or with the copy broken the live stream, had it, or if it only fills a copy made from scratch:
        older than the stream's end when the copy started).  A message that is no mc0 record (anything
        a NATS user allowed the stream's subjects published there) is None too: the copy keeps a
        hole at its seq, so the seqs stay the stream's and every read skips it; counted
        ``unreadable`` and logged once."""
        try:
            record: Record | None = decode_payload(seq, ts, payload, 0, len(payload))
        except (ValueError, struct.error) as exc:
            record = None
            if seq >= max(self._next_live, self.cache.next_seq):
                self._unreadable(seq, exc)
            payload = b""
        if not self.broken:
            try:
                appended = self.cache.append_at(seq, ts, payload)
            except OSError as exc:
                self._break(exc)
            else:
                if not appended:
                    return None
                self.counters["arrived"] += 1
                self.acknowledged(seq)
                self._next_live = max(self._next_live, seq + 1)
                return record if seq >= self._live_from else None
        if seq < max(self._next_live, self.cache.next_seq):
            return None
        self.counters["arrived"] += 1
        self.acknowledged(seq)
        self._next_live = seq + 1
        return record if seq >= self._live_from else None

    def _unreadable(self, seq: int, exc: Exception) -> None:
        self.counters["unreadable"] += 1
        if self.counters["unreadable"] == 1:
            log.warning(
                "journal %s: seq %d of stream %s is not an mc0 record (%s: written by something else than a "
                "broker): skipped, here and at every read; further ones are only counted (unreadable)",
                self.name,
                seq,
                self.stream,
                exc,
            )

    def flush(self) -> None:
        """Write what arrived to the OS (readers see it either way)."""
        if self.broken:
            return
        try:
            self.cache.commit(sync=False)
        except OSError as exc:
            self._break(exc)

    def _break(self, exc: OSError) -> None:
        """The copy cannot be written: it stays where it is (what it holds is still served) and
        what arrives goes on to live subscribers only; a restart rebuilds it from the stream."""
        self.counters["copy_write_failed"] += 1
        self.broken = f"{type(exc).__name__}: {exc}"
        log.error(
            "journal %s: the local copy cannot be written (%s): it stops at seq %d; live delivery goes on, "
            "replays and fetches at this broker stop there until a restart rebuilds the copy",
            self.name,
            self.broken,
            self.cache.next_seq,
        )

    def feed_status(self, following: bool, reason: str, now: float) -> None:
        """What the copy's feed said: its consumer runs, or not (``reason``: why)."""
        self.copy.feed(following, reason, now)

    def watch(self, now: float) -> None:
        """The copy's state as of ``now`` (the shell calls it once a loop turn): stuck is logged once."""
        if not self.settings.mailboxes:
            self.copy.watch(now, self.cache.next_seq, self.stored_next_seq, self.broken)

    def stream_state(self, first: int, last: int, created: str, start: int) -> None:
        """The stream as the link found it: ``first``..``last``, made at ``created``; its records
        arrive from ``start`` on.  A copy of another stream (or one that ran past this one's end)
        starts again, empty, at ``start``.  A stream whose first seq passed the copy's (purged while
        this broker was away, or by NATS's own tools, or its own retention) is followed: the copy
        drops what the stream dropped."""
        self.copy.learnt()
        self.stream_first = first
        if created != self.created or self.cache.next_seq > last + 1:
            scratch = not self.created  # no marker: a new broker, or its data folder lost
            if self.cache.next_seq > self.cache.first_seq or self.created:
                log.warning("journal %s: local copy of %s started again at seq %d", self.name, self.stream, start)
                self.counters["resets"] += 1
            # Another stream (or this one recreated): what was known of the old one's end no longer holds.
            self._stored_next = 0
            self._next_live = 0
            self.created = created
            # Filled from scratch, the copy takes the stream's history without handing it to live
            # subscribers (nor queue groups their work again): live delivery starts past its end now.
            # Another stream's records (one made anew) are new here: delivered.
            self._live_from = last + 1 if scratch else 0
            if not self.broken:
                try:
                    self.cache.reset(start)
                    self._mark(self._live_from)
                except OSError as exc:
                    self._break(exc)
        if first > self.cache.first_seq and not self.broken:
            try:
                self.cache.purge(first)
            except OSError as exc:
                self._break(exc)
        self.acknowledged(last)

    def position(self) -> tuple[int, str]:
        """(the copy's next seq, the stream it was made from): where the link's delivery starts."""
        return self.cache.next_seq, self.created
