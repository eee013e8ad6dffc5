"""Monitoring: the latency histogram (one definition of a percentile), ``--http`` parsing, and the
HTTP pages and Prometheus ``/metrics`` of a live broker process under traffic; /varz is fresh right
after each connect, and the listener queues a burst of connections instead of refusing them."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

import mc0
from mc0 import ports
from mc0.broker.core.histogram import Histogram
from mc0.broker.monitoring.httpd import parse_listen
from mc0.errors import ConfigError
from mc0.process import BrokerProcess

from .conftest import RawPeer
from .test_rpc_live import WorkerProcess

# ------------------------------------------------------------ histogram


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 0.5, None),
        ([0.003], 0.5, 0.0025 + (0.005 - 0.0025) * 0.5),  # one value: the middle of its bucket
        ([0.003, 0.003], 1.0, 0.005),
        ([0.0001] * 10, 0.5, 0.00005),  # the first bucket starts at 0
        ([0.001] * 50 + [0.1] * 50, 0.5, 0.001),  # rank 50 is the top of the 1 ms bucket
        ([0.001] * 50 + [0.1] * 50, 0.99, 0.05 + 0.05 * 49 / 50),
        ([100.0], 0.5, 60.0),  # +Inf: the largest finite bound, as PromQL
    ],
)
def test_quantile_is_promql_histogram_quantile(values: list[float], q: float, expected: float | None) -> None:
    h = Histogram()
    for v in values:
        h.observe(v)
    got = h.quantile(q)
    assert got == (None if expected is None else pytest.approx(expected))


def test_histogram_buckets_are_cumulative_and_bounds_checked() -> None:
    h = Histogram((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 3.0):
        h.observe(v)
    assert h.cumulative() == [(1.0, 2), (2.0, 3), (float("inf"), 4)]
    assert h.sum == pytest.approx(6.0)
    assert h.percentiles_ms() == {"p50": 1000.0, "p95": 2000.0, "p99": 2000.0}
    for bad in ((), (2.0, 1.0), (1.0, 1.0)):
        with pytest.raises(ValueError):
            Histogram(bad)
    with pytest.raises(ValueError):
        h.quantile(1.5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8222", ("127.0.0.1", 8222)),
        (":8222", ("127.0.0.1", 8222)),
        ("8222", ("127.0.0.1", 8222)),
        ("[::1]:0", ("::1", 0)),
        ("0.0.0.0:9", ("0.0.0.0", 9)),
        ("http://127.0.0.1:8222", "without a scheme"),
        ("127.0.0.1:port", "must be a number"),
        ("127.0.0.1:70000", "must be a number"),
        ("", "must be a number"),
    ],
)
def test_parse_listen(text: str, expected: tuple[str, int] | str) -> None:
    if isinstance(expected, tuple):
        assert parse_listen(text) == expected
    else:
        with pytest.raises(ConfigError, match=expected):
            parse_listen(text)


def test_every_page_has_a_renderer_a_row_of_parameters_and_only_its_own_parts() -> None:
    """The page table (httpd.PAGE_TABLE, one line per path) and the two tables beside it name the same
    pages: each path of queries.PAGES is rendered or is the console's; snapshot.PAGE_PARTS names only
    pages of the table (a page without a row copies what every capture has)."""
    from mc0.broker.monitoring import httpd, queries, snapshot

    assert set(queries.PAGES) == {*httpd.PAGE_TABLE, *httpd.CONSOLE_FILES}
    assert not set(httpd.PAGE_TABLE) & set(httpd.CONSOLE_FILES)
    assert set(snapshot.PAGE_PARTS) <= set(httpd.PAGE_TABLE)
    assert httpd.PATHS == tuple(httpd.PAGE_TABLE) and httpd.PATHS[0] == "/healthz"  # (the JSON index's order)


# ------------------------------------------------------------ live


def _free_port() -> int:
    return ports.free_port()  # leased below the ephemeral range: no other process takes it meanwhile


def _get(url: str, accept: str = "") -> tuple[int, str, str]:
    try:
        request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def _metrics(base: str) -> dict[str, Any]:
    status, content_type, text = _get(base + "/metrics")
    assert status == 200 and content_type.startswith("text/plain"), (status, content_type)
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_http_pages_and_metrics_under_traffic() -> None:
    port = _free_port()
    with BrokerProcess("--http", f"127.0.0.1:{port}", insecure=True) as broker:
        base = f"http://127.0.0.1:{port}"
        worker = WorkerProcess(broker.endpoint, "answer", "calc", ttl=0.5)
        stop = threading.Event()
        published = [0]

        def publish() -> None:  # steady traffic (~10k/s) while the pages are read, for at most 30 s
            deadline = time.monotonic() + 30
            with mc0.Client(broker.endpoint) as client:
                while not stop.is_set() and time.monotonic() < deadline:
                    for _ in range(100):
                        client.publish("load.x", b"x" * 100)
                    published[0] += 100
                    stop.wait(0.01)

        try:
            with mc0.Client(broker.endpoint) as client, client.subscribe("load.>") as sub:
                publisher = threading.Thread(target=publish, daemon=True)
                publisher.start()
                sub.next(timeout=5)  # traffic flows
                for _ in range(20):
                    assert client.request("calc", b"1", timeout=5) is not None
                assert _get(base + "/healthz")[:1] == (200,)
                assert json.loads(_get(base + "/healthz")[2]) == {"status": "ok"}
                varz = json.loads(_get(base + "/varz")[2])
                assert varz["connections"] >= 3 and varz["subscriptions"] >= 1
                assert varz["in_msgs"] > 0 and varz["in_bytes"] > 0 and varz["out_msgs"] > 0
                assert varz["rss_bytes"] > 0 and varz["cpu_s"] > 0 and varz["version"]
                connz = json.loads(_get(base + "/connz")[2])
                names = [c["name"] for c in connz["connections"]]
                assert connz["count"] == len(names) >= 3
                assert all("#" in n for n in names)  # identity#n, never a routing id
                assert any(c["services"] == ["calc"] for c in connz["connections"])
                subsz = json.loads(_get(base + "/subsz")[2])
                assert subsz["patterns"].get("load.>") == 1
                servicez = json.loads(_get(base + "/servicez")[2])
                assert servicez["calc"]["served"] >= 20 and servicez["calc"]["latency_ms"]["p50"] > 0
                assert _get(base + "/nope")[0] == 404
                # /connz: each peer's address, connected time and traffic; sorted and paged on request.
                by_traffic = json.loads(_get(base + "/connz?sort=msgs_in&limit=1")[2])
                (busiest,) = by_traffic["connections"]
                assert busiest["msgs_in"] > 0 and busiest["address"].startswith("127.0.0.1:")
                assert busiest["connected_at"].endswith("Z") and by_traffic["count"] >= 3
                assert _get(base + "/connz?sort=nope")[0] == 400
                with mc0.Client(broker.endpoint) as brief:
                    brief.publish("load.brief", b"x", confirm=True)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:  # (the broker learns of the close in a moment)
                    closed = json.loads(_get(base + "/connz?state=closed")[2])["connections"]
                    if closed:
                        break
                    time.sleep(0.05)
                assert closed[0]["reason"] == "disconnected" and closed[0]["msgs_in"] >= 1, closed
                for page in ("/consumerz", "/journalz", "/mailboxz"):
                    assert _get(base + page)[0] == 200

                families = _metrics(base)
                latency = families["mc0_service_latency_seconds"]
                samples = {(s.name, s.labels.get("le")): s.value for s in latency.samples}
                assert samples[("mc0_service_latency_seconds_count", None)] >= 20
                assert samples[("mc0_service_latency_seconds_bucket", "+Inf")] >= 20
                assert families["mc0_connections"].samples[0].value >= 3
                assert families["mc0_nats_connected"].samples[0].value == 0  # standalone
                assert families["process_resident_memory_bytes"].samples[0].value > 0
                first = families["mc0_in_messages"].samples[0].value
                # Counters move with traffic (poll: the traffic takes a moment to arrive).
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and _metrics(base)["mc0_in_messages"].samples[0].value <= first:
                    time.sleep(0.05)
                assert _metrics(base)["mc0_in_messages"].samples[0].value > first
                # mc0 stats and /metrics: one definition of a percentile (same buckets, same estimate).
                stats = client.request("mc0.broker", b"services", timeout=5)
                p50 = json.loads(stats.body)["calc"]["latency_ms"]["p50"]
                assert p50 > 0
        finally:
            stop.set()
            worker.close()


def test_http_is_off_by_default_and_refuses_a_taken_port() -> None:
    port = _free_port()
    with BrokerProcess(insecure=True):
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with pytest.raises(mc0.Error, match=f"http.listen.*127.0.0.1:{busy}"):
            BrokerProcess("--http", f"127.0.0.1:{busy}", insecure=True).start()


def test_a_stalled_loop_is_503_on_healthz_within_about_a_second() -> None:
    from mc0.broker.monitoring.httpd import MonitorServer

    asked = threading.Event()
    server = MonitorServer("127.0.0.1:0", wake=asked.set)  # a loop that never publishes
    server.start()
    try:
        start = time.monotonic()
        status, _, text = _get(server.url + "/healthz")
        assert status == 503 and json.loads(text)["status"] == "stalled"
        assert asked.is_set() and server.wanted and time.monotonic() - start < 3.0
        assert _get(server.url + "/metrics")[0] == 503
        # The index of pages, for a client that asks JSON; the console (GET /) needs no snapshot.
        assert json.loads(_get(server.url + "/", "application/json")[2])["endpoints"][0] == "/healthz"
        status, content_type, page = _get(server.url + "/")
        assert status == 200 and content_type.startswith("text/html") and "console.js" in page
    finally:
        server.close()
        server.close()  # idempotent


# ---------------------------------------------------------------- fresh figures, a burst of scrapers
@pytest.mark.timeout(60)
def test_varz_right_after_each_connect_counts_it(zctx: zmq.Context[Any]) -> None:
    """Item 13: /varz showed the snapshot made for the previous request (connections 0 right
    after a peer connected)."""
    port = _free_port()
    with BrokerProcess("--http", f"127.0.0.1:{port}", insecure=True) as broker:
        base = f"http://127.0.0.1:{port}"
        peers = []
        for i in range(1, 21):
            peer = RawPeer(broker.endpoint, zctx)
            assert peer.connect()[0] == b"OK"  # the broker has the session now
            peers.append(peer)
            status, _, text = _get(base + "/varz")
            assert status == 200 and json.loads(text)["connections"] == i
            assert json.loads(_get(base + "/connz")[2])["count"] == i
        for peer in peers:
            peer.close()


@pytest.mark.timeout(30)
def test_the_monitoring_listener_queues_a_burst_of_connections_instead_of_refusing_them() -> None:
    """Item 16: the accept backlog was 5 (http.server's default): a scrape storm met refusals.
    The server stops accepting (its thread ends; the socket still listens) and 200 clients
    connect at once: the kernel completes every handshake into the backlog."""
    from mc0.broker.monitoring.httpd import MonitorServer

    server = MonitorServer("127.0.0.1:0", wake=lambda: None)
    server.start()
    assert server._httpd is not None
    server._httpd.shutdown()  # no more accept() calls; the listening socket stays open
    clients = [socket.socket() for _ in range(200)]
    try:
        for client in clients:
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", server.port))
        pending = set(clients)
        deadline = time.monotonic() + 5
        while pending and time.monotonic() < deadline:  # bounded: each round waits at most 0.1 s
            _, writable, _ = select.select([], list(pending), [], 0.1)
            for client in writable:
                assert client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                pending.discard(client)
        assert not pending, f"{len(pending)} of 200 connections never completed"
    finally:
        for client in clients:
            client.close()
        server.close()


# ---------------------------------------------------------------- JetStream journals' local copies (issue 40)
def copy_row(name: str, state: str, lag: int, reason: str = "") -> dict[str, object]:
    return {"name": name, "store": "jetstream", "records": 3, "bytes": 30, "copy_state": state, "copy_lag": lag,
            "copy_reason": reason, "copy_stuck_times": int(state == "stuck")}  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "health"),
    [
        ([copy_row("main", "following", 0)], {"status": "ok"}),
        ([copy_row("main", "catching_up", 4), copy_row("other", "restarting", 0, "failed over")], {"status": "ok"}),
        (
            [copy_row("main", "stuck", 2, "stream MC0_J_main has no leader now"), copy_row("other", "following", 0)],
            {
                "status": "degraded",
                "reason": "journal main: its local copy is stuck: stream MC0_J_main has no leader now",
            },
        ),
        (
            [copy_row("a", "broken", 1, "the local copy cannot be written (OSError)"), copy_row("b", "stuck", 0, "x")],
            {
                "status": "degraded",
                "reason": "journal a: its local copy is broken: the local copy cannot be written (OSError); "
                "journal b: its local copy is stuck: x",
            },
        ),
        ([{"name": "files", "store": "file", "records": 1, "bytes": 10}], {"status": "ok"}),  # (no copy)
    ],
)
def test_each_copys_lag_and_state_are_gauges_and_healthz_is_degraded_while_one_is_stuck(
    rows: list[dict[str, object]], health: dict[str, str]
) -> None:
    from mc0.broker.monitoring import httpd
    from mc0.broker.monitoring.snapshot import Snapshot

    cluster = {"name": "b1", "nats_connected": True, "brokers": []}
    varz = {"journals": {}, "cluster": cluster, "connections": 0, "subscriptions": 0, "services": 0,
            "pending_bytes": 0, "uptime_s": 1.0, "in_msgs": 0, "in_bytes": 0, "out_msgs": 0, "out_bytes": 0,
            "delivered": 0, "dropped": 0, "slow_consumers": 0}  # fmt: skip
    server = httpd.MonitorServer("127.0.0.1:0", wake=lambda: None)
    snap = Snapshot(taken=0.0, varz=varz, peers=[], subsz={}, servicez={}, journalz={"journals": rows})
    assert json.loads(httpd.PAGE_TABLE["/healthz"].body(server, snap, {})) == health
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in httpd.store_metrics(snap)  # (what /metrics renders of /journalz)
        for s in family.samples
        if s.name.startswith("mc0_journal_copy")
    }
    want: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for row in rows:
        if "copy_state" in row:
            want[("mc0_journal_copy_lag", (("journal", str(row["name"])),))] = float(row["copy_lag"])  # type: ignore[arg-type]
            for state in ("starting", "following", "catching_up", "restarting", "stuck", "broken"):
                labels = (("journal", str(row["name"])), ("state", state))
                want[("mc0_journal_copy_state", labels)] = float(row["copy_state"] == state)
    assert samples == want
