"""Sphinx configuration of the celery-resilience documentation.

Build with warnings as errors (the pictures need Graphviz's ``dot`` on the PATH)::

    sphinx-build -W -b html docs docs/_build/html
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import celery_resilience  # noqa: E402

project = "celery-resilience"
author = "celery-resilience contributors"
copyright = "celery-resilience contributors"
release = celery_resilience.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.graphviz",
    "sphinx.ext.viewcode",
    "sphinx_click",
    "resilience_docs",
]

root_doc = "index"
exclude_patterns = ["_build"]
templates_path: list[str] = []
html_static_path: list[str] = []

# Furo's own pair (it ships them through accessible-pygments): grey code blocks that sit in its
# neutral palette, colours checked for contrast, and a dark style for its dark mode. Sphinx's
# classic "sphinx" style painted every block pale green.
pygments_style = "a11y-light"
pygments_dark_style = "a11y-dark"
highlight_language = "default"

html_theme = "furo"
html_title = f"celery-resilience {release}"
# An open breaker. Without an icon every browser asks the site for /favicon.ico, in vain.
html_favicon = "_static/favicon.svg"

# The pictures (``docs/_diagrams/*.dot``) are drawn by Graphviz's ``dot`` at build time, as SVG
# files served with the pages: nothing is fetched when a reader opens one.
graphviz_output_format = "svg"
graphviz_dot_args = [
    "-Gfontname=Helvetica",
    "-Nfontname=Helvetica",
    "-Efontname=Helvetica",
    "-Nfontsize=11",
    "-Efontsize=10",
]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": False}
autoclass_content = "class"
