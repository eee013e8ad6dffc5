"""Free loopback TCP ports for child processes that bind them later (nats-server nodes, brokers, Spark).

Contract: ``free_ports(n)`` returns ``n`` distinct ports on 127.0.0.1 that
nothing listened on when asked and that no other caller of this module, in
any process of this user on this machine, was handed within the last
``LEASE_SECONDS`` (the ledger is per user: another user's callers are kept
apart only by the bind probe).

Why not ``bind(0)``: the kernel hands a port out of its ephemeral range, and
between closing the probe and the child's bind, anything else may take the
same port: another test's ``bind(0)`` or an outgoing connection's source
port (nats-server nodes dial each other's routes while they start).  Ports
here come from below the ephemeral range, which the kernel never hands out
by itself, and a ledger under a file lock keeps concurrent callers (pytest-
xdist workers, benchmarks) from picking the same one.  Cost: one flock and
a small JSON file read and written per call.  The ledger lives in a private
folder of the user's in the temp folder; if that name is taken by anything
else (a symlink, someone else's folder), or the kernel leaves no room below
its ephemeral range, ports come from ``bind(0)`` as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

LEASE_SECONDS = 1800.0  # longer than any test or benchmark keeps a child on a port it was handed
LOWEST = 20000  # below it are well-known and commonly configured service ports
EPHEMERAL_FALLBACK = (32768, 60999)  # Linux's default, when /proc does not say


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return EPHEMERAL_FALLBACK


def _ledger_dir() -> Path | None:
    """The ledger's folder; None when the shared temp folder holds something else under its name
    (a symlink or another user's folder: the ledger is never written where someone else points it)."""
    folder = Path(tempfile.gettempdir()) / f"mc0-ports-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        found = folder.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        return None
    return folder


@contextlib.contextmanager
def _ledger(folder: Path) -> Iterator[dict[str, float]]:
    """The leases (port -> expiry, wall clock: shared across processes), read and written under one flock."""
    with open(folder / "lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            path = folder / "leases.json"
            try:
                leases = {k: float(v) for k, v in json.loads(path.read_text() or "{}").items()}
            except (OSError, ValueError, AttributeError, TypeError):
                leases = {}  # a missing or torn ledger only forgets leases: the bind probe still guards
            now = time.time()
            leases = {k: v for k, v in leases.items() if v > now}
            yield leases
            scratch = path.with_suffix(".tmp")
            try:
                scratch.write_text(json.dumps(leases))
                os.replace(scratch, path)
            except OSError:  # a full disk: these leases are not kept, the bind probe still guards
                pass
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_ports(count: int) -> list[int]:
    """The old way (``bind(0)`` held together): only when no range below the ephemeral one is left."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports nobody listens on, leased to this caller (see the module's contract)."""
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count}")
    low, _ = _ephemeral_range()
    top = low - 1
    folder = _ledger_dir()
    # An unusual kernel setting leaves no room, or there is no private folder for the ledger:
    # fall back rather than fail.
    if top - LOWEST < 1000 or folder is None:
        return _kernel_ports(count)
    chosen: list[int] = []
    with _ledger(folder) as leases:
        span = top - LOWEST + 1
        start = random.randrange(span)  # different callers start at different places: fewer probes
        for step in range(span):
            if len(chosen) == count:
                break
            port = LOWEST + (start + step) % span
            if str(port) in leases or not _bindable(port):
                continue
            chosen.append(port)
        expiry = time.time() + LEASE_SECONDS
        for port in chosen:
            leases[str(port)] = expiry
    if len(chosen) < count:
        raise OSError(f"only {len(chosen)} of {count} free ports between {LOWEST} and {top}")
    return chosen


def free_port() -> int:
    """One port, as ``free_ports(1)``."""
    return free_ports(1)[0]
