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

from tests.support.sources import parse

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
    (
        "stores",
        ("redis_io", "events", "fleet", "breaker", "breaker.*", "backout", "backout.*", "tracing"),
    ),
    ("runtime", ("runtime",)),
    (
        "use cases",
        (
            "delivery",
            "delivery.*",
            "breaker_listing",
            "drain",
            "drain.*",
            "maintenance",
            "checks",
            "metrics",
            "metrics_server",
            "rekey",
            "adopt",
            "repair",
            "writers",
            "store_checks",
            "known_tasks",
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
            "remote",
            "cli",
            "cli.*",
            "contrib",
            "contrib.*",
        ),
    ),
]


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
#: Django store, which only a Django project can import; ``resilience_tracing = True`` names the
#: OpenTelemetry module, which only the ``opentelemetry`` extra can import. Every other string
#: naming a module of the package obeys the layers like an import.
PLUGIN_ALIASES = {
    ("config.backout", "contrib.django.store"),
    ("runtime", "contrib.opentelemetry"),
}


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


#: The steps of a delivery, from its admission to its end: one package below the task.
DELIVERY_STEPS = {
    "context",
    "pipeline",
    "admission",
    "ending",
    "fate",
    "carry_out",
    "parking",
    "kept",
    "settle",
    "dedup",
    "body_retry",
    "turned_away",
    "breaker_key",
    "time_limits",
}


def test_a_deliverys_steps_are_one_package_below_the_task() -> None:
    mods = modules()
    in_package = {m.removeprefix("delivery.") for m in mods if m.startswith("delivery.")}
    assert DELIVERY_STEPS - in_package == set()
    # none of them stands loose beside the task (but the alias that keeps an old import path)
    assert sorted(DELIVERY_STEPS & set(mods) - {"time_limits"}) == []
    assert layer_of("delivery.pipeline") < layer_of("task")


def untyped_task_parameters(path: Path) -> list[str]:
    """Parameters named ``task`` in ``path`` without a type, or typed ``Any``: a step that
    takes the task so can reach anything of it, unseen by mypy and by this test."""
    found = []
    for node in ast.walk(parse(path)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        arguments = node.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            if arg.arg != "task":
                continue
            annotation = arg.annotation
            named = ast.unparse(annotation) if annotation is not None else ""
            if named.strip("'\"").split(".")[-1] in ("", "Any"):
                where = getattr(node, "name", "lambda")
                found.append(f"{path.name}:{arg.lineno} {where}(task: {named or 'untyped'})")
    return found


def test_no_step_of_a_delivery_takes_the_task_untyped() -> None:
    """Each step gets what it needs of the task as a value (its options) or through a typed
    port (the few calls it makes on Celery's task), never the task as ``Any``."""
    paths = [path for name, path in modules().items() if name.startswith("delivery")]
    assert paths
    assert [found for path in paths for found in untyped_task_parameters(path)] == []


def test_the_checker_sees_a_task_taken_untyped(tmp_path: Path) -> None:
    path = tmp_path / "step.py"
    path.write_text(
        "def a(task: Any, request: Any) -> None: ...\n"
        "def b(task, x: int) -> None: ...\n"
        "def c(*, task: 'typing.Any') -> None: ...\n"
        "def d(task: TaskPort) -> None: ...\n"
        "def e(name: Any) -> None: ...\n"
    )
    assert untyped_task_parameters(path) == [
        "step.py:1 a(task: Any)",
        "step.py:2 b(task: untyped)",
        "step.py:3 c(task: 'typing.Any')",
    ]


def runtime_lookups(path: Path) -> list[str]:
    """Where ``path`` looks an app's runtime up: ``Runtime.for_app(...)``, or a task's
    ``runtime`` property (which does the same)."""
    found = []
    for node in ast.walk(parse(path)):
        if not isinstance(node, ast.Attribute):
            continue
        owner = ast.unparse(node.value)
        if (node.attr, owner) == ("for_app", "Runtime") or (
            node.attr == "runtime" and owner.split(".")[-1] == "task"
        ):
            found.append(f"{path.name}:{node.lineno} {owner}.{node.attr}")
    return found


def test_no_use_case_looks_a_runtime_up() -> None:
    """The use cases are handed a runtime (docs/design.rst, "One object per app"): only what
    holds an app and nothing else (the surfaces) asks ``Runtime.for_app``."""
    use_cases = [n for n, _ in LAYERS].index("use cases")
    below_surfaces = [path for name, path in modules().items() if layer_of(name) <= use_cases]
    assert [found for path in below_surfaces for found in runtime_lookups(path)] == []


#: Class names given in more than one module, for one concept: the breaker, as the facade, as
#: the protocol of what the async calls use of it, and as the admin's model of its page.
ONE_CONCEPT_CLASSES = {"Breaker"}


def test_one_class_name_names_one_concept() -> None:
    """A reader meeting a class name knows which thing it is (docs/design.rst, "Glossary")."""
    where: dict[str, list[str]] = {}
    for module, path in modules().items():
        for node in parse(path).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(module)
    twice = {name: found for name, found in where.items() if len(found) > 1}
    assert set(twice) <= ONE_CONCEPT_CLASSES, twice


def test_long_modules_are_flagged_for_review() -> None:
    """A review signal, not a gate. What it guards is the design page's first rule
    (docs/design.rst, "Modules"): one concept per module, most under 300 lines. A module past
    ``MAX_LINES`` probably holds two concepts, and a reviewer should ask which. Cutting it to
    fit the number (a mixin that declares its host's attributes, a test-only helper parked in
    the store it tests, a private helper imported from a sibling) is worse than the length:
    split by concept or not at all. So this warns, naming each module, and never fails."""
    long = {}
    for module, path in sorted(modules().items()):
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            long[f"celery_resilience.{module or '__init__'}"] = lines
    for module, lines in long.items():
        warnings.warn(f"{module} has {lines} lines: does it hold two concepts?", stacklevel=1)
    assert all(lines > MAX_LINES for lines in long.values())  # what was flagged is long


def drawn_as(patterns: tuple[str, ...]) -> set[str]:
    """How the layers picture names a layer's modules: ``config/`` for a package and its
    modules, ``breaker/types`` for one module of a package, ``__init__`` for the root."""
    names = set()
    for pattern in patterns:
        if pattern.endswith(".*"):
            names.add(pattern.removesuffix(".*").replace(".", "/") + "/")
        elif f"{pattern}.*" not in patterns:
            names.add(pattern.replace(".", "/") or "__init__")
    return names


def test_the_layers_picture_holds_the_layers_test_layers_enforces() -> None:
    dot = (ROOT.parent / "docs" / "_diagrams" / "layers.dot").read_text()
    # Each layer's box: its node id, its title line, then its modules.
    boxes = dict(re.findall(r'^\s*(\w+)\s+\[label="[^"\\]*\\n([^"]*)"', dot, re.MULTILINE))
    assert set(boxes) >= {layer.replace(" ", "_") for layer, _ in LAYERS}
    for layer, patterns in LAYERS:
        shown = set(boxes[layer.replace(" ", "_")].replace("\\n", " ").split())
        assert shown == drawn_as(patterns), layer


def test_the_checker_sees_a_circle_and_an_upward_import(tmp_path: Path) -> None:
    """The rules above can fail: a lower module importing a higher one is seen."""
    source = "from ..drain import Drainer\nfrom . import store\n"
    path = tmp_path / "model.py"
    path.write_text(source)
    found = imports_of("breaker.model", path, {"drain", "breaker", "breaker.store"})
    assert found == {"drain", "breaker.store"}  # not "breaker": its __init__ runs already
    assert layer_of("drain") > layer_of("breaker.model")


def table_cells(text: str, column: int) -> list[str]:
    """The text of ``column`` (0 first) in each row of the design page's first list-table under
    its "Modules" title: a row starts with ``* -``, each further cell with ``-``."""
    section = text.split("\nModules\n=======\n", 1)[1]
    table = section.split(".. list-table::", 1)[1]
    rows: list[list[str]] = []
    for line in table.splitlines()[1:]:
        if line and not line.startswith(" "):
            break  # the first line outside the table's indentation ends it
        stripped = line.strip()
        if stripped.startswith("* -"):
            rows.append([stripped.removeprefix("* -")])
        elif stripped.startswith("- ") or stripped == "-":
            if rows:
                rows[-1].append(stripped.removeprefix("-"))
        elif rows and stripped:
            rows[-1][-1] += " " + stripped
    return [row[column].strip() for row in rows[1:] if len(row) > column]  # the header left out


def tabled_paths(cell: str) -> list[str]:
    """The paths a module cell names, relative to the package. A name with a folder
    (``breaker/store.py``) sets the folder the next bare names of its cell are in
    (``redis.py``, ``lua/``); a bare name before any is the package's (``errors``: a module,
    ``config/``: a folder and everything in it)."""
    paths: list[str] = []
    folder = ""
    for name in re.findall(r"``([^`]+)``", cell):
        if "/" in name.rstrip("/"):
            folder = name.rstrip("/").rsplit("/", 1)[0] + "/"
            paths.append(name)
        elif name.endswith((".py", "/")):
            paths.append(folder + name)
        else:
            paths.append(f"{name}.py")
    return paths


def tabled_in(text: str) -> set[str]:
    return {path for cell in table_cells(text, 1) for path in tabled_paths(cell)}


def untabled(tabled: set[str], root: Path = ROOT) -> list[str]:
    """Modules of ``root`` that no path of the table names or holds (an ``__init__`` re-exports
    what its package's modules hold, so it has no row)."""
    files = [p.relative_to(root).as_posix() for p in root.rglob("*.py")]
    folders = tuple(path for path in tabled if path.endswith("/"))
    return sorted(
        path
        for path in files
        if not path.endswith("__init__.py") and path not in tabled and not path.startswith(folders)
    )


def test_the_design_pages_module_table_names_every_module() -> None:
    tabled = tabled_in((ROOT.parent / "docs" / "design.rst").read_text())
    assert untabled(tabled) == []


def test_every_module_the_design_pages_table_names_exists() -> None:
    tabled = tabled_in((ROOT.parent / "docs" / "design.rst").read_text())
    assert sorted(path for path in tabled if not (ROOT / path).exists()) == []


def test_the_module_table_check_sees_a_missing_row_and_a_row_of_nothing(tmp_path: Path) -> None:
    """The two checks above can fail: a module no row names, a row naming no file."""
    page = (
        "Modules\n=======\n\n.. list-table::\n   :header-rows: 1\n\n"
        "   * - Layer\n     - Module\n     - Holds\n"
        "   * - leaves\n     - ``errors``, ``config/``\n     - errors; settings\n"
        "   * -\n     - ``backout/store.py``,\n       ``gone.py``, ``lua/``\n     - the store\n"
        "\nAfter the table\n"
    )
    assert tabled_in("Design\n" + page) == {
        "errors.py",
        "config/",
        "backout/store.py",
        "backout/gone.py",
        "backout/lua/",
    }
    for path in ("errors.py", "config/limits.py", "backout/store.py", "backout/codec.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    (tmp_path / "backout" / "__init__.py").write_text("")
    assert untabled(tabled_in("Design\n" + page), tmp_path) == ["backout/codec.py"]
