"""Commands that talk to a running broker: pub, sub, ping, call, serve, stats, top."""

from __future__ import annotations

import base64
import json
import logging
import os
import sys
import threading
from typing import Any

import click

from ..aio.worker import HANDLER_THREAD_PREFIX
from ..client import Client, Worker
from ..errors import Error, Forbidden, RemoteError, Timeout
from ..message import Message, Reply
from ..protocol import BROKER_SERVICE, IDENTITY_OP, MAILBOX_STORED
from .base import Connection, cli, connection_options, one_line_errors, parse_headers, set_option_help


@cli.command()
@click.argument("topic")
@click.argument("body", required=False)
@click.option("--header", "-H", "header_pairs", multiple=True, metavar="X-KEY=VALUE", help="User header (repeatable).")
@click.option("--confirm", is_flag=True, help="Wait for the broker's OK for each message.")
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True, help="Publish the body N times.")
@click.option(
    "--msgid", default=None, help="Message id: a repeat within the dedup window is stored (or, --to, taken) once."
)
@click.option(
    "--to", "to", default=None, metavar="IDENTITY", help="A direct message to this identity (kept while it is offline)."
)
@click.option("--json", "as_json", is_flag=True, help="With --confirm: one JSON object per message (where it went).")
@connection_options
@one_line_errors
def pub(
    topic: str,
    body: str | None,
    header_pairs: tuple[str, ...],
    confirm: bool,
    count: int,
    msgid: str | None,
    to: str | None,
    as_json: bool,
    conn: Connection,
) -> None:
    """Publish BODY (or stdin when BODY is '-' or absent) to TOPIC.

    With --confirm, a journaled message prints where it was stored (journal and
    seq). A direct message (--to IDENTITY) always prints whether it was
    delivered or stored for later, and notes on stderr an identity the broker
    never saw (a misspelt name looks just like one that is offline)."""
    data = sys.stdin.buffer.read() if body in (None, "-") else body.encode()
    headers = parse_headers(header_pairs)
    warned = False
    refusals = _Refusals()  # an unconfirmed PUT's ERROR comes back unasked: the command fails on it
    client_log = logging.getLogger("mc0.client")
    client_log.addFilter(refusals)
    try:
        with conn.client() as client:
            for _ in range(count):
                if to is not None:  # always confirmed: where a letter went is what the command tells
                    outcome = client.send_to(to, topic, data, headers=headers, confirm=True, msgid=msgid)
                    letter = {"to": to, "topic": topic, "outcome": outcome}
                    click.echo(json.dumps(letter) if as_json else f"{to}: {outcome}")
                    if outcome == MAILBOX_STORED and not warned:
                        warned = _warn_if_never_seen(client, to)
                    continue
                ack = client.publish(topic, data, headers=headers, confirm=confirm, msgid=msgid)
                if as_json and ack is not None:
                    record = {"topic": topic, "journal": ack.journal, "seq": ack.seq, "duplicate": ack.duplicate}
                    click.echo(json.dumps(record))
                elif ack is not None and ack.seq is not None:
                    repeat = " (duplicate: stored before)" if ack.duplicate else ""
                    click.echo(f"{ack.journal} seq {ack.seq}{repeat}")
            if not confirm:
                client.ping()  # everything before it has reached the broker, and its refusals came back
    finally:
        client_log.removeFilter(refusals)
    refusals.raise_first()


def _warn_if_never_seen(client: Client, identity: str) -> bool:
    """A letter was stored: if the broker never saw ``identity`` since it started, say so on stderr
    (a misspelt name looks just like an identity that is offline).  True when it warned."""
    query = json.dumps({"op": IDENTITY_OP, "identity": identity})
    try:
        answer = json.loads(client.request(BROKER_SERVICE, query).body)
    except (Error, ValueError):
        return False  # an older broker without the op, or no answer: no hint rather than a failure
    if answer.get("seen") is not False:
        return False
    click.echo(
        f"mc0: note: no identity {identity!r} has connected to this broker since it started; the letter waits for"
        " one (check the name: `mc0 keys list` shows the allowed identities)",
        err=True,
    )
    return True


class _Refusals(logging.Filter):
    """Takes the broker's refusals of unconfirmed publishes out of the client's log (where the
    library reports them) so that ``pub`` ends with one line for them, and a non-zero exit."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[RemoteError] = []

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.args[0] if isinstance(record.args, tuple) and record.args else None
        if isinstance(error, RemoteError):
            self.errors.append(error)
            return False
        return True

    def raise_first(self) -> None:
        if not self.errors:
            return
        first = self.errors[0]
        more = len(self.errors) - 1
        if more:
            raise type(first)(first.code, f"{first.reason} (and {more} more refused)")
        raise first


def _message_line(message: Message, as_json: bool) -> str:
    if as_json:
        record: dict[str, Any] = {"topic": message.topic, "sender": message.sender, "headers": message.headers}
        if message.seq is not None:
            record["journal"], record["seq"] = message.journal, message.seq
        if message.group is not None:
            record["group"] = message.group
        try:
            record["body"] = message.body.decode("utf-8")
        except UnicodeDecodeError:
            record["body_base64"] = base64.b64encode(message.body).decode()
        return json.dumps(record, ensure_ascii=False)
    return f"{message.topic} {message.body.decode('utf-8', 'backslashreplace')}"


NO_MESSAGE_STATUS = 3  # sub --wait ran out: a normal outcome a script can test for (1 = an error)


@cli.command()
@click.argument("patterns", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Exit after N messages.")
@click.option(
    "--wait",
    type=float,
    default=None,
    help=f"Stop (exit status {NO_MESSAGE_STATUS}, not an error) if no message arrives for this many seconds.",
)
@click.option(
    "--from",
    "from_seq",
    type=click.IntRange(min=0),
    default=None,
    help="First replay the journaled history from this seq (0 = the oldest kept), then continue live.",
)
@click.option("--journal", default=None, help="With --from: the journal to replay (when several keep the topics).")
@click.option(
    "--group",
    default=None,
    help="Join this queue group: each message goes to one member of the group (not with --from).",
)
@connection_options
@one_line_errors
def sub(
    patterns: tuple[str, ...],
    as_json: bool,
    count: int | None,
    wait: float | None,
    from_seq: int | None,
    journal: str | None,
    group: str | None,
    conn: Connection,
) -> None:
    """Print one line per message matching any PATTERN."""
    if group is not None and from_seq is not None:
        raise click.UsageError("--group and --from do not go together (a queue group cannot replay)")
    with (
        conn.client() as client,
        client.subscribe(*patterns, from_seq=from_seq, journal=journal, group=group) as subscription,
    ):
        seen = 0
        while count is None or seen < count:
            try:
                message = subscription.next(wait)
            except Timeout:
                if wait is None:
                    raise
                click.echo(f"mc0: no message within {wait:g}s on {', '.join(patterns)} ({seen} received)", err=True)
                sys.exit(NO_MESSAGE_STATUS)
            click.echo(_message_line(message, as_json))
            sys.stdout.flush()
            seen += 1


@cli.command()
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per PONG (and one summary with --count > 1).")
@connection_options
@one_line_errors
def ping(
    count: int,
    as_json: bool,
    conn: Connection,
) -> None:
    """Measure round trips to the broker."""
    with conn.client() as client:
        times = []
        for _ in range(count):
            rtt = client.ping()
            times.append(rtt)
            if as_json:
                click.echo(json.dumps({"endpoint": client.endpoint, "rtt_ms": round(rtt * 1000, 3)}))
            else:
                click.echo(f"PONG from {client.endpoint}: {rtt * 1000:.3f} ms")
        if count > 1:
            times.sort()
            low, median = times[0] * 1000, times[len(times) // 2] * 1000
            if as_json:
                click.echo(json.dumps({"count": count, "min_ms": round(low, 3), "median_ms": round(median, 3)}))
            else:
                click.echo(f"{count} pings: min {low:.3f} ms, median {median:.3f} ms")


def _body_text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


def _reply_record(reply: Reply) -> dict[str, Any]:
    record: dict[str, Any] = {"final": reply.final, "headers": reply.headers}
    if reply.worker is not None:
        record["worker"] = reply.worker
    if reply.error is not None:
        record["error"] = str(reply.error)
    try:
        record["body"] = reply.body.decode("utf-8")
    except UnicodeDecodeError:
        record["body_base64"] = base64.b64encode(reply.body).decode()
    return record


@cli.command()
@click.argument("service")
@click.argument("body", required=False)
@click.option("--all", "scatter", is_flag=True, help="Scatter-gather: ask every worker of the service.")
@click.option("--header", "-H", "header_pairs", multiple=True, metavar="X-KEY=VALUE", help="User header (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per reply.")
@connection_options
@one_line_errors
def call(
    service: str,
    body: str | None,
    scatter: bool,
    header_pairs: tuple[str, ...],
    as_json: bool,
    conn: Connection,
) -> None:
    """Call SERVICE with BODY (stdin when '-'; empty when absent); print replies as they come."""
    data = sys.stdin.buffer.read() if body == "-" else (body or "").encode()
    headers = parse_headers(header_pairs)
    with conn.client() as client:
        if scatter:
            with client.scatter(service, data, timeout=conn.timeout, headers=headers) as stream:
                for reply in stream:
                    if as_json:
                        click.echo(json.dumps(_reply_record(reply), ensure_ascii=False))
                    elif reply.error is not None:
                        click.echo(f"{reply.worker}: error {reply.error}")
                    else:
                        click.echo(f"{reply.worker}: {_body_text(reply.body)}")
                click.echo(f"{stream.count} answered, {stream.missing} missing", err=True)
            return
        with client.stream(service, data, timeout=conn.timeout, headers=headers) as stream:
            for reply in stream:
                if as_json:
                    click.echo(json.dumps(_reply_record(reply), ensure_ascii=False))
                elif reply.parts or not reply.final:
                    click.echo(_body_text(reply.body))
                sys.stdout.flush()


set_option_help(
    call,
    "timeout",
    "The request's deadline in seconds (default 30: [client] request_timeout_ms; the broker answers 504 after it).",
)


def _import_handler(spec: str) -> Any:
    import importlib
    import os

    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise click.BadParameter(f"{spec!r} is not MODULE:FUNCTION", param_hint="HANDLER")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise Error(f"cannot import {module_name}: {exc}") from None
    handler = getattr(module, attribute, None)
    if not callable(handler):
        raise Error(f"{module_name} has no callable {attribute!r}")
    return handler


@cli.command()
@click.argument("handler_spec", metavar="MODULE:FUNCTION")
@click.option("--service", "services", multiple=True, required=True, help="Service name to serve (repeatable).")
@click.option("--capacity", type=click.IntRange(min=1), default=1, show_default=True, help="Requests held at once.")
@click.option("--ttl", type=float, default=None, help="Heartbeat interval in seconds (default from config).")
@connection_options
@one_line_errors
def serve(
    handler_spec: str,
    services: tuple[str, ...],
    capacity: int,
    ttl: float | None,
    conn: Connection,
) -> None:
    """Run MODULE:FUNCTION as a worker for each --service until SIGINT/SIGTERM (the first drains:
    no new work, running calls finish and reply; a second cancels them).

    The function receives an mc0.Request (.body bytes, .headers, .caller: the identity that
    called, .deadline) and returns the reply's body: bytes, str, None, a list of frames, or an
    mc0.Reply (to set headers). A generator yields PARTIAL replies and returns the FINAL; an
    async function or generator runs on the worker's event loop; an exception becomes ERROR 500
    with its message. MODULE is imported from the current folder or sys.path, e.g. greet.py:

    \b
        def hello(request):
            return b"hello " + request.body

    \b
    mc0 serve greet:hello --service greet --capacity 4"""
    handler = _import_handler(handler_spec)
    worker = Worker(
        conn.endpoint,
        capacity=capacity,
        ttl=ttl,
        timeout=conn.timeout,
        config=conn.config().client,
        key=conn.key,
        broker_key=conn.broker_key,
    )
    for name in services:
        worker.service(name)(handler)

    def announce() -> None:
        click.echo(f"mc0 worker serving {' '.join(services)} on {worker.endpoint}")
        sys.stdout.flush()

    # run() connects: its SIGINT/SIGTERM handling is in place before the broker can dispatch here (the
    # first signal drains, a second cancels), however late this thread gets to run on a loaded box.
    try:
        worker.run(ready=announce)
    finally:
        worker.close()
    # A second signal cancelled handlers, but a sync handler's thread cannot be interrupted and
    # Python joins it at exit: leave now (the broker has already answered its caller).
    stuck = [t for t in threading.enumerate() if t.name.startswith(HANDLER_THREAD_PREFIX) and t.is_alive()]
    for thread in stuck:
        thread.join(0.5)  # idle pool threads exit at once after the executor's shutdown
    stuck = [t for t in stuck if t.is_alive()]
    if stuck:
        click.echo(f"mc0 serve: stopped with {len(stuck)} handlers still running (cancelled)", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


STATS_OPS = ("stats", "services", "topics", "groups", "mailboxes", "consumers")


def _reports(client: Any, ops: tuple[str, ...] = STATS_OPS) -> dict[str, Any]:
    """The broker's ``mc0.broker`` reports, and its peers when this identity may see them (else None)."""
    from ..protocol import BROKER_SERVICE

    reports: dict[str, Any] = {op: json.loads(client.request(BROKER_SERVICE, op).body) for op in ops}
    try:  # who is connected: only for identities granted peer telemetry (docs/SECURITY.md)
        reports["peers"] = json.loads(client.request(BROKER_SERVICE, "peers").body)
    except Forbidden:
        reports["peers"] = None
    return reports


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the raw reports as JSON.")
@click.option("--watch", is_flag=True, help="Show them again every --interval seconds (q or Ctrl-C quits).")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True, help="With --watch.")
@connection_options
@one_line_errors
def stats(
    as_json: bool,
    watch: bool,
    interval: float,
    conn: Connection,
) -> None:
    """Show the broker's services, workers, queues, topics and peers (in 80 columns)."""
    from .watch import console, live, stats_view

    with conn.client() as client:
        if as_json:
            click.echo(json.dumps(_reports(client), indent=2, sort_keys=True))
            return
        out = console()
        if watch:
            live(lambda: stats_view(_reports(client), client.endpoint), interval, out)
        else:
            out.print(stats_view(_reports(client), client.endpoint))


@cli.command()
@click.option("--interval", type=click.FloatRange(min=0.2), default=1.0, show_default=True, help="Seconds between.")
@click.option("--rows", type=click.IntRange(1, 100), default=10, show_default=True, help="Peers and topics shown.")
@connection_options
@one_line_errors
def top(interval: float, rows: int, conn: Connection) -> None:
    """A live view of peers and topics by rate (like nats top); q quits.  Peers need a subscribe
    grant naming mc0.sys.peer, as `mc0 stats` does."""
    import time

    from .watch import console, live, top_view

    with conn.client() as client:
        ops = ("stats", "traffic")
        last: list[Any] = [_reports(client, ops), time.monotonic()]

        def render() -> Any:
            now = time.monotonic()
            fresh = _reports(client, ops)
            view = top_view(last[0], fresh, now - last[1], client.endpoint, rows)
            last[0], last[1] = fresh, now
            return view

        live(render, interval, console())


@cli.command()
@click.argument("journal")
@click.argument("name")
@click.option("--topic", "topics", multiple=True, help="Topic pattern of a new consumer (repeatable; default >).")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Exit after N messages.")
@click.option("--wait", type=float, default=None, help="Exit when no message arrives for this many seconds.")
@click.option("--batch", type=click.IntRange(1, 1000), default=100, show_default=True, help="Messages per pull.")
@click.option("--ack-wait", type=float, default=30.0, show_default=True, help="A new consumer's ack_wait (seconds).")
@click.option("--max-deliver", type=click.IntRange(min=1), default=5, show_default=True, help="A new consumer's.")
@click.option("--no-ack", is_flag=True, help="Print without acknowledging (they come back after ack_wait).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@connection_options
@one_line_errors
def consume(
    journal: str,
    name: str,
    topics: tuple[str, ...],
    count: int | None,
    wait: float | None,
    batch: int,
    ack_wait: float,
    max_deliver: int,
    no_ack: bool,
    as_json: bool,
    conn: Connection,
) -> None:
    """Print messages of durable consumer NAME on JOURNAL (created if new), acknowledging each
    batch once printed; the broker keeps the position, so the next run continues after it."""
    import time

    with conn.client() as client:
        consumer = client.consume(journal, name, topics=topics or (">",), ack_wait=ack_wait, max_deliver=max_deliver)
        seen = 0
        quiet_since = time.monotonic()
        while count is None or seen < count:
            want = batch if count is None else min(batch, count - seen)
            messages = consumer.fetch(want, wait=1.0 if wait is None else min(wait, 1.0))
            if not messages:
                if wait is not None and time.monotonic() - quiet_since >= wait:
                    break
                continue
            quiet_since = time.monotonic()
            for message in messages:
                line = _message_line(message.message, as_json)
                click.echo(line if as_json else f"{line} (seq {message.seq}, delivery {message.deliveries})")
            sys.stdout.flush()
            if not no_ack:
                consumer.ack(*messages)
            seen += len(messages)
