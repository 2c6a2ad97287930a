"""A failure's cost to training: restart in place against a requeue, side by side on the local cluster.

    python -m bench --only restart

The same job (tests/inplace_pipeline.py: 1 node x 2 ranks of DDP, a checkpoint every step) has rank 1
stop itself (SIGSTOP) before step 4; the others' watchdog (3 s) names it, and the srun wrapper either
restarts the step in place (stages.train.max_restarts_in_place=3, the default) or requeues the job
(max_restarts_in_place=0, as before restarts in place). Measured, per run:
- failure to first step: from the rank's stop (its own timestamp) to the start of the first training
  step after the restart, resumed from the checkpoint. The requeue's figure leaves out the time the
  job waited in the queue (the sacct attempts' end and next start: on this idle cluster, SLURM's
  begin-time hold of a requeued job, which the bench lifts at once); on a busy cluster the queue's
  wait comes on top, minutes to days.
- scheduler calls per restart: every SLURM client the job itself ran (scontrol, srun, sbatch, squeue,
  sacct, scancel) from the failure to that first step, counted by a logging stand-in in front of each
  on the job's PATH.
- memory: the srun wrapper's peak resident memory (VmHWM) as its last SLURM call of the failure saw it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List

from bench.common import REPO, Context, fmt_s, median
from bench.report import Section
from hpc.rundir.run import DONE, RunDir

TOOLS = ("scontrol", "srun", "sbatch", "squeue", "sacct", "scancel")
REPEATS, QUICK_REPEATS = 3, 1
SAME = 1.3  # a restart in place against a requeue without its queue wait: the same work, within noise
TARGET = ("a restart in place reaches its first step after the failure before a requeue does, and within 1.3 x "
          "a requeue without its queue wait, with no more scheduler calls")
MODES = {"in place": "3", "requeue": "0"}  # stages.train.max_restarts_in_place
SHIM = """#!/bin/sh
echo "$(date +%s.%N) {tool} $(awk '/VmHWM/{{print $2}}' /proc/$PPID/status 2>/dev/null)" >> "$HPC_BENCH_CALLS"
exec {real} "$@"
"""


def shims(where: Path) -> Path:
    """A directory of stand-ins that log each SLURM client's call (time, name, the caller's peak kB)."""
    where.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        real = shutil.which(tool)
        if real is None:
            raise RuntimeError(f"{tool} not found on PATH")
        path = where / tool
        path.write_text(SHIM.format(tool=tool, real=real))
        path.chmod(0o755)
    return where


def one(ctx: Context, name: str, restarts: str, shim: Path) -> Dict[str, float]:
    """One faulted run; its figures."""
    run_dir, calls = ctx.scratch(f"restart-{name}") / "run", ctx.scratch(f"restart-{name}") / "calls.log"
    env = ctx.slurm_env({"PATH": f"{shim}{os.pathsep}{os.environ['PATH']}", "HPC_BENCH_CALLS": str(calls)})
    subprocess.run([sys.executable, "-m", "hpc.submit", "tests.inplace_pipeline", "--cluster", "slurm", "--run-dir",
                    str(run_dir), "stages.train.nodes=1", "inplace.steps=6", "inplace.fault=hang", "inplace.fault_at=4",
                    f"stages.train.max_restarts_in_place={restarts}"], cwd=REPO, env=env, check=True,
                   capture_output=True)
    run = RunDir(run_dir)
    out, job = run.task_dir("train"), run.tasks()[0]["job_id"]
    deadline = time.monotonic() + 300
    while not (out / DONE).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job} did not finish within 300 s; see {out}/logs")
        if restarts == "0":  # lift SLURM's begin-time hold of the requeued job: its wait is left out anyway
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=ctx.slurm_env(),
                           capture_output=True)
        time.sleep(1)
    (fault,) = [json.loads(p.read_text())["time"] for p in out.glob("fault-*.json")]
    steps = [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]
    first = steps[-1]["time"]
    queued = queue_wait(ctx, job) if restarts == "0" else 0.0
    logged = [line.split() for line in calls.read_text().splitlines()] if calls.exists() else []
    during = [row for row in logged if fault <= float(row[0]) <= first]
    peak = max((int(row[2]) for row in during if len(row) > 2), default=0)
    return {"seconds": first - fault - queued, "queued": queued, "calls": len(during), "peak_kb": peak,
            **{f"calls:{tool}": n for tool, n in Counter(row[1] for row in during).items()}}


def queue_wait(ctx: Context, job: str) -> float:
    """Seconds between the failed attempt's end and the next one's start (sacct -D), 0 if unknown."""
    for _ in range(30):
        out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job, "-o", "Start,End"], env=ctx.slurm_env(),
                             capture_output=True, text=True).stdout.split()
        rows = [line.split("|") for line in out]
        if len(rows) >= 2 and "Unknown" not in rows[0][1]:
            return max(0.0, _epoch(rows[1][0]) - _epoch(rows[0][1]))
        time.sleep(1)
    return 0.0


def _epoch(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def run(ctx: Context) -> Section:
    sec = Section("restart", "Restart in place against a requeue: failure to first step",
                  TARGET,
                  "python -m bench --only restart" + (" --quick" if ctx.quick else ""),
                  headers=["recovery", "failure -> first step (median)", "runs", "queue wait left out",
                           "SLURM calls per restart", "wrapper peak RSS"])
    ctx.cluster()
    shim = shims(ctx.scratch("restart-shims"))
    got: Dict[str, List[Dict[str, float]]] = {m: [] for m in MODES}
    for k in range(QUICK_REPEATS if ctx.quick else REPEATS):
        for mode, restarts in MODES.items():  # side by side: each repeat runs both, one after the other
            got[mode].append(one(ctx, f"{mode.replace(' ', '-')}-{k}", restarts, shim))
    for mode, runs in got.items():
        tools = Counter()
        for r in runs:
            tools.update({k[6:]: v for k, v in r.items() if k.startswith("calls:")})
        said = ", ".join(f"{t} {n / len(runs):g}" for t, n in sorted(tools.items()))
        sec.rows.append([mode, fmt_s(median([r["seconds"] for r in runs])), str(len(runs)),
                         fmt_s(median([r["queued"] for r in runs])),
                         f"{median([r['calls'] for r in runs]):g} ({said})",
                         f"{max(r['peak_kb'] for r in runs) / 1024:.0f} MiB"])
    fast, net = (median([r["seconds"] for r in got[m]]) for m in MODES)
    total = median([r["seconds"] + r["queued"] for r in got["requeue"]])
    calls = [median([r["calls"] for r in got[m]]) for m in MODES]
    sec.verdicts += [(f"in place {fmt_s(fast)} < requeue {fmt_s(total)} on this idle cluster, its queue wait a "
                      "begin-time hold lifted at once", fast < total),
                     (f"in place {fmt_s(fast)} <= {SAME:g} x requeue {fmt_s(net)} with its queue wait left out: the "
                      "restart itself costs what a job's start does", fast <= SAME * net),
                     (f"in place {calls[0]:g} SLURM calls <= requeue {calls[1]:g}", calls[0] <= calls[1])]
    sec.notes.append("Both include the watchdog's detection (watchdog_s=3 s and its gathering of the ranks' "
                     "stacks, about 5 s), the ranks' start and the checkpoint's load (about 5 s here). The requeue's "
                     "figure excludes its queue wait (the column beside it: from the failed attempt's end to the next "
                     "start in sacct, which holds its teardown, SLURM's begin-time hold, lifted by the bench at once, "
                     "and a scheduling cycle); on a busy cluster a requeue waits for nodes on top of that, minutes to "
                     "days, which a restart in place never does: that wait is what it saves.")
    return sec
