"""What a process knows of a family of breakers named at call time (``breaker/families.py``,
``knowledge.py``), fed synthetic sequences of reports, replies and published changes: the order,
the gaps, the epochs. The watch is the memory store's (live at once); no Redis."""

from __future__ import annotations

import time

import pytest

from celery_resilience.breaker.knowledge import MAX_KNOWLEDGE_AGE, Knowledge
from celery_resilience.breaker.memory import MemoryBreakerStore
from celery_resilience.breaker.store import FamilyReport
from celery_resilience.breaker.types import Change, Family

pytestmark = pytest.mark.unit

BASE = "hook"


def knowledge() -> tuple[Knowledge, int]:
    store = MemoryBreakerStore()
    made = Knowledge(lambda: store, lambda name: BASE if name.startswith(f"{BASE}:") else None)
    return made, made.start()


def report(version: int, epoch: str = "e1", *troubled: str) -> FamilyReport:
    return FamilyReport(version, epoch, len(troubled), frozenset(troubled), True)


def heard(
    knowledge: Knowledge, family: Family, name: str, state: str = "open", streak: bool = False
) -> None:
    knowledge._heard(name, 1, state, streak, "m", family)  # type: ignore[arg-type]


def test_a_known_family_admits_its_quiet_members_and_not_its_troubled_ones() -> None:
    known, generation = knowledge()
    known.learn_family(BASE, report(4, "e1", "hook:down"), generation)
    assert known.admits_member(BASE, "hook:never-seen")
    assert not known.admits_member(BASE, "hook:down")
    assert known.holds_member(BASE, "hook:down")


def test_changes_apply_in_order_and_a_gap_drops_the_family() -> None:
    known, generation = knowledge()
    known.learn_family(BASE, report(4), generation)
    heard(known, (5, "e1"), "hook:x")
    assert not known.admits_member(BASE, "hook:x")
    heard(known, (5, "e1"), "hook:x", state="closed")  # already applied: ignored
    assert not known.admits_member(BASE, "hook:x")
    heard(known, (6, "e1"), "hook:x", state="closed")
    assert known.admits_member(BASE, "hook:x")
    heard(known, (8, "e1"), "hook:y")  # 7 was never heard
    assert not known.admits_member(BASE, "hook:z")  # nothing is trusted now


def test_a_change_of_another_epoch_drops_the_family() -> None:
    known, generation = knowledge()
    known.learn_family(BASE, report(4), generation)
    heard(known, (5, "e2"), "hook:x", state="closed")
    assert not known.admits_member(BASE, "hook:x")


def test_a_report_older_than_a_heard_change_does_not_undo_it() -> None:
    """The report left Redis at version 4; the feed brought 5 (x opened) before it arrived."""
    known, generation = knowledge()
    known.learn_family(BASE, report(4), generation)
    heard(known, (5, "e1"), "hook:x")
    known.learn_family(BASE, report(4), generation)
    assert not known.admits_member(BASE, "hook:x")
    assert known.holds_member(BASE, "hook:x")


def test_a_reply_confirms_only_what_the_process_heard_and_applies_its_own_change() -> None:
    known, generation = knowledge()
    known.learn_family(BASE, report(4), generation)
    known._families[BASE].learnt -= MAX_KNOWLEDGE_AGE * 0.75
    behind = Change("closed", None, 0, False, "m", (6, "e1"), family_changed=False)
    assert not known.confirm_family(BASE, "hook:a", behind, generation)
    mine = Change("open", "opened", 3, False, "m", (5, "e1"), family_changed=True)
    assert known.confirm_family(BASE, "hook:x", mine, generation)  # its own change, in order
    assert not known.admits_member(BASE, "hook:x")
    another = Change("closed", None, 0, False, "m", (6, "e9"), family_changed=False)
    assert not known.confirm_family(BASE, "hook:a", another, generation)
    assert not known.admits_member(BASE, "hook:a")  # another epoch: dropped


def test_what_is_known_ages_out_without_a_reply() -> None:
    known, generation = knowledge()
    known.learn_family(BASE, report(4), generation)
    known._families[BASE].learnt = time.monotonic() - MAX_KNOWLEDGE_AGE - 0.01
    assert not known.admits_member(BASE, "hook:a")


def test_an_incomplete_report_leaves_nothing_to_trust() -> None:
    known, generation = knowledge()
    known.learn_family(BASE, report(4), generation)
    known.learn_family(BASE, FamilyReport(9, "e1", 5000, frozenset(), False), generation)
    assert not known.admits_member(BASE, "hook:a")


def test_nothing_is_trusted_after_the_watch_is_lost() -> None:
    known, generation = knowledge()
    known.learn_family(BASE, report(4), generation)
    known._lost()
    assert not known.admits_member(BASE, "hook:a")
