"""Smoke test of the benchmark harness: python -m bench --quick --only checkpoint writes a report.

    python -m pytest tests/test_bench.py
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from bench.report import Section, render

REPO = Path(__file__).resolve().parent.parent


def test_quick_checkpoint_report_is_written_and_well_formed(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    run = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", "checkpoint", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    text = out.read_text()
    assert text.startswith("# Benchmarks\n")
    assert "Produced by `python -m bench --only checkpoint --quick`" in text
    assert re.search(r"Machine: \d+ cores, .+, [\d.]+ GiB RAM", text)
    # the summary row and the section both carry a verdict, and the figures are numbers with units
    assert re.search(r"\| 1 \| Checkpoint stall per save \| .+ \| (met|NOT met) \|", text)
    row = next(ln for ln in text.splitlines() if ln.startswith("| 10 MB |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 11
    assert all(re.fullmatch(r"[\d.]+ (ms|s)", c) for c in (cells[3], cells[4]))
    assert re.fullmatch(r"[\d.]+%", cells[5])
    assert "not measured" not in text


def test_missing_piece_is_reported_not_invented():
    s = Section("x", "X", "x <= 1 s", "python -m bench --only x", not_measured="hpc.x is not written yet")
    text = render([s], "python -m bench --only x")
    assert "| 1 | X | x <= 1 s | not measured |" in text
    assert "not measured: hpc.x is not written yet" in text


def test_outcome_needs_every_check():
    s = Section("x", "X", "t", "c", verdicts=[("a", True), ("b", False)])
    assert s.outcome == "NOT met"
    s.verdicts = [("a", True)]
    assert s.outcome == "met"
    s.verdicts = []
    assert s.outcome == "not measured"
