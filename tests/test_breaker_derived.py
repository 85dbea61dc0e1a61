"""Breakers named at call time (``resilience.breaker("hook", key=host)``) on the real Redis:
one per key, the declared breaker's settings, a family known as one by every process (closed
members admitted without a round trip), and no keys left once idle."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import redis
from celery import Celery

from celery_resilience import BreakerOpen, ConfigurationError, Resilience
from celery_resilience.breaker import Breaker
from tests.support.resilience import MakeResilience
from tests.support.round_trips import lasting_knowledge
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


class Boom(Exception):
    pass


def boom() -> None:
    raise Boom("host down")


def hooks(**options: Any) -> dict[str, Any]:
    """The breakers of these tests: ``hook`` (derived per host), with ``options``, and ``other``."""
    return {"hook": {"failure_threshold": 2, "open_timeout": 30.0, **options}, "other": {}}


def fail(breaker: Breaker, times: int) -> None:
    for _ in range(times):
        with pytest.raises(Boom):
            breaker.call(boom)


#: A process must hear a change well before what it knew could age out (``MAX_KNOWLEDGE_AGE``, 2 s):
#: a wait longer than that would pass on the age alone.
HEARD = 1.0


def counting(resilience: Resilience) -> list[int]:
    """Count the commands the breakers' client sends from now on (``[n]``)."""
    client = resilience.runtime.breaker_store.client  # type: ignore[attr-defined]
    sent = [0]
    plain = client.execute_command

    def execute_command(*args: Any, **options: Any) -> Any:
        sent[0] += 1
        return plain(*args, **options)

    client.execute_command = execute_command
    return sent


def know_family(resilience: Resilience) -> None:
    """Call until the process knows the family of ``hook`` (its watch live, a refresh done)."""

    def known() -> bool:
        resilience.breaker("hook", key="warm").call(int)
        return resilience.runtime.knowledge.admits_member("hook", "hook:never-called")

    wait_for(known, "the family known")


def prune(resilience: Resilience) -> None:
    """Ask Redis for the family of ``hook`` as a refresh does: idle members are forgotten."""
    idle_us = resilience.breaker("hook", key="-").limits.idle_us
    resilience.runtime.breaker_store.family("hook", idle_us)  # type: ignore[attr-defined]


def keys_of(client: redis.Redis, prefix: str) -> list[str]:
    return sorted(k.decode() for k in client.scan_iter(match=f"*{prefix}:breaker*"))


def test_a_dead_host_opens_its_own_breaker_only(make_resilience: MakeResilience) -> None:
    resilience = make_resilience(breakers=hooks())
    dead, alive = (
        resilience.breaker("hook", key="dead.example"),
        resilience.breaker("hook", key="a"),
    )
    assert dead.name == "hook:dead.example"
    assert dead.config.failure_threshold == 2
    fail(dead, 2)
    assert dead.state == "open"
    with pytest.raises(BreakerOpen) as rejected:
        dead.call(lambda: None)
    assert rejected.value.breaker == "hook:dead.example"
    assert alive.call(lambda: "sent") == "sent"
    assert resilience.breaker("hook").state == "closed"  # the declared one is another breaker
    # The same name is the same breaker, whoever names it.
    assert resilience.breaker("hook:dead.example").state == "open"
    assert make_resilience(breakers=hooks()).breaker("hook", key="dead.example").state == "open"


def test_a_key_needs_a_declared_base_and_a_usable_key(make_resilience: MakeResilience) -> None:
    resilience = make_resilience(breakers=hooks())
    with pytest.raises(ConfigurationError, match="'undeclared' is not in resilience_breakers"):
        resilience.breaker("undeclared", key="a")
    for bad in ("", "x" * 201, "{slot}"):
        with pytest.raises(ConfigurationError, match="breaker key"):
            resilience.breaker("hook", key=bad)


def test_closed_members_are_admitted_without_a_round_trip(make_resilience: MakeResilience) -> None:
    """Once the family is known, calls spread over 1,000 hosts (each called about once) cost
    next to nothing: the family's refresh, at most one a second, carries their successes."""
    resilience = make_resilience(breakers=hooks())
    store = resilience.runtime.breaker_store
    fail(resilience.breaker("hook", key="down"), 2)
    know_family(resilience)
    # The warm-up's member is written too when a call succeeded before the change feed was
    # live (slow on a loaded host): its success could only be recorded in Redis then.
    warmed = store.family_size("hook")  # type: ignore[attr-defined]
    assert warmed in {(1, 1), (2, 1)}
    sent = counting(resilience)
    calls = 2000
    started = time.monotonic()
    for _ in range(calls):
        host = f"h{random.randrange(1000)}.example"
        assert resilience.breaker("hook", key=host).call(lambda: 1) == 1
    elapsed = time.monotonic() - started
    assert sent[0] <= 2 * (elapsed + 1), (sent[0], elapsed)  # a refresh a second, no more
    assert sent[0] / calls <= 0.05
    with pytest.raises(BreakerOpen):  # the troubled member is still asked for
        resilience.breaker("hook", key="down").call(lambda: None)
    # A member is written by a failure, not by a closed admission: 2,000 calls wrote none.
    assert store.family_size("hook") == warmed  # type: ignore[attr-defined]


def test_every_process_hears_a_member_trip_at_once(
    make_resilience: MakeResilience, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What two knows never ages out here: only the change feed can teach it (so the waits may
    # be a loaded host's).
    lasting_knowledge(monkeypatch)
    one, two = make_resilience(breakers=hooks()), make_resilience(breakers=hooks())
    know_family(two)
    assert two.runtime.knowledge.admits_member("hook", "hook:x")
    fail(one.breaker("hook", key="x"), 2)
    wait_for(lambda: not two.runtime.knowledge.admits_member("hook", "hook:x"), "two hears x", 10.0)
    with pytest.raises(BreakerOpen):
        two.breaker("hook", key="x").call(lambda: None)
    assert two.runtime.knowledge.admits_member("hook", "hook:b")  # the rest of the family holds
    one.breaker("hook", key="x").reset()
    wait_for(
        lambda: two.runtime.knowledge.admits_member("hook", "hook:x"), "two hears x reset", 10.0
    )


def test_a_family_made_again_is_not_trusted(
    make_resilience: MakeResilience, redis_client: redis.Redis, key_prefix: str
) -> None:
    """Keys deleted behind the processes' back (a FLUSHDB, eviction): a new family epoch."""
    one, two = make_resilience(breakers=hooks()), make_resilience(breakers=hooks())
    fail(one.breaker("hook", key="x"), 2)
    know_family(two)
    assert not two.runtime.knowledge.admits_member("hook", "hook:x")
    for key in keys_of(redis_client, key_prefix):
        if "{" + key_prefix + ":breaker:hook}" in key:
            redis_client.delete(key)
    fail(one.breaker("hook", key="z"), 1)  # writes a new family hash, a new epoch
    wait_for(
        lambda: not two.runtime.knowledge.admits_member("hook", "hook:y"), "two drops it", HEARD
    )

    def learnt_again() -> bool:  # calls ask Redis, and a refresh (one a second) teaches it
        two.breaker("hook", key="y").call(lambda: None)
        return two.runtime.knowledge.admits_member("hook", "hook:x")  # x's keys are gone: closed

    wait_for(learnt_again, "two learns the new family")


def test_an_idle_member_leaves_no_keys_behind(
    make_resilience: MakeResilience, redis_client: redis.Redis, key_prefix: str
) -> None:
    resilience = make_resilience(
        breakers=hooks(
            idle_timeout=1.5, open_timeout=0.3, window=1.0, probe_lease=1.0, call_lease=1.0
        )
    )
    fail(resilience.breaker("hook", key="gone"), 2)
    resilience.breaker("other").call(lambda: None)
    before = keys_of(redis_client, key_prefix)
    assert any(":key:gone:" in key for key in before), before
    time.sleep(1.7)
    prune(resilience)  # the family's index forgets it
    left = keys_of(redis_client, key_prefix)
    assert not [key for key in left if "breaker:hook}" in key], left
    assert resilience.breaker("hook", key="gone").state == "closed"


def test_idle_timeout_must_outlive_an_open_breaker(redis_url: str) -> None:
    app = Celery("t", broker=redis_url, set_as_current=False)
    app.conf.resilience_breakers = {"hook": {"open_timeout_max": 7200.0}}
    with pytest.raises(
        ConfigurationError, match=r"resilience_breakers\['hook'\]\['idle_timeout'\]"
    ):
        Resilience(app)


def test_a_forced_member_is_kept_until_a_person_ends_it(
    make_resilience: MakeResilience, redis_client: redis.Redis, key_prefix: str
) -> None:
    """Forcing a host's breaker open (a maintenance window) holds past ``idle_timeout``, and its
    family is not forgotten meanwhile; once reset, it goes the way of any idle member."""
    quick = {"idle_timeout": 1.0, "open_timeout": 0.3, "window": 0.5, "probe_lease": 0.5}
    resilience = make_resilience(breakers=hooks(**quick, call_lease=0.5))
    other = make_resilience(breakers=hooks(**quick, call_lease=0.5))
    know_family(other)
    resilience.breaker("hook", key="maintained").force_open()
    fail(resilience.breaker("hook", key="flaky"), 1)
    time.sleep(1.3)
    prune(other)  # forgets the idle "flaky"
    assert other.breaker("hook", key="maintained").state == "forced_open"
    know_family(other)  # past idle_timeout, what it knows still lists the forced member
    assert not other.runtime.knowledge.admits_member("hook", "hook:maintained")
    with pytest.raises(BreakerOpen):
        other.breaker("hook", key="maintained").call(lambda: None)
    assert other.runtime.breaker_store.troubled("hook") == ["hook:maintained"]  # type: ignore[attr-defined]
    resilience.breaker("hook", key="maintained").reset()
    time.sleep(1.3)
    prune(other)
    left = [key for key in keys_of(redis_client, key_prefix) if "breaker:hook}" in key]
    assert left == [], left


def test_successes_held_back_reach_the_familys_totals_on_flush(
    make_resilience: MakeResilience, redis_client: redis.Redis, key_prefix: str
) -> None:
    resilience = make_resilience(breakers=hooks())
    know_family(resilience)
    resilience.runtime.flush()  # the warm-up calls' own held-back successes, counted before
    before = int(redis_client.hget(f"{{{key_prefix}:breaker:hook}}:family", "calls_total") or 0)
    for n in range(50):
        resilience.breaker("hook", key=f"h{n}").call(int)
    resilience.runtime.flush()
    after = int(redis_client.hget(f"{{{key_prefix}:breaker:hook}}:family", "calls_total") or 0)
    assert after - before == 50


def test_derived_breakers_work_on_the_memory_store_too() -> None:
    """``memory://`` (one process): no family knowledge, every call asks the store."""
    app = Celery("t", broker="memory://", set_as_current=False)
    app.conf.resilience_redis_url = "memory://"
    app.conf.resilience_breakers = {"hook": {"failure_threshold": 1}}
    resilience = Resilience(app)
    fail(resilience.breaker("hook", key="x"), 1)
    assert resilience.breaker("hook", key="x").state == "open"
    assert resilience.breaker("hook", key="y").call(lambda: 2) == 2
    resilience.runtime.close()


def test_a_lost_index_of_troubled_members_is_rebuilt_and_never_trusted_meanwhile(
    make_resilience: MakeResilience, redis_client: redis.Redis, key_prefix: str
) -> None:
    """``troubled`` evicted alone (or restored from an older backup): the family's count says
    it lost members, the next refresh rebuilds it from the members' own state under a new epoch,
    and no process admits calls on the open member for longer than the staleness bound."""
    one, two = make_resilience(breakers=hooks()), make_resilience(breakers=hooks())
    fail(one.breaker("hook", key="x"), 2)
    know_family(two)
    assert not two.runtime.knowledge.admits_member("hook", "hook:x")
    redis_client.delete(f"{{{key_prefix}:breaker:hook}}:troubled")
    deadline = time.monotonic() + 3.0
    admitted_late = 0
    while time.monotonic() < deadline:
        try:
            two.breaker("hook", key="x").call(int)
            if deadline - time.monotonic() < 1.0:  # more than 2 s after the loss
                admitted_late += 1
        except BreakerOpen:
            pass
        two.breaker("hook", key="y").call(int)  # traffic: the family's refreshes
        time.sleep(0.005)
    assert admitted_late == 0
    assert two.runtime.knowledge.holds_member("hook", "hook:x")  # rebuilt, and known again
    assert redis_client.zrange(f"{{{key_prefix}:breaker:hook}}:troubled", 0, -1) == [b"hook:x"]


def test_a_members_bulkhead_slot_and_probe_lease_expire_with_it(
    make_resilience: MakeResilience, redis_client: redis.Redis, key_prefix: str
) -> None:
    """A slot or a probe lease written with nothing else (a worker killed holding it) must not
    outlive the member: its zset expires too."""
    resilience = make_resilience(breakers=hooks(max_concurrent_calls=2, open_timeout=0.2))
    resilience.breaker("hook", key="slot").acquire()  # never settled: its holder died
    tag = f"{{{key_prefix}:breaker:hook}}"
    assert redis_client.pttl(f"{tag}:key:slot:calls") > 0
    fail(resilience.breaker("hook", key="probe"), 2)
    time.sleep(0.25)
    resilience.breaker("hook", key="probe").acquire()  # the probe, never settled
    time.sleep(0.1)
    probes = f"{tag}:key:probe:probes"
    assert redis_client.exists(probes)
    assert redis_client.pttl(probes) > 0
