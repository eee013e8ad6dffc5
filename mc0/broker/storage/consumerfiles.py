"""Durable consumers' saved state on disk: one snapshot file and one append-only log per consumer.

Contract (the store side of ``JournalStore.save_consumer``/``load_consumers``,
owned by :class:`mc0.broker.storage.filestore.Journal`; the core never sees files):

* ``save(name, state)`` appends one framed record holding the whole state to
  ``consumers/NAME.log`` — a single ``write`` on a descriptor kept open, so
  an acking loop turn costs one system call, not an open, a write and a
  rename (which were a third of the broker's time when acking one by one).
  Under ``fsync = "always"`` the log is fsynced too (one fsync per save).
  At most ``MAX_OPEN_LOGS`` descriptors stay open per journal: the least
  recently saved log is closed when another opens, so a thousand consumers
  do not cost a thousand descriptors (a log reopened costs an open, once).
* When the log has grown past ``max(COMPACT_MIN_BYTES, COMPACT_RATIO x state)``
  the latest state is written to ``consumers/NAME.json`` atomically (write,
  rename; fsynced under ``always``) and the log starts over, so disk use stays
  bounded by a few snapshots per consumer.
* ``save_change(name, change)`` appends a *change* record: a change to the
  state saved before it (the core's to define and to apply: an answered ack
  saves the seqs it settled, not the whole state).  Compaction is looked at
  only on a whole ``save``, so a change never lands in a snapshot.
* ``load_saved()`` returns each consumer's newest whole state (the log's last
  intact whole record, else the snapshot) and the intact changes after it, in
  order; ``load_all()`` the whole states alone.  A torn tail (a crash mid-write) fails its CRC
  and is ignored: the previous state wins, so the last acks may be forgotten
  and those messages delivered again — at least once, never lost.
* ``save(name, None)`` removes both files and closes the log.

Record framing (little endian, :func:`mc0.protocol.journalrecords.state_frame`): ``u32 length,
u32 crc32(state), state``; a change record's length has its top bit set (``CHANGE_FLAG``), so a broker that
predates changes reads one as a torn record and starts from the state before it
(its acks come again: at least once).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from pathlib import Path

from ...protocol.journalrecords import read_state_frame, state_frame

log = logging.getLogger("mc0.journal")

SNAPSHOT_SUFFIX = ".json"
LOG_SUFFIX = ".log"
COMPACT_MIN_BYTES = 1 << 20  # a log this long (or COMPACT_RATIO states) becomes a snapshot
COMPACT_RATIO = 64
MAX_OPEN_LOGS = 32  # log descriptors kept open per journal (least recently saved closed first)


class ConsumerFiles:
    """The ``consumers/`` folder of one journal.  The constructor does no I/O."""

    def __init__(self, folder: Path, *, sync: bool) -> None:
        self.folder = folder
        self.sync = sync  # fsync = "always"
        self._logs: OrderedDict[str, tuple[int, int]] = OrderedDict()  # name -> (open fd, bytes in the log)
        self._intact: set[str] = set()  # logs whose tail was checked (and cut if torn) since start

    def load_all(self) -> dict[str, bytes]:
        """Each consumer's newest whole state (name -> bytes), the changes saved after it not applied."""
        return {name: whole for name, (whole, _) in self.load_saved().items()}

    def load_saved(self) -> dict[str, tuple[bytes, list[bytes]]]:
        """Each consumer's newest whole state and the changes saved after it, in order (name ->
        (state, changes)); leftovers of an interrupted save ignored."""
        if not self.folder.is_dir():
            return {}
        names = {p.name[: -len(SNAPSHOT_SUFFIX)] for p in self.folder.glob("*" + SNAPSHOT_SUFFIX)}
        names |= {p.name[: -len(LOG_SUFFIX)] for p in self.folder.glob("*" + LOG_SUFFIX)}
        states = {}
        for name in sorted(n for n in names if not n.startswith(".")):
            state, changes, _ = self._scan(name)
            snapshot = self.folder / (name + SNAPSHOT_SUFFIX)
            if state is None and snapshot.exists():
                state = snapshot.read_bytes()
            if state is not None:
                states[name] = (state, changes)
        return states

    def _scan(self, name: str) -> tuple[bytes | None, list[bytes], int]:
        """(the log's last intact whole state, the intact changes after it, where the intact records end)."""
        path = self.folder / (name + LOG_SUFFIX)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None, [], 0
        last: bytes | None = None
        changes: list[bytes] = []
        pos = 0
        while True:
            try:
                frame = read_state_frame(data, pos)
            except ValueError:
                log.warning("consumer state log %s: torn or corrupt record at byte %d ignored", path, pos)
                break
            if frame is None:
                break
            body, change, end = frame
            if change:
                changes.append(body)
            else:
                last, changes = body, []
            pos = end
        return last, changes, pos

    def save(self, name: str, state: bytes | None) -> None:
        if state is None:
            self._close_log(name)
            self._intact.discard(name)
            for suffix in (LOG_SUFFIX, SNAPSHOT_SUFFIX):
                (self.folder / (name + suffix)).unlink(missing_ok=True)
            if self.sync:
                fsync_dir(self.folder)
            return
        size = self._append(name, state_frame(state, change=False))
        if size > max(COMPACT_MIN_BYTES, COMPACT_RATIO * len(state)):
            self._compact(name, state)

    def save_change(self, name: str, change: bytes) -> None:
        """Append a change to the state saved before it (one write; fsynced under ``always``)."""
        self._append(name, state_frame(change, change=True))  # (ValueError, nothing written: too long)

    def _append(self, name: str, record: bytes) -> int:
        """Append one framed record to the log; the log's size after it."""
        fd, size = self._log(name)
        os.write(fd, record)
        if self.sync:
            os.fsync(fd)
        size += len(record)
        self._logs[name] = (fd, size)
        return size

    def _log(self, name: str) -> tuple[int, int]:
        held = self._logs.get(name)
        if held is not None:
            self._logs.move_to_end(name)
            return held
        while len(self._logs) >= MAX_OPEN_LOGS:
            _, (oldest, _) = self._logs.popitem(last=False)
            os.close(oldest)
        self.folder.mkdir(exist_ok=True)
        path = self.folder / (name + LOG_SUFFIX)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        size = os.fstat(fd).st_size
        if name not in self._intact:  # once per start: a log reopened later was written whole by us
            _, _, intact = self._scan(name)
            if size > intact:  # a torn tail (a crash mid-write): cut it, or what follows would never be read
                os.ftruncate(fd, intact)
                size = intact
            if self.sync:
                fsync_dir(self.folder)
            self._intact.add(name)
        self._logs[name] = (fd, size)
        return fd, size

    def _compact(self, name: str, state: bytes) -> None:
        """The newest state becomes the snapshot, then the log starts over (a crash in between
        leaves a log whose last record is that same state)."""
        temporary = self.folder / f".{name}{SNAPSHOT_SUFFIX}.tmp"
        with open(temporary, "wb") as file:
            file.write(state)
            if self.sync:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temporary, self.folder / (name + SNAPSHOT_SUFFIX))
        if self.sync:
            fsync_dir(self.folder)
        fd, _ = self._logs[name]
        os.ftruncate(fd, 0)  # O_APPEND: the next record starts at 0
        if self.sync:
            os.fsync(fd)
        self._logs[name] = (fd, 0)

    def _close_log(self, name: str) -> None:
        held = self._logs.pop(name, None)
        if held is not None:
            os.close(held[0])

    def close(self) -> None:
        """Close every log (idempotent); what was saved is already in the OS."""
        for name in list(self._logs):
            self._close_log(name)


def fsync_dir(folder: Path) -> None:
    """Make a created or removed file name durable (POSIX: fsync the directory)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
