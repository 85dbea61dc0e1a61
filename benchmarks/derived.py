"""Breakers named at call time at scale: 10,000 derived breakers of one family, 100 of them open.

Usage: ``python benchmarks/derived.py [--members N] [--open N] [--calls N]``

Runs on a private ``redis-server`` it starts on a free port (no persistence), so that ``INFO``
figures are this benchmark's alone. Prints:

- memory: ``used_memory`` per derived breaker that has state (each failed once and recovered,
  or is open), and the family's index;
- the cost of a call on a closed member, spread at random over every closed member (each is
  called about twice: no per-breaker knowledge could help), in Redis commands per call (as the
  server counts them) and microseconds per call, against a declared breaker called the same
  number of times in the same run, and against a plain function call;
- the drain's cost when a few of the open members close: one beat pass (``drain_once``) over
  the entries parked under the open members (the first looks at each), the next one, and one
  after 5 of them close.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from celery_resilience import ParkedTask, Resilience

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.redis_server import RedisServer


def commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    skip = {"cmdstat_info", "cmdstat_ping"}
    return sum(int(row["calls"]) for name, row in stats.items() if name not in skip)


def make(url: str, prefix: str) -> Resilience:
    app = Celery("bench", broker=url.replace("/0", "/1"), set_as_current=False)
    app.conf.resilience_redis_url = url
    app.conf.resilience_key_prefix = prefix
    app.conf.resilience_breakers = {
        "hook": {"failure_threshold": 2, "open_timeout": 1800.0, "idle_timeout": 3600.0},
        "dep": {"failure_threshold": 2},
    }
    return Resilience(app)


class Down(ConnectionError):
    pass


def down() -> None:
    raise Down("host down")


def fail(resilience: Resilience, name: str, key: str, times: int) -> None:
    for _ in range(times):
        with contextlib.suppress(Down):
            resilience.breaker(name, key=key).call(down)


def per_call(resilience: Resilience, server: redis.Redis, names: list[tuple[str, str | None]]):
    """(commands per call, µs per call) over ``names`` called in this order."""
    before = commands(server)
    started = time.perf_counter()
    for base, key in names:
        resilience.breaker(base, key=key).call(int)
    elapsed = time.perf_counter() - started
    resilience.runtime.flush()
    return (commands(server) - before) / len(names), elapsed / len(names) * 1e6


def park_under(resilience: Resilience, names: list[str], each: int) -> int:
    store = resilience.runtime.backout_store
    now = resilience.runtime.now()
    for name in names:
        for i in range(each):
            store.park(
                ParkedTask.new(
                    task_name="bench.send",
                    task_id=f"{name}-{i}-{uuid.uuid4().hex[:8]}",
                    reason="breaker_open",
                    breaker=name,
                    args=[i],
                    parked_at=now,
                    due_at=now,
                )
            )
    return len(names) * each


def drain_pass(resilience: Resilience, server: redis.Redis) -> tuple[float, int, Any]:
    before = commands(server)
    started = time.perf_counter()
    report = resilience.drain_once()
    return (time.perf_counter() - started) * 1e3, commands(server) - before, report


def main() -> None:  # noqa: PLR0915 - one story, told in order
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--open", type=int, default=100)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--parked", type=int, default=10, help="entries per open member")
    args = parser.parse_args()

    private = RedisServer().start()  # INFO figures of this benchmark alone
    url = private.url
    server = private.client()
    try:
        setup = make(url, "bench")
        base_memory = int(server.info("memory")["used_memory"])
        hosts = [f"h{i}.example" for i in range(args.members)]
        opened, recovered = hosts[: args.open], hosts[args.open :]
        started = time.perf_counter()
        for host in recovered:  # failed once, then answered: a closed member with state
            fail(setup, "hook", host, 1)
            setup.breaker("hook", key=host).call(int)
        for host in opened:
            fail(setup, "hook", host, 2)
        made = time.perf_counter() - started
        used = int(server.info("memory")["used_memory"]) - base_memory
        members, troubled = setup.runtime.breaker_store.family_size("hook")  # type: ignore[attr-defined]
        print(f"derived breakers with state: {members} ({troubled} troubled), made in {made:.1f}s")
        print(f"memory: {used / members:.0f} bytes per derived breaker ({used / 2**20:.1f} MiB)")

        worker = make(url, "bench")  # a fresh process's knowledge
        worker.breaker("hook", key=recovered[0]).call(int)
        worker.breaker("dep").call(int)
        spread = [("hook", random.choice(recovered)) for _ in range(args.calls)]
        declared: list[tuple[str, str | None]] = [("dep", None)] * args.calls
        cmd_d, us_d = per_call(worker, server, spread)
        cmd_p, us_p = per_call(worker, server, declared)
        started = time.perf_counter()
        for _ in range(args.calls):
            int("0")
        us_plain = (time.perf_counter() - started) / args.calls * 1e6
        print(
            f"call on a closed member, spread over {len(recovered)}: {cmd_d:.4f} commands/call, "
            f"{us_d:.1f} us/call"
        )
        print(
            f"call on a declared closed breaker:      {cmd_p:.4f} commands/call, {us_p:.1f} us/call"
        )
        print(f"plain function call:                    {us_plain:.2f} us/call")
        print(f"derived / declared: {us_d / us_p:.2f}x time per call")

        parked = park_under(worker, [f"hook:{h}" for h in opened], args.parked)
        ms, cmds, report = drain_pass(worker, server)
        print(
            f"drain pass, {args.open} open members holding {parked} entries: {ms:.1f} ms, "
            f"{cmds} commands, {report.replayed} replayed"
        )
        ms, cmds, report = drain_pass(worker, server)
        print(
            f"the next pass, nothing changed: {ms:.1f} ms, {cmds} commands "
            f"(an open host the family still lists is not looked at before its open time ends)"
        )
        for host in opened[:5]:
            worker.breaker("hook", key=host).reset()
        ms, cmds, report = drain_pass(worker, server)
        by = Counter({k: v["replayed"] for k, v in report.breakers.items() if v["replayed"]})
        print(
            f"drain pass after 5 of them closed: {ms:.1f} ms, {cmds} commands, "
            f"{report.replayed} replayed from {len(by)} breakers"
        )
        worker.runtime.close()
        setup.runtime.close()
    finally:
        private.close()


if __name__ == "__main__":
    main()
