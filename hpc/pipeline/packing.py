"""Packing: k one-node items of an array stage side by side in one job of k times the item's resources.

    python -m hpc.submit tiny stages.second.pack=2 --dry-run     # which items share which job

A site that allocates whole nodes, or refuses jobs under a minimum size, wastes most of a node on
one-GPU items, or refuses them. `stages.X.pack: k` groups the stage's items still to run k per job:
ceil(items / k) jobs, submitted as one array, each asking k times the item's GPUs, ranks (so CPUs)
and memory; a last group of fewer items is a job of its own asking for what it holds (apart, fit).
The plan is made against the partition's GPUs per node (hpc.slurm.gres, passed in) and the site's
minimum job size (cluster.min_job_gpus); a k that does not fit is refused with the numbers. Inside an
allocation (`--cluster here`) a packed job's items run as its own steps do (unpacked): up to k side by
side on a node, each with its own GPUs.

Per-item waits (StageDef.per_item_after): a packed stage's items are ordered by the upstream task
they wait for, then grouped: a group whose items all wait on one task waits on that task (aftercorr
where the groups line up with an array's tasks, afterok on the task otherwise); a group whose items
wait on several tasks is one job, afterok on each of them (hpc.pipeline.arrays.Several). A stage
waiting item by item on a packed stage waits on the task holding its item: hpc.pipeline.arrays
pairs it by that task's id (aftercorr), one array per position in the group.

The job side (hpc.pipeline.packrun): a packed job's batch script runs, where other jobs' run srun
under hpc.afterstep, the pack's driver (batch_setup), which starts each of its items not done yet
as its own `srun --exact` step of the item's GPUs, ranks, CPUs and memory (HPC_PACK: item_shape), its
ranks in the stage's container where it has one (the srun options and interpreter of an unpacked job's line),
and acts as the host of each item's stop requests: one requeue of the job for all of them. A SLURM
gotcha seen on the sandbox: a step started in the batch script with `srun --exact --gres=gpu:1`
inherits the job's SLURM_GPUS_PER_NODE and then gets all the job's GPUs (CUDA_VISIBLE_DEVICES=0,1
in each step); with that variable unset for its srun, each step gets its own (0 in one, 1 in the
other). Pure.
"""
from __future__ import annotations

import dataclasses
import json
import re
import shlex
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc.config.checks import ConfigError
from hpc.container import spec
from hpc.pipeline import arrays

PACK_FAIL = ("continue", "stop")  # stages.X.pack_fail: an item's failure leaves its siblings running, or ends them
MEM = re.compile(r"(\d+)([KMGT]?B?)", re.IGNORECASE)
Group = Tuple[Any, ...]


def factor(res: Mapping[str, Any]) -> int:
    """Items per job of a stage's resources (1: not packed)."""
    k = res.get("pack", 1)
    return 1 if k is None else int(k)


def check(key: str, is_array: bool, res: Mapping[str, Any], node_gpus: Optional[int],
          min_gpus: int = 0) -> List[str]:
    """Refuse a `pack` that cannot run (ConfigError, with the numbers); the notes on what was not checked."""
    k, gpus, where = factor(res), int(res["gpus_per_node"]), f"stages.{key}"
    if k < 1:
        raise ConfigError(f"{where}.pack={k}; expected 1 or more items per job. HINT: {where}.pack=8 packs 8 items per job.")
    if res.get("pack_fail", "continue") not in PACK_FAIL:
        raise ConfigError(f"{where}.pack_fail={res.get('pack_fail')!r}; expected one of {list(PACK_FAIL)}. "
                          f"HINT: {where}.pack_fail=continue (the default) lets an item's siblings finish.")
    if k == 1:
        return []
    if not is_array:
        raise ConfigError(f"{where}.pack={k} on a stage that is no array; expected pack only on a stage with items. "
                          f"HINT: drop {where}.pack.")
    if str(res["nodes"]) != "1" or res.get("spare_nodes"):
        raise ConfigError(f"{where}.pack={k} with nodes={res['nodes']}, spare_nodes={res.get('spare_nodes') or 0}; "
                          f"expected one-node items without spare nodes. HINT: drop {where}.pack, or run each item on one node.")
    total = k * gpus
    if node_gpus is not None and gpus and total > node_gpus:
        raise ConfigError(f"{where}.pack={k}: {k} items x {gpus} GPU(s) = {total} GPUs per job; partition "
                          f"{res.get('partition') or '(default)'} has {node_gpus} GPUs per node. "
                          f"HINT: {where}.pack={max(1, node_gpus // gpus)} or less.")
    if min_gpus and gpus and total < min_gpus:
        raise ConfigError(f"{where}.pack={k}: {k} items x {gpus} GPU(s) = {total} GPUs per job; the site's minimum "
                          f"job size is {min_gpus} GPUs (cluster.min_job_gpus). HINT: {where}.pack={-(-min_gpus // gpus)} or more.")
    if node_gpus is None and gpus:
        return [f"{where}.pack={k}: {total} GPUs per job, not checked against the partition's GPUs per node "
                "(sinfo gave no answer)"]
    return []


def scale(res: Mapping[str, Any], k: int) -> Dict[str, Any]:
    """The resources of a job running k items side by side: k times the item's GPUs, ranks and memory."""
    out = dict(res)
    out["gpus_per_node"] = k * int(res["gpus_per_node"])
    out["tasks_per_node"] = k * int(res["tasks_per_node"])  # CPUs follow: cpus_per_task per rank
    found = MEM.fullmatch(str(res.get("mem") or ""))
    if found:
        out["mem"] = f"{k * int(found.group(1))}{found.group(2)}"
    return out


def pack(todo: Sequence[Any], k: int, where: Mapping[Any, arrays.Ref]
         ) -> Tuple[List[Group], Dict[Group, arrays.Ref]]:
    """The groups of k items (in the order of the upstream tasks they wait for), and what each waits on."""
    ordered = sorted(todo, key=lambda i: arrays.order(where.get(i))) if where else list(todo)
    groups = [tuple(ordered[n:n + k]) for n in range(0, len(ordered), k)]
    waits: Dict[Group, arrays.Ref] = {}
    for group in groups:
        refs = list(dict.fromkeys(where.get(i) for i in group if where.get(i) is not None))
        if refs:
            waits[group] = refs[0] if len(refs) == 1 else arrays.Several(tuple(refs))
    return groups, waits


def apply(key: str, is_array: bool, res: Dict[str, Any], todo: Tuple[Any, ...], where: Mapping[Any, arrays.Ref],
          kind: str, node_gpus: Optional[Callable[[Optional[str]], Optional[int]]], cfg: Any
          ) -> Tuple[Sequence[Any], Mapping[Any, arrays.Ref], Dict[str, Any], List[str]]:
    """A stage's units (its items, or their groups), what each waits on, the resources of one job
    and the plan's notes: make_plan's one call here. `node_gpus`: partition -> GPUs per node."""
    k = factor(res)
    if kind != "slurm":  # the same refusals, but the node's GPUs are SLURM's
        check(key, is_array, res, None)
        return todo, where, res, [f"stages.{key}.pack={k}: the {kind} executor runs the items one by one"] * (k > 1)
    notes = check(key, is_array, res, node_gpus(res.get("partition")) if node_gpus and k > 1 else None, least(cfg))
    if k == 1:
        return todo, where, res, notes
    groups, waits = pack(todo, k, where)
    return groups, waits, scale(res, k), notes


def least(cfg: Any) -> int:
    """The site's minimum job size in GPUs (cluster.min_job_gpus; 0: none)."""
    return int((cfg.cluster.get("min_job_gpus") if hasattr(cfg.cluster, "get") else 0) or 0)


def apart(split: List[arrays.Part], res: Mapping[str, Any], packed: bool) -> List[arrays.Part]:
    """A packed stage's submissions, the last group of each that holds fewer than k items, beside
    fuller ones, as a job of its own: it asks for what it holds (fit), not k items' resources."""
    k, out = factor(res), []
    for part in split:
        if not packed or len(part.items) < 2 or len(part.items[-1]) >= k:
            out.append(part)
            continue
        rest = part.items[:-1]
        out += [arrays.Part(rest, part.waits[:-1], part.ids[:-1] if len(rest) > 1 else ()),
                arrays.Part(part.items[-1:], part.waits[-1:])]
    return out


def fit(res: Dict[str, Any], groups: Sequence[Group], cfg: Any) -> Dict[str, Any]:
    """The resources of a packed job holding `groups`: its largest group's items' (at least the site's
    minimum job size, cluster.min_job_gpus), not k items' where its groups hold fewer; `pack` says how many."""
    k, item = factor(res), unscale(res)
    size = max(map(len, groups), default=k)
    if item["gpus_per_node"] and least(cfg):
        size = max(size, min(k, -(-least(cfg) // item["gpus_per_node"])))
    return res if size >= k else {**scale(item, size), "pack": size}


def unscale(res: Mapping[str, Any]) -> Dict[str, Any]:
    """One item's resources out of a packed job's (scale's inverse); mem None where it is no size."""
    k = factor(res)
    found = MEM.fullmatch(str(res.get("mem") or ""))
    return {**res, "gpus_per_node": int(res["gpus_per_node"]) // k, "tasks_per_node": int(res["tasks_per_node"]) // k,
            "mem": f"{int(found.group(1)) // k}{found.group(2)}" if found else None}


def wait_text(job: Any) -> str:
    """How a packed job waits on its per_item_after stage, in words."""
    if len(job.groups) > 1 and not any(isinstance(w, arrays.Several) for w in job.waits):
        array = job.waits[0][0] if isinstance(job.waits[0], tuple) else f"job {str(job.waits[0]).split('_')[0]}"
        return f"the {job.item_after} task holding each group's items (aftercorr on {array})"
    return f"the {job.item_after} task(s) holding its items (afterok on each)"


def lines(job: Any) -> List[str]:
    """What the dry run says of a packed job: its size, then which items share which job."""
    res, k = job.resources, len(job.groups[0])
    ids = job.task_ids or tuple(range(len(job.groups)))
    what = "array task" if len(job.groups) > 1 else "job"
    gpus = f"{res['gpus_per_node']} GPU(s) and " if res["gpus_per_node"] else ""
    out = [f"packed {factor(job.resources)} per job (stages.{job.section}.pack): {len(job.groups)} job(s), each "
           f"{gpus}{res['tasks_per_node']} rank(s) for up to {k} items side by side, "
           f"one srun step per item; an item's failure: {res.get('pack_fail', 'continue')}"]
    out += [f"{what} {t}: items {list(group)}" for t, group in zip(ids, job.groups)]
    return out


PACK_ENV = "HPC_PACK"  # the batch script's JSON of one item's shape, for hpc.pipeline.packrun


def item_shape(res: Mapping[str, Any]) -> Dict[str, Any]:
    """One item's step, from the packed job's resources: its GPUs, ranks, CPUs per rank, memory,
    what an item's failure does to its siblings, and in a container the srun options and interpreter
    of its ranks (hpc.container.spec.launch, as an unpacked job's srun line has them)."""
    item = unscale(res)
    shape = {"gpus": item["gpus_per_node"], "ranks": item["tasks_per_node"], "cpus": int(res["cpus_per_task"]),
             "mem": item["mem"], "fail": str(res.get("pack_fail") or "continue")}
    if res.get("container"):
        inside = spec.launch(res["container"], item["gpus_per_node"])
        shape.update(srun_args=list(inside.srun_args), python=inside.python)
    return shape


def batch_setup(job: Any, params: Dict[str, Any], run_dir: str, tasks: Optional[str]) -> Dict[str, Any]:
    """A packed job's sbatch parameters: its batch script's `srun` runs the pack's driver
    (hpc.pipeline.packrun) instead of hpc.afterstep, told one item's shape; other jobs' as they were."""
    if not job.groups:
        return params
    python = shlex.quote(sys.executable)
    where = f" --tasks {shlex.quote(tasks)}" * bool(tasks)
    driver = f'srun() {{ {python} -u -m hpc.pipeline.packrun {shlex.quote(run_dir)}{where} -- "$@"; }}'
    setup = [driver if line.startswith("srun() {") else line for line in params.get("setup", [])]
    shape = json.dumps(item_shape(job.resources), sort_keys=True)
    return {**params, "setup": [*setup, f"export {PACK_ENV}={shlex.quote(shape)}"]}


def unpacked(job: Any) -> Any:
    """A packed job as `--cluster here` runs it: each item its own step of the allocation, of one item's
    resources (`pack` kept: how many share a node side by side, hpc.here.alloc.width); other jobs as they are."""
    if not job.groups:
        return job
    item = unscale(job.resources)
    return dataclasses.replace(job, groups=(), waits=(), task_ids=(), resources={
        **item, "mem": item["mem"] or job.resources.get("mem"), "pack": factor(job.resources)})


def here_lines(jobs: Sequence[Any]) -> List[str]:
    """What the `--cluster here` plan says of its packed stages."""
    return [f"stages.{job.section}.pack={factor(job.resources)}: inside the allocation each item is its own step "
            f"of its own GPUs, up to {factor(job.resources)} side by side on a node" for job in jobs if job.groups]
