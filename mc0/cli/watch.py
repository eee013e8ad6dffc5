"""What ``mc0 stats`` and ``mc0 top`` show, fitted to 80 columns: the tables, readable numbers, live refresh.

Contract: ``stats_view(reports, endpoint)`` and ``top_view(before, after, seconds, endpoint)`` turn the
broker's ``mc0.broker`` reports into rich renderables that fit ``WIDTH`` columns whatever the
numbers (counts shown as ``12.3k``, bytes as ``4.5M``, names cut with an ellipsis);
``console()`` prints at the terminal's width, or ``WIDTH`` when the output is not a terminal;
``live(render, every, ...)`` repeats a view until interrupted (on a terminal: in place, ``q``
quits; piped: one view after another).  No I/O besides the terminal.
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..protocol import SYS_PEER_TOPIC

NO_PEERS = f"peers: not shown (this identity has no subscribe grant naming {SYS_PEER_TOPIC})"

WIDTH = 80


def console() -> Console:
    """A console at the terminal's width, or 80 columns when the output is piped."""
    if sys.stdout.isatty():
        return Console()
    return Console(width=WIDTH, force_terminal=False, color_system=None)


def count(n: Any) -> str:
    """1234 -> 1,234; 12345 -> 12.3k; 1234567 -> 1.2M (at most 6 characters)."""
    if n is None:
        return "-"
    value = float(n)
    for limit, unit, suffix in ((1e12, 1e12, "T"), (1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if abs(value) >= limit:
            return f"{value / unit:.1f}{suffix}"
    return f"{value:,.0f}" if value == int(value) else f"{value:.1f}"


def size(n: Any) -> str:
    """Bytes as 512B, 1.5K, 3.2M, 4.0G (binary units, at most 6 characters)."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(value) < 1024 or unit == "T":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}T"  # (unreachable)


def per_second(n: float | None) -> str:
    return "-" if n is None else count(round(n, 1)) + "/s"


def _table(title: str, columns: list[tuple[str, str]], name_width: int = 18) -> Table:
    """A compact table: the first column holds names (cut with an ellipsis), the others numbers."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left", expand=False)
    for i, (label, justify) in enumerate(columns):
        if i == 0:
            table.add_column(label, no_wrap=True, overflow="ellipsis", max_width=name_width)
        else:
            table.add_column(label, justify=justify, no_wrap=True, overflow="ellipsis")  # type: ignore[arg-type]
    return table


def stats_view(reports: dict[str, Any], endpoint: str) -> RenderableType:
    overview = reports["stats"]
    parts: list[RenderableType] = [
        Text(
            f"broker {endpoint}: {overview['peers']} peers, {overview['subscriptions']} subscriptions, "
            f"{overview['services']} services, {overview['queued']} queued, {overview['in_flight']} in flight",
            overflow="fold",
        )
    ]
    services = _table(
        "services (latency in ms)",
        [("service", "left")] + [(c, "right") for c in ("wrk", "idle", "queue", "fly", "served", "err", "t/o")]
        + [(p, "right") for p in ("p50", "p95", "p99")],
        name_width=16,
    )  # fmt: skip
    for name, row in reports["services"].items():
        latency = row["latency_ms"]
        services.add_row(
            name,
            *(count(row[k]) for k in ("workers", "idle", "queued", "in_flight", "served", "errors", "timeouts")),
            *("-" if latency[p] is None else f"{latency[p]:.3g}" for p in ("p50", "p95", "p99")),
        )
    parts.append(services)
    topics = _table("subscriptions", [("pattern", "left"), ("subscribers", "right")], name_width=60)
    for pattern, n in reports["topics"].items():
        topics.add_row(pattern, count(n))
    parts.append(topics)
    if reports.get("groups"):
        groups = _table("queue groups", [("group", "left"), ("pattern", "left"), ("members", "right")], 24)
        for group, patterns in reports["groups"].items():
            for pattern, members in patterns.items():
                groups.add_row(group, Text(pattern, overflow="ellipsis"), count(members))
        parts.append(groups)
    if reports.get("consumers"):
        columns = ("pending", "due", "delivered", "redelivered", "acked", "dead_lettered", "ack_floor", "lag")
        labels = ("pend", "due", "deliv", "redel", "acked", "dead", "floor", "lag")
        consumers = _table("durable consumers", [("journal/consumer", "left")] + [(c, "right") for c in labels], 22)
        for key, row in reports["consumers"].items():
            consumers.add_row(key, *(count(row.get(c)) for c in columns))
        parts.append(consumers)
    if reports.get("mailboxes"):
        keeper = overview.get("mailboxes", {}).get("journal")
        boxes = _table(
            f"mailboxes ({f'journal {keeper}' if keeper else 'memory only'})",
            [("identity", "left"), ("letters", "right"), ("bytes", "right")],
            40,
        )
        for identity, row in reports["mailboxes"].items():
            boxes.add_row(identity, count(row["messages"]), size(row["bytes"]))
        parts.append(boxes)
    if reports.get("peers") is None:
        parts.append(Text(NO_PEERS))
    else:
        peers = _table(
            "peers",
            [("peer", "left"), ("kind", "left"), ("v", "left")]
            + [(c, "right") for c in ("subs", "in", "out", "deliv", "drop", "fly", "served")],
            name_width=20,
        )
        for peer in reports["peers"]:
            peers.add_row(
                peer["name"], peer["kind"][:8], peer["protocol"], count(peer["subscriptions"]),
                count(peer.get("msgs_in")), count(peer.get("msgs_out")), count(peer["delivered"]),
                count(peer["dropped"]), count(peer["in_flight"]), count(peer["served"]),
            )  # fmt: skip
        parts.append(peers)
    return Group(*parts)


def _rates(before: list[dict[str, Any]], after: list[dict[str, Any]], key: str, fields: tuple[str, ...],
           seconds: float) -> list[dict[str, Any]]:  # fmt: skip
    """``after``'s rows with ``<field>_rate``: the difference from ``before`` per second (None: new)."""
    old = {row[key]: row for row in before}
    rows = []
    for row in after:
        was = old.get(row[key])
        rates = {
            f"{f}_rate": (row[f] - was[f]) / seconds if was is not None and seconds > 0 and row[f] >= was[f] else None
            for f in fields
        }
        rows.append({**row, **rates})
    return rows


def top_view(before: dict[str, Any], after: dict[str, Any], seconds: float, endpoint: str,
             rows: int = 10) -> RenderableType:  # fmt: skip
    """Peers and topics by rate between two readings (``seconds`` apart), the busiest first."""
    stats = after["stats"]
    counters = stats.get("counters", {})
    header = Text(
        f"mc0 top {endpoint}  peers {stats['peers']}  subs {stats['subscriptions']}  services {stats['services']}"
        f"  queued {stats['queued']}  published {count(counters.get('published', 0))}"
        f"  delivered {count(counters.get('delivered', 0))}",
        overflow="ellipsis",
        no_wrap=True,
    )
    parts: list[RenderableType] = [header]
    if after.get("peers") is None:
        parts.append(Text(NO_PEERS))
    else:
        fields = ("msgs_in", "msgs_out", "bytes_in", "bytes_out")
        peers = _rates(before.get("peers") or [], after["peers"], "name", fields, seconds)
        peers.sort(key=lambda r: -((r["msgs_in_rate"] or 0) + (r["msgs_out_rate"] or 0)))
        table = _table(
            "peers by rate",
            [("peer", "left"), ("kind", "left")]
            + [(c, "right") for c in ("in/s", "out/s", "in B/s", "out B/s", "subs", "drop")],
            name_width=24,
        )
        for peer in peers[:rows]:
            table.add_row(
                peer["name"], peer["kind"][:8], per_second(peer["msgs_in_rate"]), per_second(peer["msgs_out_rate"]),
                size_rate(peer["bytes_in_rate"]), size_rate(peer["bytes_out_rate"]), count(peer["subscriptions"]),
                count(peer["dropped"]),
            )  # fmt: skip
        parts.append(table)
    topics = _rates(before.get("traffic") or [], after.get("traffic") or [], "topic", ("msgs", "bytes"), seconds)
    topics.sort(key=lambda r: -(r["msgs_rate"] or 0))
    table = _table("topics by rate", [(c, "left" if c == "topic" else "right") for c in
                   ("topic", "msg/s", "B/s", "messages", "bytes")], name_width=40)  # fmt: skip
    for topic in topics[:rows]:
        name = "(other topics)" if topic.get("other") else topic["topic"]
        table.add_row(name, per_second(topic["msgs_rate"]), size_rate(topic["bytes_rate"]), count(topic["msgs"]),
                      size(topic["bytes"]))  # fmt: skip
    parts.append(table)
    parts.append(Text("q quits", style="dim"))
    return Group(*parts)


def size_rate(n: float | None) -> str:
    return "-" if n is None else size(n) + "/s"


@contextmanager
def keys_pressed() -> Iterator[Callable[[float], str]]:
    """On a terminal: a function waiting up to ``t`` seconds for a key (returns it, or "");
    the terminal reads keys one at a time meanwhile (cbreak) and is restored after."""
    if not sys.stdin.isatty():

        def wait(t: float) -> str:
            time.sleep(t)
            return ""

        yield wait
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:

        def wait(t: float) -> str:
            ready, _, _ = select.select([fd], [], [], t)
            return os.read(fd, 1).decode(errors="replace") if ready else ""

        yield wait
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def live(render: Callable[[], RenderableType], every: float, out: Console) -> None:
    """Show ``render()`` every ``every`` seconds until ``q`` (on a terminal) or Ctrl-C."""
    from rich.live import Live

    with keys_pressed() as wait:
        if out.is_terminal:
            with Live(render(), console=out, auto_refresh=False, screen=True) as view:
                while True:
                    key = wait(every)
                    if key in ("q", "Q"):
                        return
                    view.update(render(), refresh=True)
        while True:  # piped: one view after another
            out.print(render())
            out.print(Text("-" * WIDTH))
            if wait(every) in ("q", "Q"):
                return
