"""No password leaves the package: URLs and ``password=`` values are masked in every message.

Errors, log lines and CLI output often quote a broker or Redis URL (a bad setting, an unreachable
server). :func:`redact` masks the credentials they carry (``redis://:***@host:6379/0``), and
:func:`get_logger` gives the package's loggers a filter that applies it to every record, the
formatted traceback included.
"""

from __future__ import annotations

import logging
import re

MASK = "***"

# scheme://user:password@  (the user may be empty: redis://:password@host). The password may
# hold "@" and ":" (unencoded, as people write them): the credentials end at the LAST "@" before
# the path, so the match is greedy up to a "/", a quote or a space.
_URL_CREDENTIALS = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*):[^/\s'\"]*@")
# password=..., 'password': '...', "sentinel_password": "..." (dict reprs, query strings)
_KEY_VALUE = re.compile(
    r"(?P<key>\b\w*(?:password|passwd|secret)\w*)(?P<sep>['\"]?\s*[:=]\s*['\"]?)"
    r"(?P<value>[^'\"\s,;&})\]]+)",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with every credential masked; text without credentials is returned as is."""
    if "@" not in text and "pass" not in text.lower() and "secret" not in text.lower():
        return text  # the common case: nothing to look for
    text = _URL_CREDENTIALS.sub(rf"\g<head>:{MASK}@", text)
    return _KEY_VALUE.sub(rf"\g<key>\g<sep>{MASK}", text)


class RedactingFilter(logging.Filter):
    """Masks credentials in a record's message and traceback before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


_FILTER = RedactingFilter()


def get_logger(name: str) -> logging.Logger:
    """The logger ``name`` with the redacting filter (added once)."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
