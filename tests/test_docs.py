"""The documentation: its references match the code, every example runs, and it builds.

Code examples: every ``.. code-block:: python`` of ``docs/*.rst`` runs here. An RST comment right
before a block (invisible on the rendered page) says how:

- no comment: the block runs alone, in a fresh namespace, in the sandbox below;
- ``.. docs: continue``: it runs after the blocks before it on the same page, in their namespace;
- ``.. docs: pytest``: it is a test module; pytest runs it in a subprocess and it must pass;
- ``.. docs: no-run (reason)``: it is not run; the reason is required, and such blocks are few;
- ``.. docs: before (module)``: the migration guide's code before a migration, written against
  another library (``module``, which it imports): compiled, not run, on that page only;
- ``.. docs: excerpt (example_project/FILE)``: it is not run here but is an excerpt of that file
  of the example project (a working Django project, tested on its own): its lines are the file's,
  in order, comments aside (``# ...`` marks what was left out).

The sandbox: every Celery app an example makes uses the in-memory broker, runs its tasks eagerly
(``task_always_eager``), is not made the current app, and keeps its breakers and parked tasks in
memory whatever ``resilience_redis_url`` says, so that examples can show the URLs of a real
deployment. Tasks are made with ``shared=False``: no example leaks into other apps of the test
session. Nothing touches Redis.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import inspect
import json
import re
import sys
import textwrap
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_resilience import ResilientTask, backoff
from celery_resilience.backout import BackoutKeys
from celery_resilience.breaker.redis import RedisBreakerStore
from celery_resilience.breaker.store import DeliveryQuestions
from celery_resilience.config import SETTINGS, BreakerConfig, ResilienceConfig
from celery_resilience.drain.status import last_drain_key
from tests.support.metrics_server import collector_metric_names

pytestmark = pytest.mark.integration

pytest_plugins = ("pytester",)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.rst"))
PACKAGE = ROOT / "celery_resilience"

#: Blocks that may be left unrun: each must say why, and there must stay few.
MAX_NO_RUN = 3
#: Settings whose default depends on other settings, so the page describes it in words.
DERIVED_DEFAULTS = {"redis_url", "breaker_defaults", "max_countdown", "serializer", "error_text"}


# -- reading the pages ------------------------------------------------------------------------

MARKER = re.compile(r"^\s*\.\. docs:\s*(?P<mode>[\w-]+)\s*(?P<reason>.*)$")
CODE_BLOCK = re.compile(r"^(?P<indent>\s*)\.\. code-block:: python\s*$")
MODES = ("continue", "pytest", "no-run", "excerpt", "before")
#: The page whose "before" blocks show other libraries' code, and the libraries they may show.
BEFORE_PAGE = "migration.rst"
BEFORE_MODULES = {"celery", "pybreaker", "celery_once", "celery_singleton"}


@dataclass
class Block:
    page: str
    line: int  # 1-based line of the first line of code in the page
    code: str
    mode: str  # "run", or one of MODES
    reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _marker(lines: list[str], index: int) -> tuple[str, str]:
    """The ``.. docs:`` comment right before line ``index`` (blank lines between are fine)."""
    j = index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    match = MARKER.match(lines[j]) if j >= 0 else None
    if match is None:
        return "run", ""
    return match["mode"], match["reason"].strip(" ()")


def code_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        match = CODE_BLOCK.match(line)
        if match is None:
            continue
        indent = len(match["indent"])
        j = i + 1
        while j < len(lines) and lines[j].strip().startswith(":") and _indent(lines[j]) > indent:
            j += 1  # the directive's options
        body: list[str] = []
        while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > indent):
            body.append(lines[j])
            j += 1
        first = next(k for k, text in enumerate(body) if text.strip())
        start = j - len(body) + first  # 0-based index of the first line of code
        mode, reason = _marker(lines, i)
        code = textwrap.dedent("\n".join(body[first:])).rstrip() + "\n"
        blocks.append(Block(path.name, start + 1, code, mode, reason))
    return blocks


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in code_blocks(page)]


@dataclass
class Chain:
    """Blocks of one page that run one after the other in one namespace."""

    blocks: list[Block] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.blocks[0].id


def chains() -> list[Chain]:
    found: list[Chain] = []
    for page in PAGES:
        current: Chain | None = None
        for block in code_blocks(page):
            if block.mode == "run":
                current = Chain([block])
                found.append(current)
            elif block.mode == "continue":
                assert current is not None, f"{block.id}: 'continue' with nothing before it"
                current.blocks.append(block)
    return found


def pytest_blocks() -> list[Block]:
    return [block for block in all_blocks() if block.mode == "pytest"]


# -- the sandbox ------------------------------------------------------------------------------


@pytest.fixture
def sandbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import celery
    from celery._state import _set_current_app, get_current_app

    from celery_resilience import config

    class SandboxCelery(Celery):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["broker"] = "memory://"
            kwargs.setdefault("set_as_current", False)
            super().__init__(*args, **kwargs)
            self.conf.task_always_eager = True

        def task(self, *args: Any, **options: Any) -> Any:
            options.setdefault("shared", False)
            return super().task(*args, **options)

    previous = get_current_app()
    monkeypatch.setattr(celery, "Celery", SandboxCelery)
    monkeypatch.setattr(config, "_redis_url", lambda value, broker_url: config.MEMORY_URL)
    yield
    _set_current_app(previous)


def run_block(block: Block, namespace: dict[str, Any]) -> None:
    # Padding puts the code at its line of the page: a traceback shows the page's own line.
    source = "\n" * (block.line - 1) + block.code
    exec(compile(source, str(DOCS / block.page), "exec", dont_inherit=True), namespace)


@pytest.mark.parametrize("chain", chains(), ids=lambda chain: chain.id)
@pytest.mark.usefixtures("sandbox")
def test_the_python_examples_run(chain: Chain, monkeypatch: pytest.MonkeyPatch) -> None:
    # A module of its own, as a reader's file would be (dataclasses and pickle look it up).
    module = types.ModuleType(f"docs_{Path(chain.blocks[0].page).stem}_{chain.blocks[0].line}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for block in chain.blocks:
        run_block(block, module.__dict__)


@pytest.mark.parametrize("block", pytest_blocks(), ids=lambda block: block.id)
def test_the_example_test_modules_pass(block: Block, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_example=block.code)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert result.ret == 0, result.stdout.str()
    assert outcomes.get("passed", 0) >= 1
    assert not outcomes.get("failed")
    assert not outcomes.get("errors")


def test_few_examples_are_left_unrun_and_each_says_why() -> None:
    unrun = [block for block in all_blocks() if block.mode == "no-run"]
    assert all(block.reason for block in unrun), [b.id for b in unrun if not b.reason]
    assert len(unrun) <= MAX_NO_RUN, [block.id for block in unrun]


def test_the_migration_befores_compile_and_import_what_they_name() -> None:
    before = [block for block in all_blocks() if block.mode == "before"]
    assert {block.reason for block in before} == BEFORE_MODULES
    for block in before:
        assert block.page == BEFORE_PAGE, block.id
        tree = ast.parse(block.code, filename=block.id)  # a syntax error fails here
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
        }
        assert block.reason in imported, f"{block.id}: does not import {block.reason}"
        assert "celery_resilience" not in imported, block.id


def test_every_docs_marker_is_known_and_comes_before_a_python_block() -> None:
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            match = MARKER.match(line)
            if match is None:
                continue
            assert match["mode"] in MODES, f"{page.name}:{i + 1}: unknown marker {line!r}"
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            following = lines[j] if j < len(lines) else ""
            assert CODE_BLOCK.match(following), (
                f"{page.name}:{i + 1}: {line.strip()!r} is not followed by a python code-block"
            )


def code_lines(text: str) -> list[str]:
    """The lines of code of ``text``, stripped, without comments (``  # ...`` at a line's end)."""
    lines = (line.split("  # ", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def is_excerpt(part: list[str], whole: list[str]) -> bool:
    """Each line of ``part`` is a line of ``whole``, in the same order."""
    rest = iter(whole)
    return all(line in rest for line in part)


def excerpt_blocks() -> list[Block]:
    return [block for block in all_blocks() if block.mode == "excerpt"]


@pytest.mark.parametrize("block", excerpt_blocks(), ids=lambda block: block.id)
def test_the_example_project_excerpts_are_its_code(block: Block) -> None:
    source = ROOT / block.reason
    assert block.reason.startswith("example_project/"), block.reason
    assert source.is_file(), f"{block.id}: no {block.reason}"
    whole, part = code_lines(source.read_text()), code_lines(block.code)
    missing = [line for line in part if line not in whole]
    assert missing == [], f"{block.id}: not in {block.reason}"
    assert is_excerpt(part, whole), f"{block.id}: in another order than in {block.reason}"


def test_an_excerpt_that_drifted_from_its_file_is_caught() -> None:
    whole = code_lines("x = 1\n# why\ny = 2  # two\nz = 3\n")
    assert is_excerpt(code_lines("x = 1\n# ...\nz = 3  # three\n"), whole)
    assert not is_excerpt(code_lines("z = 3\nx = 1\n"), whole)  # another order
    assert not is_excerpt(code_lines("x = 1\ny = 3\n"), whole)  # another value


def test_examples_were_found() -> None:
    assert len(chains()) >= 15
    assert len(pytest_blocks()) >= 2
    assert len(excerpt_blocks()) >= 5


# -- the configuration reference --------------------------------------------------------------

LABEL = re.compile(r"^\.\. _(?P<kind>setting|breaker-option|task-option)-(?P<name>\w+):\s*$")
FIELD = re.compile(r"^:(?P<name>\w+):\s*(?P<value>.*)$")


def reference(kind: str) -> dict[str, dict[str, str]]:
    """``{name: {field: text}}`` of the entries of one kind in ``configuration.rst``."""
    lines = (DOCS / "configuration.rst").read_text().splitlines()
    entries: dict[str, dict[str, str]] = {}
    for i, line in enumerate(lines):
        match = LABEL.match(line)
        if match is None or match["kind"] != kind:
            continue
        name = match["name"]
        j = i + 1
        while not lines[j].strip():
            j += 1
        assert lines[j] == f"``{name}``", f"label {name!r} is not followed by its title"
        underline = lines[j + 1]
        assert set(underline) == {"-"}, f"{name}: the title's underline is not of '-'"
        assert len(underline) >= len(lines[j]), f"{name}: the title's underline is too short"
        fields: dict[str, str] = {}
        k = j + 2
        while not lines[k].strip():
            k += 1
        current = None
        while k < len(lines) and lines[k].strip():
            field_match = FIELD.match(lines[k])
            if field_match:
                current = field_match["name"]
                fields[current] = field_match["value"].strip()
            else:
                assert current is not None, f"{name}: text before the first field: {lines[k]!r}"
                assert lines[k].startswith(" "), f"{name}: not a field nor its continuation"
                fields[current] += " " + lines[k].strip()
            k += 1
        assert name not in entries, f"{name} is documented twice"
        entries[name] = fields
    return entries


def single_literal(text: str) -> str | None:
    """The inside of ``text`` when it is exactly one ``literal``, else ``None``."""
    match = re.fullmatch(r"``([^`]+)``", text)
    return match[1] if match else None


def evaluate(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except ValueError:
        return eval(text, {"__builtins__": {}}, dict(vars(backoff)))


def task_options() -> set[str]:
    return set(inspect.get_annotations(ResilientTask))


def test_the_settings_reference_lists_exactly_the_settings_in_the_code() -> None:
    documented = set(reference("setting"))
    in_code = {f"resilience_{name}" for name in SETTINGS}
    assert documented - in_code == set(), "documented, but not in config.SETTINGS"
    assert in_code - documented == set(), "in config.SETTINGS, but not documented"


def test_each_setting_has_a_type_a_default_and_its_django_name() -> None:
    for name, fields in reference("setting").items():
        assert {"Type", "Default", "Django"} <= set(fields), name
        assert fields["Django"] == f"``CELERY_{name.upper()}``", name


def test_the_breaker_options_reference_lists_every_breaker_config_field() -> None:
    in_code = {f.name for f in dataclasses.fields(BreakerConfig)}
    assert set(reference("breaker-option")) == in_code


def test_the_task_options_reference_lists_every_resilient_task_option() -> None:
    assert set(reference("task-option")) == task_options()
    assert task_options() >= {"breaker", "retry_on", "park_on", "max_retries", "backoff"}


def test_documented_defaults_are_the_defaults_of_the_code() -> None:
    config = ResilienceConfig.from_conf({"broker_url": "redis://127.0.0.1:6379/0"})
    breaker = BreakerConfig()
    defaults = {
        "setting": {f"resilience_{name}": getattr(config, name) for name in SETTINGS},
        "breaker-option": {f.name: getattr(breaker, f.name) for f in dataclasses.fields(breaker)},
        "task-option": {name: getattr(ResilientTask, name) for name in task_options()},
    }
    in_words = set()
    for kind, values in defaults.items():
        for name, fields in reference(kind).items():
            literal = single_literal(fields.get("Default", ""))
            if literal is None:
                in_words.add(name)
                continue
            assert evaluate(literal) == values[name], f"{kind} {name}: the page says {literal}"
    assert in_words <= {f"resilience_{name}" for name in DERIVED_DEFAULTS}, in_words


# -- other references -------------------------------------------------------------------------


def test_every_cli_command_has_its_section() -> None:
    from celery_resilience.cli import resilience

    text = (DOCS / "operations.rst").read_text()
    documented = set(re.findall(r"^\.\. _cli-([\w-]+):$", text, re.MULTILINE))
    assert documented == set(resilience.commands)


def test_the_metrics_on_the_page_are_the_collectors() -> None:
    text = (DOCS / "operations.rst").read_text()
    documented = set(re.findall(r"\b(celery_resilience_\w+)", text))
    assert documented == collector_metric_names()


def test_the_grafana_dashboard_uses_only_real_metrics_and_shows_what_matters() -> None:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\b(celery_resilience_\w+)", expr)}
    assert used <= collector_metric_names()
    for metric in (
        "celery_resilience_breaker_state",
        "celery_resilience_breaker_transitions_total",
        "celery_resilience_backout_entries",
        "celery_resilience_replayed_total",
    ):
        assert metric in used, metric


def test_every_lua_script_is_shown_on_the_design_page() -> None:
    text = (DOCS / "design.rst").read_text()
    shown = set(re.findall(r"^\.\. lua-header:: (\S+)$", text, re.MULTILINE))
    scripts = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.lua")}
    assert shown == scripts


def test_the_key_layout_on_the_design_page_is_the_codes() -> None:
    text = (DOCS / "design.rst").read_text()
    breakers = RedisBreakerStore(redis.Redis(), "<prefix>")  # makes no connection
    message = {"task_id": "<task id>", "retries": "<retries>", "replays": "<replays>"}
    known = {f.name for f in dataclasses.fields(DeliveryQuestions)}
    delivery = DeliveryQuestions(**{k: v for k, v in message.items() if k in known})  # type: ignore[arg-type]
    store = BackoutKeys.for_prefix("<prefix>")
    derived = RedisBreakerStore(
        redis.Redis(), "<prefix>", lambda name: "<base>" if name.startswith("<base>:") else None
    )
    keys = [
        *breakers.keys("<name>")[:3],  # KEYS[4..6] of a declared breaker are never written
        *derived.keys("<base>:<key>"),
        *breakers._delivery_keys("<name>", delivery),
        breakers._tag(None),
        "<prefix>:breakers",
        *(getattr(store, f.name) for f in dataclasses.fields(store) if f.name != "tag"),
        store.ready("<breaker>"),
        f"{store.tag}:drain-lock",
        last_drain_key("<prefix>"),
    ]
    missing = [key for key in keys if key not in text]
    assert missing == []


#: A test a page cites as evidence: ``tests/test_x.py::test_y``, or ``test_y`` (a glob allowed).
CITED_TEST = re.compile(r"``(?:(?P<file>tests/[\w/]+\.py)::)?(?P<name>test_[\w*]+)``")


def defined_tests(path: Path) -> set[str]:
    """The names of the test functions in ``path`` (in classes too)."""
    tree = ast.parse(path.read_text(), str(path))
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        n.name for n in ast.walk(tree) if isinstance(n, functions) and n.name.startswith("test_")
    }


def test_every_test_a_page_cites_exists() -> None:
    suite = {path: defined_tests(path) for path in sorted((ROOT / "tests").glob("test_*.py"))}
    everywhere = set().union(*suite.values())
    cited = [(page.name, m) for page in PAGES for m in CITED_TEST.finditer(page.read_text())]
    missing = []
    for page, match in cited:
        file, name = match["file"], match["name"]
        names = suite.get(ROOT / file, set()) if file else everywhere
        if not any(fnmatch.fnmatchcase(found, name) for found in names):
            missing.append(f"{page}: {match[0]}")
    assert missing == []
    assert len(cited) >= 40  # the guarantees matrix and the pages' "shown by" notes


def test_the_pages_name_no_machine_paths() -> None:
    pictures = sorted((DOCS / "_diagrams").glob("*.dot"))
    for path in [*PAGES, *pictures, DOCS / "conf.py", DOCS / "grafana-dashboard.json"]:
        text = path.read_text()
        for pattern in ("/work/", "/tmp/", "/root/", "/home/", "/Users/", "C:\\"):
            assert pattern not in text, f"{path.name} names {pattern}"


# -- screenshots and captures -----------------------------------------------------------------

#: The tests that take what ``docs/_static/shots/`` holds (``tests.support.browser.keep_for_docs``):
#: ``admin-STEP.png`` by the admin's browser test (its ``steps.shot("STEP")``), the others by name.
SHOT_TAKERS = {"admin-": "test_admin_browser.py", "cli-": "test_admin_browser.py"}
SHOT_TAKERS["flower-"] = "test_flower.py"


def taken_by_a_test(name: str) -> bool:
    taker = next((f for p, f in SHOT_TAKERS.items() if name.startswith(p)), None)
    if taker is None:
        return False
    source = (ROOT / "tests" / taker).read_text()
    if name.startswith("admin-"):
        step = name.removeprefix("admin-").removesuffix(".png")
        return f'steps.shot("{step}")' in source
    if name.startswith("cli-"):  # cli-COMMAND.txt: the capture of ``resilience COMMAND``
        command = name.removeprefix("cli-").removesuffix(".txt")
        return "capture_cli_for_docs(" in source and f'"{command}"' in source
    return f'keep_for_docs("{name}"' in source


def test_every_screenshot_a_page_shows_is_there_and_a_test_takes_it() -> None:
    from tests.support.browser import DOCS_SHOTS, shown_in_docs

    shown = shown_in_docs()
    assert {"admin-parked-tasks.png", "flower-parked.png", "cli-status.txt"} <= shown
    kept = {path.name for path in DOCS_SHOTS.iterdir()} if DOCS_SHOTS.is_dir() else set()
    assert shown - kept == set(), "shown, but no file: run the test that takes it"
    assert kept - shown == set(), "a file no page shows: remove it"
    assert [name for name in sorted(shown) if not taken_by_a_test(name)] == []


# -- the build --------------------------------------------------------------------------------


def test_the_docs_build_with_warnings_as_errors(built_docs: Path) -> None:
    # ``built_docs`` fails on any warning; what it made is checked here.
    assert (built_docs / "index.html").exists()
    assert list(built_docs.glob("_downloads/*/grafana-dashboard.json"))
