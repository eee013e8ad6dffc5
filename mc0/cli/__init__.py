"""The ``mc0`` command line (click).

Contract: every command takes its endpoint and settings from options, then
``MC0_*`` environment variables, then the config file (``--config`` /
``MC0_CONFIG``), then the embedded defaults.  Any mc0 error ends the command
with one line on stderr (``mc0: error: ...``) and exit status 1; usage
errors are one such line too, with exit status 2.
"""

from __future__ import annotations

import sys

import click

from . import admin, bus, journal, keys, ops, samples  # noqa: F401  (each registers its commands on the group)
from .base import cli, hoist_global_options

__all__ = ["cli", "main"]


def main(argv: list[str] | None = None) -> None:
    """Console entry point: usage errors too are one line (``mc0: error: ...``, exit 2)."""
    try:
        args = hoist_global_options(sys.argv[1:] if argv is None else argv)
        status = cli.main(args=args, prog_name="mc0", standalone_mode=False)
    except click.UsageError as exc:  # click's own line, and where the usage is (click prints it on two more)
        where = exc.ctx.command_path if exc.ctx is not None else "mc0"
        click.echo(f"mc0: error: {exc.format_message()} (see `{where} --help`)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"mc0: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(130)
    sys.exit(status if isinstance(status, int) else 0)
