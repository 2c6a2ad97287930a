"""The LangSplat pipeline: stage `rgb` (1 task, 1 GPU), then stage `features`, one array task per
feature level, each a multi-GPU (multi-node) DDP job.

    python -m hpc.submit langsplat --levels 0 1 2 --profile sandbox [--dry-run]

Defaults live in templates/langsplat.yaml; the trainers are hpc.jobs.langsplat.stages.
"""
from __future__ import annotations

import shlex
import sys
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
    trainer: Dict[str, Any] = field(default_factory=dict)  # trainer settings (hpc.jobs.langsplat.defaults)


@dataclass
class ExternalSection:
    """External mode: a LangSplat checkout's own scripts are the stages (templates/langsplat_external.yaml)."""

    langsplat_dir: Optional[str] = None  # the checkout (has train.py and train_ddp.py)
    iterations: int = 30000  # {iterations} in the commands
    commands: Dict[str, str] = field(default_factory=dict)  # stage -> command template
    rgb_checkpoint: str = "{rgb_model}/chkpnt{iterations}.pth"  # stage 1's checkpoint, {rgb_checkpoint}
    standin_commands: Dict[str, str] = field(default_factory=dict)  # same, for the stand-in script
    use_standin: bool = False  # run jobs/langsplat/external_standin.py instead of a checkout (tests)


@dataclass
class LangsplatStages:
    rgb: Resources = field(default_factory=lambda: Resources(gpus_per_node=1))
    features: Resources = field(default_factory=lambda: Resources(gpus_per_node=8, tasks_per_node=8))


@dataclass
class LangsplatConfig(PipelineConfig):
    stages: LangsplatStages = field(default_factory=LangsplatStages)
    langsplat: LangsplatSection = field(default_factory=LangsplatSection)
    external: ExternalSection = field(default_factory=ExternalSection)


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
    ext = cfg.external
    if sec.mode == "external" and not ext.use_standin and not (
            ext.langsplat_dir and (Path(ext.langsplat_dir) / "train.py").is_file()):
        raise ConfigError(f"external.langsplat_dir={ext.langsplat_dir!r} has no train.py; expected a LangSplat "
                          "checkout. HINT: external.langsplat_dir=/path/to/LangSplat (or external.use_standin=true)")


def stages(cfg: Any) -> List[StageDef]:
    suffix = "_external" if cfg.langsplat.mode == "external" else ""
    return [StageDef("rgb", f"hpc.jobs.langsplat.pipeline:rgb{suffix}"),
            StageDef("features", f"hpc.jobs.langsplat.pipeline:features{suffix}", items=tuple(cfg.langsplat.levels),
                     after=("rgb",))]


def render_command(cfg: dict, stage: str, **values: Any) -> List[str]:
    """A stage's command template as argv. Split first, fill in after: a value with spaces or shell
    characters stays one argument, and no shell ever reads it."""
    ext = cfg["external"]
    table = ext["standin_commands"] if ext["use_standin"] else ext["commands"]
    values = {"python": sys.executable, "langsplat_dir": ext["langsplat_dir"],
              "source": cfg["langsplat"]["data_path"], "iterations": ext["iterations"], **values}
    values.setdefault("rgb_checkpoint", ext["rgb_checkpoint"].format(**values))
    return [token.format(**values) for token in shlex.split(table[stage])]


def rgb_external(ctx: Any) -> dict:
    from hpc.jobs.run import run_argv

    argv = render_command(ctx.cfg, "rgb", model=ctx.stage_dir, rgb_model=ctx.stage_dir)
    return run_argv(ctx, argv, ctx.cfg["stages"]["rgb"]["max_timeouts"], launch=False)


def features_external(ctx: Any) -> dict:
    from hpc.jobs.run import run_argv

    argv = render_command(ctx.cfg, "features", model=ctx.stage_dir, rgb_model=ctx.run_dir / "rgb", level=ctx.item)
    return run_argv(ctx, argv, ctx.cfg["stages"]["features"]["max_timeouts"])  # under hpc.launch


def rgb(ctx: Any) -> dict:
    from hpc.jobs.langsplat.stages import train_rgb

    return train_rgb(ctx.cfg["langsplat"], ctx.stage_dir)


def features(ctx: Any) -> dict:
    from hpc.jobs.langsplat.stages import train_features

    return train_features(ctx.cfg["langsplat"], ctx.stage_dir, ctx.item, ctx.run_dir / "rgb")


PIPELINE = PipelineDef("langsplat", LangsplatConfig, stages, validate, templates=("langsplat.yaml", "langsplat_external.yaml"))
