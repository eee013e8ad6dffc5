"""Which ``Host`` the monitoring listener serves: its own address, ``localhost`` and the names of
``[http] allowed_hosts``, nothing else (a DNS-rebinding page asks under its own name).

Contract: ``host_name(text)`` reads a Host header's value (``name``, ``name:port``, ``[v6]:port``)
or an ``allowed_hosts`` entry into one comparable name: lower case, one trailing dot dropped, an IP
address in its canonical form (an IPv4-mapped IPv6 address as the IPv4 one); None when it is none
of those (a bare IPv6 address with a port, a zone, characters a DNS name does not have, a port
that is not 0-65535 in ASCII digits); ``allowed_name(entry)`` does the same for an ``allowed_hosts``
entry, which has no port.  The port is not compared: a tunnel or a proxy may reach the
listener on another one, and the name is what a rebinding page cannot give.  ``HostRule(listen_host,
allowed)`` raises ConfigError naming ``http.allowed_hosts`` for an entry that is no name;
``refusal(values, local_address, version)`` is None for a request to serve, else its (status, one
line): 400 for no Host on HTTP/1.1 or more than one Host, 421 for a name that is not ours.  An
HTTP/1.0 request without Host is served: no browser sends one, so no page can be behind it (an
HTTP/0.9 one, which has no headers, is refused: its answer is the body alone).
Pure: no sockets, no clock.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from ipaddress import IPv6Address, ip_address

from ...errors import ConfigError

WHERE = "http.allowed_hosts"
LOCALHOST = "localhost"
WILDCARDS = ("", "0.0.0.0", "::")  # a listener on every interface: its address is each connection's own
NAME_CHARS = frozenset(string.ascii_lowercase + string.digits + "-.")
MAX_NAME_CHARS = 253  # a DNS name's bound
MISDIRECTED = 421


def _canonical(name: str) -> str | None:
    """``name`` (no port, no brackets) as compared: an IP address canonical, else a DNS-like name."""
    try:
        address = ip_address(name)
    except ValueError:
        pass
    else:
        if isinstance(address, IPv6Address):
            if address.scope_id is not None:
                return None
            if address.ipv4_mapped is not None:
                return str(address.ipv4_mapped)
        return str(address)
    name = name.lower()
    name = name[:-1] if name.endswith(".") else name
    if not name or len(name) > MAX_NAME_CHARS or not NAME_CHARS.issuperset(name):
        return None
    if any(not label for label in name.split(".")):
        return None
    return name


def _port_ok(port: str) -> bool:
    return port == "" or (port.isascii() and port.isdigit() and len(port) <= 5 and int(port) <= 65535)


def host_name(text: str) -> str | None:
    """A Host header's value (or an allowed_hosts entry) -> its name as compared, or None."""
    text = text.strip(" \t")
    if text.startswith("["):
        inner, bracket, port = text[1:].partition("]")
        if not bracket or (port and not (port.startswith(":") and _port_ok(port[1:]))) or ":" not in inner:
            return None
        return _canonical(inner)
    if text.count(":") > 1:  # a bare IPv6 address: an allowed_hosts entry may be one, a Host may not carry a port
        return _canonical(text)
    name, colon, port = text.partition(":")
    if colon and not _port_ok(port):
        return None
    return _canonical(name)


def allowed_name(entry: str) -> str | None:
    """An ``allowed_hosts`` entry (a name or an IP address, an IPv6 one bracketed or not; no port)
    -> its name as compared, or None."""
    entry = entry.strip()
    if entry.startswith("[") and entry.endswith("]"):
        entry = entry[1:-1]
        return _canonical(entry) if ":" in entry else None
    if entry.count(":") == 1:  # a port
        return None
    return _canonical(entry)


class HostRule:
    def __init__(self, listen_host: str, allowed: Sequence[str] = ()) -> None:
        """``listen_host``: the address the listener binds (its own name unless a wildcard)."""
        names = {LOCALHOST}
        if listen_host not in WILDCARDS:
            own = host_name(f"[{listen_host}]" if ":" in listen_host else listen_host)
            if own is not None:
                names.add(own)
        for entry in allowed:
            name = allowed_name(entry)
            if name is None:
                reason = (
                    f"{entry[:80]!r} is not a host name or an IP address (no scheme, no port): e.g. mc0.example.org"
                )
                raise ConfigError(WHERE, reason)
            names.add(name)
        self.names = frozenset(names)

    def refusal(self, values: Sequence[str], local_address: str, version: str) -> tuple[int, str] | None:
        """None to serve a request with these Host header ``values``, over a connection to
        ``local_address`` (the listener's side), in HTTP ``version`` (``HTTP/1.1``); else (status, why)."""
        if not values:
            if version == "HTTP/1.0":
                return None
            return 400, "a Host header is required"
        if len(values) > 1:
            return 400, "more than one Host header"
        name = host_name(values[0])
        if name is not None and (name in self.names or name == host_name(_bracketed(local_address))):
            return None
        shown = repr(values[0][:80])
        return MISDIRECTED, (
            f"this listener does not serve the host {shown}: only its own address, localhost and [http] allowed_hosts"
        )


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address else address
