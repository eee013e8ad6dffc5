"""The web console (``GET /``) in a real headless Chromium (Debian's ``chromium`` driven by Playwright), against
a real broker with CURVE peers: what it shows, that names stay text, that it asks nothing of any other host,
and that it raises no JavaScript error.  Each view's screenshot is kept in ``var/screenshots/`` of the checkout.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import zmq

import mc0
from mc0 import keys, ports
from mc0 import protocol as P
from mc0.security import configure_client

from .conftest import CurveSetup, require

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parent.parent / "var" / "screenshots"
VIEWS = ("overview", "connections", "topics", "services", "journals", "mailboxes", "cluster")
# Names that would run script if the console put them in the page as markup.
EVIL_IDENTITY = "eve<script>window.__xss=1<img src=x onerror=window.__xss=2>"
EVIL_TOPIC = "t.<script>window.__xss=3</script>"
EVIL_OPAQUE_TOPIC = "<img src=x onerror=window.__xss=4>"  # a 0.x topic: any bytes but the reserved
POLICY = """
[journals.main]
topics = ["jobs.>"]
segment_bytes = 1048576
[permissions.default]
publish = [">"]
subscribe = [">"]
call = [">"]
"""


def chromium_path() -> str:
    if not Path(CHROMIUM).exists():
        raise FileNotFoundError(f"{CHROMIUM} is missing: the console test needs it (apt-get install chromium)")
    return CHROMIUM


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def legacy_peer(context: zmq.Context[Any], setup: CurveSetup, endpoint: str) -> zmq.Socket[bytes]:
    """A 0.1 peer (CURVE as carol) on the opaque topic EVIL_OPAQUE_TOPIC: subscribed, and one PUT."""
    sock = context.socket(zmq.DEALER)
    configure_client(sock, keys.load_secret(setup.secret("carol")), keys.load_public(setup.broker_key).public)
    sock.connect(endpoint)
    sock.send_multipart(P.encode(P.Verb.CONNECT, {P.Header.VERSION: "0.1", P.Header.ID: "c"}))
    sock.send_multipart(P.encode(P.Verb.SUB, {P.Header.TOPIC: EVIL_OPAQUE_TOPIC, P.Header.ID: "s"}))
    sock.send_multipart(P.encode(P.Verb.PUT, {P.Header.TOPIC: EVIL_OPAQUE_TOPIC, P.Header.ID: "p"}, [b"x"]))
    for _ in range(3):  # OK, OK, OK (its own MESSAGE may come too)
        assert sock.poll(10_000), "the 0.1 peer got no answer"
        sock.recv_multipart()
    return sock


@pytest.fixture
def console_bus(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A CURVE broker with the console on, peers of several identities (one named as markup), a worker,
    a durable consumer with a backlog, and steady traffic while the test runs."""
    http_port = ports.free_port()
    setup = CurveSetup(tmp_path, identities=("alice", "bob", "carol", "eve"))
    # eve's key is allowed under a name that is markup: that is its identity on the bus.
    (setup.allowed_dir / "eve.key").rename(setup.allowed_dir / f"{EVIL_IDENTITY}.key")
    text = setup.config.read_text().replace("[broker]\n", f'[http]\nlisten = "127.0.0.1:{http_port}"\n[broker]\n')
    setup.config.write_text(text + POLICY)
    stop = threading.Event()
    with ExitStack() as stack:
        broker = stack.enter_context(setup.start())
        base = f"http://127.0.0.1:{http_port}"
        alice = stack.enter_context(mc0.Client(broker.endpoint, **setup.client_options("alice")))
        bob = stack.enter_context(mc0.Client(broker.endpoint, **setup.client_options("bob")))
        eve = stack.enter_context(mc0.Client(broker.endpoint, **setup.client_options("eve")))
        stack.enter_context(alice.subscribe("load.>"))
        stack.enter_context(eve.subscribe(EVIL_TOPIC))
        eve.publish(EVIL_TOPIC, b"markup", confirm=True)
        worker = mc0.Worker(broker.endpoint, **setup.client_options("carol"))
        worker.service("calc")(lambda message: b"42")
        stack.enter_context(worker)
        threading.Thread(target=worker.run, daemon=True).start()
        stack.callback(worker.stop)
        context: zmq.Context[Any] = zmq.Context()
        stack.callback(context.term)
        legacy = legacy_peer(context, setup, broker.endpoint)
        stack.callback(legacy.close, 0)
        # A durable consumer with a backlog: 40 stored, 5 handed and not acked, 35 never handed.
        for i in range(40):
            bob.publish("jobs.work", str(i).encode())
        assert bob.publish("jobs.work", b"last", confirm=True) is not None
        consumer = alice.consume("main", "invoicing", topics=("jobs.>",))
        assert len(consumer.fetch(5, wait=5.0)) == 5

        def traffic() -> None:  # steady publishes and calls (bounded: 120 s at most)
            deadline = time.monotonic() + 120
            while not stop.is_set() and time.monotonic() < deadline:
                for _ in range(50):
                    bob.publish("load.x", b"x" * 100)
                bob.request("calc", b"1", timeout=5)
                stop.wait(0.02)

        pump = threading.Thread(target=traffic, daemon=True)
        pump.start()
        stack.callback(pump.join, 10)
        stack.callback(stop.set)
        identities = ["alice", "bob", "carol", EVIL_IDENTITY]
        yield {"base": base, "identities": identities}


@pytest.mark.timeout(180)
def test_console_in_chromium_shows_the_bus_as_text_and_asks_nothing_of_other_hosts(
    console_bus: dict[str, Any],
) -> None:
    sync_api = require("playwright.sync_api")
    base = console_bus["base"]
    origin = urlsplit(base).netloc
    foreign: list[str] = []
    errors: list[str] = []
    asked: list[str] = []
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
        try:
            # bypass_csp: Playwright's waits evaluate script, which the console's policy forbids; and without
            # the policy, names shown as text are the only thing that keeps their markup from running.
            page = browser.new_page(viewport={"width": 1440, "height": 900}, bypass_csp=True)

            def route(route: Any) -> None:
                url = route.request.url
                asked.append(url)
                if urlsplit(url).netloc != origin:
                    foreign.append(url)
                    route.abort()
                else:
                    route.continue_()

            page.route("**/*", route)
            page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
            page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)

            page.goto(base + "/#overview")
            # A rate chart changes while traffic flows.
            page.wait_for_function("document.querySelectorAll('#chart-messages polyline').length > 0", timeout=15_000)
            before = page.get_attribute("#chart-messages polyline", "points")
            page.wait_for_function(
                "p => document.querySelector('#chart-messages polyline').getAttribute('points') !== p",
                arg=before,
                timeout=10_000,
            )
            legend = page.inner_text("#chart-messages .legend")
            assert re.search(r"in \(published\)\s*[1-9][\d,]*/s", legend), legend
            page.wait_for_timeout(2500)  # a few more points, for the screenshot
            page.screenshot(path=str(SCREENSHOTS / "overview.png"), full_page=True)

            # Every connected identity appears within 3 s of opening Connections.
            page.click("a[data-view=connections]")
            started = time.monotonic()
            listed = (
                "id => [...document.querySelectorAll('#conn-table td.name')].some(td => td.textContent.startsWith(id))"
            )
            for identity in console_bus["identities"]:
                page.wait_for_function(
                    listed.replace("startsWith(id)", "startsWith(id + '#')"),
                    arg=identity,
                    timeout=max(100, int((3.0 - (time.monotonic() - started)) * 1000)),
                )
            assert time.monotonic() - started < 3.0
            connz = get_json(base + "/connz")
            shown = page.eval_on_selector_all("#conn-table td.name", "tds => tds.map(td => td.textContent)")
            assert sorted(shown) == sorted(c["name"] for c in connz["connections"])
            assert all(c["address"].startswith("127.0.0.1:") for c in connz["connections"] if c["protocol"] != "")
            page.wait_for_timeout(2200)  # rates need two readings
            page.screenshot(path=str(SCREENSHOTS / "connections.png"), full_page=True)

            # A durable consumer's pending count is what /consumerz says.
            page.click("a[data-view=journals]")
            page.wait_for_selector("#consumer-table td.name")
            consumer = next(c for c in get_json(base + "/consumerz")["consumers"] if c["name"] == "invoicing")
            # 41 stored, 5 handed; counted, not a bound (its topics are not ">": the journal's topic index)
            figures = (consumer["num_pending"], consumer["num_pending_exact"], consumer["num_ack_pending"])
            assert figures == (36, True, 5)
            row = page.eval_on_selector_all(
                "#consumer-table tbody tr",
                "trs => trs.map(tr => [...tr.children].map(td => td.textContent))"
                ".find(cells => cells[0] === 'invoicing')",
            )
            headers = page.eval_on_selector_all("#consumer-table th", "ths => ths.map(th => th.textContent)")
            assert row[headers.index("Pending")] == f"{consumer['num_pending']:,}"
            assert row[headers.index("Unacked")] == f"{consumer['num_ack_pending']:,}"
            page.screenshot(path=str(SCREENSHOTS / "journals.png"), full_page=True)

            for view in ("topics", "services", "mailboxes", "cluster"):
                page.click(f"a[data-view={view}]")
                page.wait_for_timeout(2500)  # two polls (the topics' rates need two readings)
                page.screenshot(path=str(SCREENSHOTS / f"{view}.png"), full_page=True)

            # Names that are markup show as text, and no script ran.
            page.click("a[data-view=topics]")
            page.wait_for_function(
                "t => [...document.querySelectorAll('#topic-table td.name')].some(td => td.textContent === t)",
                arg=EVIL_TOPIC,
                timeout=5000,
            )
            page.wait_for_function(
                "t => [...document.querySelectorAll('#topic-table td.name')].some(td => td.textContent === t)",
                arg=EVIL_OPAQUE_TOPIC,
                timeout=5000,
            )
            page.click("a[data-view=connections]")
            page.wait_for_function(
                "id => [...document.querySelectorAll('#conn-table td.name')].some(td => td.textContent.startsWith(id))",
                arg=EVIL_IDENTITY,
                timeout=5000,
            )
            assert page.evaluate("window.__xss") is None
            assert page.evaluate("document.querySelectorAll('main img, main script').length") == 0
        finally:
            browser.close()
    assert foreign == [], f"the console asked other hosts: {foreign}"
    assert asked and all(urlsplit(u).netloc == origin for u in asked)
    assert errors == [], errors


def test_console_files_ship_in_the_package() -> None:
    """The page, its script and style are package data (an installed wheel serves them)."""
    from importlib import resources

    folder = resources.files("mc0.broker.monitoring").joinpath("console")
    for name in ("index.html", "console.js", "console.css"):
        text = folder.joinpath(name).read_text()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text, name
    assert "innerHTML" not in folder.joinpath("console.js").read_text()  # names go in as text only
    assert shutil.which("chromium") or Path(CHROMIUM).exists()


# ---------------------------------------------------------------- a failed request counted once; idle charts
LONG_IDENTITY = "payments-reconciliation-worker-eu-west-1"  # a name as long as real ones get
AXIS_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def curve_peer(context: zmq.Context[Any], setup: CurveSetup, identity: str, endpoint: str) -> zmq.Socket[bytes]:
    """A raw mc0 1.0 peer under CURVE as ``identity``, connected (its OK read)."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    configure_client(sock, keys.load_secret(setup.secret(identity)), keys.load_public(setup.broker_key).public)
    sock.connect(endpoint)
    sock.send_multipart(P.encode(P.Verb.CONNECT, {P.Header.VERSION: "1.0", P.Header.TTL: "60000", P.Header.ID: "c"}))
    assert sock.poll(10_000) and sock.recv_multipart()[0] == b"OK"
    return sock


def axis_value(label: str) -> float:
    """A chart's y label ("512 B/s", "1.5 KiB/s", "0.3/s", "1,024 B") as the number it says."""
    match = re.fullmatch(r"([\d,]+(?:\.\d+)?)\s*(B|KiB|MiB|GiB)?(?:/s)?", label)
    assert match, label
    return float(match.group(1).replace(",", "")) * AXIS_UNITS[match.group(2) or ""]


def dashboard_failed_expression() -> str:
    """The Grafana dashboard's "failed" RPC expression, for every instance."""
    dashboard = json.loads((Path(__file__).resolve().parent.parent / "etc" / "grafana" / "mc0.json").read_text())
    (expr,) = [
        t["expr"] for p in dashboard["panels"] for t in p["targets"] if t.get("legendFormat") == "{{service}} failed"
    ]
    return str(expr).replace("$instance", ".*")


def promtool_evaluates(tmp_path: Path, series: dict[str, str], expr: str, expected: dict[str, float]) -> None:
    """``expr`` over ``series`` (name{labels} -> promtool's values notation, a sample a minute), at 1m,
    is ``expected`` (labels -> value): promtool's own PromQL engine, as Prometheus evaluates it."""
    from .conftest import promtool

    yaml = require("yaml")
    case = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in series.items()],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "1m",
                        "exp_samples": [{"labels": labels, "value": value} for labels, value in expected.items()],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "dashboard-test.yml"
    path.write_text(yaml.safe_dump(case))
    import subprocess

    tested = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-2000:]


@pytest.mark.timeout(180)
def test_three_timeouts_are_three_failed_requests_on_every_page_the_dashboard_and_the_console(tmp_path: Path) -> None:
    """Three requests answered 504 are 3 failed requests (errors + timeouts) on /varz, /servicez,
    /metrics, the dashboard's expression and the console (it counted each 504 as an error and a
    timeout: 6).  The same idle broker's console, at 1,400 px with its actions on: every chart's y axis
    reads distinct, exact, evenly spaced figures (an idle bytes axis read "1 B/s, 1 B/s, 1 B/s, 0 B/s,
    0 B/s"), and the Connections table shows its Close column whole."""
    sync_api = require("playwright.sync_api")
    http_port = ports.free_port()
    token_file = tmp_path / "admin.token"
    token_file.write_text("s3cret-token-for-the-console-test\n")
    token_file.chmod(0o600)
    http = f'[http]\nlisten = "127.0.0.1:{http_port}"\nadmin_token_file = "{token_file}"\n'
    setup = CurveSetup(tmp_path, identities=("alice", LONG_IDENTITY))
    setup.config.write_text(setup.config.read_text().replace("[broker]\n", http + "[broker]\n"))
    base = f"http://127.0.0.1:{http_port}"
    with setup.start() as broker, ExitStack() as stack:
        context: zmq.Context[Any] = zmq.Context()
        stack.callback(context.term)
        worker = curve_peer(context, setup, LONG_IDENTITY, broker.endpoint)  # takes requests, answers none
        stack.callback(worker.close, 0)
        worker.send_multipart(P.encode(P.Verb.READY, {P.Header.ID: "r"}, [b"slow"]))
        assert worker.poll(10_000) and worker.recv_multipart()[0] == b"OK"
        client = curve_peer(context, setup, "alice", broker.endpoint)
        stack.callback(client.close, 0)
        for i in range(3):
            head = {P.Header.SERVICE: "slow", P.Header.ID: f"q{i}", P.Header.TIMEOUT: "200"}
            client.send_multipart(P.encode(P.Verb.REQUEST, head, [b"x"]))
        answers = []
        for _ in range(20):  # (bounded) the three 504s, NOOPs aside
            if len(answers) == 3 or not client.poll(10_000):
                break
            frames = client.recv_multipart()
            if frames[0] == b"ERROR":
                answers.append(frames)
        assert len(answers) == 3 and all(b"504" in frames for frames in answers), answers

        varz = get_json(base + "/varz")
        assert (varz["rpc_requests"], varz["rpc_errors"]) == (3, 3)
        slow = get_json(base + "/servicez")["slow"]
        assert (slow["requests"], slow["served"], slow["errors"], slow["timeouts"]) == (3, 0, 0, 3)
        with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
            metrics = response.read().decode()
        figures = {
            name: float(re.search(rf'^{name}{{service="slow"}} (\S+)$', metrics, re.MULTILINE).group(1))  # type: ignore[union-attr]
            for name in ("mc0_service_requests_total", "mc0_service_errors_total", "mc0_service_timeouts_total")
        }
        assert figures["mc0_service_errors_total"] + figures["mc0_service_timeouts_total"] == 3, figures
        # The dashboard's "failed" series over a scrape before (0) and one after (these figures), 1 minute apart:
        # 3 failed requests a minute, as promtool evaluates the dashboard's own expression.
        labels = f'{{instance="127.0.0.1:{http_port}",job="mc0",service="slow"}}'
        series = {f"{name}{labels}": f"0 {value:g}" for name, value in figures.items()}
        promtool_evaluates(tmp_path, series, dashboard_failed_expression(), {'{service="slow"}': 3 / 60})

        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900}, bypass_csp=True)
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
                page.goto(base + "/#overview")
                rpc_card = "() => [...document.querySelectorAll('.card .sub')].some(s => s.textContent.includes('RPC'))"
                page.wait_for_function(rpc_card, timeout=15_000)
                subs = page.eval_on_selector_all(".card .sub", "nodes => nodes.map(n => n.textContent)")
                assert "0 refused, 3 RPC failed" in subs, subs
                page.wait_for_timeout(4500)  # a few polls: the rates' history
                for chart in ("chart-messages", "chart-rpc", "chart-bytes", "chart-memory"):
                    labels_ = page.eval_on_selector_all(
                        f"#{chart} text.axis-label", "nodes => nodes.map(n => n.textContent)"
                    )
                    ys = [label for label in labels_ if "min" not in label and label != "now"]
                    values = [axis_value(label) for label in ys]
                    assert len(set(ys)) == len(ys) == 5, (chart, ys)  # no two alike
                    step = values[1] - values[0]
                    assert values[0] == 0 and step > 0, (chart, ys)
                    assert all(abs(v - i * step) <= 1e-9 * max(1.0, step) for i, v in enumerate(values)), (chart, ys)
                page.screenshot(path=str(SCREENSHOTS / "overview-idle-1400.png"), full_page=True)

                page.click("a[data-view=services]")
                page.wait_for_function(
                    "() => [...document.querySelectorAll('#svc-table td.name')].some(td => td.textContent === 'slow')",
                    timeout=5000,
                )
                headers = page.eval_on_selector_all("#svc-table th", "ths => ths.map(th => th.textContent)")
                row = page.eval_on_selector_all(
                    "#svc-table tbody tr",
                    "trs => trs.map(tr => [...tr.children].map(td => td.textContent)).find(c => c[0] === 'slow')",
                )
                assert (row[headers.index("Errors")], row[headers.index("Timeouts")]) == ("0", "3"), (headers, row)
                page.screenshot(path=str(SCREENSHOTS / "services-1400.png"), full_page=True)

                page.click("a[data-view=connections]")
                page.wait_for_selector("#conn-table td.actions-cell button", timeout=5000)
                page.wait_for_timeout(2500)  # rates need two readings (their columns' widths)
                page.screenshot(path=str(SCREENSHOTS / "connections-1400.png"), full_page=True)
                clipped = page.evaluate(
                    """() => {
                      const wrap = document.querySelector('#conn-table').closest('.table-wrap').getBoundingClientRect();
                      const cells = [...document.querySelectorAll('#conn-table th, #conn-table td')];
                      return cells.filter(c => c.getBoundingClientRect().right > wrap.right + 0.5
                                            || c.getBoundingClientRect().right > window.innerWidth)
                                  .map(c => c.textContent);
                    }"""
                )
                assert clipped == [], f"cut off at 1,400 px: {clipped}"
                buttons = page.eval_on_selector_all(
                    "#conn-table td.actions-cell button", "bs => bs.map(b => b.textContent)"
                )
                assert buttons and set(buttons) == {"Close"}
                assert errors == [], errors
            finally:
                browser.close()
