"""Shared fixtures: every test that touches Redis works under its own key prefix.

Tests use the Redis on 127.0.0.1:6379 (``RESILIENCE_TEST_REDIS_URL`` overrides it) and delete
only the keys under their own prefix; they never flush a database.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_resilience.contrib.pytest import delete_prefix
from tests.support.services import REDIS_URL

pytest_plugins = (
    "pytester",
    "tests.support.kinds",
    "tests.support.schedule",
    "tests.support.worker_world",
    "tests.support.cli",
    "tests.support.fleet",
    "tests.support.stores",
    "tests.support.resilience",
    "tests.support.drain_world",
)


@pytest.fixture(scope="session")
def redis_url() -> str:
    return REDIS_URL


@pytest.fixture(scope="session")
def built_docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HTML docs, built once per session with warnings as errors
    (``tests/support/docs_build.py``)."""
    from tests.support.docs_build import build_docs

    return build_docs(tmp_path_factory.mktemp("docs"))


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    # No socket timeout, as redis-py had none before 8.2 (5 s since): a test's blocking read
    # (BLPOP for a process it started) waits for its own deadline, however busy the host.
    client = redis.Redis.from_url(redis_url, socket_timeout=None)
    try:
        client.ping()
    except redis.ConnectionError:  # pragma: no cover - CI starts Redis first
        pytest.fail(f"no Redis at {redis_url}: start one or set RESILIENCE_TEST_REDIS_URL")
    yield client
    client.close()


@pytest.fixture
def key_prefix(redis_client: redis.Redis) -> Iterator[str]:
    """A fresh prefix; every key made under it is deleted afterwards."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield prefix
    delete_prefix(redis_client, prefix)


#: Queue names the suite makes (each with a random suffix): kombu's Redis transport leaves a
#: binding key per queue behind; the session removes those of its own queues at the end.
OWN_QUEUE_PREFIXES = ("drain-test-", "drain-chaos-", "admin-test-", "django-store-test-", "test-")


@pytest.fixture(scope="session", autouse=True)
def _forget_own_queue_bindings() -> Iterator[None]:
    yield
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for prefix in OWN_QUEUE_PREFIXES:
            for kind in ("_kombu.binding_permanent.", "_kombu.binding."):
                keys = list(client.scan_iter(match=f"{kind}{prefix}*", count=1000))
                if keys:
                    client.delete(*keys)
    except redis.RedisError:
        pass
    finally:
        client.close()
