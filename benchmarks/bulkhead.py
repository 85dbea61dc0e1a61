"""What the bulkhead (``max_concurrent_calls``) costs per call, against the same breaker without it.

Usage: ``python benchmarks/bulkhead.py [--calls N] [--redis-url URL]``

Three breakers in one Redis, one run, guarding a trivial function: without a bulkhead (a closed
breaker the process knows: no round trip), with a bulkhead whose limit is never reached (every
call takes a slot in the admission script and frees it when it records the outcome), and with a
full bulkhead (every call is turned away by the admission script alone). Prints latency per call
(median, p99, microseconds), client round trips per call (counted in the client) and Redis
commands per call (``INFO commandstats`` deltas: server-wide, other clients add noise; they
count the commands each script runs inside its one atomic step too).

Only keys under a fresh ``bench-*`` prefix are made, and they are deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import uuid
from pathlib import Path

import redis
from celery import Celery

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.breaker import (  # noqa: E402 - needs ROOT on the path
    Result,
    RoundTrips,
    delete_prefix,
    measure,
    ok,
    ping_median_us,
)
from celery_resilience import BulkheadFull, Resilience  # noqa: E402

LIMIT = 64


def run(redis_url: str, calls: int, warmup: int) -> list[Result]:
    prefix = f"bench-{uuid.uuid4().hex[:12]}"
    stats = redis.Redis.from_url(redis_url)
    try:
        app = Celery("bench", broker=redis_url, set_as_current=False)
        app.conf.resilience_redis_url = redis_url
        app.conf.resilience_key_prefix = prefix
        app.conf.resilience_breakers = {
            "off": {},
            "on": {"max_concurrent_calls": LIMIT},
            "full": {"max_concurrent_calls": 1},
        }
        resilience = Resilience(app)
        off, on, full = (resilience.breaker(n) for n in ("off", "on", "full"))
        for breaker in (off, on, full):
            breaker.acquire().release()  # the process learns the breaker (its watch goes live)
        held = full.acquire()  # the one slot: every other call is turned away
        trips = RoundTrips(resilience.runtime.breaker_store.client)  # type: ignore[attr-defined]

        def turned_away() -> None:
            with contextlib.suppress(BulkheadFull):
                full.call(ok)

        print(f"one Redis round trip (PING), median: {ping_median_us(stats, 1000):.1f} µs")
        common = {"stats": stats, "calls": calls, "warmup": warmup, "trips": trips}
        results = [
            measure("success", "bulkhead off", lambda: off.call(ok), after=off.flush, **common),
            measure("success", f"bulkhead {LIMIT}", lambda: on.call(ok), **common),
            measure("rejected", "bulkhead full", turned_away, **common),
        ]
        held.success()
        return results
    finally:
        delete_prefix(stats, prefix)
        stats.close()


def report(results: list[Result]) -> None:
    header = (
        f"{'path':<9} {'breaker':<14} {'median µs':>10} {'p99 µs':>9} "
        f"{'round trips/call':>17} {'commands/call':>14}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.path:<9} {r.name:<14} {r.median_us:>10.1f} {r.p99_us:>9.1f} "
            f"{r.round_trips:>17.2f} {r.commands:>14.2f}"
        )
    print()
    print("commands/call by command (INFO commandstats, includes commands run inside Lua):")
    for r in results:
        detail = ", ".join(f"{cmd} {n:.2f}" for cmd, n in r.breakdown.items() if n >= 0.01)
        print(f"  {r.path:<9} {r.name:<14} {detail}")
    print()
    off, on, _ = results
    print(
        f"the bulkhead's cost per call: +{on.median_us - off.median_us:.1f} µs median, "
        f"+{on.round_trips - off.round_trips:.2f} round trips, "
        f"+{on.commands - off.commands:.2f} Redis commands"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000, help="measured calls per variant")
    parser.add_argument("--warmup", type=int, default=None, help="default: calls // 10")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    args = parser.parse_args()
    warmup = max(100, args.calls // 10) if args.warmup is None else args.warmup
    print(
        f"bulkhead overhead per call: {args.calls} calls per variant after {warmup} warm-up, "
        f"{args.redis_url}"
    )
    report(run(args.redis_url, args.calls, warmup))


if __name__ == "__main__":
    main()
