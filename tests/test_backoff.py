"""Retry-delay strategies: bounds for every attempt, jitter distributions, validation."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from datetime import timedelta
from fractions import Fraction
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from celery_resilience.backoff import (
    BackoffStrategy,
    Bounded,
    Constant,
    DecorrelatedJitter,
    Exponential,
)
from celery_resilience.errors import ConfigurationError

pytestmark = pytest.mark.unit

attempts = st.integers(min_value=0, max_value=10_000)
bases = st.floats(min_value=1e-3, max_value=1e3)
cap_factors = st.floats(min_value=1.0, max_value=1e4)
draws = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


def exact_raw(base: float, cap: float, attempt: int, factor: int = 2) -> float:
    """``min(cap, base * factor**attempt)`` computed exactly, as the oracle."""
    return float(min(Fraction(cap), Fraction(base) * factor**attempt))


def fixed(value: float) -> Callable[[], float]:
    return lambda: value


@pytest.fixture
def seeded_default_random() -> Iterator[None]:
    """Seed the global source (the strategies' default) so the KS tests are reproducible."""
    state = random.getstate()
    random.seed(20240611)
    yield
    random.setstate(state)


# Bounds, for every attempt


@given(attempt=attempts, base=bases, factor=cap_factors, u=draws)
def test_full_jitter_stays_between_zero_and_the_capped_exponential(
    attempt: int, base: float, factor: float, u: float
) -> None:
    cap = base * factor
    delay = Exponential(base=base, cap=cap, jitter="full", random=fixed(u))(attempt)
    assert 0.0 <= delay <= exact_raw(base, cap, attempt) <= cap


@given(attempt=attempts, base=bases, factor=cap_factors, u=draws)
def test_equal_jitter_keeps_at_least_half_the_capped_exponential(
    attempt: int, base: float, factor: float, u: float
) -> None:
    cap = base * factor
    raw = exact_raw(base, cap, attempt)
    delay = Exponential(base=base, cap=cap, jitter="equal", random=fixed(u))(attempt)
    assert raw / 2 <= delay <= raw


@given(attempt=attempts, base=bases, factor=cap_factors)
def test_no_jitter_is_exactly_the_capped_exponential(
    attempt: int, base: float, factor: float
) -> None:
    cap = base * factor
    assert Exponential(base=base, cap=cap, jitter=None)(attempt) == exact_raw(base, cap, attempt)


@given(attempt=attempts, base=bases, factor=cap_factors, u=draws)
def test_decorrelated_jitter_stays_between_base_and_capped_triple(
    attempt: int, base: float, factor: float, u: float
) -> None:
    cap = base * factor
    delay = DecorrelatedJitter(base=base, cap=cap, random=fixed(u))(attempt)
    upper = exact_raw(base, cap, attempt, factor=3)
    assert base <= delay <= min(cap, upper * (1 + 1e-12))  # base * 3.0**n rounds twice


@given(attempt=attempts, u=draws)
def test_every_delay_is_within_max_delay(attempt: int, u: float) -> None:
    strategies: list[Bounded] = [
        Exponential(base=0.5, cap=60, random=fixed(u)),
        Exponential(base=0.5, cap=60, jitter="equal", random=fixed(u)),
        DecorrelatedJitter(base=0.5, cap=60, random=fixed(u)),
        Constant(7.5, jitter="full", random=fixed(u)),
    ]
    for strategy in strategies:
        assert 0.0 <= strategy(attempt) <= strategy.max_delay()


@pytest.mark.parametrize("attempt", [1_000, 10**6, 10**18])
def test_huge_attempts_return_the_cap_without_overflow(attempt: int) -> None:
    assert Exponential(base=1, cap=300, jitter=None)(attempt) == 300.0
    assert DecorrelatedJitter(base=1, cap=300, random=fixed(0.999999))(attempt) <= 300.0
    assert 0.0 <= Exponential(base=1, cap=300)(attempt) <= 300.0


def test_tiny_base_is_not_capped_early_by_an_overflowing_power() -> None:
    # 2.0**1100 overflows a float, yet 1e-300 * 2**1100 is only about 1.4e31.
    delay = Exponential(base=1e-300, cap=1e308, jitter=None)(1100)
    assert delay == exact_raw(1e-300, 1e308, 1100)


# Jitter distributions


@pytest.mark.usefixtures("seeded_default_random")
def test_full_jitter_with_the_default_source_is_uniform_over_zero_to_raw() -> None:
    strategy = Exponential(base=1, cap=300, jitter="full")
    samples = [strategy(3) for _ in range(5000)]
    assert stats.kstest(samples, "uniform", args=(0.0, 8.0)).pvalue > 0.001


@pytest.mark.usefixtures("seeded_default_random")
def test_equal_jitter_with_the_default_source_is_uniform_over_the_upper_half() -> None:
    strategy = Exponential(base=1, cap=300, jitter="equal")
    samples = [strategy(3) for _ in range(5000)]
    assert stats.kstest(samples, "uniform", args=(4.0, 4.0)).pvalue > 0.001


def test_the_uniformity_check_rejects_a_biased_source() -> None:
    rng = random.Random(7)
    strategy = Exponential(base=1, cap=300, jitter="full", random=lambda: rng.random() ** 2)
    samples = [strategy(3) for _ in range(5000)]
    assert stats.kstest(samples, "uniform", args=(0.0, 8.0)).pvalue < 0.001


# Injectable random source


@pytest.mark.parametrize(
    ("strategy", "lowest", "highest"),
    [
        (Exponential(base=1, cap=300, jitter="full"), 0.0, 8.0),
        (Exponential(base=1, cap=300, jitter="equal"), 4.0, 8.0),
        (DecorrelatedJitter(base=1, cap=300), 1.0, 27.0),
        (Constant(10, jitter="full"), 0.0, 10.0),
        (Constant(10, jitter="equal"), 5.0, 10.0),
    ],
    ids=repr,
)
def test_an_injected_source_reaches_both_ends_of_the_range(
    strategy: Any, lowest: float, highest: float
) -> None:
    at_zero = dataclasses.replace(strategy, random=fixed(0.0))(3)
    near_one = dataclasses.replace(strategy, random=fixed(0.999999))(3)
    assert at_zero == lowest
    assert highest * 0.9999 < near_one <= highest


def test_decorrelated_jitter_is_a_pure_function_of_the_attempt() -> None:
    strategy = DecorrelatedJitter(base=1, cap=300, random=fixed(0.5))
    forwards = [strategy(n) for n in range(8)]
    backwards = [strategy(n) for n in reversed(range(8))][::-1]
    assert forwards == backwards
    assert forwards[:3] == [1.0, 2.0, 5.0]  # base + (min(cap, 3**n) - base) / 2


def test_the_random_source_is_left_out_of_equality_and_repr() -> None:
    strategy = Exponential(base=2, random=fixed(0.5))
    assert strategy == Exponential(base=2)
    assert "random" not in repr(strategy)


# Constant, timedelta, protocol


def test_constant_without_jitter_always_returns_the_delay() -> None:
    strategy = Constant(12.5)
    assert [strategy(n) for n in (0, 1, 50, 10**6)] == [12.5] * 4
    assert strategy.max_delay() == 12.5


def test_timedelta_durations_become_float_seconds() -> None:
    exponential = Exponential(base=timedelta(milliseconds=500), cap=timedelta(minutes=2))
    decorrelated = DecorrelatedJitter(base=timedelta(seconds=1), cap=timedelta(hours=1))
    constant = Constant(timedelta(seconds=3))
    assert (exponential.base, exponential.cap) == (0.5, 120.0)
    assert (decorrelated.base, decorrelated.cap) == (1.0, 3600.0)
    assert constant.delay == 3.0
    assert isinstance(exponential.base, float)
    assert exponential == Exponential(base=0.5, cap=120.0)


def test_every_strategy_satisfies_the_protocol_and_is_frozen() -> None:
    for strategy in (Exponential(), Constant(1), DecorrelatedJitter()):
        assert isinstance(strategy, BackoffStrategy)
        with pytest.raises(dataclasses.FrozenInstanceError):
            strategy.cap = 1.0  # type: ignore[misc,union-attr]


# Validation


@pytest.mark.parametrize(
    ("build", "name", "shown"),
    [
        (lambda: Exponential(base=-1), "Exponential.base", "-1"),
        (lambda: Exponential(base=0), "Exponential.base", "0"),
        (lambda: Exponential(base=float("nan")), "Exponential.base", "nan"),
        (lambda: Exponential(base=timedelta(0)), "Exponential.base", "datetime.timedelta(0)"),
        (lambda: Exponential(base=2, cap=1), "Exponential.cap", "1"),
        (lambda: Exponential(cap=float("inf")), "Exponential.cap", "inf"),
        (lambda: Exponential(jitter=cast(Any, "half")), "Exponential.jitter", "'half'"),
        (lambda: Constant(-0.5), "Constant.delay", "-0.5"),
        (lambda: Constant(cast(Any, "5")), "Constant.delay", "'5'"),
        (
            lambda: Constant(1, jitter=cast(Any, "decorrelated")),
            "Constant.jitter",
            "'decorrelated'",
        ),
        (lambda: DecorrelatedJitter(base=-3), "DecorrelatedJitter.base", "-3"),
        (lambda: DecorrelatedJitter(base=5, cap=4), "DecorrelatedJitter.cap", "4"),
    ],
    ids=lambda param: param if isinstance(param, str) else "",
)
def test_a_bad_parameter_raises_configuration_error_naming_it(
    build: Callable[[], object], name: str, shown: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        build()
    message = str(caught.value)
    assert message.startswith(f"{name} must be ")
    assert message.endswith(f"got {shown}")
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    "strategy", [Exponential(), Constant(1), DecorrelatedJitter()], ids=lambda s: type(s).__name__
)
def test_a_negative_attempt_raises_value_error(strategy: BackoffStrategy) -> None:
    with pytest.raises(ValueError, match="attempt must be >= 0, got -1"):
        strategy(-1)
