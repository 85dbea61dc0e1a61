"""What the installed kombu does with broker messages, for tests whose ledger depends on it."""

from __future__ import annotations

from celery import Celery

from celery_resilience import Resilience


def publishes_in_batches(resilience: Resilience) -> bool:
    """Whether the drain publishes a batch in one go (kombu 5.7 and later: all of it or none),
    not one by one (before: a drainer killed mid-batch leaves what it sent in the queue)."""
    with resilience.runtime.app.producer_or_acquire() as producer:
        return bool(getattr(producer, "supports_batch_publish", False))


def restores_unacked_when_asked() -> bool:
    """Whether kombu's Redis transport takes ``unacked_restore_interval`` (5.7 and later).

    Before, a worker looks for unacked messages whose visibility timeout ran out when it starts,
    then only every 100 s: a test that waits for a redelivery looks itself
    (:func:`restore_unacked`).
    """
    from kombu.transport.redis import Channel

    return "unacked_restore_interval" in Channel.from_transport_options


def restore_unacked(app: Celery) -> None:
    """Hand the broker's unacked messages whose visibility timeout ran out back to their queues,
    as the Redis transport's sweep does (one look, up to 100 messages)."""
    with app.connection_for_write() as connection:
        connection.default_channel.qos.restore_visible(num=100)
