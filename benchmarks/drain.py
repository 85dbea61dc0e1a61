"""Drain throughput against the raw ``send_task`` publish rate, with and without events.

    python benchmarks/drain.py [--entries N] [--rounds R] [--broker-url URL]

All in one run, on one Redis broker (default ``redis://127.0.0.1:6379/13``, which is also the
back-out store's Redis), with a queue and key prefix of this run's own (the broker keeps its
keys under ``<prefix>:broker:`` through kombu's ``global_keyprefix``):

1. raw: ``app.send_task(name, args=[i], task_id=..., queue=q, producer=p)`` for N messages in
   one loop with one producer (``with app.producer_or_acquire() as p``): the machine's ceiling;
2. drain, events on: N entries parked in the back-out store, then one timed
   ``Resilience(app).drain()`` (``resilience_drain_rate`` far above anything reachable,
   ``resilience_drain_batch`` 500): claim, publish with the original task id (each batch
   through kombu's ``Producer.batch``: one Redis pipeline for the batch's messages), a
   ``task-replayed`` event per entry, ack;
3. drain, events off: the same with ``celery_resilience.drain.batch.replay_dispatcher``
   replaced by a no-op, so 2 - 3 is what the events cost;
4. drain, publish off: the same with ``celery_resilience.drain.sending.publish`` a no-op as
   well: what the claim, the checks of each entry and the ack cost;
5. store claim + ack alone: ``claim`` a batch and ``ack`` it, in a loop, without a drain;
6. drain, signed + encrypted: phase 2 with ``resilience_signing_key`` and
   ``resilience_encryption_key`` set (its own key prefix, same queue): every entry verified
   (HMAC-SHA256) and its arguments decrypted (AES-256-GCM) before it is published.

Parking is timed too (the N ``store.park`` calls before phases 2 and 6: one round trip each),
and the codec alone (encode and decode of one entry, no Redis) with no keys, signing only,
encryption only and both: what the keys cost per park and per drained entry.

Each drain phase checks that the store ended empty and the queue holds N new messages. No worker
consumes the queue; it is emptied between phases. A short untimed warm-up comes first; then the
five phases run back to back R times (default 6), in a rotating order so that a machine that
slows down or speeds up shifts every phase alike. The table shows each phase's best round
(least time: other load only ever adds time) and the spread (slowest / best); the line under it
is the median, over the rounds, of each round's own drain / raw ratio. Beside wall time it shows
this process's CPU time per task (``time.process_time``), which other load disturbs less. Only
keys under this run's prefix are deleted at the end; nothing is flushed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from celery import Celery

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import celery_resilience.drain.batch as drain_module
import celery_resilience.drain.sending as sending_module
from celery_resilience import ParkedTask, Resilience
from celery_resilience.backout import Codec
from celery_resilience.events import ReplayEvents

#: Keys of the signed + encrypted phase (fixed: the benchmark stores no secret).
SIGNING_KEY = "bench-signing-key-0123456789abcdef"
ENCRYPTION_KEY = "0" * 43 + "="

TASK = "bench.drain_target"
BATCH = 500
WARMUP = 200


@dataclass
class Row:
    label: str
    tasks: int
    seconds: float
    cpu: float  # CPU seconds of this process
    spread: float = 1.0  # slowest round / best round

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds if self.seconds > 0 else float("inf")


def best(rounds: list[Row]) -> Row:
    fastest = min(rounds, key=lambda r: r.seconds)
    slowest = max(r.seconds for r in rounds)
    cpu = min(r.cpu for r in rounds)
    return Row(fastest.label, fastest.tasks, fastest.seconds, cpu, slowest / fastest.seconds)


def make_app(
    broker_url: str, prefix: str, queue: str, keys: bool = False, store_prefix: str = ""
) -> Celery:
    app = Celery(f"bench-drain-{prefix}", set_as_current=False)
    app.conf.update(
        broker_url=broker_url,
        broker_transport_options={"global_keyprefix": f"{prefix}:broker:"},
        broker_connection_retry_on_startup=True,
        task_default_queue=queue,
        task_ignore_result=True,
        result_backend=None,
        worker_enable_remote_control=False,
        resilience_redis_url=broker_url,
        resilience_key_prefix=store_prefix or prefix,
        resilience_breakers={"bench": {}},
        resilience_drain_rate=1e9,  # never the limit
        resilience_drain_batch=BATCH,
        resilience_max_replays=1_000,
    )
    if keys:
        app.conf.resilience_signing_key = SIGNING_KEY
        app.conf.resilience_encryption_key = ENCRYPTION_KEY

    @app.task(name=TASK, shared=False)
    def target(i: int) -> None:
        return None

    return app


@contextlib.contextmanager
def _no_events(app: Any, hostname: str | None = None) -> Iterator[ReplayEvents]:
    yield ReplayEvents(None)


def _no_publish(resilience: Any, entry: Any, producer: Any = None) -> None:
    return None


@contextlib.contextmanager
def patched(module: Any, name: str, replacement: Callable[..., Any]) -> Iterator[None]:
    """Replace ``<module>.<name>`` (what the drainer looks up) for a while."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


class Bench:
    def __init__(self, broker_url: str) -> None:
        self.prefix = f"bench-drain-{uuid.uuid4().hex[:10]}"
        self.queue = f"{self.prefix}-q"
        self.app = make_app(broker_url, self.prefix, self.queue)
        self.resilience = Resilience(self.app)
        self.store = self.resilience.runtime.backout_store
        # Same queue, a key prefix of its own: entries signed and sealed.
        self.keyed_app = make_app(
            broker_url, self.prefix, self.queue, keys=True, store_prefix=f"{self.prefix}-k"
        )
        self.keyed = Resilience(self.keyed_app)
        self.parks: dict[bool, list[float]] = {False: [], True: []}  # seconds per park phase
        self.client = redis.Redis.from_url(broker_url)
        self.queue_key = f"{self.prefix}:broker:{self.queue}"
        self.serial = 0
        self.rounds: list[list[Row]] = []

    def queued(self) -> int:
        return int(self.client.llen(self.queue_key))

    def empty_queue(self) -> None:
        self.client.delete(self.queue_key)

    def raw(self, n: int) -> Row:
        ids = [f"{self.prefix}-raw-{self.serial}-{i}" for i in range(n)]
        self.serial += 1
        before = self.queued()
        with self.app.producer_or_acquire() as producer:
            started, cpu = time.perf_counter(), time.process_time()
            for i, task_id in enumerate(ids):
                self.app.send_task(
                    TASK, args=[i], task_id=task_id, queue=self.queue, producer=producer
                )
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        assert self.queued() - before == n, "raw publish lost messages"
        self.empty_queue()
        return Row("raw send_task, one producer", n, seconds, cpu)

    def park(self, n: int, keyed: bool = False) -> None:
        res = self.keyed if keyed else self.resilience
        store = res.runtime.backout_store
        now = res.runtime.now() - 1.0  # due at once
        serial, self.serial = self.serial, self.serial + 1
        started = time.perf_counter()
        for i in range(n):
            store.park(
                ParkedTask.new(
                    task_name=TASK,
                    task_id=f"{self.prefix}-parked-{serial}-{i}",
                    args=[i],
                    options={"queue": self.queue},
                    breaker="bench",
                    reason="breaker_open",
                    parked_at=now,
                    due_at=now,
                )
            )
        self.parks[keyed].append((time.perf_counter() - started) / n)

    def drain(self, n: int, label: str, publishes: bool = True, keyed: bool = False) -> Row:
        res = self.keyed if keyed else self.resilience
        self.park(n, keyed)
        assert res.runtime.backout_store.count() == n, "parking lost entries"
        before = self.queued()
        started, cpu = time.perf_counter(), time.process_time()
        report = res.drain()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        assert report.replayed == n, report
        assert not report.errors, report
        assert res.runtime.backout_store.count() == 0, "drain left entries behind"
        if publishes:
            assert self.queued() - before == n, "drain lost messages"
        self.empty_queue()
        return Row(label, n, seconds, cpu)

    def run(self, n: int, rounds: int) -> list[Row]:
        # Warm-up: connections, script loading, queue declaration; not timed.
        self.raw(WARMUP)
        self.drain(WARMUP, "warm-up")
        with patched(drain_module, "replay_dispatcher", _no_events):
            self.drain(WARMUP, "warm-up")
        self.drain(WARMUP, "warm-up", keyed=True)
        self.parks = {False: [], True: []}
        phases: list[list[Row]] = [[], [], [], [], [], []]
        runs = [
            lambda: self.raw(n),
            lambda: self.drain(n, "drain, task-replayed events on"),
            lambda: self.drain_without_events(n),
            lambda: self.drain_store_only(n),
            lambda: self.claim_and_ack(n),
            lambda: self.drain(n, "drain, signed + encrypted", keyed=True),
        ]
        for round_ in range(rounds):
            # The phases of a round run back to back, in a rotating order: a machine that
            # slows down or speeds up during the run shifts every phase alike.
            order = list(range(len(runs)))
            order = order[round_ % len(order) :] + order[: round_ % len(order)]
            for index in order:
                phases[index].append(runs[index]())
        self.rounds = phases
        return [best(phase) for phase in phases]

    def drain_without_events(self, n: int) -> Row:
        with patched(drain_module, "replay_dispatcher", _no_events):
            return self.drain(n, "drain, events off (no-op dispatcher)")

    def drain_store_only(self, n: int) -> Row:
        with (
            patched(drain_module, "replay_dispatcher", _no_events),
            patched(sending_module, "publish", _no_publish),
        ):
            return self.drain(n, "drain, publish off too", publishes=False)

    def claim_and_ack(self, n: int) -> Row:
        """The store's two drain operations alone: claim a batch, ack it, until none is left."""
        self.park(n)
        started, cpu = time.perf_counter(), time.process_time()
        while claimed := self.store.claim("bench", BATCH, 60.0):
            self.store.ack("bench", [e.id for e in claimed])
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        assert self.store.count() == 0, "claim and ack left entries behind"
        return Row("store claim + ack alone", n, seconds, cpu)

    def cleanup(self) -> None:
        self.resilience.runtime.close()
        self.keyed.runtime.close()
        for pattern in (f"{self.prefix}*", f"{{{self.prefix}*"):
            found = list(self.client.scan_iter(match=pattern, count=1000))
            if found:
                self.client.delete(*found)


def round_ratios(rounds: list[list[Row]]) -> list[float]:
    """Per phase, the median over rounds of raw's time / the phase's time in the same round."""
    raw = rounds[0]
    return [
        statistics.median(r.seconds / p.seconds for r, p in zip(raw, phase, strict=True))
        for phase in rounds
    ]


def codec_costs(repeat: int = 2000) -> dict[str, tuple[float, float]]:
    """CPU seconds to encode and to decode one entry (no Redis), by the keys the codec holds
    (CPU time: other load on the machine disturbs it less than wall time)."""
    entry = ParkedTask.new(
        task_name=TASK,
        task_id=str(uuid.uuid4()),
        args=[12345, "customer@example.com"],
        kwargs={"amount": "19.99", "token": "tok_" + "x" * 24},
        options={"queue": "payments", "argsrepr": "(12345, 'customer@example.com')"},
        breaker="bench",
        reason="breaker_open",
        exc_type="builtins.ConnectionError",
        exc_message="gateway unreachable",
    )
    codecs = {
        "no keys": Codec("json"),
        "signing": Codec("json", (SIGNING_KEY,)),
        "encryption": Codec("json", (), (ENCRYPTION_KEY,)),
        "both": Codec("json", (SIGNING_KEY,), (ENCRYPTION_KEY,)),
    }
    costs = {}
    for name, codec in codecs.items():
        data = codec.encode(entry)
        started = time.process_time()
        for _ in range(repeat):
            codec.encode(entry)
        encode = (time.process_time() - started) / repeat
        started = time.process_time()
        for _ in range(repeat):
            codec.decode(data, entry.id)
        costs[name] = (encode, (time.process_time() - started) / repeat)
    return costs


def trust_lines(
    rows: list[Row], by_round: list[float], parks: dict[bool, list[float]]
) -> list[str]:
    """What signing and encryption cost, per park and per drained entry."""
    on, keyed = rows[1], rows[5]
    costs = codec_costs()
    plain_park, keyed_park = min(parks[False]), min(parks[True])
    lines = [
        "",
        "signing (HMAC-SHA256) + encryption (AES-256-GCM), per entry:",
        f"  park, wall (one round trip)   {1e6 * plain_park:.1f} us without keys, "
        f"{1e6 * keyed_park:.1f} us with both (+{1e6 * (keyed_park - plain_park):.1f} us)",
        f"  drained entry, wall           {1e6 * on.seconds / on.tasks:.1f} us without keys, "
        f"{1e6 * keyed.seconds / keyed.tasks:.1f} us with both "
        f"(+{1e6 * (keyed.seconds / keyed.tasks - on.seconds / on.tasks):.1f} us)",
        "  codec alone, CPU, no Redis (encode at park / decode at drain):",
    ]
    for name, (encode, decode) in costs.items():
        lines.append(f"    {name:<12} {1e6 * encode:6.1f} us / {1e6 * decode:6.1f} us")
    lines.append(
        f"  drain signed + encrypted vs raw send_task: {by_round[5]:.2f} (median of the rounds; "
        f"target >= 2.00), without keys {by_round[1]:.2f}"
    )
    return lines


def report(
    rows: list[Row],
    n: int,
    rounds: int,
    broker_url: str,
    by_round: list[float],
    parks: dict[bool, list[float]],
) -> str:
    raw, on, off, store_only, store_ops, _ = rows
    lines = [
        f"drain benchmark: {n} entries per phase, best of {rounds} rounds, broker and store "
        f"{broker_url}, drain batch {BATCH}, drain rate unlimited",
        "",
        f"{'':<38} {'':>6} {'--------- wall time, best round ---------':>41}"
        f" {'-- CPU, client --':>17}",
        f"{'phase':<38} {'tasks':>6} {'seconds':>8} {'tasks/s':>8} {'us/task':>8} "
        f"{'vs raw':>6} {'spread':>6} {'us/task':>8} {'vs raw':>8}",
        "-" * 114,
    ]
    for row in rows:
        lines.append(
            f"{row.label:<38} {row.tasks:>6} {row.seconds:>8.3f} {row.rate:>8.0f} "
            f"{1e6 * row.seconds / row.tasks:>8.1f} {row.rate / raw.rate:>6.2f} "
            f"{row.spread:>6.2f} {1e6 * row.cpu / row.tasks:>8.1f} {raw.cpu / row.cpu:>8.2f}"
        )

    def us(seconds: float) -> str:
        return f"{1e6 * seconds / n:.1f} us"

    lines += [
        "",
        "rate vs raw, median of the rounds' own ratios (phases of a round ran back to back): "
        + ", ".join(
            f"{row.label.split(',')[-1].strip()} {ratio:.2f}"
            for row, ratio in zip(rows[1:3], by_round[1:3], strict=True)
        ),
        "",
        "per entry, wall (client CPU):",
        f"  task-replayed events        {us(on.seconds - off.seconds)} "
        f"({us(on.cpu - off.cpu)}): {100 * (on.seconds - off.seconds) / on.seconds:.0f}% of the "
        "drain with events",
        f"  publish inside the drain    {us(off.seconds - store_only.seconds)} "
        f"({us(off.cpu - store_only.cpu)}); raw send_task {us(raw.seconds)} ({us(raw.cpu)})",
        f"  claim, checks and ack       {us(store_only.seconds)} ({us(store_only.cpu)}): the "
        "drain without publish or events",
        f"  back-out store claim + ack  {us(store_ops.seconds)} ({us(store_ops.cpu)}): the "
        "store's two operations alone",
    ]
    return "\n".join(lines + trust_lines(rows, by_round, parks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=5000, help="messages / entries per phase")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of the six phases")
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/13")
    args = parser.parse_args(argv)
    if args.entries < 1 or args.rounds < 1:
        parser.error("--entries and --rounds must be >= 1")
    logging.getLogger("celery_resilience").setLevel(logging.ERROR)  # no "Drain: ..." per phase
    bench = Bench(args.broker_url)
    try:
        rows = bench.run(args.entries, args.rounds)
    finally:
        bench.cleanup()
    by_round = round_ratios(bench.rounds)
    print(report(rows, args.entries, args.rounds, args.broker_url, by_round, bench.parks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
