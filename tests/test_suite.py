"""The suite's own rules: what tests share lives in ``tests/support``, and it waits one way.

A support module is imported by test modules and by other support modules, never the other way
round: it imports neither ``conftest.py`` (pytest loads that itself, and a module importing it
runs it twice under two names) nor a test module. A condition is waited for with
``tests/support/waiting.wait_for`` alone, whose deadline holds on a loaded host.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from celery import Celery, _state

from tests.support.drain_world import TASK, drain_setup
from tests.support.schedule import durations, longest_first
from tests.support.sources import parse

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"
#: The names of a helper that polls until a condition holds.
WAITING_NAMES = ("wait_for", "wait_until")


def imported(path: Path, root: Path = TESTS.parent) -> set[str]:
    """The modules ``path`` imports, as absolute names (relative ones resolved from ``root``)."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def test_no_support_module_imports_conftest_or_a_test_module() -> None:
    wrong = {
        f"{path.name} imports {name}"
        for path in sorted(SUPPORT.glob("*.py"))
        for name in imported(path)
        if name == "tests.conftest" or name.split(".")[-1].startswith("test_")
    }
    assert sorted(wrong) == []


def test_no_test_module_imports_another_test_module_or_conftest() -> None:
    """What two test modules share is in ``tests/support``: a test module that imports another
    leans on a module of tests, whose fixtures it can only take by names that look unused."""
    wrong = {
        f"{path.relative_to(TESTS)} imports {name}"
        for path in sorted(TESTS.rglob("test_*.py"))
        for name in imported(path)
        if name == "tests.conftest"
        or (name.startswith("tests.") and name.split(".")[-1].startswith("test_"))
    }
    assert sorted(wrong) == []


def waiting_helpers(
    path: Path, root: Path = TESTS, names: tuple[str, ...] = WAITING_NAMES
) -> list[str]:
    """Functions of ``path`` (methods too) named as a helper that waits for a condition (or
    with one of ``names``)."""
    tree = parse(path)
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    return [
        f"{path.relative_to(root)} {node.name}"
        for node in ast.walk(tree)
        if isinstance(node, functions) and node.name in names
    ]


def test_the_suite_waits_one_way() -> None:
    found = [helper for path in sorted(TESTS.rglob("*.py")) for helper in waiting_helpers(path)]
    assert found == ["support/waiting.py wait_for"]


def test_the_suite_makes_its_apps_one_way() -> None:
    """``make_resilience`` is one fixture; a module whose apps need more overrides its
    ``app_setup``, and a maker of another kind of app has a name of its own."""
    found = [
        helper
        for path in sorted(TESTS.rglob("*.py"))
        for helper in waiting_helpers(path, names=("make_resilience",))
    ]
    assert found == ["support/resilience.py make_resilience"]


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    support = tmp_path / "tests" / "support"
    support.mkdir(parents=True)
    path = support / "world.py"
    path.write_text(
        "from ..conftest import REDIS_URL\n"
        "from tests import test_cli\n"
        "from .waiting import wait_for\n"
        "def wait_until(x): ...\n"
    )
    assert {"tests.conftest", "tests.test_cli", "tests.support.waiting"} <= imported(path, tmp_path)
    assert waiting_helpers(path, tmp_path / "tests") == ["support/world.py wait_until"]


def test_a_task_a_support_world_registers_stays_on_its_app() -> None:
    """``app.task`` shares a task with every app made after it by default: a world's task under
    a common name would take the place of another test's own task of that name.

    A shared task is a callback in Celery's registry of what every app finalizes with; the
    world adds none (asking a new app for the name instead would see any task another test
    of this process shared under it)."""
    shared_before = set(_state._on_app_finalizers)
    app = Celery("world", set_as_current=False)
    drain_setup("a-queue")(app)
    assert TASK in app.tasks
    assert set(_state._on_app_finalizers) == shared_before
    app.close()


def test_the_longest_modules_are_handed_out_first_and_a_module_stays_whole() -> None:
    def item(module: str, name: str) -> pytest.Item:
        return cast(pytest.Item, SimpleNamespace(path=TESTS / module, name=name))

    items = [
        item("test_a.py", "a1"),
        item("test_a.py", "a2"),
        item("test_new.py", "n1"),
        item("test_b.py", "b1"),
        item("test_c.py", "c1"),
        item("test_c.py", "c2"),
    ]
    seconds = {"test_a.py": 3.0, "test_b.py": 90.0, "test_c.py": 3.0}
    ordered = [it.name for it in longest_first(items, seconds)]
    assert ordered == ["b1", "a1", "a2", "c1", "c2", "n1"]


def test_the_recorded_durations_name_modules_of_the_suite() -> None:
    recorded = durations()
    assert recorded, "tests/durations.json is missing or empty: scripts/durations.py writes it"
    assert sorted(set(recorded) - {path.name for path in TESTS.glob("test_*.py")}) == []
