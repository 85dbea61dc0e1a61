"""What an operator sees of breakers named at call time: ``status`` (a real ``celery
resilience`` process), the Prometheus metrics and the admin's list stay bounded, whatever the
number of hosts: the troubled first, at most ``resilience_derived_shown`` of each family, the
rest summed; and a ``breaker_key`` task's deliveries go through their own breakers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_resilience.breaker_listing import is_known, listing
from celery_resilience.metrics import ResilienceCollector
from tests.support.waiting import wait_for

from .support.cli import Cli

pytestmark = pytest.mark.integration

SHOWN = 3


class Down(ConnectionError):
    pass


def down() -> None:
    raise Down("host down")


@pytest.fixture
def hooks(key_prefix: str, redis_url: str, redis_client: redis.Redis) -> Iterator[Cli]:
    """The CLI's app with ``hook`` declared: 8 hosts open, 20 closed with state, entries parked
    under 2 open hosts and 4 closed ones."""
    env = {
        "CLIAPP_PREFIX": key_prefix,
        "CLIAPP_BROKER": redis_url,
        "CLIAPP_QUEUE": f"{key_prefix}-queue",
        "CLIAPP_HOOKS": str(SHOWN),
    }
    world = Cli(env, redis_client)
    res = world.res
    for i in range(8):
        for _ in range(3):
            with pytest.raises(Down):
                res.breaker("hook", key=f"dead{i}").call(down)
    for i in range(20):
        with pytest.raises(Down):
            res.breaker("hook", key=f"ok{i}").call(down)
        res.breaker("hook", key=f"ok{i}").call(int)
    for host in ("dead0", "dead1", "ok0", "ok1", "ok2", "ok3"):
        number = len(host) * 100 + int(host[-1])
        world.park(number, breaker=f"hook:{host}", task_name="cliapp.send", args=[host], kwargs={})
    yield world
    world.res.runtime.close()


def test_the_listing_shows_the_troubled_first_and_sums_the_rest(hooks: Cli) -> None:
    shown = listing(hooks.res.runtime)
    derived = [name for name in shown.names if name.startswith("hook:")]
    assert len(derived) == SHOWN
    assert all(name.startswith("hook:dead") for name in derived)
    family = shown.families["hook"]
    assert (family.members, family.troubled, family.holding) == (28, 8, 6)
    assert family.hidden == 28 - SHOWN
    assert {"payments", "search", "hook"} <= set(shown.names)
    # Not shown is not unknown: an operator may still name any of them.
    assert is_known(hooks.res.runtime, "hook:ok19")
    assert not is_known(hooks.res.runtime, "nohook:ok19")


def test_metrics_stay_bounded_and_sum_the_rest_under_the_family(hooks: Cli) -> None:
    families = {f.name: f for f in ResilienceCollector(hooks.res).collect()}
    states = {s.labels["breaker"] for s in families["celery_resilience_breaker_state"].samples}
    assert len([name for name in states if name.startswith("hook:")]) == SHOWN
    derived = {
        s.labels["kind"]: s.value for s in families["celery_resilience_derived_breakers"].samples
    }
    assert derived == {"members": 28.0, "troubled": 8.0, "hidden": 25.0}
    entries = {
        (s.labels["breaker"], s.labels["status"]): s.value
        for s in families["celery_resilience_backout_entries"].samples
    }
    shown_parked = sum(
        v for (b, st), v in entries.items() if b.startswith("hook:") and st == "parked"
    )
    assert shown_parked == 6  # the shown ones and "hook:*" together hold every entry
    assert entries["hook:*", "parked"] == 6 - sum(
        v for (b, st), v in entries.items() if b.startswith("hook:d") and st == "parked"
    )
    samples = families["celery_resilience_parked"].samples
    parked = {s.labels["breaker"]: s.value for s in samples}
    assert parked["hook:*"] == 6  # counters are summed per family, never per host
    assert not [name for name in parked if name.startswith("hook:") and name != "hook:*"]
    # ... and in the store too: its counters name the family, never a host.
    assert not [key for key in hooks.store.stats() if "hook:dead" in key or "hook:ok" in key]


def test_status_shows_the_family_line_and_its_json(hooks: Cli) -> None:
    text = hooks("status").stdout
    assert "hook:*: 28 derived breakers with state, 8 troubled, 6 holding parked tasks" in text
    assert "hook:ok19" not in text
    data = json.loads(hooks("status", "--json").stdout)
    family = data["derived"]["hook"]
    assert (family["members"], family["troubled"], family["hidden"]) == (28, 8, 25)
    assert len(family["shown"]) == SHOWN
    assert set(family["shown"]) <= set(data["breakers"])
    # A breaker not shown can still be steered by name.
    hooks("reset", "hook:dead7")
    assert hooks.res.breaker("hook:dead7").state == "closed"


def test_a_breaker_key_task_parks_under_its_host_and_the_drain_replays_only_that_host(
    hooks: Cli,
) -> None:
    send = hooks.app.tasks["cliapp.send"]
    res = hooks.res
    result = send.apply(args=("dead2",), task_id="to-dead2")  # its host's breaker is open
    assert result.state != "FAILURE"
    (parked,) = [e for e in res.backout.list(breaker="hook:dead2") if e.task_id == "to-dead2"]
    assert (parked.reason, parked.args) == ("breaker_open", ["dead2"])
    assert send.apply(kwargs={"host": "ok5", "payload": 1}).state == "SUCCESS"
    assert res.breaker("hook", key="ok5").state == "closed"

    res.breaker("hook", key="dead0").reset()
    held = set(hooks.ids(breaker="hook:dead1"))
    report = res.drain()
    assert report.replayed == 5  # dead0's entry and the four closed hosts' ones
    assert hooks.ids(breaker="hook:dead0") == []
    assert set(hooks.ids(breaker="hook:dead1")) == held  # still open: held back
    sent = sorted(h["_body"][0][0] for h in hooks.published())
    assert sent == ["dead0", "ok0", "ok1", "ok2", "ok3"]


def test_beat_passes_skip_open_hosts_without_a_look_and_drain_one_reset_at_once(
    hooks: Cli,
) -> None:
    res = hooks.res
    runtime = res.runtime
    first = res.drain_once()  # looks at every breaker holding entries
    assert first.replayed == 4  # the entry of each of the four closed hosts
    looked: list[str] = []
    snapshot = type(runtime.breaker("hook", key="dead0")).snapshot

    def spying(breaker: Any) -> Any:
        looked.append(breaker.name)
        return snapshot(breaker)

    type(runtime.breaker("hook", key="dead0")).snapshot = spying  # type: ignore[method-assign, assignment]
    try:
        second = res.drain_once()
        assert "hook:dead0" not in looked, looked
        assert "hook:dead1" not in looked, looked
        assert second.next_in is not None  # the open hosts still want a look later
        res.breaker("hook", key="dead1").reset()  # a person: the host is back
        wait_until_left_troubled(res, "hook:dead1")
        third = res.drain_once()
        assert "hook:dead1" in looked
        assert third.replayed == 1
        assert hooks.ids(breaker="hook:dead1") == []
        assert len(hooks.ids(breaker="hook:dead0")) == 1  # still open, still held
    finally:
        type(runtime.breaker("hook", key="dead0")).snapshot = snapshot  # type: ignore[method-assign]


def wait_until_left_troubled(res: Any, name: str) -> None:
    troubled = res.runtime.knowledge.holds_member
    wait_for(lambda: not troubled("hook", name), f"{name} no longer listed as troubled")
