"""Every message the admin pages show passes through ``redact``.

The pages report errors with ``message_user``, and an error's text may quote the Redis or broker
URL it was about, password included: masked here once, for every page and action.
"""

from __future__ import annotations

from typing import Any

from ...redact import redact


class RedactedMessages:
    """Mixed into a ``ModelAdmin`` ahead of it: its ``message_user`` shows no password."""

    def message_user(self, request: Any, message: Any, *args: Any, **kwargs: Any) -> None:
        text = str(message)
        masked = redact(text)
        # Unchanged, the message keeps its own type (a safe string stays safe HTML).
        super().message_user(  # type: ignore[misc]
            request, masked if masked != text else message, *args, **kwargs
        )
