"""``celery -A proj resilience ...``: look at breakers and parked tasks, replay, drain, steer.

Registered through the ``celery.commands`` entry point, so it is a sub-command of ``celery``
with ``-A`` handled by Celery. Human tables by default, ``--json`` for scripts; exit code 1 on
error, with a clear message for unknown breakers and entry ids.
"""

from . import breakers, entries, fleet, health, keys, replays  # noqa: F401  (importing them registers their commands)
from .group import resilience

__all__ = ["resilience"]
