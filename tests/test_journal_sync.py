"""The file journal's background fsync (mc0/broker/storage/syncer.py) and what a slow disk does to a broker.

A ``batch`` journal opened with ``on_synced`` (as the broker opens it) writes a turn's records on the
caller's thread and fsyncs them on its sync thread: the loop goes on meanwhile, live deliveries go out
once written, and a confirmed PUT's OK waits for the fsync (docs/PROTOCOL.md, "Live copies and the
disk").  A stalled fsync stands in for a slow disk: ``syncer.fsync`` (the thread's) or ``os.fsync``
(the loop's own, under ``fsync = "always"``) blocks on an event until the test lets it go."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import mc0
import mc0.aio
from mc0 import protocol as P
from mc0.broker.core.dispatch import BrokerCore, CoreSettings
from mc0.broker.storage import syncer
from mc0.broker.storage.filestore import Journal, JournalSettings

from .test_core import connect, f

STALL_LIMIT = 30.0  # a stalled fsync gives up waiting for the test after this (every wait is bounded)


class Stall:
    """An fsync that blocks until ``release()`` (or STALL_LIMIT), then does the real one; ``entered`` is
    set once one is waiting, ``calls`` counts them.  ``fail`` makes the next call raise EIO instead."""

    def __init__(self, real: Callable[[int], None] = os.fsync) -> None:
        self.real = real
        self.go = threading.Event()
        self.entered = threading.Event()
        self.calls = 0
        self.fail = False

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.entered.set()
        self.go.wait(STALL_LIMIT)
        if self.fail:
            self.fail = False
            raise OSError(5, "Input/output error")
        self.real(fd)

    def release(self) -> None:
        self.go.set()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # bounded by the deadline
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.005)


def opened(tmp_path: Path, on_synced: Callable[[], None], **settings: object) -> Journal:
    options = {"folder": str(tmp_path / "j"), "topics": ("orders.>",), **settings}
    return Journal("main", JournalSettings(**options), on_synced=on_synced).open()  # type: ignore[arg-type]


# ------------------------------------------------------------------ the sync thread


def test_requests_made_while_an_fsync_runs_share_the_next_one(tmp_path: Path) -> None:
    stall = Stall()
    woken: list[int] = []
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    thread = syncer.Syncer("t", lambda: woken.append(1))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(syncer, "fsync", stall)
            thread.request(fd, 1)
            assert stall.entered.wait(10)
            thread.request(fd, 2)  # while the first runs ...
            thread.request(fd, 3)  # ... these two coalesce into one
            assert thread.synced == 0 and not thread.idle
            stall.release()
            thread.settle()
        assert (thread.synced, thread.fsyncs, stall.calls) == (3, 2, 2)
        wait_for(lambda: len(woken) == 2, what="a wake-up after each fsync")
    finally:
        thread.close()
        thread.close()  # idempotent
        os.close(fd)


def test_a_failed_fsync_keeps_its_mark_and_reports_its_error_once(tmp_path: Path) -> None:
    stall = Stall()
    stall.fail = True
    stall.release()
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    thread = syncer.Syncer("t", lambda: None)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(syncer, "fsync", stall)
            thread.request(fd, 5)
            thread.settle()
            assert thread.synced == 0
            error = thread.take_error()
            assert isinstance(error, OSError) and error.errno == 5
            assert thread.take_error() is None
            thread.request(fd, 6)  # asked again: this one works
            thread.settle()
        assert thread.synced == 6 and thread.take_error() is None
    finally:
        thread.close()
        os.close(fd)


# ------------------------------------------------------------------ the journal with a sync thread


def test_a_batch_journal_with_a_sync_thread_writes_at_commit_and_is_durable_once_the_fsync_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stall = Stall()
    monkeypatch.setattr(syncer, "fsync", stall)
    woken = threading.Event()
    j = opened(tmp_path, woken.set)
    try:
        seqs = [j.append("orders.x", "alice", {}, [f"m{i}".encode()]) for i in range(3)]
        assert (seqs, j.append_mark, j.durable_mark) == ([1, 2, 3], 3, 0)
        j.commit()  # returns with the fsync still stalled
        assert stall.entered.wait(10)
        assert j.pending and j.durable_mark == 0
        segment = next((tmp_path / "j").glob("*.seg"))
        assert segment.stat().st_size > 0  # written to the OS already
        assert [r.body for r in j.read(1)[0]] == [b"m0", b"m1", b"m2"]
        j.append("orders.x", "alice", {}, [b"m3"])
        j.commit()  # written too; its fsync waits for the one running
        stall.release()
        assert woken.wait(10)
        wait_for(lambda: j.durable_mark == 4, what="the sync thread reaching the last append")
        assert not j.pending
        j.commit()
        assert j.counters["fsyncs"] == 2 and stall.calls == 2  # the two commits' requests, no more
    finally:
        stall.release()
        j.close()
    assert [r.body for r in Journal("main", JournalSettings(folder=str(tmp_path / "j"))).open().read(1)[0]] == [
        b"m0",
        b"m1",
        b"m2",
        b"m3",
    ]


@pytest.mark.parametrize("policy", ["never", "always"])
def test_only_a_batch_journal_syncs_on_a_thread(tmp_path: Path, policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    stall = Stall()
    monkeypatch.setattr(syncer, "fsync", stall)
    j = opened(tmp_path, lambda: None, fsync=policy)
    try:
        j.append("orders.x", "alice", {}, [b"x"])
        j.commit()
        assert j.durable_mark == j.append_mark == 1 and not j.pending  # at once: written (and fsynced: always)
        assert stall.calls == 0
        assert j.counters["fsyncs"] == (1 if policy == "always" else 0)
    finally:
        j.close()


def test_a_roll_and_a_close_wait_for_the_running_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync thread's fsync uses the active segment's file: a roll (which closes it) waits for it."""
    stall = Stall()
    monkeypatch.setattr(syncer, "fsync", stall)
    j = opened(tmp_path, lambda: None, segment_bytes=4096)
    rolled = threading.Event()
    try:
        j.append("orders.x", "alice", {}, [b"x" * 1000])
        j.commit()
        assert stall.entered.wait(10)

        def fill() -> None:
            for _ in range(5):
                j.append("orders.x", "alice", {}, [b"y" * 1000])  # the fourth rolls the segment
            rolled.set()

        filler = threading.Thread(target=fill, daemon=True)
        filler.start()
        assert not rolled.wait(0.3)  # the roll waits for the stalled fsync ...
        stall.release()
        assert rolled.wait(10)  # ... and goes on once it is done
        filler.join(10)
        j.commit()
    finally:
        stall.release()
        j.close()
    again = Journal("main", JournalSettings(folder=str(tmp_path / "j"))).open()
    assert again.next_seq == 7 and len(list((tmp_path / "j").glob("*.seg"))) == 2


def test_the_core_holds_an_ok_until_the_sync_thread_made_its_record_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stall = Stall()
    monkeypatch.setattr(syncer, "fsync", stall)
    j = opened(tmp_path, lambda: None)
    core = BrokerCore(CoreSettings(), journals=[j], wall_offset=1000.0)
    for rid in (b"pub", b"sub"):
        connect(core, rid, who=rid.decode())
    core.handle(b"sub", f("SUB", "", "orders.>"), 0.0, "sub")
    try:
        out = core.handle(b"pub", f("PUT", "TOPIC", "orders.1", "ID", "a", "", "x"), 0.0, "pub")
        assert [rid for rid, _ in out] == [b"sub"]  # delivered (the shell sends it after the commit's write)
        assert core.commit() == []  # written, its fsync stalled: no OK yet
        assert stall.entered.wait(10) and core.uncommitted
        out = core.handle(b"pub", f("PUT", "TOPIC", "orders.2", "ID", "b", "", "y"), 0.0, "pub")
        assert [rid for rid, _ in out] == [b"sub"]  # the core goes on meanwhile
        assert core.commit() == []
        stall.release()
        wait_for(lambda: j.durable_mark == 2, what="both records made durable")
        assert core.commit() == [(b"pub", P.ok_journaled("a", "main", 1)), (b"pub", P.ok_journaled("b", "main", 2))]
        assert not core.uncommitted
    finally:
        stall.release()
        j.close()


def test_a_failed_background_fsync_answers_every_held_ok_507_and_the_next_commit_asks_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stall = Stall()
    stall.fail = True
    monkeypatch.setattr(syncer, "fsync", stall)
    j = opened(tmp_path, lambda: None)
    core = BrokerCore(CoreSettings(), journals=[j], wall_offset=1000.0)
    connect(core, b"pub", who="pub")
    try:
        core.handle(b"pub", f("PUT", "TOPIC", "orders.1", "ID", "a", "", "x"), 0.0, "pub")
        assert core.commit() == []
        stall.release()
        wait_for(lambda: j._syncer is not None and j._syncer.idle, what="the failed fsync")
        out = core.commit()
        assert [(rid, frames[:5]) for rid, frames in out] == [(b"pub", f("ERROR", "ID", "a", "CODE", "507"))]
        assert core.counters["journal_write_failed"] == 1
        core.handle(b"pub", f("PUT", "TOPIC", "orders.2", "ID", "b", "", "y"), 0.0, "pub")
        core.commit()  # asks again: the record of the failed one and this one
        wait_for(lambda: j.durable_mark == 2, what="the next fsync")
        assert core.commit() == [(b"pub", P.ok_journaled("b", "main", 2))]
    finally:
        stall.release()
        j.close()


# ------------------------------------------------------------------ a slow disk under a real broker


@contextlib.contextmanager
def broker_with_journal(tmp_path: Path, fsync: str) -> Iterator[Any]:
    from mc0.broker.embedded import BrokerThread
    from mc0.config import parse

    text = '[security]\ncurve = false\n[broker]\nbind = ["tcp://127.0.0.1:*"]\n'
    text += f'[journals.main]\ntopics = ["slow.>"]\nfsync = "{fsync}"\nfolder = "{tmp_path / "main"}"\n'
    with BrokerThread(parse(text)) as thread:
        yield thread.broker


@pytest.mark.timeout(60)
def test_a_stalled_fsync_holds_acknowledgements_not_live_delivery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync = "batch" (the default) on a disk whose fsync stalls: the broker goes on serving, live
    copies reach the subscriber (each once its record is written), and the confirmed PUT's OK comes
    only once the stalled fsync has made its record durable (docs/PROTOCOL.md, "Live copies and the disk")."""
    stall = Stall()
    monkeypatch.setattr(syncer, "fsync", stall)

    async def scenario(endpoint: str) -> None:
        async with mc0.aio.Client(endpoint) as reader, mc0.aio.Client(endpoint) as writer:
            sub = await reader.subscribe("slow.>")
            confirmed = asyncio.create_task(writer.publish("slow.a", b"first", confirm=True, timeout=STALL_LIMIT))
            first = await asyncio.wait_for(sub.__anext__(), 10)  # delivered while its fsync is stalled
            assert first.body == b"first" and first.seq == 1 and first.journal == "main"
            assert await asyncio.to_thread(stall.entered.wait, 10)
            for i in range(100):
                writer.publish_nowait("slow.b", f"{i}".encode())
            got = [(await asyncio.wait_for(sub.__anext__(), 10)).body for _ in range(100)]
            assert got == [f"{i}".encode() for i in range(100)]  # the loop serves on
            await writer.ping(timeout=10)
            page = await writer.fetch("main", from_seq=1, topics=["slow.>"])  # written: the journal reads them
            assert [r.seq for r in page.records] == list(range(1, 102))
            assert not confirmed.done()  # ... but the OK waits for the fsync
            stall.release()
            ack = await asyncio.wait_for(confirmed, 10)
            assert ack is not None and (ack.journal, ack.seq) == ("main", 1)

    try:
        with broker_with_journal(tmp_path, "batch") as broker:
            asyncio.run(scenario(broker.endpoints[0]))
    finally:
        stall.release()


@pytest.mark.timeout(60)
def test_under_fsync_always_a_stalled_fsync_holds_live_delivery_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync = "always": each record is fsynced as it is appended, on the loop, before it is delivered."""
    stall = Stall(os.fsync)

    async def scenario(endpoint: str) -> None:
        async with mc0.aio.Client(endpoint) as reader, mc0.aio.Client(endpoint) as writer:
            sub = await reader.subscribe("slow.>")
            stall.entered.clear()
            writer.publish_nowait("slow.a", b"first")
            assert await asyncio.to_thread(stall.entered.wait, 10)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(sub.__anext__(), 0.5)  # not delivered while its fsync stalls
            stall.release()
            first = await asyncio.wait_for(sub.__anext__(), 10)
            assert first.body == b"first" and first.seq == 1

    try:
        with broker_with_journal(tmp_path, "always") as broker:
            monkeypatch.setattr(os, "fsync", stall)  # (the loop's own fsync, once it runs: nothing else here fsyncs)
            asyncio.run(scenario(broker.endpoints[0]))
    finally:
        stall.release()
