"""A delivery's admission: the breaker's permit and the delivery questions, in one round trip.

The common case asks the breaker alone, and a closed breaker answers from what the process
knows (no round trip). Only a redelivery is counted (a first delivery can't be a crash loop: no
key per task), and a task with ``deduplicate=True`` asks whether its id succeeded or is claimed,
and claims it (``dedup.py``). What a bulkhead slot or a probe takes is taken under the token
the worker's main process gave the delivery, which frees it if the pool child dies mid-call.
"""

from __future__ import annotations

from ..breaker.permit import Admission
from ..breaker.store import DeliveryQuestions
from ..headers import delivery_token, redelivered, replays_of
from . import dedup, dedup_key
from .breaker_key import breaker_of
from .context import Delivery

#: The admission of a task without a breaker and without delivery questions.
NOTHING_ASKED = Admission(None, None)


def admission(delivery: Delivery) -> Admission:
    """What the breaker (or, without one, the delivery guard) answers for ``delivery``."""
    options, request, runtime = delivery.options, delivery.request, delivery.runtime
    count = options.acks_late and redelivered(request)
    token = delivery_token(request)
    if not count and not options.deduplicate:  # the common case: the breaker alone
        if options.breaker is None:
            return NOTHING_ASKED
        return runtime.breaker(breaker_of(delivery) or options.breaker).admit(None, token)
    config = runtime.config
    questions = DeliveryQuestions(
        task_id=request.id,
        retries=request.retries or 0,
        replays=replays_of(request),
        count=count,
        check_done=options.deduplicate,
        key=dedup_key.key_of(delivery) if options.deduplicate else "",
        ttl=config.delivery_ttl,
        max_deliveries=config.max_deliveries if options.acks_late else 0,
        **dedup.claim_of(delivery, config),  # an admitted delivery claims its task id
    )
    if options.breaker is not None:
        return runtime.breaker(breaker_of(delivery) or options.breaker).admit(questions, token)
    return runtime.deliver(None, questions)
