"""The release: one version, written once; a changelog section per release; CI tries the wheel."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.version import Version

import celery_resilience
from celery_resilience import fleet

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
HEADING = re.compile(r"^(\d+\.\d+\.\d+) \((unreleased|\d{4}-\d{2}-\d{2})\)\n=+$", re.MULTILINE)


def test_the_version_is_written_once_and_the_build_reads_it() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()  # no tomllib on Python 3.10
    assert not re.search(r"^version\s*=", pyproject, re.MULTILINE)
    assert re.search(r'^dynamic = \["version"\]$', pyproject, re.MULTILINE)
    assert "[tool.hatch.version]\n" in pyproject
    assert re.search(r'^path = "celery_resilience/__init__.py"$', pyproject, re.MULTILINE)
    init = (ROOT / "celery_resilience" / "__init__.py").read_text()
    assert re.findall(r'^__version__ = "(.+)"$', init, re.MULTILINE) == [
        celery_resilience.__version__
    ]
    Version(celery_resilience.__version__)  # a valid version, or InvalidVersion


def test_the_fleets_release_is_the_packages() -> None:
    version = Version(celery_resilience.__version__)
    assert f"{version.major}.{version.minor}" == fleet.THIS_VERSION


def test_the_changelog_has_a_dated_section_per_release_newest_first() -> None:
    sections = HEADING.findall((ROOT / "docs" / "changelog.rst").read_text())
    versions = [Version(number) for number, _ in sections]
    assert versions == sorted(versions, reverse=True)
    assert [number for number, _ in sections][-3:] == ["0.3.0", "0.2.0", "0.1.0"]
    (top, top_date), *released = sections
    assert Version(celery_resilience.__version__).base_version == top
    assert top_date == "unreleased"
    dates = [date for _, date in released]
    assert "unreleased" not in dates
    assert dates == sorted(dates, reverse=True)


def test_ci_builds_and_runs_the_wheel_after_the_suite() -> None:
    steps = [
        line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("./")
    ]
    assert steps.index("./scripts/test-wheel") == steps.index('./scripts/test "$@"') + 1
