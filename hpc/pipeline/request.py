"""One submission as `python -m hpc.submit` takes it, typed: what hpc.pipeline.submission.start() runs.

    Request("langsplat", levels=(0, 1, 2), cluster="local", wait=True)
    Request("run", nodes="1", tasks_per_node=2, command=("python", "train.py"))

The convenience options become dotted config overrides (flags()), after the user's own.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple


@dataclass(frozen=True)
class Request:
    """One submission, as `python -m hpc.submit` takes it (hpc.submit documents each option)."""

    pipeline: str  # a name in hpc.pipeline.plan.PIPELINES, or a module path ("mypkg.pipeline")
    overrides: Tuple[str, ...] = ()  # dotted key=value config overrides
    profile: Optional[str] = None
    cluster: Optional[str] = None  # auto | slurm | local | debug; None: the config's
    run_dir: Optional[str] = None  # an existing one resumes
    levels: Optional[Tuple[int, ...]] = None  # langsplat.levels
    nodes: Optional[str] = None  # `run`: stages.main.nodes, a count or MIN-MAX
    gpus_per_node: Optional[int] = None  # `run`: stages.main.gpus_per_node (and tasks per node)
    tasks_per_node: Optional[int] = None  # `run`: stages.main.tasks_per_node; alone: CPU ranks, no GPUs
    rank_env: bool = True  # `run`: export RANK/WORLD_SIZE/MASTER_* (script.rank_env)
    resume_if: Optional[str] = None  # `run`: script.resume_if (hpc.scripts.resume)
    resume_args: Optional[Tuple[str, ...]] = None  # `run`: script.resume_args
    warn_signal: Optional[str] = None  # `run`: script.warn_signal
    framework: Optional[str] = None  # `run`: script.framework (hpc.scripts.presets)
    accelerate_config: Optional[str] = None  # `run`: script.accelerate_config
    hang_after_s: Optional[float] = None  # `run`: script.hang_after_s (hpc.scripts.scriptwatch)
    heartbeat: Optional[str] = None  # `run`: script.heartbeat
    command: Tuple[str, ...] = ()  # `run`: the user's command line
    dry_run: bool = False
    wait: bool = False
    no_snapshot: bool = False
    same_snapshot: bool = False
    sweep: Optional[Tuple[str, ...]] = None  # KEY=V1,V2 axes (hpc.sweep.grid)
    sweep_file: Optional[str] = None

    def flags(self) -> List[str]:
        """The convenience options as dotted overrides (quoted as YAML flow values by OmegaConf)."""
        out = []
        if self.cluster:
            out.append(f"cluster.kind={self.cluster}")
        if self.levels:
            out.append(f"langsplat.levels=[{','.join(map(str, self.levels))}]")
        if self.nodes is not None:
            out.append(f"stages.main.nodes={self.nodes}")
        if self.gpus_per_node is not None:
            out += [f"stages.main.gpus_per_node={self.gpus_per_node}",
                    f"stages.main.tasks_per_node={max(1, self.gpus_per_node)}"]
        if self.tasks_per_node is not None:
            out.append(f"stages.main.tasks_per_node={self.tasks_per_node}")
            if self.gpus_per_node is None:
                out.append("stages.main.gpus_per_node=0")
        if not self.rank_env:
            out.append("script.rank_env=false")
        if self.resume_if is not None:
            out.append(f"script.resume_if={json.dumps(self.resume_if)}")
        if self.resume_args is not None:
            out.append(f"script.resume_args={json.dumps(list(self.resume_args))}")
        if self.warn_signal is not None:
            out.append(f"script.warn_signal={self.warn_signal}")
        if self.framework is not None:
            out.append(f"script.framework={self.framework}")
        if self.accelerate_config is not None:
            out.append(f"script.accelerate_config={json.dumps(self.accelerate_config)}")
        if self.hang_after_s is not None:
            out.append(f"script.hang_after_s={self.hang_after_s}")
        if self.heartbeat is not None:
            out.append(f"script.heartbeat={json.dumps(self.heartbeat)}")
        if self.command:
            out.append(f"script.command={json.dumps(list(self.command))}")  # JSON list: YAML reads it verbatim
        if self.no_snapshot:
            out.append("run.snapshot=false")
        return out


@dataclass(frozen=True)
class Submitted:
    """What a submission did: the run (or sweep) directory, the executor kind, and stage (or array
    label) -> the job ids submitted now; empty for a dry run, or when everything was done or queued."""

    path: Path
    kind: str  # slurm | local | debug
    jobs: Dict[str, List[str]] = field(default_factory=dict)
