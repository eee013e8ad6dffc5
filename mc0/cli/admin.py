"""An operator's commands on a running broker: sessions, durable consumers, a journal's records.

Contract: ``mc0 conn ls|close``, ``mc0 consumer ls|rm``, ``mc0 journal get|purge``.  What changes
something, and the consumer listing, goes through the ``mc0.admin`` service (the caller's identity
needs ``call = ["mc0.admin"]`` by name); ``conn ls`` is the ``peers`` report of ``mc0.broker`` (a
subscribe grant naming ``mc0.sys``, or the ``mc0.admin`` grant); ``journal get`` is an ``mc0.journal``
fetch of one seq (the caller's read grants).  Tables are printed whole, never cut (``--json`` for
scripts); every error is one line on stderr and a non-zero status, as for every command.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any

import click

from ..errors import Error
from ..protocol import ADMIN_SERVICE, BROKER_SERVICE, trace_id
from .base import Connection, cli, connection_options, one_line_errors
from .journal import journal as journal_group


def _admin(conn: Connection, op: str, **args: str) -> dict[str, Any]:
    """One ``mc0.admin`` request: its JSON answer (an ERROR answer raises, as every request's)."""
    with conn.client() as client:
        reply = client.request(ADMIN_SERVICE, json.dumps({"op": op, **args}).encode())
    data: dict[str, Any] = json.loads(reply.body)
    return data


def _table(headers: tuple[str, ...], rows: list[tuple[object, ...]]) -> None:
    """Columns as wide as their widest cell (numbers right-aligned), nothing cut."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    numeric = [bool(rows) and all(isinstance(r[i], int) or r[i] is None for r in rows) for i in range(len(headers))]

    def line(values: list[str]) -> str:
        padded = (v.rjust(w) if numeric[i] else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True)))
        return "  ".join(padded).rstrip()

    click.echo(line(list(headers)))
    for row in cells:
        click.echo(line(row))


def _brokers(data: dict[str, Any]) -> str:
    """``, at b1, b2`` for an action done in a cluster ("" for a standalone broker)."""
    done = sorted(name for name, part in data.get("brokers", {}).items() if name and part.get("status") == 200)
    return f" (at {', '.join(done)})" if done else ""


# ---------------------------------------------------------------- sessions
@cli.group("conn")
def conn_group() -> None:
    """Sessions on the broker: list them, close one."""


@conn_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON (one object per session).")
@connection_options
@one_line_errors
def conn_ls(as_json: bool, conn: Connection) -> None:
    """The sessions on the broker asked, by name (identity#n), with what each holds."""
    with conn.client() as client:
        rows: list[dict[str, Any]] = json.loads(client.request(BROKER_SERVICE, b"peers").body)
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    headers = ("NAME", "IDENTITY", "KIND", "PROTOCOL", "SUBS", "DELIVERED", "DROPPED", "IN FLIGHT", "SERVICES")
    _table(
        headers,
        [
            (
                r["name"],
                r["identity"],
                r["kind"],
                r["protocol"],
                r["subscriptions"],
                r["delivered"],
                r["dropped"],
                r["in_flight"],
                ",".join(r["services"]) or "-",
            )
            for r in sorted(rows, key=lambda r: str(r["name"]))
        ],
    )


@conn_group.command("close")
@click.argument("session_id", metavar="ID")
@connection_options
@one_line_errors
def conn_close(session_id: str, conn: Connection) -> None:
    """End exactly the session ID (identity#n, or identity#n@BROKER in a cluster); it is told why."""
    data = _admin(conn, "conn.close", id=session_id)
    name, broker = str(data["closed"]), str(data.get("broker") or "")
    click.echo(f"closed {name}" + (f" at broker {broker}" if broker and not name.endswith(f"@{broker}") else ""))


# ---------------------------------------------------------------- durable consumers
@cli.group("consumer")
def consumer_group() -> None:
    """Durable consumers, whoever owns them: list them, remove one."""


@consumer_group.command("ls")
@click.argument("journal", required=False)
@click.option("--json", "as_json", is_flag=True, help="The consumers as JSON.")
@connection_options
@one_line_errors
def consumer_ls(journal: str | None, as_json: bool, conn: Connection) -> None:
    """Every durable consumer (of JOURNAL), at every broker of a cluster."""
    data = _admin(conn, "consumer.ls", **({"journal": journal} if journal else {}))
    rows: list[dict[str, Any]] = data["consumers"]
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    failed = {name or "here": part.get("error") for name, part in data["brokers"].items() if part["status"] != 200}
    headers = ("JOURNAL", "NAME", "OWNER", "PENDING", "ACK PENDING", "ACK FLOOR", "REDELIVERED", "DEAD", "WHERE")
    _table(
        headers,
        [
            (
                r["journal"],
                r["name"],
                r["owner"] or "-",
                r["num_pending"],
                r["num_ack_pending"],
                r["ack_floor"],
                r["redelivered"],
                r["dead_lettered"],
                "jetstream" if r["store"] == "jetstream" else r["broker"] or "here",
            )
            for r in sorted(rows, key=lambda r: (str(r["journal"]), str(r["name"])))
        ],
    )
    for name, error in sorted(failed.items()):
        click.echo(f"mc0: {name}: {error}", err=True)


@consumer_group.command("rm")
@click.argument("journal")
@click.argument("name")
@connection_options
@one_line_errors
def consumer_rm(journal: str, name: str, conn: Connection) -> None:
    """Remove durable consumer NAME of JOURNAL, whoever owns it (its waiting pulls are told so)."""
    data = _admin(conn, "consumer.rm", journal=journal, name=name)
    click.echo(f"removed consumer {name} of journal {journal}{_brokers(data)}")


# ---------------------------------------------------------------- a journal's records
@journal_group.command("get")
@click.argument("name", metavar="JOURNAL")
@click.argument("seq", type=click.IntRange(min=1))
@connection_options
@one_line_errors
def journal_get(name: str, seq: int, conn: Connection) -> None:
    """Print the record at SEQ of JOURNAL: topic, sender, time, trace id (of its W3C traceparent),
    headers and body (the caller's read grants apply: a record it may not read is not shown)."""
    with conn.client() as client:
        page = client.fetch(name, from_seq=seq, to_seq=seq + 1, max_records=1)
    record = next((r for r in page.records if r.seq == seq), None)
    if record is None:
        kept = f"it keeps {page.first_seq} to {page.end_seq - 1}" if page.end_seq > page.first_seq else "it is empty"
        raise Error(f"journal {name} has no record at seq {seq} that this identity may read ({kept})")
    when = datetime.fromtimestamp(record.ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    click.echo(f"seq: {record.seq}")
    click.echo(f"time: {when}")
    click.echo(f"topic: {record.topic}")
    click.echo(f"sender: {record.sender}")
    click.echo(f"trace: {trace_id(record.headers) or 'none'}")  # (its traceparent's trace id)
    click.echo("headers:" + ("" if record.headers else " none"))
    for key, value in sorted(record.headers.items()):
        click.echo(f"  {key}: {value}")
    body = record.body
    try:
        printable = all(c.isprintable() or c in "\n\r\t" for c in body.decode("utf-8"))
    except UnicodeDecodeError:
        printable = False
    click.echo(f"body: {len(body)} bytes" + ("" if printable else ", not text: shown as hex"))
    sys.stdout.flush()
    if printable:
        click.echo(body.decode("utf-8"))
    else:  # 16 bytes a line
        click.echo("\n".join(body[i : i + 16].hex(" ") for i in range(0, len(body), 16)))


@journal_group.command("purge")
@click.argument("name", metavar="JOURNAL")
@click.option("--yes", is_flag=True, help="Yes: drop every record JOURNAL keeps (at every broker of a cluster).")
@connection_options
@one_line_errors
def journal_purge(name: str, yes: bool, conn: Connection) -> None:
    """Drop every record JOURNAL keeps now; its seqs go on where they were.  Needs --yes."""
    if not yes:
        raise click.UsageError(f"journal purge drops every record of journal {name}: give --yes to do it")
    data = _admin(conn, "journal.purge", journal=name)
    click.echo(f"purged journal {name}: {data['purged']} records dropped{_brokers(data)}")
