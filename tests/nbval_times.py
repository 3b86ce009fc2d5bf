"""Per-notebook wall time from nbval's JUnit XML: ``python tests/nbval_times.py nbval.xml`` prints a markdown table.

Used by ``.ci/gpu`` (and handy after any ``pytest --junitxml``) to report how long each chapter took to execute.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def notebook_times(path: str) -> dict[str, float]:
    """Seconds per notebook: the sum of its cells' test-case times."""
    times: dict[str, float] = defaultdict(float)
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.get("classname", "").endswith(".ipynb") or ".ipynb" in case.get("file", "") + case.get("classname", ""):
            name = case.get("classname") or case.get("file")
            times[name.replace(".ipynb", "").replace(".", "/") + ".ipynb"] += float(case.get("time", 0))
    return dict(times)


if __name__ == "__main__":
    rows = notebook_times(sys.argv[1])
    print("| notebook | seconds |\n| --- | --- |")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds:.1f} |")
    print(f"| **total** | {sum(rows.values()):.1f} |")
