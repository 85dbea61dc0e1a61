"""Helpers of the real-browser test: headless Chromium through Selenium, and the example shop.

:class:`Shop` runs the example project (``example_project/``) as an operator would, each piece
a process of its own: ``manage.py`` commands, the payment gateway, ``celery -A shop worker`` and
``manage.py runserver``. It reuses the demo's process handling (``example_project.demo``):
every process in a session of its own, stopped by its PID (SIGTERM, then SIGKILL of its own
process group if it hangs). Settings come from the environment variables ``shop/settings.py``
reads: a SQLite file in a temporary directory, the test Redis under a key prefix of the test's
own (broker keys included, through ``global_keyprefix``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, TypeVar
from urllib.error import URLError
from urllib.request import urlopen

from example_project.demo import GatewayProcess, Processes, free_port

from .waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "example_project"
#: Screenshots and terminal captures the documentation shows, kept current by the tests that
#: take them (``keep_for_docs``) and committed with the pages.
DOCS_SHOTS = ROOT / "docs" / "_static" / "shots"
SHOT_REFERENCE = re.compile(r"_static/shots/(?P<name>[\w.-]+)")
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROME_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1680,1050",
)
T = TypeVar("T")


def missing_browser() -> str | None:
    """Why a real-browser test can't run here, or ``None``."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is missing (Debian: apt-get install chromium chromium-driver)"
    return None


def chrome(profile: Path) -> Any:
    """Headless Chromium, driven by the system's chromedriver (Selenium Manager fetches
    nothing), with a throw-away profile in ``profile``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in (*CHROME_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    # Keep the page's console for ``driver.get_log("browser")``: a test may read its errors.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def shown_in_docs() -> set[str]:
    """The names of ``docs/_static/shots/`` files that a page of ``docs/`` shows or includes."""
    pages = (ROOT / "docs").glob("*.rst")
    return {m["name"] for page in pages for m in SHOT_REFERENCE.finditer(page.read_text())}


def keep_for_docs(name: str, content: bytes | str) -> None:
    """Write ``content`` as ``docs/_static/shots/NAME`` when a page shows it: each run of the
    test that took it keeps the documentation's picture of that page current."""
    if name not in shown_in_docs():
        return
    DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
    path = DOCS_SHOTS / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


class Shop:
    """The example shop on a temporary SQLite database, the given Redis and key prefix."""

    def __init__(self, workdir: Path, redis_url: str, prefix: str) -> None:
        self.workdir = workdir
        self.db_path = workdir / "shop.sqlite3"
        self.procs = Processes(workdir)
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "shop.settings",
            # The checkout's celery_resilience, whatever copy pip may have installed elsewhere.
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(EXAMPLE), str(ROOT), os.environ.get("PYTHONPATH")])
            ),
            "SHOP_DB_PATH": str(self.db_path),
            "SHOP_BROKER_URL": redis_url,
            "SHOP_RESILIENCE_REDIS_URL": redis_url,
            "SHOP_KEY_PREFIX": prefix,
            "SHOP_DEBUG": "1",  # runserver serves the admin's CSS and JavaScript
            "PYTHONUNBUFFERED": "1",
        }
        self.gateway: GatewayProcess | None = None
        self.admin_url = ""

    # -- processes ------------------------------------------------------------------------

    def manage(self, *args: str, timeout: float = 60) -> str:
        """``python manage.py ARGS`` to completion; its stdout (its output on failure)."""
        return self._run([sys.executable, "manage.py", *args], timeout)

    def _run(self, command: list[str], timeout: float) -> str:
        done = subprocess.run(
            command,
            cwd=EXAMPLE,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(
                f"{' '.join(command[1:])} exited with {done.returncode}:\n"
                f"{done.stdout}{done.stderr}"
            )
        return done.stdout

    def celery(self, *args: str, timeout: float = 60) -> str:
        """``celery -A shop ARGS`` to completion (``resilience reset payments``...); stdout."""
        return self._run([sys.executable, "-m", "celery", "-A", "shop", *args], timeout)

    def start_gateway(self) -> GatewayProcess:
        """The payment gateway on free loopback ports; the worker must start after it."""
        self.gateway = GatewayProcess(self.procs, self.env, latency=0.0)
        self.env["SHOP_GATEWAY_URL"] = self.gateway.api_url
        return self.gateway

    def start_worker(self, queue: str, hostname: str) -> subprocess.Popen[bytes]:
        """``celery -A shop worker``: prefork, 2 children, consuming ``queue`` only."""
        command = [sys.executable, "-m", "celery", "-A", "shop", "worker", "-P", "prefork"]
        command += ["-c", "2", "-Q", queue, "-n", hostname, "-l", "info"]
        command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        return self.procs.start("worker", command, self.env)

    def wait_worker_ready(self, worker: subprocess.Popen[bytes], timeout: float = 30) -> None:
        def ready() -> bool:
            if worker.poll() is not None:
                raise AssertionError(f"the worker exited:\n{self.log('worker')}")
            return " ready." in self.log("worker")

        wait_for(ready, "the worker's 'ready' line", timeout, poll=0.1)

    def start_admin(self) -> subprocess.Popen[bytes]:
        """``manage.py runserver`` on a free loopback port (no autoreloader: one process)."""
        port = free_port()
        self.admin_url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]
        return self.procs.start("runserver", command, self.env)

    def wait_admin_ready(self, server: subprocess.Popen[bytes], timeout: float = 30) -> None:
        def answers() -> bool:
            if server.poll() is not None:
                raise AssertionError(f"runserver exited:\n{self.log('runserver')}")
            try:
                with urlopen(f"{self.admin_url}/admin/login/", timeout=2) as response:
                    return bool(response.status == 200)
            except (URLError, ConnectionError, TimeoutError):
                return False

        wait_for(answers, "the admin's login page", timeout, poll=0.1)

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        """Every process's log, for a failure message."""
        return "\n".join(
            f"----- {name}.log -----\n{self.procs.log_tail(name, 40)}"
            for name in ("gateway", "worker", "runserver")
        )

    def stop(self) -> None:
        self.procs.stop_all()

    # -- what the shop's database says ----------------------------------------------------

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of a read-only query on the shop's SQLite database (WAL: no lock needed)."""
        connection = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=20)
        try:
            return connection.execute(sql, params).fetchall()
        finally:
            connection.close()

    def orders(self, ids: list[int]) -> dict[int, tuple[str, int]]:
        """``{order id: (status, charge_count)}``."""
        marks = ",".join("?" * len(ids))
        found = self.rows(
            f"SELECT id, status, charge_count FROM orders_order WHERE id IN ({marks})", *ids
        )
        return {row[0]: (row[1], row[2]) for row in found}

    def task_results(self, task_ids: list[str]) -> dict[str, tuple[str, Any]]:
        """``{task id: (state, result)}`` from django-celery-results' table."""
        marks = ",".join("?" * len(task_ids))
        found = self.rows(
            "SELECT task_id, status, result FROM django_celery_results_taskresult "
            f"WHERE task_id IN ({marks})",
            *task_ids,
        )
        return {row[0]: (row[1], json.loads(row[2]) if row[2] else None) for row in found}
