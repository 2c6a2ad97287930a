"""Write tests/file_durations.json, the seconds each test file took, from a full run's JUnit report.
tests/conftest.py hands the longest files to the workers first.

    python -m pytest --junitxml=/tmp/report.xml && python -m tests.durations /tmp/report.xml
"""
from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

OUT = Path(__file__).with_name("file_durations.json")
ROOT = Path(__file__).resolve().parents[1]


def file_of(classname: str) -> str:
    """tests/x.py from a JUnit classname ("tests.x", or "tests.x.TestSome" for a test in a class)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (ROOT / path).is_file():
            return path
    return "/".join(parts) + ".py"


def file_seconds(report: Path) -> dict:
    """{tests/x.py: seconds of its test cases (setup, call and teardown)}, longest first."""
    totals: Counter = Counter()
    for case in ET.parse(report).iter("testcase"):
        totals[file_of(case.get("classname", ""))] += float(case.get("time") or 0)
    return {path: round(s, 1) for path, s in totals.most_common()}


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.durations", description=__doc__.splitlines()[0])
    p.add_argument("report", type=Path, help="the JUnit XML report of a full run (pytest --junitxml)")
    args = p.parse_args(argv)
    seconds = file_seconds(args.report)
    if not seconds:
        raise SystemExit(f"no test cases in {args.report}. HINT: pass the report of a full run")
    OUT.write_text(json.dumps(seconds, indent=1) + "\n")
    print(f"{OUT}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
