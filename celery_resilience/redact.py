"""No secret leaves the package: passwords are masked in every error, log line, repr and output.

Three nets, each for what the one before can't see:

* **Structure.** Where the package formats a value itself (a setting in an error, a repr, a
  URL in a message), the URL is masked by parsing it (:func:`masked_url`: the credentials end
  at the URL's last ``@``, so a password may hold any character) and every option whose name
  says secret (:func:`is_secret_name`: ``password``, ``ssl_keyfile_passphrase``, ``auth``,
  ``token``...) reads ``***``, at any depth (:func:`masked_value`).
* **Shapes.** :func:`redact` masks what looks like credentials in any text: a URL that is a
  whole quoted literal (a repr: the password may hold anything), a URL's ``user:password@`` in
  running text (up to the last ``@`` before a space or a quote), and a secret-named key's value
  (``'password': b'...'``, ``auth=('u', 'p')``, ``token='...'``).
* **The app's own secrets.** A password with a space or a quote can't be told from the text
  around it when a URL is written raw in running text. Reading an app's settings remembers
  such secrets (:func:`remember_settings`), and :func:`redact` masks each wherever it shows: as
  written, percent-encoded, escaped in a repr or in JSON. Only those: remembering every secret
  would mask a password that is a common word everywhere it is written.

:func:`get_logger` gives the package's loggers a filter that applies :func:`redact` to every
record, its formatted traceback included.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote, quote_plus, unquote

MASK = "***"
#: Shortest remembered secret masked wherever it shows (characters): shorter ones are masked by
#: their shape only.
MIN_REMEMBERED = 6
#: What makes a secret worth remembering: running text can't show where it ends.
_UNDELIMITED = re.compile(r"[\s'\"]")

#: Words that make an option's name secret-bearing (redis-py's ``password``, ``ssl_password``,
#: ``credential_provider``; kombu's and Sentinel's ``sentinel_kwargs['password']``; ``auth``,
#: ``ssl_keyfile_passphrase``, tokens and keys of other clients).
_SECRET_WORDS = (
    r"pass(?:word|wd|phrase)?|pwd|secret|token|auth(?:orization)?|credentials?"
    r"|(?:api|signing|encryption|private|access|secret)[_-]?keys?"
)
_SECRET_NAME = re.compile(rf"(?<![a-z])(?:{_SECRET_WORDS})(?![a-z])")
_SCHEME = r"[a-zA-Z][\w+.-]*://"
#: Schemes whose credentials are a key alone (kombu's Azure Storage Queues:
#: ``azurestoragequeues://<access key or SAS token>@<account URL>``).
_KEY_ONLY_SCHEMES = ("azurestoragequeues",)
#: kombu's lists of URLs (``sentinel://...;sentinel://...``): split before each scheme.
_URL_LIST = re.compile(rf"(;\s*)(?={_SCHEME})")
# In text: scheme://[user]:password@, the password running to the last "@" before a space, a
# quote (one escaped in a repr is part of it) or the next URL of a list.
_URL_PASSWORD = re.compile(
    rf"(?P<head>(?<![\w+.-]){_SCHEME}[^\s'\"/:@;]*):"
    rf"(?:\\['\"]|(?!;\s*{_SCHEME})[^\s'\"])*@"
)
# In text: the key of a scheme whose credentials are a key alone, up to the last "@".
_URL_KEY = re.compile(
    rf"(?P<head>(?<![\w+.-])(?i:{'|'.join(_KEY_ONLY_SCHEMES)})://)(?:\\['\"]|[^\s'\"])*@"
)
_QUOTED = r"[bB]?'(?:[^'\\\n]|\\.)*'|[bB]?\"(?:[^\"\\\n]|\\.)*\""
# A URL that is a whole quoted literal (a repr): its password may hold spaces and quotes too,
# since the literal's end is the URL's. Not after a letter: "can't" opens no literal.
_URL_LITERAL = re.compile(
    rf"(?<![\w'\"])(?:'(?P<single>{_SCHEME}(?:[^'\\\n]|\\.)*)'"
    rf"|\"(?P<double>{_SCHEME}(?:[^\"\\\n]|\\.)*)\")"
)
# key<sep>value (:func:`masked_pairs` masks the value when the key's name says so): a quoted
# literal (str or bytes, escapes honoured), a bracketed sequence, an object's repr, or a bare
# word. The separator is "=", or ":" after a quoted key (a dict's repr, JSON); after a bare
# key, ":" counts before a quoted value only ("resilience_signing_key: key #1 is..." is prose).
_PAIR = re.compile(
    r"(?P<key>(?<![\w.-])[A-Za-z_][\w.-]*)"
    r"(?P<sep>['\"][ \t]*[:=][ \t]*|[ \t]*=[ \t]*|[ \t]*:[ \t]*(?=[bB]?['\"(\[<]))"
    rf"(?P<value>{_QUOTED}|\((?:{_QUOTED}|[^()'\"])*\)|\[(?:{_QUOTED}|[^\[\]'\"])*\]"
    r"|<[^<>\n]*>|[^\s,;&'\"(\[<{})\]]+)"
)
#: What every credential :func:`redact` masks holds (a word of ``_SECRET_WORDS``, or a URL's
#: ``://``): a few substring tests rule out most text, far sooner than a pattern would.
_HINTS = ("pass", "pwd", "secret", "token", "auth", "credential", "key", "://")


def _may_hold_credentials(text: str) -> bool:
    lowered = text.lower()
    return any(hint in lowered for hint in _HINTS)


def is_secret_name(name: str) -> bool:
    """Whether an option or key called ``name`` holds a secret (one of its words says so:
    ``ssl_password``, ``sslPassword``, ``x-api-key``; not ``passport`` nor ``author``)."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    return _SECRET_NAME.search(snake) is not None


def _password_span(url: str) -> tuple[int, int] | None:
    """Where the password of one URL is: after ``scheme://user:``, up to its last ``@`` (all
    of what is before it, for a scheme whose credentials have no user)."""
    start = re.match(_SCHEME, url)
    if start is None:
        return None
    at = url.rfind("@", start.end())
    if at >= 0 and url[: start.end() - 3].lower() in _KEY_ONLY_SCHEMES:
        return start.end(), at
    colon = url.find(":", start.end(), at) if at >= 0 else -1
    return (colon + 1, at) if colon >= 0 else None


def _urls(text: str) -> list[str]:
    return _URL_LIST.split(text)  # separators kept, at odd positions


def masked_url(url: str) -> str:
    """``url`` (or a ``;``-separated list of them) with each password read ``***``, whatever
    characters it holds."""
    parts = []
    for part in _urls(url):
        span = _password_span(part)
        parts.append(part if span is None else part[: span[0]] + MASK + part[span[1] :])
    return "".join(parts)


def masked_value(value: Any, secret: bool = False) -> Any:
    """``value`` as an error or a repr may show it: URLs masked, and the value of every key
    whose name says secret replaced by ``***``, in mappings, lists and tuples at any depth."""
    if secret:
        return value if value is None or value in ("", b"") else MASK
    if isinstance(value, str):
        return masked_url(value) if "://" in value else value
    if isinstance(value, Mapping):
        return {
            k: masked_value(v, isinstance(k, str) and is_secret_name(k)) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        if len(value) == 2 and isinstance(value[0], str) and is_secret_name(value[0]):
            pair = (value[0], masked_value(value[1], True))  # a (name, value) pair
            return list(pair) if isinstance(value, list) else pair
        masked = [masked_value(v) for v in value]
        return masked if isinstance(value, list) else tuple(masked)
    return value


def masked_repr(obj: Any) -> str:
    """A dataclass's repr with :func:`masked_value` applied to each field (a field named like
    a secret shows ``***``)."""
    fields = ", ".join(
        f"{f.name}={masked_value(getattr(obj, f.name), is_secret_name(f.name))!r}"
        for f in dataclasses.fields(obj)
        if f.repr
    )
    return f"{type(obj).__name__}({fields})"


# -- the secrets an app's settings carry -------------------------------------------------------
_remembered: frozenset[str] = frozenset()
_remembered_pattern: re.Pattern[str] | None = None
_remembering = threading.Lock()
#: Settings read when a configuration can't list its own (it offers ``get`` alone).
_KNOWN_SETTINGS = (
    "broker_url",
    "result_backend",
    "resilience_redis_url",
    "resilience_redis_options",
    "broker_transport_options",
    "resilience_signing_key",
    "resilience_encryption_key",
)


def remember_settings(conf: Any) -> None:
    """Remember the secrets of ``conf`` (a Celery app's ``conf``, or anything with ``get``): the
    value of each setting or option named like a secret, and every URL's password."""
    items = getattr(conf, "items", None)
    if items is not None:
        pairs = list(items())
    else:
        pairs = [(name, conf.get(name)) for name in _KNOWN_SETTINGS]
    for name, value in pairs:
        remember(value, isinstance(name, str) and is_secret_name(name))


def remember(value: Any, secret: bool = False) -> None:
    """Remember the secrets ``value`` carries (all of it when ``secret``) that hold a space or a
    quote, in every form text may show them in, for :func:`redact`."""
    global _remembered, _remembered_pattern
    forms = {f for s in _secrets(value, secret) for f in _forms(s) if len(f) >= MIN_REMEMBERED}
    if forms <= _remembered:
        return
    with _remembering:
        known = _remembered | forms
        alternatives = "|".join(re.escape(f) for f in sorted(known, key=len, reverse=True))
        _remembered_pattern, _remembered = re.compile(alternatives), known


def _secrets(value: Any, secret: bool) -> Iterator[str | bytes]:
    if isinstance(value, (str, bytes)):
        if secret:
            yield value
        elif isinstance(value, str) and "://" in value:
            for part in _urls(value):
                span = _password_span(part)
                if span is not None:
                    yield part[span[0] : span[1]]
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _secrets(v, secret or (isinstance(k, str) and is_secret_name(k)))
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            yield from _secrets(v, secret)


def _forms(secret: str | bytes) -> set[str]:
    """How text may show ``secret`` (as is, decoded from or encoded for a URL, inside a repr or
    a JSON string, as bytes) when its shape can't: empty for a secret without a space or a
    quote."""
    text = secret.decode(errors="replace") if isinstance(secret, bytes) else secret
    if not (_UNDELIMITED.search(text) or _UNDELIMITED.search(unquote(text))):
        return set()
    forms = {repr(secret)[2:-1]} if isinstance(secret, bytes) else set()
    for plain in {text, unquote(text)}:
        forms |= {plain, quote(plain, safe=""), quote(plain), quote_plus(plain)}
        forms |= {repr(plain)[1:-1], json.dumps(plain)[1:-1], repr(plain.encode())[2:-1]}
    return forms


# -- text ---------------------------------------------------------------------------------------
def redact(text: str) -> str:
    """``text`` with every credential masked; text without credentials is returned as is."""
    pattern = _remembered_pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    if not _may_hold_credentials(text):
        return text  # the common case: nothing shaped like a credential
    text = _URL_LITERAL.sub(_url_literal, text)
    text = _URL_PASSWORD.sub(rf"\g<head>:{MASK}@", text)
    text = _URL_KEY.sub(rf"\g<head>{MASK}@", text)
    return masked_pairs(text, is_secret_name)


def _url_literal(match: re.Match[str]) -> str:
    quote_mark = "'" if match.group("single") is not None else '"'
    return quote_mark + masked_url(match.group("single") or match.group("double")) + quote_mark


def masked_pairs(text: str, secret: Callable[[str], bool]) -> str:
    """``text`` with the value beside each name ``secret`` says yes to masked (``name=...``,
    ``'name': ...``), at any depth of the values beside other names."""

    def pair(match: re.Match[str]) -> str:
        key, sep, value = match.group("key", "sep", "value")
        if not secret(key):  # a secret may sit inside its value: look there too
            return key + sep + _PAIR.sub(pair, value)
        quote_mark = value.lstrip("bB")[:1]
        if quote_mark not in ("'", '"'):
            # A bare value beside a JSON key ("signing_keys": 2) is masked as a string, so that
            # the text stays JSON; elsewhere (key=value, a repr) it is masked bare.
            quote_mark = '"' if sep.startswith('"') and ":" in sep else ""
        return key + sep + quote_mark + MASK + quote_mark

    return _PAIR.sub(pair, text)


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
