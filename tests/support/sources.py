"""Reading the suite's and the package's sources as syntax trees."""

from __future__ import annotations

import ast
from pathlib import Path


def parse(path: Path, attempts: int = 3, source: str | None = None) -> ast.Module:
    """``ast.parse``, tried again on CPython's spurious ``SystemError: AST constructor recursion
    depth mismatch`` (python/cpython#106905: a count kept across calls goes wrong in a long,
    threaded process; fixed in later releases than some this suite runs on). Each call starts
    the count afresh, so the same text parses on the next try."""
    source = path.read_text() if source is None else source
    for _ in range(attempts - 1):
        try:
            return ast.parse(source, str(path))
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
    return ast.parse(source, str(path))
