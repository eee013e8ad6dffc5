"""Journaling: journal appends with held OKs, ``SUB FROM`` replays and ``mc0.journal`` fetches.

Contract: owns which journal keeps which topics, the OKs held until their
records are committed, and every running replay and fetch.  Storage is
reached only through the :class:`~mc0.broker.storage.port.JournalStore` port.
``commit()`` makes the batch's appends durable through the port (one write
and, per policy, one fsync per batch: a group commit) and returns the OKs
now due, or ERROR 507 for a journal that failed.  An OK waits for the
journal's ``durable_mark`` to reach the ``append_mark`` it was held at: at
that commit, or at a later one when the store syncs in the background (each
journal's OKs in the order they were held).  Replays and fetches are
*paced*: ``pages(now)`` returns one page of each, and the shell hands back
what it could not queue (``page_blocked``), which rewinds that read, so
a slow reader slows only its own reads and nothing is lost.  ``append``
hands each journal the record through the port's ``keep`` and answers what
the primary's store answered (``Kept``): a seq now, or, of a journal
JetStream keeps, a proposal's token (the OK is then held by
:mod:`.replication`).  Replays and fetches read a store up to
``stored_next_seq``; a JetStream journal's reads are of its local copy,
waiting (paced) while the copy lags what the stream holds, or is at its end
while its feed does not follow the stream (the port's ``following``; then
504 naming why, never an end as if the history were complete).  A
replay of such a journal keeps its ``FROM`` as a *floor*: it sends nothing
before it, and when it ends with the copy still short of it (a broker whose
copy is behind, where a subscriber failing over resumes) the floor stays
(``Floor``) and ``below_floor`` keeps the live records before it from that
subscriber, until the stream's delivery passes it.  No sockets, no clock.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from ... import protocol as P
from ...errors import ProtocolError, quoted
from ...message import Record
from ...protocol import JOURNAL_SERVICE, SYS_DEAD_PREFIX, Command, Header, Status
from ...protocol import jetstream as jsw
from ...topics import pattern_covers, pattern_matches, split_pattern
from ...trie import TopicTrie
from ..storage.port import NOT_KEPT, JournalStore, Kept, Trimmed, storage_fault
from .access import is_dead_letter, origin_allowed
from .peers import Out, Peer

_DEAD_NEWLINE = b"\n" + SYS_DEAD_PREFIX.encode()  # a dead letter's topic, after a newline
NO_HEADERS: Mapping[str, str] = MappingProxyType({})  # a PUT record's stored headers
log = logging.getLogger("mc0.broker")

# SUB FROM replay: records read per replaying subscription per loop turn, and
# the pause after its queue filled (it resumes where the send failed).
REPLAY_PAGE = 256
REPLAY_BACKOFF = 0.02
# mc0.journal fetch: one PARTIAL holds at most this; one fetch at most FETCH_MAX_*.
FETCH_PAGE_RECORDS = 1000
FETCH_PAGE_BYTES = 1 << 20
# A columns page may be asked to hold up to this: building 4,000 records as columns costs the
# loop turn about what 1,000 as JSON did (~0.9 us against ~3.1 us per record, measured).
COLUMNS_PAGE_RECORDS = 4000
COLUMNS_PAGE_BYTES = 4 << 20
# A filtered columns page reads on while it is less than three quarters full, at most this many reads
# (each scanning at most the page's room): a selective filter then sends fuller pages (a Spark batch
# and a hand-over each) instead of a sliver per loop turn.  A record the file journal's topic index
# rules out costs ~20 ns, so four reads of skipped records cost a turn less than one full page.
FILTERED_PAGE_READS = 4
FETCH_MAX_RECORDS = 100_000
FETCH_MAX_BYTES = 16 << 20
MAX_FETCHES_PER_PEER = 8  # fetches under way at once per peer (each sends a page per loop turn)
RETENTION_INTERVAL = 1.0  # seconds between age-retention checks
# A replay or fetch of a JetStream journal waits at most this without progress for this broker's copy to
# hold what the stream acknowledged (normally milliseconds), or for the copy's feed to follow the stream
# again (seconds after a NATS failover or NATS's quorum back: feed.ASK_AGAIN_S, CREATE_PATIENCE), looking
# every CATCH_UP_POLL.
CATCH_UP_S = 10.0
CATCH_UP_POLL = 0.005


class Replay:
    """A ``SUB FROM seq``: the records still to send from one journal, then live.

    While it runs, live copies of records that it will deliver are held back
    (the replay reaches them in order), so each record arrives once.  ``floor``:
    the seq asked for, of a JetStream journal (0: none), whose copy may not
    have reached it yet: nothing before it is sent.
    """

    __slots__ = ("journal", "patterns", "cursor", "resume_at", "waited_since", "floor", "oldest")

    def __init__(
        self,
        journal: JournalStore,
        patterns: list[tuple[str, ...]],
        cursor: int,
        floor: int = 0,
        *,
        oldest: bool = False,
    ) -> None:
        self.journal = journal
        self.patterns = patterns
        self.cursor = cursor
        self.resume_at = 0.0
        self.waited_since: float | None = None  # since when a JetStream journal's copy has been behind
        self.floor = floor
        # FROM 0 (the oldest record kept), nothing sent yet: a first seq that moves past the cursor before
        # the first record (a JetStream copy learning its stream was purged) moves the cursor, no 410.
        self.oldest = oldest

    def matches(self, tokens: tuple[str, ...]) -> bool:
        return any(pattern_matches(p, tokens) for p in self.patterns)


class Floor(NamedTuple):
    """What a replay that ended short of its ``FROM`` leaves: live records of its journal before ``seq``
    on its patterns are not for its subscriber (it had them elsewhere), as long as the stream is the one
    it asked of (``created``)."""

    seq: int
    patterns: list[tuple[str, ...]]
    created: str

    def matches(self, tokens: tuple[str, ...]) -> bool:
        return any(pattern_matches(p, tokens) for p in self.patterns)


class PageShape(NamedTuple):
    """How a fetch's PARTIALs are built: the encoding, and the most records / body bytes one holds."""

    encoding: str = P.PAGE_JSON
    records: int = FETCH_PAGE_RECORDS
    size: int = FETCH_PAGE_BYTES


JSON_PAGES = PageShape()  # what a fetch gets unless it asks otherwise


class FetchAsk(NamedTuple):
    """What an ``mc0.journal fetch`` asks for, checked: its seqs (``to_seq`` None: the journal's end),
    the most records and body bytes in all, and its pages' shape."""

    from_seq: int
    to_seq: int | None
    max_records: int
    max_bytes: int
    page: PageShape = JSON_PAGES


READ_FAULT_LOG_S = 60.0  # a journal whose reads fail says so in the log at most this often (counted)


class Fetch:
    """An ``mc0.journal fetch`` sent one page per loop turn (a large fetch never stalls the broker)."""

    __slots__ = (
        "rid",
        "user",
        "journal",
        "cursor",
        "end",
        "match",
        "records_left",
        "bytes_left",
        "count",
        "resume_at",
        "done",
        "page",
        "waited_since",
        "to_seq",
    )

    def __init__(
        self,
        rid: str,
        user: dict[str, str],
        journal: JournalStore,
        cursor: int,
        end: int,
        match: Callable[[str], bool] | None,
        asked: FetchAsk,
    ) -> None:
        """``cursor``: the first seq to read (``asked.from_seq``, checked against the journal's
        first); ``end``: where it stops for now."""
        self.rid = rid
        self.user = user
        self.journal = journal
        self.cursor = cursor
        self.end = end
        self.match = match
        self.records_left = asked.max_records
        self.bytes_left = asked.max_bytes
        self.count = 0
        self.resume_at = 0.0
        self.done = False  # FINAL handed to the shell; forgotten next turn unless that send failed
        self.page = asked.page
        self.waited_since: float | None = None  # since when it waits for a local copy to catch up
        # The end asked for (None: the journal's end, which a JetStream copy may learn later).
        self.to_seq = asked.to_seq


class PageOut(NamedTuple):
    """A page of a paced read (a replay or a fetch) and where that read resumes if it is not queued."""

    routing_id: bytes
    frames: Sequence[bytes] | bytes  # bytes: a batch record, for a batched peer
    kind: str  # "replay" (key = journal name), "fetch" (key = request id) or "error" (the read ended)
    key: str
    seq: int  # the read's cursor to go back to
    records: int  # records this message carried (fetch accounting)
    size: int = 0  # body bytes it carried (fetch accounting)


def primary(journals: Sequence[JournalStore]) -> JournalStore:
    """The journal an OK or MESSAGE names when a topic is kept by several: the first by name."""
    return journals[0] if len(journals) == 1 else min(journals, key=lambda j: j.name)


def private(journal: JournalStore, request_id: str | None) -> None:
    """403 for reading a journal that keeps mailboxes: its letters are for their identities only."""
    if journal.settings.mailboxes:
        reason = f"journal {journal.name} keeps mailboxes: its letters are private (only their info is shown)"
        raise ProtocolError(Status.FORBIDDEN, reason, request_id)


def start_seq(journal: JournalStore, from_seq: int, request_id: str | None) -> int:
    """Where a replay or fetch from ``from_seq`` starts (0 = the oldest kept); 410 if trimmed."""
    if from_seq == 0:
        return journal.first_seq
    if from_seq < journal.first_seq:
        raise ProtocolError(Status.GONE, str(Trimmed(journal.name, from_seq, journal.first_seq)), request_id)
    return from_seq


def read_columns_page(
    journal: JournalStore, start: int, end: int, match: Callable[[str], bool] | None, max_records: int, max_bytes: int
) -> tuple[P.PageColumns, int]:
    """A columns page of the records ``start <= seq < end`` passing ``match``: at most ``max_records``
    / about ``max_bytes`` of them, and where the next page starts.  Unfiltered, one read (the page's
    budgets bound what it scans); filtered, up to FILTERED_PAGE_READS reads, each scanning at most the
    room left, until the page is three quarters full or the range ends."""
    columns, cursor = journal.read_columns(start, end, match, max_records=max_records, max_bytes=max_bytes)
    if match is None:
        return columns, cursor
    spent = sum(map(len, columns.parts))
    for _ in range(FILTERED_PAGE_READS - 1):
        room = max_records - len(columns.seqs)
        if cursor >= end or room <= max_records // 4 or spent >= max_bytes * 3 // 4:
            break
        more, cursor = journal.read_columns(cursor, end, match, max_records=room, max_bytes=max_bytes - spent)
        spent += sum(map(len, more.parts))
        for column, added in zip(columns, more, strict=True):
            column.extend(added)  # type: ignore[attr-defined]  # (every field is a list)
    return columns, cursor


def holds_dead_letters(topics: list[bytes]) -> bool:
    """Whether a topic is a dead letter's (``mc0.sys.dead.``...): one join and one search, no step per
    topic.  A journaled topic holds no newline, so only one that starts with the prefix matches (and a
    false hit would only send the page the general way, which checks each dead letter's grant)."""
    return _DEAD_NEWLINE in b"\n" + b"\n".join(topics)


class Journaling:
    def __init__(
        self,
        journals: Sequence[JournalStore],
        counters: Counter[str],
        *,
        tokens_of: Callable[[str], tuple[str, ...] | None],
        wall_offset: float = 0.0,
    ) -> None:
        self.counters = counters
        self.wall_offset = wall_offset
        self._journals: dict[str, JournalStore] = {j.name: j for j in sorted(journals, key=lambda j: j.name)}
        # Some journal is configured (a PUT may be journaled): the publish paths' test before a lookup.
        self.has_journals = bool(self._journals)
        self._keepers: TopicTrie[JournalStore] = TopicTrie()
        for journal in self._journals.values():
            for pattern in journal.settings.topics:
                self._keepers.insert(split_pattern(pattern), journal)
        self._tokens_of = tokens_of
        # OKs held until their records are stored, per journal in the order held: (the journal's
        # append_mark then, peer, request id, OK frames).
        self._pending_acks: dict[str, deque[tuple[int, bytes, str, list[bytes]]]] = {}
        self._replays: dict[Peer, dict[str, Replay]] = {}  # journal name -> SUB FROM still catching up
        self._floors: dict[Peer, dict[str, Floor]] = {}  # journal name -> a replay's FROM its copy had not reached
        self._fetches: dict[Peer, dict[str, Fetch]] = {}  # request id -> fetch still sending pages
        self._next_retention = 0.0
        self.failed: set[str] = set()  # the journals whose last commit failed
        self._read_faults_written: dict[str, float] = {}  # journal -> when a read fault of it was last logged

    # ------------------------------------------------------------ the journals by name (what other rooms read)
    def journal(self, name: str) -> JournalStore | None:
        """The journal called ``name`` (None: no such journal is configured)."""
        return self._journals.get(name)

    def journal_names(self) -> list[str]:
        """Every journal's name, sorted."""
        return list(self._journals)

    def every_journal(self) -> list[JournalStore]:
        """Every journal, in the order of their names."""
        return list(self._journals.values())

    def journal_info(self) -> dict[str, dict[str, object]]:
        """Each journal's ``info()``, by name (sorted)."""
        return {name: journal.info() for name, journal in self._journals.items()}

    # ------------------------------------------------------------ appends
    def journals_of(self, tokens: tuple[str, ...]) -> Sequence[JournalStore]:
        """The journals that keep this topic (a cached trie lookup)."""
        return self._keepers.match(tokens) if self._journals else ()

    def append(
        self,
        journals: Sequence[JournalStore],
        first: JournalStore,
        topic: str,
        sender: str,
        headers: dict[str, str],
        body: Sequence[bytes],
        *,
        origin: str = "",
    ) -> Kept | None:
        """Keep the record in each journal (``JournalStore.keep``); what the primary's store answered (its
        seq now, or the token its seq comes later with), or None if it could not write (fsync=always, or a
        segment roll, write at once; a disk error must not take the broker down).  A replicated store past
        its budget keeps nothing (``NOT_KEPT``, counted: a PUT was refused 429 before, so what reaches here
        is the broker's own)."""
        primary_kept: Kept | None = None
        for journal in journals:
            try:
                kept = journal.keep(topic, sender, headers, body, origin=origin)
            except OSError as exc:
                self.counters["journal_write_failed"] += 1
                log.error("journal %s: write failed: %s", journal.name, exc)
                continue
            if kept == NOT_KEPT:  # (a tuple of two ints compared: no call)
                self.counters["store_backlog_dropped"] += 1
            if journal is first:
                primary_kept = kept
        return primary_kept

    def append_local(
        self, journals: Sequence[JournalStore], first: JournalStore, topic: str, sender: str, body: bytes
    ) -> int | None:
        """``append`` of a PUT record (one body frame, no headers) to journals that are all local ones
        (no JetStream journal among them: the caller checked, once per topic)."""
        seq: int | None = None
        for journal in journals:
            try:
                appended = journal.append(topic, sender, NO_HEADERS, (body,))
            except OSError as exc:
                self.counters["journal_write_failed"] += 1
                log.error("journal %s: write failed: %s", journal.name, exc)
                continue
            if journal is first:
                seq = appended
        return seq

    def local(self, journals: Sequence[JournalStore]) -> bool:
        """None of ``journals`` is kept by JetStream (what ``append_local`` appends to).  One of the three
        questions of which store a journal is that stay: the publish hot path appends (an int per record, no
        answer to read) where ``keep`` answers ``(seq, token)``, so it asks once per topic (cached) that
        every store there answers at once.  (The other two that stay: ``verbs.put_journaled``'s budget check
        and ``plan_replay``'s floor; storage.port names all three.)"""
        for journal in journals:  # (asked per general-path PUT too: a loop, no generator, over one or two)
            if journal.settings.replicated:
                return False
        return True

    def hold_ok(self, journal: JournalStore, routing_id: bytes, request_id: str, frames: list[bytes]) -> None:
        """Send ``frames`` (an OK) once ``journal``'s appends so far are committed (stored at its level)."""
        held = self._pending_acks.get(journal.name)
        if held is None:
            held = self._pending_acks[journal.name] = deque()
        held.append((journal.append_mark, routing_id, request_id, frames))

    @property
    def uncommitted(self) -> bool:
        """``commit()`` has work: appends to write or OKs to release."""
        return bool(self._pending_acks) or any(j.pending for j in self._journals.values())

    def commit(self) -> list[Out]:
        """Commit what was appended (through the port); returns the OKs now due.

        A journal that fails to write (or to sync) turns every OK it holds into
        ERROR 507: the publisher learns its message is not known to be stored
        (and may retry with MSGID).
        """
        failed: dict[str, OSError] = {}
        for journal in self._journals.values():
            if journal.pending:
                try:
                    journal.commit()
                except OSError as exc:
                    failed[journal.name] = exc
                    self.counters["journal_write_failed"] += 1
                    log.error("journal %s: write failed: %s", journal.name, exc)
        self.failed = set(failed)
        out: list[Out] = []
        for name, held in list(self._pending_acks.items()):
            failure = failed.get(name)
            if failure is not None:
                reason = f"journal {name} could not write: {storage_fault(failure)}"
                out += [(rid, P.error(Status.STORAGE_FAILED, reason, request_id)) for _, rid, request_id, _ in held]
                held.clear()
            else:
                durable = self._journals[name].durable_mark
                while held and held[0][0] <= durable:
                    _, routing_id, _, ok = held.popleft()
                    out.append((routing_id, ok))
            if not held:
                del self._pending_acks[name]
        return out

    def enforce_retention(self, now: float) -> None:
        """Age retention through the port, at most every ``RETENTION_INTERVAL``."""
        if self._journals and now >= self._next_retention:
            self._next_retention = now + RETENTION_INTERVAL
            for journal in self._journals.values():
                journal.enforce_retention(now + self.wall_offset)

    # ------------------------------------------------------------ replays
    def held_back(self, appended: Sequence[JournalStore], tokens: tuple[str, ...]) -> set[Peer] | None:
        """Peers whose running replay will deliver this just-appended record (their live copy waits)."""
        if not self._replays or not appended:
            return None
        held: set[Peer] = set()
        for peer, replays in self._replays.items():
            for journal in appended:
                replay = replays.get(journal.name)
                if replay is not None and replay.matches(tokens):
                    held.add(peer)
                    break
        return held

    @property
    def floors(self) -> bool:
        """Some subscriber's replay ended short of its ``FROM`` (``below_floor`` has work)."""
        return bool(self._floors)

    def below_floor(
        self, journal: JournalStore, seq: int, tokens: tuple[str, ...], held: set[Peer] | None
    ) -> set[Peer] | None:
        """``held`` plus the peers a live record of ``journal`` at ``seq`` is below the floor of (they
        asked FROM past it).  A record at or past a floor ends it (the stream's delivery passed it), and
        so does another stream of that name (its seqs start again)."""
        created = journal.created
        for peer, floors in list(self._floors.items()):
            floor = floors.get(journal.name)
            if floor is None:
                continue
            if seq >= floor.seq or created != floor.created:
                self._drop_floor(peer, journal.name)
            elif floor.matches(tokens):
                held = {peer} if held is None else held | {peer}
        return held

    def _drop_floor(self, peer: Peer, name: str) -> None:
        floors = self._floors.get(peer)
        if floors is not None:
            floors.pop(name, None)
            if not floors:
                del self._floors[peer]

    def _journal_for_sub(self, command: Command, patterns: list[tuple[str, tuple[str, ...]]]) -> JournalStore:
        name = command.headers.get(Header.JOURNAL)
        if name is not None:
            journal = self._journals.get(name)
            if journal is None:
                raise ProtocolError(Status.BAD_REQUEST, f"no journal named {quoted(name)}", command.id)
            private(journal, command.id)
            return journal
        candidates = [
            j
            for j in self._journals.values()
            if all(any(pattern_covers(split_pattern(jp), t) for jp in j.settings.topics) for _, t in patterns)
        ]
        if not candidates:
            reason = "no journal keeps these topics, so there is no history to replay (the broker's [journals.NAME])"
            raise ProtocolError(Status.BAD_REQUEST, reason, command.id)
        if len(candidates) > 1:
            names = ", ".join(sorted(j.name for j in candidates))[:120]
            reason = f"several journals keep these topics ({names}): name one (--journal; journal= in the library)"
            raise ProtocolError(Status.BAD_REQUEST, reason, command.id)
        private(candidates[0], command.id)
        return candidates[0]

    def plan_replay(self, peer: Peer, command: Command, patterns: list[tuple[str, tuple[str, ...]]]) -> Replay:
        """Check a ``SUB FROM`` before anything changes; the replay to start."""
        if peer.legacy:
            raise ProtocolError(Status.BAD_REQUEST, "FROM needs protocol 1.0", command.id)
        asked = P.parse_int(command, Header.FROM)
        journal = self._journal_for_sub(command, patterns)
        if journal.name in self._replays.get(peer, ()):
            raise ProtocolError(Status.CONFLICT, f"a replay of {journal.name} is already running", command.id)
        from_seq = start_seq(journal, asked, command.id)
        # Of a JetStream journal, a FROM past what this broker knows of the stream is a floor: the
        # subscriber had the records before it (at another broker), this copy may just be behind.
        # (This asks which store it is, as nothing else tells: a file journal's FROM past its end waits
        # for nothing, and its live records from its end on are for the subscriber.)
        floor = from_seq if journal.settings.replicated else 0
        cursor = min(from_seq, journal.stored_next_seq)
        return Replay(journal, [t for _, t in patterns], cursor, floor, oldest=asked == 0)

    def start_replay(self, peer: Peer, replay: Replay) -> None:
        self._drop_floor(peer, replay.journal.name)  # (the new replay's FROM says what it had)
        self._replays.setdefault(peer, {})[replay.journal.name] = replay
        self.counters["replays"] += 1

    def unsubscribed(self, peer: Peer, removed: Sequence[tuple[str, ...]]) -> None:
        """Patterns ``peer`` dropped no longer replay (nor keep a floor); a replay left with none ends."""
        for tokens in removed:
            for name, replay in list(self._replays.get(peer, {}).items()):
                if tokens in replay.patterns:
                    replay.patterns.remove(tokens)
                    if not replay.patterns:
                        self._end_replay(peer, name)
            for name, floor in list(self._floors.get(peer, {}).items()):
                if tokens in floor.patterns:
                    floor.patterns.remove(tokens)
                    if not floor.patterns:
                        self._drop_floor(peer, name)

    def _end_replay(self, peer: Peer, name: str) -> None:
        replays = self._replays.get(peer)
        if replays is not None:
            replays.pop(name, None)
            if not replays:
                del self._replays[peer]

    def _replay_ended(self, peer: Peer, name: str, replay: Replay) -> None:
        """The replay sent what it could: if its copy has not reached its floor yet, the floor stays
        for live delivery (the records before it come live from this copy's feed, and are not for it)."""
        self._end_replay(peer, name)
        journal = replay.journal
        if replay.floor > journal.next_seq:  # (a floor is 0 but of a JetStream journal: see plan_replay)
            self._floors.setdefault(peer, {})[name] = Floor(replay.floor, list(replay.patterns), journal.created)
            self.counters["replay_floors"] += 1

    # ------------------------------------------------------------ fetches
    def fetch_running(self, peer: Peer, rid: str) -> bool:
        fetches = self._fetches.get(peer)  # (no default dict: this runs for every REQUEST)
        if not fetches:
            return False
        fetch = fetches.get(rid)
        return fetch is not None and not fetch.done

    def start_fetch(
        self,
        peer: Peer,
        rid: str,
        user: dict[str, str],
        journal: JournalStore,
        asked: FetchAsk,
        match: Callable[[str], bool] | None,
    ) -> None:
        """Check and start a fetch of the records ``match`` passes (None: all); its pages follow from
        ``pages()``, one per loop turn."""
        from_seq = start_seq(journal, asked.from_seq, rid)
        to_seq = asked.to_seq
        end = journal.stored_next_seq if to_seq is None else min(to_seq, journal.stored_next_seq)
        fetches = self._fetches.get(peer, {})
        running = sum(1 for f in fetches.values() if not f.done)
        if running >= MAX_FETCHES_PER_PEER:
            raise ProtocolError(Status.OVER_LIMIT, f"{running} fetches under way, the limit per peer", rid)
        self._fetches.setdefault(peer, {})[rid] = Fetch(rid, user, journal, from_seq, end, match, asked)
        self.counters["journal_fetches"] += 1

    def cancel_fetch(self, peer: Peer, rid: str) -> bool:
        fetches = self._fetches.get(peer)
        if fetches is None or fetches.pop(rid, None) is None:
            return False
        if not fetches:
            del self._fetches[peer]
        return True

    def drop_peer(self, peer: Peer) -> None:
        self._replays.pop(peer, None)
        self._fetches.pop(peer, None)
        self._floors.pop(peer, None)

    # ------------------------------------------------------------ pacing
    @property
    def paging(self) -> bool:
        """Replays or fetches are sending pages (call ``pages`` every loop turn)."""
        return bool(self._replays) or bool(self._fetches)

    def pages(self, now: float) -> list[PageOut]:
        """One page of every running replay and fetch.

        The shell sends them in order and reports each one it could not
        queue (and each after it for that peer) to ``page_blocked``, which
        rewinds that read; nothing is lost and a slow reader only slows
        its own reads.
        """
        out: list[PageOut] = []
        for peer in list({**self._fetches, **self._replays}):
            fetches = self._fetches.get(peer, {})
            for rid, fetch in list(fetches.items()):
                if fetch.done:
                    self.cancel_fetch(peer, rid)
                elif fetch.resume_at <= now:
                    out += self._fetch_page(peer, fetch, now)
            for name, replay in list(self._replays.get(peer, {}).items()):
                if replay.resume_at <= now:
                    out += self._replay_page(peer, name, replay, now)
            peer.last_sent = now
        return out

    def _replay_page(self, peer: Peer, name: str, replay: Replay, now: float) -> list[PageOut]:
        journal = replay.journal
        rid = peer.routing_id
        try:
            records, next_seq = journal.read(replay.cursor, None, None, max_records=REPLAY_PAGE)
        except (Trimmed, OSError) as exc:  # retention, or a segment gone or unreadable
            if isinstance(exc, Trimmed) and replay.oldest:  # (FROM 0: the oldest kept is further on now)
                replay.cursor = max(replay.cursor, journal.first_seq)
                return []
            self._replay_ended(peer, name, replay)
            code = Status.GONE if isinstance(exc, Trimmed) else Status.STORAGE_FAILED
            pattern = ".".join(replay.patterns[0])
            reason = str(exc) if isinstance(exc, Trimmed) else self._read_failed(journal, exc, now)
            return [PageOut(rid, P.replay_ended(code, reason, name, pattern), "error", name, 0, 0)]
        out = []
        for record in records:
            if record.seq < replay.floor:
                continue  # (the subscriber had it: a JetStream journal's copy here was behind its FROM)
            tokens = self._tokens_of(record.topic)
            if tokens is None or not replay.matches(tokens):
                continue
            if peer.grants.deny_subscribe and not peer.grants.delivers(tokens):
                continue
            if is_dead_letter(tokens) and not origin_allowed(peer.grants, record.headers):
                continue  # a dead letter of a topic this reader may not see
            out.append(PageOut(rid, record_message(record, name), "replay", name, record.seq, 1))
        self.counters["replayed"] += len(out)
        replay.cursor = next_seq
        if records:
            replay.waited_since = None
            replay.oldest = replay.oldest and not out
            return out
        # Ends only on a turn with nothing left, so a record whose send
        # failed in the last page is still resent (see page_blocked).  Of a JetStream journal, only at
        # the end of a copy whose feed follows the stream: what it knows of the stream's end is current.
        behind = next_seq < journal.stored_next_seq
        if not behind and journal.following:
            self._replay_ended(peer, name, replay)
            return out
        # A JetStream journal's copy is behind what the stream acknowledged, or its feed does not follow
        # the stream now (starting, or making its consumer again): look again in a moment (not every
        # loop turn), for at most CATCH_UP_S without progress.
        if replay.waited_since is None:
            replay.waited_since = now
        if now - replay.waited_since < CATCH_UP_S:
            replay.resume_at = now + CATCH_UP_POLL
            return out
        self._replay_ended(peer, name, replay)
        self.counters["replay_copy_behind" if behind else "replay_copy_not_following"] += 1
        reason = copy_short(journal, next_seq) + f"; replay stopped at seq {next_seq} (subscribe again FROM {next_seq})"
        pattern = ".".join(replay.patterns[0])
        ended = P.replay_ended(Status.DEADLINE, reason, name, pattern)  # (the SUB stays: live from here)
        return out + [PageOut(peer.routing_id, ended, "error", name, 0, 0)]

    def _read_failed(self, journal: JournalStore, exc: OSError, now: float) -> str:
        """A read of ``journal`` failed: its log line names the file (at most one a minute per journal,
        the rest counted); the wire reason it returns names the journal, never the disk."""
        self.counters["journal_read_failed"] += 1
        if now - self._read_faults_written.get(journal.name, -READ_FAULT_LOG_S) >= READ_FAULT_LOG_S:
            self._read_faults_written[journal.name] = now
            log.error("journal %s: read failed: %s", journal.name, exc)
        return f"journal {journal.name} could not be read: {storage_fault(exc)}"

    def _fetch_page(self, peer: Peer, fetch: Fetch, now: float) -> list[PageOut]:
        journal = fetch.journal
        rid = peer.routing_id
        dialect = peer.dialect
        start = fetch.cursor
        waiting = self._fetch_waits(peer, fetch, start, now)
        if waiting is not None:
            return waiting
        fetch.waited_since = None
        if start < fetch.end and fetch.records_left > 0 and fetch.bytes_left > 0:
            max_records = min(fetch.page.records, fetch.records_left)
            max_bytes = min(fetch.page.size, fetch.bytes_left)
            try:
                columns = None
                if fetch.page.encoding == P.PAGE_COLUMNS:  # the fast path: no Record objects
                    columns, cursor = read_columns_page(journal, start, fetch.end, fetch.match, max_records, max_bytes)
                    if holds_dead_letters(columns.topics):
                        columns = None  # dead letters need their headers read: the general path below
                    else:
                        fetch.cursor = cursor
                        count, spent = len(columns.seqs), sum(map(len, columns.parts))
                        body = [P.columns_page(columns, cursor)] if count else []
                if columns is None:
                    records, fetch.cursor = journal.read(
                        start, fetch.end, fetch.match, max_records=max_records, max_bytes=max_bytes
                    )
                    if fetch.match is not None:  # a dead letter also needs its original topic's grant
                        grants = peer.grants
                        records = [
                            r
                            for r in records
                            if not r.topic.startswith(SYS_DEAD_PREFIX) or origin_allowed(grants, r.headers)
                        ]
                    count = len(records)
                    spent = sum(len(p) for r in records for p in r.parts)
                    if fetch.page.encoding == P.PAGE_COLUMNS:
                        body = [P.columns_page(P.page_columns(records), fetch.cursor)] if count else []
                    else:
                        body = P.journal_page(records) if count else []
            except (Trimmed, OSError) as exc:  # retention overtook a slow fetch, or a segment unreadable
                self.cancel_fetch(peer, fetch.rid)
                code = Status.GONE if isinstance(exc, Trimmed) else Status.STORAGE_FAILED
                reason = str(exc) if isinstance(exc, Trimmed) else self._read_failed(journal, exc, now)
                failed = dialect.error(fetch.rid, JOURNAL_SERVICE, code, reason)
                return [PageOut(rid, failed, "error", fetch.rid, 0, 0)]
            spent = spent or 1  # a page that matched nothing still costs
            fetch.records_left -= count or 1
            fetch.bytes_left -= spent
            if not count:
                return []
            fetch.count += count
            page = dialect.partial(fetch.rid, JOURNAL_SERVICE, {}, fetch.user, body)
            if page is None:  # the client's dialect has no partial replies: only the FINAL's summary reaches it
                self.counters["partials_unsent"] += 1
                return []
            return [PageOut(rid, page, "fetch", fetch.rid, start, count, spent)]
        summary = {
            "next_seq": fetch.cursor,
            "records": fetch.count,
            "first_seq": journal.first_seq,
            "end_seq": journal.stored_next_seq,
        }
        fetch.done = True
        final = dialect.final(fetch.rid, JOURNAL_SERVICE, {}, fetch.user, [json.dumps(summary).encode()])
        return [PageOut(rid, final, "fetch", fetch.rid, fetch.cursor, 0)]

    def _fetch_waits(self, peer: Peer, fetch: Fetch, start: int, now: float) -> list[PageOut] | None:
        """A fetch of a JetStream journal whose copy is behind what the stream acknowledged, or at whose
        end the copy's feed does not follow the stream now, waits (polling) at most CATCH_UP_S: what to send
        now while it does ([]), or when it stops (the FINAL says where, or an error says why); None: go on."""
        journal = fetch.journal
        behind = journal.next_seq <= start < fetch.end
        unsure = not behind and self._unsure_end(fetch, start)
        if not behind and not unsure:
            return None
        if fetch.waited_since is None:
            fetch.waited_since = now
        if now - fetch.waited_since < CATCH_UP_S:
            if unsure:
                stream_next = journal.stored_next_seq  # (the feed, back, may tell of more)
                fetch.end = stream_next if fetch.to_seq is None else min(fetch.to_seq, stream_next)
            fetch.resume_at = now + CATCH_UP_POLL
            return []
        if behind:
            self.counters["fetch_copy_behind"] += 1
            fetch.end = fetch.to_seq = start  # the FINAL says where the fetch stopped: the reader asks again
            return None
        self.counters["fetch_copy_not_following"] += 1
        self.cancel_fetch(peer, fetch.rid)
        reason = copy_short(journal, start) + f"; fetched up to seq {start}: ask again from there"
        failed = peer.dialect.error(fetch.rid, JOURNAL_SERVICE, Status.DEADLINE, reason)
        return [PageOut(peer.routing_id, failed, "error", fetch.rid, 0, 0)]

    @staticmethod
    def _unsure_end(fetch: Fetch, start: int) -> bool:
        """A fetch of a JetStream journal at its end as this broker knows it, with room for more, while
        the copy's feed does not follow the stream: the stream may hold more than is known here."""
        if fetch.journal.following or start < fetch.end or fetch.records_left <= 0 or fetch.bytes_left <= 0:
            return False
        return fetch.to_seq is None or start < fetch.to_seq

    def page_blocked(self, blocked: PageOut, peer: Peer, now: float) -> None:
        """A stream message could not be queued: rewind its stream and pause it briefly."""
        if blocked.kind == "replay":
            replay = self._replays.get(peer, {}).get(blocked.key)
            if replay is not None:
                replay.cursor = min(replay.cursor, blocked.seq)
                replay.resume_at = now + REPLAY_BACKOFF
        elif blocked.kind == "fetch":
            fetch = self._fetches.get(peer, {}).get(blocked.key)
            if fetch is not None:
                if blocked.seq < fetch.cursor or fetch.done:
                    fetch.cursor = blocked.seq
                    fetch.count -= blocked.records
                    fetch.records_left += blocked.records
                    fetch.bytes_left += blocked.size
                fetch.done = False
                fetch.resume_at = now + REPLAY_BACKOFF
        else:
            return
        self.counters["stream_paused"] += 1

    def next_deadline(self, earliest: float) -> float:
        """``earliest``, or sooner when retention or a paused read is due."""
        if self._journals:
            earliest = min(earliest, self._next_retention)
        for replays in self._replays.values():
            for replay in replays.values():
                earliest = min(earliest, replay.resume_at)
        for fetches in self._fetches.values():
            for fetch in fetches.values():
                earliest = min(earliest, fetch.resume_at)
        return earliest


def copy_short(journal: JournalStore, reached: int) -> str:
    """Why a read of a JetStream journal's copy stopped at ``reached`` after CATCH_UP_S without progress: the
    copy did not reach what the stream acknowledged, or its feed did not follow the stream (then why)."""
    stream = jsw.stream_name(journal.name)
    why = "" if journal.following else f" (its feed: {journal.copy_reason or 'not running'})"
    if reached < journal.stored_next_seq:
        short = f"did not reach seq {journal.stored_next_seq} within {CATCH_UP_S:g} s"
    else:
        short = f"did not follow stream {stream} within {CATCH_UP_S:g} s"
    return f"journal {journal.name}: this broker's copy {short}{why}"


def record_message(record: Record, journal: str) -> list[bytes]:
    """A journal record as the MESSAGE a 1.0 subscriber gets live (with JOURNAL and SEQ)."""
    user = P.user_header_frames(record.headers)
    return P.message(record.topic.encode(), record.sender.encode(), user, record.parts, (journal.encode(), record.seq))
