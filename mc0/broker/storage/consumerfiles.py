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
* ``load_all()`` returns each consumer's newest state: the log's last intact
  record, else the snapshot.  A torn tail (a crash mid-write) fails its CRC
  and is ignored: the previous state wins, so the last acks may be forgotten
  and those messages delivered again — at least once, never lost.
* ``save(name, None)`` removes both files and closes the log.

Record framing (little endian): ``u32 length, u32 crc32(state), state``.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger("mc0.journal")

SNAPSHOT_SUFFIX = ".json"
LOG_SUFFIX = ".log"
COMPACT_MIN_BYTES = 1 << 20  # a log this long (or COMPACT_RATIO states) becomes a snapshot
COMPACT_RATIO = 64
MAX_OPEN_LOGS = 32  # log descriptors kept open per journal (least recently saved closed first)
_FRAME = struct.Struct("<II")


class ConsumerFiles:
    """The ``consumers/`` folder of one journal.  The constructor does no I/O."""

    def __init__(self, folder: Path, *, sync: bool) -> None:
        self.folder = folder
        self.sync = sync  # fsync = "always"
        self._logs: OrderedDict[str, tuple[int, int]] = OrderedDict()  # name -> (open fd, bytes in the log)
        self._intact: set[str] = set()  # logs whose tail was checked (and cut if torn) since start

    def load_all(self) -> dict[str, bytes]:
        """Each consumer's newest saved state (name -> bytes); leftovers of an interrupted save ignored."""
        if not self.folder.is_dir():
            return {}
        names = {p.name[: -len(SNAPSHOT_SUFFIX)] for p in self.folder.glob("*" + SNAPSHOT_SUFFIX)}
        names |= {p.name[: -len(LOG_SUFFIX)] for p in self.folder.glob("*" + LOG_SUFFIX)}
        states = {}
        for name in sorted(n for n in names if not n.startswith(".")):
            state = self._last_logged(name)
            snapshot = self.folder / (name + SNAPSHOT_SUFFIX)
            if state is None and snapshot.exists():
                state = snapshot.read_bytes()
            if state is not None:
                states[name] = state
        return states

    def _last_logged(self, name: str) -> bytes | None:
        return self._scan(name)[0]

    def _scan(self, name: str) -> tuple[bytes | None, int]:
        """(the log's last intact state, where the intact records end)."""
        path = self.folder / (name + LOG_SUFFIX)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None, 0
        last, pos = None, 0
        while pos + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, pos)
            end = pos + _FRAME.size + length
            if end > len(data) or zlib.crc32(data[pos + _FRAME.size : end]) != crc:
                log.warning("consumer state log %s: torn or corrupt record at byte %d ignored", path, pos)
                break
            last, pos = data[pos + _FRAME.size : end], end
        return last, pos

    def save(self, name: str, state: bytes | None) -> None:
        if state is None:
            self._close_log(name)
            self._intact.discard(name)
            for suffix in (LOG_SUFFIX, SNAPSHOT_SUFFIX):
                (self.folder / (name + suffix)).unlink(missing_ok=True)
            if self.sync:
                fsync_dir(self.folder)
            return
        fd, size = self._log(name)
        record = _FRAME.pack(len(state), zlib.crc32(state)) + state
        os.write(fd, record)
        if self.sync:
            os.fsync(fd)
        size += len(record)
        self._logs[name] = (fd, size)
        if size > max(COMPACT_MIN_BYTES, COMPACT_RATIO * len(state)):
            self._compact(name, state)

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
            _, intact = self._scan(name)
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
