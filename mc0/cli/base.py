"""What every ``mc0`` command shares: the click group, one-line errors, connection options.

Contract: options > ``MC0_*`` environment > the config file (``--config`` /
``MC0_CONFIG``) > embedded defaults.  Any mc0 error ends a command with one
line on stderr (``mc0: error: ...``) and exit status 1.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import wraps
from typing import Any, ParamSpec, TypeVar

import click

from .. import config as cfg
from ..client import Client
from ..errors import Error, Forbidden, NoResponders

P = ParamSpec("P")
R = TypeVar("R")


def what_to_do(error: Error) -> str:
    """The remedy a broker's refusal does not say itself (it speaks for the wire, not the CLI)."""
    if isinstance(error, Forbidden) and " may not " in error.reason:
        identity = error.reason.split(" may not ", 1)[0]
        return f" (a grant in the broker's [permissions.identity.{identity}] allows it: docs/SECURITY.md)"
    if isinstance(error, NoResponders):
        return " (start one: mc0 serve MODULE:FUNCTION --service NAME)"
    return ""


def one_line_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Every command's wrapper: an mc0 ``Error`` becomes one line on stderr (with what to do) and
    exit status 1, Ctrl-C exit status 130, never a traceback."""

    @wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except Error as exc:
            click.echo(f"mc0: error: {exc}{what_to_do(exc)}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            sys.exit(130)

    return wrapper


def load_config(path: str | None) -> cfg.Config:
    """The config a command runs with: ``--config PATH``, else the default search (mc0.config)."""
    return cfg.load_default(path)


config_option = click.option(
    "--config",
    "config_path",
    envvar=cfg.ENV_CONFIG,
    type=click.Path(dir_okay=False),
    help="TOML config file (default: $MC0_CONFIG, else the embedded defaults).",
)
endpoint_option = click.option(
    "--endpoint",
    envvar=cfg.ENV_ENDPOINT,
    help="Broker endpoint, or a comma-separated list to fail over between "
    "(default: $MC0_ENDPOINT, config, tcp://127.0.0.1:61616).",
)
timeout_option = click.option(
    "--timeout",
    type=float,
    default=None,
    help="Seconds to wait for each answer from the broker (default 5: [client] timeout_ms). "
    "A refused or unresolvable endpoint is reported within about a second.",
)


def set_option_help(command: click.Command, name: str, text: str) -> None:
    """Give one command its own help for a shared option (e.g. --timeout of ``call``)."""
    for param in command.params:
        if isinstance(param, click.Option) and param.name == name:
            param.help = text


def key_options(func: Callable[P, R]) -> Callable[P, R]:
    """--key / --broker-key (env MC0_KEY / MC0_BROKER_KEY, then the config's [client])."""
    func = click.option(
        "--broker-key",
        envvar=cfg.ENV_BROKER_KEY,
        type=click.Path(dir_okay=False),
        help="The broker's public key file (NAME.key).",
    )(func)
    return click.option(
        "--key", envvar=cfg.ENV_KEY, type=click.Path(dir_okay=False), help="This client's secret key (NAME.key_secret)."
    )(func)


@dataclass(frozen=True)
class Connection:
    """Where and how a client command reaches the broker (options > MC0_* > config > defaults)."""

    endpoint: str | None
    config_path: str | None
    timeout: float | None
    key: str | None
    broker_key: str | None

    def config(self) -> cfg.Config:
        return load_config(self.config_path)

    def client(self) -> Client:
        return Client(
            self.endpoint, timeout=self.timeout, config=self.config().client, key=self.key, broker_key=self.broker_key
        )


def connection_options(func: Callable[..., R]) -> Callable[..., R]:
    """--endpoint, --config, --timeout, --key, --broker-key, handed to the command as ``conn``."""

    @wraps(func)
    def wrapper(
        *args: Any,
        endpoint: str | None,
        config_path: str | None,
        timeout: float | None,
        key: str | None,
        broker_key: str | None,
        **kwargs: Any,
    ) -> R:
        return func(*args, conn=Connection(endpoint, config_path, timeout, key, broker_key), **kwargs)

    return endpoint_option(config_option(timeout_option(key_options(wrapper))))


LOG_FORMATS = ("text", "json")
_VERBOSE = re.compile(r"^-v+$")


def hoist_global_options(args: list[str]) -> list[str]:
    """``-v``/``-vv``/``--verbose`` and ``--log-format F`` may stand anywhere (``mc0 sub t -v``):
    they are moved before the subcommand, where the group reads them.  Nothing after ``--`` moves."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        if _VERBOSE.match(arg) or arg == "--verbose" or arg.startswith("--log-format="):
            front.append(arg)
        elif arg == "--log-format" and i + 1 < len(args):
            front += args[i : i + 2]
            i += 1
        else:
            rest.append(arg)
        i += 1
    return front + rest


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601), level, logger, msg (and exc when any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def setup_logging(verbose: int, log_format: str) -> None:
    """WARNING by default, -v INFO, -vv DEBUG; text or JSON lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING - 10 * min(verbose, 2))


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug); accepted anywhere.")
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    help="Log lines as text or as JSON objects (one per line); accepted anywhere.",
)
@click.option(
    "--version",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=lambda ctx, _, value: show_version(ctx) if value else None,
    help="Show the version and the build (compiled or pure Python), and exit.",
)
def cli(verbose: int, log_format: str) -> None:
    """mc0: a secure pub/sub + RPC message bus over ZeroMQ."""
    setup_logging(verbose, log_format)


def show_version(ctx: click.Context) -> None:
    """``mc0 0.1.0 (compiled: 19 of 19 hot modules, mypyc)``: the package's version and the build that runs."""
    from importlib.metadata import PackageNotFoundError, version

    from .. import native

    try:
        number = version("mc0")
    except PackageNotFoundError:  # the sources alone on the path (PYTHONPATH=a checkout)
        number = "(not installed)"
    click.echo(f"mc0 {number} ({native.describe()})")
    ctx.exit()


def parse_headers(pairs: tuple[str, ...]) -> dict[str, str]:
    """``--header KEY=VALUE`` options as a dict (a pair without ``=`` is a usage error)."""
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--header")
        headers[key] = value
    return headers
