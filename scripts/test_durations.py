"""Write tests/durations.json, the seconds each test file took, from a run's JUnit XML.

    .venv/bin/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile --junitxml=/tmp/j.xml
    .venv/bin/python scripts/test_durations.py /tmp/j.xml

tests/conftest.py hands the files to pytest-xdist's workers longest first, so no long file is
left for one worker at the end. Measure on an idle machine like CI's (2 cores): the order is
what matters, not the figures. A file missing from the table counts as the median.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def file_seconds(junit: Path) -> dict[str, float]:
    """test file (as pytest names it, from the repo's root) -> seconds of all its tests."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").split(".")
        # "tests.unit.test_x" or "tests.unit.test_x.TestClass": the module is the file
        for cut in range(len(path), 0, -1):
            candidate = "/".join(path[:cut]) + ".py"
            if (ROOT / candidate).is_file():
                totals[candidate] += float(case.get("time", 0.0))
                break
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: scripts/test_durations.py JUNIT_XML (a pytest --junitxml file)",
              file=sys.stderr)
        return 2
    table = {name: round(s, 1) for name, s in file_seconds(Path(argv[0])).items()}
    if not table:
        print(f"{argv[0]}: no test case of a file under tests/", file=sys.stderr)
        return 2
    out = ROOT / "tests" / "durations.json"
    out.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    print(f"{out.relative_to(ROOT)}: {len(table)} files, {sum(table.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
