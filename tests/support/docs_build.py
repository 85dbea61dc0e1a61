"""Building the HTML docs once per test session, as CI and a reader's host would: Sphinx with
warnings as errors, the furo theme, and Graphviz's ``dot`` drawing the pictures.

The ``built_docs`` fixture (``conftest.py``) calls :func:`build_docs`; ``test_docs.py`` checks the
build and ``test_docs_browser.py`` reads its pages in a browser.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def missing_tool() -> str | None:
    """Why the docs can't be built here, or ``None``."""
    for module in ("sphinx", "furo", "sphinx_click"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is missing (pip install -e '.[docs]')"
    if shutil.which("dot") is None:
        return "Graphviz's dot is missing (Debian: apt-get install graphviz)"
    return None


def build_docs(workdir: Path) -> Path:
    """The HTML build of ``docs/`` in ``workdir/html``; skips when a tool is missing and fails
    on any warning."""
    reason = missing_tool()
    if reason is not None:
        if os.environ.get("CI"):  # ./scripts/test installs them as root: missing in CI is a failure
            pytest.fail(reason)
        pytest.skip(reason)  # a contributor without Graphviz still runs the other tests
    out = workdir / "html"
    doctrees = workdir / "doctrees"
    command = ["-W", "--keep-going", "-q", "-b", "html", "-d", str(doctrees), str(DOCS), str(out)]
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", *command],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    return out
