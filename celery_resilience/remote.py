"""What a worker answers about itself through Celery's remote control: its version, the envelope
it writes, the ids of its keys (never a key). ``celery resilience fleet`` asks every live
worker, beside Celery's own ``ping``: one that answers ping but not this command runs a version
before this one.

Registered in Celery's control panel when the package is imported (a worker imports it with its
app), under a name of the package's own.
"""

from __future__ import annotations

from typing import Any

from celery.worker.control import inspect_command

from .fleet import THIS_VERSION
from .runtime import Runtime

#: The remote control command's name.
COMMAND = "resilience_version"


@inspect_command(name=COMMAND)
def resilience_version(state: Any) -> dict[str, Any]:
    """The celery-resilience version of this worker, and what it writes."""
    runtime = Runtime.for_app(state.app)
    codec = runtime.codec()
    return {
        "version": THIS_VERSION,
        "envelope": codec.envelope(),
        # Ids, which tell nothing of a key, under names no redaction takes for a secret's.
        "key_ids": {
            "signing": [] if codec.signer is None else codec.signer.ids,
            "encryption": [] if codec.cipher is None else codec.cipher.ids,
        },
    }
