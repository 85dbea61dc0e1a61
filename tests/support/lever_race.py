"""A person's lever racing beat's end of a maintenance window, in two real processes.

``python -m tests.support.lever_race beat`` ends windows as beat's drain task does
(``maintenance.end_expired``), in a loop, counting its passes in ``<prefix>:race:passes``,
until ``<prefix>:race:stop`` exists.

``python -m tests.support.lever_race person <case> <rounds>`` plays a person, round after
round: the admin sets a window on ``payments`` that ends within milliseconds, and a moment
later the person acts, as the case says:

* ``cli-open``: ``celery resilience open payments`` (the command's own code, run in this
  process: a celery start per round would cost a second);
* ``admin-window``: the admin forces it open again for an hour (what its lever calls);
* ``admin-no-end``: the admin forces it open again with no end.

After beat's next two passes the breaker must be forced open, and an admin's new window must
still be recorded. The process prints one JSON line: the rounds and the wrong ones.

Both read the ``tests.apps.cliapp`` app from ``CLIAPP_*`` environment variables.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import sys
import time
from typing import Any

from celery.bin.celery import celery

from celery_resilience import Resilience, maintenance
from tests.apps import cliapp

NAME = "payments"
DEADLINE = 30.0  # seconds for beat's two passes after an action


def passes_key(prefix: str) -> str:
    return f"{prefix}:race:passes"


def stop_key(prefix: str) -> str:
    return f"{prefix}:race:stop"


def beat() -> None:
    res = Resilience.for_app(cliapp.app)
    client, prefix = res.runtime.redis, res.runtime.config.key_prefix
    while not client.exists(stop_key(prefix)):
        maintenance.end_expired(res.runtime)
        client.incr(passes_key(prefix))


def _cli(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        celery.main(args=["-A", "tests.apps.cliapp", "resilience", *args], standalone_mode=False)
    return out.getvalue()


def _act(case: str, res: Resilience) -> dict[str, Any]:
    """The person's action; what they were told."""
    runtime = res.runtime
    if case == "cli-open":
        return {"printed": json.loads(_cli("open", NAME, "--json"))["state"]}
    until = None if case == "admin-no-end" else runtime.now() + 3600
    maintenance.start(runtime, NAME, until, "new", "bob")
    return {"until": until}


def _wrong(case: str, res: Resilience, told: dict[str, Any]) -> dict[str, Any] | None:
    state = res.breaker(NAME).state
    window = maintenance.windows(res.runtime).get(NAME)
    seen = {"state": state, "window": None if window is None else window.note, **told}
    if state != "forced_open" or told.get("printed", "forced_open") != "forced_open":
        return seen
    if case != "cli-open" and (window is None or window.note != "new"):
        return seen  # the admin's new window was dropped: it would never end, or end early
    return None


def person(case: str, rounds: int) -> None:
    res = Resilience.for_app(cliapp.app)
    runtime = res.runtime
    client, prefix = runtime.redis, runtime.config.key_prefix
    rng = random.Random()
    wrong: list[dict[str, Any]] = []
    for _ in range(rounds):
        _cli("reset", NAME)
        maintenance.start(runtime, NAME, runtime.now() + rng.uniform(0, 0.004), "old", "alice")
        time.sleep(rng.uniform(0, 0.004))  # the window ends about now
        told = _act(case, res)
        seen = int(client.get(passes_key(prefix)) or 0)
        deadline = time.monotonic() + DEADLINE
        while int(client.get(passes_key(prefix)) or 0) < seen + 2:
            if time.monotonic() > deadline:
                raise SystemExit("beat made no pass")
            time.sleep(0.001)
        if (found := _wrong(case, res, told)) is not None:
            wrong.append(found)
    print(json.dumps({"case": case, "rounds": rounds, "wrong": len(wrong), "seen": wrong[:5]}))


if __name__ == "__main__":
    if sys.argv[1] == "beat":
        beat()
    else:
        person(sys.argv[2], int(sys.argv[3]))
