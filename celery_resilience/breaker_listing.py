"""Which breakers the operator's views (``status``, metrics, the admin) show, bounded.

Declared breakers, breakers with state and breakers holding parked tasks are shown one by one,
except the derived ones (named at call time: a webhook sender's thousand hosts): of each family
at most ``resilience_derived_shown``, the troubled first (not closed, or failing), then those
holding parked tasks; the rest of the family is summed in its :class:`Family` line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .backout.store import NO_BREAKER
from .runtime import Runtime


@dataclass
class Family:
    """A family of derived breakers, summed: what is not shown one by one."""

    members: int = 0  # derived breakers with state
    troubled: int = 0  # of which not closed, or with a failure streak
    holding: int = 0  # derived breakers with parked tasks
    shown: list[str] = field(default_factory=list)

    @property
    def hidden(self) -> int:
        return max(self.members, self.holding) - len(self.shown)


@dataclass
class Listing:
    names: list[str]  # shown one by one, sorted
    families: dict[str, Family]  # by base name


def listing(runtime: Runtime) -> Listing:
    config = runtime.config
    store = runtime.breaker_store
    with_entries = runtime.backout_store.breakers() - {NO_BREAKER}
    names = set(runtime.breaker_names())
    families: dict[str, Family] = {}
    holding: dict[str, list[str]] = {}
    for name in with_entries:
        base = config.family_of(name)
        if base is None:
            names.add(name)
        else:
            holding.setdefault(base, []).append(name)
    for base in sorted(set(config.breakers) & (names | set(holding))):
        family = Family()
        troubled: list[str] = []
        size, ask = getattr(store, "family_size", None), getattr(store, "troubled", None)
        if size is not None and ask is not None:  # a store that keeps families (Redis)
            family.members, family.troubled = size(base)
            troubled = ask(base, config.derived_shown)
        family.holding = len(holding.get(base, ()))
        shown = list(dict.fromkeys([*troubled, *sorted(holding.get(base, ()))]))
        family.shown = shown[: config.derived_shown]
        if family.members or family.holding:
            families[base] = family
            names.update(family.shown)
    return Listing(sorted(names), families)


def is_known(runtime: Runtime, name: str) -> bool:
    """Whether ``name`` is a breaker an operator may name: shown, or derived from a declared
    one (``<base>:<key>``), whether or not it is shown."""
    if runtime.config.family_of(name) is not None:
        return True
    return name in listing(runtime).names
