"""``mc0 broker --check-config``: everything the broker would need, checked without starting it.

Contract: ``check_config(config)`` reads (never writes) the disk and returns
the lines of a report (what the broker would use, all paths absolute); the
first problem raises an :class:`mc0.Error` naming the file or key and what
is wrong.  Checked: every bind endpoint, the ``[http]`` listen address (and its admin token
file: 0600, one token), ``[memodb]``, the
broker's secret key (or that the keys folder can take a new one), each
allowed public key, and each journal folder (its segments readable, or its
nearest existing parent writable), and where kept mailbox letters live (the
one journal that keeps them, at most one: the loader refuses two).  No socket is opened: a port in use is
found only by starting.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import keys as keyfiles
from ..config import Config, check_stores
from ..endpoints import check_endpoint
from ..errors import ConfigError
from .cluster.link import redacted
from .monitoring.actions import read_token
from .monitoring.hosts import HostRule
from .monitoring.httpd import parse_listen
from .nngbridge import check_listen, require_modules


def _writable_folder(path: Path, what: str) -> str:
    """``path`` exists and is writable, or can be created (its nearest existing parent is writable)."""
    if path.exists():
        if not path.is_dir():
            raise ConfigError(what, f"{path} is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(what, f"{path} is not writable by this user")
        return "exists"
    parent = path.parent
    for _ in range(64):  # bounded walk to the root
        if parent.exists():
            break
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(what, f"{path} does not exist and {parent} is not writable by this user")
    return "will be created"


def require_extras(config: Config) -> None:
    """The optional packages ``config`` needs are installed, or a :class:`ConfigError` naming the extra:
    nats-py for ``[cluster] nats`` (mc0[cluster]), pynng and cbor2 for ``[memodb] enabled``
    (mc0[memodb]).  ``mc0 broker`` asks before it makes a keypair or opens anything."""
    if config.cluster.nats:
        try:
            import nats  # noqa: F401
        except ImportError:
            raise ConfigError("cluster.nats", "joining a cluster needs nats-py: pip install 'mc0[cluster]'") from None
    if config.memodb.enabled and config.broker.foreign_dialects:
        require_modules()


def check_config(config: Config) -> list[str]:
    require_extras(config)
    check_stores(config)  # a JetStream journal without [cluster] nats: the error names its store
    lines: list[str] = []
    for endpoint in config.broker.bind:
        check_endpoint(endpoint, bind=True, where="broker.bind")
    lines.append(f"bind: {' '.join(config.broker.bind)}")
    if config.http.listen:
        host, port = parse_listen(config.http.listen)
        hosts = HostRule(host, config.http.allowed_hosts)  # ConfigError naming http.allowed_hosts
        lines.append(f"http: monitoring on {host}:{port} (serving the hosts {', '.join(sorted(hosts.names))})")
        if config.http.admin_token_file:
            read_token(config.http.admin_token_file)  # ConfigError naming http.admin_token_file (never the token)
            lines.append(f"http: admin actions on (POST /admin/OP; the token in {config.http.admin_token_file})")
        else:
            lines.append("http: admin actions off (no admin_token_file)")
    else:
        lines.append("http: off")
    memodb = config.memodb
    if memodb.enabled and config.broker.foreign_dialects:
        where = "on loopback" if check_listen(memodb.listen) else "NOT on loopback: no authentication"
        lines.append(f"memodb: NNG rep0 on {memodb.listen} ({where}), peers are identity {memodb.identity!r}")
    else:
        lines.append("memodb: off" + (" (foreign_dialects = false)" if memodb.enabled else ""))
    cluster = config.cluster
    if cluster.nats:
        shown = ", ".join(redacted(url) for url in cluster.nats)
        name = cluster.name or "derived from the host and the first bind"
        lines.append(f"cluster: broker {name} joins over NATS {shown}")
    else:
        lines.append("cluster: off (standalone)")
    security = config.security
    if security.curve:
        path = keyfiles.resolve(security.broker_key, security.keys_dir, keyfiles.SECRET_SUFFIX)
        if path.exists():
            pair = keyfiles.load_secret(path)  # KeyFileError names the file
            lines.append(f"broker key: {path.resolve()} ({pair.name}, mode {path.stat().st_mode & 0o777:o})")
        else:
            state = _writable_folder(Path(security.keys_dir), "security.keys_dir")
            lines.append(f"broker key: {path.resolve()} will be created (keys folder {state})")
        allowed = Path(security.allowed_dir)
        names = []
        if allowed.is_dir():
            for public in sorted(allowed.glob(f"*{keyfiles.PUBLIC_SUFFIX}")):
                keyfiles.load_public(public)  # KeyFileError names the file
                names.append(public.name[: -len(keyfiles.PUBLIC_SUFFIX)])
        else:
            _writable_folder(allowed, "security.allowed_dir")
        lines.append(f"allowed: {allowed.resolve()}: {', '.join(names) or 'no identities yet'}")
    else:
        lines.append("security: CURVE off (anyone who reaches the port is 'anonymous')")
    for name, settings in sorted(config.journals.items()):
        folder = settings.path(name)
        state = _writable_folder(folder, f"journals.{name}.folder")
        if settings.mailboxes:
            what = "keeps the mailboxes: kept letters survive a restart"
        else:
            what = f"topics {', '.join(settings.topics)}"
        if settings.replicated:
            what += f"; kept by JetStream, R{settings.replicas}: the folder holds this broker's local copy"
            # A record is one NATS message: the servers' max_payload bounds it (the broker learns it when
            # it connects; 1 MiB is nats-server's default).  A PUT over it gets 413 at once.
            limit = config.broker.limits.max_message_bytes
            what += (
                "; a record is at most the NATS servers' max_payload (1 MiB unless they set more), "
                f"a larger PUT gets 413 (max_message_bytes {limit})"
            )
        lines.append(f"journal {name}: {folder.resolve()} ({state}; {what})")
    if not any(settings.mailboxes for settings in config.journals.values()):
        lines.append("mailboxes: in memory only (a restart loses kept letters; see [journals.NAME] mailboxes)")
    return lines
