"""The services the suite runs against, and what a test does when one is missing.

Tests use the Redis on 127.0.0.1:6379 (``RESILIENCE_TEST_REDIS_URL`` overrides it), database 15,
and delete only the keys under their own prefix; they never flush a database.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REDIS_URL = os.environ.get("RESILIENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def service_missing(why: str) -> NoReturn:
    """A service a test needs is missing: a skip on a contributor's machine, a failure in CI
    (``CI`` set), which starts every service the suite uses."""
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)
