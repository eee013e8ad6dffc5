"""The monitoring listener's HTTP surface over raw sockets, on a real broker process: every query
parameter of every page (mc0.broker.monitoring.queries) answers 400 naming it for anything not as
documented, arbitrary Unicode included (hypothesis); an unexpected exception is a 500 of one line,
written to the log once; only the listener's own address, localhost and ``[http] allowed_hosts`` are
served (mc0.broker.monitoring.hosts: 421 otherwise, DNS rebinding); an admin POST is JSON or 415
(mc0.broker.monitoring.actions); a method other than GET and POST is 405.  Never a connection closed
without an answer."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mc0.broker.faultlog import FaultLog
from mc0.broker.monitoring.httpd import MonitorServer
from mc0.broker.monitoring.queries import PAGES
from mc0.broker.monitoring.snapshot import ALL_PARTS, Capture
from mc0.ports import free_port
from mc0.process import BrokerProcess

from .conftest import write_config

pytestmark = pytest.mark.timeout(120)

TOKEN = "s3cret-token-for-the-admin-actions"
ALLOWED = "mc0.example.org"
MAX_ANSWER_BYTES = 1 << 22  # more than any page here: a bound on the read loop


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @property
    def error(self) -> str:
        """The one-line JSON error of a refusal (asserted one line)."""
        assert self.body.endswith(b"\n") and self.body.count(b"\n") == 1, self.body[:300]
        assert self.headers["content-type"] == "application/json"
        error = json.loads(self.body)["error"]
        assert isinstance(error, str) and "\n" not in error
        return error


def exchange(port: int, request: bytes, *, address: str = "127.0.0.1") -> bytes:
    """Send ``request`` as given on a new connection; every byte of the answer (the listener closes
    after each)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect((address, port))
        sock.sendall(request)
        data = b""
        while len(data) < MAX_ANSWER_BYTES:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def raw(port: int, request: bytes, *, address: str = "127.0.0.1") -> Answer:
    """The answer to ``request``, asserted complete: a status line, headers and a body of its
    Content-Length."""
    data = exchange(port, request, address=address)
    head, blank, body = data.partition(b"\r\n\r\n")
    assert blank, f"no HTTP answer (the connection closed after {len(data)} bytes: {data[:200]!r})"
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, status, _ = status_line.split(" ", 2)
    assert version.startswith("HTTP/1.")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    assert int(headers["content-length"]) == len(body) or request.startswith(b"HEAD "), (headers, len(body))
    return Answer(int(status), headers, body)


def get(port: int, target: str | bytes, host: str | None = "127.0.0.1", *, version: str = "HTTP/1.1") -> Answer:
    path = target if isinstance(target, bytes) else target.encode()
    request = b"GET " + path + f" {version}\r\n".encode()
    if host is not None:
        request += f"Host: {host}\r\n".encode()
    return raw(port, request + b"\r\n")


def post(port: int, op: str, body: bytes, headers: dict[str, str]) -> Answer:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = f"POST /admin/{op} HTTP/1.1\r\n{lines}Content-Length: {len(body)}\r\n\r\n".encode() + body
    return raw(port, request)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A real broker whose monitoring listener has the admin actions and one allowed name; its port."""
    root = tmp_path_factory.mktemp("httpd")
    port = free_port()
    token_file = root / "admin.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    http = f'[http]\nlisten = "127.0.0.1:{port}"\nadmin_token_file = "{token_file}"\nallowed_hosts = ["{ALLOWED}"]\n'
    with BrokerProcess(config=write_config(root, http), insecure=True):
        yield port


# ---------------------------------------------------------------- every parameter of every page
BAD_QUERIES = [
    ("/connz", "limit=%C2%B2", "limit"),  # '²': str.isdigit() says yes, int() raises (the dropped connection)
    ("/connz", "offset=%C2%B9", "offset"),  # '¹'
    ("/connz", "limit=%E2%91%A0", "limit"),  # '①'
    ("/connz", "limit=%EF%BC%95", "limit"),  # a full-width 5
    ("/connz", "limit=%D9%A3", "limit"),  # an Arabic-Indic 3 (int() takes it: the docs promise ASCII digits)
    ("/connz", "limit=-1", "limit"),
    ("/connz", "limit=%2B5", "limit"),  # +5
    ("/connz", "limit=1_0", "limit"),  # int() takes '1_0'
    ("/connz", "limit=%205", "limit"),  # ' 5' (int() strips it)
    ("/connz", "limit=1e3", "limit"),
    ("/connz", "limit=0x10", "limit"),
    ("/connz", "limit=10001", "limit"),
    ("/connz", "limit=" + "9" * 5000, "limit"),  # past int()'s own bound of 4,300 digits
    ("/connz", "offset=1000000000000", "offset"),  # 13 digits
    ("/connz", "limit=1001&subs=1", "limit"),  # (each row with every pattern: at most 1,000)
    ("/connz", "order=up", "order"),
    ("/connz", "filter=a%0Ab", "filter"),  # not printable
    ("/connz", "filter=" + "x" * 201, "filter"),
    ("/connz", "max_age_ms=10001", "max_age_ms"),
    ("/subsz", "sort=topic", "sort"),
    ("/subsz", "limit=10001", "limit"),
    ("/subsz", "state=open", "state"),  # a /connz parameter
    ("/consumerz", "sort=lag", "sort"),
    ("/consumerz", "offset=-1", "offset"),
    ("/consumerz", "subs=1", "subs"),
    ("/varz", "max_age_ms=%C2%B2", "max_age_ms"),
    ("/connz", "state=OPEN", "state"),
    ("/connz", "state=%00", "state"),
    ("/connz", "sort=name%0A", "sort"),
    ("/connz", "subs=yes", "subs"),
    ("/connz", "limit=1&limit=2", "limit"),  # twice
    ("/connz", "limt=5", "limt"),  # a typo is not ignored
    ("/connz", "%FF=1", "\ufffd"),  # not UTF-8
    ("/varz", "x=1", "'x'"),
    ("/metrics", "limit=5", "limit"),
    ("/healthz", "verbose", "verbose"),
    ("/", "a=b", "'a'"),
    ("/console.js", "v=2", "'v'"),
    ("/connz", "&".join(f"p{i}=1" for i in range(40)), "query parameters"),
]


@pytest.mark.parametrize(("page", "query", "named"), BAD_QUERIES)
def test_a_query_not_as_documented_is_400_naming_the_parameter(broker: int, page: str, query: str, named: str) -> None:
    answer = get(broker, f"{page}?{query}")
    assert answer.status == 400 and named in answer.error, (answer.status, answer.body[:300])


@pytest.mark.parametrize(
    "target",
    [
        "/connz?limit=5", "/connz?limit=0", "/connz?limit=00010", "/connz?limit=10000&offset=999999999999",
        "/connz?state=closed&sort=closed_at&subs=1", "/connz?limit=&state=", "/connz?subs=0&sort=subscriptions",
        "/connz?subs=1&limit=1000", "/connz?filter=alice&order=asc&sort=msgs_in&max_age_ms=500",
        "/subsz?sort=subscribers&order=asc&filter=a&limit=3&offset=1", "/consumerz?sort=num_pending&order=desc&limit=0",
        "/varz", "/varz?", "/varz?max_age_ms=10000", "/metrics?max_age_ms=0", "/healthz", "/",
    ],
)  # fmt: skip
def test_a_query_as_documented_is_answered(broker: int, target: str) -> None:
    answer = get(broker, target)
    assert answer.status == 200, answer.body[:300]


# (page, parameter): every parameter of every page; a page that takes none is asked an arbitrary one.
PARAMETERS = [(page, p.name) for page, params in PAGES.items() for p in params]
PARAMETERS += [(page, None) for page, params in PAGES.items() if not params]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PARAMETERS), st.text(), st.text(min_size=1), st.booleans())
def test_every_parameter_of_every_page_answers_arbitrary_unicode(
    broker: int, asked: tuple[str, str | None], value: str, other: str, encoded: bool
) -> None:
    """A value (and, where a page takes none, a name) of any Unicode: percent-encoded UTF-8 it is a
    200 or a 400 naming the parameter; sent as raw UTF-8 bytes in the request line (whitespace and
    control characters break the line itself), a 200 or a 400, one line.  Always an answer."""
    page, name = asked
    name = other if name is None else name
    if encoded:
        answer = get(broker, f"{page}?{quote(name, safe='')}={quote(value, safe='')}")
        assert answer.status in (200, 400), answer.body[:300]
        if answer.status == 400:
            assert repr(name[:20])[1:-1] in answer.error or "query parameters" in answer.error
    else:
        target = f"{page}?{name}={value}".encode()
        data = exchange(broker, b"GET " + target + f" HTTP/1.1\r\nHost: 127.0.0.1:{broker}\r\n\r\n".encode())
        if not data.startswith(b"HTTP/1."):  # whitespace cut the line to two words: HTTP/0.9, the body alone
            assert data
            return
        answer = raw(broker, b"GET " + target + f" HTTP/1.1\r\nHost: 127.0.0.1:{broker}\r\n\r\n".encode())
        assert answer.status in (200, 400, 404), answer.body[:300]  # (a '/' or '?' in it may change the path)
        if answer.status != 200:
            assert answer.error


# ---------------------------------------------------------------- a handler that raises
class PublishesBrokenSnapshots:
    """A loop stand-in that answers every wake with a capture missing what /metrics reads (a
    service's row without its workers)."""

    def __init__(self) -> None:
        self.server: MonitorServer | None = None

    def wake(self) -> None:
        if self.server is not None:
            now = time.monotonic()
            self.server.publish(
                Capture(
                    taken=now, wall=time.time(), started=now, in_bytes=0, parts=ALL_PARTS, counters={},
                    sent=(0, 0, 0), num_peers=0, num_subscriptions=0,
                    services={"svc": {"requests": 0, "errors": 0, "timeouts": 0}}, latency={},
                    journal_infos={}, journal_stores={}, cluster=None,
                )
            )  # fmt: skip


def test_an_unexpected_exception_is_a_500_of_one_line_written_once(caplog: pytest.LogCaptureFixture) -> None:
    loop = PublishesBrokenSnapshots()
    server = MonitorServer("127.0.0.1:0", wake=loop.wake, faults=FaultLog("the monitoring listener"))
    loop.server = server
    server.start()
    try:
        with caplog.at_level(logging.ERROR, logger="mc0.broker"):
            # (the same fault asked three ways: one kind, however the query is spelt)
            answers = [get(server.port, target) for target in ("/metrics", "/metrics?", "/metrics/?&")]
            assert get(server.port, "/healthz").status == 200  # the listener goes on serving
        for answer in answers:
            assert answer.status == 500 and answer.error.startswith("internal error (KeyError)")
        written = [r for r in caplog.records if "monitoring listener" in r.getMessage()]
        assert len(written) == 1 and written[0].exc_info is not None, [r.getMessage() for r in written]
    finally:
        server.close()


# ---------------------------------------------------------------- Host: only our own names
@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:{port}", 200),
        ("127.0.0.1", 200),
        ("localhost:{port}", 200),
        ("LOCALHOST:{port}", 200),  # names are compared in lower case
        ("localhost.:{port}", 200),  # the absolute name
        ("localhost:1", 200),  # another port: a tunnel's (the name is what a rebinding page cannot give)
        (" localhost:{port}\t", 200),
        (f"{ALLOWED}:{{port}}", 200),
        (f"{ALLOWED.upper()}.", 200),
        ("evil.example:{port}", 421),  # DNS rebinding: the page's own name
        (f"{ALLOWED}.evil.example", 421),
        (f"evil.{ALLOWED}", 421),
        ("127.0.0.1.nip.io:{port}", 421),
        ("localhost..:{port}", 421),
        ("localhost:{port}:1", 421),
        ("localhost:abc", 421),
        ("localhost:99999", 421),
        ("localhost:-1", 421),
        ("user@localhost:{port}", 421),
        ("localhost/x", 421),
        ("127.0.0.1:{port}, evil.example", 421),
        ("[::1]:{port}", 421),  # loopback, but not this listener's address
        ("[127.0.0.1]:{port}", 421),
        ("2130706433:{port}", 421),  # 127.0.0.1 as one number: a name here, and not ours
        ("local\u0127host:{port}", 421),
        ("", 421),
    ],
)
def test_only_the_listeners_own_names_are_served(broker: int, host: str, status: int) -> None:
    value = host.replace("{port}", str(broker))
    answer = raw(broker, b"GET /healthz HTTP/1.1\r\nHost: " + value.encode() + b"\r\n\r\n")
    assert answer.status == status, (value, answer.body[:300])
    if status == 421:
        assert "does not serve the host" in answer.error
        # The console and an admin POST are refused alike, before anything else is looked at.
        page = raw(broker, b"GET / HTTP/1.1\r\nHost: " + value.encode() + b"\r\n\r\n")
        assert page.status == 421 and b"console" not in page.body
        headers = {"Host": value, "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        assert post(broker, "conn.close", b'{"id": "nobody#1"}', headers).status == 421


def test_a_request_without_one_host_header(broker: int) -> None:
    """HTTP/1.1 requires Host (400 without); more than one is 400; HTTP/1.0 without one is served:
    no browser sends a request without Host, so no page can be behind it."""
    assert "Host header is required" in get(broker, "/healthz", None).error
    assert get(broker, "/healthz", None, version="HTTP/1.0").status == 200
    two = raw(broker, f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{broker}\r\nHost: evil.example\r\n\r\n".encode())
    assert two.status == 400 and "more than one Host" in two.error
    assert get(broker, "/healthz", "evil.example", version="HTTP/1.0").status == 421


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("[::1]:{port}", 200),
        ("[::1]", 200),
        ("[0:0:0:0:0:0:0:1]:{port}", 200),  # the same address written out
        ("::1", 200),  # bare (not a valid Host, but only this address)
        ("localhost:{port}", 200),
        ("[::1%25lo]:{port}", 421),  # a zone
        ("[::1:{port}", 421),
        ("[::1]x", 421),
        ("[::2]:{port}", 421),
        ("[::ffff:127.0.0.1]:{port}", 421),
        ("127.0.0.1:{port}", 421),
        ("evil.example", 421),
    ],
)
def test_an_ipv6_listener_serves_its_address_in_any_spelling(host: str, status: int) -> None:
    loop = PublishesBrokenSnapshots()  # (/healthz needs nothing of the snapshot)
    server = MonitorServer("[::1]:0", wake=loop.wake)
    loop.server = server
    server.start()
    try:
        value = host.replace("{port}", str(server.port))
        answer = raw(server.port, f"GET /healthz HTTP/1.1\r\nHost: {value}\r\n\r\n".encode(), address="::1")
        assert answer.status == status, (value, answer.body[:300])
    finally:
        server.close()


# ---------------------------------------------------------------- admin POST: JSON or 415
@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        (None, 415),
        ("application/x-www-form-urlencoded", 415),  # what a foreign page's form posts without asking first
        ("text/plain", 415),
        ("multipart/form-data; boundary=x", 415),
        ("application/jsonp", 415),
        ("application/json-patch+json", 415),
        ("", 415),
        ("application/json", 404),  # (then the action: no such session)
        ("Application/JSON; charset=utf-8", 404),
    ],
)
def test_an_admin_post_must_be_json(broker: int, content_type: str | None, status: int) -> None:
    headers = {"Host": f"127.0.0.1:{broker}", "Authorization": f"Bearer {TOKEN}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    answer = post(broker, "conn.close", b'{"id": "nobody#1"}', headers)
    assert answer.status == status, answer.body[:300]
    if status == 415:
        assert "application/json" in answer.error
    # Without the token the answer is 401 whatever the type: the token is asked first.
    assert post(broker, "conn.close", b"{}", {**headers, "Authorization": "Bearer wrong"}).status == 401


@pytest.mark.parametrize("length", ["+5", "1_0", " 5x", "-1", "99999999999999999999", "\u00b2"])
def test_an_admin_post_with_a_content_length_not_of_digits_is_400(broker: int, length: str) -> None:
    head = (
        f"POST /admin/conn.close HTTP/1.1\r\nHost: 127.0.0.1:{broker}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
    answer = raw(broker, head.encode("utf-8") + b"{}")
    assert answer.status == 400 and "JSON object" in answer.error


@pytest.mark.parametrize("method", ["PUT", "DELETE", "OPTIONS", "PATCH", "TRACE"])
def test_other_methods_are_405_after_the_host_check(broker: int, method: str) -> None:
    answer = raw(broker, f"{method} /varz HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    assert answer.status == 405 and answer.headers["allow"] == "GET, HEAD, POST"
    assert "not served here" in answer.error
    assert raw(broker, f"{method} /varz HTTP/1.1\r\nHost: evil.example\r\n\r\n".encode()).status == 421


def test_head_is_a_gets_headers_without_the_body(broker: int) -> None:
    answer = raw(broker, b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert answer.status == 200 and answer.body == b"" and int(answer.headers["content-length"]) > 0
    assert raw(broker, b"HEAD /healthz HTTP/1.1\r\nHost: evil.example\r\n\r\n").status == 421
    assert raw(broker, b"HEAD /connz?limit=%C2%B2 HTTP/1.1\r\nHost: localhost\r\n\r\n").status == 400


@pytest.mark.parametrize(
    "request_line",
    [
        b"GET\r\n\r\n",
        b"GET /varz HTTP/9.9\r\n\r\n",
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\r\n\r\n",
    ],
)
def test_what_http_server_refuses_itself_is_one_line_too(broker: int, request_line: bytes) -> None:
    answer = raw(broker, request_line)
    assert answer.status in (400, 414, 505) and answer.error


def test_a_silent_connection_is_closed_after_the_request_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each connection holds a thread: one that sends nothing (or less than its Content-Length) is
    not kept for ever."""
    from mc0.broker.monitoring import httpd

    assert httpd.REQUEST_TIMEOUT_S <= 30
    monkeypatch.setattr(httpd, "REQUEST_TIMEOUT_S", 1.0)
    server = MonitorServer("127.0.0.1:0", wake=lambda: None)
    server.start()
    try:
        for started_request in (
            b"GET /varz HTTP/1.1\r\n",
            b"POST /admin/conn.close HTTP/1.1\r\nContent-Length: 9\r\n\r\n{",
        ):
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
                sock.sendall(started_request)  # and never the rest
                answer = b""
                for _ in range(100):  # (bounded; each recv waits at most the socket's timeout)
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
                assert b"200 OK" not in answer  # closed by the listener, not served
    finally:
        server.close()


def test_an_http_09_request_is_refused_in_one_line(broker: int) -> None:
    """HTTP/0.9 has no headers, so no Host (a request line that whitespace cut to two words is read
    as one); its answer is a body alone."""
    data = exchange(broker, b"GET /healthz\r\n\r\n")
    assert data.count(b"\n") == 1 and "Host header is required" in json.loads(data)["error"]


@pytest.mark.parametrize(
    ("entry", "name"),
    [
        ("mc0.example.org", "mc0.example.org"),
        ("MC0.Example.org.", "mc0.example.org"),
        ("::1", "::1"),
        ("[0:0::1]", "::1"),
        ("10.0.0.5", "10.0.0.5"),
        ("::ffff:10.0.0.5", "10.0.0.5"),
        ("mc0.example.org:8222", None),  # no port
        ("http://mc0.example.org", None),
        ("*.example.org", None),
        ("", None),
        (".", None),
        ("a..b", None),
        ("exämple.org", None),  # (browsers send the punycode: list that)
        ("[mc0.example.org]", None),
        ("fe80::1%eth0", None),
    ],
)
def test_allowed_hosts_entries(entry: str, name: str | None) -> None:
    from mc0.broker.monitoring.hosts import HostRule, allowed_name
    from mc0.errors import ConfigError

    assert allowed_name(entry) == name
    if name is None:
        with pytest.raises(ConfigError, match="http.allowed_hosts"):
            HostRule("127.0.0.1", [entry])
    else:
        assert name in HostRule("127.0.0.1", [entry]).names


@pytest.mark.parametrize(
    ("host", "status"), [("evil.example", 421), ("localhost", 400)]
)  # refused before its body is read: not ours; larger than an action's body may be
def test_a_request_refused_before_its_body_is_read_still_gets_its_answer(broker: int, host: str, status: int) -> None:
    """The listener closed with the body unread: the close was a reset, the client's send failed and the
    answer could be lost.  Now it reads what still comes (bounded) before it closes."""
    body = b"x" * (8 << 20)
    head = (
        f"POST /admin/conn.close HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    answer = raw(broker, head.encode() + body)
    assert answer.status == status and answer.error


def test_a_refused_host_is_named_in_the_log_a_bounded_number_of_times(caplog: pytest.LogCaptureFixture) -> None:
    """A scraper or a proxy that asks under a DNS name gets 421 until the name is listed: the log says
    so, naming the host, for the first 16 names (a page trying names cannot fill the log)."""
    from mc0.broker.monitoring.httpd import MISDIRECTED_LOGGED

    loop = PublishesBrokenSnapshots()
    server = MonitorServer("127.0.0.1:0", wake=loop.wake)
    loop.server = server
    server.start()
    try:
        with caplog.at_level(logging.WARNING, logger="mc0.broker.http"):
            for i in range(MISDIRECTED_LOGGED + 10):
                assert get(server.port, "/healthz", f"broker{i}.example").status == 421
            assert get(server.port, "/healthz", "broker0.example").status == 421  # (named once)
        named = [r.getMessage() for r in caplog.records if "allowed_hosts" in r.getMessage()]
        assert len(named) == MISDIRECTED_LOGGED and "'broker0.example'" in named[0]
        assert server.misdirected == MISDIRECTED_LOGGED + 11
    finally:
        server.close()
