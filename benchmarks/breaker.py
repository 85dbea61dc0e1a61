"""Per-call cost of a shared breaker: celery_resilience against pybreaker's Redis storage.

Usage: ``python benchmarks/breaker.py [--calls N] [--redis-url URL]``

Both breakers keep their state in the same Redis and guard a trivial function, so what is
measured is the breaker's own overhead: latency per call (median, p99, microseconds), client
round trips per call (counted in the client), and Redis commands per call (``INFO
commandstats`` deltas, as the server sees them). Two paths each: every call succeeds (closed
breaker), and every call fails with a failure threshold too high to ever trip.

Only keys under a fresh ``bench-*`` prefix are made, and they are deleted at the end; the
database is never flushed. ``INFO commandstats`` is server-wide: other clients of the same
Redis add noise to that column (the round-trip column is exact).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery
from pybreaker import STATE_CLOSED, CircuitBreaker, CircuitRedisStorage

from celery_resilience import Resilience

NEVER_TRIPS = 10**9


class DependencyDown(ConnectionError):
    """What the failing dependency raises."""


def ok() -> None:
    return None


def down() -> None:
    raise DependencyDown("dependency down")


def swallow(call: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        with contextlib.suppress(DependencyDown):
            call()

    return run


class RoundTrips:
    """Counts the commands a client sends (one per round trip: no pipelines on these paths)."""

    def __init__(self, client: redis.Redis) -> None:
        self.count = 0
        send = client.execute_command

        def counted(*args: Any, **options: Any) -> Any:
            self.count += 1
            return send(*args, **options)

        client.execute_command = counted  # type: ignore[method-assign]


def command_calls(client: redis.Redis) -> Counter[str]:
    """``calls=`` of every ``cmdstat_*`` line of ``INFO commandstats``."""
    stats = client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): row["calls"] for name, row in stats.items()})


@dataclass
class Result:
    path: str
    name: str
    median_us: float
    p99_us: float
    round_trips: float
    commands: float
    breakdown: dict[str, float]


def measure(
    path: str,
    name: str,
    call: Callable[[], None],
    trips: RoundTrips,
    stats: redis.Redis,
    calls: int,
    warmup: int,
    after: Callable[[], None] = lambda: None,
) -> Result:
    for _ in range(warmup):
        call()
    after()
    latencies = [0] * calls
    trips.count = 0
    before = command_calls(stats)
    for i in range(calls):
        start = time.perf_counter_ns()
        call()
        latencies[i] = time.perf_counter_ns() - start
    delta = command_calls(stats) - before
    delta["info"] -= 1  # the first INFO is counted in the second one's answer
    sent = trips.count
    after()  # e.g. flush deferred successes: outside the measured loop and its counts
    latencies.sort()
    return Result(
        path=path,
        name=name,
        median_us=statistics.median(latencies) / 1000,
        p99_us=latencies[min(calls - 1, round(0.99 * (calls - 1)))] / 1000,
        round_trips=sent / calls,
        commands=delta.total() / calls,
        breakdown={cmd: n / calls for cmd, n in delta.most_common() if n > 0},
    )


def ping_median_us(client: redis.Redis, calls: int) -> float:
    latencies = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        client.ping()
        latencies.append(time.perf_counter_ns() - start)
    return statistics.median(latencies) / 1000


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    # Our breaker keys are hash-tagged: the prefix may follow an opening brace.
    keys = [k for pattern in (f"{prefix}*", f"{{{prefix}*") for k in client.scan_iter(pattern)]
    return int(client.delete(*keys)) if keys else 0


def run(redis_url: str, calls: int, warmup: int) -> list[Result]:
    prefix = f"bench-{uuid.uuid4().hex[:12]}"
    stats = redis.Redis.from_url(redis_url)
    try:
        app = Celery("bench", broker=redis_url, set_as_current=False)
        app.conf.resilience_redis_url = redis_url
        app.conf.resilience_key_prefix = prefix
        app.conf.resilience_breakers = {"bench": {"failure_threshold": NEVER_TRIPS}}
        resilience = Resilience(app)
        ours = resilience.breaker("bench")
        ours.acquire().release()  # the process learns the breaker (its watch goes live)
        time.sleep(0.2)
        ours.acquire().release()
        ours_trips = RoundTrips(resilience.runtime.breaker_store.client)  # type: ignore[attr-defined]

        peer_client = redis.Redis.from_url(redis_url)
        storage = CircuitRedisStorage(STATE_CLOSED, peer_client, namespace=f"{prefix}:pybreaker")
        peer = CircuitBreaker(fail_max=NEVER_TRIPS, reset_timeout=60, state_storage=storage)
        peer_trips = RoundTrips(peer_client)

        print(f"one Redis round trip (PING), median: {ping_median_us(stats, 1000):.1f} µs")
        common = {"stats": stats, "calls": calls, "warmup": warmup}
        return [
            measure(
                "success",
                "celery_resilience",
                lambda: ours.call(ok),
                ours_trips,
                after=ours.flush,
                **common,
            ),
            measure("success", "pybreaker", lambda: peer.call(ok), peer_trips, **common),
            measure(
                "failure",
                "celery_resilience",
                swallow(lambda: ours.call(down)),
                ours_trips,
                **common,
            ),
            measure("failure", "pybreaker", swallow(lambda: peer.call(down)), peer_trips, **common),
        ]
    finally:
        delete_prefix(stats, prefix)
        stats.close()


def report(results: list[Result]) -> None:
    header = (
        f"{'path':<8} {'breaker':<18} {'median µs':>10} {'p99 µs':>9} "
        f"{'round trips/call':>17} {'commands/call':>14}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.path:<8} {r.name:<18} {r.median_us:>10.1f} {r.p99_us:>9.1f} "
            f"{r.round_trips:>17.2f} {r.commands:>14.2f}"
        )
    print()
    print("commands/call by command (INFO commandstats, includes commands run inside Lua):")
    for r in results:
        detail = ", ".join(f"{cmd} {n:.2f}" for cmd, n in r.breakdown.items() if n >= 0.01)
        print(f"  {r.path:<8} {r.name:<18} {detail}")
    print()
    for path in ("success", "failure"):
        ours, peer = (r for r in results if r.path == path)
        print(
            f"ratio (ours / pybreaker), {path} path: "
            f"latency {ours.median_us / peer.median_us:.2f}, "
            f"commands {ours.commands / peer.commands:.2f}, "
            f"round trips {ours.round_trips / peer.round_trips:.2f}"
        )
    print()
    print(
        "note: a closed breaker that the process knows (its change feed is live) admits without\n"
        "      a round trip, and its successes are sent once a second at most; a failure is\n"
        "      recorded at once: one EVALSHA. commandstats also counts what each script runs\n"
        "      (TIME, HMGET, HSET), so one EVALSHA shows there as several commands; all of them\n"
        "      run in one atomic step."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000, help="measured calls per variant")
    parser.add_argument("--warmup", type=int, default=None, help="default: calls // 10")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    args = parser.parse_args()
    warmup = max(100, args.calls // 10) if args.warmup is None else args.warmup
    print(
        f"breaker overhead per call: {args.calls} calls per variant after {warmup} warm-up, "
        f"{args.redis_url}"
    )
    report(run(args.redis_url, args.calls, warmup))


if __name__ == "__main__":
    main()
