"""Pipeline configuration: documented dataclasses checked by OmegaConf.

    python -m hpc.submit langsplat --profile sandbox stages.features.nodes=1 --dry-run

Precedence, lowest first: dataclass defaults < the pipeline's templates (templates/<pipeline>.yaml, ...)
< templates/profiles/<profile>.yaml < the run directory's saved config.yaml (when resubmitting)
< dotted `key=value` command-line overrides. Templates ship as package data (hpc.templates, from the
repository's templates/) and are read through importlib.resources, so an installed wheel has them too.
The resolved result is saved as <run_dir>/config.yaml. No torch here: dry-run and status stay fast.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException


def templates_root() -> Traversable:
    """The shipped templates (package hpc.templates; the repository's templates/ directory)."""
    return resources.files("hpc.templates")

CLUSTER_KINDS = ("auto", "slurm", "local", "debug")
# Values that end up as sbatch options: one shell-safe token (submitit quotes them too; a newline
# inside a #SBATCH value would still start a new script line, so refuse it outright).
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.:,@%+=/\-\[\]]*$")


class ConfigError(ValueError):
    """Bad user configuration: the message says what was seen, what is valid, and a HINT."""


@dataclass
class Resources:
    """What one job (or one array task) of a stage asks SLURM for."""

    nodes: int = 1  # nodes per job; an array task can itself span several nodes
    gpus_per_node: int = 0  # GPUs per node (--gpus-per-node); 0 for CPU-only stages
    tasks_per_node: int = 1  # ranks per node; one per GPU for DDP stages
    cpus_per_task: int = 2  # CPU cores per rank (data loader workers live here)
    mem: Optional[str] = None  # memory per node, sbatch syntax (e.g. 16G); None = cluster default
    time_min: int = 60  # wall-clock limit in minutes
    partition: Optional[str] = None  # None = the cluster's default partition
    account: Optional[str] = None  # --account
    qos: Optional[str] = None  # --qos
    constraint: Optional[str] = None  # --constraint (node features)
    signal_delay_s: int = 120  # SIGUSR2 this many seconds before the time limit (checkpoint window)
    max_timeouts: int = 3  # how often a job that hit its time limit is requeued
    local_tasks: int = 1  # processes when run by the local executor (CPU, one machine)
    extra: Dict[str, str] = field(default_factory=dict)  # further sbatch options, name -> value


@dataclass
class ClusterSettings:
    """Where jobs go."""

    kind: str = "auto"  # auto | slurm | local | debug; auto = slurm when sbatch answers, else local
    partitions: Optional[List[str]] = None  # partitions that exist; None = ask the scheduler once
    setup: List[str] = field(default_factory=list)  # shell lines run before srun (module load ...)


@dataclass
class RunSettings:
    """Where the run directory lives."""

    name: Optional[str] = None  # run name; default <pipeline>-<timestamp>
    root: str = "runs"  # parent of new run directories
    run_dir: Optional[str] = None  # explicit run directory (resubmit into it to resume)


@dataclass
class PipelineConfig:
    """Sections every pipeline has; a pipeline's schema adds `stages` and its own section."""

    run: RunSettings = field(default_factory=RunSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)


def load(schema: type, pipeline: str, profile: Optional[str] = None,
         overrides: Sequence[str] = (), saved: Optional[Path] = None,
         templates: Optional[Traversable] = None, extra: Sequence[str] = ()) -> DictConfig:
    """Build the resolved config for `pipeline`, checked against `schema` (a dataclass).
    `extra`: the pipeline's template files (PipelineDef.templates), merged in order; each must exist:
    running on dataclass defaults because a template went missing would be silently wrong."""
    templates = templates or templates_root()
    cfg = OmegaConf.structured(schema)
    for name in extra:
        base = templates / name
        if not base.is_file():
            raise ConfigError(f"template {name} of pipeline {pipeline!r} not found in {templates}. "
                              "HINT: reinstall hpc (pip install .), or restore templates/" + name + ".")
        cfg = _merge(cfg, OmegaConf.create(base.read_text()), f"templates/{name}")
    if profile:
        path = _profile_path(profile, templates)
        cfg = _merge(cfg, _for_stages(OmegaConf.create(path.read_text()), cfg), f"templates/profiles/{profile}.yaml")
    if saved is not None and saved.exists():
        cfg = _merge(cfg, OmegaConf.load(saved), str(saved))
    cfg = _merge(cfg, _parse_overrides(overrides), "command line")
    check_resources(cfg)
    return cfg


def profile_names(templates: Optional[Traversable] = None) -> List[str]:
    folder = (templates or templates_root()) / "profiles"
    return sorted(p.name[:-len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _profile_path(profile: str, templates: Traversable) -> Traversable:
    path = templates / "profiles" / f"{profile}.yaml"
    if not path.is_file():
        names = profile_names(templates)
        raise ConfigError(f"unknown profile {profile!r}; expected one of {names}. "
                          f"HINT: add templates/profiles/{profile}.yaml or pick an existing one.")
    return path


def _for_stages(profile: DictConfig, cfg: DictConfig) -> DictConfig:
    """A profile describes resources for stages of several pipelines: keep the ones this one has."""
    if "stages" in profile:
        profile.stages = {k: v for k, v in profile.stages.items() if k in cfg.stages}
    return profile


def _parse_overrides(overrides: Sequence[str]) -> DictConfig:
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise ConfigError(f"cannot read override(s) {bad}; expected dotted key=value "
                          "(e.g. stages.features.nodes=2). HINT: options go before '--'.")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except Exception as err:  # yaml's parser errors: the value is not valid YAML
        raise ConfigError(f"cannot parse overrides {list(overrides)}: {str(err).splitlines()[0]}. "
                          "HINT: quote lists as key=[a,b] and values with spaces as key='a b'.") from None


def _merge(cfg: DictConfig, layer: Any, origin: str) -> DictConfig:
    try:
        return OmegaConf.merge(cfg, layer)
    except ConfigKeyError as err:
        raise ConfigError(_unknown_key_message(cfg, err, origin)) from None
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", "?")
        detail = str(getattr(err, "msg", err)).splitlines()[0]
        raise ConfigError(f"{origin}: bad value for {key}: {detail}. "
                          f"HINT: give {key} a value of the documented type "
                          "(see hpc/config.py and the pipeline's config dataclass).") from None


def _unknown_key_message(cfg: DictConfig, err: ConfigKeyError, origin: str) -> str:
    full_key = getattr(err, "full_key", "") or ""
    parent_path = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    parent = OmegaConf.select(cfg, parent_path) if parent_path else cfg
    valid = sorted(parent.keys()) if isinstance(parent, DictConfig) else []
    where = parent_path or "the top level"
    return (f"{origin}: unknown config key {full_key!r}; valid keys under {where}: {valid}. "
            "HINT: check the spelling, or see templates/ for the documented keys.")


def check_resources(cfg: DictConfig) -> None:
    """Refuse impossible resource requests before anything reaches the scheduler."""
    if cfg.cluster.kind not in CLUSTER_KINDS:
        raise ConfigError(f"cluster.kind={cfg.cluster.kind!r}; expected one of {list(CLUSTER_KINDS)}. "
                          "HINT: --cluster auto picks slurm when sbatch answers, else local.")
    for name, res in cfg.stages.items():
        for key in ("nodes", "tasks_per_node", "cpus_per_task", "time_min", "local_tasks"):
            if res[key] < 1:
                raise ConfigError(f"stages.{name}.{key}={res[key]}; expected an integer >= 1. "
                                  f"HINT: set stages.{name}.{key}=1 or more.")
        for key in ("gpus_per_node", "signal_delay_s", "max_timeouts"):
            if res[key] < 0:
                why = " (a GPU count cannot be negative)" if key == "gpus_per_node" else ""
                raise ConfigError(f"stages.{name}.{key}={res[key]}; expected an integer >= 0{why}. "
                                  f"HINT: set stages.{name}.{key}=0 or more.")
        values = {k: res[k] for k in ("mem", "partition", "account", "qos", "constraint")}
        values.update({f"extra.{k}": v for k, v in res.extra.items()})
        for key, value in values.items():
            if value is not None and not _SAFE_VALUE.match(str(value)):
                raise ConfigError(f"stages.{name}.{key}={value!r} has characters sbatch options may not "
                                  "contain (spaces, quotes, newlines, ;|&$`). HINT: use a plain token.")


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def to_dict(cfg: DictConfig) -> Dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
