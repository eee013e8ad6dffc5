"""``mc0 journal ...``: journals handled outside a broker (``copy``: a file journal into JetStream);
``get`` and ``purge``, on a running broker, are :mod:`.admin`'s.

Contract: one-line errors as every command; ``copy`` reads the file journal in
``--from`` and publishes it into the JetStream stream of ``[journals.NAME]``
of ``--config`` (see :mod:`mc0.broker.jetstream.journalcopy`), printing one line of
progress per 10,000 records and a summary.
"""

from __future__ import annotations

import click

from .. import config as cfg
from .base import cli, config_option, one_line_errors


@cli.group()
def journal() -> None:
    """Journals: one record by its seq, a purge (on a running broker); a copy into JetStream (outside one)."""


@journal.command("copy")
@click.argument("name")
@click.option(
    "--from",
    "folder",
    required=True,
    type=click.Path(file_okay=False, exists=True),
    help="The file journal's folder (its broker stopped).",
)
@config_option
@one_line_errors
def copy(name: str, folder: str, config_path: str | None) -> None:
    """Copy the file journal in --from into journal NAME of --config (store = "jetstream"), seqs kept."""
    from ..broker.jetstream.journalcopy import copy_journal, summary

    config = cfg.load_default(config_path)

    def progress(count: int) -> None:
        if count % 10_000 < 256:
            click.echo(f"journal copy: {count} records", err=True)

    done = copy_journal(config, name, folder, progress=progress)
    click.echo(summary(done, folder, name))
