"""The LangSplat pipeline: stage `rgb` (1 task, 1 GPU), then stage `features`, one array task per
feature level, each a multi-GPU (multi-node) DDP job.

    python -m hpc.submit langsplat --levels 0 1 2 --profile sandbox [--dry-run]

Defaults live in templates/langsplat.yaml; the trainers are jobs.langsplat.stages.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hpc.config import ConfigError, PipelineConfig, Resources
from hpc.plan import PipelineDef, StageDef

LEVELS = (0, 1, 2)
MODES = ("synthetic", "external")


@dataclass
class LangsplatSection:
    """Passed as a plain dict to the trainers (train_rgb / train_features)."""

    mode: str = "synthetic"  # synthetic: a generated scene; external: a LangSplat dataset at data_path
    data_path: Optional[str] = None  # dataset directory (external mode)
    levels: List[int] = field(default_factory=lambda: list(LEVELS))  # feature levels, one array task each
    trainer: Dict[str, Any] = field(default_factory=dict)  # trainer settings (jobs.langsplat.defaults)


@dataclass
class LangsplatStages:
    rgb: Resources = field(default_factory=lambda: Resources(gpus_per_node=1))
    features: Resources = field(default_factory=lambda: Resources(gpus_per_node=8, tasks_per_node=8))


@dataclass
class LangsplatConfig(PipelineConfig):
    stages: LangsplatStages = field(default_factory=LangsplatStages)
    langsplat: LangsplatSection = field(default_factory=LangsplatSection)


def validate(cfg: Any) -> None:
    sec = cfg.langsplat
    bad = [lv for lv in sec.levels if lv not in LEVELS]
    if bad or not sec.levels or len(set(sec.levels)) != len(sec.levels):
        raise ConfigError(f"levels {list(sec.levels)}: unknown or repeated level(s) {bad}; expected "
                          f"distinct values from {list(LEVELS)}. HINT: --levels 0 1 2")
    if sec.mode not in MODES:
        raise ConfigError(f"langsplat.mode={sec.mode!r}; expected one of {list(MODES)}. "
                          "HINT: langsplat.mode=synthetic needs no data.")
    if sec.mode == "external" and (not sec.data_path or not Path(sec.data_path).is_dir()):
        raise ConfigError(f"langsplat.data_path={sec.data_path!r} is not a directory; external mode needs "
                          "the dataset there. HINT: langsplat.data_path=/path/to/scene or langsplat.mode=synthetic")


def stages(cfg: Any) -> List[StageDef]:
    return [StageDef("rgb", "jobs.langsplat.pipeline:rgb"),
            StageDef("features", "jobs.langsplat.pipeline:features", items=tuple(cfg.langsplat.levels),
                     after=("rgb",))]


def rgb(ctx: Any) -> dict:
    from jobs.langsplat.stages import train_rgb

    return train_rgb(ctx.cfg["langsplat"], ctx.stage_dir)


def features(ctx: Any) -> dict:
    from jobs.langsplat.stages import train_features

    return train_features(ctx.cfg["langsplat"], ctx.stage_dir, ctx.item, ctx.run_dir / "rgb")


PIPELINE = PipelineDef("langsplat", LangsplatConfig, stages, validate)
