"""etc/prometheus/mc0-alerts.yml under promtool (Debian's prometheus package): the rules pass
``promtool check rules``; every rule has its unit test in tests/promtool/mc0-alerts-test.yml (input
series, the alert expected with its labels and its rendered summary and description where it should
fire, none where it should not), and ``promtool test rules`` passes them; every rule's summary and
description name a figure (its value, or the duration its ``for`` holds)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from .conftest import promtool, require

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "etc" / "prometheus" / "mc0-alerts.yml"
UNIT_TESTS = ROOT / "tests" / "promtool" / "mc0-alerts-test.yml"


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=60, cwd=ROOT)


def rules() -> list[dict[str, Any]]:
    yaml = require("yaml")
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules() -> None:
    checked = run("check", "rules", RULES)
    assert checked.returncode == 0 and f"SUCCESS: {len(rules())} rules found" in checked.stdout, (
        checked.stdout + checked.stderr
    )


def test_every_alert_rule_has_a_unit_test_that_fires_and_stays_silent() -> None:
    yaml = require("yaml")
    groups = {group["name"]: group for group in yaml.safe_load(UNIT_TESTS.read_text())["tests"]}
    names = [rule["alert"] for rule in rules()]
    assert sorted(groups) == sorted(names)  # one test group per rule, named after it
    for name in names:
        cases = groups[name]["alert_rule_test"]
        assert {case["alertname"] for case in cases} == {name}
        assert any(case["exp_alerts"] == [] for case in cases), f"{name}: no case where it stays silent"
        fired = [alert for case in cases for alert in case["exp_alerts"]]
        assert fired, f"{name}: no case where it fires"
        for alert in fired:  # its labels and both texts as rendered
            assert alert["exp_labels"]["severity"] and set(alert["exp_annotations"]) == {"summary", "description"}


def test_every_rules_texts_name_a_figure() -> None:
    for rule in rules():
        for text in (rule["annotations"]["summary"], rule["annotations"]["description"]):
            # its value as a whole number, or the time its `for` holds, in words
            assert '$value | printf "%.0f"' in text or "1 minute" in text, (rule["alert"], text)
            assert "humanize" not in text  # (1.008 evictions, 78.68 pending: a figure that is not one)


def test_promtool_runs_the_unit_tests() -> None:
    tested = run("test", "rules", UNIT_TESTS)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout[-4000:] + tested.stderr[-2000:]


def test_a_wrong_expectation_fails_the_unit_tests(tmp_path: Path) -> None:
    """The unit tests compare the rendered texts (a summary one figure off fails them)."""
    wrong = tmp_path / "promtool" / "wrong-test.yml"
    wrong.parent.mkdir()
    text = UNIT_TESTS.read_text().replace("2500 records pending", "2501 records pending")
    wrong.write_text(text.replace("../../etc/prometheus/mc0-alerts.yml", str(RULES)))
    tested = run("test", "rules", wrong)
    assert tested.returncode != 0 and "2501 records pending" in tested.stdout + tested.stderr


def test_the_rules_file_is_the_one_the_package_ships() -> None:
    from importlib import resources

    shipped = resources.files("mc0").joinpath("etc", "prometheus", "mc0-alerts.yml").read_text()
    assert shipped == RULES.read_text()
