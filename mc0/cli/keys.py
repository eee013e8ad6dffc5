"""``mc0 keys``: create, list, show, allow and revoke CURVE keys."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from .. import keys as keyfiles
from ..errors import Error
from .base import cli, config_option, load_config, one_line_errors


@cli.group()
def keys() -> None:
    """Create, list, allow and revoke CURVE keys."""


dir_option = click.option("--dir", "keys_dir", default=None, help="Key folder (default: [security] keys_dir, 'keys').")
allowed_option = click.option(
    "--allowed", "allowed_dir", default=None, help="The broker's allowed folder (default: [security] allowed_dir)."
)


def _folders(config_path: str | None, keys_dir: str | None, allowed_dir: str | None) -> tuple[Path, Path, Path]:
    security = load_config(config_path).security
    allowed = Path(allowed_dir or security.allowed_dir)
    return Path(keys_dir or security.keys_dir), allowed, allowed.parent / "revoked"


@keys.command("new")
@click.argument("name")
@dir_option
@click.option("--passphrase", is_flag=True, help="Seal the secret key (prompts, or uses MC0_PASSPHRASE).")
@click.option("--force", is_flag=True, help="Overwrite an existing keypair.")
@config_option
@one_line_errors
def keys_new(name: str, keys_dir: str | None, passphrase: bool, force: bool, config_path: str | None) -> None:
    """Create NAME.key and NAME.key_secret (mode 0600)."""
    folder, _, _ = _folders(config_path, keys_dir, None)
    secret: str | None = None
    if passphrase:
        secret = os.environ.get(keyfiles.ENV_PASSPHRASE) or click.prompt(
            "passphrase", hide_input=True, confirmation_prompt=True
        )
    public_path, secret_path = keyfiles.create(folder, name, passphrase=secret, force=force)
    pair = keyfiles.load_public(public_path)
    click.echo(f"{public_path}  {pair.fingerprint}")
    click.echo(f"{secret_path}  (secret, mode 0600{', sealed' if secret else ''}; never share or commit it)")


@keys.command("list")
@dir_option
@allowed_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per key.")
@config_option
@one_line_errors
def keys_list(keys_dir: str | None, allowed_dir: str | None, as_json: bool, config_path: str | None) -> None:
    """List keys with fingerprint and whether the broker allows them."""
    from rich.console import Console
    from rich.table import Table

    folder, allowed, revoked = _folders(config_path, keys_dir, allowed_dir)
    rows: dict[str, dict[str, str]] = {}
    for where, status in ((folder, "-"), (revoked, "revoked"), (allowed, "allowed")):
        for path in sorted(where.glob(f"*{keyfiles.PUBLIC_SUFFIX}")) if where.is_dir() else []:
            name = path.name[: -len(keyfiles.PUBLIC_SUFFIX)]
            try:
                fingerprint = keyfiles.load_public(path).fingerprint
            except Error as exc:
                fingerprint = f"unreadable: {exc}"
            row = rows.setdefault(name, {"fingerprint": fingerprint, "status": "-", "secret": "no"})
            if status != "-":
                row["status"] = status
            if where == folder and (folder / f"{name}{keyfiles.SECRET_SUFFIX}").exists():
                row["secret"] = "yes"
    if as_json:
        for name, row in sorted(rows.items()):
            record = {"name": name, **row, "secret": row["secret"] == "yes", "keys_dir": str(folder)}
            click.echo(json.dumps(record))
        return
    table = Table(title=f"keys in {folder} (allowed: {allowed})")
    for column in ("name", "fingerprint", "status", "secret here"):
        table.add_column(column)
    for name, row in sorted(rows.items()):
        table.add_row(name, row["fingerprint"], row["status"], row["secret"])
    Console().print(table)


@keys.command("show")
@click.argument("name")
@dir_option
@config_option
@one_line_errors
def keys_show(name: str, keys_dir: str | None, config_path: str | None) -> None:
    """Print NAME's public key (Z85)."""
    folder, _, _ = _folders(config_path, keys_dir, None)
    click.echo(keyfiles.load_public(keyfiles.resolve(name, folder, keyfiles.PUBLIC_SUFFIX)).public.decode())


@keys.command("allow")
@click.argument("key")
@dir_option
@allowed_option
@config_option
@one_line_errors
def keys_allow(key: str, keys_dir: str | None, allowed_dir: str | None, config_path: str | None) -> None:
    """Admit KEY (a NAME.key file, or NAME in the key folder) to the broker."""
    folder, allowed, revoked = _folders(config_path, keys_dir, allowed_dir)
    source = keyfiles.resolve(key, folder, keyfiles.PUBLIC_SUFFIX)
    pair = keyfiles.load_public(source)  # refuses secrets and malformed files
    name = keyfiles.check_name(source.name.split(keyfiles.PUBLIC_SUFFIX)[0])
    allowed.mkdir(parents=True, exist_ok=True)
    target = allowed / f"{name}{keyfiles.PUBLIC_SUFFIX}"
    staging = allowed / f".{name}.tmp"
    staging.write_bytes(source.read_bytes())
    staging.replace(target)  # atomic: the broker never reads half a file
    (revoked / target.name).unlink(missing_ok=True)
    click.echo(f"allowed {name} ({pair.fingerprint}) in {allowed}")


@keys.command("revoke")
@click.argument("name")
@allowed_option
@config_option
@one_line_errors
def keys_revoke(name: str, allowed_dir: str | None, config_path: str | None) -> None:
    """Withdraw NAME: a running broker cuts it off within a second."""
    _, allowed, revoked = _folders(config_path, None, allowed_dir)
    source = allowed / f"{keyfiles.check_name(name)}{keyfiles.PUBLIC_SUFFIX}"
    if not source.exists():
        raise Error(f"{source}: {name} is not allowed")
    revoked.mkdir(parents=True, exist_ok=True)
    source.replace(revoked / source.name)
    click.echo(f"revoked {name} (moved to {revoked})")
