"""``make_resilience``, the suite's one way to make an app and its ``Resilience``: a fixture of the
whole suite (``conftest.py`` loads this module as a plugin).

Each call makes a new app (one "worker") on the test's Redis and key prefix, so that several of
them share the breakers and the store as processes of a fleet do; each is the app's own
(installed: its tasks use it), and every one is closed after the test. A module whose apps all
need more (a queue of the test's own, its tasks) overrides ``app_setup``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from celery import Celery

from celery_resilience import Resilience
from celery_resilience.backout import MemoryBackoutStore
from celery_resilience.breaker import MemoryBreakerStore

MakeResilience = Callable[..., Resilience]
#: What every app of a test is given before its own settings, its ``Resilience`` made after.
AppSetup = Callable[[Celery], None]


def nothing_more(app: Celery) -> None:
    """The app as ``make_resilience`` makes it, with nothing added."""


@pytest.fixture
def app_setup() -> AppSetup:
    """Applied to each app ``make_resilience`` makes, before the call's own settings."""
    return nothing_more


@pytest.fixture
def make_resilience(
    redis_url: str, key_prefix: str, app_setup: AppSetup
) -> Iterator[MakeResilience]:
    """``make(kind="redis", like=None, conf={}, **settings)``: a new app and its ``Resilience``.

    ``settings`` are ``resilience_*`` settings without the prefix (its Redis is the test's unless
    ``redis_url`` is one of them); ``conf`` other settings of the app (``task_default_queue``).
    ``kind="memory"``: breakers and store in memory, those of ``like`` if given (Redis ones are
    shared through the key prefix). Its connections to Redis carry the test's key prefix as
    their client name, so that a test can cut its own connections and no one else's.
    """
    made: list[tuple[Celery, Resilience]] = []

    def make(
        kind: str = "redis",
        like: Resilience | None = None,
        conf: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> Resilience:
        app = Celery("t", broker=redis_url, set_as_current=False)
        app_setup(app)
        app.conf.update(conf or {})
        app.conf.resilience_key_prefix = key_prefix
        app.conf.resilience_redis_url = redis_url
        app.conf.resilience_redis_options = {"client_name": key_prefix}
        app.conf.update({f"resilience_{name}": value for name, value in settings.items()})
        if kind == "memory":
            breakers = like.runtime.breaker_store if like else MemoryBreakerStore()
            backout = like.runtime.backout_store if like else MemoryBackoutStore()
            resilience = Resilience(app, breaker_store=breakers, backout=backout)
        else:
            resilience = Resilience(app)
        made.append((app, Resilience.install(app, resilience)))
        return resilience

    yield make
    for app, resilience in made:
        resilience.runtime.close()
        app.close()
