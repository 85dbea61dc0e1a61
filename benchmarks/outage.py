"""What an outage costs: the rest of the fleet, the gateway and the orders, variant by variant.

    python benchmarks/outage.py [--seconds 90] [--outage 20:50] [--rate 20]
                                [--modes hang,refuse,503] [--variants plain,pybreaker,resilient]
                                [--settle 60] [--drain-every 5] [--drain-rate R]
                                [--drain-batch N] [--concurrency 4] [--bulkhead 2]
                                [--on-open park] [--soft-time-limit 3]
                                [--latency 0.02] [--broker-url URL]
                                [--plot docs/_static/outage.png] [--json FILE] [--from-json FILE]
                                [--logs DIR] [--loglevel warning]

One prefork worker (``celery -A benchmarks.outageapp worker -c 4``, ``--concurrency``) serves two
task types from
one queue: ``charge(order_id)``, which POSTs to a real HTTP payment gateway (``outagegateway``,
its own process; client timeout 2 s), and ``report(n)``, ~5 ms of local work that calls nothing.
A producer in this script publishes ``--rate`` charges and ``--rate`` reports per second,
interleaved, for ``--seconds``; during ``--outage`` the gateway is down, in each ``--modes``:
``hang`` (accepts connections, never answers), ``refuse`` (connection refused), ``503``.

Variants (``outageapp`` has the tasks), each run alone, one after the other, on the same broker
(Redis, a dedicated db), each with its own queue and key prefix, all with ``acks_late`` and
``task_reject_on_worker_lost``: (1) plain Celery, ``autoretry_for=(RequestException,)``,
``retry_backoff``, ``retry_jitter``, ``max_retries=5``; (2) the same through pybreaker with
``CircuitRedisStorage``; (3) ``ResilientTask`` on a shared breaker, the drain run by a real
``celery beat`` (``Resilience.for_app(app).beat_schedule(every=--drain-every)``), with the
package's defaults plus the options the README recommends: a bulkhead (``--bulkhead``:
``max_concurrent_calls`` below the pool's size, so a hung gateway never holds every slot), the
client's timeout declared (``call_timeout``) and a ``soft_time_limit`` behind it
(``--soft-time-limit``).

After the producer stops, the run waits (at most ``--settle`` seconds) until every report ran
and every charge was charged or failed for good, then reads what the gateway received and what
the worker processes recorded. Per 1 s: reports finished, report latency from publish to finish
(by the second they were published), charges charged (first charge of an order, by the
gateway's clock). Baseline: the same run's pre-outage window, from 5 s (the worker warmed up)
to the outage: no second run without an outage. The ledger counts each order charged once,
twice or more (from the gateway's log), failed (its Celery FAILURE: retries spent, the charge is
lost), parked (in the back-out store at the end) or unfinished (none of these when the wait
ended: still retrying); and the time from the gateway's recovery until every order published
before it was charged. The table and a PNG (``--plot``) end the run; ``--json`` keeps the raw
runs, which ``--from-json`` turns into the table and the plot again.

Only keys carrying this run's id are deleted at the end; nothing is flushed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis
from celery import Celery

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import outageapp  # noqa: E402 - needs ROOT on the path
from benchmarks.outagefigures import (  # noqa: E402
    LABELS,
    MODES,
    Run,
    figures,
    ms,
    plot,
    report,
)
from celery_resilience import Resilience  # noqa: E402

START_TIMEOUT = 60.0
POLL = 0.5


# -- the processes ------------------------------------------------------------------------------
class Gateway:
    """The gateway's process, steered over its control port."""

    def __init__(self, latency: float) -> None:
        command = [sys.executable, "-m", "benchmarks.outagegateway", "--latency", str(latency)]
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, start_new_session=True
        )
        assert self.process.stdout is not None
        urls = json.loads(self.process.stdout.readline())
        self.api, self.control = urls["api"], urls["control"]

    def _request(self, method: str, path: str) -> Any:
        request = urllib.request.Request(self.control + path, method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def switch(self, mode: str) -> None:
        self._request("POST", f"/mode?to={mode}")

    def log(self) -> list[tuple[float, str, str]]:
        return [
            (float(t), str(key), str(outcome)) for t, key, outcome in self._request("GET", "/log")
        ]

    def reset(self) -> None:
        self._request("POST", "/reset")

    def stop(self) -> None:
        _stop(self.process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Warm shutdown (SIGTERM); SIGKILL to its own session if it does not end in 20 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _tail(path: str, lines: int = 30) -> str:
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_id = uuid.uuid4().hex[:10]
        self.redis = redis.Redis.from_url(args.broker_url)
        self.tmp = tempfile.TemporaryDirectory(prefix="outage-")
        self.t0 = 0.0  # wall clock of the current run's start (its producer's first message)

    def run(self, gateway: Gateway, mode: str, variant: str) -> Run:
        args = self.args
        prefix = f"outage-{self.run_id}-{mode}-{variant}"
        env = {
            **os.environ,
            "OUTAGE_BROKER_URL": args.broker_url,
            "OUTAGE_PREFIX": prefix,
            "OUTAGE_QUEUE": prefix,
            "OUTAGE_GATEWAY_URL": gateway.api,
            "OUTAGE_DRAIN_EVERY": str(args.drain_every),
            "OUTAGE_DRAIN_RATE": str(args.drain_rate or ""),
            "OUTAGE_DRAIN_BATCH": str(args.drain_batch or ""),
            "OUTAGE_BULKHEAD": str(args.bulkhead or ""),
            "OUTAGE_SOFT_LIMIT": str(args.soft_time_limit or ""),
            "OUTAGE_ON_OPEN": args.on_open,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        app = Celery("outage-publisher", set_as_current=False)
        app.conf.update(outageapp.settings(args.broker_url, prefix, prefix))
        logs = Path(self.args.logs or self.tmp.name)
        logs.mkdir(parents=True, exist_ok=True)
        log = str(logs / f"{mode}-{variant}.log")
        level = self.args.loglevel
        celery = [sys.executable, "-m", "celery", "-A", "benchmarks.outageapp"]
        processes = []
        with open(log, "wb") as out:
            pool = ["-P", "prefork", "-c", str(args.concurrency)]
            worker = [*celery, "worker", *pool, "-Q", prefix, "-l", level]
            worker += ["-n", f"{prefix}@%h", "--without-heartbeat", "--without-gossip"]
            worker += ["--without-mingle"]
            commands = [worker]
            if variant == "resilient":
                schedule = f"{self.tmp.name}/{mode}-beat-schedule"
                commands.append([*celery, "beat", "-l", level, "-s", schedule])
            for command in commands:
                processes.append(
                    subprocess.Popen(
                        command,
                        cwd=ROOT,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        run = Run(mode, variant, args.seconds)
        try:
            self.warm_up(app, variant, prefix, processes, log)
            gateway.reset()
            self.produce(app, gateway, run, prefix)
            self.settle(gateway, run, prefix, processes, log)
            if variant == "resilient":
                resilience = Resilience.for_app(app)
                snap = resilience.breaker(outageapp.BREAKER).snapshot()
                run.note = f"breaker opened {snap['opened_total']}x, now {snap['state']}"
                entries = resilience.backout.list(limit=100_000)
                run.parked = sorted(int(e.args[0]) for e in entries if int(e.args[0]) >= 0)
                resilience.runtime.close()
        finally:
            for process in reversed(processes):
                _stop(process)
        self.collect(gateway, run, prefix)
        return run

    def warm_up(
        self, app: Celery, variant: str, prefix: str, processes: list[Any], log: str
    ) -> None:
        """Two reports and two charges (negative numbers, left out of every figure) must run."""
        for n in (-1, -2):
            app.send_task(outageapp.REPORT, (n,), queue=prefix)
            app.send_task(outageapp.TASKS[variant], (n,), queue=prefix)
        deadline = time.monotonic() + START_TIMEOUT
        while (
            self.redis.llen(f"{prefix}:rec:reports") < 2
            or self.redis.llen(f"{prefix}:rec:calls") < 2
        ):
            if any(p.poll() is not None for p in processes) or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start; log:\n{_tail(log)}")
            time.sleep(0.1)

    def produce(self, app: Celery, gateway: Gateway, run: Run, prefix: str) -> None:
        """``--rate`` reports and charges a second, interleaved; the outage switched on time."""
        args = self.args
        interval = 1.0 / (2 * args.rate)
        start, end = args.outage
        self.t0 = time.time()
        clock = time.perf_counter()
        down = up = False
        with app.producer_or_acquire() as producer:
            for i in range(round(args.seconds * 2 * args.rate)):
                wait = i * interval - (time.perf_counter() - clock)
                if wait > 0:
                    time.sleep(wait)
                now = time.time() - self.t0
                if not down and now >= start:
                    gateway.switch(run.mode)
                    down, run.outage = True, (time.time() - self.t0, end)
                if down and not up and now >= end:
                    gateway.switch("up")
                    up, run.outage = True, (run.outage[0], time.time() - self.t0)
                if i % 2:
                    run.charges.append(time.time() - self.t0)
                    name = outageapp.TASKS[run.variant]
                    app.send_task(name, (i // 2,), queue=prefix, producer=producer)
                else:
                    run.reports.append(time.time() - self.t0)
                    app.send_task(outageapp.REPORT, (i // 2,), queue=prefix, producer=producer)
        if down and not up:
            gateway.switch("up")
            run.outage = (run.outage[0], time.time() - self.t0)

    def settle(
        self, gateway: Gateway, run: Run, prefix: str, processes: list[Any], log: str
    ) -> None:
        """Wait until every report ran and every order was charged or failed, or ``--settle``."""
        deadline = time.monotonic() + self.args.settle
        orders = len(run.charges)
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in processes):
                raise RuntimeError(f"the worker exited; log:\n{_tail(log)}")
            reports = self.redis.llen(f"{prefix}:rec:reports") - 2
            charged = {key for _, key, outcome in gateway.log() if outcome == "charged"}
            settled = len({k for k in charged if not k.startswith("-")})
            settled += self.redis.llen(f"{prefix}:rec:failed")
            if reports >= len(run.reports) and settled >= orders:
                break
            time.sleep(POLL)
        run.ended = time.time() - self.t0

    def collect(self, gateway: Gateway, run: Run, prefix: str) -> None:
        def lines(kind: str) -> list[list[str]]:
            raw: list[bytes] = self.redis.lrange(f"{prefix}:rec:{kind}", 0, -1)  # type: ignore[assignment]
            return [line.decode().split() for line in raw]

        t0 = self.t0
        run.finished = [(int(n), float(t) - t0) for n, t in lines("reports") if int(n) >= 0]
        run.calls = [
            (int(n), float(a) - t0, float(b) - t0, outcome)
            for n, a, b, outcome in lines("calls")
            if int(n) >= 0
        ]
        run.failed = [(int(n), float(t) - t0) for n, t in lines("failed") if int(n) >= 0]
        run.gateway = [
            (t - t0, int(key), outcome)
            for t, key, outcome in gateway.log()
            if key.lstrip("-").isdigit() and int(key) >= 0
        ]

    def cleanup(self) -> int:
        keys = list(self.redis.scan_iter(match=f"*{self.run_id}*", count=1000))
        deleted = 0
        for start in range(0, len(keys), 500):
            deleted += int(self.redis.delete(*keys[start : start + 500]))
        self.tmp.cleanup()
        return deleted


# -- main ---------------------------------------------------------------------------------------
def machine(broker_url: str) -> str:
    import celery
    import kombu

    server = redis.Redis.from_url(broker_url).info("server")
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor() or platform.machine(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.machine()
    )
    return (
        f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, Celery "
        f"{celery.__version__}, kombu {kombu.__version__}, redis-py {redis.__version__}, Redis "
        f"{server['redis_version']}, pybreaker {importlib.metadata.version('pybreaker')}"
    )


def _window(value: str) -> tuple[float, float]:
    start, _, end = value.partition(":")
    return float(start), float(end)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=90.0, help="producer's run time")
    parser.add_argument("--outage", type=_window, default=(20.0, 50.0), help="START:END (s)")
    parser.add_argument("--rate", type=float, default=20.0, help="charges/s, and reports/s")
    parser.add_argument("--modes", default="hang,refuse,503")
    parser.add_argument("--variants", default="plain,pybreaker,resilient")
    parser.add_argument("--settle", type=float, default=60.0, help="wait after the producer")
    parser.add_argument("--drain-every", type=float, default=5.0, help="beat's drain period")
    parser.add_argument("--drain-rate", type=float, help="resilience_drain_rate (default: its)")
    parser.add_argument("--drain-batch", type=int, help="resilience_drain_batch (default: its)")
    parser.add_argument("--concurrency", type=int, default=4, help="the worker's pool size")
    parser.add_argument(
        "--bulkhead",
        type=int,
        default=2,
        help="ResilientTask's max_concurrent_calls (recommended: below the pool; 0: off)",
    )
    parser.add_argument(
        "--on-open",
        choices=("park", "retry"),
        default="park",
        help="ResilientTask's on_open (the package's default: park)",
    )
    parser.add_argument(
        "--soft-time-limit",
        type=float,
        default=3.0,
        help="ResilientTask's soft_time_limit, a backstop behind the client's 2 s (0: none)",
    )
    parser.add_argument("--latency", type=float, default=0.02, help="the gateway's, per charge")
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "_static" / "outage.png")
    parser.add_argument("--json", type=Path, help="also write the raw runs here")
    parser.add_argument("--logs", type=Path, help="keep the worker and beat logs here")
    parser.add_argument("--loglevel", default="warning", help="of the worker and beat")
    parser.add_argument("--from-json", type=Path, help="no run: table and plot of a saved one")
    args = parser.parse_args(argv)
    modes, variants = args.modes.split(","), args.variants.split(",")
    if not set(modes) <= set(MODES) or not set(variants) <= set(LABELS):
        parser.error(f"--modes: some of {list(MODES)}; --variants: some of {list(LABELS)}")
    start, end = args.outage
    if not 0 < start < end <= args.seconds:
        parser.error("--outage START:END within (0, --seconds]")

    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        about, args.rate = saved["machine"], saved["rate"]
        runs = [Run(**{**r, "outage": tuple(r["outage"])}) for r in saved["runs"]]
    else:
        about = machine(args.broker_url)
        runs = measure(args, modes, variants, about)
        if args.json:
            saved = {"machine": about, "rate": args.rate, "runs": [asdict(r) for r in runs]}
            args.json.write_text(json.dumps(saved))
    report(runs)
    caption = (
        f"{args.rate:.0f} charges/s + {args.rate:.0f} reports/s on one prefork worker "
        f"-c {args.concurrency}, the gateway down in the shaded window; {about}"
    )
    plot(runs, args.plot, caption)
    print(f"\nplot: {args.plot}")
    return 0


def measure(
    args: argparse.Namespace, modes: list[str], variants: list[str], about: str
) -> list[Run]:
    bench = Bench(args)
    print(
        f"outage benchmark: {args.rate:.0f} charges/s + {args.rate:.0f} reports/s for "
        f"{args.seconds:.0f} s, gateway down {args.outage[0]:.0f}-{args.outage[1]:.0f} s; modes "
        f"{', '.join(modes)}; broker {args.broker_url}, keys *{bench.run_id}*; {about}",
        flush=True,
    )
    runs = []
    gateway = Gateway(args.latency)
    started = time.monotonic()
    try:
        for mode in modes:
            for variant in variants:
                load = os.getloadavg()[0]
                run = bench.run(gateway, mode, variant)
                runs.append(run)
                f = figures(run)
                print(
                    f"  {mode:<7}{LABELS[run.variant]:<21} reports {f.rate:.1f}/s in the outage "
                    f"(baseline {f.base_rate:.1f}), p99 {ms(f.p99)} ms; orders once {f.once}, "
                    f"failed {f.failed}, parked {f.parked}, unfinished {f.unfinished}; waited "
                    f"until {run.ended:.0f} s; load avg before {load:.1f}",
                    flush=True,
                )
    finally:
        gateway.stop()
        deleted = bench.cleanup()
        print(
            f"total {time.monotonic() - started:.0f}s; deleted {deleted} keys of run {bench.run_id}"
        )
    return runs


if __name__ == "__main__":
    sys.exit(main())
