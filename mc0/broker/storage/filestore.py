"""Journal: the file-backed journal store, an append-only, segmented, replayable log of PUTs.

Implements :class:`mc0.broker.storage.port.JournalStore`; the broker shell opens,
owns and closes it, the core only appends, commits and reads through that
port.  Contract: the constructor does no I/O; ``open()`` scans the folder, checks
every record's CRC and truncates a torn tail (a crash mid-write), then
``append`` gives each record the next sequence number (1, 2, ...).  What
``append`` returns is *written* only after ``commit()`` (the broker commits
once per receive batch, then sends the OKs): ``never`` writes to the OS,
``batch`` also fsyncs once per commit, ``always`` writes and fsyncs every
record as it is appended.  A record written to the OS survives ``kill -9``
of the broker; ``batch``/``always`` also survive losing the machine.
``durable_mark`` says how far that holds: every append up to that
``append_mark`` is stored at the policy's level.  With ``on_synced`` (the
broker's loop) a ``batch`` journal's ``commit()`` writes and returns, and
its fsync runs on a thread (:mod:`.syncer`), which calls ``on_synced()``
after each: ``durable_mark`` moves then (and ``pending`` stays true until it
has); an explicit ``commit(sync=True)``, a segment roll and ``close`` still
fsync at once.

Reads (``read``) are deterministic: the same ``[from_seq, to_seq)`` and
filter give the same records until retention trims them, after which
``read`` raises :class:`Trimmed`.  Retention deletes whole segments, oldest
first, beyond ``max_bytes`` or older than ``max_age_s``; the active segment
is never deleted, nor is a segment holding a record at or after the seq given
to ``retain_from`` (a kept mailbox letter: retention waits for it to be
delivered or to expire).  ``(sender, MSGID)`` pairs are remembered for
``dedup_window_s`` (at most ``dedup_max_ids`` of them), so a publisher's
retry is stored once; the dedup memory is rebuilt from the segments on open.

File format (little endian), one file per segment named by its first seq::

    record  = head payload
    head    = u32 payload_len, u32 crc32(seq ts payload), u64 seq, f64 ts
    payload = u16 topic_len, u16 sender_len, u16 n_headers, u16 n_parts,
              topic, sender, n_headers * (u16 klen, u32 vlen, key, value),
              n_parts * (u32 len, bytes)

A record with an empty payload is a hole (``append_at``: a seq a JetStream
journal's stream holds that is no mc0 record); readers skip it.  A record
whose payload cannot be decoded (a copy written before holes existed) is
skipped too, counted ``unreadable`` and logged once: a read never fails on
one record's bytes.

Memory per journal: 9 bytes per retained record (the offset index and the
topic index, :mod:`.topicindex`: a filtered read skips what cannot match
without reading it) plus the dedup memory.  Wall-clock time comes from the injected ``clock``.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ...message import Record
from ...protocol import Header, PageColumns, page_columns
from ...protocol.journalrecords import (
    HEAD_BYTES,
    MAX_PAYLOAD,
    decode_payload,
    encode_body_record,
    encode_payload,
    encode_record,
    frame_payload,
    payload_columns,
    payload_prefix,
    payload_topic,
    read_head,
    record_crc,
)
from ...settings import FSYNC_POLICIES, JournalSettings
from .consumerfiles import ConsumerFiles, fsync_dir
from .port import JournalError, Kept, Trimmed
from .syncer import Syncer
from .topicindex import TopicIndex, select

__all__ = [
    "FSYNC_POLICIES",
    "Journal",
    "JournalError",
    "JournalSettings",
    "Trimmed",
    "decode_payload",
    "encode_payload",
    "encode_record",
]

log = logging.getLogger("mc0.journal")

CONSUMER_FOLDER = "consumers"  # durable consumers' state: a log and a snapshot each
SEGMENT_SUFFIX = ".seg"
PREFIXES = 1024  # (topic, sender) pairs whose payload head is kept for appends (a cache: cleared when full)


class _Segment:
    __slots__ = ("first_seq", "path", "offsets", "topics", "size", "first_ts", "last_ts", "fd")

    def __init__(self, first_seq: int, path: Path) -> None:
        self.first_seq = first_seq
        self.path = path
        self.offsets = array("Q")  # record i (seq first_seq + i) starts here
        self.topics = TopicIndex()  # record i's topic (kept beside offsets; a read trusts it only when as long)
        self.size = 0  # bytes on disk (and in the write buffer, for the active segment)
        self.first_ts: float | None = None
        self.last_ts = 0.0
        self.fd = -1

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.offsets)


class Journal:
    def __init__(
        self,
        name: str,
        settings: JournalSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        on_synced: Callable[[], None] | None = None,
    ):
        self.name = name
        self.settings = settings or JournalSettings()
        self.folder = self.settings.path(name)
        self.clock = clock
        self._segments: list[_Segment] = []
        self._firsts: list[int] = []  # first_seq of each segment, for bisect
        self._buffer = bytearray()  # appended, not yet written to the OS
        self._buffer_start = 0  # file offset of the buffer's first byte (active segment)
        self._dirty = False  # written to the OS but not fsynced
        self._appends = 0  # append_mark: appends so far (never goes back, not even for a withdrawn write)
        self._written = 0  # the append mark the last write reached
        self._durable = 0  # ... and the last fsync (or, under fsync = "never", the last write)
        self._asked = 0  # the mark the sync thread was last asked for
        self._fsyncs_counted = 0  # the sync thread's fsyncs already in counters["fsyncs"]
        self._prefixes: dict[tuple[str, str], bytes] = {}  # (topic, sender) -> records.payload_prefix
        background = on_synced is not None and (settings or JournalSettings()).fsync == "batch"
        self._syncer = Syncer(name, on_synced) if background and on_synced is not None else None
        self._dedup: dict[tuple[str, str], tuple[int, float]] = {}  # insertion (= time) order
        self._opened = False
        self._floor: int | None = None  # retain_from: retention keeps this seq and later
        self.counters = {"appended": 0, "fsyncs": 0, "trimmed_segments": 0, "truncated_bytes": 0, "unreadable": 0}
        self._unreadable_seen: set[int] = set()  # seqs counted unreadable (each is counted and logged once)
        self._consumer_files = ConsumerFiles(self.folder / CONSUMER_FOLDER, sync=self.settings.fsync == "always")

    # ------------------------------------------------------------ lifecycle
    def open(self) -> Journal:
        """Create or recover the folder (torn tails are truncated); idempotent."""
        if self._opened:
            return self
        try:
            self._open()
        except OSError as exc:
            if isinstance(exc, JournalError):
                raise
            raise JournalError(f"journal {self.name}: {self.folder}: {exc.strerror or exc}") from None
        return self

    def _open(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        names = sorted(p for p in self.folder.iterdir() if p.name.endswith(SEGMENT_SUFFIX))
        expected: int | None = None
        for path in names:
            stem = path.name[: -len(SEGMENT_SUFFIX)]
            if not stem.isdigit():
                log.warning("journal %s: ignoring %s (not a segment name)", self.name, path)
                continue
            if int(stem) == 0:  # seqs start at 1 (the port's contract): a folder made by hand, or copied wrong
                raise JournalError(f"journal {self.name}: {path} starts at seq 0; seqs start at 1: move it out")
            segment = _Segment(int(stem), path)
            if expected is not None and segment.first_seq != expected:
                log.error("journal %s: gap before %s (expected seq %d)", self.name, path.name, expected)
            self._scan(segment)
            if not segment.offsets and self._segments:
                path.unlink()  # an empty segment left by a crash right after a roll
                continue
            self._segments.append(segment)
            expected = segment.next_seq
        if not self._segments:
            self._segments.append(self._new_segment(1))
        self._firsts = [s.first_seq for s in self._segments]
        active = self._segments[-1]
        active.fd = os.open(active.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self._buffer_start = active.size
        self._opened = True
        self._rebuild_dedup()

    def _new_segment(self, first_seq: int) -> _Segment:
        segment = _Segment(first_seq, self.folder / f"{first_seq:020d}{SEGMENT_SUFFIX}")
        fd = os.open(segment.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        os.close(fd)
        fsync_dir(self.folder)
        return segment

    def _scan(self, segment: _Segment) -> None:
        """Index a segment's records; truncate it at the first torn or corrupt record."""
        try:
            data = segment.path.read_bytes()
        except OSError as exc:
            raise JournalError(f"journal {self.name}: cannot read {segment.path}: {exc.strerror}") from None
        pos = 0
        seq = segment.first_seq
        view = memoryview(data)
        while pos + HEAD_BYTES <= len(data):
            length, crc, rec_seq, ts = read_head(data, pos)
            end = pos + HEAD_BYTES + length
            if length > MAX_PAYLOAD or end > len(data) or rec_seq != seq:
                break
            if record_crc(view[pos + HEAD_BYTES : end], rec_seq, ts) != crc:
                break
            segment.offsets.append(pos)
            segment.topics.add_payload(data, pos + HEAD_BYTES, end)
            if segment.first_ts is None:
                segment.first_ts = ts
            segment.last_ts = ts
            seq += 1
            pos = end
        if pos < len(data):
            log.warning(
                "journal %s: %s: truncating %d bytes after seq %d (torn or corrupt record)",
                self.name,
                segment.path.name,
                len(data) - pos,
                seq - 1,
            )
            self.counters["truncated_bytes"] += len(data) - pos
            os.truncate(segment.path, pos)
        segment.size = pos

    def _rebuild_dedup(self) -> None:
        window = self.settings.dedup_window_s
        if not window:
            return
        horizon = self.clock() - window
        for segment in self._segments:
            if segment.last_ts < horizon:
                continue
            for record in self._read_segment(segment, segment.first_seq, segment.next_seq, None):
                msgid = record.headers.get(Header.MSGID)
                if msgid is not None and record.ts >= horizon:
                    self._remember(record.sender, msgid, record.seq, record.ts)

    def close(self) -> None:
        """Write and fsync what is buffered; close files (idempotent)."""
        if not self._opened:
            return
        try:
            self.commit(sync=self.settings.fsync != "never")
        finally:
            if self._syncer is not None:
                self._syncer.close()
            for segment in self._segments:
                if segment.fd >= 0:
                    os.close(segment.fd)
                    segment.fd = -1
            self._consumer_files.close()
            self._opened = False

    # ------------------------------------------------------------ writing
    @property
    def first_seq(self) -> int:
        return self._segments[0].first_seq

    @property
    def next_seq(self) -> int:
        return self._segments[-1].next_seq

    @property
    def stored_next_seq(self) -> int:
        return self.next_seq

    @property
    def pending(self) -> bool:
        """Something appended is not yet written (and synced, per the policy)."""
        return bool(self._buffer) or self._dirty or self.durable_mark < self._written

    @property
    def append_mark(self) -> int:
        """How many appends this journal took (a count that only grows): what was appended by now."""
        return self._appends

    @property
    def durable_mark(self) -> int:
        """Every append up to this ``append_mark`` is stored at the fsync policy's level."""
        syncer = self._syncer
        return self._durable if syncer is None else max(self._durable, syncer.synced)

    def duplicate_of(self, sender: str, msgid: str) -> int | None:
        """The seq of an earlier record with this ``(sender, MSGID)`` inside the dedup window."""
        if not self.settings.dedup_window_s:
            return None
        self._expire_dedup(self.clock())
        seen = self._dedup.get((sender, msgid))
        return seen[0] if seen is not None else None

    def append(self, topic: str, sender: str, headers: Mapping[str, str], parts: Sequence[bytes]) -> int:
        """Add a record; returns its seq.  Durable only after ``commit()`` (see the module doc)."""
        active = self._segments[-1]
        seq = active.first_seq + len(active.offsets)
        ts = self.clock()
        if not headers and len(parts) == 1:  # a PUT record's shape: its topic and sender's bytes are kept
            prefix = self._prefixes.get((topic, sender))
            if prefix is None:
                if len(self._prefixes) >= PREFIXES:
                    self._prefixes.clear()
                prefix = self._prefixes[topic, sender] = payload_prefix(topic, sender)
            body = parts[0]
            data = encode_body_record(seq, ts, prefix, body if type(body) is bytes else bytes(body))
        else:
            data = encode_record(seq, ts, topic, sender, headers, parts)
        if active.offsets and active.size + len(data) > self.settings.segment_bytes:
            active = self._roll(seq)
        active.offsets.append(active.size)
        active.topics.add(topic)
        active.size += len(data)
        if active.first_ts is None:
            active.first_ts = ts
        active.last_ts = ts
        self._buffer += data
        self.counters["appended"] += 1
        self._appends += 1
        msgid = headers.get(Header.MSGID) if headers else None
        if msgid is not None and self.settings.dedup_window_s:
            self._remember(sender, msgid, seq, ts)
        if self.settings.fsync == "always":
            self.commit()
        return seq

    def keep(
        self, topic: str, sender: str, headers: Mapping[str, str], parts: Sequence[bytes], *, origin: str = ""
    ) -> Kept:
        """``append``, answered as the port's ``keep`` (the seq now; ``origin`` is not kept here)."""
        return (self.append(topic, sender, headers, parts), 0)

    @property
    def backlog(self) -> str:
        return ""  # (nothing waits for an answer: a record is in the journal once appended)

    @property
    def following(self) -> bool:
        return True  # (the journal is its own store: nothing is held past what it reads)

    @property
    def copy_reason(self) -> str:
        return ""

    @property
    def created(self) -> str:
        return ""  # (its seqs never start again)

    def append_at(self, seq: int, ts: float, payload: bytes) -> bool:
        """Add a record another store numbered (a JetStream journal's local copy): ``payload`` as
        ``encode_payload`` made it, at ``seq`` and ``ts`` (an empty ``payload``: a hole, a seq that
        holds no record, which readers skip).  A seq already held is skipped (False);
        one past a gap (records the stream deleted) starts a new segment there.  Written to the OS
        at the next ``commit``."""
        active = self._segments[-1]
        if seq < active.next_seq:
            return False
        if seq > active.next_seq:
            if active.offsets:
                active = self._roll(seq)
            else:  # an empty segment: it starts where the records do
                self._replace_empty(seq)
                active = self._segments[-1]
        data = frame_payload(seq, ts, payload)
        if active.offsets and active.size + len(data) > self.settings.segment_bytes:
            active = self._roll(seq)
        active.offsets.append(active.size)
        active.topics.add_payload(payload, 0, len(payload))
        active.size += len(data)
        if active.first_ts is None:
            active.first_ts = ts
        active.last_ts = ts
        self._buffer += data
        self.counters["appended"] += 1
        self._appends += 1
        return True

    def _replace_empty(self, first_seq: int) -> None:
        """The active segment holds nothing: it starts at ``first_seq`` instead."""
        self._settle()
        empty = self._segments.pop()
        self._firsts.pop()
        if empty.fd >= 0:
            os.close(empty.fd)
        empty.path.unlink(missing_ok=True)
        segment = self._new_segment(first_seq)
        segment.fd = os.open(segment.path, os.O_WRONLY | os.O_APPEND)
        self._segments.append(segment)
        self._firsts.append(first_seq)
        self._buffer_start = 0

    def reset(self, first_seq: int) -> None:
        """Drop every record; the journal starts again, empty, at ``first_seq`` (a local copy whose
        stream was created anew)."""
        self._settle()
        self._buffer.clear()
        self._dirty = False
        self._written = self._durable = self._appends  # (nothing is left to write)
        for segment in self._segments[:-1]:
            segment.path.unlink(missing_ok=True)
        del self._segments[:-1]
        del self._firsts[:-1]
        active = self._segments[-1]
        if active.offsets or active.first_seq != first_seq:
            active.offsets = array("Q")
            active.topics = TopicIndex()
            active.size = 0
            self._replace_empty(first_seq)
        self._dedup.clear()

    def trim_before(self, seq: int) -> int:
        """Delete whole segments whose records all come before ``seq`` (the active one stays)."""
        removed = 0
        while len(self._segments) > 1 and self._segments[0].next_seq <= seq:
            oldest = self._segments.pop(0)
            self._firsts.pop(0)
            oldest.path.unlink(missing_ok=True)
            removed += 1
        self.counters["trimmed_segments"] += removed
        return removed

    def purge(self, upto: int | None = None) -> int:
        """Drop every record before ``upto`` (None: every record); the journal goes on at its next seq
        (at ``upto`` when that is beyond it).  What was appended is committed first.  Whole segments
        are deleted; the first one left, when it still starts before ``upto``, is written anew from
        ``upto`` on.  The dedup memory stays (a retry of a purged message is still its duplicate).
        Returns how many records were dropped."""
        self.commit()
        end = self.next_seq if upto is None else upto
        first = self.first_seq
        if end <= first:
            return 0
        dropped = min(end, self.next_seq) - first
        if end >= self.next_seq:
            dedup = dict(self._dedup)  # (reset empties it)
            self.reset(end)
            self._dedup = dedup
        else:
            self.trim_before(end)
            if self._segments[0].first_seq < end:
                self._rewrite_head(end)
        log.info("journal %s: purged %d records (the first kept is now %d)", self.name, dropped, self.first_seq)
        return dropped

    def _rewrite_head(self, start: int) -> None:
        """The first segment holds records before ``start``: written anew from ``start`` on (a new file
        named by ``start``, then the old one removed; a crash between leaves both, the old one's
        records still readable, never a record lost)."""
        self._settle()
        head = self._segments[0]
        data = self._segment_bytes(head, start, head.next_seq)
        segment = _Segment(start, self.folder / f"{start:020d}{SEGMENT_SUFFIX}")
        fd = os.open(segment.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, memoryview(data)[written:])
            if self.settings.fsync != "never":
                os.fsync(fd)
        finally:
            os.close(fd)
        self._scan(segment)
        if len(self._segments) == 1:  # the active one: appends go on in the new file
            os.close(head.fd)
            head.fd = -1
            segment.fd = os.open(segment.path, os.O_WRONLY | os.O_APPEND)
            self._buffer_start = segment.size
        self._segments[0] = segment
        self._firsts[0] = start
        head.path.unlink(missing_ok=True)
        fsync_dir(self.folder)

    def commit(self, *, sync: bool | None = None) -> None:
        """Write the buffer to the OS and fsync per the policy (``sync`` overrides).

        On an OSError the records not written are withdrawn (their seqs are
        reused) and the error is raised: their publishers must not get OK.
        """
        if self._buffer:
            active = self._segments[-1]
            try:
                written = os.write(active.fd, self._buffer)
                while written < len(self._buffer):
                    written += os.write(active.fd, memoryview(self._buffer)[written:])
            except OSError:
                self._withdraw_buffer(active)
                raise
            self._buffer_start += len(self._buffer)
            self._buffer.clear()
            self._dirty = True
            self._written = self._appends
        syncer = self._syncer
        if syncer is not None and sync is None:  # the sync thread fsyncs (fsync = "batch", the broker's loop)
            done = syncer.fsyncs
            self.counters["fsyncs"] += done - self._fsyncs_counted
            self._fsyncs_counted = done
            error = syncer.take_error()
            if error is not None:
                self._asked = self.durable_mark  # (the next commit asks again)
                self._dirty = True
                raise error
            if self._dirty and self._written > self._asked:
                self._asked = self._written
                syncer.request(self._segments[-1].fd, self._written)
            self._dirty = False  # (pending and durable_mark now ask the sync thread)
            return
        if sync is None:
            sync = self.settings.fsync != "never"
        if self._dirty and sync:
            if syncer is not None:
                syncer.settle()  # (one fsync at a time on a file)
            os.fsync(self._segments[-1].fd)
            self.counters["fsyncs"] += 1
        if sync or self.settings.fsync == "never":
            self._dirty = False
            self._durable = self._written

    def _settle(self) -> None:
        """No fsync runs on the sync thread (before a file descriptor it may use is closed or replaced)."""
        if self._syncer is not None:
            self._syncer.settle()

    def _withdraw_buffer(self, active: _Segment) -> None:
        try:
            os.ftruncate(active.fd, self._buffer_start)
        except OSError:
            pass
        while active.offsets and active.offsets[-1] >= self._buffer_start:
            active.offsets.pop()
        active.topics.truncate(len(active.offsets))
        active.size = self._buffer_start
        self._buffer.clear()
        last = active.next_seq
        self._dedup = {k: v for k, v in self._dedup.items() if v[0] < last}

    def _roll(self, first_seq: int) -> _Segment:
        self.commit(sync=self.settings.fsync != "never")
        self._settle()
        old = self._segments[-1]
        os.close(old.fd)
        old.fd = -1
        segment = self._new_segment(first_seq)
        segment.fd = os.open(segment.path, os.O_WRONLY | os.O_APPEND)
        self._segments.append(segment)
        self._firsts.append(first_seq)
        self._buffer_start = 0
        self.enforce_retention(self.clock())
        return segment

    def _remember(self, sender: str, msgid: str, seq: int, ts: float) -> None:
        key = (sender, msgid)
        self._dedup.pop(key, None)
        self._dedup[key] = (seq, ts)
        while len(self._dedup) > self.settings.dedup_max_ids:
            del self._dedup[next(iter(self._dedup))]

    def _expire_dedup(self, now: float) -> None:
        horizon = now - self.settings.dedup_window_s
        dedup = self._dedup
        while dedup:
            key = next(iter(dedup))
            if dedup[key][1] >= horizon:
                break
            del dedup[key]

    def enforce_retention(self, now: float) -> int:
        """Delete whole segments beyond max_bytes / older than max_age_s; returns how many."""
        settings = self.settings
        removed = 0
        while len(self._segments) > 1:
            oldest = self._segments[0]
            if self._floor is not None and oldest.next_seq > self._floor:
                break  # it holds a record retention must keep (a kept letter)
            total = sum(s.size for s in self._segments)
            too_big = settings.max_bytes and total > settings.max_bytes
            too_old = settings.max_age_s and oldest.last_ts < now - settings.max_age_s
            if not (too_big or too_old):
                break
            self._segments.pop(0)
            self._firsts.pop(0)
            try:
                oldest.path.unlink()
            except FileNotFoundError:
                pass
            removed += 1
            log.info("journal %s: retention removed %s", self.name, oldest.path.name)
        self.counters["trimmed_segments"] += removed
        return removed

    def retain_from(self, seq: int | None) -> None:
        """Retention keeps every segment holding ``seq`` or later (None: no floor)."""
        self._floor = seq

    # ------------------------------------------------------------ reading
    def read(
        self,
        from_seq: int,
        to_seq: int | None = None,
        match: Callable[[str], bool] | None = None,
        *,
        max_records: int = 1000,
        max_bytes: int = 1 << 20,
    ) -> tuple[list[Record], int]:
        """Records with ``from_seq <= seq < to_seq`` whose topic passes ``match``.

        Returns ``(records, next_seq)``: where to continue (``to_seq`` or the
        journal's end once everything in range was read).  Stops after
        ``max_records`` records scanned or about ``max_bytes`` read (at least
        one record), so a page is bounded whatever the filter skips.
        """
        records: list[Record] = []
        chunks, seq = self._chunks(from_seq, to_seq, max_records, max_bytes)
        for segment, start, stop in chunks:
            records += self._read_segment(segment, start, stop, match)
        return records, seq

    def read_columns(
        self,
        from_seq: int,
        to_seq: int | None = None,
        match: Callable[[str], bool] | None = None,
        *,
        max_records: int = 1000,
        max_bytes: int = 1 << 20,
    ) -> tuple[PageColumns, int]:
        """``read`` as columns, straight from the segment bytes (no Record objects: a columns page's input)."""
        columns = PageColumns([], [], [], [], [], [], [], [], [])
        chunks, seq = self._chunks(from_seq, to_seq, max_records, max_bytes)
        for segment, start, stop in chunks:
            data = self._segment_bytes(segment, start, stop)
            sizes = {name: len(getattr(columns, name)) for name in columns._fields}
            check = match
            if match is not None:
                data, check = self._candidates(segment, start, stop, data, match)
            try:
                payload_columns(data, check, columns)
            except (struct.error, ValueError):  # a record that is no mc0 record: this chunk record by record
                more = page_columns(self._read_segment(segment, start, stop, match))
                for name, size in sizes.items():
                    column = getattr(columns, name)
                    del column[size:]
                    column.extend(getattr(more, name))
        return columns, seq

    def count_matching(
        self, from_seq: int, match: Callable[[str], bool], *, to_seq: int | None = None, max_checked: int = 10_000
    ) -> int | None:
        """By the topic index (``match`` asked once per topic a segment names, then one byte per
        record): the records the index cannot name (past a segment's 255 topics, or unreadable) are
        read, from the first such to the last of each segment, at most ``max_checked`` in all, else None."""
        if self._buffer:
            self.commit(sync=False)  # as a read: everything appended counts
        count = 0
        from_seq = max(from_seq, self.first_seq)
        end = self.next_seq if to_seq is None else min(to_seq, self.next_seq)
        index = max(0, bisect.bisect_right(self._firsts, from_seq) - 1)
        for segment in self._segments[index:]:
            start, stop = max(from_seq, segment.first_seq), min(end, segment.next_seq)
            if segment.first_seq >= end:
                break
            if start >= stop:
                continue
            topics = segment.topics
            i, j = start - segment.first_seq, stop - segment.first_seq
            if len(topics.ids) != len(segment.offsets):  # (never expected: then every record is read)
                flags = bytearray(b"\2") * (j - i)
            else:
                flags = topics.flags(i, j, match)
            count += flags.count(1)
            first = flags.find(2)
            if first >= 0:
                last = flags.rfind(2)
                max_checked -= last + 1 - first  # read as one range: every record of it costs
                if max_checked < 0:
                    return None
                records = self._read_segment(segment, start + first, start + last + 1, match)
                count += sum(1 for r in records if flags[r.seq - start] == 2)
        return count

    @staticmethod
    def _candidates(
        segment: _Segment, start: int, stop: int, data: bytes, match: Callable[[str], bool]
    ) -> tuple[bytes, Callable[[str], bool] | None]:
        """Of ``data`` (records ``[start, stop)`` of the segment) the records whose topic may pass
        ``match``, by the topic index, and the filter still to apply to them (:func:`.topicindex.select`)."""
        index = segment.topics
        if len(index.ids) != len(segment.offsets):  # (never expected: then every record is checked)
            return data, match
        i, j = start - segment.first_seq, stop - segment.first_seq
        return select(data, segment.offsets[i:j], index.flags(i, j, match), match)

    def _chunks(
        self, from_seq: int, to_seq: int | None, max_records: int, max_bytes: int
    ) -> tuple[list[tuple[_Segment, int, int]], int]:
        """The segment ranges ``[start, stop)`` a read covers within its budgets, and where it ends."""
        if from_seq < self.first_seq:
            raise Trimmed(self.name, from_seq, self.first_seq)
        end = self.next_seq if to_seq is None else min(to_seq, self.next_seq)
        if self._buffer:
            self.commit(sync=False)  # readers see everything appended, synced or not
        chunks: list[tuple[_Segment, int, int]] = []
        seq = from_seq
        budget_records = max_records
        budget_bytes = max_bytes
        index = max(0, bisect.bisect_right(self._firsts, seq) - 1)
        while seq < end and budget_records > 0 and budget_bytes > 0 and index < len(self._segments):
            segment = self._segments[index]
            seq = max(seq, segment.first_seq)  # a gap left by a corrupt segment
            stop = min(end, segment.next_seq)
            if seq < stop:
                i = seq - segment.first_seq
                j = min(stop - segment.first_seq, i + budget_records)
                # Byte budget: the first record whose start is beyond it ends the chunk (at least one record).
                start_offset = segment.offsets[i]
                limit = bisect.bisect_right(segment.offsets, start_offset + budget_bytes, i + 1, j)
                j = max(i + 1, min(j, limit))
                chunk_end = segment.offsets[j] if j < len(segment.offsets) else segment.size
                chunks.append((segment, seq, segment.first_seq + j))
                budget_records -= j - i
                budget_bytes -= chunk_end - start_offset
                seq = segment.first_seq + j
            else:
                index += 1
        return chunks, seq

    def _segment_bytes(self, segment: _Segment, from_seq: int, to_seq: int) -> bytes:
        """The bytes of records ``[from_seq, to_seq)`` of a segment (JournalError if the file is short)."""
        i = from_seq - segment.first_seq
        j = to_seq - segment.first_seq
        if i >= j:
            return b""
        start = segment.offsets[i]
        stop = segment.offsets[j] if j < len(segment.offsets) else segment.size
        with open(segment.path, "rb") as f:
            f.seek(start)
            data = f.read(stop - start)
        if len(data) != stop - start:
            raise JournalError(f"journal {self.name}: {segment.path.name} is shorter than its index")
        return data

    def _read_segment(
        self, segment: _Segment, from_seq: int, to_seq: int, match: Callable[[str], bool] | None
    ) -> list[Record]:
        """The records of ``[from_seq, to_seq)`` of a segment that pass ``match``: holes skipped, and
        records that cannot be decoded skipped (counted, logged once)."""
        data = self._segment_bytes(segment, from_seq, to_seq)
        out: list[Record] = []
        pos = 0
        view = memoryview(data)
        while pos < len(data):
            length, _crc, seq, ts = read_head(data, pos)
            body_start = pos + HEAD_BYTES
            pos = body_start + length
            if not length:
                continue  # a hole
            try:
                if match is not None:
                    if not match(payload_topic(view, body_start).decode()):
                        continue
                out.append(decode_payload(seq, ts, view, body_start, pos))
            except (struct.error, ValueError) as exc:
                self._unreadable(seq, exc)
        return out

    def _unreadable(self, seq: int, exc: Exception) -> None:
        """Record ``seq`` is no mc0 record: skipped by every read; counted and logged once."""
        if seq in self._unreadable_seen:
            return
        if len(self._unreadable_seen) < 10_000:  # (bounded: past it, a record may be counted again)
            self._unreadable_seen.add(seq)
        self.counters["unreadable"] += 1
        if self.counters["unreadable"] == 1:
            log.warning("journal %s: seq %d is not an mc0 record (%s): skipped by every read", self.name, seq, exc)

    # ------------------------------------------------------------ durable consumers' state
    def load_consumers(self) -> dict[str, bytes]:
        """Each consumer's newest saved state (see :mod:`mc0.broker.storage.consumerfiles`)."""
        return self._consumer_files.load_all()

    def save_consumer(self, name: str, state: bytes | None) -> None:
        """Append the consumer's state to its log (one write; fsynced only under ``fsync = "always"``),
        or remove it.  Survives ``kill -9`` as soon as it returns.  After losing the machine without
        ``always``, the last acks may be forgotten: those messages are delivered again, never lost."""
        self._consumer_files.save(name, state)

    def load_consumer_changes(self) -> dict[str, list[bytes]]:
        return {name: changes for name, (_, changes) in self._consumer_files.load_saved().items() if changes}

    def save_consumer_change(self, name: str, change: bytes) -> None:
        """Append a change to the consumer's log (one write; fsynced only under ``fsync = "always"``)."""
        self._consumer_files.save_change(name, change)

    def info(self) -> dict[str, object]:
        return {
            "first_seq": self.first_seq,
            "next_seq": self.next_seq,
            "records": self.next_seq - self.first_seq,
            "bytes": sum(s.size for s in self._segments),
            "segments": len(self._segments),
            "topics": list(self.settings.topics),
            "fsync": self.settings.fsync,
            "oldest_ts": self._segments[0].first_ts,
            "dedup_ids": len(self._dedup),
        }
