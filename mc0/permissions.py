"""Per-identity permissions: what each identity may publish, subscribe, call, serve.

Contract: ``Permissions.from_table(toml_table, where)`` builds the policy
from the config's ``[permissions]`` table (errors name the key);
``grants(identity)`` returns the compiled :class:`Grants` the broker core
consults.  Rules, NATS style:

* each of ``publish``, ``subscribe``, ``call``, ``serve`` and ``send_to`` is
  a list of topic (service, identity) patterns; an identity's own list replaces the default's, a
  missing one inherits it; the default allows everything (``[">"]``) unless
  configured otherwise (authentication is the first gate);
* ``deny`` lists (the default's and the identity's together) win over
  allows;
* a SUB pattern must lie wholly inside an allowed pattern and not wholly
  inside a denied one; a wildcard that merely overlaps a denied topic is
  accepted, and the broker never delivers the denied topics to it (checked
  at delivery, as NATS does).
* a 0.x peer's *opaque* topic (one that is not a 1.0 topic, such as
  ``mcollective discovery``: see :mod:`mc0.topics`) has no tokens to match,
  so it may be published (subscribed) only by an identity whose publish
  (subscribe) list allows ``>`` and denies nothing;
* peer telemetry (``mc0.sys.peer``: who connects and disconnects) is for
  identities granted it by name: once a ``[permissions]`` table exists, a
  SUB pattern that can match ``mc0.sys.peer`` (``mc0.sys.peer``,
  ``mc0.sys.*``, ``mc0.sys.>``) needs a subscribe grant that names
  ``mc0.sys`` and matches it; ``>`` does not.  No other pattern can match
  it (see :mod:`mc0.topics`), so the check at SUB time is the whole rule:
  deliveries pay nothing.  With no table at all, everything stays allowed.
* the operator's actions (``mc0.admin``: close a session, remove a durable
  consumer, purge a journal) are for identities granted them by name: a call
  grant ``mc0.admin`` (the pattern itself, not ``>``, ``mc0.>`` or
  ``mc0.*``), and no call deny that matches it.  Unlike peer telemetry this
  holds with no ``[permissions]`` table too: nobody is an operator by
  default.  An operator may also see the ``peers`` report.

Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError, InvalidTopic
from .topics import SYSTEM_TOKENS, pattern_covers, pattern_matches, split_pattern

ACTIONS = ("publish", "subscribe", "call", "serve", "send_to")
ALL: tuple[str, ...] = (">",)
ALL_TOKENS: tuple[str, ...] = (">",)  # the pattern ">" split
PEER_TELEMETRY: tuple[str, ...] = ("mc0", "sys", "peer")  # mc0.protocol.SYS_PEER_TOPIC, split
ADMIN: tuple[str, ...] = ("mc0", "admin")  # mc0.protocol.ADMIN_SERVICE, split
_CACHE_SIZE = 1024


@dataclass(frozen=True, slots=True)
class Rules:
    """Allow and deny pattern lists for one identity (None = inherit the default)."""

    allow: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    deny: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def _tokens(patterns: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    return tuple(split_pattern(p, max_bytes=1024, max_tokens=64) for p in patterns)


class Grants:
    """One identity's compiled rules."""

    __slots__ = ("_allow", "_deny", "_publish_cache", "admin", "deny_subscribe", "sees_peers", "unrestricted")

    def __init__(
        self, allow: Mapping[str, Sequence[str]], deny: Mapping[str, Sequence[str]], *, peers_by_default: bool = False
    ) -> None:
        self._allow = {action: _tokens(allow.get(action, ())) for action in ACTIONS}
        self._deny = {action: _tokens(deny.get(action, ())) for action in ACTIONS}
        # Peer telemetry: granted by a pattern naming mc0.sys (or by having no policy at all).
        self.sees_peers = not any(pattern_matches(d, PEER_TELEMETRY) for d in self._deny["subscribe"]) and (
            peers_by_default
            or any(a[:2] == SYSTEM_TOKENS and pattern_matches(a, PEER_TELEMETRY) for a in self._allow["subscribe"])
        )
        # The operator's actions: granted by the call pattern "mc0.admin" itself (never by default).
        self.admin = ADMIN in self._allow["call"] and not any(pattern_matches(d, ADMIN) for d in self._deny["call"])
        # Everything allowed, nothing denied: the hot path answers without matching.
        self.unrestricted = not any(self._deny.values()) and all(a == ((">",),) for a in self._allow.values())
        self.deny_subscribe = self._deny["subscribe"]  # non-empty: the broker filters deliveries
        self._publish_cache: dict[tuple[str, ...], bool] = {}

    def _literal(self, action: str, tokens: tuple[str, ...]) -> bool:
        if self.unrestricted:
            return True
        if any(pattern_matches(d, tokens) for d in self._deny[action]):
            return False
        return any(pattern_matches(a, tokens) for a in self._allow[action])

    def may_publish(self, topic: tuple[str, ...]) -> bool:
        if self.unrestricted:
            return True
        verdict = self._publish_cache.get(topic)
        if verdict is None:
            if len(self._publish_cache) >= _CACHE_SIZE:
                self._publish_cache.clear()
            verdict = self._publish_cache[topic] = self._literal("publish", topic)
        return verdict

    def hides_peers(self, pattern: tuple[str, ...]) -> bool:
        """The pattern reaches peer telemetry, which this identity was not granted by name."""
        return not self.sees_peers and pattern[:2] == SYSTEM_TOKENS and pattern_matches(pattern, PEER_TELEMETRY)

    def may_subscribe(self, pattern: tuple[str, ...]) -> bool:
        if self.hides_peers(pattern):
            return False
        if any(pattern_covers(d, pattern) for d in self.deny_subscribe):
            return False
        return any(pattern_covers(a, pattern) for a in self._allow["subscribe"])

    def delivers(self, topic: tuple[str, ...]) -> bool:
        """False when a subscribe-deny pattern matches this topic."""
        return not any(pattern_matches(d, topic) for d in self.deny_subscribe)

    def may_receive(self, topic: tuple[str, ...]) -> bool:
        """A message on this literal topic may be handed to this identity: a SUB naming the topic
        would be accepted and the delivery not filtered.  The check for what the broker hands
        out without a SUB pattern of the identity's own (fetches, durable consumers, dead letters)."""
        return self.may_subscribe(topic) and self.delivers(topic)

    def may_use_opaque(self, action: str) -> bool:
        """A 0.x peer's opaque topic (not a 1.0 topic: no tokens to match): only for an
        identity whose ``action`` list allows ``>`` and denies nothing."""
        return self.unrestricted or (ALL_TOKENS in self._allow[action] and not self._deny[action])

    def may_call(self, service: tuple[str, ...]) -> bool:
        if service == ADMIN:  # by name only: see the module's contract
            return self.admin
        return self._literal("call", service)

    def may_serve(self, service: tuple[str, ...]) -> bool:
        return self._literal("serve", service)

    def may_send_to(self, identity: tuple[str, ...]) -> bool:
        """A direct message (PUT TO) to this identity (its name split like a topic)."""
        return self._literal("send_to", identity)


ALLOW_ALL = Grants(dict.fromkeys(ACTIONS, ALL), {}, peers_by_default=True)  # no [permissions] table at all
ALLOW_ALL_BUT_PEERS = Grants(dict.fromkeys(ACTIONS, ALL), {})  # a table that allows everything


@dataclass(frozen=True)
class Permissions:
    default: Rules = field(default_factory=Rules)
    identities: Mapping[str, Rules] = field(default_factory=dict)
    configured: bool = False  # built from a [permissions] table: peer telemetry needs a grant naming it

    def grants(self, identity: str) -> Grants:
        own = self.identities.get(identity, Rules())
        allow = {}
        deny = {}
        for action in ACTIONS:
            chosen = own.allow.get(action)
            if chosen is None:
                chosen = self.default.allow.get(action)
            allow[action] = ALL if chosen is None else chosen
            deny[action] = (*self.default.deny.get(action, ()), *own.deny.get(action, ()))
        if not any(deny.values()) and all(a == ALL for a in allow.values()):
            return ALLOW_ALL_BUT_PEERS if self.configured else ALLOW_ALL
        return Grants(allow, deny, peers_by_default=not self.configured)

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str = "permissions") -> Permissions:
        unknown = set(table) - {"default", "identity"}
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]}", "unknown key (known: default, identity)")
        default = _rules(table.get("default", {}), f"{where}.default")
        identities_table = table.get("identity", {})
        if not isinstance(identities_table, Mapping):
            raise ConfigError(f"{where}.identity", "must be a table of identities")
        identities = {name: _rules(rules, f"{where}.identity.{name}") for name, rules in identities_table.items()}
        return cls(default, identities, configured=True)


def _pattern_list(raw: Any, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise ConfigError(where, f"must be a list of patterns, got {raw!r}")
    for pattern in raw:
        try:
            split_pattern(pattern, max_bytes=1024, max_tokens=64)
        except InvalidTopic as exc:
            raise ConfigError(where, str(exc)) from None
    return tuple(raw)


def _rules(table: Any, where: str) -> Rules:
    if not isinstance(table, Mapping):
        raise ConfigError(where, "must be a table")
    allow: dict[str, tuple[str, ...] | None] = {}
    deny: dict[str, tuple[str, ...]] = {}
    for key, raw in table.items():
        if key == "deny":
            if not isinstance(raw, Mapping):
                raise ConfigError(f"{where}.deny", "must be a table")
            for action, patterns in raw.items():
                if action not in ACTIONS:
                    raise ConfigError(f"{where}.deny.{action}", f"unknown key (known: {', '.join(ACTIONS)})")
                deny[action] = _pattern_list(patterns, f"{where}.deny.{action}")
        elif key in ACTIONS:
            allow[key] = _pattern_list(raw, f"{where}.{key}")
        else:
            raise ConfigError(f"{where}.{key}", f"unknown key (known: {', '.join(ACTIONS)}, deny)")
    return Rules(allow, deny)
