"""What a breaker's fleet-wide ``rate_limit`` costs, and how close the fleet keeps to it.

    python benchmarks/ratelimit.py [--rate 2000/s] [--threads 4] [--processes 3]
                                   [--seconds 3] [--redis-url URL]

1. One process, ``--threads`` threads calling ``Breaker.call`` (a no-op) as fast as they can
   through a breaker with ``rate_limit=--rate``, for ``--seconds`` after a half-second warm-up:
   the calls admitted and turned away, and the Redis commands per call at steady state, counted
   at the breaker's own client (scripts included; no MONITOR) and, for comparison, as the
   server's ``INFO commandstats`` delta (which also holds every other client's commands, and
   the commands the scripts run inside).
2. ``--processes`` processes (one thread each) sharing the limit: the fleet's achieved rate
   against the limit, over the time they called (Redis time), and the commands per call.

It uses its own key prefix and deletes what it made.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import threading
import time
import uuid
from typing import Any

import redis
from celery import Celery

from celery_resilience import RateLimited, Resilience
from celery_resilience.breaker import Breaker
from celery_resilience.config.values import calls_per_second

WARMUP = 0.5


def make_resilience(redis_url: str, prefix: str, rate: str) -> Resilience:
    app = Celery("ratelimit", broker=redis_url, set_as_current=False)
    app.conf.update(
        resilience_redis_url=redis_url,
        resilience_key_prefix=prefix,
        resilience_redis_timeout=5.0,
        resilience_breakers={"bench": {"rate_limit": rate}},
    )
    return Resilience(app)


class ClientCommands:
    """Commands one client of this process sends (scripts included)."""

    def __init__(self, client: redis.Redis) -> None:
        self.count = 0
        send: Any = client.execute_command

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return send(*args, **kwargs)

        client.execute_command = counted  # type: ignore[method-assign]


def server_commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def redis_seconds(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1_000_000


def hammer(breaker: Breaker, seconds: float) -> tuple[int, int]:
    """Calls through ``breaker`` for ``seconds``: (admitted, turned away)."""
    admitted = limited = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            breaker.call(lambda: None)
            admitted += 1
        except RateLimited:
            limited += 1
    return admitted, limited


def threads(args: argparse.Namespace, prefix: str, stats: redis.Redis) -> None:
    resilience = make_resilience(args.redis_url, prefix, args.rate)
    breaker = resilience.breaker("bench")
    try:
        hammer(breaker, WARMUP)  # scripts loaded, the first lease taken
        sent = ClientCommands(breaker._store().client)  # type: ignore[attr-defined]
        results: list[tuple[int, int]] = []

        def run() -> None:
            results.append(hammer(breaker, args.seconds))

        before_server, started = server_commands(stats), redis_seconds(stats)
        workers = [threading.Thread(target=run) for _ in range(args.threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed = redis_seconds(stats) - started
        server = server_commands(stats) - before_server - 2  # less this function's TIME/INFO
        admitted = sum(r[0] for r in results)
        limited = sum(r[1] for r in results)
        calls = admitted + limited
        assert breaker.rate is not None
        print(f"1 process, {args.threads} threads, rate_limit={args.rate}, {elapsed:.2f}s:")
        print(f"  calls made          {calls:9d}  ({admitted} admitted, {limited} turned away)")
        print(f"  admitted per second {admitted / elapsed:9.0f}  (batch {breaker.rate.batch})")
        print(f"  commands per call, the breaker's client: {sent.count / calls:.5f}")
        print(f"  commands per admitted call, its client:  {sent.count / admitted:.5f}")
        print(
            f"  commands per call, server-wide (every client, inside scripts too): "
            f"{server / calls:.5f}"
        )
    finally:
        resilience.runtime.close()


def fleet_member(redis_url: str, prefix: str, rate: str, barrier: Any, seconds: float) -> None:
    resilience = make_resilience(redis_url, prefix, rate)
    breaker = resilience.breaker("bench")
    client = redis.Redis.from_url(redis_url)
    hammer(breaker, 0.05)  # scripts loaded
    sent = ClientCommands(breaker._store().client)  # type: ignore[attr-defined]
    barrier.wait(60)
    first = redis_seconds(client)
    admitted, limited = hammer(breaker, seconds)
    last = redis_seconds(client)
    report = {
        "admitted": admitted,
        "limited": limited,
        "sent": sent.count,
        "first": first,
        "last": last,
    }
    client.rpush(f"{prefix}:reports", json.dumps(report))
    resilience.runtime.close()


def fleet(args: argparse.Namespace, prefix: str, stats: redis.Redis) -> None:
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(args.processes)
    members = [
        spawn.Process(
            target=fleet_member,
            args=(args.redis_url, f"{prefix}-fleet", args.rate, barrier, args.seconds),
        )
        for _ in range(args.processes)
    ]
    for member in members:
        member.start()
    for member in members:
        member.join()
    reports = [json.loads(r) for r in stats.lrange(f"{prefix}-fleet:reports", 0, -1)]
    elapsed = max(r["last"] for r in reports) - min(r["first"] for r in reports)
    admitted = sum(r["admitted"] for r in reports)
    calls = admitted + sum(r["limited"] for r in reports)
    sent = sum(r["sent"] for r in reports)
    per_second = calls_per_second(args.rate)
    print(f"{args.processes} processes sharing rate_limit={args.rate}, {elapsed:.2f}s:")
    print(
        f"  admitted per second {admitted / elapsed:9.0f}  "
        f"({admitted / elapsed / per_second:.3f} x the limit)"
    )
    print(f"  calls made          {calls:9d}  ({admitted} admitted)")
    print(f"  commands per call, the processes' clients: {sent / calls:.5f}")
    print(f"  commands per admitted call:                {sent / admitted:.5f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="2000/s")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    args = parser.parse_args()
    prefix = f"bench-rate-{uuid.uuid4().hex[:8]}"
    stats = redis.Redis.from_url(args.redis_url)
    try:
        threads(args, prefix, stats)
        fleet(args, prefix, stats)
    finally:
        for key in stats.scan_iter(match=f"*{prefix}*", count=1000):
            stats.delete(key)
        stats.close()


if __name__ == "__main__":
    main()
