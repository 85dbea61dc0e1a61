"""Tracing's port: what the package's steps tell a tracer when tracing is on.

A step holds no tracer of its own. ``Runtime.tracing`` is ``None`` unless tracing was turned on
(``resilience_tracing``, or the ``trace`` function of the ``opentelemetry`` extra); each step
reads it once and, when it is ``None``, goes its way as before: a task through a closed breaker
pays one attribute read. Each method runs the step it is given inside a span of its own and
returns what the step returned; the one implementation is the extra's, in ``contrib/``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from .backout.entry import ParkedTask, Reason
from .breaker.permit import Admission

T = TypeVar("T")


class Tracing(Protocol):
    """The spans and events of one app's steps."""

    def admission(
        self,
        task_name: str,
        task_id: str,
        breaker: str | None,
        parked_span: str | None,
        admit: Callable[[], Admission],
    ) -> Admission:
        """The breaker's decision for a delivery (``parked_span``: the ``traceparent`` of the
        span that parked it, when it is a replay)."""

    def park(
        self,
        task_name: str,
        task_id: str,
        breaker: str | None,
        reason: Reason,
        store: Callable[[str | None], ParkedTask],
    ) -> ParkedTask:
        """A delivery parked: ``store`` is given the ``traceparent`` of the park's span, to
        keep in the entry, and stores it."""

    def replay(self, entry: ParkedTask, publish: Callable[[], None]) -> None:
        """A parked entry published again; its span links to the span that parked it."""

    def drain(
        self, kind: str, run: Callable[[], T], figures: Callable[[T], Mapping[str, int]]
    ) -> T:
        """One drain run (``kind``: ``pass`` for beat's, ``run`` for everything due);
        ``figures`` of its report become the span's attributes."""

    def transition(self, breaker: str, transition: str, state: str) -> None:
        """A transition this process made: an event on its current span."""
