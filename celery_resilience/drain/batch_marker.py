"""Telling whether a batch publish whose reply was lost reached the broker.

kombu's Redis batch (``Producer.batch``) sends a whole batch in one pipeline. When the
connection drops before the reply comes back, kombu raises ``BatchPublishError`` ("delivery is
uncertain") and forgets the pipeline: some, all or none of the messages may be in the queue,
and publishing the batch again would run those that went out twice.

So the drain makes that pipeline a transaction (``MULTI`` ... ``EXEC``: Redis runs all of it or
none of it) whose last command writes a marker, a key of its own with a short expiry. After a
lost reply, the marker is asked for on a new connection: there, every message went out; absent,
none did. Only a broker that can't be asked right then leaves the question open (the batch is
then given back, and what went out runs again: at most one batch).

This reaches into kombu 5.7's batch (its session's redis-py pipeline); where that is not there,
the batch is sent as kombu sends it, without a marker.
"""

from __future__ import annotations

import uuid
from typing import Any

#: Milliseconds the marker lives: the question is asked right after the failure.
MARKER_TTL_MS = 600_000


class BatchMarker:
    """The marker of one batch, written inside its transaction."""

    def __init__(self, pipeline: Any, channel: Any, key: str) -> None:
        self.pipeline = pipeline
        self.channel = channel
        self.key = key

    @classmethod
    def start(cls, batch: Any, producer: Any, key_prefix: str) -> BatchMarker | None:
        """Make the batch a transaction, before its first message; ``None`` where it can't."""
        try:
            channel = producer.channel
            session = batch.state._get_session(channel)
            pipeline = session.pipeline
        except Exception:  # another kombu, or a transport without a session: no marker
            return None
        if pipeline is None or getattr(pipeline, "command_stack", None):
            return None
        pipeline.multi()
        return cls(pipeline, channel, f"{key_prefix}:replay-batch:{uuid.uuid4().hex}")

    def seal(self) -> None:
        """The transaction's last commands: the marker (HSET and PEXPIRE, which kombu's key
        prefix covers as it covers the queues, so the read below finds it)."""
        self.pipeline.hset(self.key, "sent", "1")
        self.pipeline.pexpire(self.key, MARKER_TTL_MS)

    def went_out(self) -> bool:
        """Whether the transaction ran (asked on a new connection); ``False`` if unknown."""
        try:
            return bool(self.channel.client.hget(self.key, "sent"))
        except Exception:
            return False
