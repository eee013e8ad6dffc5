"""The route wire: what crosses NATS between brokers (subjects, the beacon, the frame around a route's batch).

Contract: pure functions, no I/O.  Subjects live under ``mc0.cl.`` (the NATS
user the brokers share is allowed ``mc0.>``; nobody else should be):

- ``mc0.cl.hello``: every broker's beacon, every ``hello_ms``: who it is
  (name, epoch) — discovery and liveness in one;
- ``mc0.cl.to.NAME``: the route traffic to broker NAME, one NATS message per
  flush of that route's queue (a batched-wire blob of records, <= 256 KiB).

A route message is ``from_len:u8 from epoch:u64 blob``: the sender's name and
epoch travel inside the payload (cheaper than NATS headers through nats-py).
An epoch is drawn at random when a broker starts: a beacon or message with a
new epoch from a known name means that broker restarted (its session is
replaced).  Broker names are 1-64 bytes of letters, digits, ``-`` and ``_``
(they are a NATS subject token).
"""

from __future__ import annotations

import json
import re
import struct
import urllib.parse

from ..errors import ConfigError

SUBJECT_PREFIX = "mc0.cl"
HELLO_SUBJECT = f"{SUBJECT_PREFIX}.hello"
MAX_NAME_BYTES = 64
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_EPOCH = struct.Struct("!Q")
WIRE_VERSION = 1


def is_name(name: str) -> bool:
    """``name`` is a broker name (1-64 letters, digits, ``-`` or ``_``)."""
    return _NAME.fullmatch(name) is not None


def check_name(name: str, where: str = "cluster.name") -> str:
    """A broker name usable as a subject token (ConfigError naming ``where`` otherwise)."""
    if not is_name(name):
        raise ConfigError(where, f"1 to {MAX_NAME_BYTES} letters, digits, '-' or '_', got {name!r}")
    return name


# A queue-group copy one broker chose another for and that one could not place goes back with
# REFUSED (and on to another with TRIED): the brokers that could not place it, as comma-separated
# broker names, each once (at most one per broker of a cluster).
MAX_BROKER_LIST = 256


def broker_list(names: tuple[str, ...] | list[str]) -> bytes:
    """The TRIED / REFUSED value naming ``names`` (broker names, in order)."""
    return ",".join(names).encode()


def parse_broker_list(text: str) -> tuple[str, ...] | None:
    """The broker names of a TRIED / REFUSED value (each once, in order); None if malformed."""
    names = tuple(dict.fromkeys(text.split(",")))
    if len(names) > MAX_BROKER_LIST or not all(_NAME.fullmatch(n) for n in names):
        return None
    return names


def check_url(url: str, where: str = "cluster.nats") -> str:
    """A NATS server URL (``nats://[user:pass@]host:port`` or ``tls://...``); ConfigError otherwise."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("nats", "tls") or not parts.hostname or port is None:
        shown = urllib.parse.urlunsplit((parts.scheme, parts.hostname or "", "", "", "")) if parts.password else url
        raise ConfigError(where, f"not a NATS URL (nats://user:password@host:4222): {shown!r}")
    return url


def derived_name(host: str, endpoint: str) -> str:
    """The default broker name: the host and the port of the first bound endpoint (``web1-61616``)."""
    port = endpoint.rpartition(":")[2]
    base = re.sub(r"[^A-Za-z0-9_-]", "-", host.split(".")[0])[: MAX_NAME_BYTES - 8] or "mc0"
    return f"{base}-{port}" if port.isdigit() else base


def inbox(name: str) -> str:
    """The subject a broker receives its route traffic on."""
    return f"{SUBJECT_PREFIX}.to.{name}"


def hello(name: str, epoch: int) -> bytes:
    return json.dumps({"v": WIRE_VERSION, "name": name, "epoch": epoch}, separators=(",", ":")).encode()


def parse_hello(data: bytes) -> tuple[str, int] | None:
    """(name, epoch) of a beacon, None if it is not one this broker understands."""
    try:
        beacon = json.loads(data)
        name, epoch, version = beacon["name"], beacon["epoch"], beacon["v"]
    except (ValueError, TypeError, KeyError):
        return None
    if version != WIRE_VERSION or not isinstance(name, str) or not _NAME.fullmatch(name):
        return None
    if not isinstance(epoch, int) or not 0 <= epoch < 1 << 64:
        return None
    return name, epoch


def route_message(sender: str, epoch: int, blob: bytes) -> bytes:
    head = sender.encode()
    return bytes((len(head),)) + head + _EPOCH.pack(epoch) + blob


def parse_route_message(data: bytes) -> tuple[str, int, bytes] | None:
    """(sender, epoch, blob) of a route message, None if malformed."""
    if not data:
        return None
    size = data[0]
    end = 1 + size + _EPOCH.size
    if size == 0 or size > MAX_NAME_BYTES or len(data) < end:
        return None
    try:
        sender = data[1 : 1 + size].decode("ascii")
    except UnicodeDecodeError:
        return None
    if not _NAME.fullmatch(sender):
        return None
    (epoch,) = _EPOCH.unpack_from(data, 1 + size)
    return sender, epoch, data[end:]
