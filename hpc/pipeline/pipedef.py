"""What a pipeline is: its stages (StageDef), the pipeline itself (PipelineDef), and the registry
that loads one by name or module path.

    from hpc.pipeline.plan import PipelineDef, StageDef   # their documented home re-exports them
    PIPELINE = PipelineDef("mine", MyConfig, lambda cfg: [StageDef("train", "mypkg.jobs:train")])
    python -m hpc.submit mypkg.pipeline --dry-run

Pipelines register in PIPELINES (name -> module exposing PIPELINE, a PipelineDef); modules are
imported lazily so that loading a pipeline never imports torch, nor the planner (hpc.pipeline.plan).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from hpc import Frozen
from hpc.config.checks import ConfigError

# name -> module path; the module defines PIPELINE. Tests and users may add entries.
PIPELINES: Dict[str, str] = {
    "langsplat": "hpc.jobs.langsplat.pipeline",
    "run": "hpc.jobs.run",
}

# A pipeline's classes are never compared or printed: no generated __repr__ or __eq__ (imports cost a submission)


@dataclass(repr=False, eq=False)
class StageDef(Frozen):
    """One stage: `target` ("module:function") is called with a StageContext in every task."""

    name: str
    target: str
    items: Tuple[Any, ...] = ()  # array items (one task each); () = a single job
    after: Tuple[str, ...] = ()  # stages that must end successfully first (afterok)
    # an earlier array stage with the same items: item k waits only for its item k (aftercorr)
    per_item_after: str = ""
    # item -> the per_item_after item it waits for (None: the same item); a sweep's stage waits on
    # its point's one task of the stage before (hpc.sweep.submission)
    per_item_of: Optional[Callable[[Any], Any]] = None
    resources: str = ""  # key under cfg.stages; default: the stage name
    describe: str = ""  # what each task runs, for the plan output (default: the target)
    skip: str = ""  # why this stage is not needed (its outputs exist): listed as skipped, never submitted
    batch: Tuple[int, ...] = ()  # (global batch, most samples per device): the plan shows plan_batch per world size


@dataclass(repr=False, eq=False)
class PipelineDef(Frozen):
    name: str
    schema: type  # config dataclass checked by OmegaConf
    stages: Callable[[Any], List[StageDef]]  # cfg -> stages, in submission order
    validate: Callable[[Any], None] = lambda cfg: None  # pipeline-specific input checks
    templates: Tuple[str, ...] = ()  # its files in templates/ (hpc.templates), merged in order; each must exist
    notes: Callable[[Any], List[str]] = lambda cfg: []  # cfg -> lines the plan states (choices it made)
    # fills in values that depend on others (a mode's default) on the built config, before it is
    # checked, kept (hpc.config.cache) and saved: `validate` only reads, as it gets a read-only view.
    # Returns whether what it did depends on the config alone; False (it read files or the working
    # directory): the result is built anew every time, never read back from the cache. It may call any
    # module of its own package: the cache key hashes that package's sources (hpc.config.cache)
    settle: Optional[Callable[[Any], bool]] = None
    options: Tuple[Any, ...] = ()  # its own options of hpc.submit (hpc.pipeline.options.Option), in help order


def get_pipeline(name: str) -> PipelineDef:
    """A registered name, or a user's own `package.module[:ATTR]` defining a PipelineDef (ATTR: PIPELINE)."""
    module, _, attr = PIPELINES.get(name, name).partition(":")
    if name not in PIPELINES and "." not in module and not attr:
        raise ConfigError(f"unknown pipeline {name!r}; expected one of {sorted(PIPELINES)} or a module "
                          "path such as mypkg.pipelines:PIPELINE. HINT: register it in hpc.pipeline.plan.PIPELINES.")
    try:
        found = getattr(importlib.import_module(module), attr or "PIPELINE")
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"pipeline {name!r} could not be loaded ({err}). HINT: the module must be "
                          "importable from the current directory and define PIPELINE "
                          "(a hpc.pipeline.plan.PipelineDef).") from err
    if not isinstance(found, PipelineDef):
        raise ConfigError(f"{name!r} is a {type(found).__name__}, expected a hpc.pipeline.plan.PipelineDef.")
    return found
