"""The version policy: ``check`` warns where a version was never promised or is known to be
wrong, and only shows news of a newer minor release; the tested matrix is the one the lock files
install and the pages state."""

from __future__ import annotations

import configparser
import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_resilience import Resilience, versions
from celery_resilience.checks import log_findings, run_checks
from celery_resilience.versions import TESTED, minor, version_notes

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


def newest(name: str) -> tuple[int, int]:
    return TESTED[name][1]


def test_versions_inside_the_matrix_give_no_note() -> None:
    assert version_notes(INSIDE) == []


def test_a_version_below_the_floor_is_a_warning_naming_the_floor() -> None:
    (note,) = version_notes({**INSIDE, "celery": "5.3.6"})
    assert note.level == "warning"
    assert note.message.startswith(
        "celery 5.3.6 is older than the oldest version the package supports (5.4;"
    )


def test_a_version_with_a_known_defect_says_what_the_defect_does() -> None:
    (note,) = version_notes({**INSIDE, "redis": "6.2.0"})
    assert note.level == "warning"
    assert note.message.startswith("redis 6.2.0 is older than 6.4: its pub/sub lock")
    assert "celery/celery#10477" in note.message


def test_a_newer_minor_release_is_news_not_a_warning() -> None:
    major, last = newest("redis")
    (note,) = version_notes({**INSIDE, "redis": f"{major}.{last + 1}.0"})
    assert note.level == "info"
    assert note.message.startswith(f"redis {major}.{last + 1}.0 is newer than the newest tested")


def test_a_major_version_above_the_newest_tested_is_a_warning() -> None:
    major, _ = newest("celery")
    (note,) = version_notes({**INSIDE, "celery": f"{major + 1}.0.0"})
    assert note.level == "warning"
    assert "is a major version above the newest tested" in note.message


def test_a_patch_release_counts_as_its_minor_version() -> None:
    major, last = newest("celery")
    assert version_notes({**INSIDE, "celery": f"{major}.{last}.99", "django": "4.2.99rc1"}) == []


def test_a_version_that_is_not_numbered_is_a_warning() -> None:
    assert minor("main") is None
    (note,) = version_notes({**INSIDE, "kombu": "main"})
    assert note.level == "warning"


def test_django_not_installed_is_not_reported() -> None:
    assert version_notes({**INSIDE, "django": None, "django-celery-results": None}) == []


def _app() -> Celery:
    return Celery(f"versions-{uuid.uuid4().hex[:8]}", broker="memory://", set_as_current=False)


def test_check_warns_below_the_floor_and_keeps_news_for_verbose(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    major, last = newest("redis")
    pinned = {**INSIDE, "celery": "5.3.6", "redis": f"{major}.{last + 1}.0"}
    monkeypatch.setattr(versions, "installed", pinned.get)
    found = run_checks(Resilience(_app()).runtime)
    about = {
        f.message.split(" ")[0]: f.level for f in found if f.message[:6] in ("celery", "redis ")
    }
    assert about == {"celery": "warning", "redis": "info"}
    # At worker start (log_findings): the warning, never the news.
    caplog.set_level("DEBUG", logger="celery_resilience.checks")
    log_findings(found)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "celery 5.3.6" in logged
    assert f"redis {major}.{last + 1}.0" not in logged


#: The app ``celery -A tests.test_versions:CLI_APP`` loads in the test below.
CLI_APP = _app()


def test_check_command_shows_news_with_verbose_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from celery.bin.celery import celery

    major, last = newest("kombu")
    monkeypatch.setattr(versions, "installed", {**INSIDE, "kombu": f"{major}.{last + 1}.2"}.get)
    runner = CliRunner()
    command = ["-A", f"{__name__}:CLI_APP", "resilience", "check"]
    quiet = runner.invoke(celery, command)
    verbose = runner.invoke(celery, [*command, "--verbose"])
    news = f"INFO: kombu {major}.{last + 1}.2 is newer than the newest tested"
    assert news not in quiet.output, quiet.output
    assert news in verbose.output, verbose.output
    assert quiet.exit_code == verbose.exit_code == 0, verbose.output


def _matrix() -> ModuleType:
    """scripts/matrix.py: what reads the lock files and writes the pages."""
    spec = importlib.util.spec_from_file_location("matrix", ROOT / "scripts" / "matrix.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("matrix", module)
    spec.loader.exec_module(module)
    return module


def test_the_tested_matrix_is_what_the_corners_lock_files_install() -> None:
    assert _matrix().matrix_of(ROOT) == TESTED


def test_the_lock_files_pin_every_package_with_hashes() -> None:
    for name in ("main", "oldest", "newest"):
        text = (ROOT / "requirements" / f"{name}.txt").read_text()
        requirements = [line for line in text.splitlines() if line[:1].isalnum()]
        assert requirements, name
        for line in requirements:
            assert "==" in line, (name, line)
            assert line.endswith("\\"), (name, line)  # its hashes follow
        assert text.count("--hash=sha256:") >= len(requirements), name


def test_the_tox_environments_install_the_lock_files() -> None:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    for corner in ("oldest", "newest"):
        assert f"requirements/{corner}.txt" in tox[f"testenv:{corner}"]["deps"], corner
    assert "requirements/main.txt" in tox["testenv"]["deps"]


@pytest.mark.parametrize("page", ["README.md", "docs/index.rst"])
def test_the_pages_state_the_tested_matrix(page: str) -> None:
    text = (ROOT / page).read_text()
    assert _matrix().page(text, TESTED) == text, f"{page}: run python scripts/matrix.py"
    flat = " ".join(text.split())
    for name, label in (("python", "Python"), ("celery", "Celery"), ("redis", "redis-py")):
        (low, high) = TESTED[name]
        assert f"{label} {low[0]}.{low[1]} to {high[0]}.{high[1]}" in flat, (page, name)
