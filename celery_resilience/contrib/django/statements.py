"""How the database store sends its statements: few enough ids in each for every backend, and
connection trouble as :class:`StoreUnavailable` (parking then keeps the message)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from django.db import InterfaceError, OperationalError

from ...errors import StoreUnavailable

#: Ids per statement (well under every backend's parameter limit).
CHUNK = 500


def chunks(ids: Sequence[str]) -> Iterator[list[str]]:
    """``ids`` in lists small enough for one statement on every backend."""
    for start in range(0, len(ids), CHUNK):
        yield list(ids[start : start + CHUNK])


@contextmanager
def reachable() -> Iterator[None]:
    """Connection trouble becomes ``StoreUnavailable``: parking then keeps the message."""
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        raise StoreUnavailable(f"back-out store unreachable: {exc}") from exc
