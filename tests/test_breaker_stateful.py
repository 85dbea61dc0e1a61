"""The Lua scripts, the memory store and the pure model agree on every decision and state.

Hypothesis drives random sequences of acquire / record / advance time / force through all three
with the same pinned clock; any divergence is a bug in the scripts (the model is the spec).
"""

from __future__ import annotations

import uuid

import pytest
import redis
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_resilience.breaker import MemoryBreakerStore, RedisBreakerStore, model
from celery_resilience.breaker.model import BreakerState, Limits
from celery_resilience.config import BreakerConfig
from tests.conftest import REDIS_URL, delete_prefix

START = 1_700_000_000_000_000  # microseconds

breaker_configs = st.builds(
    BreakerConfig,
    failure_threshold=st.integers(1, 4),
    failure_rate_threshold=st.one_of(st.none(), st.sampled_from([0.3, 0.5, 1.0])),
    minimum_calls=st.integers(1, 6),
    window=st.sampled_from([0.5, 2.0, 10.0]),
    open_timeout=st.sampled_from([0.25, 1.0, 3.0]),
    open_timeout_max=st.sampled_from([None, 8.0]),
    half_open_max_calls=st.integers(1, 3),
    probe_lease=st.sampled_from([0.5, 2.0]),
)


class BreakerAgreement(RuleBasedStateMachine):
    client: redis.Redis
    prefix: str

    def __init__(self) -> None:
        super().__init__()
        self.redis_store = RedisBreakerStore(self.client, self.prefix)
        self.memory_store = MemoryBreakerStore(clock=lambda: self.now)
        self.state = BreakerState()
        self.name = uuid.uuid4().hex[:10]
        self.now = START
        self.permits: list[tuple[model.Kind, str]] = []

    @initialize(cfg=breaker_configs)
    def configure(self, cfg: BreakerConfig) -> None:
        self.limits = Limits.of(cfg)

    @rule(deferred=st.sampled_from([0, 0, 0, 1, 3]))
    def acquire(self, deferred: int) -> None:
        permit_id = uuid.uuid4().hex
        expected = model.acquire(self.state, self.limits, self.now, permit_id, deferred)
        got_redis = self.redis_store.acquire(
            self.name, self.limits, permit_id, deferred, now_us=self.now
        )
        got_memory = self.memory_store.acquire(self.name, self.limits, permit_id, deferred)
        assert got_redis == expected
        assert got_memory == expected
        event(f"acquire: {expected.state} allowed={expected.allowed} {expected.transition}")
        if expected.allowed:
            assert expected.kind is not None
            self.permits.append((expected.kind, permit_id))

    @precondition(lambda self: self.permits)
    @rule(index=st.integers(0, 50), success=st.booleans(), deferred=st.sampled_from([0, 0, 2]))
    def record(self, index: int, success: bool, deferred: int) -> None:
        kind, permit_id = self.permits.pop(index % len(self.permits))
        args = (self.limits, kind, permit_id, success, deferred)
        expected = model.record(
            self.state, self.limits, self.now, kind, permit_id, success, deferred
        )
        assert self.redis_store.record(self.name, *args, now_us=self.now) == expected
        assert self.memory_store.record(self.name, *args) == expected
        event(f"record: {kind} -> {expected.transition}")

    @rule(step=st.sampled_from([1, 1_000, 100_000, 250_000, 600_000, 1_000_000, 4_000_000]))
    def advance(self, step: int) -> None:
        self.now += step

    @rule(action=st.sampled_from(["open", "closed", "reset", "reset", "reset"]))
    def force(self, action: model.Action) -> None:
        expected = model.force(self.state, action)
        assert self.redis_store.force(self.name, self.limits, action, now_us=self.now) == expected
        assert self.memory_store.force(self.name, self.limits, action) == expected

    @invariant()
    def snapshots_agree(self) -> None:
        if not hasattr(self, "limits"):
            return
        expected = model.snapshot(self.state, self.limits, self.now)
        assert self.redis_store.snapshot(self.name, self.limits, now_us=self.now) == expected
        assert self.memory_store.snapshot(self.name, self.limits) == expected


@pytest.fixture(scope="module")
def agreement_machine() -> type[BreakerAgreement]:
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"test-stateful-{uuid.uuid4().hex[:8]}"
    BreakerAgreement.client = client
    BreakerAgreement.prefix = prefix
    yield BreakerAgreement
    delete_prefix(client, prefix)
    client.close()


def test_lua_memory_and_model_agree_on_random_histories(
    agreement_machine: type[BreakerAgreement],
) -> None:
    run_state_machine_as_test(
        agreement_machine,
        settings=settings(
            max_examples=500,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
