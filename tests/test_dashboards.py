"""etc/grafana/mc0.json and etc/prometheus/mc0-alerts.yml: every metric their queries name exists in the
/metrics of a real broker (with a journal and a durable consumer, so that every family has samples), and
that /metrics passes ``promtool check metrics``."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import mc0
from mc0 import ports
from mc0.process import BrokerProcess

from .conftest import promtool, require, write_config

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "etc" / "grafana" / "mc0.json"
ALERTS = ROOT / "etc" / "prometheus" / "mc0-alerts.yml"
PROMETHEUS_OWN = {"up"}  # Prometheus's own series for a target (no exporter has it)
# A metric name in PromQL: a word not followed by "(" (a function) that is not a keyword, label or duration.
WORD = re.compile(r"(?<![\w\"'{,=])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w(\"'])")
PROMQL_WORDS = {"by", "without", "and", "or", "unless", "on", "ignoring", "group_left", "group_right", "bool", "le"}


def expressions() -> dict[str, list[str]]:
    yaml = require("yaml")
    dashboard = json.loads(DASHBOARD.read_text())
    panel_exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable.get("type") == "query":
            panel_exprs.append(re.sub(r"label_values\((\w+),.*\)", r"\1", variable["query"]))
    rules = yaml.safe_load(ALERTS.read_text())
    alert_exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    return {"dashboard": panel_exprs, "alerts": alert_exprs}


def metric_names(expr: str) -> set[str]:
    text = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r'"[^"]*"', "", text)
    names = {m for m in WORD.findall(text) if m not in PROMQL_WORDS and not m.isdigit()}
    return {n for n in names if "_" in n or n in PROMETHEUS_OWN}


def test_the_files_are_what_grafana_and_prometheus_read() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["panels"] and all(p["targets"] for p in dashboard["panels"])
    found = expressions()
    alerts = " ".join(found["alerts"])
    for wanted in ("mc0_consumer_pending", "mc0_slow_consumers_total", "up", "mc0_nats_connected"):
        assert wanted in alerts  # a backlog growing, evictions, a broker stalled, NATS disconnected
    assert metric_names('rate(mc0_in_messages_total{instance=~"$x"}[1m]) by (le)') == {"mc0_in_messages_total"}


@pytest.mark.timeout(60)
def test_every_metric_they_name_is_in_a_real_brokers_metrics(tmp_path: Path) -> None:
    port = ports.free_port()
    journal = '[journals.main]\ntopics = ["jobs.>"]\nsegment_bytes = 1048576\n'
    config = write_config(tmp_path, f'[http]\nlisten = "127.0.0.1:{port}"\n{journal}')
    with BrokerProcess(config=config, insecure=True) as broker, mc0.Client(broker.endpoint) as client:
        client.publish("jobs.x", b"1", confirm=True)
        client.consume("main", "invoicing", topics=("jobs.>",))
        worker = mc0.Worker(broker.endpoint)  # a service, so that the per-service families have samples
        worker.service("calc")(lambda message: b"2")
        with worker:
            serving = threading.Thread(target=worker.run, daemon=True)
            serving.start()
            assert client.request("calc", b"1", timeout=10).body == b"2"
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                text = response.read().decode()
            worker.stop()
            serving.join(10)
    # promtool's lint of the exposition: names, units, _total suffixes, HELP text (no output when clean).
    linted = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert linted.returncode == 0 and not linted.stdout.strip() and not linted.stderr.strip(), (
        linted.stdout + linted.stderr
    )
    exposed = set()
    for family in text_string_to_metric_families(text):
        exposed |= {sample.name for sample in family.samples}
    assert {"mc0_consumer_pending", "mc0_consumer_ack_pending", "mc0_journal_records", "mc0_journal_bytes"} <= exposed
    for where, exprs in expressions().items():
        for expr in exprs:
            missing = metric_names(expr) - exposed - PROMETHEUS_OWN
            assert not missing, f"{where}: {expr!r} names {sorted(missing)}, not in /metrics"
