"""What the admin's search box and task filter match, the same on every store.

A query matches an entry when it is part of the task's name, the start of its task id or entry
id (what Flower and the logs give, or a short prefix), or the start of a word of its arguments
as a person sees them (masked, ``backout.summary.arguments``) where a number matches whole:
``15`` finds ``order_id=15`` and ``(15,)``, not ``150`` nor an id holding "15". A masked value
is never searched, so a search can't probe a card token.

No store has a text index over arguments: the search reads entries, newest first, up to
``SCAN_LIMIT`` of those the other filters keep, and the page says so.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ...backout.entry import ParkedTask
from ...backout.masking import SHOW_ALL, Masking
from ...backout.summary import arguments

#: Entries a search or task filter reads at most (newest first).
SCAN_LIMIT = 10_000
#: Entries read per round trip while scanning.
SCAN_PAGE = 500


def _word(needle: str) -> re.Pattern[str]:
    end = r"(?!\d)" if needle[-1:].isdigit() else ""
    return re.compile(rf"(?<![0-9a-z_]){re.escape(needle)}{end}")


def matcher(query: str, masking: Masking = SHOW_ALL) -> Callable[[ParkedTask], bool]:
    """Whether an entry matches ``query`` (case-insensitive; see the module docstring)."""
    needle = query.strip().lower()
    word = _word(needle)

    def matches(entry: ParkedTask) -> bool:
        if not needle:
            return True
        if needle in entry.task_name.lower():
            return True
        if entry.task_id.lower().startswith(needle) or entry.id.lower().startswith(needle):
            return True
        return word.search(arguments(entry, masking).lower()) is not None

    return matches


@dataclass
class Scan:
    """Matching entries of a bounded scan, and whether it stopped before the end."""

    entries: builtins.list[ParkedTask]
    cut: bool


def scan(
    pages: Callable[[int, int], builtins.list[ParkedTask]],
    keep: Callable[[ParkedTask], bool],
    limit: int = SCAN_LIMIT,
    enough: int | None = None,
) -> Scan:
    """Entries of ``pages(offset, count)`` (newest first) that ``keep`` keeps, reading at
    most ``limit`` of them (and no further once ``enough`` were found)."""
    found: builtins.list[ParkedTask] = []
    read = 0
    for batch in _batches(pages, limit):
        read += len(batch)
        found += [entry for entry in batch if keep(entry)]
        if enough is not None and len(found) >= enough:
            break
    return Scan(found, read >= limit)


def _batches(
    pages: Callable[[int, int], builtins.list[ParkedTask]], limit: int
) -> Iterator[builtins.list[ParkedTask]]:
    offset = 0
    while offset < limit:
        batch = pages(offset, min(SCAN_PAGE, limit - offset))
        if batch:
            yield batch
        if len(batch) < SCAN_PAGE:
            return
        offset += len(batch)


def by_task(task: str | None) -> Callable[[Any], bool]:
    """The task filter: an entry of task ``task`` (any without one)."""
    return lambda entry: task is None or entry.task_name == task
