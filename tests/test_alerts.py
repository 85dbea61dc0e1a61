"""The Prometheus alert rules in docs/alerts/: valid for promtool, true to their own unit tests,
about metrics the package exports, and each with its runbook entry on the operations page.

``promtool`` is Debian's ``prometheus`` package (scripts/test installs it); without it the
promtool tests are skipped, except under CI, where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .support.metrics_server import collector_metric_names

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "docs" / "alerts"
RULES = ALERTS / "celery-resilience.rules.yml"
RULE_TESTS = ALERTS / "celery-resilience.rules.test.yml"
OPERATIONS = ROOT / "docs" / "operations.rst"

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None and not os.environ.get("CI"),
    reason="promtool missing (Debian's prometheus package: apt-get install prometheus)",
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None, "promtool missing: CI installs Debian's prometheus package"
    return subprocess.run(
        [PROMTOOL, *args], cwd=ALERTS, capture_output=True, text=True, timeout=120, check=False
    )


def alerts() -> list[str]:
    return re.findall(r"^\s*- alert: (\S+)$", RULES.read_text(), re.MULTILINE)


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


@needs_promtool
def test_the_rules_pass_their_unit_tests() -> None:
    done = promtool("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_unit_tests_cover_the_breaker_and_up_alerts() -> None:
    tested = set(re.findall(r"alertname: (\S+)", RULE_TESTS.read_text()))
    assert {"CeleryResilienceDown", "CeleryResilienceBreakerOpen"} <= tested
    assert tested <= set(alerts())


def test_every_metric_in_a_rule_is_one_the_package_exports() -> None:
    used = set(re.findall(r"\b(celery_resilience_\w+)", RULES.read_text()))
    assert used
    assert used <= collector_metric_names(), used - collector_metric_names()


def test_the_rules_cover_what_an_operator_must_hear_of() -> None:
    text = RULES.read_text()
    for metric in (
        "celery_resilience_up",
        "celery_resilience_breaker_state",
        "celery_resilience_backout_entries",
        "celery_resilience_oldest_parked_age_seconds",
        "celery_resilience_last_drain_timestamp_seconds",
        "celery_resilience_drain_task_last_run_timestamp_seconds",
    ):
        assert metric in text, metric


def test_every_alert_links_to_its_runbook_entry() -> None:
    text = RULES.read_text()
    page = OPERATIONS.read_text()
    links = re.findall(r'runbook_url: "operations\.html#([\w-]+)"', text)
    assert len(links) == len(alerts())
    for alert, anchor in zip(alerts(), links, strict=True):
        assert anchor == f"runbook-{alert.lower()}", (alert, anchor)
        assert f"\n.. _{anchor}:\n" in page, f"operations.rst has no runbook entry for {alert}"
        assert f"``{alert}``" in page, alert
