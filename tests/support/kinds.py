"""The three kinds of test, and the guard that keeps ``unit`` honest.

Every test carries exactly one kind (a module's ``pytestmark`` gives it):

- ``unit``: pure logic, no network and no process (``pytest -m unit`` runs in seconds);
- ``contract``: one behaviour suite run against every backend (memory, Redis, database);
- ``integration``: real Redis, real workers, real services.

A test without a kind, or with two, stops the collection. A ``unit`` test that connects a socket
or starts a process fails, naming what it did: such a test belongs to another kind. ``-m unit``
imports only the modules that name ``pytest.mark.unit``.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest

KINDS = ("unit", "contract", "integration")
UNIT_MARK = "pytest.mark.unit"


def kinds_of(item: pytest.Item) -> list[str]:
    return sorted({mark.name for mark in item.iter_markers() if mark.name in KINDS})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    wrong = [
        f"{item.nodeid}: {kinds_of(item) or 'none'}" for item in items if len(kinds_of(item)) != 1
    ]
    if wrong:
        raise pytest.UsageError(
            "every test needs exactly one of the markers unit, contract, integration "
            "(in its module: pytestmark = pytest.mark.unit, or contract, or integration): "
            + "; ".join(wrong[:10])
        )


class NotAUnitTest(AssertionError):
    """A ``unit`` test did I/O that only contract and integration tests may do."""


def _refuse(what: str) -> Any:
    def refused(*args: object, **kwargs: object) -> NoReturn:
        raise NotAUnitTest(f"a unit test {what}: mark its module integration (or contract)")

    return refused


@contextmanager
def no_network_no_process() -> Iterator[None]:
    """Within the block, connecting a socket or starting a process raises ``NotAUnitTest``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", _refuse("connected a socket"))
        patch.setattr(socket.socket, "connect_ex", _refuse("connected a socket"))
        patch.setattr(subprocess.Popen, "__init__", _refuse("started a process"))
        patch.setattr(os, "fork", _refuse("forked"))
        yield


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m unit`` alone, a test module whose source never names ``pytest.mark.unit`` is
    not even imported: importing every module (Django, Selenium, SciPy...) would take longer
    than running the unit tests."""
    if config.option.markexpr.strip() != "unit" or not collection_path.name.startswith("test_"):
        return None
    if collection_path.suffix == ".py" and UNIT_MARK not in collection_path.read_text():
        return True
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    if "unit" not in kinds_of(item):
        return (yield)
    with no_network_no_process():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    if "unit" not in kinds_of(item):
        return (yield)
    with no_network_no_process():
        return (yield)
