"""Writes ``tests/durations.json`` from a JUnit report of a main run: each test module's seconds.

    ./scripts/test --junitxml=build/suite.xml
    .venv/main/bin/python scripts/durations.py build/suite.xml

A module's seconds are the sum of its tests' (setup, call and teardown, as the report counts
them): how long the worker that ran it was busy with it. ``tests/support/schedule.py`` hands the
longest modules out first. Refresh the file when a module's duration changes much, or a new
module takes long.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = ROOT / "tests" / "durations.json"


def module_seconds(report: Path) -> dict[str, float]:
    """Module file name -> its tests' summed seconds, longest first, to a tenth of a second."""
    seconds: defaultdict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        # classname: "tests.test_cli" or, for a class of tests, "tests.test_cli.TestGroup"
        parts = case.get("classname", "").split(".")
        module = next(part for part in parts if part.startswith("test_"))
        seconds[f"{module}.py"] += float(case.get("time", "0"))
    return {name: round(total, 1) for name, total in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    DURATIONS.write_text(json.dumps(module_seconds(Path(argv[0])), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
