"""Settings: the frozen dataclasses every part of mc0 is configured with.

Contract: a leaf.  This module imports nothing of the broker or the
clients (only the wire limits and the permission policy, both pure), so
``mc0.config`` (the TOML loader), the broker rooms and the clients can all
depend on it without depending on each other.  ``Config()`` is the embedded
defaults; field bounds live in each field's ``metadata`` (``min``, ``empty``,
``choices``), read by the loader.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .permissions import Permissions
from .protocol import Limits

DEFAULT_ENDPOINT = "tcp://127.0.0.1:61616"  # the port of the original mc0d

ENV_ENDPOINT = "MC0_ENDPOINT"
ENV_CONFIG = "MC0_CONFIG"
ENV_KEY = "MC0_KEY"
ENV_BROKER_KEY = "MC0_BROKER_KEY"
# ``mc0 broker --cluster``'s URLs from the environment: a password there is readable by its user (and
# root) only, where one on the command line is in /proc/PID/cmdline for every local user.
ENV_CLUSTER = "MC0_CLUSTER"

FSYNC_POLICIES = ("always", "batch", "never")
# Where a journal's records live: "file" (this broker's segment files) or "jetstream" (a stream
# the NATS cluster of [cluster] replicates; this broker keeps a local copy to read from).
STORES = ("file", "jetstream")
FILE_STORE, JETSTREAM_STORE = STORES
MAX_REPLICAS = 5  # JetStream's own bound on a stream's replicas
# Patterns one other broker of a cluster may announce here ([cluster] max_route_patterns): a route is
# trusted, but what it costs is bounded (a pattern is 1-2 KB: measured 0.8 KB for
# short ones, 1.9 KB for the adversary's; 100,000 are up to ~200 MiB).
MAX_ROUTE_PATTERNS = 100_000


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """The broker-core knobs (the config file's ``[broker]`` tables map onto these)."""

    limits: Limits = field(default_factory=Limits)
    min_ttl_ms: int = 100
    max_ttl_ms: int = 60_000
    liveness: int = 3
    # A peer whose sends keep failing at HWM for this long is told 429 and
    # forgotten; 0 keeps it (drops are still counted).
    slow_consumer_ms: int = field(default=5_000, metadata={"min": 0})
    request_timeout_ms: int = 30_000  # when a REQUEST has no TIMEOUT
    max_request_timeout_ms: int = 600_000  # TIMEOUT is clamped to this
    max_queue: int = 10_000  # queued requests per service (429 beyond)
    max_requests: int = 10_000  # outstanding requests per client (429 beyond)
    max_attempts: int = 3  # dispatches of one request before 502
    max_capacity: int = 1_000  # CAPACITY a worker may claim
    # Heartbeat interval of every foreign dialect's workers, and how long a foreign peer may be
    # silent (x liveness): MDP/0.2 (majortomo's default), seed 000, eMQP, DCP.  Was ``mdp_ttl_ms``.
    foreign_ttl_ms: int = 2_500
    # MDP/0.2, seed 000, eMQP and DCP peers on the broker's socket (mc0.broker.dialects); false:
    # their messages are dropped and counted, and only mc0's own protocol is spoken.
    foreign_dialects: bool = True
    # Mailboxes (PUT TO identity): direct messages kept while no session of the identity is
    # connected, per identity at most this many / these bytes, each for at most this long;
    # all mailboxes together at most mailboxes_max_bytes.  Beyond a bound the PUT gets 429.
    # In memory only, unless a journal keeps them (JournalSettings.mailboxes): then across restarts.
    mailbox_max_messages: int = 1_000
    mailbox_max_bytes: int = 16 * 1024 * 1024
    mailbox_ttl_ms: int = 3_600_000
    mailboxes_max_bytes: int = 256 * 1024 * 1024
    # Durable consumers (mc0.consumer create): at most max_consumers on the broker, and at most
    # max_consumers_per_identity owned by one identity (429 beyond either), so one identity
    # cannot take every slot.  Saved consumers are restored whatever these say.
    max_consumers: int = 1_000
    max_consumers_per_identity: int = 100


@dataclass(frozen=True, slots=True)
class BrokerConfig(CoreSettings):
    bind: tuple[str, ...] = (DEFAULT_ENDPOINT,)
    # Each peer's outgoing queue, counted by the broker: beyond either bound a message to
    # that peer is dropped and counted, and a peer that stays over it for slow_consumer_ms
    # is evicted (told 429) and its queue freed.  Per peer, memory is at most
    # max_queue_bytes plus send_hwm messages inside libzmq.
    max_queue_bytes: int = field(default=64 * 1024 * 1024, metadata={"min": 1024})
    max_queue_messages: int = field(default=200_000, metadata={"min": 1})
    # Messages libzmq may hold per peer (ZMQ_SNDHWM) beyond the broker's own queue: a small
    # window, so what a slow peer pins is counted by the broker, not hidden in libzmq.
    send_hwm: int = field(default=64, metadata={"min": 1})


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
    # One endpoint, or a comma-separated list the client fails over between (mc0.endpoints).
    endpoint: str = DEFAULT_ENDPOINT
    ttl_ms: int = field(default=5_000, metadata={"min": 1})
    timeout_ms: int = field(default=5_000, metadata={"min": 1})
    request_timeout_ms: int = field(default=30_000, metadata={"min": 1})
    # This client's secret key (NAME.key_secret path) and the broker's public key
    # (NAME.key path); both empty = no CURVE. Overridden by MC0_KEY / MC0_BROKER_KEY.
    key: str = field(default="", metadata={"empty": True})
    broker_key: str = field(default="", metadata={"empty": True})


@dataclass(frozen=True, slots=True)
class JournalSettings:
    """One ``[journals.NAME]`` table of the config file."""

    topics: tuple[str, ...] = (">",)  # patterns whose PUTs are journaled
    folder: str = field(default="", metadata={"empty": True})  # "" = var/journal/NAME
    segment_bytes: int = field(default=64 * 1024 * 1024, metadata={"min": 4096})
    max_bytes: int = field(default=1024 * 1024 * 1024, metadata={"min": 0})  # 0 = no size limit
    max_age_s: int = field(default=7 * 24 * 3600, metadata={"min": 0})  # 0 = no age limit
    fsync: str = field(default="batch", metadata={"choices": FSYNC_POLICIES})
    dedup_window_s: int = field(default=120, metadata={"min": 0})  # 0 = no dedup
    dedup_max_ids: int = field(default=100_000, metadata={"min": 1})
    # This journal keeps the mailboxes (PUT TO letters stored for offline identities), and
    # nothing else: its topics are mc0.sys.mailbox.> (the loader sets them); at most one
    # journal may.  Without one, kept letters live in memory only (mc0.broker.core.mailboxes).
    mailboxes: bool = False
    # "jetstream": the records live in a JetStream stream replicated on `replicas` NATS nodes
    # (needs [cluster] nats); every broker of the cluster serves it.  folder and segment_bytes
    # then shape this broker's local copy; dedup_window_s is the stream's duplicate window.
    store: str = field(default=FILE_STORE, metadata={"choices": STORES})
    replicas: int = 3  # jetstream only: nodes that hold each record (1..5); R3 survives losing one
    max_messages: int = field(default=0, metadata={"min": 0})  # jetstream only: retention by count (0 = none)

    @property
    def replicated(self) -> bool:
        return self.store == JETSTREAM_STORE

    def path(self, name: str) -> Path:
        return Path(self.folder or os.path.join("var", "journal", name))


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """``[http]``: the broker's monitoring endpoint (``mc0 broker --http``): the web console (/),
    /healthz, /varz, /connz, /subsz, /servicez, /consumerz, /journalz, /mailboxz, /metrics.
    Off unless ``listen`` is set; it has no authentication, so keep it on loopback (a host
    elsewhere is logged at WARNING); its actions need the token in
    ``admin_token_file``."""

    listen: str = field(default="", metadata={"empty": True})  # "127.0.0.1:8222"; "" = off
    # A file (mode 0600) holding the bearer token of the admin actions (POST /admin/OP: close a
    # session, remove a consumer, purge a journal); "" = no actions over HTTP (every POST is 403).
    admin_token_file: str = field(default="", metadata={"empty": True})
    # Host names a request's Host header may give besides the listener's own address and localhost
    # (e.g. the name a reverse proxy forwards under); any other Host is answered 421 (DNS rebinding).
    allowed_hosts: tuple[str, ...] = field(default=(), metadata={"empty": True})


@dataclass(frozen=True, slots=True)
class MemodbConfig:
    """``[memodb]``: MemoDB (seed 003) clients and workers over NNG req/rep with CBOR headers
    (mc0.broker.dialects.memodb, mc0.broker.nngbridge).  Off unless ``enabled``; MemoDB has no
    authentication, so every peer on it is ``identity`` (allowed nothing unless
    ``[permissions.identity.NAME]`` grants it) and ``listen`` stays on loopback unless changed
    (elsewhere is logged at WARNING)."""

    enabled: bool = False
    listen: str = "tcp://127.0.0.1:12703"  # any NNG address: tcp://host:port, tcp://[::1]:port, ipc:///path
    identity: str = "memodb"
    # NNG contexts, each holding one request until its reply: clients' JOBs (and anything not a
    # worker's) waiting at once.  A waiting (parked) worker's request is held on a context of its
    # own beside these, at most max_workers of them, so parked workers never crowd out JOBs.
    max_pending: int = field(default=256, metadata={"min": 1})
    max_workers: int = field(default=1024, metadata={"min": 1})
    heartbeat_ms: int = field(default=5_000, metadata={"min": 10})  # a waiting worker's HEARTBEAT


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """``[cluster]``: join other brokers over a NATS cluster (``mc0 broker --cluster URL,URL --name NAME``;
    docs/DEPLOY.md).  Standalone while ``nats`` is empty.  Each broker stays the gateway its peers
    know; NATS carries what crosses brokers.  Credentials go in the URL (``nats://user:pass@host:4222``:
    in this file, mode 0600, or ``$MC0_CLUSTER``, never on the command line, which every local user can
    read), or in a creds / nkey seed file; TLS with ``tls_ca`` (and ``tls_cert``/``tls_key`` for mutual TLS)."""

    # NATS server URLs (they may hold credentials: never shown); () = standalone.
    nats: tuple[str, ...] = field(default=(), repr=False, metadata={"empty": True})
    name: str = field(default="", metadata={"empty": True})  # unique per broker; "" = host + first bind's port
    credentials: str = field(default="", metadata={"empty": True})  # a NATS .creds file (user JWT + nkey seed)
    nkey_seed: str = field(default="", metadata={"empty": True})  # an nkey seed file
    tls_ca: str = field(default="", metadata={"empty": True})  # CA bundle that signed the NATS servers
    tls_cert: str = field(default="", metadata={"empty": True})  # client certificate (mutual TLS)
    tls_key: str = field(default="", metadata={"empty": True})  # its private key
    tls_hostname: str = field(default="", metadata={"empty": True})  # the name the servers' certificates carry
    hello_ms: int = field(default=250, metadata={"min": 20})  # beacon interval: discovery and liveness
    route_liveness: int = field(default=4, metadata={"min": 2})  # beacons missed before a broker is gone
    # Patterns one other broker may announce here (its peers' subscriptions, deduplicated): past it the
    # rest are refused, counted (route_patterns_refused) and logged once per route.
    max_route_patterns: int = field(default=MAX_ROUTE_PATTERNS, metadata={"min": 1})
    reconnect_ms: int = field(default=200, metadata={"min": 10})  # between NATS reconnection attempts
    ping_ms: int = field(default=1_000, metadata={"min": 1000})  # NATS pings: a frozen server is left after 2
    # How long a write to a JetStream journal (a confirmed PUT's OK, a kept letter) waits for
    # the stream's acknowledgement, retries through a NATS failover included; then 504: stored
    # or not is unknown, and a re-send with the same MSGID is stored once.
    jetstream_timeout_ms: int = field(default=5_000, metadata={"min": 100})


@dataclass(frozen=True, slots=True)
class Config:
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    permissions: Permissions = field(default_factory=Permissions)
    http: HttpConfig = field(default_factory=HttpConfig)
    memodb: MemodbConfig = field(default_factory=MemodbConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # Where relative paths of a config file (keys_dir, allowed_dir, journal folders, key files)
    # resolve: "" = the config file's own folder; a relative data_dir is itself taken from there.
    # Without a config file they follow the current directory.
    data_dir: str = field(default="", metadata={"empty": True})
    # [journals.NAME] tables: which topics the broker keeps, and how (see mc0.broker.storage.filestore).
    journals: dict[str, JournalSettings] = field(default_factory=dict)
