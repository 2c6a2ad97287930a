"""Sweep submission: `python -m hpc.submit tiny --sweep ...` for grids of 10, 100 and 1000 points of a
2-stage pipeline (tests/tiny_pipeline.py: `first`, then `second` over tiny.parts), its CPU per point,
`python -m hpc.status` on each, and at 100 points the shell loop users write instead (one sbatch per
point and stage), on the benchmark's local SLURM cluster.

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

TARGET_S = 2.0  # wall time of the 100-point sweep
TARGET_CPU_S = 2.0  # CPU of the 1000-point sweep
TARGET_MS_PER_POINT = 1.0  # CPU per point, from the 10- and 1000-point sweeps
TARGET_STATUS_S = 2.0  # hpc.status on the 1000-point sweep (3000 tasks)
SIZES = (10, 100, 1000)  # points: tiny.score over 10 values x tiny.sleep_s over 1, 10, 100
QUICK_SIZES = (4, 8)
PARTS = "tiny.parts=[0,1]"  # items of stage `second` per point


def axes_for(points: int, more: float = 0.0) -> List[str]:
    """The grid of `points` points; with `more`, that share of new points beside the same ones."""
    scores = min(points, 10)
    sleeps = points // scores
    return ["tiny.score=" + ",".join(map(str, range(scores))),
            "tiny.sleep_s=" + ",".join(map(str, range(sleeps + round(sleeps * more))))]


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
    sizes = QUICK_SIZES if ctx.quick else SIZES
    sec = Section("sweep", f"Sweep submission: {', '.join(map(str, sizes))} points, 2 stages",
                  f"a 100-point sweep of a 2-stage pipeline submitted within {TARGET_S:g} s, the 1000-point one "
                  f"within {TARGET_CPU_S:g} s of CPU ({TARGET_MS_PER_POINT:g} ms per point), one sbatch per stage "
                  f"(and per item of a point waiting on its point's task) per chunk, hpc.status on it within "
                  f"{TARGET_STATUS_S:g} s",
                  "python -m bench --only sweep" + (" --quick" if ctx.quick else ""),
                  headers=["points", "variant", "command", "median wall", "median CPU (user+sys)", "sbatch calls",
                           "runs"])
    cluster = ctx.cluster()
    base = ctx.scratch("sweep")
    env = ctx.slurm_env()
    shims, log = base / "shims", base / "calls.log"
    counting_shims(shims, log, path=env.get("PATH"))
    counted = dict(env, PATH=f"{shims}{os.pathsep}{env['PATH']}")
    nodes = ",".join(cluster.nodes)
    cluster.run(["scontrol", "update", f"NodeName={nodes}", "State=DRAIN", "Reason=bench-sweep"])
    results = {}
    try:
        for points in sizes:
            results[points] = _measure(base / f"p{points}", counted, log, cluster, axes_for(points), points,
                                       repeats=2 if ctx.quick or points >= 1000 else 3, loop=points == 100)
    finally:
        _cancel_all(cluster)
        best_effort(lambda: cluster.run(["scontrol", "update", f"NodeName={nodes}", "State=RESUME"]))
    labels = {
        "hpc sweep": f"`python -m hpc.submit tiny {PARTS} --sweep tiny.score=... tiny.sleep_s=...`",
        "hpc resubmit": "the same command again while every job is queued (submits nothing)",
        "hpc +10% points": "the grid grown by 10% (tiny.sleep_s), every earlier point still queued",
        "hpc status": "`python -m hpc.status SWEEP` (scheduler calls in the sbatch column)",
        "sbatch loop": "`bash -c 'for p in ...; do sbatch first; sbatch --array second; done'`",
    }
    for points, (times, cpu, calls, _) in results.items():
        for name, label in labels.items():
            if times[name]:
                sec.rows.append([str(points), name, label, fmt_s(median(times[name])), fmt_s(median(cpu[name])),
                                 f"{median(calls[name]):g}", str(len(times[name]))])
    mid_points = 100 if 100 in results else sizes[-1]
    small, mid, big = results[sizes[0]], results[mid_points], results[sizes[-1]]
    per_point = (median(big[1]["hpc sweep"]) - median(small[1]["hpc sweep"])) / (sizes[-1] - sizes[0]) * 1000
    wall = median(mid[0]["hpc sweep"])
    sec.verdicts.append((f"{mid_points}-point sweep submitted in {fmt_s(wall)} (target {TARGET_S:g} s)",
                         wall <= TARGET_S))
    sec.verdicts.append((f"{sizes[-1]}-point sweep: {fmt_s(median(big[1]['hpc sweep']))} CPU (target "
                         f"{TARGET_CPU_S:g} s); {per_point:.2f} ms of CPU per point from {sizes[0]} to {sizes[-1]} "
                         f"points (target {TARGET_MS_PER_POINT:g} ms)",
                         median(big[1]["hpc sweep"]) <= TARGET_CPU_S and per_point <= TARGET_MS_PER_POINT))
    most = _max_array_size(cluster)
    for points, (times, cpu, calls, grew) in results.items():
        # MaxArraySize splits an array: one sbatch per stage per chunk; stage `second`'s 2 items per point
        # each wait on their point's `first` task (aftercorr pairs one task id with one): one array per item
        expected = 3 * -(-points // most)
        sec.verdicts.append((f"{points} points: {max(calls['hpc sweep'])} sbatch call(s) (target {expected}, "
                             f"MaxArraySize {most}); resubmission while queued: {max(calls['hpc resubmit'])}",
                             max(calls["hpc sweep"]) == expected and max(calls["hpc resubmit"]) == 0))
        if points in grew:
            new, wanted = grew[points], points // 10
            sec.verdicts.append((f"{points} points grown by 10%: {new} new point(s) submitted (target {wanted}), "
                                 f"{max(calls['hpc +10% points'])} sbatch call(s) (target {3 * -(-wanted // most)}), "
                                 "every earlier point's jobs kept", new == wanted
                                 and max(calls["hpc +10% points"]) == 3 * -(-wanted // most)))
    status_s = median(big[0]["hpc status"])
    sec.verdicts.append((f"hpc.status on {sizes[-1]} points ({3 * sizes[-1]} tasks): {fmt_s(status_s)}, "
                         f"{max(big[2]['hpc status'])} scheduler call(s) (target {TARGET_STATUS_S:g} s, 1 call)",
                         status_s <= TARGET_STATUS_S and max(big[2]["hpc status"]) == 1))
    sec.notes += [
        "wall time of the whole command, interpreter start included; the nodes are drained so that the jobs "
        "stay pending, and they are cancelled after each round",
        "CPU is the user and system time of the command and its children (sbatch included): on a machine "
        "shared with other work, the wall time waits for a core and the CPU time does not",
        "CPU per point: the difference between the largest and the smallest sweep's CPU, over the difference "
        "in points, which includes the extra arrays of the larger sweep (one sbatch each past MaxArraySize); "
        "what stays per point is mostly the file system's: the point's directory with its config.yaml "
        "and manifest.json (each written once, atomically); an array's tasks share one log folder "
        "(hpc.rundir.logdirs: SLURM opens the logs in it and does not create it) and their pickles are one file "
        "(hpc.pipeline.arraytasks), and a point's links to its stages' logs are made by its tasks when they start",
        f"hpc sweep writes a run directory per point (config.yaml, manifest.json), per array a file naming each "
        f"task's point and one of its tasks' pickles, and the sweep's sweep.json; "
        f"stage `second` has {PARTS.split('=')[1]} items per point, each waiting on its own point's `first` task "
        "(aftercorr): item k of every point is one array, at the task ids of the points' `first` tasks",
        "the sbatch loop (one sbatch per point and stage) is measured at 100 points",
        "per-point dependencies: after every submission each point's `second` tasks are checked to wait on "
        "their own point's `first` task alone, recorded so in the point's manifest and paired with it by array "
        "task id (what aftercorr holds SLURM to); a point that waits on anything else stops the section",
        f"cluster: {len(cluster.nodes)} slurmd nodes, MaxArraySize {most} (the scale sandbox: python -m hpc.cluster "
        "up --nodes 16 --max-array-size 300, then python -m bench --only sweep --cluster-dir DIR)"]
    return sec


def _max_array_size(cluster) -> int:
    from hpc.slurm.scheduler import parse_max_array_size

    return parse_max_array_size(cluster.run(["scontrol", "show", "config"]).stdout)


def _measure(base: Path, env: Dict[str, str], log: Path, cluster, axes: List[str], points: int,
             repeats: int, loop: bool):
    names = ("hpc sweep", "hpc resubmit", "hpc +10% points", "hpc status", "sbatch loop")
    times: Dict[str, List[float]] = {k: [] for k in names}
    cpu: Dict[str, List[float]] = {k: [] for k in names}
    calls: Dict[str, List[int]] = {k: [] for k in names}
    grew: Dict[int, int] = {}  # points -> the points a grown grid's resubmission added

    def measure(name: str, argv: List[str], counted: str = "sbatch") -> None:
        log.unlink(missing_ok=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        times[name].append(timed(argv, env=env, cwd=REPO))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        found = count_calls(log)
        calls[name].append(found.get(counted, 0) if counted else sum(found.values()))

    base.mkdir(parents=True, exist_ok=True)
    for i in range(repeats):  # interleaved: a busy moment on the machine hits every variant
        sweep = [sys.executable, "-m", "hpc.submit", "tests.tiny_pipeline", "--cluster", "slurm",
                 "--run-dir", str(base / f"sweep-{i}"), PARTS, "--sweep", *axes]
        measure("hpc sweep", sweep)
        measure("hpc resubmit", sweep)
        measure("hpc status", [sys.executable, "-m", "hpc.status", str(base / f"sweep-{i}")], counted="")
        jobs = _check(base / f"sweep-{i}", points)
        if i == 0 and points >= 100:  # the grid grown by 10%: only the new points are submitted
            grown = sweep[:-len(axes)] + axes_for(points, more=0.1)
            measure("hpc +10% points", grown)
            grew[points] = len(_check(base / f"sweep-{i}", points + points // 10, keep=jobs)) - len(jobs)
        if loop:
            folder = base / f"loop-{i}"
            folder.mkdir()
            measure("sbatch loop", ["bash", "-c", loop_script(folder, points, 2)])
        _cancel_all(cluster)
    return times, cpu, calls, grew


def _check(sweep: Path, points: int, keep: Dict[str, Dict[str, str]] | None = None) -> Dict[str, Dict[str, str]]:
    """Every point's task -> job id, once each point has recorded its 3 tasks and each of its
    `second` tasks waits on its own point's `first` task: recorded so, and paired by array task id,
    which is what aftercorr holds SLURM to. `keep`: points whose jobs must be the ones recorded
    before (a resubmission submits none of them again). RuntimeError otherwise: the timing would
    have measured a failure."""
    record = json.loads((sweep / "sweep.json").read_text())
    jobs: Dict[str, Dict[str, str]] = {}
    for sig in record["points"]:
        tasks = json.loads((sweep / sig / "manifest.json").read_text())["tasks"]
        jobs[sig] = {key: t["job_id"] for key, t in tasks.items()}
        first = tasks.get("first", {}).get("job_id", "")
        for key, t in tasks.items():
            if t["stage"] == "second" and (t["jobs"][-1].get("after") != [first]
                                           or t["job_id"].partition("_")[2] != first.partition("_")[2]):
                raise RuntimeError(f"point {sig} of {sweep}: {key} ({t['job_id']}) waits on "
                                   f"{t['jobs'][-1].get('after')}, not on its point's first task {first} alone")
    counts = {len(tasks) for tasks in jobs.values()}
    if len(jobs) != points or counts != {3}:
        raise RuntimeError(f"the sweep in {sweep} recorded {len(jobs)} point(s) with {sorted(counts)} "
                           f"task(s) each, expected {points} with 3")
    changed = [sig for sig in keep or {} if jobs.get(sig) != keep[sig]]
    if changed:
        raise RuntimeError(f"a resubmission of {sweep} submitted {len(changed)} point(s) again ({changed[0]})")
    return jobs


if __name__ == "__main__":
    sys.exit("run it through the harness: python -m bench --only sweep")
