"""Latency histograms: one bucket layout for ``mc0 stats`` percentiles and Prometheus ``/metrics``.

Contract: ``Histogram.observe(seconds)`` counts a value in the first bucket
whose upper bound is >= it (cumulative counts are derived, as Prometheus
expects them); ``quantile(q)`` estimates the q-quantile the way PromQL's
``histogram_quantile`` does (linear interpolation inside the bucket that
holds the rank), so the figure ``mc0 stats`` prints and the one a Grafana
panel computes from ``/metrics`` are the same definition.  Memory is fixed
(one int per bucket), an observation is one ``bisect``.  Pure: no clock.
"""

from __future__ import annotations

from bisect import bisect_left

# Upper bounds in seconds (+Inf is implicit): 100 µs .. 60 s, roughly 1-2.5-5 per decade.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
# The percentiles every mc0 report shows (the broker's and the pipeline's).
PERCENTILES: tuple[float, ...] = (0.50, 0.95, 0.99)


class Histogram:
    __slots__ = ("bounds", "counts", "total", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError("bucket bounds must be strictly increasing and not empty")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += 1
        self.sum += value

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, count of values <= it) for every bucket, ending with (inf, total)."""
        out = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out

    def quantile(self, q: float) -> float | None:
        """histogram_quantile(q): None with no observations; the largest finite bound when the
        rank falls in +Inf (as PromQL does)."""
        if not 0.0 <= q <= 1.0:
            raise ValueError("q must be in [0, 1]")
        if self.total == 0:
            return None
        rank = q * self.total
        lower_bound = 0.0
        below = 0
        for bound, cumulative in self.cumulative():
            if cumulative >= rank and cumulative > below:
                if bound == float("inf"):
                    return self.bounds[-1]
                return lower_bound + (bound - lower_bound) * (rank - below) / (cumulative - below)
            lower_bound, below = bound, cumulative
        return self.bounds[-1]  # pragma: no cover - the +Inf bucket always ends the walk

    def percentiles_ms(self) -> dict[str, float | None]:
        """{"p50": ms, "p95": ms, "p99": ms} (None before any observation), for reports."""
        out: dict[str, float | None] = {}
        for q in PERCENTILES:
            value = self.quantile(q)
            out[f"p{round(q * 100)}"] = None if value is None else round(value * 1000, 3)
        return out
