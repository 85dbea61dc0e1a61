"""Shared fixtures: every test that touches Redis works under its own key prefix.

Tests use the Redis on 127.0.0.1:6379 (``RESILIENCE_TEST_REDIS_URL`` overrides it) and delete
only the keys under their own prefix; they never flush a database.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
import redis

from celery_resilience.contrib.pytest import delete_prefix

pytest_plugins = ("pytester", "tests.support.kinds")

REDIS_URL = os.environ.get("RESILIENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def service_missing(why: str) -> NoReturn:
    """A service a test needs is missing: a skip on a contributor's machine, a failure in CI
    (``CI`` set), which starts every service the suite uses."""
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


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
    client = redis.Redis.from_url(redis_url)
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
