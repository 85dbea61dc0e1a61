"""One entry as a person names it: its id, a unique prefix of it, or its Celery task id.

Flower, the logs and a task's result give the task id; the CLI's list shows the first
characters of the entry id. A replay into an open breaker parks the task again under a new
entry id with the same task id, so the task id is what stays findable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .entry import ParkedTask
from .store import EntryStore

#: Candidates a lookup returns at most (enough to tell the person which to pick).
CANDIDATES = 10
_HEX = re.compile(r"^[0-9a-f]{1,31}$")


@dataclass(frozen=True)
class Found:
    """What ``key`` names: ``entries`` (one when it is unambiguous) and how it matched
    (``entry id``, ``id prefix`` or ``task id``; empty when nothing did)."""

    key: str
    by: str = ""
    entries: list[ParkedTask] = field(default_factory=list)

    @property
    def one(self) -> ParkedTask | None:
        return self.entries[0] if len(self.entries) == 1 else None


def find(store: EntryStore, key: str, limit: int = CANDIDATES) -> Found:
    """The entries ``key`` names: the entry of that id; else, for a short hex key, the entries
    whose id starts with it (cheap: ids only); else the entries of that Celery task id (it
    reads every entry)."""
    key = key.strip()
    entry = store.get(key) if key else None
    if entry is not None:
        return Found(key, "entry id", [entry])
    if _HEX.match(key):
        prefixed = store.with_prefix(key, limit)
        if prefixed:
            return Found(key, "id prefix", prefixed)
    tasks = store.with_task_id(key, limit) if key else []
    return Found(key, "task id" if tasks else "", tasks)
