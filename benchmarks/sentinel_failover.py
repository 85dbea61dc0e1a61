"""A Sentinel failover, again and again, under a prefork worker that parks: does it ever stall?

Usage: ``python benchmarks/sentinel_failover.py [--runs 20] [--tasks 40] [--rate 1.0]
[--kill-after 15] [--concurrency 2] [--limit 150] [--stall-sentinel 0] [--logs DIR]``

Each run starts a Sentinel deployment of its own (``tests/support/redis_sentinel.py``: a
primary with append-only file, its replica, one sentinel, ``down-after-milliseconds`` 5 s) and
one real ``celery worker -P prefork`` of ``tests.apps.deployapp`` with
``resilience_park_replicas = 1`` and the default ``resilience_keep_delay`` (30 s); its breaker
``dep`` is forced open, so every task parks. A thread publishes ``--tasks`` tasks at ``--rate``
per second; ``--kill-after`` seconds in, the primary is killed by its PID (no ``SENTINEL
FAILOVER``: the sentinel finds it down and fails over), and once the new primary takes writes
the old one is started again from its append-only file, for the sentinel to make it the new
primary's replica. With ``--stall-sentinel S`` the sentinel is stopped (SIGSTOP) for ``S``
seconds as soon as the new primary takes writes: its host stalled while every client asks it
where the primary went.

A run is clean when every published task ended (parked, or run: ``fail_open`` while the
breaker could not be read) and the worker logged each one ``received``, within ``--limit``
seconds of the kill. A run that is not clean is a stall: the script then dumps the stacks of
the worker's processes with ``py-spy dump`` (when ``py-spy`` is installed) into ``--logs``,
beside each run's worker log. Prints one line per run, then runs, stalls, and the longest time
from the kill until every task ended. Broker, results and the ledger live on the suite's Redis
(127.0.0.1:6379/15) under a prefix per run, deleted at the end of it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.deploy_world import World, world_env  # noqa: E402
from tests.support.redis_sentinel import MASTER_NAME, SentinelDeployment  # noqa: E402
from tests.support.worker_process import WorkerProcess, wait_until  # noqa: E402


@dataclass
class Run:
    number: int
    published: list[str] = field(default_factory=list)
    writable_after: float = 0.0
    ended_after: float | None = None  # None: not every task ended within the limit
    ended: int = 0
    received: int = 0
    failovers: int = 0

    @property
    def clean(self) -> bool:
        return self.ended_after is not None and self.received == len(self.published)

    def line(self) -> str:
        ended = "never" if self.ended_after is None else f"{self.ended_after:.1f}s"
        return (
            f"run {self.number:2d}: {'clean' if self.clean else 'STALL'}; "
            f"{self.ended}/{len(self.published)} ended, {self.received} received; "
            f"primary writable {self.writable_after:.1f}s after the kill, every task ended "
            f"{ended} after it; {self.failovers} failover(s)"
        )


def ended(world: World, task_ids: list[str]) -> set[str]:
    """Tasks parked (their park acknowledged), run, or failed for good (gave up parking)."""
    done = set(world.acked_parks(task_ids)) | world.succeeded()
    for task_id in task_ids:
        raw = world.ledger.get(world.meta_key(task_id))
        if raw and json.loads(raw).get("status") == "FAILURE":
            done.add(task_id)
    return done & set(task_ids)


def received(world: World, task_ids: list[str]) -> int:
    log = world.worker.log() if world.worker is not None else ""
    return sum(1 for t in task_ids if f"[{t}] received" in log)


def dump_stacks(world: World, path: Path) -> None:
    if world.worker is None or shutil.which("py-spy") is None:
        return
    with path.open("w") as out:
        for pid in [world.worker.pid, *world.worker.children()]:
            dumped = subprocess.run(
                ["py-spy", "dump", "--pid", str(pid)],
                check=False,
                capture_output=True,
                text=True,
                timeout=60,
            )
            out.write(f"==== pid {pid}\n{dumped.stdout}{dumped.stderr}\n")


def fail_over(deployment: SentinelDeployment, prefix: str, stall_sentinel: float) -> float:
    """Kill the primary, wait for the sentinel's new one to take writes (stalling the sentinel
    then, if asked), start the old one again: seconds from the kill until writable."""
    old = deployment.primary()
    old.kill()
    killed = time.monotonic()

    def writable() -> bool:
        try:
            if deployment.primary_port() == old.port:
                return False
            with deployment.primary().client(socket_timeout=0.5) as client:
                return bool(client.set(f"{prefix}:probe", 1))
        except Exception:  # the sentinel or the new primary not ready yet
            return False

    wait_until(writable, "a new writable primary", 60, poll=0.2)
    writable_after = time.monotonic() - killed
    if stall_sentinel > 0:
        sentinel = deployment.sentinel.process
        assert sentinel is not None
        sentinel.send_signal(signal.SIGSTOP)
        try:
            time.sleep(stall_sentinel)
        finally:
            sentinel.send_signal(signal.SIGCONT)
    old.start()
    return writable_after


def one_run(number: int, args: argparse.Namespace, logs: Path) -> Run:
    run = Run(number)
    prefix = f"bench-failover-{uuid.uuid4().hex[:8]}"
    deployment = SentinelDeployment(down_after_ms=5000, failover_timeout_ms=3000).start()
    env = world_env(
        prefix,
        deployment.url,
        DEPLOYAPP_REDIS_OPTIONS=json.dumps({"master_name": MASTER_NAME}),
        DEPLOYAPP_PARK_REPLICAS="1",
        WORKERAPP_KEEP_DELAY="30",
    )
    world = World(env, logs / f"run-{number:02d}-worker.log")
    try:
        world.worker = WorkerProcess(
            env, world.log, pool="prefork", concurrency=args.concurrency, app="tests.apps.deployapp"
        ).start()
        world.set_dependency(True)
        world.res.breaker("dep").force_open()

        def publish() -> None:
            for n in range(args.tasks):
                run.published.append(world.app.send_task("workerapp.charge", args=[f"o-{n}"]).id)
                time.sleep(1 / args.rate)

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        time.sleep(args.kill_after)
        killed = time.monotonic()
        run.writable_after = fail_over(deployment, prefix, args.stall_sentinel)
        publisher.join(args.tasks / args.rate + 60)
        while time.monotonic() - killed < args.limit:
            if len(ended(world, run.published)) == len(run.published):
                run.ended_after = time.monotonic() - killed
                break
            time.sleep(0.5)
        run.ended = len(ended(world, run.published))
        run.received = received(world, run.published)
        run.failovers = deployment.failovers()
        if not run.clean:
            dump_stacks(world, logs / f"run-{number:02d}-stacks.txt")
            (logs / f"run-{number:02d}-servers.txt").write_text(
                "\n".join(f"--- {p.port}\n{p.log()[-6000:]}" for p in deployment.processes())
            )
    finally:
        world.close()
        deployment.close()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--rate", type=float, default=1.0, help="tasks published per second")
    parser.add_argument("--kill-after", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--limit", type=float, default=150.0, help="seconds after the kill")
    parser.add_argument("--stall-sentinel", type=float, default=0.0)
    parser.add_argument("--logs", type=Path, default=None)
    args = parser.parse_args()
    logs = args.logs or Path(tempfile.mkdtemp(prefix="sentinel-failover-"))
    logs.mkdir(parents=True, exist_ok=True)
    runs = []
    for number in range(1, args.runs + 1):
        runs.append(one_run(number, args, logs))
        print(runs[-1].line(), flush=True)
    stalls = [r for r in runs if not r.clean]
    times = [r.ended_after for r in runs if r.ended_after is not None]
    longest = f"{max(times):.1f}s" if times else "-"
    print(
        f"{len(runs)} runs, {len(stalls)} stalls; every task ended at most {longest} after the "
        f"kill (limit {args.limit:.0f}s); worker logs in {logs}"
    )


if __name__ == "__main__":
    main()
