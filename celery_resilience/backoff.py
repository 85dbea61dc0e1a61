"""Retry delays: small, pure strategies mapping a retry attempt to a delay in seconds.

Attempt 0 is the delay before the first retry. Every strategy is a pure function of the attempt
(plus its random source): a Celery retry is a new message, so nothing may be carried between
calls. Durations are seconds (float); ``datetime.timedelta`` is accepted and converted.

Pick :class:`Exponential` (full jitter) by default, :class:`DecorrelatedJitter` when every retry
must wait at least ``base``, and :class:`Constant` when the remote side dictates a fixed pause.
Any ``Callable[[int], float]`` is a strategy too, so a strategy of one's own can wrap these
(``lambda attempt: min(60.0, Exponential()(attempt) + 1.0)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from random import random as _default_random
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from .errors import ConfigurationError

Jitter = Literal["full", "equal"]
RandomSource = Callable[[], float]
_JITTERS = ("full", "equal", None)


@runtime_checkable
class BackoffStrategy(Protocol):
    """A retry attempt (0-based) -> a delay in seconds: any such callable is a strategy, a plain
    function or lambda included, so strategies compose as functions do."""

    def __call__(self, attempt: int) -> float: ...


@runtime_checkable
class Bounded(Protocol):
    """A strategy that knows its longest delay (the ones here do): the start-up check warns
    when it is longer than ``resilience_max_countdown`` (such retries are parked instead)."""

    def __call__(self, attempt: int) -> float: ...

    def max_delay(self) -> float:
        """The largest delay this strategy can return (seconds)."""
        ...


def max_delay(strategy: BackoffStrategy) -> float | None:
    """The strategy's longest delay, or ``None`` if it does not say (a plain function)."""
    return strategy.max_delay() if isinstance(strategy, Bounded) else None


def _set_seconds(owner: object, name: str, ok: Callable[[float], bool], rule: str) -> float:
    """Convert field ``name`` to float seconds in place; raise unless it is finite and ``ok``."""
    value = getattr(owner, name)
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        seconds = math.nan  # not a duration: rejected below
    if not (math.isfinite(seconds) and ok(seconds)):
        raise ConfigurationError(
            f"{type(owner).__name__}.{name} must be a finite number {rule}, got {value!r}"
        )
    object.__setattr__(owner, name, seconds)
    return seconds


def _check_base_cap(owner: object) -> None:
    base = _set_seconds(owner, "base", lambda s: s > 0, "> 0")
    _set_seconds(owner, "cap", lambda s: s >= base, f">= base ({base})")


def _check_jitter(owner: object, jitter: object) -> None:
    if jitter not in _JITTERS:
        raise ConfigurationError(
            f"{type(owner).__name__}.jitter must be 'full', 'equal' or None, got {jitter!r}"
        )


def _check_attempt(attempt: int) -> None:
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt!r}")


def _jittered(raw: float, jitter: Jitter | None, random: RandomSource | None) -> float:
    if jitter is None:
        return raw
    draw = (random or _default_random)()
    if jitter == "full":
        return raw * draw
    half = raw / 2
    return half + half * draw


@dataclass(frozen=True)
class Exponential:
    """``base * 2**attempt`` capped at ``cap``, jittered: the default for transient failures.

    ``"full"`` jitter (uniform over ``[0, raw]``, AWS's recommendation) spreads a herd of
    retrying tasks best; ``"equal"`` keeps at least half the delay; ``None`` is deterministic.
    """

    base: float = 1.0
    cap: float = 300.0
    jitter: Jitter | None = "full"
    random: RandomSource | None = field(default=None, compare=False, repr=False)

    if TYPE_CHECKING:

        def __init__(
            self,
            base: float | timedelta = 1.0,
            cap: float | timedelta = 300.0,
            jitter: Jitter | None = "full",
            random: RandomSource | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        _check_base_cap(self)
        _check_jitter(self, self.jitter)

    def __call__(self, attempt: int) -> float:
        _check_attempt(attempt)
        try:
            raw = min(self.cap, math.ldexp(self.base, attempt))  # exact base * 2**attempt
        except OverflowError:
            raw = self.cap
        return _jittered(raw, self.jitter, self.random)

    def max_delay(self) -> float:
        """The longest delay this strategy can return (seconds)."""
        return self.cap


@dataclass(frozen=True)
class Constant:
    """The same ``delay`` every attempt: for a known pause (a rate-limit window, a restart)."""

    delay: float
    jitter: Jitter | None = None
    random: RandomSource | None = field(default=None, compare=False, repr=False)

    if TYPE_CHECKING:

        def __init__(
            self,
            delay: float | timedelta,
            jitter: Jitter | None = None,
            random: RandomSource | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        _set_seconds(self, "delay", lambda s: s >= 0, ">= 0")
        _check_jitter(self, self.jitter)

    def __call__(self, attempt: int) -> float:
        _check_attempt(attempt)
        return _jittered(self.delay, self.jitter, self.random)

    def max_delay(self) -> float:
        """The longest delay this strategy can return (seconds)."""
        return self.delay


@dataclass(frozen=True)
class DecorrelatedJitter:
    """AWS "decorrelated jitter" in stateless form: uniform over ``[base, min(cap, base * 3**n)]``.

    AWS draws ``min(cap, uniform(base, 3 * previous_sleep))``, which needs the previous sleep;
    here the previous sleep is replaced by its largest possible value, so the delay depends on
    the attempt alone. Pick it over :class:`Exponential` for a floor of ``base`` and a ramp of
    3x per attempt rather than 2x.
    """

    base: float = 1.0
    cap: float = 300.0
    random: RandomSource | None = field(default=None, compare=False, repr=False)

    if TYPE_CHECKING:

        def __init__(
            self,
            base: float | timedelta = 1.0,
            cap: float | timedelta = 300.0,
            random: RandomSource | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        _check_base_cap(self)

    def __call__(self, attempt: int) -> float:
        _check_attempt(attempt)
        try:
            upper = min(self.cap, self.base * 3.0**attempt)
        except OverflowError:  # 3.0**attempt > 1e308: past any sensible cap
            upper = self.cap
        draw = (self.random or _default_random)()
        return min(upper, self.base + (upper - self.base) * draw)

    def max_delay(self) -> float:
        """The longest delay this strategy can return (seconds)."""
        return self.cap


# -- what a failure says of its own retry -----------------------------------------------------
#: Of a Retry-After, the share a retry's jitter may add on top (``at_least``): tasks told the
#: same time spread over a tenth of it instead of all coming back at once.
RETRY_AFTER_SPREAD = 0.1


def retry_after(exc: BaseException | None, now: float) -> float | None:
    """The least delay (seconds) before the call that raised ``exc`` may be made again, if it
    says one: its ``retry_after`` attribute (seconds, a ``timedelta`` or an aware
    ``datetime``), else the ``Retry-After`` header (seconds or an HTTP-date) of its
    ``response`` (``requests.HTTPError``, ``httpx.HTTPStatusError``: read by duck typing,
    neither library imported). ``now`` is epoch seconds, for a date. ``None`` when it says
    nothing readable (a naive datetime, a negative or non-finite number, a malformed header);
    a date already past is 0."""
    if exc is None:
        return None
    value: Any = getattr(exc, "retry_after", None)
    if value is None:
        try:
            value = exc.response.headers.get("Retry-After")  # type: ignore[attr-defined]
        except Exception:  # no response, no headers: nothing said
            return None
    return _seconds(value, now)


def _seconds(value: Any, now: float) -> float | None:
    if isinstance(value, (bytes, str)):
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        text = text.strip()
        if text.isdigit():
            value = int(text)
        else:
            try:
                value = parsedate_to_datetime(text)
            except (TypeError, ValueError, IndexError):
                return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            return None  # a naive time names no moment
        return max(0.0, value.timestamp() - now)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def at_least(least: float | None, drawn: float) -> float:
    """A retry's countdown when the failure asked for ``least`` seconds and the backoff drew
    ``drawn``: never less than ``least``, the draw's jitter only adding (up to
    ``RETRY_AFTER_SPREAD`` of ``least``), and the backoff itself when it is longer."""
    if least is None:
        return drawn
    if drawn >= least:
        return drawn
    return least + min(drawn, least * RETRY_AFTER_SPREAD)
