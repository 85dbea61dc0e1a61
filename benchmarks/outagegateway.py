"""The payment gateway of the outage benchmark (``outage.py``): a real HTTP service that can hang.

    python -m benchmarks.outagegateway [--port 0] [--control-port 0] [--latency 0.02]

It prints one JSON line with its two URLs, then serves until SIGTERM. Like the example
project's gateway, but with the outage a timeout-bound client fears most, and a log of every
request it received, by time:

* **API**: ``POST /charges`` with an ``Idempotency-Key`` header (the order id). In mode ``up``
  it waits ``--latency`` seconds (a gateway's own work), records the charge and answers 201.
  The gateway does not deduplicate: a key charged twice is in the log twice.
* **modes** (``POST /mode?to=...`` on the control port, which never goes down):
  ``hang`` reads the request and never answers, holding the connection until the client gives
  up (its timeout) and closes it; ``refuse`` closes the listening socket, so clients get
  *connection refused* and nothing reaches this process; ``503`` answers 503 at once;
  ``up`` serves again (on the same port).
* ``GET /log``: every request the API received, ``[time, key, outcome]`` with outcome
  ``charged``, ``hung`` or ``503`` (wall clock, comparable with the workers' on one host);
  ``POST /reset`` clears it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

MODES = ("up", "hang", "refuse", "503")
#: A hung request is held at most this long, should its client never give up.
HANG_LIMIT = 120.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # the API port is bound again after a "refuse" outage
    request_queue_size = 256
    gateway: Gateway


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"  # one request per connection, as the workers' client does

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log is the log

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _ApiHandler(_Handler):
    def do_POST(self) -> None:
        gateway = self.server.gateway
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = self.headers.get("Idempotency-Key", "")
        mode = gateway.mode
        if mode == "hang":
            gateway.log(key, "hung")
            self._hold()
        elif mode == "503":
            gateway.log(key, "503")
            self._reply(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "service unavailable"})
        else:
            time.sleep(gateway.latency)
            gateway.log(key, "charged")
            self._reply(HTTPStatus.CREATED, {"key": key})

    def _hold(self) -> None:
        """Answer nothing; return (closing the connection) once the client has closed it."""
        self.close_connection = True
        self.connection.settimeout(HANG_LIMIT)
        with contextlib.suppress(OSError):
            while self.connection.recv(4096):
                pass


class _ControlHandler(_Handler):
    def do_GET(self) -> None:
        if urlsplit(self.path).path == "/log":
            return self._reply(HTTPStatus.OK, self.server.gateway.entries())
        return self._reply(HTTPStatus.NOT_FOUND, {"error": "not found"})

    def do_POST(self) -> None:
        gateway = self.server.gateway
        url = urlsplit(self.path)
        if url.path == "/reset":
            gateway.reset()
        elif url.path == "/mode":
            mode = parse_qs(url.query).get("to", [""])[0]
            if mode not in MODES:
                return self._reply(HTTPStatus.BAD_REQUEST, {"error": f"to: one of {MODES}"})
            gateway.switch(mode)
        else:
            return self._reply(HTTPStatus.NOT_FOUND, {"error": "not found"})
        return self._reply(HTTPStatus.OK, {"mode": gateway.mode})


class Gateway:
    """The mode, the request log and the two listeners, served from daemon threads."""

    def __init__(self, host: str, port: int, control_port: int, latency: float) -> None:
        self.host, self.port, self.control_port = host, port, control_port
        self.latency = latency
        self.mode = "up"
        self._log: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        self._api: _Server | None = None
        self._control: _Server | None = None

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

    def switch(self, mode: str) -> None:
        with self._lock:
            if mode == "refuse" and self._api is not None:
                self._api.shutdown()
                self._api.server_close()  # from now on: connection refused
                self._api = None
            elif mode != "refuse" and self._api is None:
                self._api = self._serve(_ApiHandler, self.port)
            self.mode = mode

    def log(self, key: str, outcome: str) -> None:
        with self._lock:
            self._log.append((time.time(), key, outcome))

    def entries(self) -> list[tuple[float, str, str]]:
        with self._lock:
            return list(self._log)

    def reset(self) -> None:
        with self._lock:
            self._log.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="API port (0: any free one)")
    parser.add_argument("--control-port", type=int, default=0, help="control port (0: any)")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds per charge")
    args = parser.parse_args(argv)
    gateway = Gateway(args.host, args.port, args.control_port, args.latency).start()
    urls = {"api": f"http://{args.host}:{gateway.port}"}
    urls["control"] = f"http://{args.host}:{gateway.control_port}"
    print(json.dumps(urls), flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    gateway.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
