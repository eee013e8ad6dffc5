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
