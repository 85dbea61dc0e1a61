"""The fleet's versions: the minimum version every process runs, recorded in Redis by a person,
and the versions processes report.

A version writes only what every process that may share its Redis reads. Entries are written
in the previous version's envelope (2) until the recorded minimum says every process reads the
one that names keys (3): the switch is fleet-wide, in Redis, and a person's (``celery
resilience fleet --minimum``), because processes of the previous version report nothing, so
their absence from the reports proves nothing. Each process reads the minimum at most every
:data:`REFRESH` seconds; a Redis it can't read keeps what it knew (the previous envelope at
first).

Keys (hash tag ``{<P>:fleet}``): ``minimum`` (a string, ``0.4``), ``minimum_at`` (when it was
recorded, Redis time), ``seen`` (hash: a worker's name -> ``<version>|<epoch seconds>``,
written when it starts; a report older than :data:`REPORT_KEPT` is dropped then).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import redis

from .backout.envelope import KEYED_ENVELOPE, PREVIOUS_ENVELOPE
from .redact import get_logger

logger = get_logger("celery_resilience.fleet")

#: The version this code is: what it reports, and what a recorded minimum is compared with.
THIS_VERSION = "0.4"
#: The first version that reads envelope 3 (keys named in entries).
KEYED_FROM = "0.4"
#: Seconds a process trusts the minimum it read.
REFRESH = 10.0
#: Seconds after which a report of a worker is shown as old (it may have stopped).
REPORT_FRESH = 86400.0
#: Seconds a worker's report is kept without being written again (its start writes it): the
#: ``seen`` hash then holds the workers started in the last 30 days, not every name ever.
REPORT_KEPT = 30 * 86400.0

#: Writes a worker's report with Redis's time, and drops the reports older than ARGV[3].
#: KEYS[1] seen  hash  name -> "<version>|<epoch seconds>"
#: ARGV[1] name, ARGV[2] version, ARGV[3] seconds a report is kept. Returns the number dropped.
_REPORT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. string.format('%.6f', now))
local cutoff, old = now - tonumber(ARGV[3]), {}
local seen = redis.call('HGETALL', KEYS[1])
for i = 1, #seen, 2 do
  local at = tonumber(string.match(seen[i + 1], '|([^|]*)$'))
  if not at or at < cutoff then old[#old + 1] = seen[i] end
end
for i = 1, #old, 500 do redis.call('HDEL', KEYS[1], unpack(old, i, math.min(#old, i + 499))) end
return #old
"""
#: Records the minimum version and when (Redis's time), in one step.
#: KEYS[1] minimum  string, KEYS[2] minimum_at  string;  ARGV[1] the version.
_RECORD = """
local t = redis.call('TIME')
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], string.format('%d.%06d', t[1], t[2]))
"""


def version(text: str) -> tuple[int, ...]:
    """``"0.4"`` as ``(0, 4)``; ``ValueError`` for anything but dotted numbers."""
    parts = text.strip().split(".")
    if not text.strip() or not all(p.isdigit() for p in parts):
        raise ValueError(f"a version is dotted numbers such as {THIS_VERSION!r}, got {text!r}")
    return tuple(int(p) for p in parts)


def envelope_for(minimum: str | None) -> int:
    """The envelope a fleet whose every process runs ``minimum`` or later reads."""
    if minimum is not None and version(minimum) >= version(KEYED_FROM):
        return KEYED_ENVELOPE
    return PREVIOUS_ENVELOPE


@dataclass(frozen=True)
class Report:
    """What a worker said of itself: its version, and when (Redis time, epoch seconds)."""

    version: str
    at: float


class Fleet:
    """The recorded minimum version and the reports, in the Redis of ``client()``."""

    def __init__(
        self,
        client: Callable[[], redis.Redis] | None,
        prefix: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client  # None: memory://, one process, the previous envelope
        tag = f"{{{prefix}:fleet}}"
        self.minimum_key, self.seen_key = f"{tag}:minimum", f"{tag}:seen"
        self.minimum_at_key = f"{tag}:minimum_at"
        self._clock = clock
        self._lock = threading.Lock()
        self._known: str | None = None
        self._read_at: float | None = None

    def minimum(self, fresh: bool = False) -> str | None:
        """The recorded minimum version (``None``: none recorded), read again at most every
        :data:`REFRESH` seconds unless ``fresh``; ``RedisError`` only when ``fresh``."""
        if self._client is None:
            return None
        now = self._clock()
        with self._lock:
            if not fresh and self._read_at is not None and now - self._read_at < REFRESH:
                return self._known
        try:
            raw = cast(bytes | None, self._client().get(self.minimum_key))
        except redis.RedisError:
            if fresh:
                raise
            logger.debug("Could not read the fleet's minimum version", exc_info=True)
            with self._lock:
                self._read_at = now  # not asked again at every park while Redis is away
                return self._known
        known = None if raw is None else raw.decode(errors="replace")
        with self._lock:
            self._known, self._read_at = known, now
        return known

    def recorded_at(self) -> float | None:
        """When the minimum was recorded (Redis time), ``None`` if never (or by hand)."""
        if self._client is None:
            return None
        raw = cast(bytes | None, self._client().get(self.minimum_at_key))
        try:
            return None if raw is None else float(raw)
        except ValueError:
            return None

    def envelope(self) -> int:
        """The envelope this process writes now."""
        try:
            return envelope_for(self.minimum())
        except ValueError:  # a minimum written by hand that is not a version
            return PREVIOUS_ENVELOPE

    def record_minimum(self, minimum: str) -> None:
        """Record ``minimum`` as the version every process runs (a person said so)."""
        version(minimum)
        if self._client is None:
            raise ValueError("memory:// has no fleet: nothing to record")
        client = self._client()
        script: Any = client.register_script(_RECORD)
        script([self.minimum_key, self.minimum_at_key], [minimum])
        self.minimum(fresh=True)

    def report(self, name: str) -> int:
        """Say that worker ``name`` runs this version (now, by Redis's clock), and drop the
        reports not written for :data:`REPORT_KEPT` seconds; the number dropped."""
        if self._client is None:
            return 0
        script: Any = self._client().register_script(_REPORT)
        return int(script([self.seen_key], [name, THIS_VERSION, REPORT_KEPT]))

    def reports(self) -> dict[str, Report]:
        """Every report, by worker name (processes of versions before 0.4 make none)."""
        if self._client is None:
            return {}
        raw = cast(dict[bytes, bytes], self._client().hgetall(self.seen_key))
        found = {}
        for name, value in raw.items():
            text, _, at = value.decode(errors="replace").partition("|")
            try:
                found[name.decode(errors="replace")] = Report(text, float(at))
            except ValueError:
                continue
        return found
