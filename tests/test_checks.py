"""Start-up checks: settings and Redis setups that can lose work, found before they do.

``run_checks`` in-process; the Redis findings against a private ``redis-server`` (a Redis of our
own, so ``CONFIG SET maxmemory-policy`` / ``appendonly`` / ``save`` are ours to change, the same
settings as the command-line flags); ``celery resilience check``'s exit codes; and the findings a
real ``celery worker`` logs when it is ready (signal ``worker_ready``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_resilience import Resilience, ResilientTask
from celery_resilience.checks import Finding, log_findings, run_checks
from celery_resilience.config.limits import WorkerLimits
from celery_resilience.task import resilient_tasks
from celery_resilience.versions import version_notes

from .apps.workerapp import make_app as make_worker_app
from .support import cli_forks
from .support.cli_forks import Forked
from .support.redis_server import RedisServer, free_port
from .support.worker_process import WorkerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as private:
        yield private


def configure(server: RedisServer, policy: str, appendonly: bool, save: str = "") -> None:
    client = server.client()
    try:
        client.config_set("maxmemory-policy", policy)
        client.config_set("appendonly", "yes" if appendonly else "no")
        client.config_set("save", save)
    finally:
        client.close()


def make_app(redis_url: str, **conf: Any) -> Celery:
    app = Celery(f"checks-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update(
        broker_url=redis_url,
        resilience_redis_url=redis_url,
        resilience_key_prefix=f"test-checks-{uuid.uuid4().hex[:8]}",
        **conf,
    )
    return app


def checks(app: Celery, worker: WorkerLimits | None = None) -> list[Finding]:
    """What ``celery resilience check`` finds, or a worker with ``worker``'s limits."""
    res = Resilience(app)
    res.runtime.worker = worker or WorkerLimits()
    try:
        return run_checks(res.runtime, resilient_tasks(app))
    finally:
        res.runtime.close()


def redis_findings(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.message.startswith(("Redis ", "Redis at "))]


def version_messages() -> set[str]:
    """What the installed versions make ``check`` say (tests/test_versions.py covers it): left
    out where a test counts findings, so that a dependency's new release changes nothing here."""
    return {note.message for note in version_notes()}


# -- settings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("transport", "max_countdown", "error"),
    [
        ({"broker_transport_options": {"visibility_timeout": 100}}, 100, True),
        ({"broker_transport_options": {"visibility_timeout": 100}}, 150, True),
        ({"broker_transport_options": {"visibility_timeout": 100}}, 99, False),
        ({"broker_transport_options": {"visibility_timeout": 100}}, None, False),
        # The shortest timeout wins: the result backend's redelivers first.
        (
            {
                "broker_transport_options": {"visibility_timeout": 100},
                "result_backend_transport_options": {"visibility_timeout": 50},
            },
            60,
            True,
        ),
        ({}, 3600, True),  # kombu's default visibility timeout, 3600 s
        ({}, None, False),
    ],
)
def test_max_countdown_not_below_visibility_timeout_is_an_error(
    server: RedisServer, transport: dict[str, Any], max_countdown: float | None, error: bool
) -> None:
    configure(server, "noeviction", appendonly=True)
    conf = dict(transport)
    if max_countdown is not None:
        conf["resilience_max_countdown"] = max_countdown
    found = checks(make_app(server.url, **conf))
    countdown = [f for f in found if "resilience_max_countdown" in f.message]
    if not error:
        assert countdown == []
        return
    assert len(countdown) == 1
    (finding,) = countdown
    assert finding.level == "error"
    assert f"resilience_max_countdown ({max_countdown:.0f}s) is not below" in finding.message
    assert "Lower resilience_max_countdown" in finding.message


def test_an_entry_lifetime_not_above_the_longest_wait_is_a_warning(server: RedisServer) -> None:
    """A lifetime starts when an entry is due; one shorter than entries wait (here a retry's
    countdown) says the app's times were not thought through together."""
    configure(server, "noeviction", appendonly=True)

    def lifetime_findings(**conf: Any) -> list[Finding]:
        found = checks(make_app(server.url, **conf))
        return [f for f in found if "resilience_entry_lifetime" in f.message]

    (finding,) = lifetime_findings(resilience_entry_lifetime=600.0, resilience_max_countdown=900)
    assert finding.level == "warning"
    assert "entries may wait 900s (resilience_max_countdown)" in finding.message
    assert lifetime_findings() == []  # 30 days by default


def test_resilient_task_that_a_killed_worker_would_lose_is_an_error_naming_it(
    server: RedisServer,
) -> None:
    configure(server, "noeviction", appendonly=True)
    app = make_app(server.url)
    options: dict[str, Any] = {"base": ResilientTask, "bind": True, "shared": False}

    @app.task(name="checks.unsafe", acks_late=False, **options)
    def unsafe(self: Any) -> None: ...

    @app.task(name="checks.safe", acks_late=True, reject_on_worker_lost=True, **options)
    def safe(self: Any) -> None: ...

    @app.task(name="checks.half", acks_late=True, **options)
    def half(self: Any) -> None: ...

    @app.task(name="checks.plain", acks_late=False, shared=False)
    def plain() -> None: ...  # not a ResilientTask: none of our business

    found = checks(app)
    mine = [f for f in found if f.message.startswith("checks.")]
    assert mine == [
        Finding(
            "error",
            "checks.half has acks_late but not reject_on_worker_lost: a pool child killed "
            "mid-task acks and fails it. Set task_reject_on_worker_lost=True (the "
            "redelivery guard, resilience_max_deliveries, stops crash loops).",
        ),
        Finding(
            "error",
            "checks.unsafe is a ResilientTask without acks_late: a worker killed mid-task "
            "loses it. Set acks_late=True (and task_reject_on_worker_lost=True).",
        ),
    ]
    assert [f for f in found if f.level == "error"] == mine


def test_task_acks_late_setting_counts_for_tasks_that_do_not_say(server: RedisServer) -> None:
    configure(server, "noeviction", appendonly=True)
    app = make_app(server.url, task_acks_late=True, task_reject_on_worker_lost=True)

    @app.task(name="checks.inherits", base=ResilientTask, bind=True, shared=False)
    def inherits(self: Any) -> None: ...

    @app.task(name="checks.opts_out", base=ResilientTask, bind=True, shared=False, acks_late=False)
    def opts_out(self: Any) -> None: ...

    named = {f.message.split(" ")[0] for f in checks(app) if f.message.startswith("checks.")}
    assert named == {"checks.opts_out"}


def test_a_guarded_task_with_nothing_to_end_a_hanging_call_is_a_warning(
    server: RedisServer,
) -> None:
    configure(server, "noeviction", appendonly=True)
    app = make_app(server.url, task_acks_late=True, task_reject_on_worker_lost=True)
    options: dict[str, Any] = {"base": ResilientTask, "bind": True, "shared": False}

    @app.task(name="checks.unbounded", breaker="dep", **options)
    def unbounded(self: Any) -> None: ...

    @app.task(name="checks.soft", breaker="dep", soft_time_limit=5, **options)
    def soft(self: Any) -> None: ...

    @app.task(name="checks.hard", breaker="dep", time_limit=5, **options)
    def hard(self: Any) -> None: ...

    @app.task(name="checks.declared", breaker="dep", call_timeout=3.0, **options)
    def declared(self: Any) -> None: ...

    @app.task(name="checks.nonsense", breaker="dep", call_timeout="3s", **options)
    def nonsense(self: Any) -> None: ...

    @app.task(name="checks.unguarded", **options)
    def unguarded(self: Any) -> None: ...  # no breaker: nothing the breaker would miss

    mine = sorted(
        (f.level, f.message.split(" ")[0]) for f in checks(app) if f.message.startswith("checks.")
    )
    assert mine == [("error", "checks.nonsense.call_timeout"), ("warning", "checks.unbounded")]
    warning = next(f for f in checks(app) if f.message.startswith("checks.unbounded"))
    assert "soft_time_limit" in warning.message
    assert "call_timeout" in warning.message

    app.conf.task_soft_time_limit = 10  # the app's limit counts for every task
    assert not [f for f in checks(app) if f.message.startswith("checks.unbounded")]


def test_a_time_limit_longer_than_the_bulkheads_call_lease_is_a_warning(
    server: RedisServer,
) -> None:
    configure(server, "noeviction", appendonly=True)
    app = make_app(
        server.url,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        resilience_breakers={
            "gateway": {"max_concurrent_calls": 4, "call_lease": 30.0},
            "plain": {},
        },
    )
    options: dict[str, Any] = {"base": ResilientTask, "bind": True, "shared": False}

    @app.task(name="checks.outlives", breaker="gateway", time_limit=120, **options)
    def outlives(self: Any) -> None: ...

    @app.task(name="checks.within", breaker="gateway", soft_time_limit=20, **options)
    def within(self: Any) -> None: ...

    @app.task(name="checks.unbulkheaded", breaker="plain", time_limit=120, **options)
    def unbulkheaded(self: Any) -> None: ...

    mine = [f for f in checks(app) if f.message.startswith("checks.")]
    assert mine == [
        Finding(
            "warning",
            "checks.outlives may run 120s (its time limit) through breaker 'gateway', longer "
            "than the bulkhead's call_lease (30s): a call still running when its lease ends "
            "gives its slot away, and more than max_concurrent_calls (4) calls may then be in "
            "flight. Raise call_lease above the time limit.",
        )
    ]


def test_the_workers_own_time_limits_count_where_its_pool_applies_them(
    server: RedisServer,
) -> None:
    # given: tasks with no time limit of their own, one through a bulkhead
    configure(server, "noeviction", appendonly=True)
    app = make_app(
        server.url,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        resilience_breakers={"gateway": {"max_concurrent_calls": 4, "call_lease": 30.0}},
    )
    options: dict[str, Any] = {"base": ResilientTask, "bind": True, "shared": False}

    @app.task(name="checks.guarded", breaker="gateway", **options)
    def guarded(self: Any) -> None: ...

    def mine(worker: WorkerLimits | None = None) -> list[str]:
        found = checks(app, worker)
        return sorted(
            " ".join(f.message.split()[:3]) for f in found if f.message.startswith("checks.")
        )

    # when, then: without a worker, nothing ends a hanging call
    assert mine() == ["checks.guarded calls through"]
    # a worker's --time-limit 120 ends it, and outlives the bulkhead's lease
    assert mine(WorkerLimits(hard=120.0)) == ["checks.guarded may run"]
    # a worker's --soft-time-limit 20 ends it within the lease
    assert mine(WorkerLimits(soft=20.0)) == []
    # a solo worker applies neither
    unapplied = checks(app, WorkerLimits(hard=120.0, applied=False))
    assert [f.message for f in unapplied if f.message.startswith("checks.")] == [
        next(f.message for f in checks(app) if f.message.startswith("checks.")).replace(
            OUTSIDE_A_WORKER, " (this worker's pool, solo or threads, applies none)"
        )
    ]
    # outside a worker, the finding names the flags it can't see
    assert OUTSIDE_A_WORKER in next(f.message for f in checks(app) if "guarded" in f.message)


#: What a finding about time limits says in a process that is no worker.
OUTSIDE_A_WORKER = (
    " of its own or in the app's settings (a worker's --time-limit or --soft-time-limit flag "
    "applies to it too, and is not seen outside that worker)"
)


def test_deduplicate_without_a_hard_time_limit_is_a_warning(server: RedisServer) -> None:
    configure(server, "noeviction", appendonly=True)
    app = make_app(server.url, task_acks_late=True, task_reject_on_worker_lost=True)
    options: dict[str, Any] = {"base": ResilientTask, "bind": True, "shared": False}

    @app.task(name="checks.unbounded", deduplicate=True, **options)
    def unbounded(self: Any) -> None: ...

    @app.task(name="checks.limited", deduplicate=True, time_limit=30, **options)
    def limited(self: Any) -> None: ...

    @app.task(name="checks.soft_only", deduplicate=True, soft_time_limit=30, **options)
    def soft_only(self: Any) -> None: ...

    def mine(worker: WorkerLimits | None = None) -> list[Finding]:
        return [f for f in checks(app, worker) if f.message.startswith("checks.")]

    assert mine() == [
        Finding(
            "warning",
            f"checks.{name} has deduplicate=True and no hard time limit of its own or in the "
            "app's settings (a worker's --time-limit or --soft-time-limit flag applies to it "
            "too, and is not seen outside that worker): its claim on a task id "
            "lasts resilience_dedup_lease (600s), so a body that runs longer may run beside a "
            "second copy, and a worker lost whole (not a pool child) holds the id that long. "
            "Set the task's time_limit option, the task_time_limit setting or the worker's "
            "--time-limit flag (the claim then lasts it plus 10s), on a pool that applies it "
            "(prefork).",
        )
        for name in ("soft_only", "unbounded")
    ]
    assert mine(WorkerLimits(hard=60.0, in_worker=True)) == []  # celery worker --time-limit 60
    [in_worker, _] = mine(WorkerLimits(in_worker=True))  # a worker without the flag
    assert "no hard time limit: its claim" in in_worker.message
    assert len(mine(WorkerLimits(hard=60.0, applied=False))) == 3  # a solo pool


# -- Redis ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "appendonly", "save", "expected"),
    [
        ("allkeys-lru", True, "", [("error", "maxmemory-policy is allkeys-lru")]),
        ("allkeys-random", True, "", [("error", "maxmemory-policy is allkeys-random")]),
        ("volatile-lru", True, "", [("warning", "maxmemory-policy is volatile-lru")]),
        ("volatile-ttl", True, "", [("warning", "maxmemory-policy is volatile-ttl")]),
        ("noeviction", True, "", []),
        ("noeviction", False, "", [("error", "keeps nothing on disk")]),
        ("noeviction", False, "3600 1", []),  # RDB snapshots: something is on disk
        (
            "allkeys-lru",
            False,
            "",
            [("error", "maxmemory-policy is allkeys-lru"), ("error", "keeps nothing on disk")],
        ),
    ],
)
def test_redis_setup(
    server: RedisServer,
    policy: str,
    appendonly: bool,
    save: str,
    expected: list[tuple[str, str]],
) -> None:
    configure(server, policy, appendonly, save)
    found = redis_findings(checks(make_app(server.url)))
    assert [f.level for f in found] == [level for level, _ in expected], found
    for finding, (_, text) in zip(found, expected, strict=True):
        assert text in finding.message
    if policy.startswith("allkeys"):
        assert "Set maxmemory-policy noeviction" in found[0].message


def test_unreachable_redis_is_an_error() -> None:
    found = checks(make_app(f"redis://127.0.0.1:{free_port()}/0"))
    errors = [f for f in found if f.level == "error"]
    assert len(errors) == 1, found
    assert errors[0].message.startswith("Redis at resilience_redis_url (redis://127.0.0.1:")


def test_in_memory_store_is_a_warning_not_an_unreachable_redis() -> None:
    app = Celery(f"checks-{uuid.uuid4().hex[:8]}", broker="memory://", set_as_current=False)
    found = run_checks(Resilience(app).runtime, resilient_tasks(app))
    found = [f for f in found if f.message not in version_messages()]
    assert [f.level for f in found] == ["warning"], found
    assert found[0].message.startswith("resilience_redis_url is memory://")


def test_redis_without_config_command_gives_no_redis_finding(server: RedisServer) -> None:
    """Managed Redis often refuses CONFIG: nothing to look at, and no crash."""
    configure(server, "allkeys-lru", appendonly=False)
    admin = server.client()
    admin.acl_setuser(
        "checker", enabled=True, passwords=["+secret"], keys=["*"], commands=["+@all", "-config"]
    )
    try:
        url = f"redis://checker:secret@127.0.0.1:{server.port}/0"
        assert redis_findings(checks(make_app(url))) == []
    finally:
        admin.acl_deluser("checker")
        admin.close()


def test_log_findings_levels(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="celery_resilience.checks")
    log_findings([Finding("error", "bad"), Finding("warning", "meh")])
    records = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert records == [
        ("ERROR", "celery-resilience check: bad"),
        ("WARNING", "celery-resilience check: meh"),
    ]


# -- the command ----------------------------------------------------------------------------------


def _check_command(env: dict[str, str], *args: str) -> subprocess.Popen[str] | Forked:
    return _cli_command(env, "check", *args)


def _cli_command(env: dict[str, str], *args: str) -> subprocess.Popen[str] | Forked:
    return cli_forks.celery(["-A", "tests.apps.cliapp", "resilience", *args], env)


def _finish(process: subprocess.Popen[str] | Forked) -> tuple[int, str, str]:
    try:
        stdout, stderr = process.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"resilience check hung:\n{stdout}\n{stderr}")
    return process.returncode, stdout, stderr


def test_check_command_exit_codes(server: RedisServer, key_prefix: str, redis_url: str) -> None:
    env = {
        "CLIAPP_PREFIX": key_prefix,
        "CLIAPP_BROKER": redis_url,
        "CLIAPP_QUEUE": f"{key_prefix}-queue",
        "CLIAPP_REDIS": server.url,
    }
    unreachable = {**env, "CLIAPP_REDIS": f"redis://127.0.0.1:{free_port()}/0"}

    # Warnings only (an evicting policy that spares keys without a TTL): exit 0.
    configure(server, "volatile-lru", appendonly=True)
    safe = {**env, "CLIAPP_ACKS_LATE": "1"}
    running = [
        _check_command(safe),
        _check_command(env),
        _check_command(env, "--json"),
        _check_command(unreachable),
    ]
    finished = list(map(_finish, running))
    (rc_ok, out_ok, err_ok), (rc, out, err), (rc_json, out_json, _), (rc_down, out_down, _) = (
        finished
    )
    assert rc_ok == 0, (out_ok, err_ok)
    lines = out_ok.splitlines()
    assert all(line.startswith("WARNING: ") for line in lines), out_ok
    assert "WARNING: Redis maxmemory-policy is volatile-lru" in out_ok
    # Work a killed worker would lose (cliapp's tasks have no acks_late): errors, exit 1.
    assert rc == 1, (out, err)
    assert "ERROR: cliapp.charge is a ResilientTask without acks_late" in out
    assert rc_json == 1
    data = json.loads(out_json)
    lost = {f["message"].split(" ")[0] for f in data if f["level"] == "error"}
    assert {"cliapp.charge", "cliapp.lookup", "cliapp.notify"} <= lost
    # Redis unreachable: an error, exit 1.
    assert rc_down == 1
    assert re.search(r"ERROR: Redis at resilience_redis_url \(redis://\S+\) unreachable", out_down)

    # An evicting Redis: an error, exit 1.
    configure(server, "allkeys-lru", appendonly=True)
    rc, out, err = _finish(_check_command(env))
    assert rc == 1, (out, err)
    assert "ERROR: Redis maxmemory-policy is allkeys-lru" in out


# -- the worker -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_worker_logs_the_findings_when_ready(
    server: RedisServer, key_prefix: str, redis_url: str, tmp_path: Path
) -> None:
    configure(server, "volatile-lru", appendonly=False)
    env = {
        "WORKERAPP_PREFIX": key_prefix,
        "WORKERAPP_QUEUE": f"{key_prefix}-queue",
        "WORKERAPP_BROKER": redis_url,
        "WORKERAPP_REDIS": server.url,
        "WORKERAPP_VISIBILITY_TIMEOUT": "3600",
        "WORKERAPP_MAX_COUNTDOWN": "7200",
    }
    expected = checks(make_worker_app(env), WorkerLimits(applied=False))  # a solo pool
    # The two this configuration is about (max_countdown, nothing on disk) are errors; the
    # eviction policy and the test app's own tasks add warnings.
    levels = [f.level for f in expected]
    assert levels.count("error") == 2, expected
    assert set(levels) == {"error", "warning"}, expected

    worker = WorkerProcess(env, tmp_path / "worker.log")
    try:
        worker.start()
    finally:
        log = worker.stop()
    logged = re.findall(r"(ERROR|WARNING)/MainProcess\] celery-resilience check: (.*)", log)
    assert sorted(logged) == sorted((f.level.upper(), f.message) for f in expected), log
    # Logged before the worker says it is ready to take tasks.
    ready = log.index(" ready.")
    assert all(log.index(message) < ready for _, message in logged)
    assert "resilience_max_countdown (7200s) is not below" in log


class _Consumer:
    def __init__(self, app: Celery) -> None:
        self.app = app


def test_checks_run_on_worker_ready_signal(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler stays connected (not weakly collected) and checks the sender's app."""
    from celery.signals import worker_ready

    configure(server, "noeviction", appendonly=False)
    app = make_app(server.url)
    consumer = _Consumer(app)  # what the worker sends: its consumer, with .app
    caplog.set_level("WARNING", logger="celery_resilience.checks")
    try:
        worker_ready.send(sender=consumer)
    finally:
        Resilience.for_app(app).runtime.close()
    logged = [r.getMessage() for r in caplog.records if r.name == "celery_resilience.checks"]
    notes = {f"celery-resilience check: {message}" for message in version_messages()}
    messages = [m for m in logged if m not in notes]
    assert len(messages) == 1, messages
    assert "keeps nothing on disk" in messages[0]


# -- bad settings, all at once ------------------------------------------------------------------

BAD_SETTINGS = {
    "resilience_drain_rate": 0,
    "resilience_max_replays": "five",
    "resilience_breakers": {
        "payments": {"window": -1, "colour": "red"},
        "search": {"open_timeout": 30.0},
    },
}


def test_check_reports_every_bad_setting_at_once_also_as_json(
    key_prefix: str, redis_url: str
) -> None:
    env = {
        "CLIAPP_PREFIX": key_prefix,
        "CLIAPP_BROKER": redis_url,
        "CLIAPP_CONF": json.dumps(BAD_SETTINGS),
    }
    human, as_json, status = (
        _check_command(env),
        _check_command(env, "--json"),
        _cli_command(env, "status"),
    )
    rc, out, err = _finish(human)
    assert rc == 1, (out, err)
    assert "Traceback" not in err
    errors = [line for line in out.splitlines() if line.startswith("ERROR: ")]
    for expected in (
        "ERROR: resilience_drain_rate must be a number of tasks per second > 0, got 0",
        "ERROR: resilience_max_replays must be an integer >= 1, got 'five'",
        "ERROR: resilience_breakers['payments']: unknown option 'colour'",
        "ERROR: resilience_breakers['payments']['window'] must be a number of seconds > 0, got -1",
    ):
        assert any(line.startswith(expected) for line in errors), (expected, out)
    # The checks went on past the settings: the tasks a killed worker would lose, Redis looked at.
    assert "ERROR: cliapp.charge is a ResilientTask without acks_late" in out

    rc_json, out_json, err_json = _finish(as_json)
    assert rc_json == 1, err_json
    data = json.loads(out_json)
    messages = [f["message"] for f in data if f["level"] == "error"]
    assert sum(m.startswith("resilience_") for m in messages) == 4, messages

    # Anything else still stops at the first bad setting, naming it, in one line.
    rc_status, out_status, err_status = _finish(status)
    assert rc_status == 1
    assert out_status == ""
    assert err_status.strip().startswith("Error: resilience_")
    assert len(err_status.strip().splitlines()) == 1, err_status


def test_start_up_still_raises_at_the_first_bad_setting_naming_it(redis_url: str) -> None:
    from celery_resilience import ConfigurationError

    app = make_app(redis_url, **BAD_SETTINGS)
    with pytest.raises(ConfigurationError, match=r"^resilience_\w+"):
        Resilience(app)


def test_without_an_app_the_cli_says_none_was_given() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_APP", "APP")}
    for args in (("check",), ("check", "--json"), ("status",), ("list",)):
        done = subprocess.run(
            [sys.executable, "-m", "celery", "resilience", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 1, done
        assert done.stdout == ""
        assert done.stderr.strip() == (
            "Error: no Celery app given: name yours with -A (celery -A proj resilience ...), "
            "or set the CELERY_APP environment variable"
        ), done.stderr
