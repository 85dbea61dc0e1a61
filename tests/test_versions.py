"""The tested matrix: ``celery resilience check`` warns about a version outside it, and the
matrix is the one tox runs and the pages state."""

from __future__ import annotations

import configparser
import re
import uuid
from pathlib import Path

import pytest
from celery import Celery

from celery_resilience import Resilience, versions
from celery_resilience.checks import run_checks
from celery_resilience.versions import TESTED, minor, outside_matrix

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
INSIDE: dict[str, str | None] = {
    "python": "3.11.7",
    "celery": "5.4.0",
    "kombu": "5.7.0",
    "redis": "6.4.0",
    "django": "5.2.19",
    "django-celery-results": "2.5.1",
}


def test_versions_inside_the_matrix_give_no_warning() -> None:
    assert outside_matrix(INSIDE) == []


def test_an_older_celery_is_named_with_the_tested_range() -> None:
    (note,) = outside_matrix({**INSIDE, "celery": "5.3.6"})
    assert note.startswith("celery 5.3.6 is older than the versions the suite runs on (5.4 to 5.7)")


def test_a_newer_release_than_the_newest_tested_is_outside_too() -> None:
    (note,) = outside_matrix({**INSIDE, "redis": "9.0.0"})
    assert note.startswith("redis 9.0.0 is outside the versions the suite runs on (6.4 to 8.1)")


def test_a_patch_release_counts_as_its_minor_version() -> None:
    assert outside_matrix({**INSIDE, "celery": "5.7.9", "django": "4.2.99rc1"}) == []


def test_a_version_that_is_not_numbered_is_outside() -> None:
    assert minor("main") is None
    assert len(outside_matrix({**INSIDE, "kombu": "main"})) == 1


def test_django_not_installed_is_not_reported() -> None:
    assert outside_matrix({**INSIDE, "django": None, "django-celery-results": None}) == []


def test_check_warns_about_a_version_outside_the_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    real = versions.installed
    monkeypatch.setattr(versions, "installed", lambda n: "5.3.6" if n == "celery" else real(n))
    app = Celery(f"versions-{uuid.uuid4().hex[:8]}", broker="memory://", set_as_current=False)
    found = run_checks(Resilience(app).runtime)
    outside = [f for f in found if f.message.startswith("celery 5.3.6")]
    assert [f.level for f in outside] == ["warning"]


def test_the_tox_corners_are_the_tested_matrix() -> None:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    oldest = tox["testenv:oldest"]
    pins = dict(re.findall(r"^\s*([\w-]+)==(\S+)", oldest["deps"], re.MULTILINE))
    for name, (low, _) in TESTED.items():
        version = oldest["basepython"].removeprefix("python") if name == "python" else pins[name]
        assert minor(version) == low, name
    newest = tox["testenv:newest"]["basepython"].removeprefix("python")
    assert minor(newest) == TESTED["python"][1]
    assert {"oldest", "newest"} <= set(tox["tox"]["envlist"].replace(",", " ").split())


@pytest.mark.parametrize("page", ["README.md", "docs/index.rst"])
def test_the_pages_state_the_tested_matrix(page: str) -> None:
    text = " ".join((ROOT / page).read_text().split())
    for name, label in (("python", "Python"), ("celery", "Celery"), ("redis", "redis-py")):
        (low, high) = TESTED[name]
        assert f"{label} {low[0]}.{low[1]} to {high[0]}.{high[1]}" in text, (page, name)
