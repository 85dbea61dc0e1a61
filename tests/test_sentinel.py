"""Breakers and parked tasks on a primary watched by Redis Sentinel, through a failover.

One deployment for the module (``tests/support/redis_sentinel.py``): a primary, its replica and one
sentinel, all the test's own. One real worker (``tests/apps/deployapp.py``) with
``resilience_park_replicas=1`` parks a steady stream of tasks while the test forces a failover
(``SENTINEL FAILOVER``, then the old primary is killed by its PID, and started again from its
append-only file once the new primary takes writes, for the sentinel to make it the new
primary's replica).
Ledger: every published task id ends succeeded or parked, so no entry whose message was acked
is missing; the breaker's forced state survives. The time from the old primary's death until a
park succeeded again is printed (``-s``); when tasks do not settle, the failure says where each
one is (``World.whereabouts``) and shows the servers' and the sentinel's logs. Then
the CLI, the metrics collector and the Django admin read the new primary, and the CLI's drain
replays everything.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from celery import Celery

from celery_resilience import ConfigurationError, ParkedTask, Resilience, StoreUnavailable
from celery_resilience.backout import RedisBackoutStore
from celery_resilience.checks import run_checks
from celery_resilience.config import ResilienceConfig
from celery_resilience.redis_io import make_client
from tests.support.deploy_world import World, metric, require_redis_7, world_env
from tests.support.redis_sentinel import MASTER_NAME, SentinelDeployment, SentinelServer
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

PREFIX = f"test-sentinel-{uuid.uuid4().hex[:8]}"
APP: Celery | None = None  # CELERY_RESILIENCE_APP of the admin test
OPTIONS = {"master_name": MASTER_NAME}
#: Tasks published per second during the drill (by one thread of the test).
RATE = 10.0


# -- settings -----------------------------------------------------------------------------------


def test_kombus_sentinel_url_names_every_sentinel_and_the_primarys_password_and_db() -> None:
    config = ResilienceConfig.from_conf(
        {
            "resilience_redis_url": "sentinel://:s%3Bcret@h1:26380/2;sentinel://h2",
            "resilience_redis_options": {**OPTIONS, "sentinel_kwargs": {"password": "x"}},
        }
    )
    where = config.redis_deployment
    assert where.kind == "sentinel"
    assert where.nodes == (("h1", 26380), ("h2", 26379))
    assert (where.password, where.db, where.master_name) == ("s;cret", 2, MASTER_NAME)
    assert "master_name" not in where.client_options()


def test_a_sentinel_broker_is_the_default_with_its_master_name() -> None:
    conf = {
        "broker_url": "sentinel://h1:26379;sentinel://h2:26379",
        "broker_transport_options": {"master_name": "shop", "visibility_timeout": 60},
    }
    config = ResilienceConfig.from_conf(conf)
    assert config.redis_url == conf["broker_url"]
    assert config.redis_deployment.master_name == "shop"


@pytest.mark.parametrize("options", [None, {}, {"master_name": ""}, {"socket_timeout": 1}])
def test_a_missing_master_name_is_a_configuration_error_naming_it(options: Any) -> None:
    conf = {"resilience_redis_url": "sentinel://h1:26379", "resilience_redis_options": options}
    with pytest.raises(ConfigurationError, match=r"resilience_redis_options\['master_name'\]"):
        ResilienceConfig.from_conf(conf)


@pytest.mark.parametrize(
    "url", ["sentinel://h1:port", "sentinel://h1;redis://h2", "sentinel://:pw@/0", "sentinel:"]
)
def test_a_malformed_sentinel_url_names_the_setting(url: str) -> None:
    conf = {"resilience_redis_url": url, "resilience_redis_options": OPTIONS}
    with pytest.raises(ConfigurationError, match="resilience_redis_url"):
        ResilienceConfig.from_conf(conf)


# -- the deployment and its world ---------------------------------------------------------------


@pytest.fixture(scope="module")
def deployment() -> Iterator[SentinelDeployment]:
    require_redis_7()
    servers = SentinelDeployment(down_after_ms=5000, failover_timeout_ms=3000)
    try:
        yield servers.start()
    finally:
        servers.close()


@pytest.fixture(scope="module")
def world(
    deployment: SentinelDeployment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    env = world_env(
        PREFIX,
        deployment.url,
        DEPLOYAPP_REDIS_OPTIONS=json.dumps(OPTIONS),
        DEPLOYAPP_PARK_REPLICAS="1",
    )
    world = World(env, tmp_path_factory.mktemp("sentinel") / "worker.log")
    try:
        world.start_worker()
        yield world
    finally:
        print(world.close()[-20_000:])


def test_a_park_that_fewer_replicas_hold_than_asked_is_store_unavailable(
    deployment: SentinelDeployment,
) -> None:
    """Given one replica, a store asking for two waits, then refuses (the worker keeps the
    message in the broker); one asking for one stores the entry."""
    prefix = f"{PREFIX}-wait"
    config = ResilienceConfig.from_conf(
        {"resilience_redis_url": deployment.url, "resilience_redis_options": OPTIONS}
    )
    client = make_client(config.redis_deployment, 5.0)
    try:
        entry = ParkedTask.new(task_name="t", task_id="t-1", args=[], kwargs={}, reason="park_on")
        too_many = RedisBackoutStore(client, prefix, replicas=2, replicas_timeout=0.1)
        with pytest.raises(StoreUnavailable, match=r"[01] of 2 replicas held the entry"):
            too_many.park(entry)
        assert too_many.get(entry.id) is None  # taken back: the message stays in the broker
        assert too_many.count() == 0
        # Seconds for the one replica's acknowledgement: it must not run out on a loaded host.
        enough = RedisBackoutStore(client, prefix, replicas=1, replicas_timeout=3.0)
        kept = ParkedTask.new(task_name="t", task_id="t-2", args=[], kwargs={}, reason="park_on")
        enough.park(kept)
        with deployment.servers[1].client() as replica:
            assert replica.hexists(f"{{{prefix}:backout}}:entries", kept.id)
    finally:
        keys = list(client.scan_iter(match=f"{{{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()


def test_a_stalled_sentinel_costs_a_park_a_few_timeouts_not_redis_pys_retries() -> None:
    """Given a sentinel that stopped answering (its host stalled mid-failover) and a client whose
    connections to the primary were closed (as a failover closes them), a park gives up within
    a few ``resilience_redis_timeout``s: StoreUnavailable, the message kept in the broker. Each
    sentinel is asked once per connection attempt (two attempts, each up to a connect and a read
    timeout). With redis-py's default retry on the sentinels' clients (redis-py before 8.2) it
    took ~19 s, every command of every delivery, and the worker stopped taking messages."""
    require_redis_7()
    timeout = 0.5
    bound = 2 * 2 * timeout  # attempts x (connect + read) for one sentinel
    with RedisServer() as primary:
        sentinel = SentinelServer(primary.port, down_after_ms=60_000, failover_timeout_ms=60_000)
        sentinel.start()
        assert sentinel.process is not None
        config = ResilienceConfig.from_conf(
            {
                "resilience_redis_url": f"sentinel://127.0.0.1:{sentinel.port}",
                "resilience_redis_options": OPTIONS,
            }
        )
        client = make_client(config.redis_deployment, timeout)
        store = RedisBackoutStore(client, f"{PREFIX}-stalled")
        entry = ParkedTask.new(task_name="t", task_id="t-1", args=[], kwargs={}, reason="park_on")
        try:
            assert client.ping()  # the primary found through the sentinel
            sentinel.process.send_signal(signal.SIGSTOP)
            client.connection_pool.disconnect()
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="No master found"):
                store.park(entry)
            elapsed = time.monotonic() - started
        finally:
            sentinel.process.send_signal(signal.SIGCONT)
            client.close()
            sentinel.close()
    # Slack for a loaded host's scheduling; redis-py's retries took 18-19 s here.
    assert elapsed < bound + 3.0, f"a park waited {elapsed:.1f}s on a stalled sentinel"


# -- the failover drill -------------------------------------------------------------------------


@dataclass
class Publisher:
    """Publishes ``workerapp.charge`` at ``RATE`` per second from a thread until stopped."""

    world: World
    ids: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stop.wait(1 / RATE) and n < 2_000:  # bounded in count and time
            self.ids.append(self.world.app.send_task("workerapp.charge", args=[f"o-{n}"]).id)
            n += 1

    def finish(self) -> list[str]:
        self.stop.set()
        self.thread.join(10)
        return list(self.ids)


@dataclass
class Drill:
    published: list[str]
    #: Task id -> entry id of every park the worker acknowledged (and so acked its message).
    acked: dict[str, str]
    #: Acknowledged entries missing from the store after the failover: must be none.
    lost: list[str]
    #: Seconds from the old primary's death until it was writable again (a new primary), and
    #: until a park was acknowledged again (its entry held by a replica).
    writable_after: float
    parking_after: float
    #: Seconds from the publisher's stop until every task had run or parked.
    settled_after: float
    #: Failovers the sentinel made during the drill: one (a second one, back to a server that
    #: was not in sync, is what left tasks neither parked nor run on a loaded host).
    failovers: int
    entries: Counter[str]
    succeeded: set[str]


@pytest.fixture(scope="module")
def drill(deployment: SentinelDeployment, world: World) -> Drill:
    """Given a worker parking a steady stream of tasks (``dep`` forced open, and
    ``resilience_park_replicas=1``), when the primary is failed over and killed by its PID,
    then started again once the new primary takes writes: the figures of what followed."""
    res = world.res
    world.set_dependency(True)
    res.breaker("dep").force_open()
    probe = make_client(res.runtime.config.redis_deployment, 0.5)  # a client of the test's own
    store = res.runtime.backout_store
    publisher = Publisher(world)
    try:
        wait_for(lambda: len(world.acked_parks(publisher.ids[:])) >= 10, "parks", 60)
        old = deployment.primary()
        deployment.failover()
        old.kill()  # the primary's death
        died = time.time()

        def writable() -> bool:
            try:
                return bool(probe.set(f"{PREFIX}:probe", 1))
            except redis.RedisError:
                return False

        wait_for(writable, "a writable primary", 20, poll=0.05)
        writable_after = time.time() - died
        old.start()  # from its AOF; the sentinel makes it the new primary's replica

        def parked_again() -> bool:
            recent = world.acked_parks(publisher.ids[-20:])
            return any(parked_at(store, e) > died for e in recent.values())

        try:
            wait_for(parked_again, "a park acknowledged again", 90, poll=0.1)
        except AssertionError as timeout:
            raise AssertionError(f"{timeout}\n{server_logs(deployment)}") from None
        time.sleep(1.0)  # more parks on the new primary
    finally:
        published = publisher.finish()
        probe.close()

    stopped = time.time()

    def settled() -> bool:
        return set(published) <= world.succeeded() | set(world.acked_parks(published))

    try:
        wait_for(settled, "every published task to end succeeded or parked", 90, poll=0.2)
    except AssertionError as timeout:
        missing = sorted(set(published) - world.succeeded() - set(world.acked_parks(published)))
        where = json.dumps(world.whereabouts(missing), indent=1)
        raise AssertionError(
            f"{timeout}: {len(missing)} neither ran nor parked:\n{where}\n{server_logs(deployment)}"
        ) from None
    settled_after = time.time() - stopped
    acked = world.acked_parks(published)
    times = [parked_at(store, e) for e in acked.values()]
    return Drill(
        published,
        acked,
        [e for e in acked.values() if store.get(e) is None],
        writable_after,
        min(t for t in times if t > died) - died,
        settled_after,
        deployment.failovers(),
        Counter(world.parked_task_ids()),
        world.succeeded(),
    )


def server_logs(deployment: SentinelDeployment) -> str:
    """The ends of the sentinel's and the servers' logs (the failovers, the syncs)."""
    return "\n".join(f"--- {p.port}\n{p.log()[-4000:]}" for p in deployment.processes())


def parked_at(store: Any, entry_id: str) -> float:
    entry = store.get(entry_id)
    return 0.0 if entry is None else float(entry.parked_at)


@pytest.mark.slow
def test_no_acked_park_is_lost_in_a_failover_and_the_breaker_state_survives(
    deployment: SentinelDeployment, world: World, drill: Drill
) -> None:
    published = set(drill.published)
    assert drill.failovers == 1, deployment.sentinel.log()[-6000:]
    assert drill.lost == []  # every acknowledged entry is on the new primary
    assert published <= set(drill.acked) | drill.succeeded  # nothing dropped
    assert world.res.breaker("dep").state == "forced_open"  # replicated before the failover
    assert deployment.primary_port() != deployment.servers[0].port
    twice = sorted(t for t, n in drill.entries.items() if n > 1)
    print(
        f"\nfailover drill: {len(published)} published; {len(drill.acked)} parked and acked, "
        f"{len(published & drill.succeeded)} succeeded (run while Redis was unreachable, "
        f"fail_open), {len(drill.lost)} acked entries lost; {len(twice)} task ids with two "
        f"entries; {len(published & set(drill.acked) & drill.succeeded)} both parked and run. "
        f"Primary writable again {drill.writable_after:.2f}s after its death; a park "
        f"acknowledged by 1 replica again after {drill.parking_after:.2f}s; every task run or "
        f"parked {drill.settled_after:.2f}s after the last was published"
    )


# -- the surfaces, on the new primary -----------------------------------------------------------


@pytest.mark.slow
def test_cli_status_and_list_read_the_new_primary(world: World, drill: Drill) -> None:
    status, listing = world.cli_json(("status",), ("list", "--limit", "10000"))
    assert status["breakers"]["dep"]["state"] == "forced_open"
    assert status["breakers"]["dep"]["parked"] == sum(drill.entries.values())
    assert Counter(e["task_id"] for e in listing) == drill.entries


@pytest.mark.slow
def test_the_metrics_collector_reads_the_new_primary(world: World, drill: Drill) -> None:
    samples = world.metrics()
    assert metric(samples, "breaker_state", breaker="dep", state="forced_open") == 1.0
    parked = metric(samples, "backout_entries", breaker="dep", status="parked")
    assert parked == sum(drill.entries.values())


@pytest.mark.slow
def test_the_django_admin_lists_the_parked_tasks(
    request: pytest.FixtureRequest, world: World, drill: Drill
) -> None:
    page = world.admin_store_page(request.config, sys.modules[__name__])
    assert f"{sum(drill.entries.values())} entries" in page
    newest = world.res.runtime.backout_store.list(limit=5)
    for entry in newest:
        assert entry.task_id in page


@pytest.mark.slow
def test_start_up_checks_on_sentinel(world: World, drill: Drill) -> None:
    """park_replicas 0 on a Sentinel is an error (a failover can lose parked tasks); asking for
    more replicas than there are is one too (every park would fail); the world's own settings
    raise neither."""
    own = [f.message for f in run_checks(world.res.runtime)]
    assert not any("resilience_park_replicas" in m for m in own), own
    for replicas, level in ((0, "error"), (2, "error")):
        app = Celery(f"checks-{replicas}", set_as_current=False)
        app.conf.resilience_redis_url = world.env["WORKERAPP_REDIS"]
        app.conf.resilience_redis_options = OPTIONS
        app.conf.resilience_key_prefix = f"{PREFIX}-checks"
        app.conf.resilience_park_replicas = replicas
        res = Resilience(app)
        try:
            findings = [f for f in run_checks(res.runtime) if "park_replicas" in f.message]
        finally:
            res.runtime.close()
        assert [f.level for f in findings] == [level], findings


@pytest.mark.slow
def test_the_drain_replays_every_parked_task(world: World, drill: Drill) -> None:
    # Just after the drill the new primary may still be busy with its replica's first sync: a
    # command then says the store is unavailable, as it should. The drain is what is tested.
    wait_for(
        lambda: world.cli(("reset", "dep"), check=False)[0].returncode == 0,
        "a reset that the primary answers",
        60,
    )
    (report,) = world.cli_json(("drain",))
    assert report["replayed"] == sum(drill.entries.values())
    wait_for(lambda: world.succeeded() >= set(drill.published), "every task succeeded", 40)
    assert world.parked_task_ids() == []
