"""Prints the part of a lock file that some packages with their extras need, hashes kept.

    python scripts/lock_subset.py requirements/main.txt "celery-resilience[prometheus,demo]" ...

Run with the interpreter of an environment made from that lock file (scripts/venv main): the
requirements are read from its installed metadata, markers and extras evaluated, down to every
package they need. scripts/test-wheel installs the wheel's dependencies with it: the locked
versions, without the test, lint and docs tools the suite needs and the wheel does not.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(name: str, extras: set[str]) -> set[str]:
    """Names (canonical) of the packages ``name[extras]`` needs."""
    needed: set[str] = set()
    todo = [(name, extras)]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        current, wanted = todo.pop()
        key = (canonicalize_name(current), frozenset(wanted))
        if key in seen:
            continue
        seen.add(key)
        for line in distribution(current).requires or ():
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is not None and not any(
                marker.evaluate({"extra": extra}) for extra in (wanted or {""})
            ):
                continue
            needed.add(canonicalize_name(requirement.name))
            todo.append((requirement.name, set(requirement.extras)))
    return needed


def blocks(lock: str) -> dict[str, str]:
    """Each pinned package's lines (pin, hashes, comments), by canonical name."""
    found: dict[str, str] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", lock):
        pin = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==", block)
        if pin:
            found[canonicalize_name(pin.group(1))] = block.rstrip("\n")
    return found


def main(lock_file: str, *specs: str) -> None:
    pinned = blocks(Path(lock_file).read_text())
    needed: set[str] = set()
    for spec in specs:
        requirement = Requirement(spec)
        needed |= closure(requirement.name, set(requirement.extras))
        needed.add(canonicalize_name(requirement.name))
    needed.discard(canonicalize_name("celery-resilience"))  # the wheel, not the lock
    missing = sorted(needed - set(pinned))
    if missing:
        sys.exit(f"{lock_file} pins none of {missing}")
    print("\n".join(pinned[name] for name in sorted(needed)))


if __name__ == "__main__":
    main(*sys.argv[1:])
