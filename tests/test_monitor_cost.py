"""What scrapers cost the bus (mc0.broker.server's capture budget, mc0.broker.monitoring's capture/build
split, consumers' and peers' per-turn work kept to what changed): issue 35's figure, with room for a
loaded box.  The benchmark (scripts/bench_monitor.py --table bus) holds the targets (p50 <= 1.2x,
calls/s >= 0.8x); this test holds 10x either way (under half the old cost on a calm box), and that nothing
fails."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.monitor_load import Setup


@pytest.mark.timeout(400)
def test_ten_scrapers_of_the_biggest_pages_cost_the_bus_round_trip_a_bounded_share() -> None:
    """1,000 sessions (a subscription each), 2,000 durable consumers, 10 scrapers each reading
    /connz?subs=1, /consumerz, /journalz and /metrics every 100 ms: RPC round trips keep within 10x of
    the runs without scrapers (was 22-71x), alternating runs, every call and page answered."""
    runs: dict[int, list[dict[str, float]]] = {0: [], 10: []}
    with Setup(sessions=1_000, consumers=2_000, every=0.1) as setup:
        for _ in range(2):
            for scrapers in (0, 10):
                runs[scrapers].append(setup.calls(4.0, scrapers))
    for figures in runs[0] + runs[10]:
        assert figures["failed"] == 0 and figures["page_failures"] == 0, figures
    # The scrapers were served; a page may say "stalled" (503: no capture within a second) on a box
    # loaded far past its cores, a few, never most.
    for figures in runs[10]:
        assert figures["pages"] > 0 and figures["pages_stalled"] <= figures["pages"] / 10, figures

    def median(scrapers: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[scrapers])

    # Scrapes built on the loop cost 22-71x on a calm box; off it, 0.8-1.5x there, but 3.6x and 6.4x (a CI
    # run) beside the whole suite: on a box loaded past its cores, the broker's HTTP threads (one per
    # scraper) and the scrapers' own process compete with the loop for the interpreter and the two cores.
    # 10x is room for that and still under half the old calm cost.
    assert median(10, "p50_ms") <= 10 * median(0, "p50_ms"), runs
    assert median(10, "calls_per_s") >= median(0, "calls_per_s") / 10, runs
