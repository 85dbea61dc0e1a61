"""One breaker's settings: :class:`BreakerConfig`, read from ``resilience_breaker_defaults``
and each entry of ``resilience_breakers`` (a dict of options, over the defaults)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError
from .values import (
    call_rate,
    calls_per_second,
    exception_types,
    integer,
    invalid,
    non_negative,
    optional,
    positive,
    rate,
    share,
)


@dataclass(frozen=True)
class BreakerConfig:
    """One breaker's settings; durations are seconds (float)."""

    failure_threshold: int = 5
    failure_rate_threshold: float | None = None
    minimum_calls: int = 10
    window: float = 60.0
    slow_call_seconds: float | None = None
    open_timeout: float = 30.0
    open_timeout_max: float | None = None
    half_open_max_calls: int = 1
    probe_lease: float = 60.0
    max_concurrent_calls: int | None = None
    call_lease: float = 60.0
    #: Derived breakers (named at call time, ``<name>:<key>``) unwritten for this long leave no
    #: keys behind.
    idle_timeout: float = 3600.0
    ignore: tuple[type[BaseException], ...] = ()
    #: The retry budget: retries of the breaker's tasks, fleet-wide, may add at most this share
    #: of its first attempts over ``window``, plus ``min_retries_per_second``; ``None``: off.
    retry_budget: float | None = None
    min_retries_per_second: float = 10.0
    #: Calls through the breaker, fleet-wide, as Celery writes a rate (``"100/s"``, ``"20/m"``,
    #: ``"500/h"``); ``None``: off.
    rate_limit: str | None = None

    @property
    def max_open_timeout(self) -> float:
        """The ceiling of the open timeout's growth on repeated trips (no growth when unset)."""
        return self.open_timeout if self.open_timeout_max is None else self.open_timeout_max

    @property
    def rate_per_second(self) -> float | None:
        """``rate_limit`` in calls per second (``None``: no rate limit)."""
        return None if self.rate_limit is None else calls_per_second(self.rate_limit)


def breaker_config(setting: str, options: Any, base: BreakerConfig) -> BreakerConfig:
    if not isinstance(options, Mapping):
        raise invalid(setting, options, "a dict of breaker options")
    known = BreakerConfig.__dataclass_fields__
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigurationError(
            f"{setting}: unknown option {unknown[0]!r} (known: {', '.join(sorted(known))})"
        )
    values = {name: getattr(base, name) for name in known}
    values.update(options)

    def at(option: str) -> str:
        return f"{setting}[{option!r}]"

    cfg = BreakerConfig(
        failure_threshold=integer(at("failure_threshold"), values["failure_threshold"]),
        failure_rate_threshold=optional(
            rate, at("failure_rate_threshold"), values["failure_rate_threshold"]
        ),
        minimum_calls=integer(at("minimum_calls"), values["minimum_calls"]),
        window=positive(at("window"), values["window"]),
        slow_call_seconds=optional(positive, at("slow_call_seconds"), values["slow_call_seconds"]),
        open_timeout=positive(at("open_timeout"), values["open_timeout"]),
        open_timeout_max=optional(positive, at("open_timeout_max"), values["open_timeout_max"]),
        half_open_max_calls=integer(at("half_open_max_calls"), values["half_open_max_calls"]),
        probe_lease=positive(at("probe_lease"), values["probe_lease"]),
        max_concurrent_calls=optional(
            integer, at("max_concurrent_calls"), values["max_concurrent_calls"]
        ),
        call_lease=positive(at("call_lease"), values["call_lease"]),
        idle_timeout=positive(at("idle_timeout"), values["idle_timeout"]),
        ignore=exception_types(setting, "ignore", values["ignore"]),
        retry_budget=optional(share, at("retry_budget"), values["retry_budget"]),
        min_retries_per_second=non_negative(
            at("min_retries_per_second"), values["min_retries_per_second"]
        ),
        rate_limit=optional(call_rate, at("rate_limit"), values["rate_limit"]),
    )
    if cfg.open_timeout_max is not None and cfg.open_timeout_max < cfg.open_timeout:
        raise invalid(
            at("open_timeout_max"), cfg.open_timeout_max, f">= open_timeout ({cfg.open_timeout})"
        )
    # An open derived breaker must reach half-open (a probe's write keeps it) before it can
    # be forgotten, and its window must fit in its life.
    floor = max(cfg.max_open_timeout, cfg.window, cfg.probe_lease, cfg.call_lease)
    if cfg.idle_timeout <= floor:
        raise invalid(
            at("idle_timeout"),
            cfg.idle_timeout,
            f"longer than open_timeout_max, window, probe_lease and call_lease ({floor:g}s)",
        )
    return cfg


def derived_name(breakers: Mapping[str, BreakerConfig], base: str, key: str) -> str:
    """The name of the breaker derived from declared breaker ``base`` for ``key`` (a host, a
    tenant): ``<base>:<key>``. ``ConfigurationError`` if ``base`` is not declared or ``key`` is
    unusable (empty, over 200 characters, or braces, which would break Redis Cluster's tags)."""
    if base not in breakers:
        raise ConfigurationError(
            f"breaker {base!r} is not in resilience_breakers: a breaker named at call time "
            "takes its settings from a declared one"
        )
    if not isinstance(key, str) or not key or len(key) > 200 or "{" in key or "}" in key:
        raise ConfigurationError(
            f"breaker key {key!r} for {base!r} must be a non-empty string of at most 200 "
            "characters, without braces"
        )
    return f"{base}:{key}"
