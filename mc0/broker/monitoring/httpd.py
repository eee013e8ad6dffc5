"""The monitoring HTTP shell: the console (``/``), /healthz, /varz, /connz, /subsz, /servicez, /consumerz,
/journalz, /mailboxz (JSON) and /metrics (Prometheus), and the admin actions (``POST /admin/OP``:
:mod:`.actions`) when ``[http] admin_token_file`` names a token.

Contract: ``MonitorServer(listen, wake=...)`` does no I/O; ``start()`` binds
(``host:port``; port 0 picks one) and serves from one daemon thread;
``close()`` is idempotent.  The HTTP side never touches the broker's rooms
and never blocks the loop: each request raises a flag naming the parts of
the broker its page needs (``wanted_parts``) and wakes the loop (``wake``);
the loop copies them at the end of its turn (a :class:`Capture`:
``publish``) and the request waits for it at most ``SNAPSHOT_WAIT`` seconds.
The pages are built (``snapshot.build``, once per capture), rendered and
serialised here, on this side.  Every answer reflects the broker after its
request arrived (a capture taken before is never served to it); requests
waiting at once share the next capture, and the loop takes at most one per
``SNAPSHOT_INTERVAL``, and fewer as they cost more (the loop's copy and this
side's work are both counted: ``spent``; mc0.broker.server), so any number
of scrapers costs the broker a bounded share.  ``/healthz`` is 200 while the loop
answers within ``SNAPSHOT_WAIT`` (``degraded`` when a clustered broker lost
NATS, heard another broker under its own name, or while a JetStream
journal's local copy is stuck or broken), 503 when it is stalled.  The listening
socket's accept backlog is ``ACCEPT_BACKLOG`` (a scrape storm is queued, not
refused).  Process CPU and memory come from ``prometheus_client``'s process
collector, read on this thread.

Every request goes through ``serve``: a ``Host`` that is not the listener's
own (:mod:`.hosts`) is 421 before anything else; GET (and HEAD, its headers)
reads a page, POST does an action, any other method is 405; an unexpected
exception is a 500 of one line, written to the ``faults`` sink (once per
page and method and kind); every refusal is one line of JSON, http.server's
own (a bad request line, 414, 431) included; a connection that sends nothing
for ``REQUEST_TIMEOUT_S`` is closed, and after an answer what a client still
sends is drained (bounded) so that the close does not lose the answer.

``PAGE_TABLE`` names every page and what renders it, one line per path: a
function of the listener, the snapshot and the query, which the page's row
of :mod:`.queries` parsed (400 naming the parameter for anything not as
documented) before a snapshot is asked for; the console's files
(``CONSOLE_FILES``) come from the installed package
(``mc0/broker/monitoring/console``, package data) with a
Content-Security-Policy that lets the page load and fetch from this origin
only.  Each page is rendered once per snapshot and parsed query (at most
``RENDERS_KEPT`` kept).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from ipaddress import ip_address
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from ...errors import ConfigError
from ...protocol.jetstream import COPY_BROKEN, COPY_STATES, COPY_STUCK
from . import actions
from .hosts import MISDIRECTED, HostRule
from .queries import PAGES, BadQuery, Value, parse_query
from .snapshot import PAGE_PARTS, SUBS, Capture, Snapshot, build, connz, consumerz, subsz

log = logging.getLogger("mc0.broker.http")

SNAPSHOT_WAIT = 1.0  # seconds a request waits for the loop before /healthz says stalled
DEFAULT_PORT = 8222  # nats-server's monitoring port
RENDERS_KEPT = 32  # pages rendered per snapshot (one per path and query): kept, at most
# The console: one page and its two files, shipped in the package (mc0/broker/monitoring/console/).
CONSOLE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/console.css": ("console.css", "text/css; charset=utf-8"),
    "/console.js": ("console.js", "text/javascript; charset=utf-8"),
}
# The console loads, fetches and shows nothing but what this listener serves; no inline script runs.
CONSOLE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
ACCEPT_BACKLOG = 1024  # connections the kernel queues before they are accepted (http.server's default: 5)
# A connection that sends nothing (or not the body its Content-Length promised) for this long is closed:
# each one holds a thread (http.server's default: never).
REQUEST_TIMEOUT_S = 10.0
# After an answer, what a client still sends is read and dropped (so that the close does not reset the
# connection and lose the answer) for at most this long and this much.
LINGER_S = 1.0
LINGER_BYTES = 16 << 20
MISDIRECTED_LOGGED = 16  # distinct Host values answered 421 that the log names (the rest are counted)
SERVED = ("GET", "HEAD", "POST")  # the methods answered; any other is 405 (after the Host check, as every request)
OTHER_METHODS = ("PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT")
Reply = tuple[int, dict[str, str], bytes]  # (status, headers, body)


class FaultSink(Protocol):
    """Where an unexpected exception in a request's handling is written (``mc0.broker.faultlog.FaultLog``:
    the first of a kind with its traceback, the same again a line a minute); called under a lock."""

    def fault(self, step: str, exc: BaseException, now: float) -> bool: ...


class _EveryFault:
    """The sink without a FaultLog given: each fault, with its traceback."""

    def fault(self, step: str, exc: BaseException, now: float) -> bool:
        log.error("internal error in the monitoring listener (%s)", step, exc_info=exc)
        return True


class _HttpServer(ThreadingHTTPServer):
    request_queue_size = ACCEPT_BACKLOG
    daemon_threads = True

    def shutdown_request(self, request: Any) -> None:
        """Close after the answer without losing it: a body the client is still sending (refused before
        it was read: 421, 415, 400 for one too large) would make the close a reset, which can discard
        the answer at the client; so the sending side is shut first and what comes in is read and
        dropped, for at most ``LINGER_S`` and ``LINGER_BYTES``, until the client closes."""
        try:
            request.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + LINGER_S
            left = LINGER_BYTES
            while left > 0 and (wait := deadline - time.monotonic()) > 0:
                request.settimeout(wait)
                chunk = request.recv(min(1 << 16, left))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:  # (a reset, a timeout: nothing more to save)
            pass
        self.close_request(request)


class _HttpServer6(_HttpServer):
    address_family = socket.AF_INET6  # (http.server's is AF_INET: an IPv6 address would not bind)


def parse_listen(text: str) -> tuple[str, int]:
    """``host:port``, ``:port`` or ``port`` (host 127.0.0.1) -> (host, port); ConfigError otherwise."""
    example = "e.g. 127.0.0.1:8222"
    raw = text.strip()
    if "://" in raw:
        raise ConfigError("http.listen", f"{text!r} is host:port without a scheme ({example})")
    host, sep, port_text = raw.rpartition(":") if ":" in raw else ("", "", raw)
    host = host.strip("[]") or "127.0.0.1"
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError("http.listen", f"{text!r}: the port must be a number 0-65535 ({example})")
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def _json(data: object) -> bytes:
    # Compact: json's C encoder serves only calls without ``indent`` (with it, a /connz page of 1,000
    # rows took the pure-Python encoder ~10x as long, holding the interpreter the loop needs).
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def one_line(status: int, error: str) -> Reply:
    """A refusal or a failure: ``{"error": ...}`` on one line (json escapes any newline in ``error``)."""
    return status, {"Content-Type": "application/json"}, json.dumps({"error": error}).encode() + b"\n"


def write_reply(request: BaseHTTPRequestHandler, reply: Reply) -> None:
    """``reply`` on ``request``'s connection (HEAD: its headers, no body); a client gone is not an error."""
    status, headers, body = reply
    try:
        request.send_response(status)
        for name, value in headers.items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(body)))
        request.send_header("X-Content-Type-Options", "nosniff")
        request.end_headers()
        if request.command != "HEAD":
            request.wfile.write(body)
    except OSError:  # the client went away: nothing to answer
        request.close_connection = True


def process_figures() -> dict[str, float]:
    """This process's CPU seconds and resident memory (read on the HTTP thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    figures = {"cpu_s": round(usage.ru_utime + usage.ru_stime, 3), "max_rss_bytes": usage.ru_maxrss * 1024}
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            figures["rss_bytes"] = int(statm.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        figures["rss_bytes"] = figures["max_rss_bytes"]
    return figures


class _Collector(Collector):
    """The broker's figures as Prometheus metric families, from the newest snapshot."""

    def __init__(self, server: MonitorServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        snap = self.server.rendering  # (rendered under the server's render lock)
        if snap is None:
            return
        varz = snap.varz
        for name, key, doc in (
            ("mc0_connections", "connections", "Connected peers."),
            ("mc0_subscriptions", "subscriptions", "Subscription patterns held."),
            ("mc0_services", "services", "RPC services known."),
            ("mc0_pending_bytes", "pending_bytes", "Bytes queued by the broker for peers."),
            ("mc0_uptime_seconds", "uptime_s", "Seconds since the broker started."),
        ):
            yield GaugeMetricFamily(name, doc, value=float(varz[key]))  # type: ignore[arg-type]
        for name, key, doc in (
            ("mc0_in_messages", "in_msgs", "Messages received."),
            ("mc0_in_bytes", "in_bytes", "Message body bytes received."),
            ("mc0_out_messages", "out_msgs", "Messages sent (a BATCH counts once)."),
            ("mc0_out_bytes", "out_bytes", "Bytes sent."),
            ("mc0_delivered", "delivered", "Messages delivered to subscribers."),
            ("mc0_dropped", "dropped", "Messages dropped for peers over their queue budget."),
            ("mc0_slow_consumers", "slow_consumers", "Peers evicted as slow consumers."),
        ):
            yield CounterMetricFamily(name, doc, value=float(varz[key]))  # type: ignore[arg-type]
        events = CounterMetricFamily("mc0_events", "Every broker counter, by name.", labels=["event"])
        for event, count in snap.counters.items():
            events.add_metric([event], float(count))
        yield events
        gauges = {
            key: GaugeMetricFamily(f"mc0_service_{key}", f"Per service: {key.replace('_', ' ')}.", labels=["service"])
            for key in ("workers", "idle", "queued", "in_flight")
        }
        counters = {
            key: CounterMetricFamily(f"mc0_service_{key}", f"Per service: {key}.", labels=["service"])
            for key in ("requests", "served", "errors", "timeouts")
        }
        latency = HistogramMetricFamily(
            "mc0_service_latency_seconds", "Request to answer, per service.", labels=["service"]
        )
        for service, row in snap.servicez.items():
            for key, gauge in gauges.items():
                gauge.add_metric([service], float(row[key]))  # type: ignore[arg-type]
            for key, counter in counters.items():
                counter.add_metric([service], float(row[key]))  # type: ignore[arg-type]
            buckets, total = snap.latency.get(service, ([], 0.0))
            if buckets:
                latency.add_metric(
                    [service], [("+Inf" if b == float("inf") else repr(b), float(c)) for b, c in buckets], total
                )
        yield from gauges.values()
        yield from counters.values()
        yield latency
        first = GaugeMetricFamily("mc0_journal_first_seq", "A journal's first kept record.", labels=["journal"])
        end = GaugeMetricFamily("mc0_journal_end_seq", "A journal's next sequence number.", labels=["journal"])
        journals: dict[str, dict[str, Any]] = varz["journals"]  # type: ignore[assignment]
        for name, info in journals.items():
            first.add_metric([name], float(info.get("first_seq", 0)))
            end.add_metric([name], float(info.get("end_seq", info.get("next_seq", 0))))
        yield first
        yield end
        yield from store_metrics(snap)
        cluster = snap.varz.get("cluster")
        cluster = cluster if isinstance(cluster, dict) else {}
        member = float(bool(cluster.get("name")))
        yield GaugeMetricFamily("mc0_cluster_member", "1 when this broker is in a cluster, else 0.", value=member)
        yield GaugeMetricFamily(
            "mc0_nats_connected", "1 while the cluster link is connected to NATS (0 standalone).",
            value=float(bool(cluster.get("nats_connected"))),
        )  # fmt: skip
        brokers = float(len(cluster.get("brokers") or ()))
        yield GaugeMetricFamily("mc0_cluster_brokers", "Other brokers with a route here.", value=brokers)


def store_metrics(snap: Snapshot) -> Iterator[Metric]:
    """Durable consumers' backlogs and journals' sizes, labelled by name (from /consumerz, /journalz)."""
    by = ["journal", "consumer"]
    pending = GaugeMetricFamily("mc0_consumer_pending", "Stored records a consumer has yet to be handed.", labels=by)
    ack_pending = GaugeMetricFamily("mc0_consumer_ack_pending", "Records handed to a consumer, not acked.", labels=by)
    for row in snap.consumerz.get("consumers", ()):  # type: ignore[attr-defined]
        labels = [str(row["journal"]), str(row["name"])]
        pending.add_metric(labels, float(row["num_pending"]))
        ack_pending.add_metric(labels, float(row["num_ack_pending"]))
    records = GaugeMetricFamily("mc0_journal_records", "Records a journal keeps.", labels=["journal"])
    size = GaugeMetricFamily("mc0_journal_bytes", "Bytes a journal keeps (this broker's copy).", labels=["journal"])
    lag = GaugeMetricFamily(
        "mc0_journal_copy_lag", "Records a JetStream journal's stream is known to hold past this broker's copy.",
        labels=["journal"],
    )  # fmt: skip
    state = GaugeMetricFamily(
        "mc0_journal_copy_state", "1 for the state a JetStream journal's local copy is in, 0 for the others.",
        labels=["journal", "state"],
    )  # fmt: skip
    for row in snap.journalz.get("journals", ()):  # type: ignore[attr-defined]
        name = str(row["name"])
        records.add_metric([name], float(row.get("records", 0)))
        size.add_metric([name], float(row.get("bytes", 0)))
        if "copy_state" in row:  # (a JetStream journal's copy; none for letters)
            lag.add_metric([name], float(row["copy_lag"]))
            for each in COPY_STATES:
                state.add_metric([name, each], float(row["copy_state"] == each))
    yield from (pending, ack_pending, records, size, lag, state)


def stuck_copies(snap: Snapshot) -> list[str]:
    """The JetStream journals whose local copy is stuck or broken, each with why (/healthz)."""
    rows = snap.journalz.get("journals", ())
    return [
        f"journal {row['name']}: its local copy is {row['copy_state']}: {row.get('copy_reason', '')}"
        for row in rows  # type: ignore[attr-defined]
        if row.get("copy_state") in (COPY_STUCK, COPY_BROKEN)
    ]


# ------------------------------------------------------------ the pages
Query = Mapping[str, Value]  # a page's query, parsed by its row of queries.PAGES


@dataclass(frozen=True, slots=True)
class Page:
    """What renders one path from a snapshot: ``body(listener, snapshot, query)`` -> the body, served as
    ``content_type`` (with ``Cache-Control: no-store``; rendered once per snapshot and query)."""

    body: Callable[[MonitorServer, Snapshot, Query], bytes]
    content_type: str = "application/json"


def json_page(data: Callable[[MonitorServer, Snapshot, Query], object]) -> Page:
    """A JSON page: what ``data`` returns (JSON-ready), serialised compact with its keys sorted."""
    return Page(lambda server, snap, query: _json(data(server, snap, query)))


def healthz(server: MonitorServer, snap: Snapshot, query: Query) -> dict[str, object]:
    """``ok``; ``degraded`` (200: the broker serves its own peers) with the reason; 503 ``stalled`` is the
    listener's, when no snapshot came in time."""
    cluster = snap.varz.get("cluster")
    cluster = cluster if isinstance(cluster, dict) else {}
    namesake = cluster.get("name_collision")
    # Cut off from NATS the broker still serves its own peers: degraded, not down (200).  So does a
    # broker another one is named as, but the cluster loses traffic between them until one is renamed.
    if cluster.get("name") and not cluster.get("nats_connected"):
        return {"status": "degraded", "reason": "NATS unreachable"}
    if isinstance(namesake, dict):
        reason = f"another broker is also named {namesake['name']} (names must be unique in a cluster)"
        return {"status": "degraded", "reason": reason, "name_collision": namesake}
    if stuck := stuck_copies(snap):  # (replays and fetches there end with 504 at the copy's end)
        return {"status": "degraded", "reason": "; ".join(stuck)}
    return {"status": "ok"}


def varz(server: MonitorServer, snap: Snapshot, query: Query) -> dict[str, object]:
    """The snapshot's figures, and the listener's own: the version, whether actions are on, the process's."""
    return {**snap.varz, "version": server.version, "actions": server.actions, **process_figures()}


def metrics(server: MonitorServer, snap: Snapshot, query: Query) -> bytes:
    """Prometheus text: the listener's registry, whose collector reads ``server.rendering`` (this snapshot)."""
    return generate_latest(server.registry)


# Every path the listener serves from a snapshot, one line each, and what renders it (as nats-server's
# mux.HandleFunc list).  A path's query parameters are its row in queries.PAGES (every path there is one of
# these or of CONSOLE_FILES); what the loop copies for it, its row in snapshot.PAGE_PARTS (none: what every
# capture has); its figures, the Snapshot's fields (snapshot.build).  docs/ARCHITECTURE.md, "Extending".
PAGE_TABLE: dict[str, Page] = {
    "/healthz": json_page(healthz),
    "/varz": json_page(varz),
    "/connz": json_page(lambda server, snap, query: connz(snap, query)),
    "/subsz": json_page(lambda server, snap, query: subsz(snap, query)),
    "/servicez": json_page(lambda server, snap, query: snap.servicez),
    "/consumerz": json_page(lambda server, snap, query: consumerz(snap, query)),
    "/journalz": json_page(lambda server, snap, query: snap.journalz),
    "/mailboxz": json_page(lambda server, snap, query: snap.mailboxz),
    "/metrics": Page(metrics, CONTENT_TYPE_LATEST),
}
PATHS = tuple(PAGE_TABLE)  # (the index GET / gives a client that asks JSON; a 404 names them)


class MonitorServer:
    def __init__(
        self,
        listen: str,
        *,
        wake: Callable[[], None],
        admin_token_file: str = "",
        allowed_hosts: tuple[str, ...] = (),
        faults: FaultSink | None = None,
    ) -> None:
        """``admin_token_file``: the token of the admin actions ("" = none: every POST is 403);
        ``allowed_hosts``: names a request's Host may give besides the listener's address and
        localhost (ConfigError naming ``http.allowed_hosts`` for one that is no name); ``faults``:
        where an unexpected exception in a request is written."""
        self.host, self.port = parse_listen(listen)
        self.hosts = HostRule(self.host, allowed_hosts)
        self._faults: FaultSink = faults if faults is not None else _EveryFault()
        self._faults_lock = threading.Lock()
        self.misdirected = 0  # requests answered 421 (a Host not ours)
        self._misdirected_named: set[str] = set()  # the Host values logged (at most MISDIRECTED_LOGGED)
        self._wake = wake
        self._token_file = admin_token_file
        self.admin: actions.AdminDoor | None = None  # the actions' door to the loop (start() opens it)
        self.actions: bool = False  # /varz "actions": the admin actions are on (a console shows them)
        self._latest: Capture | None = None
        self._wanted = False
        self.wanted_parts: frozenset[str] = frozenset()  # what the waiting requests' pages need copied
        # Seconds this side spent building and rendering, in all (only grows; added to under the render
        # lock): the loop reads it without a lock and counts what it grew by since its last read, so an
        # addition between its read and a reset is never lost (there is no reset).
        self.spent = 0.0
        self._built: Snapshot | None = None  # the latest capture built (once per capture)
        self._fresh = threading.Condition()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.registry = CollectorRegistry(auto_describe=False)  # filled by start() (the process collector reads /proc)
        self._render_lock = threading.Lock()
        self._rendered_for: Snapshot | None = None
        self._rendered: dict[str, tuple[int, str, bytes]] = {}
        self.rendering: Snapshot | None = None  # the snapshot /metrics is rendered from (the collector reads it)
        self.url = ""
        self.version: str = "unknown"  # (annotated: PAGE_TABLE's renderers, above the class, read it)
        self._console: dict[str, bytes] = {}  # the console's files, read from the package once

    # ------------------------------------------------------------ loop side
    @property
    def wanted(self) -> bool:
        """True when a request waits for a snapshot (read by the loop each turn: one attribute)."""
        return self._wanted

    def publish(self, capture: Capture) -> None:
        with self._fresh:
            self._latest = capture
            self._wanted = False
            self.wanted_parts = frozenset()
            self._fresh.notify_all()

    # ------------------------------------------------------------ HTTP side
    def current(self, parts: frozenset[str] = frozenset(), max_age: float = 0.0) -> Snapshot | None:
        """A snapshot of a capture the loop took after this call began (or at most ``max_age``
        seconds before), with ``parts`` copied (waits <= SNAPSHOT_WAIT for it); None when the loop
        did not answer in time."""
        # (The building happens after this lock is let go: ``publish``, on the loop, takes it.)
        with self._fresh:
            asked = time.monotonic() - max_age  # (the loop's clock too: a capture's ``taken``)
            latest = self._latest
            if not (max_age and latest is not None and latest.taken >= asked and parts <= latest.parts):
                self._ask(parts)
                deadline = asked + max_age + SNAPSHOT_WAIT
                while self._latest is None or self._latest.taken < asked or not parts <= self._latest.parts:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    if not self._wanted:  # one taken too early, or without these parts, came: ask again
                        self._ask(parts)
                    self._fresh.wait(left)
                latest = self._latest
        return self._snapshot_of(latest)

    def _ask(self, parts: frozenset[str]) -> None:
        self.wanted_parts = self.wanted_parts | parts
        self._wanted = True
        self._wake()

    def _snapshot_of(self, capture: Capture) -> Snapshot:
        """The capture built into pages' data, once (the requests that share it wait for one build)."""
        with self._render_lock:
            built = self._built
            if built is None or built.taken != capture.taken or built.parts != capture.parts:
                started = time.perf_counter()
                built = self._built = build(capture)
                self.spent += time.perf_counter() - started
            return built

    def start(self) -> str:
        if self._httpd is not None:
            return self.url
        if not is_loopback(self.host):
            log.warning(
                "monitoring on %s:%d is reachable beyond this machine and has no authentication", self.host, self.port
            )
        if self._token_file:  # (ConfigError naming http.admin_token_file: before the port is taken)
            self.admin = actions.AdminDoor(actions.read_token(self._token_file), wake=self._wake)
            self.actions = True
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes
        self.registry.register(_Collector(self))
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = REQUEST_TIMEOUT_S

            def serve(self) -> None:  # (SERVED and OTHER_METHODS: the latter are 405)
                server.serve(self)

            def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
                """http.server's own refusals (a bad request line, 414, 431) as one line of JSON, with a
                status line (a line it could not read leaves the version at HTTP/0.9: the body alone)."""
                self.close_connection = True
                if self.request_version == "HTTP/0.9":
                    self.request_version = "HTTP/1.0"
                write_reply(self, one_line(code, message or self.responses.get(code, ("error",))[0]))

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                log.debug("http %s", format % args)

        for method in (*SERVED, *OTHER_METHODS):
            setattr(Handler, f"do_{method}", Handler.serve)

        try:
            kind = _HttpServer6 if ":" in self.host else _HttpServer
            self._httpd = kind((self.host, self.port), Handler)
        except OSError as exc:
            raise ConfigError(
                "http.listen", f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None
        self.port = self._httpd.server_address[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{self.port}"
        try:
            self.version = importlib.metadata.version("mc0")
        except importlib.metadata.PackageNotFoundError:  # run from a source tree without installing
            self.version = "unknown"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="mc0-http", daemon=True)
        self._thread.start()
        log.info("monitoring on %s", self.url)
        if self.admin is not None:
            log.info("admin actions on %s/admin/OP (the token in %s)", self.url, self._token_file)
        return self.url

    def serve(self, request: BaseHTTPRequestHandler) -> None:
        """Every request (on its handler's thread): refused unless its Host is ours (:mod:`.hosts`), else
        answered by its method (GET and HEAD: a page, POST: an action, any other: 405); an unexpected
        exception is a 500 of one line (written to the faults once), never a connection closed without
        an answer."""
        answer = {"GET": self._get, "HEAD": self._get, "POST": self._post}.get(request.command, self._not_allowed)
        try:
            local = str(request.connection.getsockname()[0])
            hosts = request.headers.get_all("Host") or []
            refusal = self.hosts.refusal(hosts, local, request.request_version)
            if refusal is not None and refusal[0] == MISDIRECTED:
                self._misdirected(hosts[0])
            reply = one_line(*refusal) if refusal is not None else answer(request)
        except Exception as exc:  # noqa: BLE001 - whatever it was, the client gets an answer
            page = request.path.partition("?")[0].rstrip("/") or "/"
            step = f"{request.command} {page if page in PAGES else 'another path'}"  # (not the query: one kind)
            with self._faults_lock:
                self._faults.fault(step, exc, time.monotonic())
            reply = one_line(500, f"internal error ({type(exc).__name__}): the broker's log has the details")
        write_reply(request, reply)

    def _misdirected(self, host: str) -> None:
        """A request for a name that is not ours: the first few names are logged (a scraper or proxy that
        uses a DNS name gets 421 until it is listed: the operator should see why), the rest counted."""
        with self._faults_lock:
            self.misdirected += 1
            if len(self._misdirected_named) >= MISDIRECTED_LOGGED or host in self._misdirected_named:
                return
            self._misdirected_named.add(host)
        log.warning(
            "monitoring: refused a request for the host %r (421): if it names this broker, list it in "
            "[http] allowed_hosts (at most %d such names are logged)",
            host[:80],
            MISDIRECTED_LOGGED,
        )

    def _not_allowed(self, request: BaseHTTPRequestHandler) -> Reply:
        status, headers, body = one_line(
            405, f"{request.command} is not served here: GET (or HEAD) a page, POST an action"
        )
        return status, {**headers, "Allow": ", ".join(SERVED)}, body

    def _post(self, request: BaseHTTPRequestHandler) -> Reply:
        """An admin action (:mod:`.actions`): refused, or handed to the loop and answered with its outcome."""
        path = request.path.split("?", 1)[0]
        origins = actions.own_origins(self.host, self.port, request.headers.get("Host"))
        client = request.client_address[:2]
        status, data = actions.respond(
            self.admin, path, request.headers.get, request.rfile.read, (str(client[0]), int(client[1])), origins
        )
        if status >= 400 and set(data) == {"error"}:
            return one_line(status, str(data["error"]))
        return status, {"Content-Type": "application/json"}, _json(data)

    def _get(self, request: BaseHTTPRequestHandler) -> Reply:
        """GET (or HEAD) ``request.path`` (path and query) -> (status, headers, body)."""
        return self._page(request.path, request.headers.get("Accept", ""))

    def _page(self, target: str, accept: str) -> Reply:
        """GET ``target`` (path and query; ``accept``: the request's Accept) -> (status, headers, body): a
        page of ``PAGE_TABLE``, a console file, or the index of pages; 404, 400 (a bad query), 503 (no
        snapshot within ``SNAPSHOT_WAIT``) otherwise."""
        raw_path, _, raw_query = target.partition("?")
        path = raw_path.rstrip("/") or "/"
        if path not in PAGES:
            return one_line(404, f"pages: /, {', '.join(PATHS)}")
        try:
            query = parse_query(path, raw_query)
        except BadQuery as exc:
            return one_line(400, str(exc))
        if path == "/" and "application/json" in accept and "text/html" not in accept:
            return 200, {"Content-Type": "application/json"}, _json({"endpoints": list(PATHS), "console": "/"})
        if path in CONSOLE_FILES:
            return self._console_file(path)
        parts = PAGE_PARTS.get(path, frozenset())
        if query.get("subs"):
            parts = parts | {SUBS}
        max_age = int(query.get("max_age_ms", 0)) / 1000.0
        snap = self.current(parts, max_age)  # requests waiting at once share one
        if snap is None:
            reason = f"the broker loop did not answer in {SNAPSHOT_WAIT}s"
            return 503, {"Content-Type": "application/json"}, _json({"status": "stalled", "reason": reason})
        # (parsed: one key per meaning; max_age_ms changes which snapshot, never what a page of it is)
        key = path + "?" + "&".join(f"{k}={v}" for k, v in sorted(query.items()) if k != "max_age_ms")
        with self._render_lock:  # one render at a time, each page once per snapshot and query
            if snap is not self._rendered_for:
                self._rendered_for, self._rendered = snap, {}
            rendered = self._rendered.get(key)
            if rendered is None:
                self.rendering = snap
                started = time.perf_counter()
                page = PAGE_TABLE[path]
                rendered = (200, page.content_type, page.body(self, snap, query))
                self.spent += time.perf_counter() - started
                if len(self._rendered) < RENDERS_KEPT:
                    self._rendered[key] = rendered
        status, content_type, body = rendered
        return status, {"Content-Type": content_type, "Cache-Control": "no-store"}, body

    def _console_file(self, path: str) -> Reply:
        name, content_type = CONSOLE_FILES[path]
        body = self._console.get(name)
        if body is None:
            body = self._console[name] = resources.files(__package__).joinpath("console", name).read_bytes()
        headers = {"Content-Type": content_type, "Content-Security-Policy": CONSOLE_POLICY, "Cache-Control": "no-cache"}
        return 200, headers, body

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
