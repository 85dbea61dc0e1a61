"""The breaker's vocabulary: its states, settings, stored state and answers, as plain data.

Split from ``model.py`` (the transitions) because most of the package needs only these types: the
store protocol, both stores, the facade, the process's knowledge and the metrics speak in them
without depending on the state machine. The Lua scripts receive ``Limits.argv()`` and keep
``BreakerState`` in a hash (see ``lua/_common.lua``): a change here is a change to them too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..config import BreakerConfig

State = Literal["closed", "open", "half_open", "forced_open", "forced_closed"]
#: A permit's kind; ``"lost"`` records the call of a permit whose holder died with it: a probe's
#: if its id holds a probe lease, a normal call's otherwise.
Kind = Literal["normal", "probe", "lost"]
Transition = Literal["opened", "half_opened", "closed", "forced_open", "forced_closed", "reset"]
Action = Literal["open", "closed", "reset"]
#: Why an admission took no permit without asking the breaker: the task id already succeeded
#: (``deduplicate``), another delivery of it holds its claim and runs it now (``deduplicate``),
#: or this message was delivered more than ``resilience_max_deliveries`` times.
Skip = Literal["", "done", "claimed", "redelivered"]
#: A family of derived breakers' (version, epoch) after a change of one of them (``knowledge.py``).
Family = tuple[int, str]

STATES: tuple[State, ...] = ("closed", "open", "half_open", "forced_open", "forced_closed")
#: The sliding window is kept in this many buckets: constant work per record.
BUCKETS = 10
US = 1_000_000

TOTALS = (
    "opened_total",
    "half_opened_total",
    "closed_total",
    "calls_total",
    "failures_total",
    "successes_total",
    "rejected_total",
    "bulkhead_rejected_total",
    "retry_budget_refused_total",
    "rate_limited_total",
)


@dataclass(frozen=True)
class Limits:
    """A breaker's settings in the integer units the scripts use (microseconds)."""

    failure_threshold: int
    failure_rate_threshold: float  # 0 = off
    minimum_calls: int
    window_us: int
    open_timeout_us: int
    open_timeout_max_us: int
    half_open_max_calls: int
    probe_lease_us: int
    max_concurrent_calls: int = 0  # the bulkhead; 0 = off
    call_lease_us: int = 60 * US
    #: A derived breaker's keys outlive its last write by this much; 0: a declared breaker.
    idle_us: int = 0

    @property
    def bucket_us(self) -> int:
        return max(1, self.window_us // BUCKETS)

    @classmethod
    def of(cls, cfg: BreakerConfig, derived: bool = False) -> Limits:
        return cls(
            failure_threshold=cfg.failure_threshold,
            failure_rate_threshold=cfg.failure_rate_threshold or 0.0,
            minimum_calls=cfg.minimum_calls,
            window_us=round(cfg.window * US),
            open_timeout_us=round(cfg.open_timeout * US),
            open_timeout_max_us=round(cfg.max_open_timeout * US),
            half_open_max_calls=cfg.half_open_max_calls,
            probe_lease_us=round(cfg.probe_lease * US),
            max_concurrent_calls=cfg.max_concurrent_calls or 0,
            call_lease_us=round(cfg.call_lease * US),
            idle_us=round(cfg.idle_timeout * US) if derived else 0,
        )

    def argv(self) -> tuple[int | float, ...]:
        """The settings as the scripts receive them, in this order (see ``lua/_common.lua``)."""
        return (
            self.failure_threshold,
            self.failure_rate_threshold,
            self.minimum_calls,
            self.window_us,
            self.open_timeout_us,
            self.open_timeout_max_us,
            self.half_open_max_calls,
            self.probe_lease_us,
            self.max_concurrent_calls,
            self.call_lease_us,
            self.idle_us,
        )


@dataclass
class BreakerState:
    """Everything stored for one breaker (one Redis hash, and sorted sets of probe leases and
    of the bulkhead's call leases)."""

    state: State = "closed"
    consecutive_failures: int = 0
    opened_at_us: int = 0
    open_until_us: int = 0
    trips: int = 0
    half_open_successes: int = 0
    probes: dict[str, int] = field(default_factory=dict)  # permit id -> lease expiry
    #: The bulkhead's slots: permit id -> lease expiry. Calls in flight stay in flight whatever
    #: the state does, so no transition clears them: only an outcome, a release or the lease.
    calls: dict[str, int] = field(default_factory=dict)
    bucket_epoch: list[int] = field(default_factory=lambda: [-1] * BUCKETS)
    bucket_calls: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    bucket_failures: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    #: Retries the retry budget granted (``model.spend_retries``), in the same buckets.
    bucket_retries: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    #: The rate limit's theoretical arrival time (``model.lease_rate``, a GCRA): the fleet's
    #: rate is spent up to this moment (microseconds).
    rate_tat_us: int = 0
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOTALS, 0))
    #: Bumped whenever what a process may cache changes (see :func:`view`).
    version: int = 0
    #: The maintenance window holding the breaker forced open (its id, ``""``: none), when it
    #: ends (0: not by itself) and when it was set. Set by the ``open`` order that starts it,
    #: dropped by every other order and by the window's end, in the same step
    #: (``maintenance.py``).
    window: str = ""
    window_until_us: int = 0
    window_at_us: int = 0


@dataclass(frozen=True)
class Decision:
    """The answer to ``acquire``: admitted or not, and the transition this call made.

    ``deliveries`` and ``skip`` answer the task-level questions a store may ask in the same
    round trip (see ``store.DeliveryQuestions``); the pure model leaves them at their defaults.
    """

    allowed: bool
    kind: Kind | None
    state: State
    retry_after_us: int | None
    transition: Transition | None
    deliveries: int = 0
    skip: Skip = ""
    #: With skip ``claimed``: microseconds until the claim's lease ends.
    claim_wait_us: int = 0
    #: Not admitted because ``max_concurrent_calls`` calls are in flight (the bulkhead is full).
    full: bool = False
    # The view after the call (see :func:`view`): what it means for caching, not the decision.
    version: int = field(default=0, compare=False)
    streak: bool = field(default=False, compare=False)
    #: The incarnation of the stored state ("" for one never written; see :func:`view`).
    epoch: str = field(default="", compare=False)
    #: A derived breaker's family after the call (``None`` for a declared breaker), and
    #: whether this call's change is the family's version.
    family: Family | None = field(default=None, compare=False)
    family_changed: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Change:
    """The answer to ``record``, ``release`` and ``force``: the resulting state, this call's
    transition, and the view's version and streak after it (see :func:`view`)."""

    state: State
    transition: Transition | None
    version: int = field(default=0, compare=False)
    streak: bool = field(default=False, compare=False)
    #: The incarnation of the stored state ("" for one never written; see :func:`view`).
    epoch: str = field(default="", compare=False)
    #: A derived breaker's family after the call (``None`` for a declared breaker), and
    #: whether this call's change is the family's version.
    family: Family | None = field(default=None, compare=False)
    family_changed: bool = field(default=False, compare=False)


def view(s: BreakerState) -> tuple[State, bool]:
    """What a process may cache between round trips: the state, and whether a streak of failures
    is running (``consecutive_failures > 0``: then a success must be recorded at once, since it
    ends the streak). Every operation that changes it bumps ``version`` and, in Redis, publishes
    the new view: that is how every process learns of a transition within one round trip.
    A version counts within one incarnation of the stored state (its ``epoch``): state that is
    deleted and made again starts counting from 0 under a new epoch."""
    return s.state, s.consecutive_failures > 0
