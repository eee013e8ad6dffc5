"""``mc0 report``: the pipeline's Parquet tables -> charts a person can read.

Contract: ``build_report(input_dir, output_dir)`` reads ``topics``,
``senders`` and ``rpc`` (as written by :mod:`mc0.pipeline`) with pyarrow,
draws ``traffic.png`` (messages and bytes per minute, busiest topics) and
``rpc.png`` (latency p50/p95/p99 and error rate per service over time) with
matplotlib (a minute without data is a gap in a line, never a line across it;
the error axis starts at 0), and writes ``report.html`` embedding both plus summary tables.
Returns the files written; a missing or empty input is an :class:`mc0.Error`.
No Spark needed.
"""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path
from typing import Any

from ..errors import Error

MAX_TOPIC_LINES = 8


def _table(input_dir: Path, name: str) -> Any:
    import pyarrow.dataset as ds

    folder = input_dir / name
    if not folder.is_dir():
        return None
    table = ds.dataset(str(folder), format="parquet", partitioning="hive").to_table().to_pandas()
    return table if len(table) else None


def build_report(input_dir: str | os.PathLike[str], output_dir: str | os.PathLike[str]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")

    source = Path(input_dir)
    topics = _table(source, "topics")
    if topics is None:
        raise Error(f"{source}: no pipeline tables here (run `mc0 pipeline --once` first)")
    senders = _table(source, "senders")
    rpc = _table(source, "rpc")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    traffic_png = _traffic_chart(topics, out / "traffic.png")
    written = [traffic_png]
    rpc_png = None if rpc is None else _rpc_chart(rpc, out / "rpc.png")
    if rpc_png is not None:
        written.append(rpc_png)
    written.append(_page(source, topics, senders, rpc, traffic_png, rpc_png, out / "report.html"))
    return written


def _traffic_chart(topics: Any, path: Path) -> Path:
    """Messages per minute of the busiest topics over bytes per minute of all of them."""
    import matplotlib.pyplot as plt

    fig, (ax_messages, ax_bytes) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    # A topic silent in a minute that has rows is 0; a minute with no rows at all is no data: a gap.
    per_topic = topics.pivot_table(index="minute", columns="topic", values="messages", aggfunc="sum").fillna(0)
    per_topic = per_topic.reindex(_every_minute(topics["minute"]))
    busiest = per_topic.sum().sort_values(ascending=False).index[:MAX_TOPIC_LINES]
    for topic in busiest:
        ax_messages.plot(per_topic.index, per_topic[topic], marker="o", label=topic)
    ax_messages.set_ylabel("messages / minute")
    ax_messages.set_title("Traffic by topic (busiest topics)")
    ax_messages.legend(fontsize="small", ncol=2)
    total_bytes = topics.groupby("minute")["bytes"].sum()
    ax_bytes.bar(total_bytes.index, total_bytes.values, width=0.6 / 1440, color="tab:gray")
    ax_bytes.set_ylabel("bytes / minute")
    ax_bytes.set_xlabel("minute (UTC)")
    _time_axis(ax_bytes, topics["minute"])
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _rpc_chart(rpc: Any, path: Path) -> Path:
    """Latency p50/p95/p99 per service over its error rate, per minute."""
    import matplotlib.pyplot as plt

    services = sorted(rpc["service"].unique())
    fig, (ax_latency, ax_errors) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    minutes = _every_minute(rpc["minute"])
    for service in services:
        # A minute without requests has no latency and no error rate: a gap, not a line across it.
        rows = rpc[rpc["service"] == service].groupby("minute").first().reindex(minutes)
        line = ax_latency.plot(rows.index, rows["latency_p50_ms"], marker="o", label=f"{service} p50")[0]
        ax_latency.plot(rows.index, rows["latency_p95_ms"], linestyle="--", color=line.get_color(), label="p95")
        ax_latency.plot(rows.index, rows["latency_p99_ms"], linestyle=":", color=line.get_color(), label="p99")
        ax_errors.plot(rows.index, rows["error_rate"] * 100, marker="o", label=service)
    ax_latency.set_ylabel("latency (ms)")
    ax_latency.set_title("RPC latency per service (p50 solid, p95 dashed, p99 dotted)")
    ax_latency.legend(fontsize="small", ncol=3)
    worst = float(rpc["error_rate"].max()) * 100
    # Errors are never negative; with none, 0 to 1 % (matplotlib would centre a flat 0 on -0.04..0.04).
    ax_errors.set_ylim(0, max(1.0, worst * 1.15))
    ax_errors.set_title("Error rate per service" if worst > 0 else "Error rate per service: no errors")
    ax_errors.set_ylabel("errors (%)")
    ax_errors.set_xlabel("minute (UTC)")
    ax_errors.legend(fontsize="small")
    _time_axis(ax_errors, rpc["minute"])
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _page(
    source: Path, topics: Any, senders: Any, rpc: Any, traffic_png: Path, rpc_png: Path | None, path: Path
) -> Path:
    """report.html: the charts (embedded) and the summary tables."""
    sections = [
        f"<h2>Traffic</h2>{_img(traffic_png)}",
        _html_table(
            "Topics over the whole period",
            topics.groupby("topic")[["messages", "bytes"]].sum().sort_values("messages", ascending=False).head(20),
        ),
    ]
    if senders is not None:
        top = senders.groupby("sender")[["messages", "bytes"]].sum().sort_values("messages", ascending=False).head(20)
        sections.append(_html_table("Top senders (summed over the minutes where they ranked)", top))
    if rpc is not None and rpc_png is not None:
        summary = rpc.groupby("service").agg(
            requests=("requests", "sum"), errors=("errors", "sum"), worst_p99_ms=("latency_p99_ms", "max")
        )
        sections.append(f"<h2>RPC</h2>{_img(rpc_png)}")
        sections.append(_html_table("Services over the whole period", summary))
    first, last = topics["minute"].min(), topics["minute"].max()
    path.write_text(
        "<!doctype html><meta charset=utf-8><title>mc0 report</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
        "th:first-child,td:first-child{text-align:left}</style>"
        f"<h1>mc0 bus report</h1><p>{html.escape(str(first))} to {html.escape(str(last))} (UTC), "
        f"from {html.escape(str(source))}</p>" + "".join(sections),
        encoding="utf-8",
    )
    return path


def _every_minute(minutes: Any) -> Any:
    """Each minute from the first to the last of ``minutes``: the index a chart's series take, so
    that a minute without data is a NaN (matplotlib leaves a gap) rather than skipped."""
    import pandas as pd

    return pd.date_range(minutes.min(), minutes.max(), freq="min", name="minute")


def _time_axis(ax: Any, minutes: Any) -> None:
    """HH:MM ticks; a lone minute gets a few minutes of room (matplotlib would span years)."""
    import matplotlib.dates as mdates
    import pandas as pd

    low, high = minutes.min(), minutes.max()
    span = max(1, int((high - low) / pd.Timedelta(minutes=1)))
    ax.xaxis.set_major_locator(mdates.MinuteLocator(interval=max(1, span // 10)))  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))  # type: ignore[no-untyped-call]
    pad = pd.Timedelta(minutes=2) if low == high else (high - low) * 0.05
    ax.set_xlim(low - pad, high + pad)


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}" style="max-width:100%">'


def _html_table(title: str, frame: Any) -> str:
    return f"<h3>{html.escape(title)}</h3>" + str(frame.to_html(float_format=lambda v: f"{v:,.3f}"))
