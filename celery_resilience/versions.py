"""The versions the suite runs on (tox's ``oldest`` and ``newest`` corners), and which of the
installed ones lie outside them.

A declared lower bound that no run ever tried is a promise nobody checked: ``celery resilience
check`` says when this process runs on a version outside the tested matrix, so a team pinned to
an old Celery hears it before an outage does. Only the minor version counts (a patch release is
taken as tested); the Django packages count only where installed.
"""

from __future__ import annotations

import sys
from importlib import metadata

Minor = tuple[int, int]

#: Distribution -> (oldest, newest) minor version the suite runs on; keep in step with tox.ini,
#: README.md and docs/index.rst.
TESTED: dict[str, tuple[Minor, Minor]] = {
    "python": ((3, 10), (3, 13)),
    "celery": ((5, 4), (5, 7)),
    "kombu": ((5, 3), (5, 7)),
    "redis": ((6, 4), (8, 1)),
    "django": ((4, 2), (5, 2)),
    "django-celery-results": ((2, 5), (2, 6)),
}
#: Needed by the package: a missing one is not this module's to report.
REQUIRED = frozenset({"python", "celery", "kombu", "redis"})


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


def outside_matrix(found: dict[str, str | None] | None = None) -> list[str]:
    """One sentence per installed version outside :data:`TESTED` (``found``: tests only)."""
    found = found if found is not None else {name: installed(name) for name in TESTED}
    notes = []
    for name, (oldest, newest) in TESTED.items():
        version = found.get(name)
        if version is None:
            continue
        have = minor(version)
        if have is not None and oldest <= have <= newest:
            continue
        tested = f"{oldest[0]}.{oldest[1]} to {newest[0]}.{newest[1]}"
        side = "older than" if have is not None and have < oldest else "outside"
        notes.append(
            f"{name} {version} is {side} the versions the suite runs on ({tested}): it may "
            "work, but nothing checked it. Use a tested version, or run the suite on yours."
        )
    return notes
