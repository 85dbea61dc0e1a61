"""``./scripts/demo --serve``: after the story, the shop stays up to be explored until Ctrl-C.

Redis, the gateway, the worker and beat of the story keep running; Flower (started with them, so
that it saw the whole story) and the admin (``manage.py runserver``) join them. The ``payments``
breaker is then forced open, as for a maintenance window, and a few more orders are charged: the
worker parks them, and they wait in the admin, in Flower (state ``PARKED``) and in
``celery -A shop resilience list`` until someone closes the breaker and the drain replays them.
A superuser with a random password, printed once, logs in to the admin. Ctrl-C ends it all: the
demo stops every process it started, by PID.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.error import URLError
from urllib.request import urlopen

BREAKER = "payments"
#: Orders parked for a person to explore once the story is over.
PARKED_TO_EXPLORE = 20
ADMIN_USER = "admin"


class Processes(Protocol):
    """What the demo's process table offers (``example_project.demo.Processes``)."""

    started: list[tuple[str, subprocess.Popen[bytes]]]

    def start(
        self, name: str, cmd: list[str], env: dict[str, str], pipe: bool = False
    ) -> subprocess.Popen[bytes]: ...

    def log_tail(self, name: str, lines: int = 25) -> str: ...


@dataclass
class Services:
    """Where a person finds the shop while it is served."""

    admin_url: str = ""
    flower_url: str = ""
    password: str = ""


def start_flower(procs: Processes, env: dict[str, str], port: int) -> str:
    """``celery -A shop flower`` on a loopback port, its API open (it answers only there)."""
    command = [sys.executable, "-m", "celery", "-A", "shop", "flower"]
    command += ["--address=127.0.0.1", f"--port={port}"]
    procs.start("flower", command, {**env, "FLOWER_UNAUTHENTICATED_API": "true"})
    return f"http://127.0.0.1:{port}"


def start_admin(procs: Processes, env: dict[str, str], port: int) -> str:
    """``manage.py runserver`` (one process, no autoreloader); ``--insecure`` serves the admin's
    CSS and JavaScript with ``DEBUG`` off."""
    command = [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}"]
    procs.start("admin", [*command, "--noreload", "--insecure"], env)
    return f"http://127.0.0.1:{port}"


def wait_until_it_answers(procs: Processes, name: str, url: str, timeout: float = 45) -> None:
    proc = dict(procs.started)[name]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the {name} exited:\n" + procs.log_tail(name))
        try:
            with urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the {name} did not answer at {url}:\n" + procs.log_tail(name))


def create_superuser() -> str:
    """A superuser ``admin`` with a fresh random password, which is returned (and never kept)."""
    from django.contrib.auth import get_user_model

    password = secrets.token_urlsafe(12)
    get_user_model().objects.create_superuser(ADMIN_USER, "", password)
    return password


def park_orders(app: Any, submit: Callable[[int], list[int]], count: int) -> list[int]:
    """Force the breaker open and charge ``count`` orders: the worker parks every one."""
    from celery_resilience import Resilience

    resilience = Resilience.for_app(app)
    resilience.breaker(BREAKER).force_open()
    before = resilience.backout.count(BREAKER, "parked")
    ids = submit(count)
    deadline = time.monotonic() + 60
    while resilience.backout.count(BREAKER, "parked") < before + count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not park the {count} orders within 60 s")
        time.sleep(0.2)
    return ids


def print_services(services: Services, env: dict[str, str], ids: list[int], here: Path) -> None:
    settings = ("DJANGO_SETTINGS_MODULE", "SHOP_BROKER_URL", "SHOP_KEY_PREFIX", "SHOP_DB_PATH")
    lines = [
        "",
        f"Serving until Ctrl-C. The payments breaker is forced open (a maintenance window) and "
        f"{len(ids)} orders ({ids[0]}..{ids[-1]}) are parked:",
        f"  admin   {services.admin_url}/admin/",
        f"          user {ADMIN_USER}, password {services.password} (printed once, not stored)",
        f"  Flower  {services.flower_url}/tasks?state=PARKED",
        f"          {services.flower_url}/api/tasks?state=PARKED",
        f"  CLI     in another terminal, in {here}:",
        "          export " + " ".join(f"{name}={env[name]}" for name in settings),
        "          celery -A shop resilience status",
        "          celery -A shop resilience list",
        "Close the breaker (Breakers, then Reset, in the admin; or celery -A shop resilience "
        "close payments) and beat's drain replays the parked orders within seconds.",
    ]
    for line in lines:
        print(line, flush=True)


def serve_until_interrupted(procs: Processes) -> None:
    """Watch every process until Ctrl-C; a process that exits ends the demo with its log."""
    try:
        while True:
            for name, proc in procs.started:
                if proc.poll() is not None:
                    raise RuntimeError(f"the {name} exited:\n" + procs.log_tail(name))
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nStopping everything the demo started.", flush=True)
