"""The Redis back-out store holding a long outage: memory per entry and the commands at 1M.

    python benchmarks/store_scale.py [--entries N] [--big N] [--rounds R]

On a private ``redis-server`` the script starts on a free port (``--save "" --appendonly no``,
killed at the end), with the app of ``tests/apps/cliapp.py`` (breakers ``payments`` and ``search``):

1. fill: N entries (default 1,000,000) through ``park.lua`` itself, 1,000 to a pipeline (70 %
   ``payments``, 29 % ``search``, 1 % without a breaker; 5 % ``retries_exhausted``, 0.1 % dead),
   each a typical entry of ~550 bytes (an order id, a few kwargs, a ten-line traceback);
2. memory: ``INFO memory`` ``used_memory`` before and after, per entry, and ``MEMORY USAGE`` of
   each key; then ``--big`` entries (default 50,000) of ~2,500 bytes under a second prefix, whose
   cost per entry gives the sizing rule's slope (bytes of Redis per byte of payload);
3. commands at N, each run in this process through click (``celery -A tests.apps.cliapp resilience
   ...``, Celery's own entry point; the app's start-up is paid once, before): ``status``,
   ``list`` (first page, page 1,000, and the first page of ``--status dead`` and of
   ``--reason retries_exhausted``), ``purge`` without ``--yes`` (it counts what it would
   delete), and the store's ``count`` of every filter; the best of R rounds and the spread;
4. drain: the store's claim + ack of one batch of 500 at N, against the same at 1,000 entries
   (the ratio says whether a pass does work that grows with the store);
5. counts by reason: reading every entry's metadata (what a store without reason counters
   does) against the counters, and the one-time backfill of a store parked into before them
   (batches timed, the longest ``PING`` meanwhile);
6. park: the cost per entry of ``park.lua`` against the one before the reason counters
   (``PARK_BEFORE``, kept here), 20,000 entries each, 1,000 to a pipeline, in alternate rounds;
7. purge: ``Backout.purge()`` of everything at N, with its batches counted and timed through the
   progress callback, and the longest a ``PING`` waited meanwhile (how long Redis was blocked).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from celery_resilience import ParkedTask, Resilience
from celery_resilience.backout import Filter, RedisBackoutStore
from celery_resilience.backout.store import Meta
from tests.support.redis_server import RedisServer

#: ``park.lua`` before the reason counters (its header left out): the park cost's baseline.
PARK_BEFORE = """
local id = ARGV[1]
if redis.call('HEXISTS', KEYS[1], id) == 1 then
  redis.call('HINCRBY', KEYS[7], 'reparked', 1)
  return 0
end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[7]) then
  return -1
end
redis.call('HSET', KEYS[1], id, ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[5], id)
redis.call('HSET', KEYS[3], id, ARGV[3])
redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
redis.call('HINCRBY', KEYS[7], ARGV[9], 1)
if ARGV[8] == 'dead' then
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[6], string.format('%d.%06d', t[1], t[2]), id)
else
  redis.call('ZADD', KEYS[5], ARGV[6], id)
end
return 1
"""

TRACEBACK = "Traceback (most recent call last):\n" + "".join(
    f'  File "/app/shop/payments.py", line {10 + i}, in charge\n    gateway.post(order)\n'
    for i in range(5)
)


def entry(n: int, big: bool = False) -> ParkedTask:
    roll = n % 1000
    breaker = "payments" if roll < 700 else "search" if roll < 990 else None
    reason = "retries_exhausted" if n % 20 == 0 else "breaker_open"
    fields: dict[str, Any] = {}
    if n % 1000 == 500:
        fields = {"status": "dead", "dead_reason": "unpublishable"}
    return ParkedTask.new(
        task_name="cliapp.charge",
        task_id=f"{n:08d}-4c6e-4b7e-9a57-3d7f0c8e{n % 10000:04d}",
        args=[f"A-{n}"] + (["x" * 2000] if big else []),
        kwargs={"amount": 1999, "currency": "EUR", "customer": n % 5000},
        options={"queue": "payments", "priority": 3},
        breaker=breaker,
        reason=reason,  # type: ignore[arg-type]
        exc_type="builtins.ConnectionError",
        exc_message="gateway refused the connection",
        traceback=TRACEBACK,
        retries=3,
        parked_at=1_700_000_000.0 + n / 300,  # a few hundred a second, as in an outage
        due_at=1_700_000_030.0 + n / 300,
        **fields,
    )


def fill(
    store: RedisBackoutStore, count: int, big: bool = False, script: Any = None, first: int = 0
) -> tuple[float, float]:
    """Park ``count`` entries (from number ``first``) with ``park.lua`` (or ``script``, given
    the same KEYS and ARGV), 1,000 a pipeline; (seconds, mean payload)."""
    park = script or store._park
    encoded = []
    for n in range(first, first + count):
        e = entry(n, big)
        encoded.append((e, store.codec.encode(e)))
    started = time.perf_counter()
    size = 0
    for start in range(0, count, 1000):
        with store.client.pipeline(transaction=False) as pipe:
            for e, data in encoded[start : start + 1000]:
                size += len(data)
                keys, argv = store.park_call(e.id, data, Meta.of(e), e.parked_at, e.due_at, 2**62)
                park(keys, argv, client=pipe)
            pipe.execute()
    return time.perf_counter() - started, size / count


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def timed(fn: Callable[[], Any], rounds: int) -> tuple[float, float, Any]:
    """(best seconds, slowest / best, last result) of ``rounds`` calls."""
    times, result = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), max(times) / min(times), result


def cli(*args: str) -> Callable[[], str]:
    from celery.bin.celery import celery

    def run() -> str:
        result = CliRunner().invoke(celery, ["-A", "tests.apps.cliapp", "resilience", *args])
        if result.exit_code not in (0, 1):
            raise RuntimeError(f"{args}: {result.output}")
        return result.output

    return run


class Pinger(threading.Thread):
    """PINGs Redis every 5 ms and keeps the longest wait: how long a script blocked it."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.longest = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            self.client.ping()
            self.longest = max(self.longest, time.perf_counter() - started)
            time.sleep(0.005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--big", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    server = RedisServer().start()  # no persistence: what is measured is the store alone
    url = server.url
    prefix = f"scale{os.getpid()}"
    os.environ.update(CLIAPP_PREFIX=prefix, CLIAPP_BROKER=url)
    try:
        run(url, prefix, opts)
    finally:
        server.close()


def run(url: str, prefix: str, opts: argparse.Namespace) -> None:
    from tests.apps import cliapp

    app = cliapp.make_app(os.environ)
    res = Resilience(app)
    client = redis.Redis.from_url(url)
    store = res.runtime.backout_store
    assert isinstance(store, RedisBackoutStore)
    n = opts.entries

    # -- drain baseline at 1,000 entries, before the fill ------------------------------------
    small = RedisBackoutStore(client, prefix + "small", max_entries=2**62)
    fill(small, 1000 * opts.rounds)  # payments: 700 of each 1,000, a batch a round
    claim_small = claim_ack(small, 1000, opts.rounds)
    small.purge()

    before = used(client)
    seconds, payload = fill(store, n)
    after = used(client)
    per_entry = (after - before) / n
    print(f"fill: {n:,} entries in {seconds:.1f}s ({n / seconds:,.0f}/s), payload {payload:.0f} B")
    print(f"memory: {per_entry:,.0f} B per entry (used_memory {after / 2**20:,.0f} MiB)")
    for key in sorted(client.scan_iter(f"{{{prefix}:backout}}:*")):
        size = client.memory_usage(key) or 0
        print(f"  {key.decode():40} {size / n:8.1f} B per entry")

    big = RedisBackoutStore(client, prefix + "big", max_entries=2**62)
    start = used(client)
    _, big_payload = fill(big, opts.big, big=True)
    big_entry = (used(client) - start) / opts.big
    slope = (big_entry - per_entry) / (big_payload - payload)
    overhead = per_entry - slope * payload
    print(
        f"memory, {opts.big:,} entries of {big_payload:.0f} B: {big_entry:,.0f} B per entry; "
        f"rule: {overhead:.0f} B + {slope:.2f} x payload"
    )
    big.purge()

    print(f"\ncommands at {n:,} entries (best of {opts.rounds}, spread slowest/best):")
    cli("status", "--json")()  # the app's start-up, paid once
    figures = [
        ("status", cli("status")),
        ("list (first page)", cli("list")),
        ("list --page 1000", cli("list", "--page", "1000")),
        ("list --status dead", cli("list", "--status", "dead")),
        (
            "list --breaker search --status dead",
            cli("list", "--breaker", "search", "--status", "dead"),
        ),
        (
            "list --breaker payments --page 100",
            cli("list", "--breaker", "payments", "--page", "100"),
        ),
        ("list --reason retries_exhausted", cli("list", "--reason", "retries_exhausted")),
        ("purge --breaker search (no --yes)", cli("purge", "--breaker", "search")),
        ("count()", store.count),
        ("count(breaker, status)", lambda: res.backout.count("search", "dead")),
        ("count(reason)", lambda: store.count(Filter(reason="retries_exhausted"))),
        (
            "count(reason, status)",
            lambda: store.count(Filter(status="parked", reason="retries_exhausted")),
        ),
        (
            "count(breaker, status, reason)",
            lambda: store.count(Filter("search", "dead", "retries_exhausted")),
        ),
        (
            "count(reason), every meta read",
            lambda: store.reasons.scan_count(Filter(reason="retries_exhausted")),
        ),
    ]
    for label, fn in figures:
        best, spread, _ = timed(fn, opts.rounds)
        print(f"  {label:40} {best * 1000:9.1f} ms  x{spread:.2f}")
    claim_big = claim_ack(store, n, opts.rounds)
    print(
        f"  {'claim + ack of 500':40} {claim_big * 1000:9.1f} ms  "
        f"(at {1000 * opts.rounds:,} entries {claim_small * 1000:.1f} ms: "
        f"x{claim_big / claim_small:.2f})"
    )
    backfill(store, url)
    park_cost(client, prefix, opts.rounds)
    purge(res, url, n - 500 * opts.rounds)


def backfill(store: RedisBackoutStore, url: str) -> None:
    """The one-time backfill of a store of N entries parked into before the reason counters."""
    where = Filter(reason="retries_exhausted")
    expected = store.reasons.scan_count(where)
    store.client.delete(store.keys.reasons)  # as a release without them left the store
    batches: list[float] = []
    last = time.perf_counter()

    def progress(steps: int) -> None:
        nonlocal last
        now = time.perf_counter()
        batches.append(now - last)
        last = now

    pinger = Pinger(url)
    pinger.start()
    started = time.perf_counter()
    counted = store.backfill_reason_counts(progress=progress)
    seconds = time.perf_counter() - started
    pinger.stop.set()
    pinger.join()
    print(f"backfill of the reason counters: {counted:,} entries in {seconds:.1f}s")
    print(
        f"  {len(batches)} batches, median {statistics.median(batches) * 1000:.1f} ms, "
        f"longest {max(batches) * 1000:.1f} ms; longest PING meanwhile "
        f"{pinger.longest * 1000:.1f} ms"
    )
    assert store.count(where) == expected, "the counters disagree with the metadata"


def park_cost(client: redis.Redis, prefix: str, rounds: int) -> None:
    """``park.lua`` against ``PARK_BEFORE``, each into an empty store, in alternate rounds: the
    time per entry in this process, and in Redis (``INFO commandstats`` of ``EVALSHA``, reset
    before each round: this private server runs nothing else)."""
    before = client.register_script(PARK_BEFORE)
    wall: dict[str, list[float]] = {"before": [], "now": []}
    redis_us: dict[str, list[float]] = {"before": [], "now": []}
    count = 20_000
    for r in range(2 * rounds):
        order = [("before", before), ("now", None)]
        for label, script in order if r % 2 == 0 else order[::-1]:
            store = RedisBackoutStore(client, f"{prefix}park{label}{r}", max_entries=2**62)
            client.config_resetstat()
            seconds, _ = fill(store, count, script=script, first=2_000_000)
            stats = client.info("commandstats")["cmdstat_evalsha"]
            wall[label].append(seconds / count * 1e6)
            redis_us[label].append(float(stats["usec_per_call"]))
            store.purge()
    print(f"park, {count:,} entries a round, {2 * rounds} rounds (median; best):")
    for label in ("before", "now"):
        print(
            f"  {label:7} {statistics.median(wall[label]):6.1f} us per entry "
            f"({min(wall[label]):.1f}); in Redis {statistics.median(redis_us[label]):5.2f} us "
            f"({min(redis_us[label]):.2f})"
        )
    ratio = statistics.median(redis_us["now"]) / statistics.median(redis_us["before"])
    print(f"  in Redis now / before: x{ratio:.2f}")


def claim_ack(store: RedisBackoutStore, count: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        claimed = store.claim("payments", 500, 60.0, now=2e9)
        store.ack("payments", [e.id for e in claimed])
        times.append(time.perf_counter() - started)
        assert claimed, "nothing due"
    return min(times)


def purge(res: Resilience, url: str, count: int) -> None:
    batches: list[float] = []
    last = time.perf_counter()

    def progress(steps: int) -> None:
        nonlocal last
        now = time.perf_counter()
        batches.append(now - last)
        last = now

    pinger = Pinger(url)
    pinger.start()
    started = time.perf_counter()
    try:
        removed = res.backout.purge(progress=progress)  # type: ignore[call-arg]
    except TypeError:  # a store without progress: one figure only
        removed = res.backout.purge()
    seconds = time.perf_counter() - started
    pinger.stop.set()
    pinger.join()
    print(f"purge: {removed:,} entries in {seconds:.1f}s ({removed / seconds:,.0f}/s)")
    if batches:
        print(
            f"  {len(batches)} batches, median {statistics.median(batches) * 1000:.1f} ms, "
            f"longest {max(batches) * 1000:.1f} ms"
        )
    print(f"  longest PING meanwhile: {pinger.longest * 1000:.1f} ms")
    print(f"  left: {res.backout.count()} entries")
    assert removed == count, (removed, count)  # less what the drain figure acked


if __name__ == "__main__":
    main()
