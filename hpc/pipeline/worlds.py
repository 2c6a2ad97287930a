"""A stage's world sizes and its batch at each: what the plan checks and states about ranks.

    python -m hpc.submit langsplat --dry-run      # "stage features: 3 task(s), 1-2 node(s) x 2 task(s) = 2-4 rank(s)"

Under a node range (stages.X.nodes=MIN-MAX) a job may run with either end's number of ranks, and
the batch plan (hpc.runtime.batching.plan_batch) must split at both; the local executors run
`local_tasks` processes whatever SLURM would have given, and the plan says so.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from hpc.config.checks import ConfigError
from hpc.runtime.batching import plan_batch
from hpc.slurm import noderange


def worlds(stage: str, res: Dict[str, Any], kind: str) -> Tuple[Tuple[int, ...], str]:
    """The world sizes a job may run with (both ends of a node range; one otherwise), and a note
    when the executor runs another number of processes than SLURM would."""
    lo, hi = noderange.bounds(res["nodes"])
    requested = tuple(sorted({lo * res["tasks_per_node"], hi * res["tasks_per_node"]}))
    if kind == "slurm":
        return requested, ""
    actual = res["local_tasks"]
    if requested == (actual,):
        return requested, ""
    return (actual,), (f"stage {stage}: requested {noderange.show((lo, hi))} node(s) x {res['tasks_per_node']} "
                       f"task(s) = {'-'.join(map(str, requested))} rank(s); the {kind} executor runs {actual} "
                       "process(es) on this machine's CPU")


def check_batch(where: str, res: Dict[str, Any], global_batch: int) -> None:
    try:
        noderange.check_batch(where, noderange.bounds(res["nodes"]), res["tasks_per_node"], global_batch)
    except noderange.NodeRangeError as err:
        raise ConfigError(str(err)) from None


def rank_text(job: Any) -> str:
    """'4 rank(s)'; under a node range '1-2 node(s) x 2 task(s) = 2-4 rank(s)'."""
    worlds = job.worlds or (job.ranks,)
    if len(worlds) == 1:
        return f"{worlds[0]} rank(s)"
    return (f"{noderange.show(noderange.bounds(job.resources['nodes']))} node(s) x {job.resources['tasks_per_node']} task(s) = "
            f"{worlds[0]}-{worlds[-1]} rank(s)")


def batch_lines(batch: Sequence[int], worlds: Sequence[int]) -> List[str]:
    """The batch plan (hpc.runtime.batching.plan_batch) at each world size; one that cannot split says so."""
    if not batch:
        return []
    global_batch, per_device_max = batch
    lines = []
    for world in worlds:
        try:
            b = plan_batch(global_batch, per_device_max, world)
        except ValueError as err:
            lines.append(f"batch at {world} rank(s): cannot plan: {err}")
            continue
        lines.append(f"batch at {world} rank(s): global {b.global_batch} = {b.micro_batch} per micro-batch x "
                     f"{b.accum_steps} accumulation step(s) x {world} rank(s)")
    return lines
