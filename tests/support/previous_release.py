"""The previous release's code, run beside this one's on one Redis (a rolling upgrade).

The previous release is the commit recorded in ``tests/upgrade/previous-release`` (its tag and
commit); :func:`previous_tree` takes its tree with ``git archive``. A process run with that
tree first on ``PYTHONPATH`` imports the previous release's ``celery_resilience``.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

from .services import service_missing
from .worker_process import ROOT

RECORD = ROOT / "tests" / "upgrade" / "previous-release"


def previous_tree(into: Path) -> Path:
    """The previous release's tree (``git archive`` of the recorded commit) under ``into``."""
    tag, commit = RECORD.read_text().split()
    git = shutil.which("git")
    if git is None:
        service_missing("git is not installed: the previous release can't be checked out")
    archive = into / "previous.tar"
    with open(archive, "wb") as out:
        done = subprocess.run(
            [git, "-C", str(ROOT), "archive", "--format=tar", commit], stdout=out, check=False
        )
    if done.returncode != 0:
        service_missing(f"commit {commit} ({tag}) is not in this clone: fetch the tag")
    tree = into / "previous"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    shutil.copy(ROOT / "tests" / "apps" / "upgradeapp.py", tree / "tests" / "apps")
    return tree
