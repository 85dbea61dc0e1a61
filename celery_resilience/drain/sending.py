"""Sending claimed entries to the broker in batches, and telling a broker outage from an entry
the broker will never take.

kombu's ``Producer.batch`` sends a whole batch in one Redis pipeline, made a transaction with a
marker here (``batch_marker.py``): a batch whose reply was lost is acknowledged if it ran and
given back if not, never sent again in part. When the transport can't batch, or the broker
refused the batch, entries go one by one, so that an error that belongs to one entry (it can't
be encoded, a queue the broker refuses, a size limit) never stops the entries behind it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kombu.exceptions import OperationalError as KombuOperationalError

try:
    from kombu.exceptions import BatchPublishError
except ImportError:  # kombu < 5.7: no batch publish, so none of its errors either

    class BatchPublishError(Exception):  # type: ignore[no-redef]
        """Stands for kombu's, which this kombu does not have."""


from ..backout.entry import ParkedTask
from ..redact import get_logger
from ..runtime import Runtime
from .batch_marker import BatchMarker
from .message import publish

logger = get_logger("celery_resilience.drain")

#: Tries of one entry's publish before its error is taken for the entry's own.
PUBLISH_TRIES = 3
#: Entries refused in a row, none published, after which the broker is taken to be refusing
#: everything (out of memory, read-only) rather than those entries.
SUSPECTS_BEFORE_OUTAGE = 3
#: kombu's wrappers around the transport's own error.
WRAPPERS = (KombuOperationalError, BatchPublishError)


@dataclass(frozen=True)
class PublishFailure:
    """A publish that failed: ``outage`` (the broker is unreachable: every publish would fail),
    ``refused`` (the broker said no to this message: a queue it won't take, a size limit, a
    permission, or a broker that refuses everything, such as one out of memory) or ``entry``
    (the message could not even be made: the entry's own fault)."""

    kind: Literal["outage", "refused", "entry"]
    error: BaseException

    def __str__(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


class BrokerErrors:
    """Tells the kinds of :class:`PublishFailure` apart for the app's broker transport."""

    def __init__(self, app: Any) -> None:
        connection = app.connection_for_write()
        try:
            self.outage = tuple(connection.connection_errors)
            self.refused = tuple(connection.channel_errors)
        finally:
            connection.release()

    def classify(self, exc: BaseException) -> PublishFailure:
        # kombu re-raises transport errors as its OperationalError, and a failed batch as its
        # BatchPublishError ("delivery is uncertain"): the broker's error is the cause.
        root = exc
        while isinstance(root, WRAPPERS) and root.__cause__ is not None:
            root = root.__cause__
        if isinstance(root, BatchPublishError):  # no cause: nothing says the message was bad
            return PublishFailure("outage", root)
        if isinstance(root, self.outage):
            return PublishFailure("outage", root)
        if isinstance(root, self.refused):
            return PublishFailure("refused", root)
        if isinstance(root, KombuOperationalError):  # kombu's own, with nothing beneath it
            return PublishFailure("outage", root)
        return PublishFailure("entry", root)


@dataclass
class Sent:
    """What publishing a batch came to: published, failed (entry, failure), to give back."""

    published: list[ParkedTask]
    suspects: list[tuple[ParkedTask, PublishFailure]]
    give_back: list[ParkedTask]
    down: bool


class Sender:
    """Publishes entries for one drain batch through ``producer``."""

    def __init__(self, runtime: Runtime, producer: Any) -> None:
        self.runtime = runtime
        self.producer = producer
        self.errors = BrokerErrors(runtime.app)

    def send(self, entries: list[ParkedTask]) -> Sent:
        """Publish ``entries`` in one batch where the transport can (kombu's ``Producer.batch``:
        one Redis pipeline, made a transaction here), and one by one where it can't or the
        broker refused the batch."""
        if not entries or not getattr(self.producer, "supports_batch_publish", False):
            return self.one_by_one(entries)
        buffered: list[ParkedTask] = []
        made_badly: list[tuple[ParkedTask, PublishFailure]] = []
        rest: list[ParkedTask] = []
        marker: BatchMarker | None = None
        try:
            # Room for every command of the batch: kombu would flush early otherwise, and a
            # failed early flush would surface as the error of whichever entry came next.
            with self.producer.batch(max_size=4 * len(entries) + 16) as batch:
                marker = BatchMarker.start(batch, self.producer, self.runtime.config.key_prefix)
                for index, entry in enumerate(entries):
                    try:
                        publish(self.runtime, entry, self.producer)
                    except Exception as exc:
                        failure = self.errors.classify(exc)
                        if failure.kind == "outage":  # the broker went away: send what is in
                            rest = entries[index:]
                            break
                        made_badly.append((entry, failure))  # the message could not be made
                    else:
                        buffered.append(entry)
                if marker is not None and buffered:
                    marker.seal()
        except Exception as exc:  # the batch went to the broker and failed there
            failure = self.errors.classify(exc)
            logger.warning("Publishing a batch of %d failed (%s)", len(buffered), failure)
            if failure.kind == "outage":
                # The reply was lost: the transaction ran whole or not at all, and its marker
                # says which. Unknown (no marker, or the broker can't be asked): give all back.
                if marker is not None and marker.went_out():
                    return Sent(buffered, made_badly, rest, down=bool(rest))
                return Sent([], [], entries, down=True)
            # Refused: the transaction was not run (the broker refused a command of it before
            # EXEC), so nothing went out; find which entry, one by one.
            again = self.one_by_one(buffered)
            again.suspects += made_badly
            return again
        return Sent(buffered, made_badly, rest, down=bool(rest))

    def one_by_one(self, entries: list[ParkedTask]) -> Sent:
        sent = Sent([], [], [], down=False)
        for index, entry in enumerate(entries):
            failure = self._publish(entry)
            if failure is None:
                sent.published.append(entry)
                continue
            sent.suspects.append((entry, failure))
            refused_all = not sent.published and all(f.kind == "refused" for _, f in sent.suspects)
            if failure.kind == "outage" or (
                refused_all and len(sent.suspects) >= SUSPECTS_BEFORE_OUTAGE
            ):
                # The broker is down, or refuses everything: stop, give the rest back.
                logger.error(
                    "Publishing %s[%s] failed: %s", entry.task_name, entry.task_id, failure
                )
                sent.down = True
                sent.give_back += [e for e, _ in sent.suspects] + entries[index + 1 :]
                sent.suspects = []
                break
        return sent

    def _publish(self, entry: ParkedTask) -> PublishFailure | None:
        """Publish ``entry``, a few tries unless the broker is down; ``None`` once it went out."""
        failure = None
        for _ in range(PUBLISH_TRIES):
            try:
                publish(self.runtime, entry, self.producer)
            except Exception as exc:
                failure = self.errors.classify(exc)
                if failure.kind == "outage":
                    break
            else:
                return None
        return failure
