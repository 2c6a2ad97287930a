"""A stage's resources as the plan takes them: its section of the config, checked, and what the plan says of it.

    python -m hpc.submit langsplat --profile sandbox --dry-run    # the notes these checks add end the plan

hpc.pipeline.plan decides which tasks run and after what; this module gives it, per stage, the
resolved `stages.<key>` section with its container (hpc.container.spec, on SLURM only: the local
executors run on the host), the world sizes a job may get (hpc.pipeline.worlds, a node range's
batch checked at every node count), and the notes each calls for: the executor running another
number of processes than SLURM would, a time-limit signal due so soon it may reach no task
(hpc.pipeline.earlysignal), and `--cluster auto` having fallen back from SLURM (fallback_notes).
Pure, but for the container's checks of the file system.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc.config.schema import to_dict
from hpc.container import spec
from hpc.pipeline import earlysignal, sbatch, worlds


def of_stage(cfg: Any, name: str, key: str, batch: Sequence[int], kind: str, run_dir: str
             ) -> Tuple[Dict[str, Any], Tuple[int, ...], str, Optional[str]]:
    """(the resources of stage `name` from cfg.stages[`key`], its world sizes, the executor's note
    on them or '', the early-signal note or None). `batch`: StageDef.batch, checked on SLURM."""
    res = dict(to_dict(cfg.stages[key]))
    res["extra"] = sbatch.with_mail(res.get("extra"), to_dict(getattr(cfg, "notify", None) or {}))  # SLURM's mail
    res["container"] = _container(cfg, key, res, run_dir) if kind == "slurm" else None
    if kind == "slurm" and batch:  # every node count SLURM may grant, not only the ends
        worlds.check_batch(f"stages.{key}.nodes", res, batch[0])
    ranks, note = worlds.worlds(name, res, kind)
    return res, ranks, note, earlysignal.note(f"stages.{key}", res) if kind == "slurm" else None


def _container(cfg: Any, key: str, res: Mapping[str, Any], run_dir: str) -> Optional[Dict[str, Any]]:
    """The stage's container section, checked, with hpc's mounts (hpc.container.spec); None: the host."""
    section = spec.effective(res.get("container") or {}, to_dict(cfg.cluster).get("container") or {})
    where = f"stages.{key}.container" if (res.get("container") or {}).get("runtime") else "cluster.container"
    return spec.resolve(section, where, run_dir, to_dict(cfg), key) if section.get("runtime") else None


def fallback_notes(stages: Sequence[Any], cfg: Any, why_not_slurm: str) -> List[str]:
    """What `--cluster auto` falling back to the local executor means for each of `stages` (StageDefs)
    that asks for GPUs, in words, with the reason no SLURM answered."""
    if not why_not_slurm:
        return []
    notes = []
    for stage in stages:
        res = to_dict(cfg.stages[stage.resources or stage.name])
        if res["gpus_per_node"]:
            notes.append(f"no SLURM answered ({why_not_slurm}); stage {stage.name} asks for "
                         f"{res['gpus_per_node']} GPUs per node and runs as {res['local_tasks']} CPU "
                         "process(es) here")
    return notes or [f"no SLURM answered ({why_not_slurm}); running on this machine"]
