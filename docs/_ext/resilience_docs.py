"""Local Sphinx helpers of the celery-resilience documentation.

``.. lua-header:: breaker/acquire.lua`` shows the comment block that opens one of the package's
Lua scripts (its KEYS, ARGV and return value), read from the installed package at build time, so
the page always shows the header the code carries.

:func:`home_module` points viewcode's "[docs]" links of a module's source page at the anchors
the API page really has.
"""

from __future__ import annotations

import importlib
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


def home_module(app: Sphinx, modname: str, attribute: str) -> str | None:
    """The module that defines the object ``attribute`` belongs to (``ResilientTask`` for
    ``ResilientTask.backoff``).

    viewcode's own lookup follows the attribute to its value: ``ResilientTask.backoff`` is an
    ``Exponential`` instance, so it names ``celery_resilience.backoff``, files that module under
    the name ``celery_resilience`` on the first visit, and every "[docs]" link on the module's
    source page then points at an anchor (``api.html#celery_resilience.Exponential``) that does
    not exist. The top-level object's own module is where the attribute's code is.
    """
    try:
        top = getattr(importlib.import_module(modname), attribute.split(".", maxsplit=1)[0])
    except (ImportError, AttributeError):
        return None  # viewcode's own lookup decides
    home = getattr(top, "__module__", None)
    return home if isinstance(home, str) else None


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("lua-header", LuaHeader)
    app.connect("viewcode-follow-imported", home_module)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
