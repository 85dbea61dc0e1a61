"""One breaker's settings: :class:`BreakerConfig`, read from ``resilience_breaker_defaults``
and each entry of ``resilience_breakers`` (a dict of options, over the defaults)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError
from .values import _bad, _integer, _optional, _positive, _rate, exception_types


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
    ignore: tuple[type[BaseException], ...] = ()

    @property
    def max_open_timeout(self) -> float:
        """The ceiling of the open timeout's growth on repeated trips (no growth when unset)."""
        return self.open_timeout if self.open_timeout_max is None else self.open_timeout_max


def _breaker_config(setting: str, options: Any, base: BreakerConfig) -> BreakerConfig:
    if not isinstance(options, Mapping):
        raise _bad(setting, options, "a dict of breaker options")
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
        failure_threshold=_integer(at("failure_threshold"), values["failure_threshold"]),
        failure_rate_threshold=_optional(
            _rate, at("failure_rate_threshold"), values["failure_rate_threshold"]
        ),
        minimum_calls=_integer(at("minimum_calls"), values["minimum_calls"]),
        window=_positive(at("window"), values["window"]),
        slow_call_seconds=_optional(
            _positive, at("slow_call_seconds"), values["slow_call_seconds"]
        ),
        open_timeout=_positive(at("open_timeout"), values["open_timeout"]),
        open_timeout_max=_optional(_positive, at("open_timeout_max"), values["open_timeout_max"]),
        half_open_max_calls=_integer(at("half_open_max_calls"), values["half_open_max_calls"]),
        probe_lease=_positive(at("probe_lease"), values["probe_lease"]),
        max_concurrent_calls=_optional(
            _integer, at("max_concurrent_calls"), values["max_concurrent_calls"]
        ),
        call_lease=_positive(at("call_lease"), values["call_lease"]),
        ignore=exception_types(setting, "ignore", values["ignore"]),
    )
    if cfg.open_timeout_max is not None and cfg.open_timeout_max < cfg.open_timeout:
        raise _bad(
            at("open_timeout_max"), cfg.open_timeout_max, f">= open_timeout ({cfg.open_timeout})"
        )
    return cfg
