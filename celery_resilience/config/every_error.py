"""Every setting error at once, for ``celery resilience check``: fixed in one go, not one a run.

Start-up stops at the first error (``ResilienceConfig.from_conf`` raises, naming the setting).
Here each error's setting is set aside (its default read instead: a breaker's bad option, a
breaker with an unknown option, a whole setting) and the settings are read again, until they
read clean or nothing more can be set aside.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from .broker import MEMORY_URL

if TYPE_CHECKING:
    from . import ResilienceConfig

#: Read again at most this many times (each round sets one setting aside).
_ROUNDS = 100
_ABSENT = object()
#: ``resilience_breakers['payments']['window'] must be...``: the setting, then its path.
_NAMED = re.compile(r"^(resilience_\w+)((?:\[[^\]]*\])*)")
_STEP = re.compile(r"\[([^\]]*)\]")
_UNKNOWN = re.compile(r": unknown option ('[^']*'|\"[^\"]*\")")


class _SetAside:
    """``conf`` with some settings replaced (``_ABSENT``: read as not set)."""

    def __init__(self, conf: Any, replaced: Mapping[str, Any]) -> None:
        self._conf, self._replaced = conf, replaced

    def get(self, name: str, default: Any = None) -> Any:
        if name in self._replaced:
            value = self._replaced[name]
            return default if value is _ABSENT else value
        return self._conf.get(name, default)

    def items(self) -> Any:
        """The settings as given (their secrets are remembered for redaction)."""
        items = getattr(self._conf, "items", None)
        return items() if items is not None else ()


def setting_errors(conf: Any) -> tuple[list[ConfigurationError], ResilienceConfig | None]:
    """Every error of the ``resilience_*`` settings of ``conf``, and the configuration read
    with the bad ones set aside (``None`` if even that can't be read). The URL set aside reads
    as ``memory://``: nothing to connect to."""
    from . import ResilienceConfig

    replaced: dict[str, Any] = {}
    errors: list[ConfigurationError] = []
    for _ in range(_ROUNDS):
        try:
            return errors, ResilienceConfig.from_conf(_SetAside(conf, replaced))
        except ConfigurationError as exc:
            errors.append(exc)
            if not _set_aside(str(exc), _SetAside(conf, replaced), replaced):
                return errors, None
    return errors, None


def _set_aside(message: str, conf: _SetAside, replaced: dict[str, Any]) -> bool:
    """Replace what ``message`` blames; whether anything changed (else: stop)."""
    named = _NAMED.match(message)
    if named is None:
        return False
    name = named.group(1)
    path = [_literal(step) for step in _STEP.findall(named.group(2))]
    unknown = _UNKNOWN.search(message)
    if unknown is not None:
        path.append(_literal(unknown.group(1)))
    if name == "resilience_redis_url" and not path:
        if replaced.get(name) == MEMORY_URL:
            return False
        replaced[name] = MEMORY_URL  # not set and the broker is not Redis: absent won't do
        return True
    value = conf.get(name, _ABSENT)
    if path and isinstance(value, Mapping):
        pruned = _without(value, path)
        if pruned is not None:
            replaced[name] = pruned
            return True
    if replaced.get(name) is _ABSENT:
        return False
    replaced[name] = _ABSENT
    return True


def _without(value: Mapping[Any, Any], path: list[Any]) -> dict[Any, Any] | None:
    """A copy of ``value`` without the item at ``path``; ``None`` if there is no such item."""
    head, rest = path[0], path[1:]
    if head not in value:
        return None
    copy = dict(value)
    if not rest:
        del copy[head]
        return copy
    inner = value[head]
    if not isinstance(inner, Mapping):
        del copy[head]
        return copy
    pruned = _without(inner, rest)
    if pruned is None:
        del copy[head]
    else:
        copy[head] = pruned
    return copy


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
