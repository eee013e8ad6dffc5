"""CURVE on sockets, the ZAP handler, and the broker's allowed-keys folder.

Contract:

* :class:`AllowedKeys` maps the public keys in the allowed folder (``*.key``
  files; the file's stem is the identity) to identities, and tells, on
  ``reload()``, which identities disappeared (revoked).  A bad file in the
  folder is logged and skipped on reload, but is an error on first load.
* :class:`ZapHandler` is pyzmq's :class:`zmq.auth.base.Authenticator` (the
  ZAP policy) with our key lookup and User-Id mapping.  It owns no thread:
  the broker's loop polls ``zap_socket`` and calls ``handle()``, which
  answers every request, whatever the lookup raises, so one failure never
  stops later clients.  ``start()`` must run before the server socket binds.
* :func:`configure_server` makes a socket a CURVE server on ZAP domain
  ``mc0`` with ``ZMQ_ZAP_ENFORCE_DOMAIN``: if no ZAP handler answers, nothing
  is admitted.  :func:`configure_client` sets a client's keys.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import zmq
from zmq.auth.base import Authenticator
from zmq.utils import z85

from .errors import KeyFileError
from .keys import PUBLIC_SUFFIX, KeyPair, fingerprint, load_public

log = logging.getLogger("mc0.security")

ZAP_DOMAIN = "mc0"


REVOKED_FOLDER = "revoked"  # beside the allowed folder: where `mc0 keys revoke` moves a key


class AllowedKeys:
    """The allowed folder: Z85 public key -> identity (the file's stem).

    For the log, it also knows the keys it cannot admit by the names ``mc0 keys list`` shows:
    those allowed earlier in this run or kept in the revoked folder beside it (``revoked``),
    and those of the key folder ``keys_dir`` (``not allowed``); ``refusal(key)`` says which."""

    def __init__(self, folder: str | os.PathLike[str], *, keys_dir: str | os.PathLike[str] | None = None) -> None:
        self.folder = Path(folder)
        self.keys_dir = Path(keys_dir) if keys_dir is not None else None
        self.by_key: dict[bytes, str] = {}
        self.revoked: dict[bytes, str] = {}  # key -> name: allowed before (this run, or moved to revoked/)
        self.known: dict[bytes, str] = {}  # key -> name: a public key file in keys_dir
        self._stamp: object = None

    def _listing(self) -> list[tuple[str, int, int]]:
        try:
            entries = sorted(self.folder.glob(f"*{PUBLIC_SUFFIX}"))
        except OSError:
            return []
        listing = []
        for path in entries:
            try:
                info = path.stat()
            except OSError:
                continue
            listing.append((path.name, info.st_mtime_ns, info.st_size))
        return listing

    def load(self, *, strict: bool = True) -> set[str]:
        """(Re)read the folder; returns the identities that are no longer allowed."""
        self.folder.mkdir(parents=True, exist_ok=True)
        listing = self._listing()
        by_key: dict[bytes, str] = {}
        for name, _, _ in listing:
            path = self.folder / name
            try:
                key = load_public(path)
            except KeyFileError as exc:
                if strict:
                    raise
                log.error("allowed key skipped: %s", exc)
                continue
            identity = name[: -len(PUBLIC_SUFFIX)]
            if key.public in by_key:
                log.warning("%s repeats the key of %s; keeping %s", path, by_key[key.public], by_key[key.public])
                continue
            by_key[key.public] = identity
        before = set(self.by_key.values())
        for public, identity in self.by_key.items():
            if public not in by_key:
                self.revoked[public] = identity
        self.by_key = by_key
        self._stamp = listing
        self.revoked.update(_names(self.folder.parent / REVOKED_FOLDER))
        for public in by_key:
            self.revoked.pop(public, None)  # allowed again
        self.known = _names(self.keys_dir) if self.keys_dir is not None else {}
        return before - set(by_key.values())

    def refusal(self, public_z85: bytes) -> str:
        """Why a key is refused, by the name and fingerprint ``mc0 keys list`` shows (never the key)."""
        try:
            shown = fingerprint(public_z85)
        except ValueError:
            return "refused a malformed key"
        revoked = self.revoked.get(public_z85)
        if revoked is not None:
            return f"refused a revoked key: {revoked} ({shown}); `mc0 keys allow {revoked}` admits it again"
        name = self.known.get(public_z85)
        if name is not None:
            return f"refused a key that is not allowed: {name} ({shown}); `mc0 keys allow {name}` admits it"
        unnamed = "no key file of it here; `mc0 keys list` shows fingerprints"
        return f"refused a key that is not allowed: {shown} ({unnamed})"

    def changed(self) -> bool:
        """Whether the folder's listing (names, sizes, mtimes) moved since the last load."""
        return self._listing() != self._stamp

    def identity(self, public_z85: bytes) -> str | None:
        return self.by_key.get(public_z85)

    @property
    def identities(self) -> set[str]:
        return set(self.by_key.values())


def _names(folder: Path) -> dict[bytes, str]:
    """Public key -> name for the ``*.key`` files of ``folder`` (unreadable ones and a missing folder: none)."""
    try:
        paths = sorted(folder.glob(f"*{PUBLIC_SUFFIX}"))
    except OSError:
        return {}
    names: dict[bytes, str] = {}
    for path in paths:
        try:
            names.setdefault(load_public(path).public, path.name[: -len(PUBLIC_SUFFIX)])
        except (KeyFileError, OSError):
            continue
    return names


def _run_sync(coro: Coroutine[Any, Any, None]) -> None:
    """Drive a coroutine that never suspends (our lookup is synchronous)."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise RuntimeError("the ZAP handler suspended; it must not await")


class ZapHandler(Authenticator):
    """ZAP for the broker: only keys in the allowed folder, identity = key name."""

    def __init__(self, context: zmq.Context[Any], allowed: AllowedKeys) -> None:
        super().__init__(context, log=logging.getLogger("mc0.zap"))
        self.allowed = allowed
        self.admitted = 0
        self.refused = 0
        self.failures = 0
        self.configure_curve_callback(ZAP_DOMAIN, self)

    # The credentials provider protocol of Authenticator.configure_curve_callback.
    def callback(self, domain: str, key: bytes) -> bool:
        try:
            known = self.allowed.identity(key) is not None
        except Exception:  # a broken lookup refuses this key and nothing else
            self.failures += 1
            log.exception("key lookup failed; refusing the key")
            return False
        if known:
            self.admitted += 1
        else:
            self.refused += 1
            # WARNING: an operator wants to see who knocks with a key that is not allowed (by the name and
            # fingerprint `mc0 keys list` shows; revoked or never allowed).
            log.warning("%s", self.allowed.refusal(key))
        return known

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self.allowed.identity(z85.encode(client_public_key)) or ""

    def handle(self) -> None:
        """Answer one pending ZAP request; never raises."""
        socket = self.zap_socket
        if socket is None:
            return
        try:
            message = socket.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            _run_sync(self.handle_zap_message(message))
        except Exception:
            self.failures += 1
            log.exception("ZAP request failed; refusing it")
            try:
                self._send_zap_reply(message[1] if len(message) > 1 else b"", b"500", b"Internal error")
            except zmq.ZMQError:
                # The REP socket is out of step: start a fresh one (still before any new handshake).
                self.stop()
                self.start()


def configure_server(socket: zmq.Socket[Any], keys: KeyPair) -> None:
    assert keys.secret is not None
    socket.setsockopt(zmq.CURVE_SERVER, 1)
    socket.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    socket.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    socket.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
    socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no ZAP handler answering -> nobody admitted


def configure_client(socket: zmq.Socket[Any], keys: KeyPair, broker_public: bytes) -> None:
    assert keys.secret is not None
    socket.setsockopt(zmq.CURVE_SERVERKEY, broker_public)
    socket.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    socket.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)


HANDSHAKE_FAILURES: dict[int, str] = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: (
        "the broker refused this key: not allowed, or revoked (`mc0 keys allow NAME` on the broker admits it)"
    ),
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "CURVE handshake failed (wrong broker key, or a broker without CURVE?)",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "CURVE handshake failed (wrong broker key, or a broker without CURVE?)",
}
NO_KEY_FAILURE = (
    "handshake failed: the broker requires CURVE (give --key and --broker-key, or MC0_KEY and MC0_BROKER_KEY)"
)
