"""Configuration: TOML (stdlib ``tomllib``) -> frozen dataclasses.

Contract: ``load(path)`` returns a :class:`Config` or raises
:class:`mc0.errors.ConfigError` naming the file and the dotted key (unknown
keys, wrong types and out-of-range values are all errors).  ``Config()`` is the
embedded defaults.  Field bounds live in each field's ``metadata["min"]``.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .core import CoreSettings
from .errors import ConfigError
from .journal import JournalSettings
from .permissions import Permissions
from .topics import split_pattern

DEFAULT_ENDPOINT = "tcp://127.0.0.1:61616"  # the port of the original mc0d

ENV_ENDPOINT = "MC0_ENDPOINT"
ENV_CONFIG = "MC0_CONFIG"
ENV_KEY = "MC0_KEY"
ENV_BROKER_KEY = "MC0_BROKER_KEY"


@dataclass(frozen=True, slots=True)
class BrokerConfig(CoreSettings):
    bind: tuple[str, ...] = (DEFAULT_ENDPOINT,)
    # Outgoing queue per peer (ZMQ_SNDHWM); beyond it sends to that peer are
    # dropped and counted (see CoreSettings.slow_consumer_ms).
    send_hwm: int = field(default=10_000, metadata={"min": 1})


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """The broker's CURVE setup (``curve = false`` is ``mc0 broker --insecure``)."""

    curve: bool = True
    keys_dir: str = "keys"
    allowed_dir: str = "keys/allowed"
    # NAME of a keypair in keys_dir (created on first start if absent), or a path to NAME.key_secret.
    broker_key: str = "broker"
    # How often the allowed folder is checked for changes (revocation takes effect within this).
    reload_ms: int = field(default=500, metadata={"min": 10})


@dataclass(frozen=True, slots=True)
class ClientConfig:
    endpoint: str = DEFAULT_ENDPOINT
    ttl_ms: int = field(default=5_000, metadata={"min": 1})
    timeout_ms: int = field(default=5_000, metadata={"min": 1})
    request_timeout_ms: int = field(default=30_000, metadata={"min": 1})
    # This client's secret key (NAME.key_secret path) and the broker's public key
    # (NAME.key path); both empty = no CURVE. Overridden by MC0_KEY / MC0_BROKER_KEY.
    key: str = field(default="", metadata={"empty": True})
    broker_key: str = field(default="", metadata={"empty": True})


@dataclass(frozen=True, slots=True)
class Config:
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    permissions: Permissions = field(default_factory=Permissions)
    # [journals.NAME] tables: which topics the broker keeps, and how (see mc0.journal).
    journals: dict[str, JournalSettings] = field(default_factory=dict)


C = TypeVar("C")

# Integer settings must be at least 1 unless listed here (pure modules stay free of config concerns).
_MINIMUMS: dict[str, int] = {"slow_consumer_ms": 0}


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
                raise ConfigError(path, f"must be true or false, got {raw!r}")
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
                journals[name] = _build(JournalSettings, sub, f"{path}.{name}")
            values[key] = journals
        elif dataclasses.is_dataclass(kind):
            if not isinstance(raw, dict):
                raise ConfigError(path, "must be a table")
            values[key] = _build(kind, raw, path)  # type: ignore[arg-type]
        elif kind is int:
            if not isinstance(raw, int) or isinstance(raw, bool):
                raise ConfigError(path, f"must be an integer, got {raw!r}")
            minimum = known[key].metadata.get("min", _MINIMUMS.get(key, 1))
            if raw < minimum:
                raise ConfigError(path, f"must be at least {minimum}, got {raw}")
            values[key] = raw
        elif kind is str:
            if not isinstance(raw, str) or not (raw or known[key].metadata.get("empty")):
                raise ConfigError(path, f"must be a non-empty string, got {raw!r}")
            choices = known[key].metadata.get("choices")
            if choices and raw not in choices:
                raise ConfigError(path, f"must be one of {', '.join(choices)}, got {raw!r}")
            values[key] = raw
        elif kind == tuple[str, ...]:
            if isinstance(raw, str):
                raw = [raw]
            if not isinstance(raw, list) or not raw or not all(isinstance(v, str) and v for v in raw):
                raise ConfigError(path, f"must be a non-empty list of strings, got {raw!r}")
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
    return config


def parse(text: str, source: str = "<string>") -> Config:
    """TOML text -> Config; errors name ``source`` and the key."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, f"not valid TOML: {exc}") from None
    try:
        return _check(_build(Config, table, ""))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc.where}", exc.reason) from None


def load(path: str | os.PathLike[str]) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), "not UTF-8 text") from None
    return parse(text, str(path))


def load_default(path: str | os.PathLike[str] | None = None) -> Config:
    """``path``, else ``$MC0_CONFIG``, else the embedded defaults."""
    chosen = path or os.environ.get(ENV_CONFIG)
    return load(chosen) if chosen else Config()
