"""Settings of the example shop. Celery reads every ``CELERY_*`` name (``namespace="CELERY"``).

Environment variables, so the demo can run everything in a temporary place:
``SHOP_DB_PATH`` (SQLite file), ``SHOP_BROKER_URL``, ``SHOP_RESILIENCE_REDIS_URL`` (breakers and
back-out store; default: the broker's Redis), ``SHOP_KEY_PREFIX`` (prefix of every Redis key the
shop makes: broker and resilience alike), ``SHOP_GATEWAY_URL``.
"""

import os
from pathlib import Path

import django

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "example-only-not-a-secret")
DEBUG = os.environ.get("SHOP_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_results",
    # Parked tasks in the admin (replay, discard); it shows whichever back-out store the app
    # uses: Redis here, or the database with CELERY_RESILIENCE_BACKOUT_STORE = "django".
    "celery_resilience.contrib.django",
    "orders",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "shop.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "static/"
USE_TZ = True
TIME_ZONE = "UTC"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_DB_PATH", str(BASE_DIR / "db.sqlite3")),
        # Worker children, beat and the web process write at once: WAL lets readers go on
        # during a write, IMMEDIATE takes the write lock up front (no upgrade deadlocks), and
        # a writer waits up to 20 s for its turn instead of failing with "database is locked".
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        },
    }
}
if django.VERSION < (5, 1):  # neither option exists before Django 5.1: WAL by hand, no IMMEDIATE
    DATABASES["default"]["OPTIONS"] = {"timeout": 20}

# -- the payment gateway (example_project/gateway.py) -------------------------------------
PAYMENTS_GATEWAY_URL = os.environ.get("SHOP_GATEWAY_URL", "http://127.0.0.1:8099")
# Seconds; a timeout is a transient failure (TimeoutError). The demo's hang outage sets a long
# one (SHOP_PAYMENTS_TIMEOUT), as a client left at its library's default would have: the charge
# task's soft time limit is then what ends a hung call.
PAYMENTS_TIMEOUT = float(os.environ.get("SHOP_PAYMENTS_TIMEOUT", "2.0"))

# -- Celery -----------------------------------------------------------------------------
KEY_PREFIX = os.environ.get("SHOP_KEY_PREFIX", "shop")
CELERY_BROKER_URL = os.environ.get("SHOP_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # An ETA (retry countdown) held longer than this is delivered again by the Redis broker;
    # celery-resilience keeps every countdown below 90 % of it and parks longer delays.
    "visibility_timeout": 600,
    # Every broker key under the shop's prefix: a shared Redis stays tidy.
    "global_keyprefix": f"{KEY_PREFIX}:",
}
CELERY_RESULT_BACKEND = "django-db"  # django-celery-results: results (and PARKED) in the admin
CELERY_RESULT_EXTENDED = True  # task name, args and worker in each result row
CELERY_TASK_ACKS_LATE = True  # a message is acked after the task ran (or was parked)...
CELERY_TASK_REJECT_ON_WORKER_LOST = True  # ...and requeued if its worker child died
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_SEND_TASK_EVENTS = True  # Flower sees tasks, PARKED and replays
CELERY_TASK_SEND_SENT_EVENT = True

# Replay parked tasks every 2 s once the breaker admits calls. The same dict as
# Resilience.for_app(app).beat_schedule(every=2.0), written out so settings import nothing.
CELERY_BEAT_SCHEDULE = {
    "celery-resilience-drain": {
        "task": "celery_resilience.drain",
        "schedule": 2.0,
        "options": {"expires": 2.0},
    },
}

# -- celery-resilience (read as app.conf.resilience_*) -----------------------------------
if os.environ.get("SHOP_RESILIENCE_REDIS_URL"):
    CELERY_RESILIENCE_REDIS_URL = os.environ["SHOP_RESILIENCE_REDIS_URL"]
CELERY_RESILIENCE_KEY_PREFIX = KEY_PREFIX
CELERY_RESILIENCE_APP = "shop.celery:app"  # where the admin of parked tasks finds the app
CELERY_RESILIENCE_BREAKERS = {
    # Short timings so the demo shows a whole outage in seconds; a real gateway would have
    # open_timeout of 30 s or more.
    # max_concurrent_calls (SHOP_BULKHEAD, set by the demo's hang outage): a bulkhead across the
    # fleet. A hung gateway then holds at most that many pool slots; a charge that finds them
    # taken is parked at once and drained later. Set it above the calls a healthy gateway has
    # in flight, or healthy charges park too.
    "payments": {
        "failure_threshold": 5,
        "open_timeout": 3.0,
        "half_open_max_calls": 1,
        "max_concurrent_calls": int(os.environ.get("SHOP_BULKHEAD") or 0) or None,
    },
}
# Argument names whose values the admin, the CLI and the logs show as ***.
CELERY_RESILIENCE_SENSITIVE_KEYS = ["card_token"]
CELERY_RESILIENCE_DRAIN_RATE = 100.0  # parked tasks published per second once it is back
CELERY_RESILIENCE_DRAIN_BATCH = 50
