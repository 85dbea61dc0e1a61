"""What a fleet costs one Redis: commands per second on the resilience Redis, measured.

    python benchmarks/capacity.py [--processes P] [--tasks N] [--broker-url URL]
                                  [--package-path DIR]

Starts a ``redis-server`` of its own as the resilience Redis (so that ``INFO commandstats``
counts nothing but the breakers), publishes N no-op ``ResilientTask`` messages (closed breaker,
``acks_late`` and ``task_reject_on_worker_lost``, as the README recommends) to a queue of the
run's own on the broker, and runs them with one ``celery worker -P prefork -c P``. Between the
moment a fifth of the tasks were taken and the moment four fifths were, it reads the resilience
Redis's ``INFO commandstats`` twice and prints:

* Redis commands per task (commands run inside Lua scripts counted too) and per second;
* commands per second per worker process;
* what that means for one Redis shard of ~100,000 commands/s: the number of such processes,
  and the fleet's task rate, at which it would saturate.

``--package-path`` runs the workers from another checkout of the package (its own
``benchmarks/benchapp.py`` included) to measure an earlier release the same way. The run deletes
only what it made.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.redis_server import RedisServer  # noqa: E402 - after the path is set

SHARD_OPS = 100_000  # commands per second one Redis shard takes, roughly
SKIP = {"cmdstat_info", "cmdstat_config|get", "cmdstat_config"}


def command_counts(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if k not in SKIP}


def commands(client: redis.Redis) -> int:
    return sum(command_counts(client).values())


def measure(args: argparse.Namespace, store: RedisServer, broker: redis.Redis) -> None:
    run = uuid.uuid4().hex[:10]
    queue = prefix = f"bench-capacity-{run}"
    stats = store.client()
    env = {
        "BENCH_BROKER_URL": args.broker_url,
        "BENCH_REDIS_URL": store.url,
        "BENCH_QUEUE": queue,
        "BENCH_PREFIX": prefix,
        "BENCH_STATS_KEY": f"{prefix}:stats",
        "BENCH_TOTAL": str(args.tasks),
        "BENCH_WARMUP": "0",
    }
    os.environ.update(env)
    from benchmarks import benchapp  # configured from the environment at import

    task = benchapp.app.tasks["bench.resilient"]
    with benchapp.app.producer_or_acquire() as producer:
        for i in range(args.tasks):
            task.apply_async((i,), producer=producer, queue=queue)
    home = Path(args.package_path) if args.package_path else ROOT
    with tempfile.NamedTemporaryFile(prefix="capacity-worker-", suffix=".log") as log:
        worker = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "benchmarks.benchapp", "worker",
                "-P", "prefork", "-c", str(args.processes), "-Q", queue,
                "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "warning",
            ],
            cwd=home, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            window = observe(worker, broker, queue, args.tasks, stats)
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
            for key in broker.scan_iter(match=f"*{run}*", count=1000):
                broker.delete(key)
    stats.close()
    report(args, *window)


def observe(
    worker: subprocess.Popen[bytes],
    broker: redis.Redis,
    queue: str,
    total: int,
    stats: redis.Redis,
) -> tuple[int, int, float]:
    """(tasks, commands, seconds) between a fifth and four fifths of the tasks taken."""

    def taken() -> int:
        return total - int(broker.llen(queue))

    def wait_until(count: int) -> None:
        deadline = time.monotonic() + 300
        while taken() < count:
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the worker stopped or made no progress")
            time.sleep(0.01)

    wait_until(total // 5)
    start_tasks, before, started = taken(), command_counts(stats), time.monotonic()
    wait_until(4 * total // 5)
    end_tasks, after = taken(), command_counts(stats)
    seconds = time.monotonic() - started
    # The second INFO is not one of the fleet's commands.
    delta = {name: after[name] - before.get(name, 0) for name in after}
    busiest = sorted(((n, c) for c, n in delta.items() if n), reverse=True)[:6]
    print("  commands in the window: " + ", ".join(f"{c} {n}" for n, c in busiest))
    return end_tasks - start_tasks, sum(delta.values()) - 1, seconds


def report(args: argparse.Namespace, tasks: int, count: int, seconds: float) -> None:
    per_task, per_second, rate = count / tasks, count / seconds, tasks / seconds
    per_process = per_second / args.processes
    package = args.package_path or "this checkout"
    print(
        f"{args.processes} worker processes (prefork), {tasks} tasks in {seconds:.1f}s "
        f"({rate:.0f} tasks/s); package: {package}"
    )
    print(f"  resilience Redis: {per_task:.3f} commands/task, {per_second:.0f} commands/s")
    print(
        f"  per worker process: {per_process:.1f} commands/s at {rate / args.processes:.0f} tasks/s"
    )
    if per_task > 0.05:
        fleet = SHARD_OPS / per_task
        print(f"  one ~{SHARD_OPS:,} commands/s shard saturates at ~{fleet:,.0f} tasks/s")
    else:
        processes = SHARD_OPS / per_process
        print(
            f"  one ~{SHARD_OPS:,} commands/s shard saturates at ~{processes:,.0f} such processes, "
            "whatever their task rate (the cost is per process, not per task)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--package-path", default=None)
    args = parser.parse_args()
    broker = redis.Redis.from_url(args.broker_url)
    try:
        with RedisServer() as store:
            measure(args, store, broker)
    finally:
        broker.close()


if __name__ == "__main__":
    main()
