"""The LangSplat pipeline. Synthetic mode (the built-in trainer on a generated scene): stage `rgb`
(1 GPU), then `features`, one array task per level, each a multi-GPU DDP job. External mode drives
a user's LangSplat checkout through every stage (hpc.jobs.langsplat.external).

    python -m hpc.submit langsplat --levels 0 1 2 --profile sandbox [--dry-run]
    python -m hpc.submit langsplat langsplat.mode=external langsplat.data_path=/data/scene \
        external.langsplat_dir=/opt/LangSplat ... [--levels 1 2 3]

Defaults live in templates/langsplat.yaml and templates/langsplat_external.yaml; the synthetic
trainers are hpc.jobs.langsplat.stages.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hpc.config.schema import ConfigError, PipelineConfig, Resources, to_dict
from hpc.pipeline.options import SEVERAL, Option
from hpc.pipeline.plan import PipelineDef, StageDef

from .defaults import Trainer, check, trainer_config

# hpc.jobs.langsplat.external (the external mode's stages and checks) is loaded only in that mode: a
# synthetic submission plans without it

LEVELS = (0, 1, 2)  # the synthetic scene's levels
MODES = ("synthetic", "external")


@dataclass(repr=False, eq=False)
class LangsplatSection:
    """Passed as a plain dict to the trainers (train_rgb / train_features)."""

    mode: str = "synthetic"  # synthetic: a generated scene; external: a LangSplat checkout on data_path
    data_path: Optional[str] = None  # dataset directory (external mode): images/, sparse/0/
    levels: Optional[List[int]] = None  # one array task each; None: 1 2 3 (external), 0 1 2 (synthetic)
    trainer: Trainer = field(default_factory=Trainer)  # the built-in trainer's settings (hpc.jobs.langsplat.defaults)


@dataclass(repr=False, eq=False)
class ExternalSection:
    """External mode (templates/langsplat_external.yaml documents each key)."""

    langsplat_dir: Optional[str] = None
    gaussian_splatting_dir: Optional[str] = None
    python: Optional[str] = None
    gaussian_splatting_python: Optional[str] = None
    iterations: int = 30000
    checkpoint_every: int = 2000
    ddp_work: str = "views"
    dist_backend: str = "nccl"
    sam_checkpoint: Optional[str] = None
    clip_hf_home: Optional[str] = None
    images_per_shard: int = 50
    ae_epochs: int = 100
    ae_lr: float = 0.0007
    encoder_dims: List[int] = field(default_factory=lambda: [256, 128, 64, 32, 3])
    decoder_dims: List[int] = field(default_factory=lambda: [16, 32, 64, 128, 256, 256, 512])
    ae_ckpt_dir: Optional[str] = None
    label_dir: Optional[str] = None


def _one_gpu() -> Resources:
    return Resources(gpus_per_node=1)


@dataclass(repr=False, eq=False)
class LangsplatStages:
    rgb: Resources = field(default_factory=_one_gpu)
    features: Resources = field(default_factory=lambda: Resources(gpus_per_node=8, tasks_per_node=8))
    preprocess: Resources = field(default_factory=_one_gpu)
    merge: Resources = field(default_factory=Resources)
    ae_train: Resources = field(default_factory=_one_gpu)
    ae_encode: Resources = field(default_factory=_one_gpu)
    features_1gpu: Resources = field(default_factory=_one_gpu)
    render: Resources = field(default_factory=_one_gpu)
    eval: Resources = field(default_factory=_one_gpu)


@dataclass(repr=False, eq=False)
class LangsplatConfig(PipelineConfig):
    stages: LangsplatStages = field(default_factory=LangsplatStages)
    langsplat: LangsplatSection = field(default_factory=LangsplatSection)
    external: ExternalSection = field(default_factory=ExternalSection)


def resolved_levels(levels: Optional[List[int]], mode: str) -> List[int]:
    """--levels as given, else the mode's default: LangSplat's 1 2 3 (s m l), the synthetic 0 1 2."""
    return list(levels) if levels else ([1, 2, 3] if mode == "external" else [0, 1, 2])


def settle(cfg: Any) -> bool:
    """The levels, when none were given: the mode's default; in external mode also every path made
    absolute and SAM's checkpoint found, which depend on the directory and the files (not kept)."""
    cfg.langsplat.levels = resolved_levels(cfg.langsplat.levels, cfg.langsplat.mode)
    if cfg.langsplat.mode == "external":
        from . import external  # external mode only: a synthetic submission never loads it

        external.absolute_paths(cfg)
        return False
    return True


def notes(cfg: Any) -> List[str]:
    """External mode's lines for the plan (hpc.jobs.langsplat.external.notes); none in synthetic mode."""
    if cfg.langsplat.mode != "external":
        return []
    from . import external  # external mode only: a synthetic submission never loads it

    return external.notes(cfg)


def validate(cfg: Any) -> None:
    """Checks before submission (the levels are settled by then)."""
    sec = cfg.langsplat
    check(trainer_config(to_dict(sec)))
    if sec.mode not in MODES:
        raise ConfigError(f"langsplat.mode={sec.mode!r}; expected one of {list(MODES)}. "
                          "HINT: langsplat.mode=synthetic needs no data.")
    if sec.mode == "external":
        from . import external  # external mode only: a synthetic submission never loads it

        external.validate(cfg)
        return
    bad = [lv for lv in sec.levels if lv not in LEVELS]
    if bad or len(set(sec.levels)) != len(sec.levels):
        raise ConfigError(f"levels {list(sec.levels)}: unknown or repeated level(s) {bad}; the synthetic scene "
                          f"has levels {list(LEVELS)}. HINT: --levels 0 1 2 (or langsplat.mode=external)")


def stages(cfg: Any) -> List[StageDef]:
    if cfg.langsplat.mode == "external":
        from . import external  # external mode only: a synthetic submission never loads it

        return external.stages(cfg)
    levels = tuple(resolved_levels(cfg.langsplat.levels, "synthetic"))
    trainer = trainer_config(to_dict(cfg.langsplat))
    return [StageDef("rgb", "hpc.jobs.langsplat.pipeline:rgb"),
            StageDef("features", "hpc.jobs.langsplat.pipeline:features", items=levels, after=("rgb",),
                     batch=(trainer["cameras_per_step"], trainer["per_device_cameras"]))]


def rgb(ctx: Any) -> dict:
    from hpc.jobs.langsplat.stages import train_rgb  # torch: in the task only, never when planning

    return train_rgb(ctx.cfg["langsplat"], ctx.stage_dir)


def features(ctx: Any) -> dict:
    from hpc.jobs.langsplat.stages import train_features

    return train_features(ctx.cfg["langsplat"], ctx.stage_dir, ctx.item, ctx.run_dir / "rgb")


# python -m hpc.submit langsplat --levels 0 1, hpc.submit("langsplat", levels=[0, 1]) (hpc.pipeline.options)
OPTIONS = (Option("levels", "langsplat.levels", "LangSplat feature levels 0-3 (default: 1 2 3 in external mode, "
                  "0 1 2 synthetic)", int, form=SEVERAL),)
PIPELINE = PipelineDef("langsplat", LangsplatConfig, stages, validate,
                       templates=("langsplat.yaml", "langsplat_external.yaml"), notes=notes, settle=settle,
                       options=OPTIONS)
