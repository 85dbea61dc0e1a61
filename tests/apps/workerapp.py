"""The Celery app that ``celery worker`` subprocesses of the integration tests load.

Everything comes from ``WORKERAPP_*`` environment variables, so each test gets a world of its
own: a key prefix (breaker, back-out store, the fake dependency, result keys and, on a Redis
broker, the broker's own keys through kombu's ``global_keyprefix``) and a queue nobody else
consumes. The test process builds the same app with :func:`make_app` from the same mapping.

``WORKERAPP_LEDGER`` puts the dependency, the ledger and the results on a Redis of their own
(the fault matrix breaks the resilience Redis and the broker, never the ledger). The "dependency"
is a few Redis keys under the prefix: ``<P>:dep:up`` ("1" up, anything else
down), ``<P>:dep:latency`` (seconds each call takes), ``<P>:dep:calls`` (INCR per call),
``<P>:dep:inflight`` (calls under way), ``<P>:dep:concurrency`` (per call, the calls in flight
once it arrived: the dependency's own measure of concurrency) and ``<P>:dep:log`` (one JSON
record per call: task id, retries, Redis ``TIME``, pid). With ``WORKERAPP_HOOKS=1``, the hosts
``workerapp.webhook`` calls are down while they are in the set ``<P>:dep:down-hosts``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

import redis
from celery import Celery

from celery_resilience import ResilientTask
from celery_resilience.backoff import Exponential

DEFAULT_REDIS = "redis://127.0.0.1:6379/15"

#: Redis clients of this process, made again after a fork (a prefork child must not share one).
_clients: dict[tuple[int, str], redis.Redis] = {}


def settings(env: Mapping[str, str]) -> dict[str, Any]:
    """The ``WORKERAPP_*`` variables, parsed, with their defaults."""
    prefix = env.get("WORKERAPP_PREFIX", "workerapp")
    jitter = env.get("WORKERAPP_JITTER", "full")
    max_countdown = env.get("WORKERAPP_MAX_COUNTDOWN")
    redis_url = env.get("WORKERAPP_REDIS", DEFAULT_REDIS)
    return {
        "broker": env.get("WORKERAPP_BROKER", DEFAULT_REDIS),
        "redis": redis_url,
        "ledger": env.get("WORKERAPP_LEDGER", redis_url),
        "redis_timeout": float(env.get("WORKERAPP_REDIS_TIMEOUT", "0.5")),
        "keep_delay": float(env.get("WORKERAPP_KEEP_DELAY", "30")),
        "on_redis_error": env.get("WORKERAPP_ON_REDIS_ERROR", "fail_open"),
        "deduplicate": env.get("WORKERAPP_DEDUPLICATE", "") == "1",
        "prefix": prefix,
        "queue": env.get("WORKERAPP_QUEUE", f"{prefix}-queue"),
        "failure_threshold": int(env.get("WORKERAPP_FAILURE_THRESHOLD", "3")),
        "open_timeout": float(env.get("WORKERAPP_OPEN_TIMEOUT", "30")),
        "max_countdown": None if max_countdown is None else float(max_countdown),
        "max_retries": int(env.get("WORKERAPP_MAX_RETRIES", "4")),
        "backoff_base": float(env.get("WORKERAPP_BACKOFF_BASE", "0.2")),
        "backoff_cap": float(env.get("WORKERAPP_BACKOFF_CAP", "5")),
        "jitter": None if jitter == "none" else jitter,
        "visibility_timeout": float(env.get("WORKERAPP_VISIBILITY_TIMEOUT", "3600")),
        "prefetch_multiplier": int(env.get("WORKERAPP_PREFETCH_MULTIPLIER", "4")),
        # Seconds between the Redis broker's sweeps that bring back messages a dead worker held.
        "restore_interval": env.get("WORKERAPP_RESTORE_INTERVAL"),
        # The back-out store writes msgpack, which can't hold what JSON messages can (datetime).
        "store_msgpack": env.get("WORKERAPP_STORE_MSGPACK", "") == "1",
        "park_attempts": int(env.get("WORKERAPP_PARK_ATTEMPTS", "10")),
        # The time limits of ``workerapp.hang`` (soft) and ``workerapp.stuck`` (hard).
        "soft_time_limit": float(env.get("WORKERAPP_SOFT_TIME_LIMIT", "1")),
        "time_limit": float(env.get("WORKERAPP_TIME_LIMIT", "2")),
        # The back-out store's keys (resilience_signing_key, resilience_encryption_key).
        "signing_key": env.get("WORKERAPP_SIGNING_KEY"),
        "encryption_key": env.get("WORKERAPP_ENCRYPTION_KEY"),
        # How long a claim of a task id lasts (deduplicate=True, no time limit): seconds.
        "dedup_lease": env.get("WORKERAPP_DEDUP_LEASE"),
        # The breaker's bulkhead (unset: off), and what a rejected delivery does.
        "max_concurrent_calls": env.get("WORKERAPP_MAX_CONCURRENT_CALLS"),
        "on_open": env.get("WORKERAPP_ON_OPEN", "park"),
        # "1": a breaker per host too (``hook``), called by ``workerapp.webhook``.
        "hooks": env.get("WORKERAPP_HOOKS", "") == "1",
        # "1": the queue is a RabbitMQ quorum queue behind a topic exchange (Celery 5.5's native
        # delayed delivery holds countdowns in the broker then).
        "quorum": env.get("WORKERAPP_QUORUM", "") == "1",
        # What people and logs may read: resilience_sensitive_keys (comma-separated) and
        # resilience_error_text (unset: the package's default).
        "sensitive_keys": [k for k in env.get("WORKERAPP_SENSITIVE_KEYS", "").split(",") if k],
        "error_text": env.get("WORKERAPP_ERROR_TEXT"),
        # The breaker's retry budget (unset: off), its floor (retries a second) and window.
        "retry_budget": env.get("WORKERAPP_RETRY_BUDGET"),
        "min_retries_per_second": float(env.get("WORKERAPP_MIN_RETRIES_PER_SECOND", "10")),
        "window": float(env.get("WORKERAPP_WINDOW", "60")),
        # The breaker's fleet-wide rate limit ("5/s"; unset: off).
        "rate_limit": env.get("WORKERAPP_RATE_LIMIT"),
        # The result backend's serializer ("json" or "pickle").
        "result_serializer": env.get("WORKERAPP_RESULT_SERIALIZER", "json"),
    }


def is_redis_url(url: str) -> bool:
    return urlparse(url).scheme in ("redis", "rediss", "unix")


def broker_keyprefix(prefix: str) -> str:
    """Where the Redis broker keeps its keys (queues, ``unacked``) for this prefix."""
    return f"{prefix}:broker:"


def make_app(env: Mapping[str, str]) -> Celery:
    """The app of one test world, configured from ``env`` (``os.environ`` in a worker)."""
    s = settings(env)
    prefix = s["prefix"]
    app = Celery(f"workerapp-{prefix}", set_as_current=False)
    transport_options: dict[str, Any] = {"visibility_timeout": s["visibility_timeout"]}
    if is_redis_url(s["broker"]):
        transport_options["global_keyprefix"] = broker_keyprefix(prefix)
        if s["restore_interval"] is not None:
            transport_options["unacked_restore_interval"] = float(s["restore_interval"])
            transport_options["unacked_restore_throttle"] = 1
    else:
        # The worker notices a SIGTERM only when its event loop wakes: with no timer due, it
        # sleeps up to 10 s. An AMQP heartbeat of 2 s adds a 1 s tick (Redis has its own).
        app.conf.broker_heartbeat = 2
    app.conf.update(
        broker_url=s["broker"],
        broker_connection_retry_on_startup=True,
        broker_transport_options=transport_options,
        result_backend=s["ledger"],
        result_backend_transport_options={"global_keyprefix": f"{prefix}:"},
        task_default_queue=s["queue"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=s["prefetch_multiplier"],
        # No pidbox: remote control would broadcast to every test's workers on a shared broker.
        worker_enable_remote_control=False,
        resilience_redis_url=s["redis"],
        resilience_key_prefix=prefix,
        resilience_redis_timeout=s["redis_timeout"],
        resilience_keep_delay=s["keep_delay"],
        resilience_park_attempts=s["park_attempts"],
        resilience_on_redis_error=s["on_redis_error"],
        resilience_breakers={
            "dep": {
                "failure_threshold": s["failure_threshold"],
                "open_timeout": s["open_timeout"],
                "window": s["window"],
            }
        },
    )
    if s["quorum"]:
        app.conf.task_default_queue_type = "quorum"
        app.conf.task_default_exchange_type = "topic"
    if s["hooks"]:
        app.conf.resilience_breakers["hook"] = {
            "failure_threshold": s["failure_threshold"],
            "open_timeout": s["open_timeout"],
        }
    if s["max_concurrent_calls"] is not None:
        app.conf.resilience_breakers["dep"]["max_concurrent_calls"] = int(s["max_concurrent_calls"])
    if s["retry_budget"] is not None:
        app.conf.resilience_breakers["dep"]["retry_budget"] = float(s["retry_budget"])
        app.conf.resilience_breakers["dep"]["min_retries_per_second"] = s["min_retries_per_second"]
    if s["rate_limit"] is not None:
        app.conf.resilience_breakers["dep"]["rate_limit"] = s["rate_limit"]
    if s["store_msgpack"]:
        app.conf.accept_content = ["json", "msgpack"]
        app.conf.resilience_serializer = "msgpack"
    if s["max_countdown"] is not None:
        app.conf.resilience_max_countdown = s["max_countdown"]
    app.conf.resilience_signing_key = s["signing_key"]
    app.conf.resilience_encryption_key = s["encryption_key"]
    app.conf.resilience_sensitive_keys = s["sensitive_keys"]
    app.conf.resilience_error_text = s["error_text"]
    if s["result_serializer"] != "json":
        app.conf.result_serializer = s["result_serializer"]
        app.conf.result_accept_content = ["json", s["result_serializer"]]
    if s["dedup_lease"] is not None:
        app.conf.resilience_dedup_lease = float(s["dedup_lease"])
    define_tasks(app, s)
    return app


def client(url: str) -> redis.Redis:
    key = (os.getpid(), url)
    found = _clients.get(key)
    if found is None:
        found = _clients[key] = redis.Redis.from_url(url)
    return found


def redis_now(r: redis.Redis) -> float:
    seconds, micros = r.time()
    return float(seconds) + micros / 1_000_000


class GatewayError(Exception):
    """A dependency's error built from more than a message, shown through its own attributes
    (as HTTP clients' errors are)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(code, text)
        self.code = code

    def __str__(self) -> str:
        return f"gateway {self.code}: {self.args[1]}"


def call_dependency(r: redis.Redis, prefix: str, task: Any, order_id: str) -> None:
    """The fake dependency: every call is counted and logged; down means ``ConnectionError``."""
    now = redis_now(r)
    record = {
        "task_id": task.request.id,
        "retries": task.request.retries or 0,
        "time": now,
        "pid": os.getpid(),
    }
    inflight = f"{prefix}:dep:inflight"
    pipe = r.pipeline()
    pipe.incr(f"{prefix}:dep:calls")
    pipe.rpush(f"{prefix}:dep:log", json.dumps(record))
    pipe.incr(inflight)
    pipe.get(f"{prefix}:dep:up")
    pipe.get(f"{prefix}:dep:latency")
    _, _, concurrency, up, latency = pipe.execute()
    r.rpush(f"{prefix}:dep:concurrency", concurrency)
    try:
        if latency:
            time.sleep(float(latency))
    finally:
        r.decr(inflight)
    if up != b"1":
        raise ConnectionError(f"dependency down (order {order_id})")


def define_tasks(app: Celery, s: Mapping[str, Any]) -> None:
    prefix, url = s["prefix"], s["ledger"]
    succeeded = f"{prefix}:ledger:succeeded"
    runs = f"{prefix}:ledger:runs"  # task id -> bodies that succeeded (> 1: a duplicate)
    resilient = {
        "base": ResilientTask,
        "bind": True,
        "shared": False,  # stay out of other apps made in the same test process
        "acks_late": True,
        "reject_on_worker_lost": True,
    }

    def charge(self: Any, order_id: str, amount: int = 1) -> dict[str, Any]:
        r = client(url)
        call_dependency(r, prefix, self, order_id)
        with r.pipeline() as pipe:
            pipe.sadd(succeeded, self.request.id)
            pipe.hincrby(runs, self.request.id, 1)
            pipe.execute()
        return {"order_id": order_id, "amount": amount}

    # ``charge`` with the world's deduplicate setting; ``charge_once`` always deduplicates (a
    # world without it still shows what deduplicate=True changes).
    for name, deduplicate in (("charge", s["deduplicate"]), ("charge_once", True)):
        app.task(
            name=f"workerapp.{name}",
            breaker="dep",
            retry_on=(ConnectionError,),
            max_retries=s["max_retries"],
            backoff=Exponential(base=s["backoff_base"], cap=s["backoff_cap"], jitter=s["jitter"]),
            deduplicate=deduplicate,
            call_timeout=10.0,  # the fake dependency's calls end (its latency is the test's)
            on_open=s["on_open"],
            **resilient,
        )(charge)

    guarded = {
        "breaker": "dep",
        "retry_on": (ConnectionError,),
        "max_retries": s["max_retries"],
        "backoff": Exponential(base=s["backoff_base"], cap=s["backoff_cap"], jitter=s["jitter"]),
        "deduplicate": s["deduplicate"],
        **resilient,
    }

    if s["hooks"]:
        define_webhook(app, s, resilient)

    def charged(self: Any, order_id: str) -> str:
        """The body of the tasks below: the dependency's call, then the ledger's record."""
        r = client(url)
        call_dependency(r, prefix, self, order_id)
        with r.pipeline() as pipe:
            pipe.sadd(succeeded, self.request.id)
            pipe.hincrby(runs, self.request.id, 1)
            pipe.execute()
        return order_id

    @app.task(name="workerapp.hang", soft_time_limit=s["soft_time_limit"], **guarded)
    def hang(self: Any, order_id: str) -> str:
        """A call the soft time limit ends when the dependency hangs (its latency)."""
        return charged(self, order_id)

    @app.task(name="workerapp.stuck", time_limit=s["time_limit"], **guarded)
    def stuck(self: Any, order_id: str) -> str:
        """A call the hard time limit kills when the dependency hangs (its latency)."""
        return charged(self, order_id)

    @app.task(name="workerapp.polite", call_timeout=1.0, **guarded)
    def polite(self: Any, order_id: str) -> str:
        """Retries by itself, as Celery's docs show: ``raise self.retry(exc=exc)``."""
        try:
            return charged(self, order_id)
        except ConnectionError as exc:
            raise self.retry(exc=exc, countdown=0.05) from exc

    @app.task(
        name="workerapp.auto",
        call_timeout=1.0,
        autoretry_for=(ConnectionError,),
        retry_kwargs={"countdown": 0.05},
        **{**guarded, "retry_on": ()},
    )
    def auto(self: Any, order_id: str) -> str:
        """Retries through Celery's ``autoretry_for``."""
        return charged(self, order_id)

    @app.task(
        name="workerapp.crash",
        breaker="dep",
        retry_on=(ConnectionError,),
        call_timeout=1.0,
        **resilient,
    )
    def crash(self: Any, order_id: str) -> None:
        raise ValueError(f"bad input: order {order_id!r} does not exist")

    @app.task(name="workerapp.poison", **resilient)
    def poison(self: Any, order_id: str) -> None:
        """Kills the pool child that runs it, every time (a message that crashes its worker)."""
        client(url).rpush(f"{prefix}:poison:deaths", self.request.id)
        os.kill(os.getpid(), signal.SIGKILL)

    @app.task(name="workerapp.slow", **resilient)
    def slow(self: Any, order_id: str, seconds: float) -> str:
        r = client(url)
        start = {"task_id": self.request.id, "pid": os.getpid(), "time": redis_now(r)}
        r.rpush(f"{prefix}:slow:started", json.dumps(start))
        time.sleep(seconds)
        r.sadd(succeeded, self.request.id)
        return order_id

    define_overload_tasks(app, s, guarded)
    define_gateway_task(app, prefix, url, guarded)
    define_once_tasks(app, prefix, url, resilient)
    define_beating_task(app, prefix, url, s["time_limit"], resilient)


class TooManyRequests(Exception):
    """A 429: the dependency says when to come back (``retry_after``, seconds)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def define_overload_tasks(app: Celery, s: Mapping[str, Any], guarded: Mapping[str, Any]) -> None:
    """``workerapp.brownout``: a call that fails for a share of its attempts
    (``<P>:dep:fail_share``), drawn from (task id, retries) so that a run repeats;
    ``workerapp.throttled``: a first attempt answered with a 429 saying "come back in
    ``<P>:dep:retry_after`` seconds", then a success. Both call the fake dependency (counted
    and logged, with the attempt's retries)."""
    prefix, url = s["prefix"], s["ledger"]

    def succeed(r: redis.Redis, task_id: str) -> None:
        with r.pipeline() as pipe:
            pipe.sadd(f"{prefix}:ledger:succeeded", task_id)
            pipe.hincrby(f"{prefix}:ledger:runs", task_id, 1)
            pipe.execute()

    @app.task(name="workerapp.brownout", call_timeout=1.0, **guarded)
    def brownout(self: Any, order_id: str) -> str:
        r = client(url)
        call_dependency(r, prefix, self, order_id)
        share = float(r.get(f"{prefix}:dep:fail_share") or 0)
        if random.Random(f"{self.request.id}:{self.request.retries}").random() < share:
            raise ConnectionError(f"brownout (order {order_id})")
        succeed(r, self.request.id)
        return order_id

    @app.task(
        name="workerapp.throttled",
        call_timeout=1.0,
        **{**guarded, "retry_on": (ConnectionError, TooManyRequests)},
    )
    def throttled(self: Any, order_id: str) -> str:
        r = client(url)
        call_dependency(r, prefix, self, order_id)
        if not self.request.retries:
            wait = float(r.get(f"{prefix}:dep:retry_after") or 0)
            raise TooManyRequests(f"429 (order {order_id})", retry_after=wait)
        succeed(r, self.request.id)
        return order_id


def define_webhook(app: Celery, s: Mapping[str, Any], resilient: Mapping[str, Any]) -> None:
    """``workerapp.webhook(host, n)``: a breaker per host (``hook:<host>``)."""
    prefix, url = s["prefix"], s["ledger"]

    @app.task(
        name="workerapp.webhook",
        breaker="hook",
        breaker_key="{host}",
        retry_on=(ConnectionError,),
        max_retries=s["max_retries"],
        backoff=Exponential(base=s["backoff_base"], cap=s["backoff_cap"], jitter=s["jitter"]),
        call_timeout=1.0,
        **resilient,
    )
    def webhook(self: Any, host: str, n: int) -> str:
        r = client(url)
        if r.sismember(f"{prefix}:dep:down-hosts", host):
            raise ConnectionError(f"{host} is down")
        r.sadd(f"{prefix}:ledger:succeeded", self.request.id)
        r.hincrby(f"{prefix}:ledger:runs", self.request.id, 1)
        return host


def define_gateway_task(app: Celery, prefix: str, url: str, guarded: Mapping[str, Any]) -> None:
    """``workerapp.gateway``: fails with :class:`GatewayError`, a type with its own arguments."""
    succeeded = f"{prefix}:ledger:succeeded"

    @app.task(name="workerapp.gateway", **{**guarded, "retry_on": (GatewayError,)})
    def gateway(self: Any, order_id: str) -> bool:
        """Fails with :class:`GatewayError` (which quotes the order) while ``<P>:gateway:fails``
        counts down from above 0."""
        if client(url).decr(f"{prefix}:gateway:fails") >= 0:
            raise GatewayError(502, f"order {order_id} refused")
        client(url).sadd(succeeded, self.request.id)
        return True


def define_once_tasks(app: Celery, prefix: str, url: str, options: Mapping[str, Any]) -> None:
    """``workerapp.once`` and ``workerapp.once_dep``: ``deduplicate=True`` without a breaker
    (``deliver.lua``) and with one (``acquire.lua``); ``workerapp.once_slot``: the same body
    through the breaker without ``deduplicate`` (what its bulkhead slot alone does);
    ``workerapp.once_order`` and ``once_order_dep``: ``deduplicate="order:{order_id}"``."""

    def run_once(self: Any, order_id: str, seconds: float) -> str:
        """Counts its runs per task id (``<P>:once:runs``) and logs each start; only the first
        run of an id takes ``seconds`` (a run after a crash is quick)."""
        r = client(url)
        n = r.hincrby(f"{prefix}:once:runs", self.request.id, 1)
        start = {"task_id": self.request.id, "pid": os.getpid(), "time": redis_now(r), "n": n}
        r.rpush(f"{prefix}:once:started", json.dumps(start))
        if n == 1:
            time.sleep(seconds)
        r.sadd(f"{prefix}:ledger:succeeded", self.request.id)
        return order_id

    app.task(name="workerapp.once", deduplicate=True, **options)(run_once)
    app.task(name="workerapp.once_dep", breaker="dep", deduplicate=True, **options)(run_once)
    app.task(name="workerapp.once_slot", breaker="dep", **options)(run_once)

    def charge_order(self: Any, order_id: str, seconds: float) -> str:
        """Counts its runs per order (``<P>:once:orders``), taking ``seconds`` each."""
        r = client(url)
        r.hincrby(f"{prefix}:once:orders", order_id, 1)
        time.sleep(seconds)
        r.sadd(f"{prefix}:ledger:succeeded", self.request.id)
        return order_id

    # One order's body runs once, whatever the task ids (a dedup key from the arguments).
    for name, breaker in (("once_order", None), ("once_order_dep", "dep")):
        key = "order:{order_id}"
        app.task(name=f"workerapp.{name}", breaker=breaker, deduplicate=key, **options)(
            charge_order
        )


def define_beating_task(
    app: Celery, prefix: str, url: str, time_limit: float, options: Mapping[str, Any]
) -> None:
    """``workerapp.beating``: ``deduplicate=True`` through the breaker, under a hard time limit;
    each run of a task id leaves a heartbeat (Redis time) in ``<P>:beats:<task id>:<run>``
    every 50 ms while it runs: when a body stopped is known to the millisecond."""

    @app.task(
        name="workerapp.beating", breaker="dep", deduplicate=True, time_limit=time_limit, **options
    )
    def beating(self: Any, seconds: float) -> int:
        """Only the first run of an id takes ``seconds``."""
        r = client(url)
        n = int(r.hincrby(f"{prefix}:beats:runs", self.request.id, 1))
        deadline = time.monotonic() + (seconds if n == 1 else 0.0)
        while True:
            r.rpush(f"{prefix}:beats:{self.request.id}:{n}", redis_now(r))
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        r.sadd(f"{prefix}:ledger:succeeded", self.request.id)
        return n


app = make_app(os.environ)
