"""Start-up checks, as celery-redbeat does: settings and Redis setups that can lose work.

Each finding says what to change. ``error`` where work would be lost (when a worker is
killed, Redis restarts or fails over) or run twice, and ``celery resilience check`` exits 1;
``warning`` where a guarantee is weakened but nothing is lost (a task parked instead of waiting
in the broker, dedup markers that may be evicted, an in-memory store meant for tests) or where an
installed version was never promised (``versions.py`` says which); ``info`` for news that asks
for nothing (a newer minor release than the tested matrix), shown by ``check --verbose`` and
never logged at worker start. Run at worker start and by ``celery -A proj resilience check``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, cast

import redis

from .backoff import max_delay
from .backout.redis import BackoutKeys
from .config import CLAIM_LEASE_MARGIN, broker_countdown_limit
from .config.limits import hard_limit, soft_limit
from .redact import get_logger, masked_url
from .redis_io import node_client, primaries
from .runtime import Runtime
from .store_checks import settings_notes, store_notes
from .versions import version_notes

logger = get_logger("celery_resilience.checks")


@dataclass(frozen=True)
class Finding:
    level: Literal["error", "warning", "info"]
    message: str


def run_checks(runtime: Runtime, tasks: Iterable[Any] = ()) -> list[Finding]:
    """Every finding for this app and its ``tasks`` (its ``ResilientTask`` instances); Redis that
    can't be reached is a finding too."""
    tasks = list(tasks)
    findings = _settings(runtime) + _warnings(settings_notes(runtime, tasks))
    findings += _tasks(runtime, tasks)
    findings += _hang_bounds(runtime, tasks)
    findings += [Finding(note.level, note.message) for note in version_notes()]
    if runtime.config.in_memory:
        findings.append(
            Finding(
                "warning",
                "resilience_redis_url is memory://: breakers and parked tasks live in one "
                "process and are lost with it. Use Redis outside unit tests.",
            )
        )
        return findings
    findings += _unreplicated(runtime)
    try:
        findings += _redis(runtime.redis)
        findings += _replicas(runtime)
        findings += _warnings(store_notes(runtime))
    except redis.RedisError as exc:
        url = masked_url(runtime.config.redis_url)
        findings.append(
            Finding("error", f"Redis at resilience_redis_url ({url}) unreachable: {exc}")
        )
    return findings


def _warnings(notes: list[str]) -> list[Finding]:
    return [Finding("warning", note) for note in notes]


def log_findings(findings: list[Finding]) -> None:
    """Errors and warnings, each on its own line; news (``info``) is for ``check --verbose``."""
    for finding in findings:
        if finding.level == "info":
            continue
        level = logging.ERROR if finding.level == "error" else logging.WARNING
        logger.log(level, "celery-resilience check: %s", finding.message)


def _settings(runtime: Runtime) -> list[Finding]:
    limit = broker_countdown_limit(runtime.app.conf)
    max_countdown = runtime.config.max_countdown
    if max_countdown < limit:
        return []
    return [
        Finding(
            "error",
            f"resilience_max_countdown ({max_countdown:.0f}s) is not below how long the broker "
            f"holds a countdown safely ({limit:.0f}s: its visibility or consumer timeout): a "
            "retry that long is delivered twice. Lower resilience_max_countdown (or leave it "
            "unset).",
        )
    ]


def _tasks(runtime: Runtime, tasks: Iterable[Any]) -> list[Finding]:
    findings: list[Finding] = []
    conf = runtime.app.conf
    for task in sorted(tasks, key=lambda t: str(t.name)):
        name = task.name
        if not _task_option(task, conf, "acks_late"):
            findings.append(
                Finding(
                    "error",
                    f"{name} is a ResilientTask without acks_late: a worker killed mid-task "
                    "loses it. Set acks_late=True (and task_reject_on_worker_lost=True).",
                )
            )
        elif not _task_option(task, conf, "reject_on_worker_lost"):
            findings.append(
                Finding(
                    "error",
                    f"{name} has acks_late but not reject_on_worker_lost: a pool child killed "
                    "mid-task acks and fails it. Set task_reject_on_worker_lost=True (the "
                    "redelivery guard, resilience_max_deliveries, stops crash loops).",
                )
            )
        longest = max_delay(task.backoff)
        if longest is not None and longest > runtime.config.max_countdown:
            findings.append(
                Finding(
                    "warning",
                    f"{name}'s backoff waits up to {longest:.0f}s, longer than "
                    f"resilience_max_countdown ({runtime.config.max_countdown:.0f}s): such "
                    "retries are parked until due (delay_too_long) instead of waiting in the "
                    "broker. Lower the backoff's cap if they should stay in the broker.",
                )
            )
        findings += _bulkhead_lease(runtime, task)
        findings += _unbounded_claim(runtime, task)
    return findings


def _unbounded_claim(runtime: Runtime, task: Any) -> list[Finding]:
    """``deduplicate`` claims a task id for the hard time limit the worker applies, plus a
    margin; without one, for ``resilience_dedup_lease``, which nothing holds the body to."""
    if not task.deduplicate or hard_limit(task, None, runtime.worker):
        return []
    lease = runtime.config.dedup_lease
    return [
        Finding(
            "warning",
            f"{task.name} has deduplicate=True and no hard time limit"
            f"{_unapplied(runtime)}: its claim on "
            f"a task id lasts resilience_dedup_lease ({lease:.0f}s), so a body that runs "
            "longer may run beside a second copy, and a worker lost whole (not a pool child) "
            "holds the id that long. Set the task's time_limit option, the task_time_limit "
            "setting or the worker's --time-limit flag (the claim then lasts it plus "
            f"{CLAIM_LEASE_MARGIN:.0f}s), on a pool that applies it (prefork).",
        )
    ]


def _unapplied(runtime: Runtime) -> str:
    """What a finding about time limits adds: the worker's pool applies none, or this process
    is no worker and can't see a worker's flags."""
    worker = runtime.worker
    if not worker.applied:
        return " (this worker's pool, solo or threads, applies none)"
    if not worker.in_worker:
        return (
            " of its own or in the app's settings (a worker's --time-limit or --soft-time-limit "
            "flag applies to it too, and is not seen outside that worker)"
        )
    return ""


def _hang_bounds(runtime: Runtime, tasks: Iterable[Any]) -> list[Finding]:
    """A guarded task whose call can hang with nothing to end it holds a pool slot for as long
    as the dependency hangs: it needs a time limit, or a client timeout it declares."""
    findings: list[Finding] = []
    for task in sorted(tasks, key=lambda t: str(t.name)):
        timeout = getattr(task, "call_timeout", None)
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
        ):
            findings.append(
                Finding("error", f"{task.name}.call_timeout must be seconds > 0, got {timeout!r}")
            )
        if task.breaker is None or timeout is not None:
            continue
        if hard_limit(task, None, runtime.worker) or soft_limit(task, runtime.worker):
            continue
        findings.append(
            Finding(
                "warning",
                f"{task.name} calls through breaker {task.breaker!r} with neither a time limit "
                f"nor a declared client timeout{_unapplied(runtime)}: a "
                "dependency that hangs holds a pool slot until it answers, and the breaker "
                "hears nothing meanwhile. Set the task's soft_time_limit option, the "
                "task_soft_time_limit setting or the worker's --soft-time-limit flag (the task "
                "is then retried or parked and the breaker counts a failure), or give the "
                "client a timeout and declare it with call_timeout=<seconds>.",
            )
        )
    return findings


def _bulkhead_lease(runtime: Runtime, task: Any) -> list[Finding]:
    """A call that outlives its bulkhead slot's lease loses the slot to another caller: the
    limit then lets one call more through. The time limit the worker applies bounds its call."""
    if task.breaker is None:
        return []
    config = runtime.config.breaker(task.breaker)
    bounds = [hard_limit(task, None, runtime.worker), soft_limit(task, runtime.worker)]
    longest = max((b for b in bounds if b), default=0.0)
    if config.max_concurrent_calls is None or longest <= config.call_lease:
        return []
    return [
        Finding(
            "warning",
            f"{task.name} may run {longest:.0f}s (its time limit) through breaker "
            f"{task.breaker!r}, longer than the bulkhead's call_lease ({config.call_lease:.0f}s): "
            "a call still running when its lease ends gives its slot away, and more than "
            f"max_concurrent_calls ({config.max_concurrent_calls}) calls may then be in flight. "
            "Raise call_lease above the time limit.",
        )
    ]


def _task_option(task: Any, conf: Any, name: str) -> bool:
    """A task's own ``name`` option, else the app's ``task_<name>`` setting."""
    own = getattr(task, name, None)
    return bool(own if own is not None else conf.get(f"task_{name}"))


def _unreplicated(runtime: Runtime) -> list[Finding]:
    """A Sentinel or a Cluster is there for failovers: parks that don't wait for a replica can
    be lost in one, after their messages were acked."""
    config = runtime.config
    kind = config.redis_deployment.kind
    if config.park_replicas or kind == "server" or config.backout_store != "redis":
        return []
    return [
        Finding(
            "error",
            f"resilience_redis_url is a Redis {kind.capitalize()} and resilience_park_replicas "
            "is 0: replication is asynchronous, so a failover can lose parked tasks whose "
            "messages were already acked. Set resilience_park_replicas = 1 (or more).",
        )
    ]


def _replicas(runtime: Runtime) -> list[Finding]:
    """With ``resilience_park_replicas``, the primary of the parked tasks must have as many."""
    wanted = runtime.config.park_replicas
    if not wanted or runtime.config.backout_store != "redis":
        return []
    tag = BackoutKeys.for_prefix(runtime.config.key_prefix).tag
    info = node_client(runtime.redis, tag).info("replication")
    connected = int(info.get("connected_slaves", 0))
    if connected >= wanted:
        return []
    return [
        Finding(
            "error",
            f"resilience_park_replicas is {wanted} but the Redis primary of the parked tasks "
            f"has {connected} replica(s) connected: every park waits, fails and leaves its task "
            "in the broker. Add replicas or lower resilience_park_replicas.",
        )
    ]


def _redis(client: redis.Redis) -> list[Finding]:
    """The settings of every primary (each node of a cluster has its own), each finding once."""
    findings: list[Finding] = []
    for node in primaries(client):
        findings += [f for f in _node(node) if f not in findings]
    return findings


def _node(client: redis.Redis) -> list[Finding]:
    findings: list[Finding] = []
    try:
        # redis-py types the reply loosely (sync or async); this client is the sync one.
        config_get = cast(Callable[[str], dict[str, str]], client.config_get)
        config = {
            **config_get("maxmemory-policy"),
            **config_get("appendonly"),
            **config_get("save"),
        }
    except redis.ResponseError:  # CONFIG disabled (managed Redis): nothing to look at
        return findings
    policy = config.get("maxmemory-policy", "noeviction")
    if policy.startswith("allkeys"):
        findings.append(
            Finding(
                "error",
                f"Redis maxmemory-policy is {policy}: under memory pressure it evicts parked "
                "tasks and breaker state. Set maxmemory-policy noeviction.",
            )
        )
    elif policy != "noeviction":
        findings.append(
            Finding(
                "warning",
                f"Redis maxmemory-policy is {policy}: it may evict the dedup and delivery "
                "markers (keys with a TTL). Prefer maxmemory-policy noeviction.",
            )
        )
    if config.get("appendonly") != "yes" and not config.get("save"):
        findings.append(
            Finding(
                "error",
                "Redis keeps nothing on disk (appendonly no, no save points): parked tasks "
                "are lost if it restarts. Enable appendonly yes (appendfsync everysec or always).",
            )
        )
    return findings
