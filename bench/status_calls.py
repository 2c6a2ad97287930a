"""Status polling: scheduler calls and wall time of `python -m hpc.status RUN` for runs of 1, 10,
100 and 10,000 jobs (the last as held arrays of 1000 tasks), against one bare sacct call and, up to
100 jobs, a per-job `scontrol show job` loop.

    python -m bench --only status

Calls are counted by wrapper scripts named sacct, squeue, scontrol, sinfo, ... placed first on
PATH: each appends its name to a log and execs the real client, so every answer is SLURM's own.
The jobs are real, held (pending) jobs on the benchmark's local cluster, recorded in a run
directory through hpc.rundir.run as hpc.submit would; they are cancelled afterwards.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

from bench.common import Context, count_calls, counting_shims, fmt_s, median, timed
from bench.report import Section

COUNTS = (1, 10, 100, 10_000)
QUICK_COUNTS = (1, 10, 300)
ARRAYS_FROM = 300  # this many jobs and more are held array tasks, submitted an array of ARRAY_SIZE at a time
ARRAY_SIZE = 1000
POLLS = 3
TARGET_S = 2.0  # hpc.status at 10,000 tasks


def _submit_held(cluster, n: int, out: Path) -> List[str]:
    if n >= ARRAYS_FROM:
        size = min(n, ARRAY_SIZE)
        ids = []
        for k in range(0, n, size):
            r = cluster.run(["sbatch", "--parsable", "--hold", f"--array=0-{min(size, n - k) - 1}", "-J",
                             "bench-status", "-o", str(out / "%A_%a.out"), "--wrap", "true"])
            ids += [f"{r.stdout.strip().split(';')[0]}_{i}" for i in range(min(size, n - k))]
        return ids
    ids = []
    for i in range(n):
        r = cluster.run(["sbatch", "--parsable", "--hold", "-J", f"bench-status-{i}", "-o", str(out / "%j.out"),
                         "--wrap", "true"])
        ids.append(r.stdout.strip().split(";")[0])
    return ids


def _make_run(path: Path, ids: List[str]) -> None:
    from hpc.rundir.run import RunDir

    run = RunDir(path)
    run.start("bench", "{}\n", "slurm")
    run.record_all("work", list(enumerate(ids)), "slurm")


def run(ctx: Context) -> Section:
    sec = Section("status", "Status: scheduler calls per poll", "one scheduler call per poll, whatever the job "
                  f"count; {max(COUNTS)} tasks within {TARGET_S:g} s",
                  "python -m bench --only status" + (" --quick" if ctx.quick else ""),
                  headers=["jobs", "hpc.status calls/poll", "calls by command", "hpc.status wall",
                           "bare sacct (1 call)", "per-job scontrol loop", "loop calls"])
    cluster = ctx.cluster()
    base = ctx.scratch("status")
    shims, log = base / "shims", base / "calls.log"
    env = ctx.slurm_env()
    counting_shims(shims, log, path=env.get("PATH"))
    counted = dict(env, PATH=f"{shims}{os.pathsep}{env['PATH']}")
    counts = QUICK_COUNTS if ctx.quick else COUNTS
    for n in counts:
        ids = _submit_held(cluster, n, base)
        try:
            row, ok, wall = _measure(base / f"run-{n}", ids, env, counted, log)
        finally:
            cluster.run(["scancel", *sorted({i.split("_")[0] for i in ids})], check=False)
        sec.rows.append([str(n), *row])
        sec.verdicts.append((f"{n} job(s): {row[0]} scheduler call(s) per poll", ok))
        if n == max(counts):
            sec.verdicts.append((f"hpc.status on {n} tasks in {fmt_s(wall)} (target {TARGET_S:g} s)", wall <= TARGET_S))
    sec.notes += [
        f"{POLLS} polls per run size, median wall time; each poll is a fresh `python -m hpc.status RUN` "
        "process (interpreter start included)",
        "the comparison loop is what a naive tool does: one `scontrol show job ID` per job"]
    return sec


def _measure(run_dir: Path, ids: List[str], env: Dict[str, str], counted: Dict[str, str], log: Path):
    _make_run(run_dir, ids)
    log.unlink(missing_ok=True)
    walls = [timed([sys.executable, "-m", "hpc.status", str(run_dir)], env=counted) for _ in range(POLLS)]
    calls = count_calls(log)
    per_poll = sum(calls.values()) / POLLS
    # What the table shows must come from SLURM: a held job reads PENDING, not UNKNOWN.
    out = subprocess.run([sys.executable, "-m", "hpc.status", str(run_dir), "--json"],
                         env=env, capture_output=True, text=True)
    states = {row["state"] for row in json.loads(out.stdout)}
    if states != {"PENDING"}:
        raise RuntimeError(f"hpc.status reported states {sorted(states)} for held jobs, expected PENDING")
    arrays = sorted({i.split("_")[0] for i in ids})
    sacct = timed(["sacct", "-X", "-P", "-n", "-o", "JobID,State", "-j", ",".join(arrays)], env=env)
    log.unlink(missing_ok=True)
    loop, loop_calls = "-", "-"  # not for arrays: a call per task would take minutes
    if len(ids) < ARRAYS_FROM:
        loop = fmt_s(timed(["bash", "-c", "for j in " + " ".join(ids) + "; do scontrol show job $j >/dev/null; done"],
                           env=counted))
        loop_calls = str(sum(count_calls(log).values()))
    by_cmd = ", ".join(f"{k} {v / POLLS:g}" for k, v in sorted(calls.items())) or "none"
    return ([f"{per_poll:g}", by_cmd, fmt_s(median(walls)), fmt_s(sacct), loop, loop_calls], per_poll == 1,
            median(walls))
