"""The kinds of test (``tests/support/kinds.py``): every test has exactly one, and a ``unit``
test that connects a socket or starts a process fails, so ``pytest -m unit`` stays free of I/O.

Each case runs a throwaway test file in a pytest session of its own (``pytester``, in-process)
with the kinds plugin alone loaded (installed plugins stay out: some run ``git`` at start).
"""

from __future__ import annotations

import sys

import pytest
from _pytest.assertion.rewrite import AssertionRewritingHook

pytestmark = pytest.mark.unit

#: The kinds plugin alone, and no ``ast.parse`` in this process's runs: CPython 3.11 can fail it
#: with "AST constructor recursion depth mismatch" while another thread parses too (a stray
#: thread of an earlier test formatting a traceback), which stops the run on an internal error.
#: --assert=plain: no rewriting hook of the inner session; --tb=line: a failure is reported by
#: its crash line, without the statement range a longer traceback parses the source for.
ARGS = ("-p", "tests.support.kinds", "-p", "no:cacheprovider", "--assert=plain", "--tb=line")


@pytest.fixture(autouse=True)
def _no_installed_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture(autouse=True)
def _no_outer_rewriting(monkeypatch: pytest.MonkeyPatch) -> None:
    """This session's rewriting hook would parse the thrown-away test modules (their names
    match its ``test_*.py``) as the inner session imports them."""
    hooks = [finder for finder in sys.meta_path if isinstance(finder, AssertionRewritingHook)]
    for hook in hooks:
        monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if f is not hook])


def run(pytester: pytest.Pytester, source: str) -> pytest.RunResult:
    pytester.makepyfile(test_thrown_away=source)
    return pytester.runpytest_inprocess(*ARGS)


def test_a_unit_test_that_connects_a_socket_fails_naming_what_it_did(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
import socket
import pytest

pytestmark = pytest.mark.unit

def test_talks_to_redis():
    socket.create_connection(("127.0.0.1", 6379), timeout=1)
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*NotAUnitTest: a unit test connected a socket*"])


def test_a_unit_test_that_starts_a_process_fails_naming_what_it_did(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
import subprocess
import sys
import pytest

pytestmark = pytest.mark.unit

def test_spawns_a_worker():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*NotAUnitTest: a unit test started a process*"])


def test_a_unit_fixture_that_connects_a_socket_is_an_error_of_its_test(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
import socket
import pytest

pytestmark = pytest.mark.unit

@pytest.fixture
def client():
    return socket.create_connection(("127.0.0.1", 6379), timeout=1)

def test_uses_a_client(client):
    pass
""",
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*NotAUnitTest: a unit test connected a socket*"])


def test_pure_unit_tests_and_tests_of_other_kinds_pass(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
import pytest

def test_pure():
    assert sorted([3, 1, 2]) == [1, 2, 3]

pytest.mark.unit(test_pure)

@pytest.mark.contract
def test_contract():
    pass

@pytest.mark.integration
def test_integration():
    pass
""",
    )
    result.assert_outcomes(passed=3)


@pytest.mark.parametrize(
    ("marks", "found"),
    [("", "none"), ("@pytest.mark.unit\n@pytest.mark.integration", "['integration', 'unit']")],
)
def test_a_test_without_exactly_one_kind_stops_the_collection(
    pytester: pytest.Pytester, marks: str, found: str
) -> None:
    result = run(pytester, f"import pytest\n\n{marks}\ndef test_unsorted():\n    pass\n")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    error = result.stderr.str()
    assert "every test needs exactly one of the markers unit, contract, integration" in error
    assert f"test_thrown_away.py::test_unsorted: {found}" in error


def test_minus_m_unit_does_not_import_a_module_without_unit_tests(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_pure="import pytest\n\npytestmark = pytest.mark.unit\n\ndef test_pure():\n    pass\n",
        test_heavy="raise ImportError('a module of integration tests was imported')\n",
    )
    unit = pytester.runpytest_inprocess(*ARGS, "-m", "unit")
    unit.assert_outcomes(passed=1)
    everything = pytester.runpytest_inprocess(*ARGS)
    everything.assert_outcomes(errors=1)
