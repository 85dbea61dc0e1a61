"""The package's layering, enforced on its import graph (the diagram in ``docs/design.rst``).

Every import counts: at the top of a module, inside a function, under ``TYPE_CHECKING``. An
import of ``a.b.c`` also runs the ``__init__`` of ``a.b``, so it counts as an import of that
package too (the package root aside: it is the top surface and imports everything).
"""

from __future__ import annotations

import ast
import fnmatch
import re
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent / "celery_resilience"
PACKAGE = "celery_resilience"
MAX_LINES = 300

#: Bottom to top: a module may import modules of its own layer or of the layers below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "leaves",
        (
            "errors",
            "redact",
            "headers",
            "signals",
            "trouble",
            "backoff",
            "versions",
            "config",
            "config.*",
            "breaker.types",
            "breaker.model",
            "breaker.bulkhead",
        ),
    ),
    ("stores", ("redis_io", "events", "breaker", "breaker.*", "backout", "backout.*")),
    ("runtime", ("runtime",)),
    (
        "use cases",
        (
            "body_retry",
            "kept",
            "ending",
            "fate",
            "carry_out",
            "breaker_key",
            "breaker_listing",
            "turned_away",
            "settle",
            "parking",
            "dedup",
            "drain",
            "drain.*",
            "maintenance",
            "checks",
            "metrics",
            "rekey",
        ),
    ),
    (
        "surfaces",
        (
            "",
            "task",
            "time_limits",
            "resilience",
            "worker",
            "beat",
            "cli",
            "cli.*",
            "contrib",
            "contrib.*",
        ),
    ),
]


def parse(path: Path, attempts: int = 3) -> ast.Module:
    """``ast.parse``, tried again on CPython's spurious ``SystemError: AST constructor recursion
    depth mismatch`` (python/cpython#106905: a count kept across calls goes wrong in a long,
    threaded process; fixed in later releases than some this suite runs on). Each call starts
    the count afresh, so the same text parses on the next try."""
    source = path.read_text()
    for _ in range(attempts - 1):
        try:
            return ast.parse(source, str(path))
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
    return ast.parse(source, str(path))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py")) if "migrations" not in p.parts}


def layer_of(module: str) -> int:
    """The layer of ``module`` (relative to the package); the first pattern that matches."""
    for index, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if module == pattern or (pattern.endswith("*") and fnmatch.fnmatch(module, pattern)):
                return index
    raise AssertionError(f"celery_resilience.{module} is in no layer: add it to LAYERS")


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Package modules ``module`` imports (relative names), with the packages they run."""
    is_package = path.name == "__init__.py"
    here = module.split(".") if module else []
    base = here if is_package else here[:-1]
    found: set[str] = set()
    for node in ast.walk(parse(path)):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                prefix = ".".join(anchor + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == PACKAGE:
                prefix = (node.module or "").removeprefix(PACKAGE).lstrip(".")
            else:
                continue
            targets.append(prefix)
            # ``from . import x`` / ``from .pkg import mod``: submodules imported by name.
            targets += [f"{prefix}.{a.name}".lstrip(".") for a in node.names]
        elif isinstance(node, ast.Import):
            targets += [
                a.name.removeprefix(PACKAGE).lstrip(".")
                for a in node.names
                if a.name.split(".")[0] == PACKAGE
            ]
        for target in targets:
            if target not in known:
                continue
            parts = target.split(".")
            # The module itself and every package on the way to it (their __init__ runs), but
            # not the packages this module is in: their __init__ is running already.
            found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    found -= {".".join(here[:i]) for i in range(len(here) + (1 if is_package else 0))}
    found.discard(module)
    return found


#: Modules named by a dotted string and imported lazily on purpose, as Celery's own
#: ``BACKEND_ALIASES`` do: the setting ``resilience_backout_store = "django"`` names the optional
#: Django store, which only a Django project can import. Every other string naming a module of
#: the package obeys the layers like an import.
PLUGIN_ALIASES = {("config.backout", "contrib.django.store")}


def dotted_strings(path: Path, known: set[str]) -> set[str]:
    """Package modules named in string constants (``"celery_resilience.x.y.attr"``)."""
    found: set[str] = set()
    tree = parse(path)
    # Logger names follow the modules' names without importing anything.
    loggers = {
        id(arg)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and getattr(call.func, "id", getattr(call.func, "attr", "")) in ("get_logger", "getLogger")
        for arg in call.args
    }
    for node in ast.walk(tree):
        if id(node) in loggers:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in re.findall(rf"\b{PACKAGE}((?:\.\w+)+)", node.value):
                parts = match.lstrip(".").split(".")
                # The longest prefix that is a module: the rest names an attribute.
                for end in range(len(parts), 0, -1):
                    if ".".join(parts[:end]) in known:
                        found.add(".".join(parts[:end]))
                        break
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def test_no_string_names_a_module_of_a_higher_layer() -> None:
    mods = modules()
    known = set(mods)
    upward = [
        f"{module} names {target} in a string"
        for module, path in mods.items()
        for target in sorted(dotted_strings(path, known))
        if layer_of(target) > layer_of(module) and (module, target) not in PLUGIN_ALIASES
    ]
    assert upward == []


def test_every_module_is_in_a_layer() -> None:
    for module in modules():
        layer_of(module)


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in graph().items()
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []


def test_there_is_no_import_circle() -> None:
    edges = graph()
    edges[""] = set()  # the root imports everything and runs first: it closes no circle
    for targets in edges.values():
        targets.discard("")
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert circles == []


def test_long_modules_are_flagged_for_review() -> None:
    """A review signal, not a gate. What it guards is STYLE's first lesson, "one concept per
    module, most under 300 lines": a module past ``MAX_LINES`` probably holds two concepts, and
    a reviewer should ask which. Cutting it to fit the number (a mixin that declares its host's
    attributes, a test-only helper parked in the store it tests, a private helper imported from
    a sibling) is worse than the length: split by concept or not at all. So this warns, naming
    each module, and never fails."""
    long = {}
    for module, path in sorted(modules().items()):
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            long[f"celery_resilience.{module or '__init__'}"] = lines
    for module, lines in long.items():
        warnings.warn(f"{module} has {lines} lines: does it hold two concepts?", stacklevel=1)
    assert all(lines > MAX_LINES for lines in long.values())  # what was flagged is long


def test_the_checker_sees_a_circle_and_an_upward_import(tmp_path: Path) -> None:
    """The rules above can fail: a lower module importing a higher one is seen."""
    source = "from ..drain import Drainer\nfrom . import store\n"
    path = tmp_path / "model.py"
    path.write_text(source)
    found = imports_of("breaker.model", path, {"drain", "breaker", "breaker.store"})
    assert found == {"drain", "breaker.store"}  # not "breaker": its __init__ runs already
    assert layer_of("drain") > layer_of("breaker.model")
