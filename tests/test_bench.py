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
    assert len(cells) == 15  # hpc's writer, the synchronous save and DCP side by side
    assert all(re.fullmatch(r"[\d.]+ (ms|s)", c) for c in (cells[3], cells[4], cells[6]))
    assert re.fullmatch(r"[\d.]+%", cells[5]) and re.fullmatch(r"[\d.]+%", cells[7])
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


def _fake_benchmarks(monkeypatch, value):
    """Two benchmarks whose run() reports `value`, in modules made up for the test."""
    import types

    import bench.__main__ as cli

    for name in ("one", "two"):
        mod = types.ModuleType(f"fake_bench_{name}")

        def run(ctx, name=name):
            return Section(name, name.title(), "x <= 1", f"python -m bench --only {name}",
                           headers=["value"], rows=[[str(value)]], verdicts=[("ok", value <= 1)])

        mod.run = run
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setattr(cli, "BENCHMARKS", {n: (f"fake_bench_{n}", n.title(), "x <= 1") for n in ("one", "two")})
    return cli


def test_only_replaces_its_sections_and_keeps_the_others(tmp_path, monkeypatch):
    out = tmp_path / "B.md"
    cli = _fake_benchmarks(monkeypatch, 0.5)
    assert cli.main(["--out", str(out)]) == 0
    assert (tmp_path / "B.json").exists() and out.read_text().count("| 0.5 |") == 2
    cli = _fake_benchmarks(monkeypatch, 7)
    assert cli.main(["--only", "two", "--out", str(out)]) == 0
    text = out.read_text()
    assert "kept from earlier runs: One" in text and "| 1 | One | x <= 1 | met |" in text
    assert "| 2 | Two | x <= 1 | NOT met |" in text and "| 7 |" in text and "| 0.5 |" in text
    assert text.index("## 1. One") < text.index("## 2. Two") and text.count("Measured: ") == 2
    cli.main(["--only", "one", "--quick", "--out", str(out)])  # a smoke run: reported, never kept
    assert "kept from" not in out.read_text()
    import json

    kept = {d["name"]: d["rows"] for d in json.loads((tmp_path / "B.json").read_text())}
    assert kept == {"one": [["0.5"]], "two": [["7"]]}


def test_quick_fsdp_sections_are_measured_beside_their_baselines(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    run = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", "fsdp", "fsdp-checkpoint",
                          "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                         timeout=540)  # a hang guard: 77 s on a shared 2-core machine at a load of 6
    assert run.returncode == 0, run.stderr
    text = out.read_text()
    assert "not measured" not in text, text
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")]
            for ln in text.splitlines() if ln.startswith("| ")}
    # step time: the hand-written baseline is 1.000x by construction, the hpc rows a ratio to it
    assert rows["hand-written FSDP2 (fully_shard per block, then the root)"][-1] == "1.000x"
    assert re.fullmatch(r"[\d.]+x", rows['s.wrap(model, strategy="fsdp")'][-1])
    # checkpoints: one row per strategy, each with a committed checkpoint's size and a stop time
    for strategy in ("DDP", "FSDP"):
        cells = rows[strategy]
        assert re.fullmatch(r"[\d.]+ MiB", cells[1]) and float(cells[1].split()[0]) > 0
        assert all(re.fullmatch(r"[\d.]+ (ms|s)", c) for c in (cells[3], cells[4], cells[8]))
    assert len(re.findall(r"- (met|NOT met): (DDP|FSDP): safe [\d.]+ (ms|s) after SIGTERM", text)) == 2


def test_benchmarks_and_fault_campaigns_are_apart():
    """bench/ measures time; the fault campaigns are the faults package, run as python -m faults.reliability."""
    import bench.__main__ as cli

    assert all(module.startswith("bench.") for module, _, _ in cli.BENCHMARKS.values())
    assert not [p.name for p in (REPO / "bench").glob("*.py") if p.name.startswith("faults") or "reliab" in p.name]
    run = subprocess.run([sys.executable, "-m", "bench", "--only", "reliability"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.strip().splitlines()[-1].endswith("HINT: python -m faults.reliability")
    run = subprocess.run([sys.executable, "-m", "faults.reliability", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.startswith("usage: python -m faults.reliability"), run.stderr


def test_an_unresolved_ratio_says_how_many_launches_would_resolve_it():
    """The interval narrows with the square root of the launches: a half-width of 0.0185 around
    1.006x needs (0.0185 / 0.014)^2 = 1.75 times the 16 launches to clear 1.02x."""
    from bench.interleave import Estimate

    unresolved = Estimate(1.006, 0.987, 1.024, 640, 16, 1.0).verdict(1.02)
    assert unresolved.endswith("about 28 launches instead of 16 would tell it from 1.02x)")
    assert Estimate(1.0, 0.99, 1.01, 640, 16, 1.0).verdict(1.02) == "the whole interval is at or below the target"
    assert "launches" not in Estimate(1.02, 1.0, 1.04, 640, 16, 1.0).verdict(1.02)  # on the target: no answer


def test_a_preemption_run_whose_rank_failed_is_launched_once_more(monkeypatch):
    """A rank of the preemption run that aborts (as gloo's teardown did in CI) costs a second launch
    in an empty directory, said in the notes, not the section. The ranks' launches are replaced:
    an abort cannot be produced on demand, and the stall runs are not what is tested."""
    import shutil

    import bench.fsdp_checkpoint as fc
    from bench.common import Context

    launches = []

    def preempt_once(strategy, out, settle=True, blocks=fc.BLOCKS):
        launches.append(strategy)
        assert not list(out.iterdir()), "a launch must start from an empty directory"
        (out / "checkpoints").mkdir()
        if launches.count(strategy) == 1:
            raise RuntimeError(f"{strategy} preemption: ranks exited [0, -6]: terminate called without an "
                               "active exception")
        return {"safe": 0.2, "seen": 0.01, "step_s": 0.05, "bytes": 2**20, "write": 0.1}

    def run_ranks(module, args, out, what, repeated):
        runs = args[args.index("--runs") + 1:args.index("--steps")]
        total = int(args[args.index("--steps") + 1]) + fc.WARMUP
        return {r: {"step_s": [0.1] * (total - fc.WARMUP), "first_step": fc.WARMUP + 1, "total": total,
                    "blocked_s": [0.01 if r.endswith("async") else 0.2]} for r in runs}

    monkeypatch.setattr(fc, "preempt_once", preempt_once)
    monkeypatch.setattr(fc, "run_ranks", run_ranks)
    ctx = Context(quick=True)
    try:
        sec = fc.run(ctx)
    finally:
        shutil.rmtree(ctx.tmp, ignore_errors=True)
    assert launches == ["ddp", "ddp", "fsdp", "fsdp"]
    assert [row[0] for row in sec.rows] == ["DDP", "FSDP"]
    assert any(n.startswith("2 launch(es) failed and were launched again") and "-6" in n for n in sec.notes)
