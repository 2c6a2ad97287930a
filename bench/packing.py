"""Packing small items onto big allocations: jobs, node-hours and scheduler calls of 64 one-GPU
items on 8-GPU nodes that are allocated whole, packed 8 per job against one item per job.

    python -m bench --only packing

The table is computed by the planner (hpc.pipeline.plan.make_plan with stages.X.pack), not run: every
figure is what the plan submits. Each item holds its GPU for HOURS; a job on a whole-node partition
holds its node for as long as its longest item. Measured on the local cluster (two nodes of as
many fake GPUs as its layout gives: one-GPU items of tests/tiny_pipeline.py, two nodes' worth,
packed a node's GPUs per job against one per job; `--cluster-dir` of a cluster of 8-GPU nodes
measures the 16 items packed 8 per job of the tests): each item's start-up, from its job's start (sacct, whole seconds) to its StageTask's start (its done
marker's `started`), and the SLURM steps each job ran (sacct): a packed item keeps its own srun step
and StageTask and shares its job's batch step and the pack's driver with its siblings.
"""
from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bench.common import REPO, Context
from bench.report import Section
from hpc.config import schema
from hpc.pipeline import plan
from hpc.rundir.run import DONE, RunDir

ITEMS, NODE_GPUS, PACK = 64, 8, 8
HOURS = 1.0  # one item's run time


@dataclass
class Stages:
    work: schema.Resources = field(default_factory=lambda: schema.Resources(gpus_per_node=1, mem="16G"))


@dataclass
class Config(schema.PipelineConfig):
    stages: Stages = field(default_factory=Stages)


def _plan(pack: int) -> Any:
    pipe = plan.PipelineDef("packing", Config, lambda cfg: [plan.StageDef("work", "x:y", items=tuple(range(ITEMS)))])
    cfg = schema.load(Config, "packing", None, [f"stages.work.pack={pack}"], keep=False)
    return plan.make_plan(pipe, cfg, "/r", "slurm", node_gpus=lambda partition: NODE_GPUS)


def run(ctx: Context) -> Section:
    sec = Section("packing", f"Packing: {ITEMS} one-GPU items on {NODE_GPUS}-GPU nodes, whole nodes allocated",
                  f"pack={PACK}: {ITEMS // PACK} jobs and {ITEMS // PACK} node-hours, against {ITEMS} of each unpacked",
                  "python -m bench --only packing",
                  headers=["submission", "jobs (array tasks)", "sbatch calls", "node-hours held",
                           "GPU-hours used of held", "sacct rows per status poll"])
    figures = {}
    for pack in (1, PACK):
        p = _plan(pack)
        jobs = sum(len(job.units) for job in p.jobs)
        nodes = jobs * math.ceil(p.jobs[0].resources["gpus_per_node"] / NODE_GPUS) * HOURS
        figures[pack] = (jobs, nodes)
        sec.rows.append([f"pack={pack}" + (" (one item per job)" if pack == 1 else ""), str(jobs), str(len(p.jobs)),
                         f"{nodes:g}", f"{ITEMS * HOURS:g} of {nodes * NODE_GPUS:g} ({ITEMS * HOURS / (nodes * NODE_GPUS):.1%})",
                         str(jobs)])
    sec.verdicts.append((f"packed: {figures[PACK][0]} jobs and {figures[PACK][1]:g} node-hours against "
                         f"{figures[1][0]} and {figures[1][1]:g} unpacked", figures[PACK] == (ITEMS // PACK, ITEMS // PACK * HOURS)))
    sec.notes += [
        f"each item holds its one GPU for {HOURS:g} h; a whole-node job holds its {NODE_GPUS} GPUs as long",
        "sbatch calls: one array per stage either way; the scheduler starts, tracks and accounts 8x fewer jobs packed",
    ]
    sec.notes += measured(ctx) if ctx is not None and not ctx.quick else [
        "start-up per item on the sandbox: not measured in a quick run (python -m bench --only packing measures it)"]
    return sec


def sandbox(ctx: Context, pack: int, items: int) -> tuple:
    """`items` one-GPU tiny items at `pack` per job on the local cluster: (start-up per item in s, SLURM steps
    per job, jobs)."""
    env = ctx.slurm_env()
    run = RunDir(ctx.scratch(f"packing-{pack}") / "run")
    subprocess.run([sys.executable, "-m", "hpc.submit", "tests.tiny_pipeline", "--cluster", "slurm", "--run-dir",
                    str(run.path), "--no-snapshot", f"tiny.parts={list(range(items))}",
                    "stages.second.gpus_per_node=1", f"stages.second.pack={pack}"], cwd=REPO, env=env, check=True,
                   capture_output=True)
    for _ in range(600):
        if all(run.is_done("second", i) for i in range(items)):
            break
        time.sleep(0.5)
    else:
        raise RuntimeError(f"the items of {run.path} did not finish in 300 s")
    jobs = {t["item"]: t["job_id"] for t in run.tasks() if t["stage"] == "second"}
    for _ in range(60):  # slurmdbd lists a job a little after it ended
        rows = [line.split("|") for line in subprocess.run(
            ["sacct", "-n", "-P", "-j", ",".join(sorted(set(jobs.values()))), "--format=JobID,Start,State"], env=env,
            capture_output=True, text=True, check=True).stdout.splitlines()]
        starts = {r[0]: datetime.fromisoformat(r[1]).timestamp() for r in rows if "." not in r[0] and r[1][:1].isdigit()}
        if set(jobs.values()) <= set(starts) and all(r[2] == "COMPLETED" for r in rows):
            break
        time.sleep(0.5)
    else:
        raise RuntimeError(f"sacct did not list jobs {sorted(set(jobs.values()))} as ended: {rows}")
    steps = [r[0] for r in rows if "." in r[0] and r[0].split(".")[1].isdigit()]
    startup = [json.loads((run.task_dir("second", i) / DONE).read_text())["started"] - starts[jobs[i]] for i in jobs]
    return statistics.median(startup), len(steps) / len(set(jobs.values())), len(set(jobs.values()))


def measured(ctx: Context) -> list:
    try:
        pack = ctx.cluster().layout.gpus_per_node  # a whole node's GPUs per job
        (one, one_steps, one_jobs), (packed, steps, jobs) = sandbox(ctx, 1, 2 * pack), sandbox(ctx, pack, 2 * pack)
    except (RuntimeError, subprocess.CalledProcessError, KeyError, ValueError) as err:
        return [f"start-up per item on the sandbox: not measured ({type(err).__name__}: {err})"]
    return [f"measured on the sandbox (nodes of {pack} GPUs), {2 * pack} one-GPU items: start-up per item (its job's "
            f"start to its task's start, median, whole-second job starts) {packed:.1f} s packed {pack} per job against "
            f"{one:.1f} s one per job; {jobs} jobs against {one_jobs}, 1 sbatch call for the stage either way",
            f"SLURM steps per job: {steps:g} packed (one srun --exact per item, started by the pack's driver in the "
            f"batch step) against {one_steps:g}: one srun per item either way, {pack}x fewer jobs to start, "
            "track and account"]


if __name__ == "__main__":
    sys.exit("run it through the harness: python -m bench --only packing")
