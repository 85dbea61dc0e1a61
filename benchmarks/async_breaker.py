"""What ``await breaker.acall(fn)`` costs on a closed breaker, against ``await fn()`` itself.

    python benchmarks/async_breaker.py [--calls N] [--rounds R] [--redis-url URL]

One event loop, one process. The coroutine is the cheapest there is (it returns at once), so
the difference is the breaker's own cost per call: the process's view of the breaker admits the
call and holds the success back, with no round trip (a flush of held-back successes goes out
about once a second). Both are timed in the same run, in alternating rounds, and the medians of
the rounds are printed in µs per call with their ratio, beside the Redis commands this process
sent per ``acall``. Also prints ``async with breaker.permit():``, a coroutine that gives the
event loop one turn (``asyncio.sleep(0)``, the least any real I/O does), and a concurrent burst
(``asyncio.gather`` of 100 calls at a time).

It uses its own key prefix and deletes what it made.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis
from celery import Celery

from celery_resilience import Resilience
from celery_resilience.breaker import Breaker


async def dependency(value: int) -> int:
    return value


async def yielding(value: int) -> int:
    """The least a real I/O call does: give the event loop one turn."""
    await asyncio.sleep(0)
    return value


async def plain(calls: int) -> None:
    for i in range(calls):
        await dependency(i)


async def plain_yielding(calls: int) -> None:
    for i in range(calls):
        await yielding(i)


def through(breaker: Breaker) -> Callable[[int], Awaitable[None]]:
    async def acall(calls: int) -> None:
        for i in range(calls):
            await breaker.acall(dependency, i)

    return acall


def through_yielding(breaker: Breaker) -> Callable[[int], Awaitable[None]]:
    async def acall(calls: int) -> None:
        for i in range(calls):
            await breaker.acall(yielding, i)

    return acall


def in_block(breaker: Breaker) -> Callable[[int], Awaitable[None]]:
    async def permit(calls: int) -> None:
        for i in range(calls):
            async with breaker.permit():
                await dependency(i)

    return permit


def gathered(call: Callable[[int], Awaitable[Any]]) -> Callable[[int], Awaitable[None]]:
    async def burst(calls: int) -> None:
        for start in range(0, calls, 100):
            await asyncio.gather(*(call(i) for i in range(start, min(calls, start + 100))))

    return burst


async def per_call(run: Callable[[int], Awaitable[None]], calls: int) -> float:
    started = time.perf_counter()
    await run(calls)
    return (time.perf_counter() - started) / calls * 1e6


async def measure(
    variants: dict[str, Callable[[int], Awaitable[None]]], calls: int, rounds: int
) -> dict[str, float]:
    for run in variants.values():  # warm up: imports, the watch, the breaker's view
        await run(calls // 10)
    timings: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            timings[name].append(await per_call(run, calls))
    return {name: statistics.median(values) for name, values in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    args = parser.parse_args()
    prefix = f"bench-async-{uuid.uuid4().hex[:8]}"
    app = Celery("async-bench", set_as_current=False)
    app.conf.update(
        resilience_redis_url=args.redis_url,
        resilience_key_prefix=prefix,
        resilience_breakers={"bench": {}},
    )
    resilience = Resilience(app)
    breaker = resilience.breaker("bench")
    deadline = time.monotonic() + 10
    while breaker.known_state() != "closed" or breaker._knowledge.admits("bench") is None:
        assert time.monotonic() < deadline, "the breaker's change feed never went live"
        breaker.acquire().release()
        time.sleep(0.01)

    client = breaker._store().client  # type: ignore[attr-defined]
    sent = 0
    send = client.execute_command

    def counted(*a: Any, **kw: Any) -> Any:
        nonlocal sent
        sent += 1
        return send(*a, **kw)

    client.execute_command = counted
    acall = through(breaker)
    variants = {
        "await fn()": plain,
        "await breaker.acall(fn)": acall,
        "async with breaker.permit()": in_block(breaker),
        "await io()": plain_yielding,
        "await breaker.acall(io)": through_yielding(breaker),
        "gather(fn() x100)": gathered(dependency),
        "gather(acall(fn) x100)": gathered(lambda i: breaker.acall(dependency, i)),
    }
    try:
        medians = asyncio.run(measure(variants, args.calls, args.rounds))
        acalls = args.calls * (args.rounds + 0.1) * 3  # acall(fn), acall(io), the burst's
        print(f"{args.calls} calls x {args.rounds} rounds, medians (µs per call), closed breaker")
        print("  (fn returns at once; io gives the event loop one turn, as any real I/O does)")
        for name, value in medians.items():
            ref = medians[_reference(name)]
            print(f"  {name:30s} {value:8.2f} µs   x{value / ref:6.2f}   +{value - ref:6.2f} µs")
        print(f"  Redis commands sent per acall: {sent / acalls:.5f}")
    finally:
        resilience.runtime.close()
        cleanup = redis.Redis.from_url(args.redis_url)
        keys = list(cleanup.scan_iter(match=f"*{prefix}*", count=1000))
        if keys:
            cleanup.delete(*keys)


def _reference(name: str) -> str:
    """The plain await each variant is compared with."""
    if name.startswith("gather"):
        return "gather(fn() x100)"
    return "await io()" if "io" in name else "await fn()"


if __name__ == "__main__":
    main()
