"""Curve25519 keypairs in ZeroMQ's certificate format.

Contract:

* ``create(directory, name)`` writes ``NAME.key`` (public, 0644) and
  ``NAME.key_secret`` (0600 from the moment it exists: created with
  ``O_EXCL`` and mode 0600, then renamed into place), refusing to overwrite
  without ``force``.  Keys come from PyNaCl (libsodium).  Both files are what
  ``zmq.auth.load_certificate`` reads.
* With a passphrase the secret is sealed: Argon2id derives a key, SecretBox
  encrypts the Z85 secret, and the file holds ``sealed-secret-key`` instead of
  ``secret-key`` (so ``load_certificate`` sees a public-only certificate).
* ``load_public`` / ``load_secret`` return a :class:`KeyPair` or raise
  :class:`mc0.errors.KeyFileError` naming the file: missing, malformed, the
  wrong kind, a secret readable by group or others, a sealed secret without
  (or with the wrong) passphrase.  Never a silent fallback.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from nacl import exceptions, pwhash, utils
from nacl import secret as box
from nacl.public import PrivateKey
from zmq.utils import z85

from .errors import KeyFileError

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
ENV_PASSPHRASE = "MC0_PASSPHRASE"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_LINE = re.compile(r'^(?P<indent>\s*)(?P<key>[A-Za-z0-9_-]+)\s*(?:=\s*"(?P<value>[^"]*)")?\s*$')
Z85_KEY_LENGTH = 40


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A named key: Z85 public key, and the Z85 secret when loaded from a secret file."""

    name: str
    public: bytes
    secret: bytes | None = None

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public)

    def __repr__(self) -> str:  # never show the secret
        return f"KeyPair(name={self.name!r}, public={self.public.decode()!r}, secret={'***' if self.secret else None})"


def fingerprint(public_z85: bytes) -> str:
    return "SHA256:" + hashlib.sha256(z85.decode(public_z85)).hexdigest()[:16]


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise KeyFileError(name, "a key name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return name


def generate() -> tuple[bytes, bytes]:
    """A fresh (public, secret) pair, Z85-encoded."""
    private = PrivateKey.generate()
    return z85.encode(bytes(private.public_key)), z85.encode(bytes(private))


def _render(name: str, public: bytes, secret_line: str | None) -> str:
    kind = "Secret" if secret_line else "Public"
    lines = [
        f"#   ****  Generated on {time.strftime('%Y-%m-%d %H:%M:%S')} by mc0  ****",
        f"#   ZeroMQ CURVE **{kind}** Certificate",
    ]
    if secret_line:
        lines.append("#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.")
    lines += ["", "metadata", f'    name = "{name}"', "curve", f'    public-key = "{public.decode()}"']
    if secret_line:
        lines.append(secret_line)
    return "\n".join(lines) + "\n"


def _box(passphrase: str, salt: bytes) -> box.SecretBox:
    """The SecretBox for a passphrase: Argon2id, interactive limits (~0.1 s, 64 MiB)."""
    key = pwhash.argon2id.kdf(
        box.SecretBox.KEY_SIZE,
        passphrase.encode(),
        salt,
        opslimit=pwhash.argon2id.OPSLIMIT_INTERACTIVE,
        memlimit=pwhash.argon2id.MEMLIMIT_INTERACTIVE,
    )
    return box.SecretBox(key)


def _seal(secret: bytes, passphrase: str) -> str:
    salt = utils.random(pwhash.argon2id.SALTBYTES)
    sealed = _box(passphrase, salt).encrypt(secret)
    return base64.b64encode(salt + bytes(sealed)).decode()


def _unseal(path: Path, sealed_b64: str, passphrase: str) -> bytes:
    try:
        raw = base64.b64decode(sealed_b64, validate=True)
    except ValueError:
        raise KeyFileError(str(path), "sealed-secret-key is not base64") from None
    salt, sealed = raw[: pwhash.argon2id.SALTBYTES], raw[pwhash.argon2id.SALTBYTES :]
    try:
        return bytes(_box(passphrase, salt).decrypt(sealed))
    except exceptions.CryptoError:
        raise KeyFileError(str(path), "wrong passphrase") from None


def _write_private(path: Path, text: str, force: bool) -> None:
    """Write a file that is 0600 from its first byte, then move it into place."""
    if path.exists() and not force:
        raise KeyFileError(str(path), "exists; use --force to overwrite")
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def create(
    directory: str | os.PathLike[str], name: str, *, passphrase: str | None = None, force: bool = False
) -> tuple[Path, Path]:
    """Write NAME.key and NAME.key_secret in ``directory``; returns their paths."""
    check_name(name)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    public_path = folder / f"{name}{PUBLIC_SUFFIX}"
    secret_path = folder / f"{name}{SECRET_SUFFIX}"
    if not force:
        for existing in (public_path, secret_path):
            if existing.exists():
                raise KeyFileError(str(existing), "exists; use --force to overwrite")
    public, secret = generate()
    if passphrase:
        secret_line = f'    sealed-secret-key = "{_seal(secret, passphrase)}"\n    kdf = "argon2id"'
    else:
        secret_line = f'    secret-key = "{secret.decode()}"'
    _write_private(secret_path, _render(name, public, secret_line), force)
    public_path.write_text(_render(name, public, None), encoding="ascii")
    return public_path, secret_path


def _parse(path: Path) -> dict[str, str]:
    """The ``key = "value"`` entries of a certificate file (ZPL subset), by key."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise KeyFileError(str(path), "no such key file") from None
    except IsADirectoryError:
        raise KeyFileError(str(path), "is a directory, not a key file") from None
    except OSError as exc:
        raise KeyFileError(str(path), f"cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise KeyFileError(str(path), "not a ZeroMQ certificate (not ASCII text)") from None
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise KeyFileError(str(path), f"line {number} is not ZeroMQ certificate syntax")
        if match["value"] is not None:
            values[match["key"]] = match["value"]
    return values


def _check_key(path: Path, value: str | None, what: str) -> bytes:
    if value is None:
        raise KeyFileError(str(path), f"no {what} in this file")
    if len(value) != Z85_KEY_LENGTH:
        raise KeyFileError(str(path), f"{what} is not a 40-character Z85 key")
    try:
        z85.decode(value.encode())
    except (ValueError, KeyError):
        raise KeyFileError(str(path), f"{what} is not valid Z85") from None
    return value.encode()


def _name_of(path: Path, values: dict[str, str]) -> str:
    name = values.get("name") or path.name.split(".key")[0]
    return name


def load_public(path: str | os.PathLike[str]) -> KeyPair:
    """A public key file (NAME.key); a secret file is refused as the wrong kind."""
    path = Path(path)
    values = _parse(path)
    if "secret-key" in values or "sealed-secret-key" in values:
        raise KeyFileError(str(path), "is a secret key file; give the public NAME.key")
    return KeyPair(_name_of(path, values), _check_key(path, values.get("public-key"), "public-key"))


def load_secret(path: str | os.PathLike[str], *, passphrase: str | None = None) -> KeyPair:
    """A secret key file (NAME.key_secret), unsealed with the passphrase if sealed."""
    path = Path(path)
    values = _parse(path)
    public = _check_key(path, values.get("public-key"), "public-key")
    if "sealed-secret-key" not in values and "secret-key" not in values:
        raise KeyFileError(str(path), "is a public key file; give the secret NAME.key_secret")
    mode = path.stat().st_mode
    if mode & 0o077:
        raise KeyFileError(str(path), f"secret key is readable by group/others (mode {mode & 0o777:o}); chmod 600 it")
    if "sealed-secret-key" in values:
        passphrase = passphrase if passphrase is not None else os.environ.get(ENV_PASSPHRASE)
        if not passphrase:
            raise KeyFileError(str(path), f"secret key is sealed: give its passphrase (or set {ENV_PASSPHRASE})")
        secret = _check_key(path, _unseal(path, values["sealed-secret-key"], passphrase).decode(), "secret-key")
    else:
        secret = _check_key(path, values["secret-key"], "secret-key")
    if z85.encode(bytes(PrivateKey(z85.decode(secret)).public_key)) != public:
        raise KeyFileError(str(path), "secret-key does not belong to public-key")
    return KeyPair(_name_of(path, values), public, secret)


def resolve(spec: str | os.PathLike[str], directory: str | os.PathLike[str], suffix: str) -> Path:
    """A key given as a path, or as a NAME found in ``directory`` with ``suffix``."""
    path = Path(spec)
    if path.exists() or os.sep in str(spec) or str(spec).endswith((PUBLIC_SUFFIX, SECRET_SUFFIX)):
        return path
    return Path(directory) / f"{spec}{suffix}"
