"""The tested matrix: read from the lock files, written where the package and its pages state it.

The lock files of the two corners (``requirements/oldest.txt``, ``requirements/newest.txt``) are
what the suite runs on; this makes ``celery_resilience/versions.py``'s ``TESTED`` and the
sentences of the README and the docs say the same. ``python scripts/matrix.py`` rewrites them
(``scripts/upgrade-deps`` runs it after compiling the lock files); ``tests/test_versions.py``
holds them to the lock files with :func:`matrix_of`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORNERS = ("oldest", "newest")
#: Distribution -> its name in the sentences that state the matrix.
LABELS = {
    "python": "Python",
    "celery": "Celery",
    "kombu": "kombu",
    "redis": "redis-py",
    "django": "Django",
    "django-celery-results": "django-celery-results",
}
PAGES = ("README.md", "docs/index.rst")
VERSIONS_PY = "celery_resilience/versions.py"

Minor = tuple[int, int]


def lock_file(corner: str, root: Path = ROOT) -> Path:
    return root / "requirements" / f"{corner}.txt"


def pins(lock: Path) -> dict[str, str]:
    """Distribution -> pinned version of a compiled lock file; ``python``: the version it was
    compiled for (its header: "for Python X.Y")."""
    text = lock.read_text()
    found = {
        name.lower(): version for name, version in re.findall(r"^([\w.-]+)==(\S+)", text, re.M)
    }
    python = re.search(r"for Python (\d+\.\d+)", text)
    if python is None:
        raise ValueError(f"{lock.name} does not say which Python it was compiled for")
    found["python"] = python.group(1)
    return found


def _minor(version: str) -> Minor:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def matrix_of(root: Path = ROOT) -> dict[str, tuple[Minor, Minor]]:
    """The matrix the corners' lock files make: distribution -> (oldest, newest) minor."""
    oldest, newest = (pins(lock_file(corner, root)) for corner in CORNERS)
    return {name: (_minor(oldest[name]), _minor(newest[name])) for name in LABELS}


def _span(pair: tuple[Minor, Minor]) -> str:
    (a, b), (c, d) = pair
    return f"{a}.{b} to {c}.{d}"


def versions_py(text: str, matrix: dict[str, tuple[Minor, Minor]]) -> str:
    """``versions.py`` with its ``TESTED`` literal made from ``matrix``."""
    rows = "".join(f'    "{name}": ({low}, {high}),\n' for name, (low, high) in matrix.items())
    block = f"TESTED: dict[str, tuple[Minor, Minor]] = {{\n{rows}}}\n"
    new, count = re.subn(r"^TESTED: .*?^}\n", block, text, flags=re.M | re.S)
    if count != 1:
        raise ValueError(f"{VERSIONS_PY} has no TESTED literal to rewrite")
    return new


def page(text: str, matrix: dict[str, tuple[Minor, Minor]]) -> str:
    """A page with every "<label> X.Y to X.Y" made from ``matrix`` (line breaks kept)."""
    for name, label in LABELS.items():
        (a, b), (c, d) = matrix[name]
        pattern = rf"(?<![\w-])({re.escape(label)}\s+)\d+\.\d+(\s+to\s+)\d+\.\d+"
        text = re.sub(pattern, rf"\g<1>{a}.{b}\g<2>{c}.{d}", text)
    return text


def main() -> int:
    matrix = matrix_of()
    targets = {VERSIONS_PY: versions_py, **dict.fromkeys(PAGES, page)}
    for relative, rewrite in targets.items():
        path = ROOT / relative
        old = path.read_text()
        new = rewrite(old, matrix)
        if new != old:
            path.write_text(new)
            print(f"matrix: {relative} updated")
    for name, pair in matrix.items():
        print(f"matrix: {LABELS[name]} {_span(pair)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
