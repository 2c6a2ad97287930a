"""One submission as `python -m hpc.submit` takes it, typed: what hpc.pipeline.submission.start() runs.

    Request("langsplat", options={"levels": [0, 1, 2]}, cluster="local", wait=True)
    Request("run", options={"nodes": 1, "tasks_per_node": 2, "command": ["python", "train.py"]})

The fields are the engine's own; `options` holds the values of the pipeline's own options
(PipelineDef.options, hpc.pipeline.options), which the engine does not know by name. flags() turns
them and the engine's convenience fields into dotted config overrides, after the user's own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hpc import Frozen
from hpc.pipeline import options as hoptions
from hpc.pipeline.plan import get_pipeline


# Request, Submitted: never compared or printed, so without a generated __repr__ and __eq__ (imports cost a submission)
@dataclass(repr=False, eq=False)
class Request(Frozen):
    """One submission, as `python -m hpc.submit` takes it (hpc.submit documents each option)."""

    pipeline: str  # a name in hpc.pipeline.plan.PIPELINES, or a module path ("mypkg.pipeline")
    overrides: Tuple[str, ...] = ()  # dotted key=value config overrides
    profile: Optional[str] = None
    cluster: Optional[str] = None  # auto | slurm | local | debug; None: the config's
    run_dir: Optional[str] = None  # an existing one resumes
    options: Mapping[str, Any] = field(default_factory=dict)  # the pipeline's own options: name -> value
    dry_run: bool = False
    wait: bool = False
    no_snapshot: bool = False
    same_snapshot: bool = False
    sweep: Optional[Tuple[str, ...]] = None  # KEY=V1,V2 axes (hpc.sweep.grid)
    sweep_file: Optional[str] = None

    def flags(self) -> List[str]:
        """The convenience options as dotted overrides (quoted as YAML flow values by OmegaConf)."""
        out = [f"cluster.kind={self.cluster}"] if self.cluster else []
        if self.options:
            out += hoptions.overrides(get_pipeline(self.pipeline).options, self.options)
        return out + (["run.snapshot=false"] if self.no_snapshot else [])


@dataclass(repr=False, eq=False)
class Submitted(Frozen):
    """What a submission did: the run (or sweep) directory, the executor kind, and stage (or array
    label) -> the job ids submitted now; empty for a dry run, or when everything was done or queued."""

    path: Path
    kind: str  # slurm | local | debug
    jobs: Dict[str, List[str]] = field(default_factory=dict)
