"""Spans a ``celery worker`` of ``tests/apps/otelapp.py`` (or ``otelceleryapp.py``) wrote to its
JSON-lines file, as the SDK's ``ReadableSpan.to_json`` writes each one, read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def worker_spans(path: Path) -> list[dict[str, Any]]:
    """The spans written to ``path`` so far, in the order they ended."""
    if not path.exists():
        return []
    # Whole lines only: a pool child may be writing the last one as it is read.
    whole = path.read_text().split("\n")[:-1]
    return [json.loads(line) for line in whole if line]


def of_task(spans: list[dict[str, Any]], name: str, task_id: str) -> list[dict[str, Any]]:
    """The spans named ``name`` of task ``task_id``."""
    return [
        s
        for s in spans
        if s["name"] == name and s["attributes"].get("resilience.task_id") == task_id
    ]


def ids(span: dict[str, Any]) -> tuple[int, int]:
    """(trace id, span id) of a span as the SDK writes it in JSON."""
    return int(span["context"]["trace_id"], 16), int(span["context"]["span_id"], 16)
