"""A walk over every entry of a store that drains and discards do not disturb.

It goes by position in the store's own stable order (``payloads``: Redis's ``HSCAN``, the
database's primary key, the memory store's ids), never by an offset into a list that entries
leaving would shift: every entry that exists from the walk's start to its end is handed out,
once (the position-based order may repeat one: it is handed out the first time only).
"""

from __future__ import annotations

from collections.abc import Iterator

from .store import EntryStore


def pages(store: EntryStore, batch: int) -> Iterator[list[tuple[str, bytes]]]:
    """The store's entries as ``(id, stored bytes)``, about ``batch`` a page (an empty page is
    possible); ``ValueError`` for a ``batch`` below 1."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    seen: set[str] = set()
    position = ""
    while True:
        position, page = store.payloads(position, batch)
        fresh = [(i, d) for i, d in page if i not in seen]
        seen.update(i for i, _ in fresh)
        yield fresh
        if not position:
            return
