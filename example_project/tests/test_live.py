"""The shop for real: its own ``celery -A shop worker`` and ``celery -A shop beat`` processes,
the broker, the breaker and the back-out store on Redis, the real gateway going down and up.

The package's pytest plugin gives the test its view of the shop's breakers and parked tasks:
``resilience_factory(app, backend="redis")`` picks a fresh key prefix, the worker and beat are
started with it as ``SHOP_KEY_PREFIX`` (their broker keys go under it too), and every key under
it is deleted afterwards. Redis is ``RESILIENCE_TEST_REDIS_URL`` (default: database 15 of the
Redis on 127.0.0.1:6379). The database is the tests' SQLite file, shared with the worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis
from celery_resilience.breaker.store import DeliveryQuestions
from celery_resilience.contrib.pytest import ResilienceHarness

from gateway import Gateway
from orders.models import Order
from orders.tasks import charge_order

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PROJECT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("RESILIENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
ORDERS = 12


def wait_for(what: str, condition: Callable[[], Any], timeout: float, logs: list[Path]) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in logs)
            pytest.fail(f"timed out after {timeout}s waiting for {what}\n{tails}")
        time.sleep(0.1)
    return value


class Shop:
    """The shop's worker and beat, started as a deployment would, stopped by their PIDs."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env, self.logdir = env, logdir
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self, name: str, args: list[str], ready: str) -> None:
        log = self.logdir / f"{name}.log"
        with open(log, "ab") as out:
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "shop", *args],
                    cwd=PROJECT,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        self.logs.append(log)
        wait_for(f"the {name} to start", lambda: ready in log.read_text(), 30, self.logs)

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)  # warm shutdown: children finish first
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(15)


@pytest.fixture
def live(
    app: Any, resilience_factory: Callable[..., ResilienceHarness], gateway: Gateway, tmp_path: Path
) -> Iterator[tuple[ResilienceHarness, Shop, Any]]:
    """The harness, the shop's running worker and beat, and a connection to their broker."""
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.fail(f"no Redis at {REDIS_URL} ({exc}): start one or set RESILIENCE_TEST_REDIS_URL")
    app.conf.task_always_eager = False  # the worker runs the tasks
    harness = resilience_factory(app, backend="redis", redis_url=REDIS_URL)
    prefix = harness.resilience.runtime.config.key_prefix
    env = {
        **os.environ,
        # The shop, and the package of this checkout (the one the tests import).
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(PROJECT), str(PROJECT.parent), os.environ.get("PYTHONPATH")])
        ),
        "SHOP_BROKER_URL": REDIS_URL,
        "SHOP_RESILIENCE_REDIS_URL": REDIS_URL,
        "SHOP_KEY_PREFIX": prefix,
        "SHOP_GATEWAY_URL": gateway.api_url,
        "SHOP_DEBUG": "0",
    }
    shop = Shop(env, tmp_path)
    # The tests' app publishes to memory://: this test sends to the worker's broker instead.
    connection = app.connection_for_write(
        REDIS_URL, transport_options={"global_keyprefix": f"{prefix}:"}
    )
    try:
        shop.start(
            "worker",
            ["worker", "-P", "prefork", "-c", "2", "-n", f"{prefix}@%h", "-l", "info",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            " ready.",
        )  # fmt: skip
        shop.start("beat", ["beat", "-l", "info", "-s", str(tmp_path / "schedule")], "Starting")
        yield harness, shop, connection
    finally:
        shop.stop()
        connection.release()


def test_a_gateway_outage_with_a_real_worker_and_beat_charges_every_order_once(
    live: tuple[ResilienceHarness, Shop, Any], gateway: Gateway
) -> None:
    shop, processes, connection = live
    gateway.down("refuse")
    orders = [Order.objects.create(amount=Decimal("9.99")) for _ in range(ORDERS)]
    for order in orders:
        charge_order.apply_async((order.pk,), connection=connection)

    def statuses() -> set[str]:
        return set(
            Order.objects.filter(pk__in=[o.pk for o in orders]).values_list("status", flat=True)
        )

    # Down: the first orders retry and fail, five failures open the shared breaker, the rest
    # is parked at once; nothing reaches the gateway.
    wait_for("every order parked", lambda: statuses() == {"parked"}, 30, processes.logs)
    assert shop.state("payments") in ("open", "half_open")
    assert len(shop.parked(breaker="payments")) in (ORDERS - 1, ORDERS)  # one may be a probe
    assert gateway.ledger()["charges"] == {}

    # Up: beat's drain sends a probe once the breaker half-opens, it closes the breaker, the
    # next drains replay the rest. Nobody in the test drains.
    gateway.up()
    wait_for("every order charged", lambda: statuses() == {"charged"}, 45, processes.logs)
    wait_for("an empty back-out store", lambda: not shop.parked(), 10, processes.logs)
    time.sleep(2.5)  # one more drain from beat: nothing is left to replay
    assert gateway.ledger()["charges"] == {str(o.pk): 1 for o in orders}
    charges = Order.objects.filter(pk__in=[o.pk for o in orders]).values_list(
        "charge_count", flat=True
    )
    assert sorted(charges) == [1] * ORDERS
    assert shop.state("payments") == "closed"
    assert shop.breaker("payments").snapshot()["opened_total"] >= 1
    worker_log = processes.logs[0].read_text()
    assert "celery_resilience.drain[" in worker_log


def test_an_order_whose_charge_waits_for_a_claim_is_not_marked_parked(
    live: tuple[ResilienceHarness, Shop, Any], gateway: Gateway
) -> None:
    # Given another delivery of a charge's task id holding its claim (deduplicate) for 8 s
    shop, processes, connection = live
    runtime = shop.resilience.runtime
    order = Order.objects.create(amount=Decimal("9.99"))
    task_id = f"charge-{uuid.uuid4().hex[:8]}"
    holder = DeliveryQuestions(task_id, 0, check_done=True, claim="another", lease_us=8_000_000)
    assert runtime.deliver("payments", holder).skip == ""  # it claimed the id

    # When the charge is delivered meanwhile: it waits in the broker for the claim
    charge_order.apply_async((order.pk,), task_id=task_id, connection=connection)
    waits = f"Task orders.charge_order[{task_id}]: task id"
    wait_for(
        "the charge to wait", lambda: waits in processes.logs[0].read_text(), 30, processes.logs
    )

    # Then the order is not "parked" (nothing is in the store), and is charged once the claim
    # ends
    time.sleep(0.5)  # the delivery's end (Celery's Ignore) has been handled
    order.refresh_from_db()
    assert (order.status, shop.parked()) == ("pending", [])
    assert runtime.claim_left("payments", task_id) > 0
    charged = lambda: Order.objects.get(pk=order.pk).status == "charged"  # noqa: E731
    wait_for("the order charged", charged, 45, processes.logs)
    assert gateway.ledger()["charges"] == {str(order.pk): 1}
