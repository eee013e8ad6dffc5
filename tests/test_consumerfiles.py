"""Durable consumers' state files: an append-only log per consumer, compacted into a snapshot.
Real files in a temp folder; torn writes made by cutting the log, as a crash would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mc0.broker.storage import consumerfiles
from mc0.broker.storage.consumerfiles import ConsumerFiles
from mc0.protocol import journalrecords


def reopened(folder: Path) -> dict[str, bytes]:
    return ConsumerFiles(folder, sync=False).load_all()


@pytest.mark.parametrize("sync", [False, True])
def test_the_newest_state_comes_back_and_one_save_is_one_append(tmp_path: Path, sync: bool) -> None:
    files = ConsumerFiles(tmp_path / "consumers", sync=sync)
    assert files.load_all() == {}  # no folder yet: nothing, and nothing created
    assert not (tmp_path / "consumers").exists()
    for i in range(50):
        files.save("work", f'{{"acked": {i}}}'.encode())
    files.save("other", b"{}")
    log = tmp_path / "consumers" / "work.log"
    assert log.stat().st_size == sum(8 + len(f'{{"acked": {i}}}') for i in range(50))
    assert not (tmp_path / "consumers" / "work.json").exists()  # no snapshot until the log is long
    assert reopened(tmp_path / "consumers") == {"work": b'{"acked": 49}', "other": b"{}"}
    files.close()
    files.close()  # idempotent


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("sync", [False, True])
def test_descriptors_stay_bounded_however_many_consumers_save(tmp_path: Path, sync: bool) -> None:
    """One descriptor per consumer ran a broker out of them (1,018 open for 1,000 consumers)."""
    files = ConsumerFiles(tmp_path, sync=sync)
    before = open_fds()
    names = [f"c{i}" for i in range(3 * consumerfiles.MAX_OPEN_LOGS)]
    for turn in range(3):  # every log is closed and reopened between saves
        for name in names:
            files.save(name, f"{name}-{turn}".encode())
        assert open_fds() - before <= consumerfiles.MAX_OPEN_LOGS
    assert reopened(tmp_path) == {name: f"{name}-2".encode() for name in names}
    assert (tmp_path / "c0.log").stat().st_size == sum(8 + len(f"c0-{t}") for t in range(3))  # appended
    files.close()
    assert open_fds() == before


def test_a_torn_last_record_falls_back_to_the_one_before(tmp_path: Path) -> None:
    files = ConsumerFiles(tmp_path, sync=False)
    files.save("c", b"first")
    files.save("c", b"second")
    files.close()
    log = tmp_path / "c.log"
    size = log.stat().st_size
    for cut in range(size - len(b"second") - 8 + 1, size):  # every torn length of the last record
        data = log.read_bytes()[:cut]
        (tmp_path / "torn").mkdir(exist_ok=True)
        (tmp_path / "torn" / "c.log").write_bytes(data)
        assert reopened(tmp_path / "torn") == {"c": b"first"}, cut


def test_a_corrupt_record_is_ignored_from_there_on(tmp_path: Path) -> None:
    files = ConsumerFiles(tmp_path, sync=False)
    for state in (b"one", b"two", b"three"):
        files.save("c", state)
    files.close()
    data = bytearray((tmp_path / "c.log").read_bytes())
    data[8 + 3 + 8] ^= 0xFF  # a bit flip in "two"
    (tmp_path / "c.log").write_bytes(bytes(data))
    assert reopened(tmp_path) == {"c": b"one"}


def test_reopening_appends_after_what_is_there_and_a_torn_lone_record_is_dropped(tmp_path: Path) -> None:
    files = ConsumerFiles(tmp_path, sync=False)
    files.save("c", b"before restart")
    files.close()
    again = ConsumerFiles(tmp_path, sync=False)
    again.save("c", b"after restart")
    again.close()
    assert reopened(tmp_path) == {"c": b"after restart"}
    (tmp_path / "d.log").write_bytes(b"\x10\x00\x00\x00")  # a crash in the first record's head
    (tmp_path / "d.json").write_bytes(b"snapshot")
    assert reopened(tmp_path)["d"] == b"snapshot"
    files = ConsumerFiles(tmp_path, sync=False)
    files.save("d", b"new")
    files.close()
    assert (tmp_path / "d.log").stat().st_size == 8 + 3  # the torn head was cut before appending
    assert reopened(tmp_path)["d"] == b"new"


def test_saves_after_a_torn_tail_are_read_back(tmp_path: Path) -> None:
    """A crash tore the last record; the restarted broker's saves must not land behind the tear."""
    files = ConsumerFiles(tmp_path, sync=False)
    files.save("c", b"kept")
    files.save("c", b"torn by the crash")
    files.close()
    log = tmp_path / "c.log"
    os.truncate(log, log.stat().st_size - 3)
    assert reopened(tmp_path) == {"c": b"kept"}
    restarted = ConsumerFiles(tmp_path, sync=False)
    restarted.save("c", b"after the restart")
    restarted.close()
    assert log.stat().st_size == 2 * 8 + len(b"kept") + len(b"after the restart")
    assert reopened(tmp_path) == {"c": b"after the restart"}


def test_compaction_bounds_the_log_and_keeps_the_newest_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumerfiles, "COMPACT_MIN_BYTES", 200)
    monkeypatch.setattr(consumerfiles, "COMPACT_RATIO", 2)
    files = ConsumerFiles(tmp_path, sync=False)
    for i in range(100):
        files.save("c", b"%05d" % i + b"x" * 20)
        assert (tmp_path / "c.log").stat().st_size <= 200 + 8 + 25
    assert (tmp_path / "c.json").exists()
    assert reopened(tmp_path) == {"c": b"00099" + b"x" * 20}
    files.close()


def test_a_crash_between_snapshot_and_emptying_the_log_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumerfiles, "COMPACT_MIN_BYTES", 50)
    monkeypatch.setattr(consumerfiles, "COMPACT_RATIO", 1)
    files = ConsumerFiles(tmp_path, sync=False)
    files.save("c", b"x" * 30)

    def crash(fd: int, length: int) -> None:
        raise OSError("the broker died here")

    monkeypatch.setattr(consumerfiles.os, "ftruncate", crash)
    with pytest.raises(OSError, match="died here"):
        files.save("c", b"y" * 30)  # past 50 bytes: the snapshot is written, then the crash
    assert (tmp_path / "c.json").read_bytes() == b"y" * 30
    assert reopened(tmp_path) == {"c": b"y" * 30}  # the log's last record is the same state


def test_deleting_removes_both_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumerfiles, "COMPACT_MIN_BYTES", 10)
    monkeypatch.setattr(consumerfiles, "COMPACT_RATIO", 1)
    files = ConsumerFiles(tmp_path, sync=True)
    files.save("c", b"a state long enough to compact")
    files.save("c", b"a state long enough to compact")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "c.log"]
    files.save("c", None)
    assert list(tmp_path.iterdir()) == [] and reopened(tmp_path) == {}
    files.save("c", None)  # deleting twice is fine
    files.close()


@settings(max_examples=60, deadline=None)
@given(states=st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=40), cut=st.integers(0, 400))
def test_property_after_any_crash_the_state_is_the_last_saved_or_an_earlier_one(
    tmp_path_factory: pytest.TempPathFactory, states: list[bytes], cut: int
) -> None:
    """Whatever was saved, and wherever a crash cut the log's tail, what loads is one of the saved
    states; uncut, it is the last.  Compaction is forced often (small threshold)."""
    folder = tmp_path_factory.mktemp("cf")
    old = consumerfiles.COMPACT_MIN_BYTES, consumerfiles.COMPACT_RATIO
    consumerfiles.COMPACT_MIN_BYTES, consumerfiles.COMPACT_RATIO = 500, 2
    try:
        files = ConsumerFiles(folder, sync=False)
        for state in states:
            files.save("c", state)
        files.close()
    finally:
        consumerfiles.COMPACT_MIN_BYTES, consumerfiles.COMPACT_RATIO = old
    assert reopened(folder) == {"c": states[-1]}
    log = folder / "c.log"
    size = log.stat().st_size
    os.truncate(log, max(0, size - cut))
    loaded = reopened(folder).get("c")
    if loaded is None:  # only when the crash tore the first record ever saved (no snapshot yet)
        assert not (folder / "c.json").exists() and size - cut < 8 + len(states[0])
    else:
        assert loaded in states
        if cut == 0:
            assert loaded == states[-1]
    restarted = ConsumerFiles(folder, sync=False)  # the broker after the crash saves again
    restarted.save("c", b"after")
    restarted.close()
    assert reopened(folder) == {"c": b"after"}


def saved(folder: Path) -> dict[str, tuple[bytes, list[bytes]]]:
    return ConsumerFiles(folder, sync=False).load_saved()


@pytest.mark.parametrize("sync", [False, True])
def test_changes_come_back_after_their_whole_state_in_order_and_a_whole_save_ends_them(
    tmp_path: Path, sync: bool
) -> None:
    files = ConsumerFiles(tmp_path, sync=sync)
    files.save("c", b"whole 1")
    for change in (b"-1", b"-2", b"-3"):
        files.save_change("c", change)
    assert saved(tmp_path) == {"c": (b"whole 1", [b"-1", b"-2", b"-3"])}
    assert reopened(tmp_path) == {"c": b"whole 1"}  # load_all: the whole states alone
    assert (tmp_path / "c.log").stat().st_size == 8 + 7 + 3 * (8 + 2)  # one append each
    files.save("c", b"whole 2")
    files.save_change("c", b"-4")
    files.close()
    assert saved(tmp_path) == {"c": (b"whole 2", [b"-4"])}


def test_a_torn_change_falls_back_to_the_changes_before_it(tmp_path: Path) -> None:
    files = ConsumerFiles(tmp_path, sync=False)
    files.save("c", b"whole")
    files.save_change("c", b"first")
    files.save_change("c", b"second")
    files.close()
    data = (tmp_path / "c.log").read_bytes()
    for cut in range(len(data) - 8 - len(b"second") + 1, len(data)):  # every torn length of the last change
        torn = tmp_path / f"torn{cut}"
        torn.mkdir()
        (torn / "c.log").write_bytes(data[:cut])
        assert saved(torn) == {"c": (b"whole", [b"first"])}, cut
        restarted = ConsumerFiles(torn, sync=False)  # the broker after the crash: appends behind the tear
        restarted.save_change("c", b"after")
        restarted.close()
        assert saved(torn) == {"c": (b"whole", [b"first", b"after"])}, cut


def test_changes_after_a_compaction_apply_to_the_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumerfiles, "COMPACT_MIN_BYTES", 40)
    monkeypatch.setattr(consumerfiles, "COMPACT_RATIO", 1)
    files = ConsumerFiles(tmp_path, sync=False)
    files.save("c", b"w" * 30)
    for i in range(5):  # changes never compact: they stay after the state they change
        files.save_change("c", b"change %d" % i)
    assert saved(tmp_path) == {"c": (b"w" * 30, [b"change %d" % i for i in range(5)])}
    files.save("c", b"v" * 30)  # past 40 bytes: the snapshot, and the log starts over
    assert (tmp_path / "c.log").stat().st_size == 0 and (tmp_path / "c.json").read_bytes() == b"v" * 30
    files.save_change("c", b"later")
    files.close()
    assert saved(tmp_path) == {"c": (b"v" * 30, [b"later"])}


def test_a_change_record_reads_as_a_torn_record_to_a_reader_without_changes(tmp_path: Path) -> None:
    """A broker from before change records starts from the whole state before them (at least once)."""
    files = ConsumerFiles(tmp_path, sync=False)
    files.save("c", b"whole")
    files.save_change("c", b"-1")
    files.close()
    data = (tmp_path / "c.log").read_bytes()
    length = int.from_bytes(data[8 + 5 : 8 + 5 + 4], "little")
    assert length == journalrecords.CHANGE_FLAG | 2  # far past the file's end for a reader that ignores the flag


@settings(max_examples=60, deadline=None)
@given(
    saves=st.lists(st.tuples(st.booleans(), st.binary(min_size=0, max_size=200)), min_size=1, max_size=40),
    cut=st.integers(0, 400),
)
def test_property_after_any_crash_a_whole_state_and_a_prefix_of_its_changes_load(
    tmp_path_factory: pytest.TempPathFactory, saves: list[tuple[bool, bytes]], cut: int
) -> None:
    """Whole states and changes interleaved (the first save whole, as the core does), compaction forced
    often: uncut, the last whole state and every change after it load; cut anywhere, a whole state
    saved and a prefix of the changes saved right after it."""
    folder = tmp_path_factory.mktemp("cfc")
    saves = [(True, saves[0][1]), *saves[1:]]
    histories: list[tuple[bytes, list[bytes]]] = []  # each whole state with the changes that followed it
    old = consumerfiles.COMPACT_MIN_BYTES, consumerfiles.COMPACT_RATIO
    consumerfiles.COMPACT_MIN_BYTES, consumerfiles.COMPACT_RATIO = 300, 2
    try:
        files = ConsumerFiles(folder, sync=False)
        for whole, data in saves:
            if whole:
                files.save("c", data)
                histories.append((data, []))
            else:
                files.save_change("c", data)
                histories[-1][1].append(data)
        files.close()
    finally:
        consumerfiles.COMPACT_MIN_BYTES, consumerfiles.COMPACT_RATIO = old
    assert saved(folder) == {"c": histories[-1]}
    log = folder / "c.log"
    os.truncate(log, max(0, log.stat().st_size - cut))
    loaded = saved(folder).get("c")
    if loaded is None:  # only when the crash tore the first record ever saved (no snapshot yet)
        assert not (folder / "c.json").exists()
        return
    state, changes = loaded
    assert any(state == s and changes == later[: len(changes)] for s, later in histories)
