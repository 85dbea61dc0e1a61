"""The example shop under test: Django on a temporary SQLite file, Celery in eager mode.

Breakers and the back-out store come from the package's pytest plugin
(``celery_resilience.contrib.pytest``, loaded through its ``pytest11`` entry point): the
``resilience_factory`` fixture gives the shop's app an in-memory ``Resilience`` per test, so
the eager tests need neither Redis nor a worker; ``test_live.py`` asks it for one on Redis and
runs the shop's own worker and beat. The payment gateway is the real one, in a thread.
Without the ``demo`` extra (Django, django-celery-results) these tests are not collected.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from celery_resilience.contrib.pytest import ResilienceHarness

if TYPE_CHECKING:
    from gateway import Gateway

PROJECT = Path(__file__).resolve().parent.parent
HAVE_DJANGO = all(find_spec(name) for name in ("django", "django_celery_results"))
_DB_DIR = tempfile.mkdtemp(prefix="shop-tests-")

if not HAVE_DJANGO:  # pip install -e ".[demo]"
    collect_ignore_glob = ["test_*.py"]
else:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="shop.settings",
        SHOP_DB_PATH=str(Path(_DB_DIR) / "shop.sqlite3"),
        SHOP_BROKER_URL="memory://",  # nothing leaves the process
        SHOP_KEY_PREFIX="shop-tests",
    )
    sys.path.insert(0, str(PROJECT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def pytest_sessionfinish() -> None:
    shutil.rmtree(_DB_DIR, ignore_errors=True)


@pytest.fixture
def app() -> Iterator[Any]:
    """The shop's Celery app in eager mode; tasks' failures are returned, not raised."""
    from shop.celery import app as shop_app

    saved = {k: shop_app.conf.get(k) for k in ("task_always_eager", "task_eager_propagates")}
    shop_app.conf.task_always_eager = True
    shop_app.conf.task_eager_propagates = False
    yield shop_app
    shop_app.conf.update(saved)


@pytest.fixture
def shop(app: Any, resilience_factory: Callable[..., ResilienceHarness]) -> ResilienceHarness:
    """The shop's breakers and store, in memory, fresh for this test (the package's plugin).

    The breaker's open timeout is cut to 1 s so a test can watch it half-open (long enough that
    a loaded machine does not see it half-open before the test looks at it open).
    """
    breakers = dict(app.conf.resilience_breakers)
    breakers["payments"] = {**breakers["payments"], "open_timeout": 1.0}
    return resilience_factory(app, breakers=breakers)


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    """The real payment gateway, served from threads on free loopback ports."""
    from django.test import override_settings

    from gateway import Gateway

    gw = Gateway(port=0, control_port=0).start()
    with override_settings(PAYMENTS_GATEWAY_URL=gw.api_url):
        yield gw
    gw.stop()


@pytest.fixture(autouse=True)
def _no_orders() -> Iterator[None]:
    from orders.models import Order

    yield
    Order.objects.all().delete()
