"""Configuration: TOML (stdlib ``tomllib``) -> the frozen dataclasses of :mod:`mc0.settings`.

Contract: ``load(path)`` returns a :class:`Config` or raises
:class:`mc0.errors.ConfigError` naming the file and the dotted key (unknown
keys, wrong types and out-of-range values are all errors).  ``Config()`` is the
embedded defaults.  Field bounds live in each field's ``metadata["min"]``.
``load`` resolves the file's relative paths against the file's folder (or
its ``data_dir``), so a broker finds its keys and journals wherever it is
started from; ``parse`` (text, no file) leaves them relative.
The settings classes are re-exported here for existing imports.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import reprlib
import tomllib
import typing
from pathlib import Path
from typing import Any, TypeVar

from .endpoints import parse_endpoints
from .errors import ConfigError
from .permissions import Permissions
from .protocol import ANONYMOUS, SYS_MAILBOX_PATTERN, routes
from .settings import (
    DEFAULT_ENDPOINT,
    ENV_BROKER_KEY,
    ENV_CLUSTER,
    ENV_CONFIG,
    ENV_ENDPOINT,
    ENV_KEY,
    MAX_REPLICAS,
    BrokerConfig,
    ClientConfig,
    Config,
    CoreSettings,
    JournalSettings,
    SecurityConfig,
)
from .topics import split_pattern

__all__ = [
    "DEFAULT_ENDPOINT",
    "ENV_BROKER_KEY",
    "ENV_CLUSTER",
    "ENV_CONFIG",
    "ENV_ENDPOINT",
    "ENV_KEY",
    "BrokerConfig",
    "ClientConfig",
    "Config",
    "CoreSettings",
    "JournalSettings",
    "SecurityConfig",
    "check_stores",
    "load",
    "load_default",
    "parse",
    "resolve_paths",
]

C = TypeVar("C")
log = logging.getLogger("mc0.config")

_SHOWN = reprlib.Repr()  # a value quoted in an error: bounded in length and depth, whatever it is
_SHOWN.maxstring = _SHOWN.maxother = 60
_SHOWN.maxlevel = 3


def _shown(value: object) -> str:
    return _SHOWN.repr(value)


def _no_nul(path: str, value: str) -> str:
    if "\x00" in value:
        raise ConfigError(path, "must not contain a NUL character")
    return value


def _build(cls: type[C], table: dict[str, Any], where: str) -> C:
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for key, raw in table.items():
        path = f"{where}.{key}" if where else key
        if key not in known:
            raise ConfigError(path, f"unknown key (known: {', '.join(sorted(known))})")
        kind = hints[key]
        if kind is Permissions:
            if not isinstance(raw, dict):
                raise ConfigError(path, "must be a table")
            values[key] = Permissions.from_table(raw, path)
        elif kind is bool:
            if not isinstance(raw, bool):
                raise ConfigError(path, f"must be true or false, got {_shown(raw)}")
            values[key] = raw
        elif kind == dict[str, JournalSettings]:
            if not isinstance(raw, dict):
                raise ConfigError(path, "must be a table of [journals.NAME] tables")
            journals = {}
            for name, sub in raw.items():
                if not (name.replace("-", "").replace("_", "").isalnum() and name.isascii()):
                    raise ConfigError(f"{path}.{name}", "a journal name is letters, digits, '-' and '_'")
                if not isinstance(sub, dict):
                    raise ConfigError(f"{path}.{name}", "must be a table")
                built = _build(JournalSettings, sub, f"{path}.{name}")
                journals[name] = _mailbox_journal(_store_keys(built, sub, f"{path}.{name}"), sub, path, name)
            keeping = sorted(name for name, j in journals.items() if j.mailboxes)
            if len(keeping) > 1:
                raise ConfigError(path, f"at most one journal keeps mailboxes; {', '.join(keeping)} all say so")
            values[key] = journals
        elif dataclasses.is_dataclass(kind):
            if not isinstance(raw, dict):
                raise ConfigError(path, "must be a table")
            values[key] = _build(kind, raw, path)  # type: ignore[arg-type]
        elif kind is int:
            if not isinstance(raw, int) or isinstance(raw, bool):
                raise ConfigError(path, f"must be an integer, got {_shown(raw)}")
            minimum = known[key].metadata.get("min", 1)  # integers are at least 1 unless a field says
            if raw < minimum:
                raise ConfigError(path, f"must be at least {minimum}, got {raw}")
            values[key] = raw
        elif kind is str:
            if not isinstance(raw, str) or not (raw or known[key].metadata.get("empty")):
                raise ConfigError(path, f"must be a non-empty string, got {_shown(raw)}")
            choices = known[key].metadata.get("choices")
            if choices and raw not in choices:
                raise ConfigError(path, f"must be one of {', '.join(choices)}, got {_shown(raw)}")
            values[key] = _no_nul(path, raw)
        elif kind == tuple[str, ...]:
            if isinstance(raw, str):
                raw = [raw]
            may_be_empty = known[key].metadata.get("empty")
            if not isinstance(raw, list) or not (raw or may_be_empty) or not all(isinstance(v, str) and v for v in raw):
                raise ConfigError(
                    path, f"must be a {'' if may_be_empty else 'non-empty '}list of strings, got {_shown(raw)}"
                )
            for value in raw:
                _no_nul(path, value)
            if key == "topics":
                for pattern in raw:
                    try:
                        split_pattern(pattern)
                    except ValueError as exc:
                        raise ConfigError(path, str(exc)) from None
            values[key] = tuple(raw)
        else:  # pragma: no cover - a field type this loader does not know
            raise ConfigError(path, f"unsupported field type {kind}")
    return cls(**values)


def _mailbox_journal(settings: JournalSettings, table: dict[str, Any], path: str, name: str) -> JournalSettings:
    """A journal that keeps mailboxes keeps nothing else: its topics are the mailbox records'."""
    if not settings.mailboxes:
        return settings
    if "topics" in table and settings.topics != (SYS_MAILBOX_PATTERN,):
        reason = f"a journal that keeps mailboxes keeps nothing else: leave topics out (it is {SYS_MAILBOX_PATTERN})"
        raise ConfigError(f"{path}.{name}.topics", reason)
    return dataclasses.replace(settings, topics=(SYS_MAILBOX_PATTERN,))


# Keys of a [journals.NAME] table JetStream cannot honour (a ConfigError names the one given), and
# keys only a JetStream journal has.
JETSTREAM_CANNOT = {
    "dedup_max_ids": "JetStream remembers every MSGID of dedup_window_s (the stream's duplicate window) "
    "and has no bound on their number; leave it out",
}
JETSTREAM_ONLY = ("replicas", "max_messages")


def _store_keys(settings: JournalSettings, table: dict[str, Any], path: str) -> JournalSettings:
    """What the journal's store can honour: a key it cannot is an error naming it."""
    if not settings.replicated:
        for key in JETSTREAM_ONLY:
            if key in table:
                raise ConfigError(f"{path}.{key}", 'only a journal with store = "jetstream" has it')
        return settings
    for key, reason in JETSTREAM_CANNOT.items():
        if key in table:
            raise ConfigError(f"{path}.{key}", f'store = "jetstream" cannot honour it: {reason}')
    if not 1 <= settings.replicas <= MAX_REPLICAS:
        reason = f"must be 1 to {MAX_REPLICAS} (JetStream's bound), got {settings.replicas}"
        raise ConfigError(f"{path}.replicas", reason)
    return settings


def check_stores(config: Config) -> Config:
    """A JetStream journal needs the NATS servers of ``[cluster] nats`` (ConfigError naming its store).

    Checked by the broker (its constructor, ``--check-config``), not when a file is read: ``mc0
    broker --cluster URL,URL`` may give the servers the file leaves out."""
    for name, journal in sorted(config.journals.items()):
        if journal.replicated and not config.cluster.nats:
            reason = (
                'store = "jetstream" keeps it in the NATS cluster of [cluster] nats, and there is none: '
                'add [cluster] nats = ["nats://..."] (or use store = "file")'
            )
            raise ConfigError(f"journals.{name}.store", reason)
    return config


def _check(config: Config) -> Config:
    broker = config.broker
    if broker.min_ttl_ms > broker.max_ttl_ms:
        raise ConfigError("broker.min_ttl_ms", f"{broker.min_ttl_ms} exceeds max_ttl_ms {broker.max_ttl_ms}")
    limits = broker.limits
    if limits.max_message_bytes > limits.max_frame_bytes:
        raise ConfigError(
            "broker.limits.max_message_bytes",
            f"{limits.max_message_bytes} exceeds max_frame_bytes {limits.max_frame_bytes}",
        )
    parse_endpoints(config.client.endpoint, where="client.endpoint")  # one line naming a bad entry
    if broker.max_consumers_per_identity > broker.max_consumers:
        reason = f"{broker.max_consumers_per_identity} exceeds max_consumers {broker.max_consumers}"
        raise ConfigError("broker.max_consumers_per_identity", reason)
    cluster = config.cluster
    for i, url in enumerate(cluster.nats):
        routes.check_url(url, f"cluster.nats[{i}]")
    if cluster.name:
        routes.check_name(cluster.name)
    if cluster.tls_key and not cluster.tls_cert:
        raise ConfigError("cluster.tls_key", "a key needs tls_cert, the certificate it belongs to")
    if config.memodb.identity == ANONYMOUS:
        raise ConfigError("memodb.identity", f"choose a name of its own, not {ANONYMOUS!r} (see docs/SECURITY.md)")
    return config


# Keys renamed since a release: (table, old name) -> new name.  The old name is still read (a warning
# says so); both at once is an error naming them.
RENAMED = {("broker", "mdp_ttl_ms"): "foreign_ttl_ms"}


def _renamed(table: dict[str, Any]) -> dict[str, Any]:
    for (section, old), new in RENAMED.items():
        sub = table.get(section)
        if isinstance(sub, dict) and old in sub:
            if new in sub:
                raise ConfigError(f"{section}.{old}", f"renamed {new}, which is set too: keep {new} only")
            log.warning("config: %s.%s is now %s.%s (the old name still works)", section, old, section, new)
            sub = dict(sub)
            sub[new] = sub.pop(old)
            table = {**table, section: sub}
    return table


def parse(text: str, source: str = "<string>") -> Config:
    """TOML text -> Config; errors name ``source`` and the key."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, f"not valid TOML: {exc}") from None
    except RecursionError:  # (tomllib parses nested arrays and inline tables recursively)
        raise ConfigError(source, "not valid TOML here: arrays or tables nested too deeply") from None
    try:
        return _check(_build(Config, _renamed(table), ""))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc.where}", exc.reason) from None
    except RecursionError:
        raise ConfigError(source, "values nested too deeply") from None


def resolve_paths(config: Config, base: Path) -> Config:
    """``config`` with every relative path made absolute under ``base`` (the config file's folder,
    or its ``data_dir``): keys_dir, allowed_dir, a broker_key given as a path, journal folders
    (the default var/journal/NAME too), the [client] key files and the [http] admin token file."""

    def under(value: str) -> str:
        return value if not value or os.path.isabs(value) else str(base / value)

    security = config.security
    broker_key = security.broker_key
    if os.sep in broker_key or broker_key.endswith(".key_secret"):  # a path, not a NAME in keys_dir
        broker_key = under(broker_key)
    journals = {
        name: dataclasses.replace(j, folder=str(base / j.path(name)) if not os.path.isabs(j.path(name)) else j.folder)
        for name, j in config.journals.items()
    }
    return dataclasses.replace(
        config,
        security=dataclasses.replace(
            security,
            keys_dir=under(security.keys_dir),
            allowed_dir=under(security.allowed_dir),
            broker_key=broker_key,
        ),
        client=dataclasses.replace(
            config.client, key=under(config.client.key), broker_key=under(config.client.broker_key)
        ),
        journals=journals,
        http=dataclasses.replace(config.http, admin_token_file=under(config.http.admin_token_file)),
        cluster=dataclasses.replace(
            config.cluster,
            credentials=under(config.cluster.credentials),
            nkey_seed=under(config.cluster.nkey_seed),
            tls_ca=under(config.cluster.tls_ca),
            tls_cert=under(config.cluster.tls_cert),
            tls_key=under(config.cluster.tls_key),
        ),
    )


def load(path: str | os.PathLike[str]) -> Config:
    """The config file at ``path``, its relative paths resolved against its folder (or data_dir)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), "no such file (`mc0 config sample -o FILE` writes one with every key)") from None
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), "not UTF-8 text") from None
    config = parse(text, str(path))
    try:
        base = path.resolve().parent
        if config.data_dir:
            base = (base / config.data_dir).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a path the OS refuses
        raise ConfigError(f"{path}: data_dir", f"cannot resolve {_shown(config.data_dir)}: {exc}") from None
    return resolve_paths(config, base)


def load_default(path: str | os.PathLike[str] | None = None) -> Config:
    """``path``, else ``$MC0_CONFIG``, else the embedded defaults."""
    chosen = path or os.environ.get(ENV_CONFIG)
    return load(chosen) if chosen else Config()
