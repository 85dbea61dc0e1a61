"""Local Sphinx helpers of the celery-resilience documentation.

``.. lua-header:: breaker/acquire.lua`` shows the comment block that opens one of the package's
Lua scripts (its KEYS, ARGV and return value), read from the installed package at build time, so
the page always shows the header the code carries.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def script_header(relative: str) -> str:
    """The leading ``--`` comment lines of ``celery_resilience/<relative>``."""
    path = resources.files("celery_resilience").joinpath(relative)
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    if not lines:
        raise ValueError(f"{relative} has no header comment")
    return "\n".join(lines)


class LuaHeader(SphinxDirective):
    """The header comment of a Lua script of the package, as a highlighted literal block."""

    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        relative = self.arguments[0]
        try:
            text = script_header(relative)
        except (OSError, ValueError) as exc:
            raise self.error(f"lua-header: {exc}") from exc
        self.env.note_dependency(str(resources.files("celery_resilience").joinpath(relative)))
        block = nodes.literal_block(text, text)
        block["language"] = "lua"
        return [block]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("lua-header", LuaHeader)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
