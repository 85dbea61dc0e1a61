"""Parked tasks one a line, within 120 columns: what is parked, since when, and why.

The entry id is cut to its first characters (``show`` takes a unique prefix), times are UTC
(the header says so), and the two free-text columns, the masked arguments and the error (for
a dead entry, why it is dead), share what the fixed columns leave of the width.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..backout.entry import ParkedTask
from ..backout.masking import SHOW_ALL, Masking
from ..backout.summary import cut, summary
from .output import printable, status_text, when

#: The width a list fits in: a terminal split in two, a wide pager, a ticket.
WIDTH = 120
#: Characters of the entry id shown (``show`` finds an entry by a unique prefix).
ID_SHOWN = 8
#: The longest a task name or a breaker name gets before it is cut.
NAME_MAX = 24
BREAKER_MAX = 16
HEADERS = ("id", "parked (UTC)", "task", "breaker", "reason", "arguments", "error")
_GAP = "  "
#: The least each free-text column gets, even when names are long.
_FREE_MIN = 12


def why(entry: ParkedTask) -> str:
    """The reason it was parked, ``dead (<code>)`` (it waits for a person, or will once a drain
    sees it: an entry this process can't decode or trust), or ``held`` (it waits for a process
    that can read it)."""
    if entry.dead_reason:
        return status_text(entry)
    return "held" if entry.held else entry.reason


def error(entry: ParkedTask, masking: Masking = SHOW_ALL) -> str:
    """A dead entry's dead reason beyond its code, why a held one is held, else the exception
    (its type's own name and its message, sensitive values masked)."""
    if entry.held:
        return entry.held
    detail = (entry.dead_reason or "").partition(":")[2].strip()
    if entry.status == "dead" and detail:
        return detail
    if not entry.exc_type:
        return "-"
    kind = entry.exc_type.rpartition(".")[2]
    message = masking.text(entry.exc_message, entry.task_name, entry.args, entry.kwargs)
    return f"{kind}: {message}" if message else kind


def rows(entries: Sequence[ParkedTask], masking: Masking = SHOW_ALL, width: int = WIDTH) -> str:
    """The table of ``entries``, each line at most ``width`` characters."""
    fixed = [
        [
            e.id[:ID_SHOWN],
            when(e.parked_at),
            printable(cut(e.task_name, NAME_MAX)),
            printable(cut(e.breaker or "-", BREAKER_MAX)),
            why(e),
        ]
        for e in entries
    ]
    widths = [max([len(h), *(len(r[i]) for r in fixed)]) for i, h in enumerate(HEADERS[:5])]
    free = max(2 * _FREE_MIN, width - sum(widths) - len(_GAP) * 6)
    # Escaped before they are measured: an escape is wider than the character it stands for.
    shown_args = [printable(summary(e, masking, width)) for e in entries]
    errors = [printable(error(e, masking)) for e in entries]
    # What each needs; when both can't fit, the arguments get at least two fifths.
    args_need = max([len(HEADERS[5]), *map(len, shown_args)])
    error_need = max([len(HEADERS[6]), *map(len, errors)])
    args_width = min(args_need, max(free - error_need, free * 2 // 5))
    error_width = free - args_width
    lines = [_line([*HEADERS], widths, args_width)]
    dashes = ["-" * w for w in [*widths, args_width, len(HEADERS[6])]]
    lines.append(_line(dashes, widths, args_width))
    for cells, args, why_not in zip(fixed, shown_args, errors, strict=True):
        row = [*cells, cut(args, args_width), cut(why_not, error_width)]
        lines.append(_line(row, widths, args_width))
    return "\n".join(line.rstrip() for line in lines)


def _line(cells: list[str], widths: list[int], args_width: int) -> str:
    padded = [c.ljust(w) for c, w in zip(cells, [*widths, args_width], strict=False)]
    return _GAP.join([*padded, *cells[len(padded) :]])
