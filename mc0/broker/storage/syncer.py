"""A file journal's background fsync: the broker's loop writes a turn's records, this thread makes them durable.

Contract: ``Syncer(name, notify)`` does no I/O and starts no thread; the first
``request(fd, mark)`` starts one (a daemon).  ``request`` asks for ``fd`` to be
fsynced so that everything written to it before the call is durable, and names
that point ``mark`` (a count that only grows); ``synced`` is the largest mark an
fsync completed for, so the caller releases what waited for a mark once
``synced`` reaches it.  Requests coalesce: an fsync covers every request made
before it began, so while one runs (milliseconds) the turns that follow share
the next one (a group commit across turns).  After each fsync, failed or not,
``notify()`` is called from this thread (the broker wakes its loop).  A failed
fsync leaves ``synced`` where it was and keeps its error for ``take_error`` (the
caller reports it).
``settle()`` returns once nothing is asked and nothing runs (before the caller
closes or replaces a file descriptor it handed over); ``close()`` settles and
ends the thread (idempotent).  Why a thread: an fsync holds the calling thread
for ~1-100 ms (a loaded disk), and the loop must not stop serving peers
meanwhile; ``os.fsync`` releases the GIL, so it costs the loop nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger("mc0.journal")
fsync = os.fsync  # (module level: a test stands a stalled one in for it, a slow disk)


class Syncer:
    def __init__(self, name: str, notify: Callable[[], None]) -> None:
        self.name = name
        self._notify = notify
        self._cond = threading.Condition()
        self._wanted: tuple[int, int] | None = None  # (fd, mark): the newest request not taken yet
        self._busy = False  # an fsync runs
        self._error: OSError | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.synced = 0  # the largest mark an fsync completed for (written by the thread, read by the loop)
        self.fsyncs = 0

    def request(self, fd: int, mark: int) -> None:
        """Make what was written to ``fd`` so far durable, then say so by ``synced >= mark``."""
        with self._cond:
            if self._closed:
                raise OSError(f"journal {self.name}: its sync thread was closed")
            self._wanted = (fd, mark)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"mc0-sync-{self.name}", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def take_error(self) -> OSError | None:
        """The error of a failed fsync not yet taken (then forgotten)."""
        with self._cond:
            error, self._error = self._error, None
        return error

    @property
    def idle(self) -> bool:
        return not self._busy and self._wanted is None

    def settle(self) -> None:
        """Return once nothing is asked and no fsync runs."""
        with self._cond:
            while self._busy or self._wanted is not None:
                self._cond.wait()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()  # (it takes what was asked before it ends)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._wanted is None and not self._closed:
                    self._cond.wait()
                if self._wanted is None:
                    return
                (fd, mark), self._wanted = self._wanted, None
                self._busy = True
            error: OSError | None = None
            try:
                fsync(fd)
            except OSError as exc:
                error = exc
            with self._cond:
                self._busy = False
                if error is None:
                    self.synced = max(self.synced, mark)
                    self.fsyncs += 1
                else:
                    self._error = error
                self._cond.notify_all()
            try:
                self._notify()
            except Exception:  # (the loop's wake-up is best effort: it also looks every turn)
                log.exception("journal %s: waking the loop after an fsync failed", self.name)
