"""The Lua scripts, the memory store and the pure model agree on every decision and state.

Hypothesis drives random sequences of acquire (with and without the delivery questions: the
redelivery count, the dedup marker and the claim of a task id) / record / release / mark done /
give a claim back / advance time / force (starting maintenance windows or dropping them) /
end a window through all three with the same pinned clock, on
breakers with and without a bulkhead; any divergence is a bug in the scripts (the model is the
spec). The view each call returns (version, streak) must agree too, and every change of it must
be published once, in order, on the Redis channel and to the memory store's watchers.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

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
from celery_resilience.breaker.store import DeliveryQuestions
from celery_resilience.breaker.types import Action, BreakerState, Change, Decision, Kind, Limits
from celery_resilience.breaker.watch import parse_change
from celery_resilience.config import BreakerConfig
from celery_resilience.contrib.pytest import delete_prefix
from tests.support.services import REDIS_URL

#: Hypothesis annotates its stateful runner in some releases only.
run_as_test: Callable[..., None] = run_state_machine_as_test

pytestmark = pytest.mark.contract

START = 1_700_000_000_000_000  # microseconds
MAX_DELIVERIES = 2

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
    max_concurrent_calls=st.sampled_from([None, None, 1, 2, 3]),
    call_lease=st.sampled_from([0.5, 2.0, 5.0]),
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
        self.permits: list[tuple[Kind, str]] = []
        # The delivery questions, answered by the test itself: redeliveries and done task ids.
        self.redeliveries: dict[tuple[str, int], int] = {}
        self.done: set[str] = set()
        self.claims: dict[str, tuple[str, int]] = {}  # task id -> (token, lease end)
        self.tokens: list[str] = []  # every claim token handed out (old ones too)
        # Every published view change: expected (from the model), and heard from each store.
        self.expected_changes: list[tuple[int, str, bool]] = []
        self.memory_changes: list[tuple[int, str, bool]] = []
        self.memory_store.watch(self._memory_heard, lambda: None, lambda: None)
        self.pubsub = cast(Any, self.client).pubsub()  # annotated in some releases only
        self.pubsub.subscribe(self.redis_store.channel)
        assert self.pubsub.get_message(timeout=5.0)["type"] == "subscribe"
        self.version = 0

    def _memory_heard(
        self, name: str, version: int, state: str, streak: bool, epoch: str, family: Any
    ) -> None:
        if name == self.name:
            self.memory_changes.append((version, state, streak))

    def _check_view(self, expected: Decision | Change, *got: Any) -> None:
        for result in got:
            assert (result.version, result.streak) == (expected.version, expected.streak)
        if expected.version != self.version:
            self.version = expected.version
            self.expected_changes.append((expected.version, expected.state, expected.streak))

    def teardown(self) -> None:
        heard: list[tuple[int, str, bool]] = []
        deadline = time.monotonic() + 5.0
        while len(heard) < len(self.expected_changes) and time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=0.5)
            if message and message["type"] == "message":
                change = parse_change(message["data"])
                assert change is not None
                if change[0] == self.name:
                    heard.append(change[1:4])
        extra = self.pubsub.get_message(timeout=0.002)
        self.pubsub.close()
        assert heard == self.expected_changes
        assert extra is None or extra["type"] != "message"
        assert self.memory_changes == self.expected_changes

    @initialize(cfg=breaker_configs)
    def configure(self, cfg: BreakerConfig) -> None:
        self.limits = Limits.of(cfg)

    @rule(
        deferred=st.sampled_from([0, 0, 0, 1, 3]),
        task=st.sampled_from(["", "", "t1", "t2", "t2"]),
        # Redeliveries past MAX_DELIVERIES hide a claim: seldom enough that claims are met.
        redelivered=st.sampled_from([False, False, False, True]),
        check_done=st.booleans(),
        claim=st.sampled_from([True, True, False]),
        lease=st.sampled_from([5_000_000, 30_000_000, 120_000_000]),
    )
    def acquire(
        self,
        deferred: int,
        task: str,
        redelivered: bool,
        check_done: bool,
        claim: bool,
        lease: int,
    ) -> None:
        permit_id = uuid.uuid4().hex
        delivery = None
        skip = ""
        deliveries = wait = 0
        if task:  # a task's delivery: the redelivery count and the dedup marker ride along
            delivery = DeliveryQuestions(
                task_id=task,
                retries=0,
                count=redelivered,
                check_done=check_done,
                ttl=3600,
                max_deliveries=MAX_DELIVERIES,
                claim=uuid.uuid4().hex if claim else "",
                lease_us=lease,
            )
            if redelivered:
                key = (task, 0)
                self.redeliveries[key] = self.redeliveries.get(key, 0) + 1
                deliveries = self.redeliveries[key] + 1
            done = check_done and task in self.done
            _, lease_end = self.claims.get(task, ("", 0))
            claimed = check_done and not done and lease_end > self.now
            skip = delivery.skip(deliveries, done, claimed)
            wait = lease_end - self.now if skip == "claimed" else 0
        if skip:
            expected = model.skip(self.state, self.limits, self.now, deferred)
        else:
            expected = model.acquire(self.state, self.limits, self.now, permit_id, deferred)
        got_redis = self.redis_store.acquire(
            self.name, self.limits, permit_id, deferred, now_us=self.now, delivery=delivery
        )
        got_memory = self.memory_store.acquire(
            self.name, self.limits, permit_id, deferred, delivery=delivery
        )
        for got in (got_redis, got_memory):
            assert (got.deliveries, got.skip, got.claim_wait_us) == (deliveries, skip, wait)
            assert dataclasses.replace(got, deliveries=0, skip="", claim_wait_us=0) == expected
        self._check_view(expected, got_redis, got_memory)
        event(f"acquire: {expected.state} allowed={expected.allowed} skip={skip!r}")
        if expected.allowed and not skip:
            assert expected.kind is not None
            self.permits.append((expected.kind, permit_id))
            if delivery is not None and delivery.claims:  # admitted: the task id is claimed
                self.claims[task] = (delivery.claim, self.now + lease)
                self.tokens.append(delivery.claim)

    # t2 is seldom marked done, so that its claims are contended for, given back and run out.
    @rule(task=st.sampled_from(["t1", "t1", "t1", "t2"]))
    def mark_done(self, task: str) -> None:
        self.redis_store.mark_done(self.name, task, 3600)
        self.memory_store.mark_done(self.name, task, 3600)
        self.done.add(task)
        self.claims.pop(task, None)  # the success marker replaces the claim

    @precondition(lambda self: self.tokens)
    @rule(task=st.sampled_from(["t1", "t2"]), index=st.integers(0, 50))
    def unclaim(self, task: str, index: int) -> None:
        token = self.tokens[index % len(self.tokens)]  # the holder's, or a stale one
        expected = self.claims.get(task, ("", 0))[0] == token
        assert self.redis_store.unclaim(self.name, task, token) is expected
        assert self.memory_store.unclaim(self.name, task, token) is expected
        if expected:
            del self.claims[task]
        event(f"unclaim: released={expected}")

    @precondition(lambda self: self.permits)
    @rule(
        index=st.integers(0, 50),
        success=st.booleans(),
        deferred=st.sampled_from([0, 0, 2]),
        least=st.sampled_from([0, 0, 0, 3_000_000, 90_000_000]),  # a failure's Retry-After
    )
    def record(self, index: int, success: bool, deferred: int, least: int) -> None:
        kind, permit_id = self.permits.pop(index % len(self.permits))
        args = (self.limits, kind, permit_id, success, deferred)
        expected = model.record(
            self.state, self.limits, self.now, kind, permit_id, success, deferred, least
        )
        got_redis = self.redis_store.record(self.name, *args, now_us=self.now, least_open_us=least)
        got_memory = self.memory_store.record(self.name, *args, least_open_us=least)
        assert got_redis == expected
        assert got_memory == expected
        self._check_view(expected, got_redis, got_memory)
        event(f"record: {kind} -> {expected.transition}")

    @precondition(lambda self: self.permits)
    @rule(index=st.integers(0, 50), deferred=st.sampled_from([0, 0, 2]))
    def release(self, index: int, deferred: int) -> None:
        kind, permit_id = self.permits.pop(index % len(self.permits))
        expected = model.release(self.state, self.limits, self.now, kind, permit_id, deferred)
        args = (self.limits, kind, permit_id, deferred)
        got_redis = self.redis_store.release(self.name, *args, now_us=self.now)
        got_memory = self.memory_store.release(self.name, *args)
        assert got_redis == expected
        assert got_memory == expected
        self._check_view(expected, got_redis, got_memory)

    @rule(
        ratio=st.sampled_from([0.0, 0.1, 0.5]),
        floor=st.sampled_from([0.0, 0.5, 2.0]),
        wanted=st.integers(1, 5),
    )
    def spend_retries(self, ratio: float, floor: float, wanted: int) -> None:
        expected = model.spend_retries(self.state, self.limits, self.now, ratio, floor, wanted)
        args = (self.limits, ratio, floor, wanted)
        assert self.redis_store.spend_retries(self.name, *args, now_us=self.now) == expected
        assert self.memory_store.spend_retries(self.name, *args) == expected
        event(f"spend_retries: {expected}/{wanted}")

    @rule(
        span=st.sampled_from([0, 100_000, 250_000]),
        batches=st.sampled_from([1, 1, 3]),
        refused=st.sampled_from([0, 0, 4]),
    )
    def lease_rate(self, span: int, batches: int, refused: int) -> None:
        """A lease from the rate limit; ``span`` 0: a lease of nothing, which only counts."""
        burst = span * batches
        expected = model.lease_rate(self.state, self.now, span, burst, refused)
        args = (self.limits, span, burst, refused)
        assert self.redis_store.lease_rate(self.name, *args, now_us=self.now) == expected
        assert self.memory_store.lease_rate(self.name, *args) == expected
        event(f"lease_rate: {'granted' if expected == 0 else 'refused'}")

    @rule(step=st.sampled_from([1, 1_000, 100_000, 250_000, 600_000, 1_000_000, 4_000_000]))
    def advance(self, step: int) -> None:
        self.now += step

    @rule(
        action=st.sampled_from(["open", "closed", "reset", "reset", "reset"]),
        window=st.sampled_from(["", "", "w1", "w2"]),
        ends_in=st.sampled_from([None, 0, 500_000, 2_000_000]),
    )
    def force(self, action: Action, window: str, ends_in: int | None) -> None:
        """An order; an ``open`` may start maintenance window ``window``, ending ``ends_in``
        microseconds from now (``None``: not by itself)."""
        until = 0 if ends_in is None or not window else self.now + ends_in
        expected = model.force(self.state, action, window, until, self.now)
        got_redis = self.redis_store.force(
            self.name, self.limits, action, now_us=self.now, window=window, until_us=until
        )
        got_memory = self.memory_store.force(
            self.name, self.limits, action, window=window, until_us=until
        )
        assert got_redis == expected
        assert got_memory == expected
        self._check_view(expected, got_redis, got_memory)

    @rule(
        window=st.sampled_from(["", "w1", "w2"]),
        recorded_ago=st.sampled_from([-1_000_000, 0, 1_000_000, 3_000_000]),
    )
    def end_window(self, window: str, recorded_ago: int) -> None:
        """A window's end; ``""``: a record of the previous release, written ``recorded_ago``
        microseconds ago."""
        recorded = self.now - recorded_ago
        expected = model.end_window(self.state, self.now, window, recorded)
        got_redis = self.redis_store.end_window(
            self.name, self.limits, window, now_us=self.now, recorded_us=recorded
        )
        got_memory = self.memory_store.end_window(
            self.name, self.limits, window, recorded_us=recorded
        )
        assert got_redis == expected
        assert got_memory == expected
        self._check_view(expected, got_redis, got_memory)

    @invariant()
    def snapshots_agree(self) -> None:
        if not hasattr(self, "limits"):
            return
        expected = model.snapshot(self.state, self.limits, self.now)
        assert self.redis_store.snapshot(self.name, self.limits, now_us=self.now) == expected
        assert self.memory_store.snapshot(self.name, self.limits) == expected


@pytest.fixture(scope="module")
def agreement_machine() -> Iterator[type[BreakerAgreement]]:
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
    run_as_test(
        agreement_machine,
        settings=settings(
            max_examples=500,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
