"""The smoke test of an installed wheel (scripts/test-wheel runs it outside the checkout).

    python wheel_smoke.py VERSION DATA_FILES

The package imported is the installed one, of that version; every module imports; every file
of DATA_FILES (the package's files that are not Python, one path a line, as the repository
lists them: Lua scripts, admin templates, ``py.typed``) is in it, and so are the Django
migrations; the ``celery resilience`` command is registered; a breaker trips and a task parks
and is drained, on the in-process backend. Exit status 0, or a failed assertion.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import pkgutil
import subprocess
import sys
from pathlib import Path

from celery import Celery

import celery_resilience
from celery_resilience import BreakerOpen, Resilience, ResilientTask


def main(version: str, data_files: Path) -> None:
    package = Path(celery_resilience.__file__).parent
    assert "site-packages" in package.parts, f"not the installed package: {package}"
    assert celery_resilience.__version__ == version, celery_resilience.__version__
    assert importlib.metadata.version("celery-resilience") == version

    # Every module imports (a module the wheel left out, or one that imports a missing file).
    optional = ("celery_resilience.contrib.django.", "celery_resilience.contrib.pytest")
    for info in pkgutil.walk_packages([str(package)], "celery_resilience."):
        if not info.name.startswith(optional):
            importlib.import_module(info.name)

    # Every data file of the repository's package, where the code reads it.
    wanted = data_files.read_text().split()
    assert any(name.endswith(".lua") for name in wanted), wanted
    root = package.parent
    missing = [name for name in wanted if not (root / name).is_file()]
    assert not missing, f"missing from the wheel: {missing}"

    # The Django app's migrations and admin templates.
    django = package / "contrib" / "django"
    migrations = sorted(p.name for p in (django / "migrations").glob("0*.py"))
    assert migrations[0].startswith("0001_"), migrations

    # The command line entry point.
    done = subprocess.run(
        [sys.executable, "-m", "celery", "resilience", "--help"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "drain" in done.stdout

    # A breaker trips, a task parks, the drain replays it once the breaker closes.
    app = Celery("smoke", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True
    app.conf.resilience_breakers = {"gateway": {"failure_threshold": 1, "open_timeout": 60.0}}
    calls: list[int] = []

    @app.task(base=ResilientTask, breaker="gateway", retry_on=(ConnectionError,), max_retries=0)
    def charge(order_id: int) -> int:
        calls.append(order_id)
        return order_id

    res = Resilience.for_app(app)
    breaker = res.breaker("gateway")

    def down() -> None:
        raise ConnectionError("gateway down")

    with contextlib.suppress(ConnectionError):
        breaker.call(down)
    assert breaker.state == "open", breaker.state
    with contextlib.suppress(BreakerOpen):
        breaker.call(down)
    charge.delay(7)
    assert calls == []
    assert res.backout.count(status="parked") == 1
    breaker.reset()
    report = res.drain()
    assert report.replayed == 1, report
    assert calls == [7]
    assert res.backout.count() == 0
    print(f"smoke: celery-resilience {version} from {package}: OK")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
