"""``mc0 config sample [NAME]``: the commented sample files the package ships, written out.

Contract: the samples are package data (``mc0/etc``: in a checkout a link to
``etc/``, in a wheel its copy): ``mc0.toml`` (every key with its default and
what it means), ``journal.toml`` (a broker that journals every topic),
``mc0.service`` (the systemd unit), ``grafana`` (the Grafana dashboard,
``etc/grafana/mc0.json``) and ``alerts`` (the Prometheus alert rules,
``etc/prometheus/mc0-alerts.yml``).  ``sample_text(name, data_dir)`` returns
one, a TOML sample with its ``data_dir`` set to ``data_dir`` (``""``: the
written file's own folder) instead of the checkout's ``".."``; the command
prints it, or writes it to ``--output`` (never over an existing file
without ``--force``).  Errors are one line, as for every command.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import click

from ..errors import Error
from .base import cli, one_line_errors

# Each sample's name (as the command takes it) -> its file under mc0/etc.
SAMPLE_FILES = {
    "mc0.toml": "mc0.toml",
    "journal.toml": "journal.toml",
    "mc0.service": "mc0.service",
    "grafana": "grafana/mc0.json",
    "alerts": "prometheus/mc0-alerts.yml",
}
SAMPLES = tuple(SAMPLE_FILES)
_DATA_DIR = re.compile(r'^data_dir = "\.\."$', re.MULTILINE)  # the checkout's root, in etc/*.toml


def sample_text(name: str, data_dir: str = "") -> str:
    """The sample ``name`` as a user gets it: a TOML sample's ``data_dir`` is ``data_dir``."""
    if name not in SAMPLES:
        raise Error(f"no sample {name!r}: the samples are {', '.join(SAMPLES)}")
    try:
        text = resources.files("mc0").joinpath("etc", *SAMPLE_FILES[name].split("/")).read_text(encoding="utf-8")
    except OSError as exc:  # a broken install: the package data is missing
        raise Error(f"the sample {name} is not in this installation of mc0 ({exc}): reinstall mc0") from None
    if not name.endswith(".toml"):
        return text
    text, found = _DATA_DIR.subn(f"data_dir = {json.dumps(data_dir)}", text)
    if found != 1:
        raise Error(f"the sample {name} has no data_dir line to set: reinstall mc0")
    return text


@cli.group("config")
def config_group() -> None:
    """Sample configuration files (every key, with its default and what it means)."""


@config_group.command("sample")
@click.argument("name", type=click.Choice(SAMPLES), default=SAMPLES[0])
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write it to this file (default: print it).",
)
@click.option(
    "--data-dir",
    default="",
    help='The TOML sample\'s data_dir: where keys/ and var/ live, relative to the file (default "": its folder).',
)
@click.option("--force", is_flag=True, help="Overwrite --output if it exists.")
@one_line_errors
def sample(name: str, output: str | None, data_dir: str, force: bool) -> None:
    """Print (or write) the commented sample NAME: mc0.toml (every key of the broker and its
    clients, with its default), journal.toml (a broker that journals every topic, for
    `mc0 pipeline`), mc0.service (the systemd unit, docs/DEPLOY.md), grafana (the Grafana
    dashboard, JSON to import) or alerts (the Prometheus alert rules, docs/OPERATIONS.md).

    \b
    mc0 config sample > mc0.toml                 # then: mc0 broker --config mc0.toml
    mc0 config sample journal.toml -o journal.toml
    mc0 config sample --data-dir /var/lib/mc0 -o /etc/mc0/mc0.toml
    mc0 config sample grafana -o mc0-dashboard.json
    mc0 config sample alerts -o /etc/prometheus/rules/mc0-alerts.yml"""
    text = sample_text(name, data_dir)
    if output is None:
        click.echo(text, nl=False)
        return
    target = Path(output)
    if target.exists() and not force:
        raise Error(f"{target} exists: give --force to overwrite it")
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise Error(f"cannot write {target}: {exc.strerror or exc}") from None
    click.echo(f"wrote {target} (the sample {name})", err=True)
