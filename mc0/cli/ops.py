"""Commands that run something here: broker, bench, pipeline, report, demo."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import click

from .. import config as cfg
from ..endpoints import check_endpoint
from ..errors import ConfigError, Error
from ..protocol import routes
from .base import Connection, cli, config_option, connection_options, load_config, one_line_errors


@cli.command()
@click.option("--bind", "binds", multiple=True, help="Endpoint to bind (repeatable; tcp://127.0.0.1:* picks a port).")
@click.option("--insecure", is_flag=True, help="Run without CURVE (local development only): everyone is 'anonymous'.")
@click.option(
    "--http",
    "http_listen",
    metavar="HOST:PORT",
    help="Serve monitoring (/healthz /varz /connz /subsz /servicez /metrics) here, e.g. 127.0.0.1:8222.",
)
@click.option(
    "--check-config",
    is_flag=True,
    help="Check the config, keys and journal folders (what the broker would use), then exit: 0 = fine.",
)
@click.option(
    "--cluster",
    "cluster_urls",
    metavar="URL,URL",
    envvar=cfg.ENV_CLUSTER,
    help="Join other brokers over these NATS servers ([cluster] nats; default: $MC0_CLUSTER), e.g. "
    "nats://10.0.0.1:4222,nats://10.0.0.2:4222. A password goes in $MC0_CLUSTER or the config file, "
    "never here: every local user can read a command line.",
)
@click.option("--name", "cluster_name", help="This broker's name in the cluster ([cluster] name; default: HOST-PORT).")
@config_option
@one_line_errors
def broker(
    binds: tuple[str, ...],
    insecure: bool,
    http_listen: str | None,
    check_config: bool,
    cluster_urls: str | None,
    cluster_name: str | None,
    config_path: str | None,
) -> None:
    """Run the broker until SIGINT/SIGTERM (SIGHUP reloads keys and permissions)."""
    from ..broker import Broker

    config = load_config(config_path)
    config = _with_cluster(config, cluster_urls, cluster_name)
    if cluster_urls is not None and _on_command_line("cluster_urls") and _with_credentials(cluster_urls):
        click.echo(
            f"mc0: warning: --cluster holds NATS credentials, which every local user can read (ps); give the "
            f"URLs in ${cfg.ENV_CLUSTER} or the config file's [cluster] nats (mode 0600), or use [cluster] "
            "credentials or nkey_seed",
            err=True,
        )
    for endpoint in binds:
        check_endpoint(endpoint, bind=True, where="--bind")
    if binds:
        config = dataclasses.replace(config, broker=dataclasses.replace(config.broker, bind=binds))
    if insecure:
        config = dataclasses.replace(config, security=dataclasses.replace(config.security, curve=False))
    if http_listen is not None:
        config = dataclasses.replace(config, http=dataclasses.replace(config.http, listen=http_listen))
    from ..broker.check import require_extras

    require_extras(config)  # a missing extra is named before a keypair is made or a port bound
    if check_config:
        from ..broker.check import check_config as check

        source = config_path or os.environ.get(cfg.ENV_CONFIG) or "the embedded defaults (no --config)"
        click.echo(f"config: {source}")
        for line in check(config):
            click.echo(line)
        click.echo("config OK")
        return
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
    if server.http is not None:
        click.echo(f"mc0 broker monitoring on {server.http.url}")
    if server.nng is not None:
        click.echo(f"mc0 broker MemoDB (NNG rep0) on {server.nng.address}")
    sys.stdout.flush()
    server.run()


def _on_command_line(parameter: str) -> bool:
    """The current command's ``parameter`` was given on its command line (not from the environment)."""
    return click.get_current_context().get_parameter_source(parameter) is click.core.ParameterSource.COMMANDLINE


def _with_credentials(urls: str) -> bool:
    """Some URL of a comma-separated list carries a password or a token (``nats://TOKEN@host``)."""
    return any(urllib.parse.urlsplit(url.strip()).username for url in urls.split(","))


def _with_cluster(config: cfg.Config, urls: str | None, name: str | None) -> cfg.Config:
    """``--cluster`` / ``--name`` over ``[cluster]`` (each URL and the name checked: one line naming it)."""
    cluster = config.cluster
    if urls is not None:
        entries = [u.strip() for u in urls.split(",")]
        for i, url in enumerate(entries):
            routes.check_url(url, f"--cluster entry {i + 1}")
        cluster = dataclasses.replace(cluster, nats=tuple(entries))
    if name is not None:
        cluster = dataclasses.replace(cluster, name=routes.check_name(name, "--name"))
    if cluster.name and not cluster.nats:
        raise ConfigError("--name", "a name is for a broker in a cluster: give --cluster URL,URL (or [cluster] nats)")
    return dataclasses.replace(config, cluster=cluster)


@cli.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    options_metavar="--endpoint URL [SCENARIO] [OPTIONS]",
)
@click.pass_context
@one_line_errors
def bench(ctx: click.Context) -> None:
    """Load a running broker, as `nats bench` does: scenarios pubsub (the default), pub, sub,
    request, reply and rpc.

    \b
    mc0 bench --endpoint tcp://127.0.0.1:61616 --pub 2 --sub 2 --msgs 100000
    mc0 bench --endpoint URL --help              the scenarios, --key/--broker-key/--config
    mc0 bench --endpoint URL SCENARIO --help     one scenario's options

    In a source checkout of mc0, options without --endpoint run the comparison beside NATS,
    Majordomo and raw ZeroMQ instead (scripts/bench.py: `mc0 bench --help-bench` lists its
    options); it is not part of the package."""
    if any(a == "--endpoint" or a.startswith("--endpoint=") for a in ctx.args):
        from .load import run

        sys.exit(run(list(ctx.args)))
    if not ctx.args or any(a in ("-h", "--help") for a in ctx.args):
        click.echo(ctx.get_help())  # bare: the usage (--help with --endpoint is the load's own, per scenario)
        return
    import subprocess

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"
    if not script.is_file():
        raise Error(
            f"mc0 bench {' '.join(ctx.args)}: the comparison harness (scripts/bench.py) is in a source checkout"
            " of mc0, not in the package; to load a running broker: mc0 bench --endpoint URL [SCENARIO]"
        )
    args = ["--help" if a == "--help-bench" else a for a in ctx.args]
    sys.exit(subprocess.call([sys.executable, str(script), *args], env={**os.environ, "MC0_PROG": "mc0 bench"}))


def require_spark_extra(command: str, modules: tuple[str, ...]) -> None:
    """One line naming the extra when a module ``command`` needs is not installed (never a traceback
    from deep inside the job)."""
    import importlib

    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise Error(f"{command} needs the Spark extra ({', '.join(missing)} not installed): pip install 'mc0[spark]'")


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
@click.option(
    "--source-option",
    "source_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="An option of the mc0 source (docs/PIPELINE.md), e.g. minPartitions=3; may repeat.",
)
@connection_options
@one_line_errors
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
    source_options: tuple[str, ...],
) -> None:
    """Per-minute traffic, top senders and RPC latency from a journal, with Spark (Parquet + mc0.rollup.*)."""
    require_spark_extra("mc0 pipeline", ("pyspark", "pyarrow", "pandas"))  # before the broker or a JVM
    from rich.console import Console

    from ..spark import make_session
    from ..spark import pipeline as job

    client_config = conn.config().client
    extra: dict[str, str] = {}
    for entry in source_options:
        key, equals, value = entry.partition("=")
        if not equals or not key.strip():
            raise ConfigError("--source-option", f"KEY=VALUE, got {entry!r}")
        extra[key.strip()] = value.strip()
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
        extra_source_options=extra,
    )
    job.check_source(options)  # before paying for a JVM
    console = Console(stderr=True)
    with console.status(f"starting Spark ({master})") as status:
        spark = make_session(None if master == "submit" else master, app="mc0-pipeline")

        shown: set[object] = set()

        def progress(event: dict[str, Any]) -> None:
            line = job.progress_line(event)
            status.update(f"{line}; tables in {output}")
            if event.get("batchId") not in shown:  # one line per batch, kept on screen (stderr)
                shown.add(event.get("batchId"))
                console.print(f"pipeline: {line}", highlight=False)

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
@one_line_errors
def report(input_dir: str, output_dir: str | None) -> None:
    """Charts of traffic and RPC latency over time from the pipeline's tables (HTML + PNG)."""
    require_spark_extra("mc0 report", ("matplotlib", "pyarrow", "pandas"))
    from ..spark.report import build_report

    written = build_report(input_dir, output_dir or os.path.join(input_dir, "report"))
    for path in written:
        click.echo(str(path))


@cli.command()
@one_line_errors
def demo() -> None:
    """Run the end-to-end demo: broker, subscriber, publisher, ping (exits 0)."""
    from ..demo import run_demo

    started = time.monotonic()
    run_demo(click.echo)
    click.echo(f"demo finished in {time.monotonic() - started:.1f}s")


@cli.command("cluster-demo")
@one_line_errors
def cluster_demo() -> None:
    """Three NATS nodes and three brokers on loopback: pub/sub, RPC and failover across them (exits 0)."""
    from ..cluster_demo import run_cluster_demo

    started = time.monotonic()
    run_cluster_demo(click.echo)
    click.echo(f"cluster demo finished in {time.monotonic() - started:.1f}s")
