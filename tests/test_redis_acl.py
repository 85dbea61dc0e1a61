"""The Redis ACL rules of ``docs/threat-model.rst`` are enough: a real worker parks and a drainer
drains under them, and Redis denies nothing on the way.

The rules are read from the page itself (its ``ACL SETUSER`` lines), so the page and the test
can't drift apart. They are set on a ``redis-server`` this test starts (the resilience Redis);
the broker and the ledger stay on the shared one. Signing and encryption are on, and at the end
no order id is found in any key of that server.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from celery import Celery
from cryptography.fernet import Fernet

from celery_resilience import Resilience

from .apps.workerapp import broker_keyprefix, make_app
from .support.faults import command
from .support.redis_server import RedisServer
from .support.worker_process import WorkerProcess, wait_until

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


def test_a_worker_and_a_drainer_run_under_the_documented_acl_rules(
    acl_server: RedisServer, redis_url: str, redis_client: redis.Redis, key_prefix: str,
    tmp_path: Path,
) -> None:  # fmt: skip
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

    redis_client.set(f"{key_prefix}:dep:up", "0")
    worker = WorkerProcess(env("worker"), tmp_path / "worker.log")
    apps: list[Celery] = []
    try:
        worker.start()
        drainer_app, admin_app = make_app(env("drainer")), make_app(env("admin"))
        apps += [drainer_app, admin_app]
        orders = [f"order-{uuid.uuid4().hex}" for _ in range(4)]
        ids = [drainer_app.tasks["workerapp.charge"].delay(o).id for o in orders]
        admin = Resilience.for_app(admin_app)
        wait_until(lambda: admin.backout.count() == len(ids), "every order parked", 60.0)
        parked = admin.backout.list()
        assert {e.task_id for e in parked} == set(ids)
        assert {e.args[0] for e in parked} == set(orders)  # the admin holds the key
        stored = everything_in(admin_client)
        assert not [o for o in orders if o.encode() in stored], "an order id stored in clear"

        redis_client.set(f"{key_prefix}:dep:up", "1")
        admin.breaker("dep").reset()  # the admin's "reset" action
        report = Resilience.for_app(drainer_app).drain()
        assert (report.replayed, report.dead, report.errors) == (len(ids), 0, 0)
        succeeded = f"{key_prefix}:ledger:succeeded"
        wait_until(
            lambda: (
                {m.decode() for m in cast(set[bytes], redis_client.smembers(succeeded))} == set(ids)
            ),
            "every replay succeeded",
            60.0,
        )
        # Only what the page leaves out on purpose: CONFIG GET of the start-up check (it could
        # read the server's passwords too).
        # (acl_log(): the raw reply is a flat list per entry on RESP2, a map on RESP3.)
        denied = cast(list[dict[str, Any]], admin_client.acl_log())
        assert {d["object"] for d in denied} <= {"config|get"}, f"Redis denied: {denied}"
    finally:
        log = worker.stop()
        print(f"===== worker log\n{log}")
        for app in apps:
            Resilience.for_app(app).runtime.close()
            app.close()
        queue = f"{key_prefix}-queue"
        redis_client.delete(queue, f"_kombu.binding.{queue}")
        for key in redis_client.scan_iter(match=f"{broker_keyprefix(key_prefix)}*"):
            redis_client.delete(key)
