"""The ``mc0`` command line (click).

Contract: every command takes its endpoint and settings from options, then
``MC0_*`` environment variables, then the config file (``--config`` /
``MC0_CONFIG``), then the embedded defaults.  Any mc0 error ends the command
with one line on stderr (``mc0: error: ...``) and exit status 1; usage
errors are one such line too, with exit status 2.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import click

from . import config as cfg
from . import keys as keyfiles
from .client import Client, Worker
from .errors import Error
from .message import Message, Reply

P = ParamSpec("P")
R = TypeVar("R")


def _one_line_errors(func: Callable[P, R]) -> Callable[P, R]:
    @wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except Error as exc:
            click.echo(f"mc0: error: {exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            sys.exit(130)

    return wrapper


def _load_config(path: str | None) -> cfg.Config:
    return cfg.load_default(path)


config_option = click.option(
    "--config",
    "config_path",
    envvar=cfg.ENV_CONFIG,
    type=click.Path(dir_okay=False),
    help="TOML config file (default: $MC0_CONFIG, else the embedded defaults).",
)
endpoint_option = click.option(
    "--endpoint",
    envvar=cfg.ENV_ENDPOINT,
    help="Broker endpoint (default: $MC0_ENDPOINT, config, tcp://127.0.0.1:61616).",
)
timeout_option = click.option(
    "--timeout",
    type=float,
    default=None,
    help="Seconds to wait for the broker (call: the request deadline, default 30).",
)


def key_options(func: Callable[P, R]) -> Callable[P, R]:
    """--key / --broker-key (env MC0_KEY / MC0_BROKER_KEY, then the config's [client])."""
    func = click.option(
        "--broker-key",
        envvar=cfg.ENV_BROKER_KEY,
        type=click.Path(dir_okay=False),
        help="The broker's public key file (NAME.key).",
    )(func)
    return click.option(
        "--key", envvar=cfg.ENV_KEY, type=click.Path(dir_okay=False), help="This client's secret key (NAME.key_secret)."
    )(func)


@dataclass(frozen=True)
class Connection:
    """Where and how a client command reaches the broker (options > MC0_* > config > defaults)."""

    endpoint: str | None
    config_path: str | None
    timeout: float | None
    key: str | None
    broker_key: str | None

    def config(self) -> cfg.Config:
        return _load_config(self.config_path)

    def client(self) -> Client:
        return Client(
            self.endpoint, timeout=self.timeout, config=self.config().client, key=self.key, broker_key=self.broker_key
        )


def connection_options(func: Callable[..., R]) -> Callable[..., R]:
    """--endpoint, --config, --timeout, --key, --broker-key, handed to the command as ``conn``."""

    @wraps(func)
    def wrapper(
        *args: Any,
        endpoint: str | None,
        config_path: str | None,
        timeout: float | None,
        key: str | None,
        broker_key: str | None,
        **kwargs: Any,
    ) -> R:
        return func(*args, conn=Connection(endpoint, config_path, timeout, key, broker_key), **kwargs)

    return endpoint_option(config_option(timeout_option(key_options(wrapper))))


def main(argv: list[str] | None = None) -> None:
    """Console entry point: usage errors too are one line (``mc0: error: ...``, exit 2)."""
    try:
        status = cli.main(args=argv, prog_name="mc0", standalone_mode=False)
    except click.ClickException as exc:
        click.echo(f"mc0: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(130)
    sys.exit(status if isinstance(status, int) else 0)


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.version_option(package_name="mc0")
def cli(verbose: int) -> None:
    """mc0: a secure pub/sub + RPC message bus over ZeroMQ."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@cli.command()
@click.option("--bind", "binds", multiple=True, help="Endpoint to bind (repeatable; tcp://127.0.0.1:* picks a port).")
@click.option("--insecure", is_flag=True, help="Run without CURVE (local development only): everyone is 'anonymous'.")
@config_option
@_one_line_errors
def broker(binds: tuple[str, ...], insecure: bool, config_path: str | None) -> None:
    """Run the broker until SIGINT/SIGTERM (SIGHUP reloads keys and permissions)."""
    from .broker import Broker

    config = _load_config(config_path)
    if binds:
        config = dataclasses.replace(config, broker=dataclasses.replace(config.broker, bind=binds))
    if insecure:
        config = dataclasses.replace(config, security=dataclasses.replace(config.security, curve=False))
    server = Broker(config, config_path=config_path or os.environ.get(cfg.ENV_CONFIG))
    try:
        endpoints = server.bind()
    except Error:
        raise
    except Exception as exc:  # zmq.ZMQError: address in use, bad endpoint ...
        raise Error(f"cannot bind {', '.join(config.broker.bind)}: {exc}") from None
    if server.public_key is not None:
        click.echo(f"mc0 broker public key {server.public_key.decode()}")
    click.echo(f"mc0 broker listening on {' '.join(endpoints)}")
    sys.stdout.flush()
    server.run()


def _parse_headers(pairs: tuple[str, ...]) -> dict[str, str]:
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--header")
        headers[key] = value
    return headers


@cli.command()
@click.argument("topic")
@click.argument("body", required=False)
@click.option("--header", "-H", "header_pairs", multiple=True, metavar="X-KEY=VALUE", help="User header (repeatable).")
@click.option("--confirm", is_flag=True, help="Wait for the broker's OK for each message.")
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True, help="Publish the body N times.")
@click.option("--msgid", default=None, help="Message id: a journal stores a repeat within its dedup window once.")
@connection_options
@_one_line_errors
def pub(
    topic: str,
    body: str | None,
    header_pairs: tuple[str, ...],
    confirm: bool,
    count: int,
    msgid: str | None,
    conn: Connection,
) -> None:
    """Publish BODY (or stdin when BODY is '-' or absent) to TOPIC.

    With --confirm, a journaled message prints where it was stored."""
    data = sys.stdin.buffer.read() if body in (None, "-") else body.encode()
    headers = _parse_headers(header_pairs)
    with conn.client() as client:
        for _ in range(count):
            ack = client.publish(topic, data, headers=headers, confirm=confirm, msgid=msgid)
            if ack is not None and ack.seq is not None:
                repeat = " (duplicate: stored before)" if ack.duplicate else ""
                click.echo(f"{ack.journal} seq {ack.seq}{repeat}")
        if not confirm:
            client.ping()  # everything before it has reached the broker


def _message_line(message: Message, as_json: bool) -> str:
    if as_json:
        record: dict[str, Any] = {"topic": message.topic, "sender": message.sender, "headers": message.headers}
        if message.seq is not None:
            record["journal"], record["seq"] = message.journal, message.seq
        try:
            record["body"] = message.body.decode("utf-8")
        except UnicodeDecodeError:
            record["body_base64"] = base64.b64encode(message.body).decode()
        return json.dumps(record, ensure_ascii=False)
    return f"{message.topic} {message.body.decode('utf-8', 'backslashreplace')}"


@cli.command()
@click.argument("patterns", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Exit after N messages.")
@click.option(
    "--wait", type=float, default=None, help="Exit with status 1 if no message arrives for this many seconds."
)
@click.option(
    "--from",
    "from_seq",
    type=click.IntRange(min=0),
    default=None,
    help="First replay the journaled history from this seq (0 = the oldest kept), then continue live.",
)
@click.option("--journal", default=None, help="With --from: the journal to replay (when several keep the topics).")
@connection_options
@_one_line_errors
def sub(
    patterns: tuple[str, ...],
    as_json: bool,
    count: int | None,
    wait: float | None,
    from_seq: int | None,
    journal: str | None,
    conn: Connection,
) -> None:
    """Print one line per message matching any PATTERN."""
    with (
        conn.client() as client,
        client.subscribe(*patterns, from_seq=from_seq, journal=journal) as subscription,
    ):
        seen = 0
        while count is None or seen < count:
            message = subscription.next(wait)
            click.echo(_message_line(message, as_json))
            sys.stdout.flush()
            seen += 1


@cli.command()
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True)
@connection_options
@_one_line_errors
def ping(
    count: int,
    conn: Connection,
) -> None:
    """Measure round trips to the broker."""
    with conn.client() as client:
        times = []
        for _ in range(count):
            rtt = client.ping()
            times.append(rtt)
            click.echo(f"PONG from {client.endpoint}: {rtt * 1000:.3f} ms")
        if count > 1:
            times.sort()
            click.echo(f"{count} pings: min {times[0] * 1000:.3f} ms, median {times[len(times) // 2] * 1000:.3f} ms")


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
@_one_line_errors
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
    headers = _parse_headers(header_pairs)
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
@_one_line_errors
def serve(
    handler_spec: str,
    services: tuple[str, ...],
    capacity: int,
    ttl: float | None,
    conn: Connection,
) -> None:
    """Run MODULE:FUNCTION as a worker for each --service until SIGINT/SIGTERM."""
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
    with worker:
        click.echo(f"mc0 worker serving {' '.join(services)} on {worker.endpoint}")
        sys.stdout.flush()
        worker.run()


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the raw reports as JSON.")
@connection_options
@_one_line_errors
def stats(
    as_json: bool,
    conn: Connection,
) -> None:
    """Show the broker's services, workers, queues, topics and peers."""
    from .protocol import BROKER_SERVICE

    with conn.client() as client:
        reports = {op: json.loads(client.request(BROKER_SERVICE, op).body) for op in ("stats", "services", "topics")}
        reports["peers"] = json.loads(client.request(BROKER_SERVICE, "peers").body)
    if as_json:
        click.echo(json.dumps(reports, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    overview = reports["stats"]
    console.print(
        f"[bold]broker[/bold] {client.endpoint}: {overview['peers']} peers, {overview['subscriptions']} "
        f"subscriptions, {overview['services']} services, {overview['queued']} queued, "
        f"{overview['in_flight']} in flight"
    )
    table = Table(title="services")
    for column in (
        "service",
        "workers",
        "idle",
        "queued",
        "in flight",
        "served",
        "errors",
        "timeouts",
        "p50 ms",
        "p99 ms",
    ):
        table.add_column(column, justify="left" if column == "service" else "right")
    for name, row in reports["services"].items():
        latency = row["latency_ms"]
        table.add_row(
            name,
            *(str(row[k]) for k in ("workers", "idle", "queued", "in_flight", "served", "errors", "timeouts")),
            str(latency["p50"] if latency["p50"] is not None else "-"),
            str(latency["p99"] if latency["p99"] is not None else "-"),
        )
    console.print(table)
    topics = Table(title="subscriptions")
    topics.add_column("pattern")
    topics.add_column("subscribers", justify="right")
    for pattern, count in reports["topics"].items():
        topics.add_row(pattern, str(count))
    console.print(topics)
    peers = Table(title="peers")
    for column in ("peer", "kind", "protocol", "subs", "delivered", "dropped", "services", "in flight", "served"):
        peers.add_column(column)
    for peer in reports["peers"]:
        peers.add_row(
            peer["name"],
            peer["kind"],
            peer["protocol"],
            str(peer["subscriptions"]),
            str(peer["delivered"]),
            str(peer["dropped"]),
            ",".join(peer["services"]),
            str(peer["in_flight"]),
            str(peer["served"]),
        )
    console.print(peers)


@cli.group()
def keys() -> None:
    """Create, list, allow and revoke CURVE keys."""


dir_option = click.option("--dir", "keys_dir", default=None, help="Key folder (default: [security] keys_dir, 'keys').")
allowed_option = click.option(
    "--allowed", "allowed_dir", default=None, help="The broker's allowed folder (default: [security] allowed_dir)."
)


def _folders(config_path: str | None, keys_dir: str | None, allowed_dir: str | None) -> tuple[Path, Path, Path]:
    security = _load_config(config_path).security
    allowed = Path(allowed_dir or security.allowed_dir)
    return Path(keys_dir or security.keys_dir), allowed, allowed.parent / "revoked"


@keys.command("new")
@click.argument("name")
@dir_option
@click.option("--passphrase", is_flag=True, help="Seal the secret key (prompts, or uses MC0_PASSPHRASE).")
@click.option("--force", is_flag=True, help="Overwrite an existing keypair.")
@config_option
@_one_line_errors
def keys_new(name: str, keys_dir: str | None, passphrase: bool, force: bool, config_path: str | None) -> None:
    """Create NAME.key and NAME.key_secret (mode 0600)."""
    folder, _, _ = _folders(config_path, keys_dir, None)
    secret: str | None = None
    if passphrase:
        secret = os.environ.get(keyfiles.ENV_PASSPHRASE) or click.prompt(
            "passphrase", hide_input=True, confirmation_prompt=True
        )
    public_path, secret_path = keyfiles.create(folder, name, passphrase=secret, force=force)
    pair = keyfiles.load_public(public_path)
    click.echo(f"{public_path}  {pair.fingerprint}")
    click.echo(f"{secret_path}  (secret, mode 0600{', sealed' if secret else ''}; never share or commit it)")


@keys.command("list")
@dir_option
@allowed_option
@config_option
@_one_line_errors
def keys_list(keys_dir: str | None, allowed_dir: str | None, config_path: str | None) -> None:
    """List keys with fingerprint and whether the broker allows them."""
    from rich.console import Console
    from rich.table import Table

    folder, allowed, revoked = _folders(config_path, keys_dir, allowed_dir)
    rows: dict[str, dict[str, str]] = {}
    for where, status in ((folder, "-"), (revoked, "revoked"), (allowed, "allowed")):
        for path in sorted(where.glob(f"*{keyfiles.PUBLIC_SUFFIX}")) if where.is_dir() else []:
            name = path.name[: -len(keyfiles.PUBLIC_SUFFIX)]
            try:
                fingerprint = keyfiles.load_public(path).fingerprint
            except Error as exc:
                fingerprint = f"unreadable: {exc}"
            row = rows.setdefault(name, {"fingerprint": fingerprint, "status": "-", "secret": "no"})
            if status != "-":
                row["status"] = status
            if where == folder and (folder / f"{name}{keyfiles.SECRET_SUFFIX}").exists():
                row["secret"] = "yes"
    table = Table(title=f"keys in {folder} (allowed: {allowed})")
    for column in ("name", "fingerprint", "status", "secret here"):
        table.add_column(column)
    for name, row in sorted(rows.items()):
        table.add_row(name, row["fingerprint"], row["status"], row["secret"])
    Console().print(table)


@keys.command("show")
@click.argument("name")
@dir_option
@config_option
@_one_line_errors
def keys_show(name: str, keys_dir: str | None, config_path: str | None) -> None:
    """Print NAME's public key (Z85)."""
    folder, _, _ = _folders(config_path, keys_dir, None)
    click.echo(keyfiles.load_public(keyfiles.resolve(name, folder, keyfiles.PUBLIC_SUFFIX)).public.decode())


@keys.command("allow")
@click.argument("key")
@dir_option
@allowed_option
@config_option
@_one_line_errors
def keys_allow(key: str, keys_dir: str | None, allowed_dir: str | None, config_path: str | None) -> None:
    """Admit KEY (a NAME.key file, or NAME in the key folder) to the broker."""
    folder, allowed, revoked = _folders(config_path, keys_dir, allowed_dir)
    source = keyfiles.resolve(key, folder, keyfiles.PUBLIC_SUFFIX)
    pair = keyfiles.load_public(source)  # refuses secrets and malformed files
    name = keyfiles.check_name(source.name.split(keyfiles.PUBLIC_SUFFIX)[0])
    allowed.mkdir(parents=True, exist_ok=True)
    target = allowed / f"{name}{keyfiles.PUBLIC_SUFFIX}"
    staging = allowed / f".{name}.tmp"
    staging.write_bytes(source.read_bytes())
    staging.replace(target)  # atomic: the broker never reads half a file
    (revoked / target.name).unlink(missing_ok=True)
    click.echo(f"allowed {name} ({pair.fingerprint}) in {allowed}")


@keys.command("revoke")
@click.argument("name")
@allowed_option
@config_option
@_one_line_errors
def keys_revoke(name: str, allowed_dir: str | None, config_path: str | None) -> None:
    """Withdraw NAME: a running broker cuts it off within a second."""
    _, allowed, revoked = _folders(config_path, None, allowed_dir)
    source = allowed / f"{keyfiles.check_name(name)}{keyfiles.PUBLIC_SUFFIX}"
    if not source.exists():
        raise Error(f"{source}: {name} is not allowed")
    revoked.mkdir(parents=True, exist_ok=True)
    source.replace(revoked / source.name)
    click.echo(f"revoked {name} (moved to {revoked})")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def bench(ctx: click.Context) -> None:
    """Benchmarks beside NATS, Majordomo and raw ZeroMQ (options: see `mc0 bench --help-bench`).

    The harness lives in the source checkout (benchmarks/, run by scripts/bench.py), not in the package."""
    import subprocess

    script = Path(__file__).resolve().parent.parent / "scripts" / "bench.py"
    if not script.is_file():
        raise Error(f"mc0 bench runs {script} from a source checkout of mc0; it is not there")
    args = ["--help" if a == "--help-bench" else a for a in ctx.args]
    sys.exit(subprocess.call([sys.executable, str(script), *args]))


@cli.command()
@click.option("--journal", default="main", show_default=True, help="The broker journal to read.")
@click.option(
    "--output", default=os.path.join("var", "pipeline"), show_default=True, help="Folder of the Parquet tables."
)
@click.option("--checkpoint", default=None, help="Streaming checkpoint folder (default: OUTPUT/_checkpoint).")
@click.option(
    "--master",
    default="local[*]",
    show_default=True,
    help="Spark master (local[*], spark://host:7077, yarn, ...; 'submit': leave it to spark-submit).",
)
@click.option("--once", is_flag=True, help="Process what the journal holds now, then exit (availableNow).")
@click.option(
    "--trigger",
    "trigger_seconds",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Seconds between micro-batches when running continuously.",
)
@click.option("--max-records-per-trigger", type=click.IntRange(min=1), default=None, help="Cap each micro-batch.")
@click.option("--top-senders", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--no-publish", is_flag=True, help="Do not publish the rollups on mc0.rollup.*.")
@connection_options
@_one_line_errors
def pipeline(
    conn: Connection,
    journal: str,
    output: str,
    checkpoint: str | None,
    master: str,
    once: bool,
    trigger_seconds: int,
    max_records_per_trigger: int | None,
    top_senders: int,
    no_publish: bool,
) -> None:
    """Per-minute traffic, top senders and RPC latency from a journal, with Spark (Parquet + mc0.rollup.*)."""
    try:
        from .spark import make_session
        from .spark import pipeline as job
    except ImportError as exc:
        raise Error(f"the pipeline needs the Spark extra: pip install 'mc0[spark]' ({exc})") from None
    from rich.console import Console

    client_config = conn.config().client
    options = job.PipelineOptions(
        endpoint=conn.endpoint or client_config.endpoint,
        journal=journal,
        key=conn.key or client_config.key or None,
        broker_key=conn.broker_key or client_config.broker_key or None,
        output=output,
        checkpoint=checkpoint,
        once=once,
        trigger_seconds=trigger_seconds,
        max_records_per_trigger=max_records_per_trigger,
        top_senders=top_senders,
        publish=not no_publish,
        timeout=conn.timeout,
    )
    job.check_source(options)  # before paying for a JVM
    console = Console(stderr=True)
    with console.status(f"starting Spark ({master})") as status:
        spark = make_session(None if master == "submit" else master, app="mc0-pipeline")

        def progress(event: dict[str, Any]) -> None:
            rate = event.get("processedRowsPerSecond") or 0.0
            status.update(
                f"batch {event.get('batchId')}: {event.get('numInputRows', 0)} records ({rate:,.0f}/s); "
                f"tables in {output}"
            )

        status.update("reading the journal")
        try:
            totals = job.run(spark, options, progress)
        finally:
            spark.stop()
    click.echo(f"pipeline: {totals['batches']} batches, {totals['events']} events -> {output}")


@cli.command()
@click.option(
    "--input",
    "input_dir",
    default=os.path.join("var", "pipeline"),
    show_default=True,
    help="The pipeline's output folder.",
)
@click.option(
    "--output", "output_dir", default=None, help="Where to write report.html and the PNGs (default: INPUT/report)."
)
@_one_line_errors
def report(input_dir: str, output_dir: str | None) -> None:
    """Charts of traffic and RPC latency over time from the pipeline's tables (HTML + PNG)."""
    try:
        from .spark.report import build_report
    except ImportError as exc:
        raise Error(f"the report needs the Spark extra: pip install 'mc0[spark]' ({exc})") from None
    written = build_report(input_dir, output_dir or os.path.join(input_dir, "report"))
    for path in written:
        click.echo(str(path))


@cli.command()
@_one_line_errors
def demo() -> None:
    """Run the end-to-end demo: broker, subscriber, publisher, ping (exits 0)."""
    from .demo import run_demo

    started = time.monotonic()
    run_demo(click.echo)
    click.echo(f"demo finished in {time.monotonic() - started:.1f}s")
