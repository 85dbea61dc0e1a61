"""The Redis ACL rules of ``docs/threat-model.rst`` are enough: a real worker parks and a drainer
drains under them, and Redis denies nothing on the way.

The rules are read from the page itself (its ``ACL SETUSER`` lines), so the page and the test
can't drift apart. They are set on a ``redis-server`` this test starts (the resilience Redis);
the broker and the ledger stay on the shared one. Signing and encryption are on, and at the end
no order id is found in any key of that server.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from celery import Celery
from cryptography.fernet import Fernet

from celery_resilience import ParkedTask, Resilience

from .apps.workerapp import broker_keyprefix, make_app
from .support.drain_world import sent_count
from .support.faults import command
from .support.redis_server import RedisServer
from .support.waiting import wait_for
from .support.worker_process import WorkerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PAGE = Path(__file__).resolve().parent.parent / "docs" / "threat-model.rst"
PASSWORD = "acl-test-" + uuid.uuid4().hex


def acl_rules() -> dict[str, str]:
    """Role -> the rule text of its ``ACL SETUSER resilience-<role> ...`` line on the page."""
    text = (PAGE.read_text()).replace("\\\n", " ")
    found = re.findall(r"ACL SETUSER resilience-(\w+) (.+)", text)
    return {role: " ".join(rules.split()) for role, rules in found}


def set_user(server: redis.Redis, role: str, rules: str, prefix: str) -> str:
    """Creates the role's user from its documented rules; its URL."""
    args = rules.replace("<prefix>", prefix).replace(">PASSWORD", f">{PASSWORD}").split()
    command(server, "ACL", "SETUSER", f"resilience-{role}", "reset", *args)
    return f"resilience-{role}:{PASSWORD}"


def everything_in(client: redis.Redis) -> bytes:
    """Every key of the server: its name, its ``DUMP``, and its values read plainly (``DUMP``
    may compress them)."""
    parts: list[Any] = []  # bytes: the client decodes nothing
    for key in client.scan_iter(count=1000):
        parts += [key, client.dump(key) or b""]
        kind = client.type(key)
        if kind == b"hash":
            parts += [b for pair in client.hgetall(key).items() for b in pair]
        elif kind == b"zset":
            parts += client.zrange(key, 0, -1)
        elif kind == b"set":
            parts += list(client.smembers(key))
        elif kind == b"list":
            parts += client.lrange(key, 0, -1)
        elif kind == b"string":
            parts.append(client.get(key) or b"")
    assert parts, "the resilience Redis holds the entries"
    return b"\n".join(parts)


@pytest.fixture
def acl_server() -> Iterator[RedisServer]:
    with RedisServer() as server:  # started on entering, killed on leaving
        yield server


def test_the_page_gives_rules_for_a_worker_a_drainer_and_the_admin() -> None:
    assert set(acl_rules()) == {"worker", "drainer", "admin"}


def memory_of(prefix: str, role: str) -> set[tuple[str, str]]:
    """(user, key) of each key of the drain's memory, which a role's drain or replay names."""
    keys = (f"{{{prefix}:backout}}:consumed", f"{{{prefix}:backout}}:consumed_until")
    return {(f"resilience-{role}", key) for key in keys}


def refused_keys(denied: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The (user, key or command) pairs of Redis's ACL log, but the ``CONFIG GET`` the rules
    leave out on purpose (it could read the server's passwords too)."""
    # (acl_log(): the raw reply is a flat list per entry on RESP2, a map on RESP3.)
    return {(d["username"], d["object"]) for d in denied if d["object"] != "config|get"}


def drain_as_the_worker(beat: Celery, worker: WorkerProcess, res: Resilience, queue: str) -> None:
    """Beat's drain sent twice to the workers' queue, then ``celery resilience drain`` run as
    the worker's user: each refused by Redis before it publishes, said once at ERROR."""
    passes = [beat.send_task("celery_resilience.drain", queue=queue).id for _ in range(2)]
    wait_for(
        lambda: all(f"celery_resilience.drain[{p}] succeeded" in worker.log() for p in passes),
        "both drain passes to end on the worker",
        60.0,
    )
    assert worker.log().count("Drain refused, nothing more is published") == 1
    report = res.drain()
    assert (report.replayed, report.errors) == (0, 1)
    assert report.denied is not None
    assert "NOPERM" in report.denied


def test_a_worker_and_a_drainer_run_under_the_documented_acl_rules(
    acl_server: RedisServer, redis_url: str, redis_client: redis.Redis, key_prefix: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """A worker parks under the worker's rules; beat's drain sent to it by mistake is refused
    before it publishes (said once at ERROR); a drainer worker on the drain's own queue, under
    the drainer's rules, then drains: every order charged once."""
    admin_client = acl_server.client()
    users = {
        role: set_user(admin_client, role, rules, key_prefix) for role, rules in acl_rules().items()
    }
    base = {
        "WORKERAPP_PREFIX": key_prefix,
        "WORKERAPP_QUEUE": f"{key_prefix}-queue",
        "WORKERAPP_BROKER": redis_url,
        "WORKERAPP_LEDGER": redis_url,
        "WORKERAPP_FAILURE_THRESHOLD": "2",
        "WORKERAPP_MAX_RETRIES": "1",
        "WORKERAPP_BACKOFF_BASE": "0.05",
        "WORKERAPP_OPEN_TIMEOUT": "600",
        "WORKERAPP_SIGNING_KEY": "acl-test-signing-" + uuid.uuid4().hex,
        "WORKERAPP_ENCRYPTION_KEY": Fernet.generate_key().decode(),
    }

    def env(role: str) -> dict[str, str]:
        url = f"redis://{users[role]}@127.0.0.1:{acl_server.port}/0"
        return {**base, "WORKERAPP_REDIS": url}

    drain_queue = f"{key_prefix}-drain"
    redis_client.set(f"{key_prefix}:dep:up", "0")
    worker = WorkerProcess(env("worker"), tmp_path / "worker.log")
    drainer = WorkerProcess({**env("drainer"), "WORKERAPP_QUEUE": drain_queue},
                            tmp_path / "drainer.log")  # fmt: skip
    apps: list[Celery] = []
    try:
        worker.start()
        beat, admin_app, worker_app = (
            make_app(env("admin")),
            make_app(env("admin")),
            make_app(env("worker")),
        )
        apps += [beat, admin_app, worker_app]
        orders = [f"order-{uuid.uuid4().hex}" for _ in range(4)]
        ids = [beat.tasks["workerapp.charge"].delay(o).id for o in orders]
        admin = Resilience.for_app(admin_app)
        wait_for(lambda: admin.backout.count() == len(ids), "every order parked", 60.0)
        parked = admin.backout.list()
        assert {e.task_id for e in parked} == set(ids)
        assert {e.args[0] for e in parked} == set(orders)  # the admin holds the key
        stored = everything_in(admin_client)
        assert not [o for o in orders if o.encode() in stored], "an order id stored in clear"

        redis_client.set(f"{key_prefix}:dep:up", "1")
        admin.breaker("dep").reset()  # the admin's "reset" action
        succeeded = f"{key_prefix}:ledger:succeeded"

        def charged() -> set[str]:
            return {m.decode() for m in cast(set[bytes], redis_client.smembers(succeeded))}

        # Beat's drain sent to the workers' queue by mistake: refused, nothing published.
        drain_as_the_worker(beat, worker, Resilience.for_app(worker_app), base["WORKERAPP_QUEUE"])
        assert charged() == set()
        assert admin.backout.count(status="parked") == len(ids)

        # The drain's own queue, consumed by a worker under the drainer's rules.
        drainer.start()
        beat.send_task("celery_resilience.drain", queue=drain_queue)
        wait_for(lambda: charged() == set(ids), "every replay succeeded", 60.0)
        wait_for(lambda: admin.backout.count() == 0, "every entry acked", 60.0)
        runs = cast(dict[bytes, bytes], redis_client.hgetall(f"{key_prefix}:ledger:runs"))
        assert {k.decode(): int(v) for k, v in runs.items()} == dict.fromkeys(ids, 1)
        assert "Drain refused" not in drainer.log()
        # Only what the page leaves out (CONFIG GET) and the worker's user's drains.
        denied = refused_keys(cast(list[dict[str, Any]], admin_client.acl_log(count=1000)))
        assert denied, "the worker's drains were refused by Redis"
        assert denied <= memory_of(key_prefix, "worker"), denied
    finally:
        for process in (worker, drainer):
            log = process.stop() if process.process is not None else ""
            print(f"===== {process.queue} log\n{log}")
        for app in apps:
            Resilience.for_app(app).runtime.close()
            app.close()
        for queue in (base["WORKERAPP_QUEUE"], drain_queue):
            redis_client.delete(queue, f"_kombu.binding.{queue}")
        for key in redis_client.scan_iter(match=f"{broker_keyprefix(key_prefix)}*"):
            redis_client.delete(key)


#: Every ``celery resilience`` command, with the arguments each is run with under every role
#: (``{entry}``, ``{prefix}`` and ``{task}`` name an entry of the role's own world), and the
#: exit code it must end with. ``purge`` without ``--yes`` only counts, and says so with 1.
READS: tuple[tuple[tuple[str, ...], int], ...] = (
    (("status",), 0),
    (("status", "--json"), 0),
    (("list",), 0),
    (("list", "--status", "dead"), 0),
    (("list", "--status", "parked", "--json"), 0),
    (("show", "{entry}"), 0),
    (("show", "{prefix}"), 0),
    (("show", "{task}"), 0),
    (("show", "{dead}", "--json"), 0),
    (("replay", "--all", "--dry-run"), 0),
    (("purge",), 1),
    (("check", "--json"), 0),
    (("repair", "--dry-run"), 0),
    (("fleet", "--json", "--timeout", "0.5", "--rounds", "1"), 0),
)
#: Commands Redis refuses to a role, before they publish anything (their exit code is 1).
REFUSED: dict[str, set[tuple[str, ...]]] = {"worker": {("replay", "{entry}"), ("drain",)}}
WRITES: tuple[tuple[tuple[str, ...], int], ...] = (
    (("open", "payments", "--reason", "acl"), 0),
    (("close", "payments"), 0),
    (("reset", "payments"), 0),
    (("open", "hook:h1"), 0),  # a derived breaker: its family's keys are kept while forced
    (("reset", "hook:h1"), 0),
    (("replay", "{entry}"), 0),
    (("drain",), 0),
    (("rotate-keys",), 0),
    (("repair",), 0),
    (("purge", "--status", "dead", "--yes"), 0),
)


def allowed_commands(rules: str) -> set[str]:
    """The commands a role's rules allow (``+cmd`` and ``+cmd|sub``), in lower case."""
    return {word[1:].lower() for word in rules.split() if word.startswith("+")}


def test_every_command_a_script_runs_is_allowed_to_every_role() -> None:
    """Redis checks each command a script runs against the caller's rules: a command the page
    forgets fails only on the path that runs it (forcing a derived breaker runs PERSIST)."""
    scripts = Path(__file__).resolve().parent.parent / "celery_resilience"
    called = {
        name.lower()
        for path in scripts.rglob("*.lua")
        for name in re.findall(r"redis\.p?call\(\s*['\"](\w+)['\"]", path.read_text())
    }
    assert {"zadd", "time", "persist"} <= called  # the pattern finds them
    for role, rules in acl_rules().items():
        assert called - allowed_commands(rules) == set(), f"resilience-{role} may not run them"


def test_every_cli_command_and_the_commands_table_agree() -> None:
    from celery_resilience.cli import resilience

    covered = {args[0] for args, _ in READS + WRITES} | {"metrics"}
    assert covered == set(resilience.commands)


@pytest.mark.parametrize("role", ["worker", "drainer", "admin"])
def test_every_cli_command_and_a_metrics_scrape_run_under_each_documented_role(
    role: str, acl_server: RedisServer, redis_url: str, redis_client: redis.Redis,
    key_prefix: str,
) -> None:  # fmt: skip
    from .support.cli import Cli
    from .support.metrics_server import MetricsServer, value

    admin_client = acl_server.client()
    rules = acl_rules()
    assert role in rules, f"the page gives no rules for resilience-{role}"
    user = set_user(admin_client, role, rules[role], key_prefix)
    keys = json.dumps(
        {
            "signing": ["acl-test-signing-" + uuid.uuid4().hex],
            "encryption": [Fernet.generate_key().decode()],
        }
    )
    base = {
        "CLIAPP_PREFIX": key_prefix,
        "CLIAPP_BROKER": redis_url,
        "CLIAPP_QUEUE": f"{key_prefix}-queue",
        "CLIAPP_KEYS": keys,
        "CLIAPP_ACKS_LATE": "1",
        "CLIAPP_HOOKS": "5",
    }
    # The world is parked by the server's own default user; the commands run as the role.
    world = Cli({**base, "CLIAPP_REDIS": acl_server.url}, redis_client)
    as_role = Cli(
        {**base, "CLIAPP_REDIS": f"redis://{user}@127.0.0.1:{acl_server.port}/0"}, redis_client
    )
    metrics = MetricsServer(as_role.env)
    try:
        first, second = world.park(1), world.park(2)
        dead = world.park(3, status="dead")
        world.park(4, task_name="cliapp.notify", breaker=None)
        names = {
            "entry": first.id,
            "prefix": second.id[:8],
            "task": second.task_id,
            "dead": dead.id,
        }

        refused = REFUSED.get(role, set())

        def run(commands: tuple[tuple[tuple[str, ...], int], ...], together: bool) -> list[str]:
            """Each command's failure (an unexpected exit code), for after Redis's own log."""
            argv = [tuple(a.format(**names) for a in args) for args, _ in commands]
            results = (
                as_role.many(*argv) if together else [as_role(*args, rc=None) for args in argv]
            )
            wanted = [1 if args in refused else rc for args, rc in commands]
            return [str(r) for r, rc in zip(results, wanted, strict=True) if r.returncode != rc]

        failed = run(READS, together=True)
        failed += run(WRITES, together=False)
        metrics.wait_ready()
        scraped = metrics.scrape()

        denied = refused_keys(cast(list[dict[str, Any]], admin_client.acl_log(count=1000)))
        allowed = memory_of(key_prefix, role) if refused else set()
        assert denied <= allowed, f"Redis denied {sorted(denied - allowed)} to resilience-{role}"
        assert failed == []
        assert value(scraped, "up") == 1, metrics.output()
        assert value(scraped, "breaker_state", breaker="payments", state="closed") == 1
        left = world.store.count()
        if refused:  # neither replayed nor drained: the three parked entries are still there
            assert (left, sent_count(redis_client, base["CLIAPP_QUEUE"])) == (3, 0)
        else:
            assert left == 0, "replayed, drained and purged: nothing is left"
        checked = as_role("check", "--json").json()
        assert not [f for f in checked if f["level"] == "error"], checked
    finally:
        metrics.stop()
        world.res.runtime.close()
        as_role.res.runtime.close()
        admin_client.close()


def test_an_ack_refused_mid_drain_stops_it_and_nothing_is_sent_again_until_it_may(
    acl_server: RedisServer, redis_url: str, redis_client: redis.Redis, key_prefix: str,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The drainer's user loses the drain's memory between two batches (its rules changed):
    the second batch's ack is refused. The drain stops, said once at ERROR; that batch stays
    claimed until its lease ends, and no pass sends it again while the user may not ack: it
    goes once more (at-least-once, one batch) when a drain may."""
    from celery_resilience.drain import Drainer

    from .support.drain_world import TASK, PublishSpy, charge, park, queue_keys

    admin_client = acl_server.client()
    rules = acl_rules()
    user = set_user(admin_client, "drainer", rules["drainer"], key_prefix)
    queue = f"{key_prefix}-acl-queue"
    app = Celery("acl-mid-drain", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        resilience_redis_url=f"redis://{user}@127.0.0.1:{acl_server.port}/0",
        resilience_key_prefix=key_prefix,
        resilience_drain_batch=2,
        resilience_drain_rate=100_000.0,
    )
    app.task(name=TASK, shared=False)(charge)
    res = Resilience(app)
    try:
        entries = park(res, 4, queue)
        store = res.runtime.backout_store

        def downgrade(sent: int, entry: ParkedTask) -> None:
            if sent == 2:  # the first batch acked: the second is published, then refused
                set_user(admin_client, "drainer", rules["worker"], key_prefix)

        spy = PublishSpy(monkeypatch, downgrade)
        with caplog.at_level(logging.ERROR, logger="celery_resilience.drain"):
            first = Drainer(res.runtime, lease=2.0).run()
            again = Drainer(res.runtime, lease=2.0).run()
        assert (first.replayed, first.errors) == (2, 1)
        assert first.denied is not None
        assert again.denied is not None
        assert len(spy.task_ids) == 4, "the refused pass published nothing"
        refused = [r for r in caplog.records if r.getMessage().startswith("Drain refused")]
        assert len(refused) == 1
        assert store.count() == 2
        set_user(admin_client, "drainer", rules["drainer"], key_prefix)
        wait_for(lambda: store.due("dep") == 2, "the refused batch's lease to end", 30.0)
        assert Drainer(res.runtime).run().replayed == 2
        assert store.count() == 0
        assert sorted(spy.task_ids) == sorted(
            [e.task_id for e in entries] + [e.task_id for e in entries[2:]]
        )
    finally:
        res.runtime.close()
        app.close()
        for key in queue_keys(redis_client, queue):
            redis_client.delete(key)
        redis_client.delete(f"_kombu.binding.{queue}")
