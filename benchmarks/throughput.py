"""Throughput of a no-op task: plain Celery, ``ResilientTask``, and a pybreaker peer.

    python benchmarks/throughput.py [--tasks N] [--warmup W] [--rounds R]
                                    [--broker-url URL] [--redis-url URL]

For each pool (solo, then prefork -c 2) and each variant (plain ``@app.task``; ``ResilientTask``
with a closed breaker; a plain task calling through ``pybreaker.CircuitBreaker`` with
``CircuitRedisStorage``), all on the same broker in this one run:

1. publish W + N numbered messages to the run's own queue while no worker runs (timed apart);
2. start a real ``celery -A benchmarks.benchapp worker`` subprocess on that queue;
3. wait until the worker processes report all W + N tasks done (see ``benchapp``: counters in
   memory, written with one HSET every 500 tasks per process and on each of the last 64);
4. throughput = N / (end of the last timed task - start of the first timed task), where the
   first W messages are the warm-up; ``INFO commandstats`` and ``INFO cpu`` of the resilience
   Redis are read before the worker starts and after the last task, for Redis commands and
   Redis CPU per task; the worker processes also report their CPU time and the requests they
   wrote to Redis (client round trips), which other load on the machine disturbs far less.

All six cells run R times (default 2, every other round in reverse variant order); the table
shows the best throughput of the rounds and, for the costs, the lowest.

The run uses its own queue and key prefix and deletes only the keys that carry its run id.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
POOLS = ("solo", "prefork")
VARIANTS = {
    "plain": "bench.plain",
    "resilient": "bench.resilient",
    "pybreaker": "bench.pybreaker",
}
LABELS = {
    "plain": "(a) plain @app.task",
    "resilient": "(b) ResilientTask",
    "pybreaker": "(c) pybreaker+Redis",
}
POLL_INTERVAL = 0.02
STALL_TIMEOUT = 30.0  # seconds without progress before a worker is judged stuck
START_TIMEOUT = 60.0


#: One worker process's report: tasks run, timed tasks run, start of its first timed task, end
#: of its last one, requests it wrote to Redis, CPU seconds it used since its first timed task.
Record = tuple[int, int, float, float, int, float]


@dataclass
class Cell:
    variant: str
    pool: str
    total: int
    publish_seconds: float = 0.0
    window: float = 0.0
    timed: int = 0
    processes: int = 0
    commands: Counter[str] = field(default_factory=Counter)
    round_trips: int = 0
    cpu: float = 0.0  # CPU seconds of the task-running processes over the timed tasks
    redis_cpu: float = 0.0  # CPU seconds of the resilience Redis over the worker's run
    breaker_check: str = ""
    note: str = ""

    @property
    def rate(self) -> float:
        return self.timed / self.window if self.window > 0 else 0.0

    def per_task(self) -> dict[str, float]:
        return {name: calls / self.total for name, calls in self.commands.items()}


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.n = args.tasks
        self.warmup = args.warmup
        self.total = self.n + self.warmup
        self.broker_url = args.broker_url
        self.redis_url = args.redis_url or args.broker_url
        self.run_id = uuid.uuid4().hex[:12]
        self.queue = f"bench-throughput-{self.run_id}"
        self.prefix = f"bench-{self.run_id}"
        self.broker = redis.Redis.from_url(self.broker_url)
        self.store = redis.Redis.from_url(self.redis_url)
        self.same_server = (
            self.broker.info("server")["run_id"] == self.store.info("server")["run_id"]
        )
        self.base_env = {
            **os.environ,
            "BENCH_BROKER_URL": self.broker_url,
            "BENCH_REDIS_URL": self.redis_url,
            "BENCH_QUEUE": self.queue,
            "BENCH_PREFIX": self.prefix,
            "BENCH_WARMUP": str(self.warmup),
            "BENCH_TOTAL": str(self.total),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        os.environ.update({k: v for k, v in self.base_env.items() if k.startswith("BENCH_")})
        sys.path.insert(0, str(ROOT))
        self.benchapp = importlib.import_module("benchmarks.benchapp")
        self.own = Counter[str]()  # commands this script sends to the measured Redis
        self.resilient_done = 0  # tasks of variant (b) run so far, for the breaker's calls_total

    # -- one cell ---------------------------------------------------------------------------
    def run(self, variant: str, pool: str, round_: int) -> Cell:
        cell = Cell(variant, pool, self.total)
        stats_key = f"{self.prefix}:stats:{variant}:{pool}:{round_}"
        cell.publish_seconds = self.publish(VARIANTS[variant])
        queued = self.broker.llen(self.queue)
        if queued != self.total:
            raise RuntimeError(f"{queued} messages in {self.queue} after publishing {self.total}")

        name = f"{self.prefix}-{variant}-{pool}-{round_}@%h"
        command = [sys.executable, "-m", "celery", "-A", "benchmarks.benchapp", "worker"]
        command += ["-P", pool]
        command += ["-c", "2", "-Q", self.queue, "-n", name, "-l", "warning"]
        command += ["--without-heartbeat", "--without-gossip", "--without-mingle"]
        before, before_cpu = self.commandstats(), self.redis_cpu()
        own_before = self.own.copy()
        with tempfile.NamedTemporaryFile(prefix=f"bench-{variant}-{pool}-", suffix=".log") as log:
            worker = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**self.base_env, "BENCH_STATS_KEY": stats_key},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                records = self.wait(worker, stats_key, log.name)
                after, after_cpu = self.commandstats(), self.redis_cpu()
            finally:
                self.stop(worker)
        if sum(r[0] for r in records) < self.total:  # a process was not among the last writers
            records = self.read_records(stats_key)

        done = sum(r[0] for r in records)
        if done != self.total:
            cell.note = f"worker reported {done} tasks, expected {self.total}"
        timed = [r for r in records if r[1]]
        cell.timed = sum(r[1] for r in timed)
        cell.processes = len(records)
        cell.round_trips = sum(r[4] for r in records)
        cell.cpu = sum(r[5] for r in records)
        cell.redis_cpu = after_cpu - before_cpu
        cell.window = max(r[3] for r in timed) - min(r[2] for r in timed)
        own = self.own - own_before
        cell.commands = Counter(
            {k: v - before.get(k, 0) - own.get(k, 0) for k, v in after.items() if k != "info"}
        )
        if variant == "resilient":
            self.resilient_done += done
            resilience = importlib.import_module("celery_resilience").Resilience
            snap = resilience.for_app(self.benchapp.app).breaker("bench").snapshot()
            cell.breaker_check = (
                f"{pool} round {round_ + 1}: {snap['state']}, calls_total {snap['calls_total']}"
                f" of {self.resilient_done} run"
            )
        return cell

    def publish(self, task_name: str) -> float:
        task = self.benchapp.app.tasks[task_name]
        started = time.perf_counter()
        with self.benchapp.app.producer_or_acquire() as producer:
            for i in range(self.total):
                task.apply_async((i,), producer=producer)
        return time.perf_counter() - started

    def commandstats(self) -> dict[str, int]:
        stats = self.store.info("commandstats")
        return {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}

    def redis_cpu(self) -> float:
        cpu = self.store.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    def read_records(self, stats_key: str) -> list[Record]:
        raw: dict[bytes, bytes] = self.broker.hgetall(stats_key)  # type: ignore[assignment]
        if self.same_server:
            self.own["hgetall"] += 1
        records = []
        for value in raw.values():
            count, timed, first, last, trips, cpu = value.split()
            records.append(
                (int(count), int(timed), float(first), float(last), int(trips), float(cpu))
            )
        return records

    def wait(self, worker: subprocess.Popen[bytes], stats_key: str, log: str) -> list[Record]:
        """Poll the records (one HGETALL each 20 ms) until all tasks are reported done."""
        progress, changed = -1, time.monotonic()
        timeout = START_TIMEOUT
        while True:
            records = self.read_records(stats_key)
            done = sum(r[0] for r in records)
            if done >= self.total:
                return records
            if worker.poll() is not None:
                raise RuntimeError(f"worker exited ({worker.returncode}); log:\n{_tail(log)}")
            if done != progress:
                progress, changed = done, time.monotonic()
                if done:
                    timeout = STALL_TIMEOUT
            elif time.monotonic() - changed > timeout:
                if self.same_server:
                    self.own["llen"] += 1
                if done and self.broker.llen(self.queue) == 0:
                    return records  # the rest is reported at shutdown
                raise RuntimeError(f"no progress for {timeout:.0f}s; log:\n{_tail(log)}")
            time.sleep(POLL_INTERVAL)

    def stop(self, worker: subprocess.Popen[bytes]) -> None:
        """Warm shutdown (SIGTERM): children flush and report; SIGKILL to its group if stuck."""
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)  # the worker's own session (its children)
                worker.wait()

    # -- cleanup: only keys carrying this run's id --------------------------------------------
    def cleanup(self) -> int:
        deleted = 0
        clients = [self.broker] if self.broker_url == self.redis_url else [self.broker, self.store]
        for client in clients:
            keys = list(client.scan_iter(match=f"*{self.run_id}*", count=1000))
            for start in range(0, len(keys), 500):
                deleted += int(client.delete(*keys[start : start + 500]))  # type: ignore[arg-type]
        return deleted


def _tail(path: str, lines: int = 30) -> str:
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


def _breakdown(per_task: dict[str, float], shown: float = 0.05) -> str:
    """The commands of at least ``shown`` per task; the rest (mostly other clients) summed up."""
    items = sorted(per_task.items(), key=lambda kv: (-abs(kv[1]), kv[0]))
    parts = [f"{name} {value:+.2f}" for name, value in items if abs(value) >= shown]
    rest = sum(value for _, value in items if abs(value) < shown)
    return ", ".join([*parts, f"others {rest:+.2f}"])


def _lowest(cells: list[Cell]) -> dict[str, float]:
    """Per command, the lowest per-task count of the rounds: other clients only ever add."""
    names = set().union(*(c.commands for c in cells))
    return {name: min(c.per_task().get(name, 0.0) for c in cells) for name in names}


def _round_ratio(cells: dict[tuple[str, str], list[Cell]], pool: str, variant: str) -> float:
    pairs = zip(cells[(variant, pool)], cells[("plain", pool)], strict=True)
    return statistics.median(c.rate / p.rate for c, p in pairs if p.rate)


def report(bench: Bench, cells: dict[tuple[str, str], list[Cell]]) -> None:
    rounds = len(cells[("plain", POOLS[0])])
    print()
    print(
        f"{'pool':<9}{'variant':<22}{'tasks/s':>8}{'vs plain':>9}{'wkr CPU':>9}{'+plain':>8}"
        f"{'Redis CPU':>10}{'+plain':>8}   tasks/s of each round"
    )
    for pool in POOLS:
        plain = cells[("plain", pool)]
        best_plain = max(c.rate for c in plain)
        cpu_plain = min(c.cpu / max(c.timed, 1) for c in plain) * 1e6
        redis_plain = min(c.redis_cpu / c.total for c in plain) * 1e6
        for variant in VARIANTS:
            runs = cells[(variant, pool)]
            best = max(c.rate for c in runs)
            ratio = best / best_plain if best_plain else 0.0
            cpu = min(c.cpu / max(c.timed, 1) for c in runs) * 1e6
            redis_cpu = min(c.redis_cpu / c.total for c in runs) * 1e6
            each = " ".join(f"{c.rate:.0f}" for c in runs)
            notes = "; ".join(c.note for c in runs if c.note)
            print(
                f"{pool:<9}{LABELS[variant]:<22}{best:>8.0f}{ratio:>9.2f}{cpu:>9.0f}"
                f"{cpu - cpu_plain:>+8.0f}{redis_cpu:>10.0f}{redis_cpu - redis_plain:>+8.0f}"
                f"   {each}" + (f"  !! {notes}" if notes else "")
            )
    print(
        "vs plain, median of each round's own ratio (a round runs the variants of a pool back to "
        "back, so a machine that slows down shifts them alike): "
        + "; ".join(
            f"{pool} "
            + ", ".join(
                f"{variant} {_round_ratio(cells, pool, variant):.2f}"
                for variant in VARIANTS
                if variant != "plain"
            )
            for pool in POOLS
        )
    )
    print(
        f"tasks/s: best of {rounds} rounds; vs plain: ratio of the bests in the same pool. "
        "wkr CPU: CPU µs per timed task of the task-running processes (solo: the whole worker, "
        "broker consumer included; prefork: the two children, not the parent). Redis CPU: "
        "used_cpu_user+sys of the resilience Redis per task over the worker's run (server-wide: "
        "other clients add to it). CPU columns: lowest of the rounds."
    )
    print()
    where = "same Redis as the broker" if bench.same_server else "a Redis apart from the broker"
    print(
        f"Redis commands per task on the resilience Redis ({where}): INFO commandstats delta "
        "over each worker's run (warm-up included, this script's own commands excluded, "
        "commands run inside Lua counted too), per command the lowest of the rounds:"
    )
    for pool in POOLS:
        base = _lowest(cells[("plain", pool)])
        print(f"  {pool:<8}(a) plain, absolute    {sum(base.values()):6.2f}  ({_breakdown(base)})")
        for variant in ("resilient", "pybreaker"):
            own = _lowest(cells[(variant, pool)])
            extra = {k: own.get(k, 0.0) - base.get(k, 0.0) for k in set(own) | set(base)}
            label = f"{LABELS[variant][:3]} {variant} - plain"
            print(f"  {pool:<8}{label:<22}{sum(extra.values()):+7.2f}  ({_breakdown(extra)})")
    print(
        "  network round trips per task: (b) EVALSHA only (the commands listed beside it run "
        "inside its Lua); (c) each command listed is a round trip of its own"
    )
    print(
        "Client round trips per task (requests written to Redis, a pipeline counting one), "
        "counted inside the task-running processes, immune to other clients; solo: the whole "
        "worker, broker included; prefork: the two children, not the parent that talks to the "
        "broker; lowest of the rounds:"
    )
    for pool in POOLS:
        trips = {v: min(c.round_trips / c.total for c in cells[(v, pool)]) for v in VARIANTS}
        line = "   ".join(
            f"{LABELS[v][:3]} {v} {trips[v]:.2f}"
            + ("" if v == "plain" else f" ({trips[v] - trips['plain']:+.2f})")
            for v in VARIANTS
        )
        print(f"  {pool:<8}{line}")
    checks = [c for pool in POOLS for c in cells[("resilient", pool)]]
    print(
        "breaker 'bench' after each (b) worker stopped (deferred successes flushed at shutdown; "
        "cumulative): " + "; ".join(c.breaker_check for c in checks)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000, help="timed tasks per cell")
    parser.add_argument("--warmup", type=int, default=300, help="untimed tasks run first")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of all six cells")
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--redis-url", default=None, help="resilience Redis (default: broker)")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("--tasks and --rounds must be >= 1, --warmup >= 0")

    bench = Bench(args)
    print(
        f"celery_resilience throughput: {bench.n} timed no-op tasks (+{bench.warmup} warm-up) "
        f"per cell, {args.rounds} rounds; broker {bench.broker_url}, queue {bench.queue}; "
        f"resilience Redis {bench.redis_url}, key prefix {bench.prefix}; {os.cpu_count()} CPUs"
    )
    print(
        "timing: task_prerun/task_postrun handlers (same for every variant) count in memory in "
        "each worker process and write one HSET per process every 500 tasks and on each of the "
        "last 64 messages; window = start of the first timed task -> end of the last one (wall "
        "clock); task_ignore_result, no result backend; workers: celery worker -P solo|prefork "
        "-c 2 --without-heartbeat --without-gossip --without-mingle"
    )
    cells: dict[tuple[str, str], list[Cell]] = {key: [] for key in product(VARIANTS, POOLS)}
    started = time.monotonic()
    try:
        for round_ in range(args.rounds):
            # Every other round runs the variants in reverse order, against drift in the load.
            order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
            for pool in POOLS:
                for variant in order:
                    load = os.getloadavg()[0]
                    cell = bench.run(variant, pool, round_)
                    cells[(variant, pool)].append(cell)
                    print(
                        f"  round {round_ + 1} {pool:<8}{variant:<10} published {bench.total} in "
                        f"{cell.publish_seconds:.2f}s ({bench.total / cell.publish_seconds:.0f}/s,"
                        f" apply_async loop, one producer); ran {cell.timed} timed tasks in "
                        f"{cell.window:.2f}s on {cell.processes} process(es): "
                        f"{cell.rate:.0f} tasks/s; load avg before {load:.1f}",
                        flush=True,
                    )
    finally:
        deleted = bench.cleanup()
    report(bench, cells)
    print(f"total {time.monotonic() - started:.0f}s; deleted {deleted} keys of run {bench.run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
