"""pytest plugin: an isolated breaker store and back-out store per test, and helpers.

Registered through the ``pytest11`` entry point, and inert until a test asks for one of its
fixtures. ``resilience_factory(app)`` gives ``app`` a fresh :class:`Resilience` for the test:
in memory (the default: no Redis needed, single process) or on Redis under a fresh key prefix
that is deleted afterwards (``backend="redis"``, for tests with real workers). The app's own
``Resilience`` is put back at the end.

.. code-block:: python

    def test_charge_is_parked_while_payments_are_down(celery_app, resilience_factory):
        harness = resilience_factory(celery_app)
        harness.force_open("payments")
        charge.delay(42)
        [entry] = harness.parked(breaker="payments")
        assert entry.reason == "breaker_open"
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import redis

from .. import runtime as runtimes
from ..backout.entry import ParkedTask
from ..breaker.breaker import Breaker
from ..config import MEMORY_URL, ResilienceConfig
from ..drain import DrainReport
from ..resilience import Resilience
from ..runtime import Runtime

REDIS_URL_ENV = "RESILIENCE_TEST_REDIS_URL"


class _Overlay:
    """``app.conf`` with a few settings replaced, without touching the app's configuration."""

    def __init__(self, conf: Any, overrides: Mapping[str, Any]) -> None:
        self._conf, self._overrides = conf, overrides

    def get(self, name: str, default: Any = None) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        return self._conf.get(name, default)


class ResilienceHarness:
    """What a test needs: the app's isolated ``Resilience`` and short-hands to steer it."""

    def __init__(self, app: Any, resilience: Resilience) -> None:
        self.app = app
        self.resilience = resilience

    def breaker(self, name: str) -> Breaker:
        return self.resilience.breaker(name)

    def state(self, name: str) -> str:
        return self.breaker(name).state

    def force_open(self, name: str) -> None:
        self.breaker(name).force_open()

    def force_closed(self, name: str) -> None:
        self.breaker(name).force_closed()

    def reset(self, name: str) -> None:
        self.breaker(name).reset()

    def parked(
        self, breaker: str | None = None, reason: str | None = None, status: str | None = None
    ) -> list[ParkedTask]:
        """Parked entries, newest first (all of them: tests park few)."""
        return self.resilience.backout.list(breaker, status, 10_000, reason=reason)

    def drain(self, breaker: str | None = None, limit: int | None = None) -> DrainReport:
        """Replay due entries of breakers that admit calls (in eager mode they run at once)."""
        return self.resilience.drain(breaker=breaker, limit=limit)

    def replay_all(self) -> list[ParkedTask]:
        """Replay every parked entry now, whatever the breakers say."""
        return [self.resilience.backout.replay(e.id) for e in self.parked(status="parked")]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "resilience_backend",
        "celery-resilience test backend: memory (default) or redis",
        default="memory",
    )
    parser.addini(
        "resilience_redis_url",
        f"Redis for backend=redis (default: ${REDIS_URL_ENV}, else the app's own)",
        default="",
    )


@pytest.fixture
def resilience_factory(
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., ResilienceHarness]]:
    """``make(app, backend=None, redis_url=None, **settings)`` -> an isolated harness."""
    made: list[tuple[Any, Runtime | None, Runtime]] = []

    def make(
        app: Any, backend: str | None = None, redis_url: str | None = None, **settings: Any
    ) -> ResilienceHarness:
        backend = backend or str(request.config.getini("resilience_backend") or "memory")
        overrides = {f"resilience_{k}": v for k, v in settings.items()}
        if backend == "memory":
            overrides["resilience_redis_url"] = MEMORY_URL
        elif backend == "redis":
            url = redis_url or request.config.getini("resilience_redis_url")
            url = url or os.environ.get(REDIS_URL_ENV)
            if url:
                overrides["resilience_redis_url"] = url
            overrides["resilience_key_prefix"] = f"pytest-{uuid.uuid4().hex[:12]}"
        else:
            raise ValueError(f"backend must be 'memory' or 'redis', got {backend!r}")
        config = ResilienceConfig.from_conf(_Overlay(app.conf, overrides))
        runtime = Runtime(app, config)
        made.append((app, runtimes.installed(app), runtime))
        runtimes.install(app, runtime)
        return ResilienceHarness(app, Resilience.for_app(app))

    yield make
    for app, previous, runtime in reversed(made):
        if not runtime.config.in_memory:
            delete_prefix(runtime.redis, runtime.config.key_prefix)
        runtime.close()
        if previous is None:
            runtimes.forget(app)
        else:
            runtimes.install(app, previous)


@pytest.fixture
def resilience(
    request: pytest.FixtureRequest, resilience_factory: Callable[..., ResilienceHarness]
) -> ResilienceHarness:
    """A harness for the ``celery_app`` fixture's app (Celery's own pytest plugin)."""
    return resilience_factory(request.getfixturevalue("celery_app"))


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    """Delete every key under ``prefix`` (hash-tagged ones too); never a whole database."""
    for pattern in (f"{prefix}*", f"{{{prefix}*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
