"""The order the suite's modules are handed to xdist's workers: the longest first.

``--dist loadfile`` gives a worker a whole module at a time. xdist hands out the modules with
the most tests first, which says little here: a module of a few worker tests can take two
minutes, one of a hundred pure tests a second. A long module handed out last keeps one worker
busy while the others are done. ``scripts/test`` turns xdist's order off
(``--no-loadscope-reorder``) and this plugin orders the collection by each module's duration in
a main run (``tests/durations.json``; ``scripts/durations.py`` writes it from a JUnit report):
the longest first, so the run ends about when the work spread over the workers is done. A
module that file does not name yet is taken as short; the order only changes when the run ends,
never what a test sees.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parent.parent / "durations.json"


def durations(path: Path = DURATIONS) -> dict[str, float]:
    """Module file name (``test_cli.py``) -> seconds of a main run; empty without the file."""
    try:
        loaded = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {str(name): float(seconds) for name, seconds in loaded.items()}


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """``items`` with whole modules ordered by ``seconds``, the longest first; modules of equal
    duration and the tests within a module keep their order."""
    first_seen: dict[Path, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(item.path, index)

    def key(item: pytest.Item) -> tuple[float, int]:
        return (-seconds.get(item.path.name, 0.0), first_seen[item.path])

    return sorted(items, key=key)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = longest_first(items, durations())
