"""mc0.ports: leased loopback ports below the ephemeral range, disjoint across processes."""

from __future__ import annotations

import multiprocessing
import socket
from pathlib import Path

import pytest

from mc0 import ports

pytestmark = pytest.mark.timeout(60)


def _ask(count: int) -> list[int]:
    return ports.free_ports(count)


@pytest.fixture
def own_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ledger of this test's own: the shared one keeps the leases of the other test workers."""
    monkeypatch.setattr(ports, "_ledger_dir", lambda: tmp_path)
    return tmp_path / "leases.json"


def test_ports_are_distinct_bindable_and_below_the_kernels_ephemeral_range() -> None:
    low, _ = ports._ephemeral_range()
    got = ports.free_ports(12)
    assert len(set(got)) == 12
    assert all(ports.LOWEST <= p < low for p in got)
    for port in got:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # nothing listens there


def test_a_port_handed_out_is_leased_until_it_expires(own_ledger: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports.random, "randrange", lambda span: 0)  # every caller starts at LOWEST
    first = ports.free_ports(3)
    second = ports.free_ports(3)
    assert not set(first) & set(second)
    monkeypatch.setattr(ports, "LEASE_SECONDS", -1.0)  # leases written from now on are already over
    own_ledger.write_text("{}")
    assert ports.free_ports(3) == first  # nothing listens there and no lease holds them


def test_a_port_someone_listens_on_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", ports.free_port()))  # leased in the shared ledger: no other worker's
        listener.listen()
        busy = listener.getsockname()[1]
        # A ledger of this test's own, empty: only the bind probe stands between that port and the caller.
        monkeypatch.setattr(ports, "_ledger_dir", lambda: tmp_path)
        monkeypatch.setattr(ports.random, "randrange", lambda span: busy - ports.LOWEST)
        got = ports.free_ports(2)
    assert busy not in got
    assert len(set(got)) == 2


def _same_start() -> None:
    ports.random.seed(0)  # every worker scans from the same place: only the ledger keeps them apart


def test_concurrent_processes_never_get_the_same_port() -> None:
    with multiprocessing.get_context("spawn").Pool(4, initializer=_same_start) as pool:
        answers = pool.map(_ask, [40] * 8, chunksize=1)
    every = [p for answer in answers for p in answer]
    assert len(every) == 320
    assert len(set(every)) == 320


@pytest.mark.parametrize("torn", ['{"2', "[1, 2]", '{"20000": "soon"}', '{"20000": null}', "\x00"])
def test_a_torn_ledger_forgets_leases_and_still_answers(own_ledger: Path, torn: str) -> None:
    own_ledger.write_text(torn)
    assert len(set(ports.free_ports(3))) == 3
    assert len(ports.json.loads(own_ledger.read_text())) == 3  # written whole again


@pytest.mark.parametrize("count", [0, -1])
def test_asking_for_no_ports_is_local_misuse(count: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ports.free_ports(count)


def test_no_room_below_the_ephemeral_range_falls_back_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: (ports.LOWEST + 10, 60999))
    got = ports.free_ports(3)
    assert len(set(got)) == 3
    assert all(p >= ports.LOWEST + 10 for p in got)


def test_the_shared_ledger_folder_is_private() -> None:
    folder = ports._ledger_dir()
    assert folder is not None
    assert folder.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("planted", ["symlink", "open folder", "file"])
def test_a_ledger_folder_planted_by_someone_else_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: str
) -> None:
    monkeypatch.setattr(ports.tempfile, "gettempdir", lambda: str(tmp_path))
    name = tmp_path / f"mc0-ports-{ports.os.getuid()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if planted == "symlink":
        name.symlink_to(elsewhere)
    elif planted == "open folder":
        name.mkdir()
        name.chmod(0o777)
    else:
        name.write_text("")
    assert ports._ledger_dir() is None
    assert len(set(ports.free_ports(3))) == 3  # the kernel's ports, as when there is no room
    assert list(elsewhere.iterdir()) == []
    assert planted != "open folder" or list(name.iterdir()) == []
