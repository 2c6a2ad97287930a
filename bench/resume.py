"""Resume: time from job start to the first training step when resuming from a checkpoint, against
a fresh start of the same job, both measured in this run.

    python -m bench --only resume

The job is bench.trainjob (hpc.ddp.session + hpc.trainloop.TrainLoop, one process, outside SLURM);
"job start" is the parent launching the process, so interpreter start and `import torch` count,
as they do for a requeued job. Fresh and resumed starts alternate; the medians are compared.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Dict, List

from bench.common import Context, fmt_s, median, run_child
from bench.report import Section

SIZE_MB, QUICK_SIZE_MB = 100, 10
REPEATS, QUICK_REPEATS = 4, 2
TARGET = 1.2


def first_step(out: Path, size_mb: int) -> Dict[str, float]:
    t_launch = time.time()
    r = run_child("trainjob", ["--out", str(out), "--size-mb", str(size_mb), "--mode", "first-step"])
    return {"to_first_step": r["t_first_step"] - t_launch, "to_python": r["t_process"] - t_launch,
            "resumed": r["resumed"]}


def run(ctx: Context) -> Section:
    size = QUICK_SIZE_MB if ctx.quick else SIZE_MB
    repeats = QUICK_REPEATS if ctx.quick else REPEATS
    sec = Section("resume", "Resume: job start to first step", f"resuming <= {TARGET} x a fresh start",
                  "python -m bench --only resume" + (" --quick" if ctx.quick else ""),
                  headers=["start", "model state", "launch -> first step (median)", "launch -> bench code runs",
                           "runs", "ratio"])
    saved = ctx.scratch("resume-saved")
    run_child("trainjob", ["--out", str(saved), "--size-mb", str(size), "--mode", "save"])
    fresh: List[Dict[str, float]] = []
    resumed: List[Dict[str, float]] = []
    for i in range(repeats):  # alternate, so a busy moment hits both
        fresh.append(first_step(ctx.scratch(f"resume-fresh-{i}"), size))
        resumed.append(first_step(saved, size))
    if any(r["resumed"] == 0 for r in resumed) or any(r["resumed"] != 0 for r in fresh):
        raise RuntimeError(f"resume runs did not resume (steps {[r['resumed'] for r in resumed]}) or fresh runs did")
    f, r = median([x["to_first_step"] for x in fresh]), median([x["to_first_step"] for x in resumed])
    ratio = r / f
    sec.rows.append(["fresh", f"{size} MB", fmt_s(f), fmt_s(median([x['to_python'] for x in fresh])),
                     str(repeats), "1"])
    sec.rows.append([f"resume from step {resumed[0]['resumed']}", f"{size} MB", fmt_s(r),
                     fmt_s(median([x['to_python'] for x in resumed])), str(repeats), f"{ratio:.2f}x"])
    sec.verdicts.append((f"resume {fmt_s(r)} vs fresh {fmt_s(f)}: {ratio:.2f}x (target {TARGET}x)", ratio <= TARGET))
    sec.notes += [
        "both include interpreter start, `import torch`, building the model and the session; resume adds "
        "finding the newest valid checkpoint, verifying its crc32 and loading it (weights_only, mmap)",
        f"python: {sys.version.split()[0]}; torch on CPU, one thread"]
    return sec
