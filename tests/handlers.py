"""Handlers run by worker processes in the tests (``mc0 serve tests.handlers:NAME``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from mc0 import Request


def mark(request: Request) -> None:
    """Say the request arrived: this process's pid in the file the body names, whole or not at all
    (written aside, then renamed: a test that sees the file never reads it half written)."""
    path = Path(request.body.decode())
    aside = path.with_name(path.name + ".part")
    aside.write_text(str(os.getpid()))
    aside.replace(path)


def hold(request: Request) -> bytes:
    """Mark that the request arrived (file named by the body), then hang until killed."""
    mark(request)
    time.sleep(3600)
    return b"never"


def partial_then_hold(request: Request) -> Iterator[bytes]:
    yield b"first half"
    mark(request)
    time.sleep(3600)


def answer(request: Request) -> bytes:
    return f"answered by {os.getpid()}".encode()


def whoami(request: Request) -> bytes:
    return str(os.getpid()).encode()
