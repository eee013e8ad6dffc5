"""The in-memory journal store: the :class:`~mc0.broker.storage.port.JournalStore` port in a list.

Contract: the same sequence, dedup, read and retention rules as the file
store (:mod:`mc0.broker.storage.filestore`), no files; the core's tests and
the fuzzer use it, so they touch no disk.  ``clock`` gives record times.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ...message import Record
from ...protocol import Header, PageColumns, page_columns
from ...protocol import jetstream as jsw
from ...settings import JournalSettings
from .port import NOT_KEPT, Kept, Trimmed


class MemoryStore:
    """A :class:`JournalStore` in a list: same sequence, dedup, read and retention rules, no files.

    ``fail_writes`` makes ``commit`` raise (as a full disk would), so the
    core's 507 path is testable without one.
    """

    def __init__(
        self, name: str, settings: JournalSettings | None = None, *, clock: Callable[[], float] = lambda: 0.0
    ) -> None:
        self.name = name
        self.settings = settings or JournalSettings()
        self.clock = clock
        self.records: list[Record] = []
        self._first = 1
        self._uncommitted = 0  # records at the end not yet committed
        self._appends = 0  # append_mark
        self._committed = 0  # durable_mark: the append mark the last commit reached
        self._size = 0  # body bytes kept
        self._dedup: dict[tuple[str, str], tuple[int, float]] = {}
        self.fail_writes = False
        self.commits = 0
        self.consumers: dict[str, bytes] = {}
        self.consumer_changes: dict[str, list[bytes]] = {}  # saved after each one's state, in order
        self.floor: int | None = None  # retain_from
        self.backlog = ""  # (a replicated one: set it to refuse proposals, as a full budget would)
        self.following = True  # (a replicated one: set False, with a copy_reason: a copy whose feed does not follow)
        self.copy_reason = ""
        self.created = ""  # (a replicated one: its stream's creation time)

    @property
    def first_seq(self) -> int:
        return self._first

    @property
    def next_seq(self) -> int:
        return self._first + len(self.records)

    @property
    def stored_next_seq(self) -> int:
        return self.next_seq

    @property
    def pending(self) -> bool:
        return self._uncommitted > 0

    @property
    def append_mark(self) -> int:
        return self._appends

    @property
    def durable_mark(self) -> int:
        return self._committed

    def duplicate_of(self, sender: str, msgid: str) -> int | None:
        window = self.settings.dedup_window_s
        if not window:
            return None
        seen = self._dedup.get((sender, msgid))
        if seen is None or seen[1] < self.clock() - window:
            return None
        return seen[0]

    def append(self, topic: str, sender: str, headers: Mapping[str, str], parts: Sequence[bytes]) -> int:
        seq = self.next_seq
        ts = self.clock()
        record = Record(seq, ts, topic, sender, dict(headers), tuple(bytes(p) for p in parts))
        self.records.append(record)
        self._size += sum(map(len, record.parts))
        self._uncommitted += 1
        self._appends += 1
        msgid = headers.get(Header.MSGID)
        if msgid is not None and self.settings.dedup_window_s:
            self._dedup[sender, msgid] = (seq, ts)
            while len(self._dedup) > self.settings.dedup_max_ids:
                del self._dedup[next(iter(self._dedup))]
        if self.settings.max_bytes and self._size > self.settings.max_bytes:
            self.enforce_retention(ts)  # as the file store does when a segment rolls
        return seq

    def keep(
        self, topic: str, sender: str, headers: Mapping[str, str], parts: Sequence[bytes], *, origin: str = ""
    ) -> Kept:
        return (self.append(topic, sender, headers, parts), 0)

    def commit(self) -> None:
        if self.fail_writes and self._uncommitted:
            withdrawn = self.records[-self._uncommitted :]
            del self.records[-self._uncommitted :]
            self._size -= sum(len(p) for r in withdrawn for p in r.parts)
            self._uncommitted = 0
            gone = {r.seq for r in withdrawn}
            self._dedup = {k: v for k, v in self._dedup.items() if v[0] not in gone}
            raise OSError(28, "No space left on device")
        self._uncommitted = 0
        self._committed = self._appends
        self.commits += 1

    def enforce_retention(self, now: float) -> int:
        settings = self.settings
        removed = 0
        while len(self.records) > 1:  # never the newest (the file store never deletes its active segment)
            oldest = self.records[0]
            if self.floor is not None and oldest.seq >= self.floor:
                break
            too_big = settings.max_bytes and self._size > settings.max_bytes
            too_old = settings.max_age_s and oldest.ts < now - settings.max_age_s
            if not (too_big or too_old):
                break
            del self.records[0]
            self._size -= sum(map(len, oldest.parts))
            self._first += 1
            removed += 1
        self._uncommitted = min(self._uncommitted, len(self.records))
        return removed

    def retain_from(self, seq: int | None) -> None:
        self.floor = seq

    def purge(self, upto: int | None = None) -> int:
        self.commit()
        end = self.next_seq if upto is None else upto
        dropped = self.records[: max(0, end - self._first)]
        del self.records[: len(dropped)]
        self._size -= sum(len(p) for r in dropped for p in r.parts)
        self._first = max(self._first, end)
        return len(dropped)

    def read(
        self,
        from_seq: int,
        to_seq: int | None = None,
        match: Callable[[str], bool] | None = None,
        *,
        max_records: int = 1000,
        max_bytes: int = 1 << 20,
    ) -> tuple[list[Record], int]:
        if from_seq < self._first:
            raise Trimmed(self.name, from_seq, self._first)
        end = self.next_seq if to_seq is None else min(to_seq, self.next_seq)
        out: list[Record] = []
        seq = from_seq
        spent = 0
        scanned = 0
        while seq < end and scanned < max_records and (spent < max_bytes or scanned == 0):
            record = self.records[seq - self._first]
            scanned += 1
            spent += sum(len(p) for p in record.parts)
            seq += 1
            if match is None or match(record.topic):
                out.append(record)
        return out, seq

    def count_matching(
        self, from_seq: int, match: Callable[[str], bool], *, to_seq: int | None = None, max_checked: int = 10_000
    ) -> int | None:
        """Record by record (no topic index here): None past ``max_checked`` records."""
        end = len(self.records) if to_seq is None else max(0, to_seq - self._first)
        records = self.records[max(0, from_seq - self._first) : end]
        if len(records) > max_checked:
            return None
        return sum(1 for record in records if match(record.topic))

    def read_columns(
        self,
        from_seq: int,
        to_seq: int | None = None,
        match: Callable[[str], bool] | None = None,
        *,
        max_records: int = 1000,
        max_bytes: int = 1 << 20,
    ) -> tuple[PageColumns, int]:
        records, next_seq = self.read(from_seq, to_seq, match, max_records=max_records, max_bytes=max_bytes)
        return page_columns(records), next_seq

    def info(self) -> dict[str, object]:
        return {
            "first_seq": self.first_seq,
            "next_seq": self.next_seq,
            "records": len(self.records),
            "bytes": self._size,
            "segments": 1,
            "topics": list(self.settings.topics),
            "fsync": self.settings.fsync,
            "oldest_ts": self.records[0].ts if self.records else None,
            "dedup_ids": len(self._dedup),
        }

    def load_consumers(self) -> dict[str, bytes]:
        return dict(self.consumers)

    def save_consumer(self, name: str, state: bytes | None) -> None:
        if self.fail_writes:
            raise OSError(28, "No space left on device")
        self.consumer_changes.pop(name, None)
        if state is None:
            self.consumers.pop(name, None)
        else:
            self.consumers[name] = state

    def load_consumer_changes(self) -> dict[str, list[bytes]]:
        return {name: list(changes) for name, changes in self.consumer_changes.items()}

    def save_consumer_change(self, name: str, change: bytes) -> None:
        if self.fail_writes:
            raise OSError(28, "No space left on device")
        self.consumer_changes.setdefault(name, []).append(change)


class MemoryReplicatedStore(MemoryStore):
    """A :class:`~mc0.broker.storage.port.ReplicatedStore` in a list, for the core's tests: ``keep``
    proposes; ``commit`` moves the queue to ``sent`` (what the shell would hand to JetStream);
    ``store(token)`` is JetStream storing one, returning its seq and record (what the stream then
    delivers back, which the test hands to the core with the stored outcome)."""

    def __init__(
        self, name: str, settings: JournalSettings | None = None, *, clock: Callable[[], float] = lambda: 0.0
    ) -> None:
        super().__init__(name, settings, clock=clock)
        self.proposals: list[tuple[int, str, str, dict[str, str], tuple[bytes, ...], str | None, str]] = []
        self.sent: dict[int, tuple[str, str, dict[str, str], tuple[bytes, ...], str | None, str]] = {}
        self.stored_seqs: dict[str, int] = {}  # msgid -> seq (the store's dedup)
        self._token = 0
        self.acknowledged = 0  # the highest seq the store acknowledged
        self.created = "made-1"  # (set another to stand for a stream made anew)

    @property
    def stored_next_seq(self) -> int:
        return max(self.next_seq, self.acknowledged + 1)

    @property
    def pending(self) -> bool:
        return bool(self.proposals)

    def duplicate_of(self, sender: str, msgid: str) -> int | None:
        return None  # the store dedups (JetStream's duplicate window: ``stored_seqs``)

    def append(self, topic: str, sender: str, headers: Mapping[str, str], parts: Sequence[bytes]) -> int:
        raise TypeError(f"journal {self.name} is kept by JetStream: its records are proposed, not appended")

    def keep(
        self, topic: str, sender: str, headers: Mapping[str, str], parts: Sequence[bytes], *, origin: str = ""
    ) -> Kept:
        """Propose (``NOT_KEPT`` past ``backlog``); its dedup id as ``ReplicatedJournal.keep`` makes it."""
        if self.backlog:
            return NOT_KEPT
        msgid = headers.get(Header.MSGID)
        store_id = jsw.msg_id(sender, msgid) if msgid is not None and self.settings.dedup_window_s else None
        self._token += 1
        body = tuple(bytes(p) for p in parts)
        self.proposals.append((self._token, topic, sender, dict(headers), body, store_id, origin))
        return (0, self._token)

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
        """Propose a kept letter for ``identity`` (``msgid``: the store's dedup id for it, as JetStream's
        duplicate window keeps it)."""
        self._token += 1
        self.proposals.append((self._token, topic, sender, dict(headers), tuple(parts), msgid, identity))
        return self._token

    def commit(self) -> None:
        for token, *rest in self.proposals:
            self.sent[token] = tuple(rest)  # type: ignore[assignment]
        self.proposals.clear()
        self.commits += 1

    def store(self, token: int) -> tuple[int, bool, Record | None, str]:
        """JetStream stores proposal ``token``: (seq, duplicate, the record the stream then delivers
        (None for a duplicate: nothing new), origin)."""
        topic, sender, headers, parts, msgid, origin = self.sent.pop(token)
        if msgid is not None and msgid in self.stored_seqs:
            return self.stored_seqs[msgid], True, None, origin
        self.acknowledged += 1
        seq = self.acknowledged
        if msgid is not None:
            self.stored_seqs[msgid] = seq
        return seq, False, Record(seq, self.clock(), topic, sender, headers, parts), origin

    def arrived(self, record: Record) -> None:
        """The shell filled the local copy with ``record`` (in seq order)."""
        if record.seq >= self.next_seq:
            self.records.append(record)
