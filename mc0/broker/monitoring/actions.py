"""The admin actions on the monitoring listener: ``POST /admin/OP`` with a bearer token, done by the loop.

Contract: ``read_token(path)`` reads ``[http] admin_token_file`` (ConfigError naming that key when
the file cannot be read, is not a regular file, is readable or writable by group or others, or does
not hold one token of at least ``MIN_TOKEN_CHARS`` visible ASCII characters); the token itself is
never logged nor put in an error.  ``respond(door, ...)`` is a POST's whole answer, decided in this
order: no token file (``door`` None): 403; an ``Origin`` header that is not the listener's own: 403;
a missing or wrong ``Authorization: Bearer TOKEN`` (compared in constant time): 401; an unknown OP:
404; a ``Content-Type`` that is not ``application/json``: 415; a body that is not a JSON object of
at most ``MAX_BODY_BYTES`` (a ``Content-Length`` of ASCII digits): 400; else the action, handed to
the broker loop through the door and answered with its status and JSON.

:class:`AdminDoor` is where the HTTP threads and the loop meet: ``submit`` (an HTTP thread) queues
an action and wakes the loop, then waits at most ``ACTION_WAIT_S`` for its answer (504 after);
the loop reads ``waiting`` (one attribute) each turn, ``take``s the queue, hands each action to the
core (``mc0.broker.core.admin.http_call``) and gives each answer to ``answer``.  At most
``MAX_IN_FLIGHT`` actions wait at once (429 beyond).  The core logs each action, naming who asked:
``http token from HOST:PORT``.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

from ...errors import ConfigError
from ...protocol.admin import ACTIONS

log = logging.getLogger("mc0.broker.http")

WHERE = "http.admin_token_file"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_FILE_BYTES = 4096
MAX_BODY_BYTES = 64 * 1024
ACTION_WAIT_S = 30.0  # an action waits this long for the loop's answer (the core answers within ~10 s)
MAX_IN_FLIGHT = 32
PREFIX = "/admin/"
JSON_TYPE = "application/json"
Action = tuple[int, str, dict[str, Any], str]  # (ticket, op, arguments, who asked)


def read_token(path: str) -> str:
    """The token in ``path`` (see the module's contract for what is refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ConfigError(WHERE, f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(WHERE, f"{path} is not a regular file")
        if info.st_mode & 0o077:
            mode = f"{info.st_mode & 0o777:o}"
            raise ConfigError(WHERE, f"{path} is readable or writable by group/others (mode {mode}): chmod 600 it")
        data = os.read(fd, MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(WHERE, f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    token = data.decode("ascii", "replace").strip()
    if len(data) > MAX_TOKEN_FILE_BYTES or len(token) < MIN_TOKEN_CHARS or not all(33 <= ord(c) < 127 for c in token):
        example = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        raise ConfigError(
            WHERE, f"{path} must hold one token of at least {MIN_TOKEN_CHARS} visible ASCII characters (e.g. {example})"
        )
    return token


def is_json(content_type: str | None) -> bool:
    """``Content-Type`` names JSON: ``application/json``, any case, parameters (``; charset=utf-8``) allowed."""
    media = (content_type or "").partition(";")[0].strip().lower()
    return media == JSON_TYPE


def own_origins(host: str, port: int, host_header: str | None) -> set[str]:
    """The origins a page of this listener has: its address (and the loopback names for it when it
    is on loopback); a listener on every interface (0.0.0.0, ::) is reached under the name the
    request gives in ``Host``."""
    shown = f"[{host}]" if ":" in host else host
    origins = {f"http://{shown}:{port}"}
    if host in ("127.0.0.1", "::1", "localhost"):
        origins |= {f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}"}
    if host in ("0.0.0.0", "::", "") and host_header:
        origins.add(f"http://{host_header.strip()}")
    return origins


class AdminDoor:
    def __init__(self, token: str, *, wake: Callable[[], None]) -> None:
        self._token = token.encode()
        self._wake = wake
        self._lock = threading.Condition()
        self._queue: list[Action] = []
        self._answers: dict[int, tuple[int, dict[str, Any]]] = {}
        self._open: set[int] = set()  # tickets submitted and not yet answered or given up
        self._ticket = 0
        self.waiting = False  # actions are queued for the loop (read by the loop each turn)

    def __repr__(self) -> str:  # (never the token)
        return "<AdminDoor>"

    def authorized(self, header: str | None) -> bool:
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token)

    # ------------------------------------------------------------ HTTP side
    def submit(self, op: str, args: dict[str, Any], who: str) -> tuple[int, dict[str, Any]]:
        """Hand an action to the loop; its (status, body) when answered, 504 after ``ACTION_WAIT_S``."""
        with self._lock:
            if len(self._open) >= MAX_IN_FLIGHT:
                return 429, {"error": f"{MAX_IN_FLIGHT} actions are under way: try again shortly"}
            self._ticket += 1
            ticket = self._ticket
            self._open.add(ticket)
            self._queue.append((ticket, op, args, who))
            self.waiting = True
        self._wake()
        deadline = time.monotonic() + ACTION_WAIT_S
        with self._lock:
            try:
                while ticket not in self._answers:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return 504, {"error": f"the broker did not answer within {ACTION_WAIT_S:g} s"}
                    self._lock.wait(left)
                return self._answers.pop(ticket)
            finally:
                self._open.discard(ticket)
                self._answers.pop(ticket, None)

    # ------------------------------------------------------------ loop side
    def take(self) -> list[Action]:
        with self._lock:
            taken, self._queue = self._queue, []
            self.waiting = False
        return taken

    def answer(self, ticket: int, status: int, body: dict[str, Any]) -> None:
        with self._lock:
            if ticket in self._open:  # (else its request gave up waiting)
                self._answers[ticket] = (status, body)
                self._lock.notify_all()


def respond(
    door: AdminDoor | None,
    path: str,
    header: Callable[[str], str | None],
    read_body: Callable[[int], bytes],
    client: tuple[str, int],
    origins: set[str],
) -> tuple[int, dict[str, Any]]:
    """One POST's (status, JSON body) (``header``: a request header by name, None when absent); see
    the module's contract for the order of the checks."""
    if door is None:
        return 403, {"error": "admin actions are off: [http] admin_token_file names no token"}
    origin = header("Origin")
    if origin is not None and origin not in origins:
        log.info("admin: POST %s refused: Origin %r is not this listener's", path[:80], origin[:80])
        return 403, {"error": "cross-origin request refused: Origin is not this listener's"}
    if not door.authorized(header("Authorization")):
        log.info("admin: POST %s from %s:%d refused: missing or wrong token", path[:80], *client)
        return 401, {"error": "missing or wrong token (Authorization: Bearer TOKEN)"}
    op = path[len(PREFIX) :] if path.startswith(PREFIX) else ""
    if op not in ACTIONS:
        return 404, {"error": f"actions: {', '.join(PREFIX + a for a in ACTIONS)}"}
    if not is_json(header("Content-Type")):  # (a form a foreign page may post without asking first is not JSON)
        return 415, {"error": f"the body must be sent as {JSON_TYPE} (Content-Type: {JSON_TYPE})"}
    given = (header("Content-Length") or "0").strip()
    length = int(given) if given.isascii() and given.isdigit() and len(given) <= 12 else -1  # ('+5', '1_0': no)
    if not 0 <= length <= MAX_BODY_BYTES:
        return 400, {"error": f"the body must be a JSON object of at most {MAX_BODY_BYTES} bytes"}
    try:
        args = json.loads(read_body(length) or b"{}")
    except (ValueError, RecursionError):
        args = None
    if not isinstance(args, dict):
        return 400, {"error": f"the body must be a JSON object of {op}'s arguments"}
    status, body = door.submit(op, args, f"http token from {client[0]}:{client[1]}")
    log.info("admin: POST %s from %s:%d: %d", path, client[0], client[1], status)
    return status, body
