"""The versions the suite runs on, and what ``check`` says of the installed ones.

The policy a team can live with: a warning only where something is known to be wrong or was
never promised (a version below the declared floor, a major version above the newest tested, a
version with a defect the docs name); a newer minor or patch release than the tested matrix is
news, not a warning (``celery resilience check --verbose`` and ``status`` show it), so that a
dependency's routine release does not raise a warning at every worker start. Only the minor
version counts against the matrix (a patch release is taken as tested); the Django packages
count only where installed.

:data:`TESTED` is written by ``scripts/upgrade-deps`` from the lock files the suite installs
(``requirements/oldest.txt`` and ``requirements/newest.txt``); a test holds it to them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Literal

Minor = tuple[int, int]

#: Distribution -> (oldest, newest) minor version the suite runs on: the locked corners.
TESTED: dict[str, tuple[Minor, Minor]] = {
    "python": ((3, 10), (3, 13)),
    "celery": ((5, 4), (5, 7)),
    "kombu": ((5, 3), (5, 7)),
    "redis": ((6, 4), (8, 2)),
    "django": ((4, 2), (5, 2)),
    "django-celery-results": ((2, 5), (2, 6)),
}
#: Needed by the package: a missing one is not this module's to report.
REQUIRED = frozenset({"python", "celery", "kombu", "redis"})


@dataclass(frozen=True)
class Defect:
    """Versions of ``name`` below ``fixed_in`` have a defect the docs name (operations page,
    "Versions"): ``why`` says what it does to an app."""

    name: str
    fixed_in: Minor
    why: str


#: Known defects, each with the release that fixed it: the reason a floor is where it is.
DEFECTS: tuple[Defect, ...] = (
    Defect(
        "redis",
        (6, 4),
        "its pub/sub lock is not reentrant, and Celery before 5.7 re-enters it when a dropped "
        "AsyncResult is collected during a subscribe (celery/celery#10477): a process that "
        "publishes tasks and reads results on a Redis result backend can hang for good",
    ),
)


@dataclass(frozen=True)
class VersionNote:
    """What ``check`` says of one installed version: ``warning`` or ``info`` (news only)."""

    level: Literal["warning", "info"]
    message: str


def minor(version: str) -> Minor | None:
    """``(5, 4)`` of ``"5.4.0rc1"``; ``None`` when it does not start with two numbers."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or "x")
    except (IndexError, ValueError):
        return None


def installed(name: str) -> str | None:
    if name == "python":
        return ".".join(str(n) for n in sys.version_info[:3])
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _text(version: Minor) -> str:
    return f"{version[0]}.{version[1]}"


def version_notes(found: dict[str, str | None] | None = None) -> list[VersionNote]:
    """One note per installed version that is not plainly inside :data:`TESTED` (``found``:
    name -> version, for tests; default: what is installed)."""
    found = found if found is not None else {name: installed(name) for name in TESTED}
    notes = []
    for name, (oldest, newest) in TESTED.items():
        version = found.get(name)
        if version is None:
            continue
        note = _note(name, version, minor(version), oldest, newest)
        if note is not None:
            notes.append(note)
    return notes


def _note(
    name: str, version: str, have: Minor | None, oldest: Minor, newest: Minor
) -> VersionNote | None:
    tested = f"{_text(oldest)} to {_text(newest)}"
    if have is None:
        return VersionNote(
            "warning",
            f"{name} {version} is not a numbered release: nothing checked it (the suite runs "
            f"on {tested}). Use a release, or run the suite on yours.",
        )
    for defect in DEFECTS:
        if defect.name == name and have < defect.fixed_in:
            return VersionNote(
                "warning",
                f"{name} {version} is older than {_text(defect.fixed_in)}: {defect.why}. "
                f"Upgrade {name} (the suite runs on {tested}).",
            )
    if have < oldest:
        return VersionNote(
            "warning",
            f"{name} {version} is older than the oldest version the package supports "
            f"({_text(oldest)}; the suite runs on {tested}). Upgrade {name}.",
        )
    if have[0] > newest[0]:
        return VersionNote(
            "warning",
            f"{name} {version} is a major version above the newest tested ({_text(newest)}; "
            f"the suite runs on {tested}): it may change what the package relies on. Run the "
            "suite on it before an outage does.",
        )
    if have > newest:
        return VersionNote(
            "info",
            f"{name} {version} is newer than the newest tested ({_text(newest)}): a minor "
            "release, expected to work; the next upgrade of the tested matrix will cover it.",
        )
    return None
