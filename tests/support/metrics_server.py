"""``celery resilience metrics`` as the tests run it: a real process serving the metrics page,
and what a scrape of it reads."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from .redis_server import free_port
from .worker_process import ROOT

PREFIX = "celery_resilience_"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(PREFIX):
                samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples


def collector_metric_names() -> set[str]:
    """Every metric name the collector exports (counters with their ``_total``)."""
    from celery import Celery

    from celery_resilience import Resilience
    from celery_resilience.metrics import ResilienceCollector

    app = Celery("docs-metrics", broker="memory://", set_as_current=False)
    app.conf.resilience_breakers = {"payments": {}}
    names = set()
    for family in ResilienceCollector(Resilience(app)).collect():
        names.add(f"{family.name}_total" if family.type == "counter" else family.name)
    return names


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((PREFIX + name, frozenset(labels.items())))


class MetricsServer:
    """``celery -A tests.apps.cliapp resilience metrics --port N`` in a subprocess."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        command = [
            sys.executable, "-m", "celery", "-A", "tests.apps.cliapp", "resilience", "metrics",
            "--port", str(self.port), "--addr", "127.0.0.1",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def scrape(self) -> Samples:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return parse(response.read().decode())

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                output = self.process.stdout.read().decode() if self.process.stdout else ""
                raise RuntimeError(f"metrics exited with {self.process.returncode}:\n{output}")
            with contextlib.suppress(OSError):
                self.scrape()
                return
            if time.monotonic() > deadline:
                raise TimeoutError("the metrics command does not answer")
            time.sleep(0.1)

    def output(self) -> str:
        """What the command printed (stdout and stderr), once it was stopped."""
        return self.process.stdout.read().decode() if self.process.stdout else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
