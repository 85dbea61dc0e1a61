"""A small payment gateway: a real HTTP service on a loopback port, with an outage switch.

Two listeners:

* the **API** (``POST /charges``, JSON ``{"order_id": ..., "amount": ...}`` and an
  ``Idempotency-Key`` header): each accepted request is recorded in the ledger under its key.
  The gateway does *not* deduplicate: a key charged twice shows up twice in the ledger, which is
  how the demo tells "charged exactly once" from "charged twice".
* the **control** port, which stays up during an outage: ``POST /down`` (``?mode=refuse``, the
  default, ``?mode=503`` or ``?mode=hang``), ``POST /up``, ``GET /ledger``, ``GET /health``.

"Down" closes the API's listening socket, so callers get *connection refused*: what a client
sees when the gateway process crashed, is being redeployed, or its host is gone, the most
common outage of a dependency, and one the client learns about at once (no timeout to wait
for). ``mode=503`` keeps the socket and answers ``503 Service Unavailable`` instead, as a load
balancer in front of a dead backend does. ``mode=hang`` accepts every connection and never
answers (the commonest real outage, and the costliest: each caller waits for its own timeout);
a hung request is dropped unanswered, uncharged, when the gateway comes back. Requests already
being served when it goes down still finish (as with a real process that drains its connections).

Run it alone with ``python gateway.py --port 8099 --control-port 8098``; it prints one JSON
line with both URLs, then serves until SIGTERM or Ctrl-C. ``Gateway`` runs it in a thread
(the example's tests do).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections import Counter
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

MODES = ("refuse", "503", "hang")
#: The longest a hung request is held (seconds), whatever the outage's length.
HANG_CAP = 120.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # the API port is bound again after each outage
    request_queue_size = 128
    gateway: Gateway


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"  # one request per connection: simple and outage-friendly

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the ledger is the log

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            data = json.loads(raw)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}


class _ApiHandler(_Handler):
    def do_POST(self) -> None:
        gateway = self.server.gateway
        if urlsplit(self.path).path != "/charges":
            return self._reply(HTTPStatus.NOT_FOUND, {"error": "not found"})
        body = self._body()
        key = self.headers.get("Idempotency-Key") or str(body.get("order_id") or "")
        amount = body.get("amount")
        if not key or not isinstance(amount, (int, float, str)):
            return self._reply(HTTPStatus.BAD_REQUEST, {"error": "order_id and amount needed"})
        if gateway.latency:
            time.sleep(gateway.latency)
        if gateway.mode == "hang":
            gateway.count("hung")
            gateway.wait_until_up(HANG_CAP)
            self.close_connection = True  # dropped unanswered: the caller timed out long ago
            return None
        if gateway.mode == "503":
            gateway.count("unavailable")
            return self._reply(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "service unavailable"})
        if str(amount).startswith("-"):
            return self._reply(HTTPStatus.PAYMENT_REQUIRED, {"error": "card declined"})
        times = gateway.record(key)
        return self._reply(
            HTTPStatus.CREATED, {"charge_id": f"ch_{key}_{times}", "key": key, "times": times}
        )


class _ControlHandler(_Handler):
    def do_GET(self) -> None:
        gateway = self.server.gateway
        path = urlsplit(self.path).path
        if path == "/ledger":
            return self._reply(HTTPStatus.OK, gateway.ledger())
        if path == "/health":
            return self._reply(HTTPStatus.OK, {"up": gateway.is_up, "mode": gateway.mode})
        return self._reply(HTTPStatus.NOT_FOUND, {"error": "not found"})

    def do_POST(self) -> None:
        gateway = self.server.gateway
        url = urlsplit(self.path)
        if url.path == "/down":
            mode = parse_qs(url.query).get("mode", ["refuse"])[0]
            if mode not in MODES:
                return self._reply(HTTPStatus.BAD_REQUEST, {"error": f"mode: one of {MODES}"})
            gateway.down(mode)
        elif url.path == "/up":
            gateway.up()
        else:
            return self._reply(HTTPStatus.NOT_FOUND, {"error": "not found"})
        return self._reply(HTTPStatus.OK, {"up": gateway.is_up, "mode": gateway.mode})


class Gateway:
    """The gateway's state and its two listeners, served from daemon threads."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, control_port: int = 0, latency: float = 0.0
    ) -> None:
        self.host, self.port, self.control_port = host, port, control_port
        self.latency = latency
        #: None (up), "refuse" (listening socket closed) or "503".
        self.mode: str | None = None
        self._charges: Counter[str] = Counter()
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._up = threading.Event()
        self._up.set()
        self._api: _Server | None = None
        self._control: _Server | None = None

    # -- listeners ------------------------------------------------------------------------
    def _serve(self, handler: type[_Handler], port: int) -> _Server:
        server = _Server((self.host, port), handler)
        server.gateway = self
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        return server

    def start(self) -> Gateway:
        self._api = self._serve(_ApiHandler, self.port)
        self.port = self._api.server_address[1]
        self._control = self._serve(_ControlHandler, self.control_port)
        self.control_port = self._control.server_address[1]
        return self

    def stop(self) -> None:
        for server in (self._api, self._control):
            if server is not None:
                server.shutdown()
                server.server_close()
        self._api = self._control = None

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def control_url(self) -> str:
        return f"http://{self.host}:{self.control_port}"

    # -- the outage switch ----------------------------------------------------------------
    @property
    def is_up(self) -> bool:
        return self.mode is None

    def down(self, mode: str = "refuse") -> None:
        with self._lock:
            if mode == "refuse" and self._api is not None:
                self._api.shutdown()
                self._api.server_close()  # from now on: connection refused
                self._api = None
            self.mode = mode
            self._up.clear()

    def up(self) -> None:
        with self._lock:
            if self._api is None:
                self._api = self._serve(_ApiHandler, self.port)  # the same port as before
            self.mode = None
            self._up.set()

    def wait_until_up(self, timeout: float) -> None:
        """Hold a hung request until the outage ends (at most ``timeout`` seconds)."""
        self._up.wait(timeout)

    # -- the ledger -----------------------------------------------------------------------
    def record(self, key: str) -> int:
        with self._lock:
            self._charges[key] += 1
            self._counts["charges"] += 1
            return self._charges[key]

    def count(self, what: str) -> None:
        with self._lock:
            self._counts[what] += 1

    def ledger(self) -> dict[str, Any]:
        """``charges``: idempotency key -> times charged; ``counts``: totals."""
        with self._lock:
            return {"charges": dict(self._charges), "counts": dict(self._counts)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099, help="API port (0: any free one)")
    parser.add_argument("--control-port", type=int, default=8098, help="control port (0: any)")
    parser.add_argument("--latency", type=float, default=0.005, help="seconds per charge")
    args = parser.parse_args(argv)
    gateway = Gateway(args.host, args.port, args.control_port, args.latency).start()
    print(json.dumps({"api": gateway.api_url, "control": gateway.control_url}), flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    gateway.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
