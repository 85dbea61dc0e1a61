"""Breakers, the delivery guard, the drain lock and the back-out store on a Redis Cluster.

One cluster for the module (``tests/support/redis_cluster.py``): three primaries of the test's
own, and a replica of the primary that holds the parked tasks, so that every park of the worker
waits for it (``resilience_park_replicas=1``: ``WAIT`` on that node). One real worker
(``tests/apps/deployapp.py``) with two breakers whose keys live on two primaries, the store on the
third: it trips both and parks their tasks; the CLI, the metrics collector and the Django admin
read what it left; the CLI's drain replays it all. Ledger: every task published succeeds once.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import pytest
import redis
from celery import Celery

from celery_resilience import ConfigurationError, ParkedTask, Resilience, StoreUnavailable
from celery_resilience.backout import RedisBackoutStore
from celery_resilience.breaker.redis import RedisBreakerStore
from celery_resilience.breaker.types import Limits
from celery_resilience.checks import run_checks
from celery_resilience.config import BreakerConfig, ResilienceConfig
from celery_resilience.contrib.pytest import delete_prefix
from celery_resilience.redis_io import make_client
from tests.support.deploy_world import World, metric, require_redis_7, world_env
from tests.support.redis_cluster import RedisClusterServers
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

PREFIX = f"test-cluster-{uuid.uuid4().hex[:8]}"
APP: Celery | None = None  # CELERY_RESILIENCE_APP of the admin test
CHARGES, LOOKUPS = 12, 6


def breaker_key(name: str) -> str:
    return f"{{{PREFIX}:breaker:{name}}}:state"


BACKOUT = f"{{{PREFIX}:backout}}:entries"


# -- settings -----------------------------------------------------------------------------------


def test_a_cluster_url_names_its_nodes_credentials_and_tls() -> None:
    config = ResilienceConfig.from_conf(
        {"resilience_redis_url": "rediss+cluster://app:s%40cret@h1:7000,h2:7001,[::1]:7002"}
    )
    where = config.redis_deployment
    assert where.kind == "cluster"
    assert where.nodes == (("h1", 7000), ("h2", 7001), ("::1", 7002))
    assert (where.username, where.password, where.ssl) == ("app", "s@cret", True)
    plain = ResilienceConfig.from_conf({"resilience_redis_url": "redis+cluster://h1"})
    assert plain.redis_deployment.nodes == (("h1", 6379),)
    assert plain.redis_deployment.ssl is False


@pytest.mark.parametrize(
    ("url", "options", "named"),
    [
        ("redis+cluster://h1:7000/3", None, "resilience_redis_url"),
        ("redis+cluster://h1:port", None, "resilience_redis_url"),
        ("redis+cluster://", None, "resilience_redis_url"),
        (
            "redis+cluster://h1:7000",
            {"master_name": "m"},
            "resilience_redis_options['master_name']",
        ),
        ("redis+cluster://h1:7000", {"db": 2}, "resilience_redis_options['db']"),
        ("redis+cluster://h1:7000", {"retry": 3}, "resilience_redis_options['retry']"),
        ("redis+cluster://h1:7000", ["ssl"], "resilience_redis_options"),
    ],
)
def test_a_bad_cluster_setting_names_the_setting(url: str, options: Any, named: str) -> None:
    conf = {"resilience_redis_url": url, "resilience_redis_options": options}
    with pytest.raises(ConfigurationError) as info:
        ResilienceConfig.from_conf(conf)
    assert named in str(info.value)


# -- the cluster and its world ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    require_redis_7()
    servers = RedisClusterServers(3)
    try:
        servers.start()
        servers.add_replica(servers.owner(BACKOUT))
        yield servers
    finally:
        servers.close()


def second_breaker(cluster: RedisClusterServers) -> str:
    """A breaker name whose keys live on a primary other than ``dep``'s and the store's."""
    taken = {cluster.owner(breaker_key("dep")).port, cluster.owner(BACKOUT).port}
    for n in range(100):
        name = f"lookup{n}"
        if cluster.owner(breaker_key(name)).port not in taken:
            return name
    raise AssertionError("no breaker name lands on a third primary")


@pytest.fixture(scope="module")
def world(
    cluster: RedisClusterServers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    env = world_env(
        PREFIX,
        cluster.url(),
        DEPLOYAPP_PARK_REPLICAS="1",
        DEPLOYAPP_SECOND_BREAKER=second_breaker(cluster),
    )
    world = World(env, tmp_path_factory.mktemp("cluster") / "worker.log")
    try:
        world.start_worker()
        yield world
    finally:
        print(world.close()[-20_000:])


@dataclass
class Parked:
    charges: list[str]
    lookups: list[str]
    second: str


@pytest.fixture(scope="module")
def parked(world: World) -> Parked:
    """Given both dependencies down, a worker ran a batch of tasks through each breaker: both
    breakers tripped, and every task is parked under its breaker."""
    second = world.env["DEPLOYAPP_SECOND_BREAKER"]
    world.set_dependency(False)
    world.set_dependency(False, second)
    charges = world.publish("workerapp.charge", CHARGES, "charge")
    lookups = world.publish("deployapp.lookup", LOOKUPS, "lookup")
    wait_for(
        lambda: sorted(world.parked_task_ids()) == sorted(charges + lookups),
        "every task parked",
        40,
    )
    return Parked(charges, lookups, second)


# -- what the worker did -------------------------------------------------------------------------


@pytest.mark.slow
def test_each_breaker_lives_on_its_own_primary_and_parks_reach_the_replica(
    cluster: RedisClusterServers, world: World, parked: Parked
) -> None:
    assert world.res.breaker("dep").state == "open"
    assert world.res.breaker(parked.second).state == "open"
    dep, second, store = (
        cluster.owner(breaker_key("dep")),
        cluster.owner(breaker_key(parked.second)),
        cluster.owner(BACKOUT),
    )
    assert dep.port != second.port
    assert second.port != store.port
    for node, key in ((dep, breaker_key("dep")), (second, breaker_key(parked.second))):
        with node.client() as client:
            assert client.exists(key), f"{key} is not on the primary that owns its slot"
    # Acked only once the replica held it: every entry is on the replica too.
    (replica,) = cluster.replicas
    # A loaded host can make a node see the cluster as down for a moment: ask until it answers.
    deadline = time.monotonic() + 15
    while True:
        try:
            with replica.client(single_connection_client=True) as client:
                client.execute_command("READONLY")
                held = client.hlen(BACKOUT)
            break
        except redis.exceptions.ClusterDownError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert held == CHARGES + LOOKUPS
    assert sorted(world.parked_task_ids("dep")) == sorted(parked.charges)  # once each
    assert sorted(world.parked_task_ids(parked.second)) == sorted(parked.lookups)


@pytest.mark.slow
def test_cli_status_and_list_read_the_cluster(world: World, parked: Parked) -> None:
    status, listing = world.cli_json(("status",), ("list", "--breaker", "dep"))
    breakers = status["breakers"]
    assert breakers["dep"]["state"] == "open"
    assert breakers["dep"]["parked"] == CHARGES
    assert breakers[parked.second]["state"] == "open"
    assert breakers[parked.second]["parked"] == LOOKUPS
    assert sorted(e["task_id"] for e in listing) == sorted(parked.charges)


@pytest.mark.slow
def test_the_metrics_collector_reads_the_cluster(world: World, parked: Parked) -> None:
    samples = world.metrics()
    assert metric(samples, "breaker_state", breaker="dep", state="open") == 1.0
    assert metric(samples, "breaker_state", breaker=parked.second, state="open") == 1.0
    assert metric(samples, "backout_entries", breaker="dep", status="parked") == CHARGES
    assert metric(samples, "backout_entries", breaker=parked.second, status="parked") == LOOKUPS
    assert metric(samples, "breaker_transitions_total", breaker="dep", transition="opened") == 1


@pytest.mark.slow
def test_the_django_admin_lists_the_parked_tasks(
    request: pytest.FixtureRequest, world: World, parked: Parked
) -> None:
    page = world.admin_store_page(request.config, sys.modules[__name__])
    assert f"{CHARGES + LOOKUPS} entries" in page
    for task_id in parked.charges + parked.lookups:
        assert task_id in page


def test_a_park_that_fewer_replicas_hold_than_asked_is_store_unavailable(
    cluster: RedisClusterServers,
) -> None:
    """Given the store's primary with one replica: a store asking for two waits, then refuses
    (the worker keeps the message in the broker); one asking for one stores the entry."""
    replicated = cluster.owner(BACKOUT)  # the one primary with a replica
    prefix = next(
        p
        for p in (f"test-cluster-wait-{uuid.uuid4().hex[:6]}" for _ in range(200))
        if cluster.owner(f"{{{p}:backout}}").port == replicated.port
    )
    client = make_client(cluster.url(), 2.0)
    try:
        entry = ParkedTask.new(task_name="t", task_id="t-1", args=[], kwargs={}, reason="park_on")
        # A second: the replica's acknowledgement must not be what runs out (a loaded host).
        too_many = RedisBackoutStore(client, prefix, replicas=2, replicas_timeout=1.0)
        with pytest.raises(StoreUnavailable, match="1 of 2 replicas held the entry"):
            too_many.park(entry)
        assert too_many.get(entry.id) is None  # taken back: the message stays in the broker
        assert too_many.count() == 0
        enough = RedisBackoutStore(client, prefix, replicas=1, replicas_timeout=1.0)
        again = ParkedTask.new(task_name="t", task_id="t-2", args=[], kwargs={}, reason="park_on")
        enough.park(again)
        assert enough.get(again.id) is not None
    finally:
        delete_prefix(client, prefix)
        client.close()


def test_the_change_feed_reaches_a_subscriber_on_another_primary(
    cluster: RedisClusterServers,
) -> None:
    """A breaker's script publishes on its own primary; a process listens on the primary of the
    channel's slot: classic pub/sub carries the change across the cluster."""
    prefix = f"test-cluster-feed-{uuid.uuid4().hex[:6]}"
    store = RedisBreakerStore(make_client(cluster.url(), 0.5, retry=False), prefix)
    listening = cluster.owner(store.channel)
    name = next(
        f"b{n}"
        for n in range(100)
        if cluster.owner(f"{{{prefix}:breaker:b{n}}}:state").port != listening.port
    )
    heard: list[tuple[str, int, str, bool, str]] = []
    live = threading.Event()
    watch = store.watch(lambda *change: heard.append(change), live.set, lambda: None)
    try:
        assert live.wait(10), "the feed never went live"
        store.force(name, Limits.of(BreakerConfig()), "open")
        change = (name, 1, "forced_open", False)
        wait_for(lambda: any(h[:4] == change for h in heard), "the change", 5)
    finally:
        watch.close()
        delete_prefix(store.client, prefix)
        store.client.close()


def test_breakers_named_at_call_time_keep_their_family_in_one_slot(
    cluster: RedisClusterServers,
) -> None:
    """A family's scripts touch its members' keys and its index together: one slot (the
    declared breaker's tag), whatever the key; another process learns the family and hears a
    member trip across the cluster."""
    prefix = f"test-cluster-derived-{uuid.uuid4().hex[:6]}"

    def make() -> Resilience:
        app = Celery("t", broker="memory://", set_as_current=False)
        app.conf.resilience_redis_url = cluster.url()
        app.conf.resilience_key_prefix = prefix
        app.conf.resilience_breakers = {"hook": {"failure_threshold": 1}}
        return Resilience(app)

    one, two = make(), make()
    try:
        two.breaker("hook", key="warm").call(lambda: None)
        for n in range(5):
            with pytest.raises(ZeroDivisionError):
                one.breaker("hook", key=f"host-{n}.example").call(lambda: 1 / 0)
        wait_for(
            lambda: not two.runtime.knowledge.admits_member("hook", "hook:host-4.example"),
            "the other process hears the member trip",
            5,
        )
        assert two.breaker("hook", key="host-4.example").state == "open"
        store = cast(RedisBreakerStore, two.runtime.breaker_store)
        assert store.family_size("hook")[1] == 5  # troubled: the five that failed
        two.breaker("hook", key="warm").refresh_family()
        assert two.runtime.knowledge.admits_member("hook", "hook:other.example")
    finally:
        for res in (one, two):
            res.runtime.close()
        delete_prefix(make_client(cluster.url(), 0.5), prefix)


@pytest.mark.slow
def test_start_up_checks_object_when_a_cluster_parks_without_replicas(world: World) -> None:
    messages = [f.message for f in run_checks(world.res.runtime)]
    assert not any("resilience_park_replicas" in m for m in messages), messages
    app = Celery("unreplicated", set_as_current=False)
    app.conf.resilience_redis_url = world.env["WORKERAPP_REDIS"]
    app.conf.resilience_key_prefix = f"{PREFIX}-checks"
    unreplicated = Resilience(app)
    try:
        findings = run_checks(unreplicated.runtime)
    finally:
        unreplicated.runtime.close()
    (finding,) = [f for f in findings if "resilience_park_replicas" in f.message]
    assert finding.level == "error"  # a failover can lose parked tasks
    assert "Cluster" in finding.message


# -- bringing them back --------------------------------------------------------------------------


@pytest.mark.slow
def test_the_drain_replays_every_parked_task_once(world: World, parked: Parked) -> None:
    world.set_dependency(True)
    world.set_dependency(True, parked.second)
    world.cli(("reset", "dep"), ("reset", parked.second))
    (report,) = world.cli_json(("drain",))
    assert report["replayed"] == CHARGES + LOOKUPS
    everything = set(parked.charges) | set(parked.lookups)
    wait_for(lambda: world.succeeded() >= everything, "every task succeeded", 30)
    assert world.parked_task_ids() == []
    runs = world.runs()
    assert {runs[t] for t in everything} == {1}, "a task ran twice"
