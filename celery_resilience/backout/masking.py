"""What no person may read of a task: the values of its sensitive arguments, wherever they show.

``resilience_sensitive_keys`` names arguments. A value is sensitive when its name is one of
them: a keyword argument's, a key of a mapping at any depth, or a positional argument's, named
by the task's own signature (:class:`Positions`; a bound task's ``self`` is not a position).
Where the signature is unknown (the task is not registered in this process), every positional
argument is taken as sensitive, masking more rather than showing a secret.

The same values are masked in free text (:meth:`Masking.text`): an exception's message or
traceback that quotes a card number is shown with ``***`` in its place. And
``resilience_error_text`` says what of an error's message leaves the store at all
(:meth:`Masking.error`): the result backend's meta, the ``task-parked`` event, log lines.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config.trust import ErrorText
from ..redact import MASK, masked_pairs, redact

__all__ = ["EVERYTHING", "EVERY_KEY", "MASK", "SHOW_ALL", "Masking", "Positions", "stand_in"]

#: Shortest quote of a sensitive value masked in free text (characters): a shorter one (an
#: amount of 1, a flag "y") would mask every number or word like it; beside its name
#: (``amount=1``) it is masked whatever its length.
MIN_TEXT_FORM = 3
#: Stands for every key: what a page masks when it cannot read the app's sensitive keys
#: (a bad setting, no usable app), masking more rather than showing a secret.
EVERY_KEY = ("*",)


@dataclass(frozen=True)
class Positions:
    """The positional parameters of a task: their names in order, and its ``*args`` name."""

    names: tuple[str, ...] = ()
    rest: str | None = None

    def name(self, index: int) -> str | None:
        """The parameter the ``index``-th positional argument binds to (``None``: beyond a
        signature without ``*args``)."""
        return self.names[index] if index < len(self.names) else self.rest


def _no_signature(task_name: str) -> Positions | None:
    return None


@dataclass(frozen=True)
class Masking:
    """How an app shows its tasks' arguments and errors to people and logs."""

    #: ``resilience_sensitive_keys`` (lower case); :data:`EVERY_KEY` masks every value.
    keys: tuple[str, ...] = ()
    #: ``resilience_error_text``.
    error_text: ErrorText = "full"
    #: A task's positional parameters by its name, ``None`` when this process can't tell.
    positions: Callable[[str], Positions | None] = field(default=_no_signature, compare=False)

    def sensitive(self, name: str | None) -> bool:
        return bool(self.keys) and ("*" in self.keys or (name or "").lower() in self.keys)

    def value(self, value: Any) -> Any:
        """``value`` with every mapping's sensitive keys masked, at any depth of mappings,
        lists and tuples: the second item of a pair whose first names a sensitive key
        (``[("card", "4111...")]``), the positional arguments of a task's signature (a
        ``link``) by that task's parameters, and inside a string that is JSON."""
        if not self.keys:
            return value
        if isinstance(value, Mapping):
            masked = {
                k: MASK if isinstance(k, str) and self.sensitive(k) else self.value(v)
                for k, v in value.items()
            }
            if _is_signature(value):
                masked["args"] = self.args(value["task"], value["args"])
            return masked
        if isinstance(value, (list, tuple)):
            if _is_pair(value) and self.sensitive(value[0]):
                return type(value)((value[0], MASK))
            return type(value)(self.value(v) for v in value)
        if isinstance(value, str) and (decoded := _json_container(value)) is not None:
            masked_json = self.value(decoded)
            return value if masked_json == decoded else json.dumps(masked_json)
        return value

    def args(self, task_name: str, args: Any) -> list[Any]:
        """The positional arguments of a call of ``task_name``, each sensitive one masked."""
        given: list[Any] = list(args or ())
        if not self.keys:
            return given
        marked = self._marks(task_name, given)
        return [MASK if sensitive else self.value(value) for value, sensitive in marked]

    def _marks(self, task_name: str, args: list[Any]) -> Iterator[tuple[Any, bool]]:
        positions = self.positions(task_name)
        for index, value in enumerate(args):
            yield value, positions is None or self.sensitive(positions.name(index))

    def secrets(self, task_name: str, args: Any, kwargs: Any) -> list[Any]:
        """The sensitive values of a call: what :meth:`text` masks."""
        if not self.keys:
            return []
        found: list[Any] = []
        for value, sensitive in self._marks(task_name, list(args or ())):
            found += _leaves(value) if sensitive else self._nested(value)
        for name, value in dict(kwargs or {}).items():
            found += _leaves(value) if self.sensitive(name) else self._nested(value)
        return found

    def _nested(self, value: Any) -> list[Any]:
        if isinstance(value, Mapping):
            found = [
                leaf
                for k, v in value.items()
                for leaf in (_leaves(v) if self.sensitive(str(k)) else self._nested(v))
            ]
            if _is_signature(value):
                found += self.secrets(value["task"], value["args"], {})
            return found
        if isinstance(value, (list, tuple)):
            if _is_pair(value) and self.sensitive(value[0]):
                return _leaves(value[1])
            return [leaf for v in value for leaf in self._nested(v)]
        if isinstance(value, str) and (decoded := _json_container(value)) is not None:
            return self._nested(decoded)
        return []

    def text(self, text: str, task_name: str, args: Any, kwargs: Any) -> str:
        """``text`` (an error's message, a traceback) with every sensitive value of the call
        masked where it shows whole, and the value beside a sensitive name (``card=...``)."""
        if not self.keys or not text:
            return text
        forms = {form for value in self.secrets(task_name, args, kwargs) for form in _quotes(value)}
        if forms:
            text = _pattern(frozenset(forms)).sub(MASK, text)
        return masked_pairs(text, self.sensitive)

    def error(self, message: str, task_name: str, args: Any, kwargs: Any) -> str:
        """What of an error's ``message`` (or its traceback) may leave the store
        (``resilience_error_text``): all of it, none of it (the type says enough), or it with
        the sensitive values masked; credentials are masked in any case."""
        if self.error_text == "type":
            return ""
        if self.error_text == "masked":
            message = self.text(message, task_name, args, kwargs)
        return redact(message)

    def exception(
        self, exc: BaseException | None, task_name: str, args: Any, kwargs: Any
    ) -> BaseException | None:
        """``exc`` as it may leave the store (a retry's cause, which Celery stores and logs):
        itself when :meth:`error` shows its message whole, else :func:`stand_in` for it,
        carrying the message shown (none: its type alone)."""
        if exc is None:
            return None
        message = str(exc)
        shown = self.error(message, task_name, args, kwargs)
        if shown == message:
            return exc
        return stand_in(type(exc), shown)


#: Shows every value: no key is sensitive.
SHOW_ALL = Masking()
#: Masks every value: what a page shows when it cannot read the app's settings.
EVERYTHING = Masking(EVERY_KEY)


def stand_in(kind: type[BaseException], message: str) -> BaseException:
    """An exception of ``kind`` (an instance of a subclass of it with its names, so that
    ``except``, ``retry_on`` and ``park_on`` match it and a result backend records its type's
    name) that says ``message`` alone: ``kind``'s own ``__init__`` and ``__str__`` are not run,
    since they may take other arguments or read attributes the stand-in lacks, and it pickles
    whatever ``kind``'s constructor takes. A type that can't be subclassed gets a plain
    ``Exception`` saying ``<its name>: message``."""
    try:
        shown = _stand_in_class(kind)
    except TypeError:
        return Exception(f"{kind.__qualname__}: {message}" if message else kind.__qualname__)
    return shown(message) if message else shown()


#: Each type's stand-in class, made once.
_stand_ins: dict[type[BaseException], type[BaseException]] = {}


def _stand_in_class(kind: type[BaseException]) -> type[BaseException]:
    made = _stand_ins.get(kind)
    if made is None:
        made = _stand_ins[kind] = _new_stand_in_class(kind)
    return made


def _new_stand_in_class(kind: type[BaseException]) -> type[BaseException]:
    def __init__(self: BaseException, *args: Any) -> None:
        self.args = args

    def __str__(self: BaseException) -> str:
        return str(self.args[0]) if self.args else ""

    def __repr__(self: BaseException) -> str:
        return f"{kind.__qualname__}({', '.join(map(repr, self.args))})"

    def __reduce__(self: BaseException) -> tuple[Any, ...]:
        return stand_in, (kind, str(self))

    namespace: dict[str, Any] = {
        "__init__": __init__,
        "__str__": __str__,
        "__repr__": __repr__,
        "__reduce__": __reduce__,
        "__module__": kind.__module__,
        "__qualname__": kind.__qualname__,
        "__doc__": kind.__doc__,
    }
    made: type[BaseException] = type(kind.__name__, (kind,), namespace)
    return made


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, Mapping):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def _quotes(value: Any) -> set[str]:
    """How a message may quote ``value``: its text, its repr's inside, its JSON string's inside.
    None shorter than :data:`MIN_TEXT_FORM`: such a value is masked beside its name only."""
    if value is None or isinstance(value, bool):
        return set()
    if isinstance(value, bytes):
        forms = {repr(value)[2:-1], value.decode(errors="replace")}
    elif isinstance(value, str):
        forms = {value, repr(value)[1:-1]}
        if not (value.isascii() and value.isprintable()) or '"' in value or "\\" in value:
            forms.add(json.dumps(value)[1:-1])  # JSON escapes it another way
    else:
        forms = {str(value), repr(value)}
    return {form for form in forms if len(form.strip()) >= MIN_TEXT_FORM}


@functools.lru_cache(maxsize=256)
def _pattern(forms: frozenset[str]) -> re.Pattern[str]:
    """One pattern for ``forms``, compiled once: each call of a task quotes the same values."""
    return re.compile("|".join(map(_whole, sorted(forms, key=len, reverse=True))))


def _is_pair(value: list[Any] | tuple[Any, ...]) -> bool:
    """A ``(name, value)`` pair, as headers and form fields are often passed."""
    return len(value) == 2 and isinstance(value[0], str)


def _is_signature(value: Mapping[Any, Any]) -> bool:
    """A task's signature as a message carries it (a ``link``, a chain's next step)."""
    return (
        isinstance(value.get("task"), str)
        and isinstance(value.get("args"), (list, tuple))
        and "subtask_type" in value
    )


def _json_container(text: str) -> Any:
    """The object or array a string holds as JSON (a payload passed encoded), else ``None``."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        decoded = json.loads(stripped)
    except ValueError:
        return None
    return decoded if isinstance(decoded, (dict, list)) else None


def _whole(form: str) -> str:
    """``form`` as a pattern that matches it whole: not inside a longer word or number
    (``123`` masks the CVV, not a part of ``41234``)."""
    head = r"(?<![0-9A-Za-z])" if form[0].isalnum() else ""
    tail = r"(?![0-9A-Za-z])" if form[-1].isalnum() else ""
    return head + re.escape(form) + tail
