"""Sweep submission: `python -m hpc.submit tiny --sweep ...` for a grid of 100 points of a 2-stage
pipeline (tests/tiny_pipeline.py: `first`, then `second` over tiny.parts), against the shell loop
users write instead (one sbatch per point and stage), on the benchmark's local SLURM cluster.

    python -m bench --only sweep

Figures are wall times of whole commands, interpreter start included; sbatch calls are counted by
wrapper scripts first on PATH (bench.common.counting_shims), each of which execs the real client.
The nodes are drained meanwhile so that the jobs stay pending; they are cancelled after each round.
A resubmission of the same sweep while its jobs are queued is measured too: it must submit nothing.
"""
from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Dict, List

from bench.common import REPO, Context, best_effort, count_calls, counting_shims, fmt_s, median, timed
from bench.report import Section

TARGET_S = 2.0
# one per stage per MaxArraySize chunk (100 points: one chunk), and per item of a point for a stage
# whose items wait on their point's one task (aftercorr pairs one task id with one): first, then
# second's items 0 and 1 of every point
TARGET_SBATCH = 3
AXES = ["tiny.score=" + ",".join(map(str, range(10))), "tiny.sleep_s=" + ",".join(map(str, range(10)))]
QUICK_AXES = ["tiny.score=0,1,2,3", "tiny.sleep_s=0,1"]
PARTS = "tiny.parts=[0,1]"  # items of stage `second` per point


def _cancel_all(cluster) -> None:
    ids = cluster.run(["squeue", "-h", "-o", "%A"], check=False).stdout.split()
    if ids:
        cluster.run(["scancel", *sorted(set(ids))], check=False)


def loop_script(folder: Path, points: int, items: int) -> str:
    """The shell loop a sweep replaces: per point, first, then its items afterok on it."""
    sb = f"sbatch --parsable -p low -t 5 -c 1 --requeue -o {folder}/%j.out"
    return (f"set -e\nfor p in $(seq {points}); do\n  jid=$({sb} -J first --wrap true)\n"
            f"  {sb} -J second --array=0-{items - 1} --dependency=afterok:$jid --wrap true >/dev/null\ndone\n")


def run(ctx: Context) -> Section:
    axes = QUICK_AXES if ctx.quick else AXES
    points = 1
    for axis in axes:
        points *= len(axis.split("=", 1)[1].split(","))
    sec = Section("sweep", f"Sweep submission: {points} points, 2 stages",
                  f"a {points}-point sweep of a 2-stage pipeline submitted within {TARGET_S:g} s, "
                  f"in {TARGET_SBATCH} sbatch calls",
                  "python -m bench --only sweep" + (" --quick" if ctx.quick else ""),
                  headers=["variant", "command", "median wall", "median CPU (user+sys)", "sbatch calls", "runs"])
    cluster = ctx.cluster()
    base = ctx.scratch("sweep")
    env = ctx.slurm_env()
    shims, log = base / "shims", base / "calls.log"
    counting_shims(shims, log, path=env.get("PATH"))
    counted = dict(env, PATH=f"{shims}{os.pathsep}{env['PATH']}")
    nodes = ",".join(cluster.nodes)
    cluster.run(["scontrol", "update", f"NodeName={nodes}", "State=DRAIN", "Reason=bench-sweep"])
    try:
        times, cpu, calls = _measure(base, counted, log, cluster, axes, points, repeats=2 if ctx.quick else 3)
    finally:
        _cancel_all(cluster)
        best_effort(lambda: cluster.run(["scontrol", "update", f"NodeName={nodes}", "State=RESUME"]))
    labels = {
        "hpc sweep": f"`python -m hpc.submit tiny {PARTS} --sweep {' '.join(axes)}`",
        "hpc resubmit": "the same command again while every job is queued (submits nothing)",
        "sbatch loop": f"`bash -c 'for p in ...; do sbatch first; sbatch --array second; done'` ({points} points)",
    }
    for name, label in labels.items():
        sec.rows.append([name, label, fmt_s(median(times[name])), fmt_s(median(cpu[name])), f"{median(calls[name]):g}",
                         str(len(times[name]))])
    wall, sbatch = median(times["hpc sweep"]), max(calls["hpc sweep"])
    sec.verdicts.append((f"{points}-point sweep submitted in {fmt_s(wall)} (target {TARGET_S:g} s), of which "
                         f"{fmt_s(median(cpu['hpc sweep']))} CPU; the sbatch loop took "
                         f"{fmt_s(median(times['sbatch loop']))}", wall <= TARGET_S))
    sec.verdicts.append((f"{sbatch} sbatch call(s) per sweep (target {TARGET_SBATCH})", sbatch == TARGET_SBATCH))
    sec.verdicts.append((f"resubmission while queued: {max(calls['hpc resubmit'])} sbatch call(s)",
                         max(calls["hpc resubmit"]) == 0))
    sec.notes += [
        "wall time of the whole command, interpreter start included; the nodes are drained so that the jobs "
        "stay pending, and they are cancelled after each round",
        "CPU is the user and system time of the command and its children (sbatch included): on a machine "
        "shared with other work, the wall time waits for a core and the CPU time does not",
        f"hpc sweep writes a run directory per point (config.yaml, manifest.json) and the sweep's sweep.json; "
        f"stage `second` has {PARTS.split('=')[1]} items per point, each waiting on its own point's `first` task "
        "(aftercorr): item k of every point is one array, at the task ids of the points' `first` tasks"]
    return sec


def _measure(base: Path, env: Dict[str, str], log: Path, cluster, axes: List[str], points: int,
             repeats: int):
    names = ("hpc sweep", "hpc resubmit", "sbatch loop")
    times: Dict[str, List[float]] = {k: [] for k in names}
    cpu: Dict[str, List[float]] = {k: [] for k in names}
    calls: Dict[str, List[int]] = {k: [] for k in names}

    def measure(name: str, argv: List[str]) -> None:
        log.unlink(missing_ok=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        times[name].append(timed(argv, env=env, cwd=REPO))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        calls[name].append(count_calls(log).get("sbatch", 0))

    for i in range(repeats):  # interleaved: a busy moment on the machine hits every variant
        sweep = [sys.executable, "-m", "hpc.submit", "tests.tiny_pipeline", "--cluster", "slurm",
                 "--run-dir", str(base / f"sweep-{i}"), PARTS, "--sweep", *axes]
        measure("hpc sweep", sweep)
        measure("hpc resubmit", sweep)
        _check(base / f"sweep-{i}", points)
        folder = base / f"loop-{i}"
        folder.mkdir()
        measure("sbatch loop", ["bash", "-c", loop_script(folder, points, 2)])
        _cancel_all(cluster)
    return times, cpu, calls


def _check(sweep: Path, points: int) -> None:
    """Every point must have recorded its 3 tasks, or the timing measured a failure."""
    record = json.loads((sweep / "sweep.json").read_text())
    counts = [len(json.loads((sweep / sig / "manifest.json").read_text())["tasks"]) for sig in record["points"]]
    if len(counts) != points or set(counts) != {3}:
        raise RuntimeError(f"the sweep in {sweep} recorded {len(counts)} point(s) with {sorted(set(counts))} "
                           f"task(s) each, expected {points} with 3")


if __name__ == "__main__":
    sys.exit("run it through the harness: python -m bench --only sweep")
