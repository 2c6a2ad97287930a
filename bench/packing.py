"""Packing small items onto big allocations: jobs, node-hours and scheduler calls of 64 one-GPU
items on 8-GPU nodes that are allocated whole, packed 8 per job against one item per job.

    python -m bench --only packing

Computed by the planner (hpc.pipeline.plan.make_plan with stages.X.pack), not run: every figure is
what the plan submits. Each item holds its GPU for HOURS; a job on a whole-node partition holds its
node for as long as its longest item. A task's start-up is measured by `--only task-startup`; a
packed item would keep its own task start (its own srun step, interpreter and StageTask) and share
its job's batch step (bash and hpc.afterstep) with its siblings: not measured, as the job side of
packing is not built yet.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

from bench.common import Context
from bench.report import Section
from hpc.config import schema
from hpc.pipeline import plan

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
        "start-up cost per item: not measured, as no packed job runs yet; by design an item keeps its own task "
        "start (the task start-up section's task step) and shares its job's batch step with its k-1 siblings",
        "packed jobs are planned, shown by --dry-run and refused at submission: the job side that runs each item as "
        "its own srun step is not built yet, so no packed job has run on the sandbox",
    ]
    return sec


if __name__ == "__main__":
    sys.exit("run it through the harness: python -m bench --only packing")
