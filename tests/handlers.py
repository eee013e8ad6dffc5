"""Handlers run by worker processes in the tests (``mc0 serve tests.handlers:NAME``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from mc0 import Request


def hold(request: Request) -> bytes:
    """Mark that the request arrived (file named by the body), then hang until killed."""
    Path(request.body.decode()).write_text(str(os.getpid()))
    time.sleep(3600)
    return b"never"


def partial_then_hold(request: Request) -> Iterator[bytes]:
    yield b"first half"
    Path(request.body.decode()).write_text(str(os.getpid()))
    time.sleep(3600)


def answer(request: Request) -> bytes:
    return f"answered by {os.getpid()}".encode()


def whoami(request: Request) -> bytes:
    return str(os.getpid()).encode()
