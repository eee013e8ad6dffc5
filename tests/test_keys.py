"""Key files: format, modes, sealing, and every way a key file can be wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import zmq.auth

from mc0 import keys
from mc0.errors import KeyFileError


def test_keypair_files_are_zeromq_certificates_and_the_secret_is_0600(tmp_path: Path) -> None:
    public_path, secret_path = keys.create(tmp_path, "alice")
    assert secret_path.stat().st_mode & 0o777 == 0o600
    public, secret = zmq.auth.load_certificate(secret_path)
    assert secret is not None and len(public) == len(secret) == 40
    assert zmq.auth.load_certificate(public_path) == (public, None)
    pair = keys.load_secret(secret_path)
    assert (pair.name, pair.public, pair.secret) == ("alice", public, secret)
    assert keys.load_public(public_path).public == public
    assert "secret=***" in repr(pair) and secret.decode() not in repr(pair)


def test_secret_is_never_world_readable_even_while_written(tmp_path: Path) -> None:
    old = os.umask(0)  # the most permissive umask: the file must still be 0600
    try:
        _, secret_path = keys.create(tmp_path, "umask")
    finally:
        os.umask(old)
    assert secret_path.stat().st_mode & 0o777 == 0o600


def test_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    keys.create(tmp_path, "a")
    first = keys.load_public(tmp_path / "a.key").public
    with pytest.raises(KeyFileError, match="exists; use --force"):
        keys.create(tmp_path, "a")
    keys.create(tmp_path, "a", force=True)
    assert keys.load_public(tmp_path / "a.key").public != first


def test_passphrase_round_trip_and_wrong_passphrase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, secret_path = keys.create(tmp_path, "sealed", passphrase="correct horse")
    text = secret_path.read_text()
    assert "sealed-secret-key" in text and "\n    secret-key" not in text
    assert zmq.auth.load_certificate(secret_path)[1] is None  # nothing readable without the passphrase
    pair = keys.load_secret(secret_path, passphrase="correct horse")
    assert pair.secret is not None and len(pair.secret) == 40
    with pytest.raises(KeyFileError, match="wrong passphrase"):
        keys.load_secret(secret_path, passphrase="battery staple")
    monkeypatch.delenv(keys.ENV_PASSPHRASE, raising=False)
    with pytest.raises(KeyFileError, match="sealed: give its passphrase"):
        keys.load_secret(secret_path)
    monkeypatch.setenv(keys.ENV_PASSPHRASE, "correct horse")
    assert keys.load_secret(secret_path).secret == pair.secret


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


GOOD_PUBLIC = '    public-key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"\n'


@pytest.mark.parametrize(
    ("name", "text", "mode", "loader", "message"),
    [
        ("missing.key_secret", None, 0o600, "secret", "no such key file"),
        ("garbage.key_secret", "\x00\xff binary", 0o600, "secret", "not ASCII"),
        ("syntax.key_secret", "curve\n    public-key = unquoted\n", 0o600, "secret", "line 2 is not ZeroMQ"),
        ("nopublic.key_secret", 'curve\n    secret-key = "x"\n', 0o600, "secret", "no public-key"),
        ("short.key", 'curve\n    public-key = "abc"\n', 0o644, "public", "not a 40-character Z85"),
        ("badz85.key", 'curve\n    public-key = "' + "~" * 40 + '"\n', 0o644, "public", "not valid Z85"),
        ("public.key", "curve\n" + GOOD_PUBLIC, 0o644, "secret", "is a public key file"),
        (
            "mismatch.key_secret",
            "curve\n" + GOOD_PUBLIC + '    secret-key = "' + "0" * 40 + '"\n',
            0o600,
            "secret",
            "does not belong",
        ),
        (
            "group.key_secret",
            "curve\n" + GOOD_PUBLIC + '    secret-key = "' + "0" * 40 + '"\n',
            0o640,
            "secret",
            "readable by group/others",
        ),
    ],
)
def test_bad_key_files_are_errors_naming_the_file(
    tmp_path: Path, name: str, text: str | None, mode: int, loader: str, message: str
) -> None:
    path = tmp_path / name
    if text is not None:
        write(path, text, mode)
    load = keys.load_secret if loader == "secret" else keys.load_public
    with pytest.raises(KeyFileError) as info:
        load(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_a_secret_file_is_the_wrong_kind_for_a_public_key(tmp_path: Path) -> None:
    _, secret_path = keys.create(tmp_path, "k")
    with pytest.raises(KeyFileError, match="is a secret key file"):
        keys.load_public(secret_path)


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "x" * 65, "sp ace"])
def test_bad_key_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(KeyFileError):
        keys.create(tmp_path, name)
