"""The package's words: its docstrings and comments say what is, never what was (history goes
to ``docs/changelog.rst``), and the glossary on the design page names each concept once.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.support.sources import parse

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "celery_resilience"
#: Phrases that tell the code's history rather than what it is.
HISTORY = re.compile(
    r"\b(used to (?:be|take|have|run|read|write|keep|count|call|send|go)|once (?:took|was|were"
    r"|had)|formerly|previously|until recently|(?:is|are) now|now (?:takes|uses|reads|keeps))\b",
    re.IGNORECASE,
)


def prose(path: Path) -> list[tuple[int, str]]:
    """The docstrings and comments of a Python or Lua file, with the line each starts on."""
    text = path.read_text()
    if path.suffix == ".lua":
        return [
            (n, line.split("--", 1)[1])
            for n, line in enumerate(text.splitlines(), 1)
            if "--" in line
        ]
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(parse(path, source=text)):
        if isinstance(node, owners) and (doc := ast.get_docstring(node, clean=False)):
            found.append((getattr(node, "lineno", 1), doc))
    return found


def history(path: Path, root: Path = ROOT) -> list[str]:
    return [
        f"{path.relative_to(root)}:{line}: {match}"
        for line, words in prose(path)
        for match in HISTORY.findall(" ".join(words.split()))
    ]


def test_docstrings_and_comments_say_what_is_not_what_was() -> None:
    files = sorted([*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.lua")])
    assert [found for path in files for found in history(path)] == []


def test_the_history_check_sees_a_docstring_and_a_comment(tmp_path: Path) -> None:
    path = tmp_path / "room.py"
    path.write_text(
        '"""Parks used to take one lock row.\n\nThe store once took them in two orders."""\n'
        "x = 1  # the limit is now approximate\n"
        'def f() -> None:\n    """A key used to sign entries: what is, not what was."""\n'
    )
    assert history(path, tmp_path) == [
        "room.py:4: is now",
        "room.py:1: used to take",
        "room.py:1: once took",
    ]


def glossary_terms(text: str) -> list[str]:
    """The terms of the design page's glossary: the lines indented by three spaces in its
    ``.. glossary::`` block (a definition is indented further); ``a, b`` names two."""
    block = text.split(".. glossary::\n", 1)[1]
    terms: list[str] = []
    for line in block.splitlines()[1:]:
        if line and not line.startswith(" "):
            break
        if line.startswith("   ") and not line.startswith("    "):
            terms += [term.strip() for term in line.split(",")]
    return terms


def test_the_glossary_names_each_concept_once() -> None:
    terms = glossary_terms((ROOT / "docs" / "design.rst").read_text())
    assert len(terms) == len(set(terms)), terms
    core = {"delivery", "entry", "pass", "give back", "release", "held", "settle", "permit"}
    assert core <= set(terms)
