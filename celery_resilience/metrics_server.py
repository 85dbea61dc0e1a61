"""The HTTP server of ``celery resilience metrics``: ``/metrics`` and ``/healthz``.

``/healthz`` answers 200 while the process serves and Redis answers a PING, and 503 with a
one-line reason while Redis does not. It never looks at a breaker: an open breaker is the
package doing its work (tasks park), and a probe that failed on it would take the pods out
with the dependency (spring-projects/spring-boot#15479). Any other path is a 404.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis

from .errors import ResilienceError
from .redact import get_logger, redact
from .runtime import Runtime

logger = get_logger("celery_resilience.metrics")

METRICS_PATH = "/metrics"
HEALTH_PATH = "/healthz"

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def health(runtime: Runtime) -> tuple[bool, str]:
    """Whether this process can reach its Redis (one PING), and a line that says so."""
    if runtime.config.in_memory:
        return True, "ok: memory://, no Redis to reach"
    try:
        runtime.redis.ping()
    except (ResilienceError, redis.RedisError, OSError) as exc:
        return False, redact(f"redis unreachable: {type(exc).__name__}: {exc}")
    return True, "ok"


WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def make_app(runtime: Runtime, metrics: WSGIApp) -> WSGIApp:
    """A WSGI application: ``metrics`` (the metrics page) at ``/metrics``, the health probe,
    and 404 for the rest."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == METRICS_PATH:
            return metrics(environ, start_response)
        if path == HEALTH_PATH:
            ok, line = health(runtime)
            if not ok:
                logger.warning("Health: %s", line)
            status = "200 OK" if ok else "503 Service Unavailable"
            return _text(start_response, status, line)
        return _text(start_response, "404 Not Found", f"not found: try {METRICS_PATH}")

    return app


def _text(start_response: StartResponse, status: str, line: str) -> list[bytes]:
    body = f"{line}\n".encode()
    start_response(
        status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
    )
    return [body]


class _Server(ThreadingMixIn, WSGIServer):
    """One thread a request: a slow PING never holds a scrape."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes every few seconds: no access log."""


def serve(
    runtime: Runtime, metrics: WSGIApp, port: int, addr: str = "127.0.0.1"
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics`` and ``/healthz`` on ``addr:port`` in a background thread;
    ``server.shutdown()`` stops it."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    server_class = type("_Server", (_Server,), {"address_family": family})
    server: WSGIServer = make_server(
        addr, port, make_app(runtime, metrics), server_class, _QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="resilience-metrics", daemon=True)
    thread.start()
    return server, thread
