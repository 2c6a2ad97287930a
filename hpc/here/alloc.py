"""The allocation a `--cluster here` run is in, and each step's exact share of it (hpc.here.steps).

    salloc -N 2 --ntasks-per-node=2 --gres=gpu:2      # then, in its shell:
    python -m hpc.submit langsplat --profile sandbox --levels 1 --cluster here --dry-run

An salloc shell exports its allocation's shape (SLURM_NTASKS=4, SLURM_NTASKS_PER_NODE=2, SLURM_GPUS_PER_NODE,
SLURM_MEM_PER_NODE, ...), and srun reads each of them as an option of every step started in it (man srun,
INPUT ENVIRONMENT VARIABLES): a 1-task stage would run as 4 ranks, or be refused ("More processors
requested than permitted"). So each step gets its stage's numbers on srun's command line (srun_argv:
--nodes, --ntasks, --ntasks-per-node, --cpus-per-task, its GPUs or none, the memory it shares) and none
of the allocation's in its environment (step_env).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence

from hpc.config.checks import ConfigError
from hpc.pipeline.plan import JobSpec
from hpc.slurm import noderange, scheduler

# What salloc (or sbatch) exports about the allocation's size that srun takes as a step's options:
# dropped from every step's environment; its own numbers are on its command line.
ALLOCATION_SHAPE = frozenset({
    "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_CORE",
    "SLURM_NTASKS_PER_SOCKET", "SLURM_NTASKS_PER_GPU", "SLURM_NNODES",
    "SLURM_CPUS_PER_TASK", "SRUN_CPUS_PER_TASK", "SLURM_CPUS_PER_GPU", "SLURM_TRES_PER_TASK",
    "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU", "SLURM_MEM_PER_GPU",
    "SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_GPUS_PER_SOCKET", "SLURM_GRES",
    "SLURM_STEP_GRES",
})


@dataclass(frozen=True)
class Allocation:
    """What the enclosing allocation holds, per node (scontrol's TRES, spread evenly over its nodes)."""

    job_id: str
    nodes: int
    cpus_per_node: int
    gpus_per_node: int

    @classmethod
    def from_info(cls, job_id: str, info: Mapping[str, str]) -> "Allocation":
        """From `scontrol -o show job` fields: NumNodes, TRES=cpu=4,node=2,gres/gpu=4."""
        tres = dict(p.split("=", 1) for p in info.get("TRES", "").split(",") if "=" in p)
        nodes = int(info.get("NumNodes", "1").split("-")[0] or 1)
        cpus = int(tres.get("cpu") or info.get("NumCPUs", "0") or 0)
        return cls(str(job_id), nodes, cpus // nodes, int(tres.get("gres/gpu", "0") or 0) // nodes)

    def show(self) -> str:
        return (f"{self.nodes} node(s) x {self.gpus_per_node} GPU(s) x {self.cpus_per_node} CPU(s) "
                f"per node")


def current(env: Mapping[str, str] = os.environ) -> Allocation:
    """The allocation of this shell (SLURM_JOB_ID), as SLURM holds it now."""
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        raise ConfigError("--cluster here runs the stages inside an allocation, and SLURM_JOB_ID is not set. "
                          "HINT: salloc -N 2 --ntasks-per-node=2 (with --gres=gpu:N for GPU stages), then run "
                          "this command in its shell.")
    try:
        info = scheduler.job_info(job_id)
    except RuntimeError as err:
        raise ConfigError(f"allocation {job_id} (SLURM_JOB_ID) could not be read: {err}. HINT: run inside "
                          "a live salloc shell, or unset a stale SLURM_JOB_ID.") from None
    return Allocation.from_info(job_id, info)


def need(job: JobSpec, alloc: Allocation) -> Dict[str, int]:
    """What one task of `job` takes: nodes (the most of a node range that fit), GPUs and CPUs per node."""
    lo, hi = noderange.bounds(job.resources["nodes"])
    res = job.resources
    return {"nodes": lo if lo > alloc.nodes else min(hi, alloc.nodes), "gpus": int(res["gpus_per_node"] or 0),
            "cpus": int(res["tasks_per_node"]) * int(res["cpus_per_task"] or 1)}


def check_fits(jobs: Sequence[JobSpec], alloc: Allocation) -> None:
    """ConfigError naming the first stage one of whose tasks does not fit in the allocation."""
    for job in jobs:
        n = need(job, alloc)
        if n["nodes"] > alloc.nodes or n["gpus"] > alloc.gpus_per_node or n["cpus"] > alloc.cpus_per_node:
            raise ConfigError(
                f"stage {job.stage} asks for {n['nodes']} node(s) x {n['gpus']} GPU(s) x {n['cpus']} CPU(s) per "
                f"node; allocation {alloc.job_id} has {alloc.show()}. HINT: salloc -N {n['nodes']} "
                f"--gres=gpu:{n['gpus']} --ntasks-per-node={job.resources['tasks_per_node']} (or more), or "
                f"lower stages.{job.stage}.nodes / gpus_per_node / tasks_per_node.")


def width(job: JobSpec, alloc: Allocation) -> int:
    """How many tasks of `job` run side by side in the allocation: one per node it takes, and up to
    `pack` on each node where its stage is packed (hpc.pipeline.packing.unpacked), as its GPUs and CPUs hold."""
    n, k = need(job, alloc), int(job.resources.get("pack") or 1)
    if k > 1 and n["nodes"] == 1:  # a packed stage's one-node items
        k = min(k, alloc.gpus_per_node // n["gpus"] if n["gpus"] else k, alloc.cpus_per_node // max(1, n["cpus"]))
        return max(1, alloc.nodes * k)
    return max(1, alloc.nodes // n["nodes"])


def srun_argv(job: JobSpec, alloc: Allocation, logs: str, name: str) -> List[str]:
    """One task's step, named `name`: its share of the allocation only (--exact), every number its
    stage's, its logs where hpc.status reads them."""
    n, per_node = need(job, alloc), int(job.resources["tasks_per_node"])
    argv = ["srun", f"--job-name={name}", f"--nodes={n['nodes']}", f"--ntasks={n['nodes'] * per_node}",
            f"--ntasks-per-node={per_node}", f"--cpus-per-task={job.resources['cpus_per_task'] or 1}",
            "--mem=0",  # the allocation's memory on its nodes, shared with the steps beside it, none held back
            "--exact", "--kill-on-bad-exit=1", f"--output={logs}_%t_log.out", f"--error={logs}_%t_log.err"]
    if n["gpus"]:
        argv.append(f"--gpus-per-node={n['gpus']}")
    elif alloc.gpus_per_node:  # a step is given every GPU of the allocation unless it asks for a count
        argv.append("--gres=gpu:0")
    return argv


def step_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """`environ` without the allocation's shape (ALLOCATION_SHAPE): srun then reads each step's from its
    command line only. How the clients find the controller and the allocation (SLURM_JOB_ID) stay."""
    return {k: v for k, v in environ.items() if k not in ALLOCATION_SHAPE}
