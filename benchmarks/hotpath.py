"""Where a task's time goes: the per-task CPU of ``ResilientTask`` over a plain task, profiled.

    python benchmarks/hotpath.py [--tasks N] [--redis-url URL] [--top K] [--retry-budget R]
                                 [--tracing]

Runs N no-op deliveries of a plain task and of a ``ResilientTask`` on a closed breaker through
Celery's own tracer (``build_tracer``: what a worker runs for each message, minus the broker),
in this process, with ``acks_late`` and ``task_reject_on_worker_lost`` as the README recommends.
Prints the CPU time per task of each (``time.process_time``), the difference, the Redis commands
per task (``INFO commandstats`` of the resilience Redis), and the functions of the package (and
of redis-py, when they are called) that take the most time under cProfile. ``--retry-budget``
gives the breaker a retry budget: first attempts are counted in the window's existing buckets,
so it costs a closed breaker's success path nothing more. ``--tracing`` turns the package's spans
on (the ``opentelemetry`` extra), into an SDK ``TracerProvider`` that keeps them nowhere: what
the spans themselves cost, without an exporter's.

It uses its own key prefix and deletes what it made.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery
from celery.app.trace import build_tracer

from celery_resilience import Resilience, ResilientTask


def make_app(redis_url: str, prefix: str, retry_budget: float | None = None) -> Celery:
    app = Celery("hotpath", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        resilience_redis_url=redis_url,
        resilience_key_prefix=prefix,
        resilience_breakers={
            "bench": {} if retry_budget is None else {"retry_budget": retry_budget}
        },
    )
    return app


def deliveries(app: Celery, name: str, task: Any, count: int) -> Callable[[], None]:
    """A function that runs ``count`` first deliveries of ``task`` as a worker would."""
    trace = build_tracer(name, task, app=app, eager=False)
    requests = [
        (
            f"{name}-{i}",
            {"id": f"{name}-{i}", "delivery_info": {"exchange": "", "routing_key": "q"}},
        )
        for i in range(count)
    ]

    def run() -> None:
        for task_id, request in requests:
            trace(task_id, (1,), {}, request)

    return run


def commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info",))


class ClientCommands:
    """Commands one client of this process sends (scripts included): a shared server's own
    counts also hold every other client's."""

    def __init__(self, client: redis.Redis) -> None:
        self.count = 0
        send = client.execute_command

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return send(*args, **kwargs)

        client.execute_command = counted  # type: ignore[method-assign]


def cpu_per_task(run: Callable[[], None], count: int) -> float:
    started = time.process_time()
    run()
    return (time.process_time() - started) / count * 1e6


def traced(app: Celery) -> None:
    """The package's spans on, into a provider that keeps them nowhere."""
    from opentelemetry.sdk.trace import TracerProvider

    from celery_resilience.contrib.opentelemetry import trace

    trace(app, TracerProvider())


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--retry-budget", type=float, default=None)
    parser.add_argument("--tracing", action="store_true")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    prefix = f"bench-hot-{uuid.uuid4().hex[:8]}"
    app = make_app(args.redis_url, prefix, args.retry_budget)
    if args.tracing:
        traced(app)

    @app.task(name="hot.plain", shared=False)
    def plain(i: int) -> None:
        return None

    @app.task(name="hot.resilient", base=ResilientTask, breaker="bench", shared=False)
    def resilient(i: int) -> None:
        return None

    resilience = Resilience.for_app(app)
    stats = redis.Redis.from_url(args.redis_url)
    try:
        breaker = resilience.breaker("bench")
        for _ in range(3):  # the process learns the breaker (its change feed, where there is one)
            breaker.acquire().release()
            time.sleep(0.1)
        n = args.tasks
        runs = {
            "plain": deliveries(app, "hot.plain", plain, n),
            "resilient": deliveries(app, "hot.resilient", resilient, n),
        }
        for _ in runs:  # warm-up: imports, caches, script loads
            deliveries(app, "hot.plain", plain, 200)()
        cpu: dict[str, float] = {}
        redis_commands: dict[str, float] = {}
        own: dict[str, float] = {}
        sent = ClientCommands(breaker._store().client)  # type: ignore[attr-defined]
        for name, run in runs.items():
            before, before_own = commands(stats), sent.count
            cpu[name] = cpu_per_task(run, n)
            redis_commands[name] = (commands(stats) - before - 1) / n
            own[name] = (sent.count - before_own) / n
        budget = "" if args.retry_budget is None else f", retry_budget={args.retry_budget}"
        budget += ", tracing on" if args.tracing else ""
        print(f"{n} deliveries each, acks_late, closed breaker{budget}, Redis {args.redis_url}")
        print(f"  plain task       {cpu['plain']:8.1f} µs CPU/task")
        print(f"  ResilientTask    {cpu['resilient']:8.1f} µs CPU/task")
        print(f"  over plain       {cpu['resilient'] - cpu['plain']:+8.1f} µs CPU/task")
        print(f"  ResilientTask / plain: {cpu['resilient'] / cpu['plain']:.3f}")
        print(f"  Redis commands per task over plain: {redis_commands['resilient']:+.3f}")
        print(f"  of them sent by the breaker's client: {own['resilient']:.4f}")

        profiler = cProfile.Profile()
        profile_run = deliveries(app, "hot.resilient", resilient, n)
        profiler.enable()
        profile_run()
        profiler.disable()
        print(
            f"\nResilientTask, cProfile, the {args.top} costliest functions of ours and redis-py:"
        )
        rows = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        ours = [
            (tottime, ncalls, f"{file.rsplit('site-packages/', 1)[-1]}:{line} {func}")
            for (file, line, func), (_, ncalls, tottime, _, _) in rows.items()
            if "celery_resilience" in file or "/redis/" in file
        ]
        for tottime, ncalls, where in sorted(ours, reverse=True)[: args.top]:
            print(f"  {tottime / n * 1e6:7.2f} µs/task  {ncalls / n:6.2f} calls/task  {where}")
    finally:
        resilience.runtime.close()
        for key in stats.scan_iter(match=f"*{prefix}*", count=1000):
            stats.delete(key)
        stats.close()


if __name__ == "__main__":
    main()
