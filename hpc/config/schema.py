"""Pipeline configuration: documented dataclasses checked by OmegaConf.

    python -m hpc.submit langsplat --profile sandbox stages.features.nodes=1 --dry-run

Precedence, lowest first: dataclass defaults < the pipeline's templates (templates/<pipeline>.yaml, ...)
< the run directory's saved config.yaml (when resubmitting) < templates/profiles/<profile>.yaml
< dotted `key=value` command-line overrides. A profile named on a resubmission is applied over the
saved config (resuming with fewer GPUs is a profile away), and load() says which values it changed. Templates ship as package data (hpc.templates, from the
repository's templates/) and are read through importlib.resources, so an installed wheel has them too.
The resolved result is saved as <run_dir>/config.yaml. No torch here: dry-run and status stay fast.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from hpc.config import cache as configcache
from hpc.config import defaults, layers, userfile
from hpc.config import view as configview
from hpc.config.checks import CLUSTER_KINDS, LIMITS, ConfigError, check_resources, check_text, has_control  # noqa: F401

if TYPE_CHECKING:
    from omegaconf import DictConfig

# OmegaConf and yaml are imported where a config is built, not here: a submission whose config was
# built before reads it back as plain data (hpc.config.cache, hpc.config.view) and never needs them.
# The classes are templates for OmegaConf, never compared or printed: no generated __repr__ or __eq__
# (each costs a submission its import; hpc.config.cache spells their defaults field by field).


@dataclass(repr=False, eq=False)
class Container:
    """Where a stage's ranks run: on the host (runtime ''), or inside an image; the batch script,
    hpc.afterstep and every SLURM call stay on the host (hpc.container.spec, docs/containers.md)."""

    runtime: str = ""  # '' (no container) | pyxis | apptainer | exec (any prefix command, `prefix`)
    # pyxis: a .sqsh file or a registry image (nvcr.io#nvidia/pytorch:24.05-py3); apptainer: a .sif or docker://...
    image: str = ""
    mounts: List[str] = field(default_factory=list)  # SRC[:DST[:FLAGS]] beyond hpc's own (run dir, cache, data)
    env: Dict[str, str] = field(default_factory=dict)  # variables set inside the container, over the image's own
    python: str = "python"  # the interpreter inside the image
    workdir: Optional[str] = None  # working directory inside; the task then moves into the code snapshot
    prefix: List[str] = field(default_factory=list)  # exec: the command every rank runs under (bwrap, a wrapper)
    # carry: hpc copies itself and its pure-Python requirements into the container (hpc.container.carry);
    # image: the image has hpc installed
    hpc: str = "carry"
    # pyxis: a shared .sqsh file a registry `image` is imported to once, at submission (hpc.container.squash)
    squash: str = ""


@dataclass(repr=False, eq=False)
class NodeCheck:
    """One short check per node before a stage's ranks start, as one srun step (hpc.recovery.nodecheck,
    docs/nodecheck.md); a node that fails is excluded, one that fails `avoid_after` times avoided."""

    enabled: bool = False  # run the check before each srun of the stage (a `command` turns it on too)
    builtin: bool = True  # hpc's own check: the job's GPUs (or GPU files) answer, the CPU computes; false: command only
    command: str = ""  # a site's check, run by the shell on each node; a non-zero exit fails the node
    collective: bool = False  # also an all_reduce of collective_mb across the nodes (gloo; nccl with GPUs)
    collective_mb: float = 4.0
    timeout_s: float = 60.0  # the whole check's bound; a node without an answer by then has failed it
    avoid_after: int = 2  # failed checks in a run after which a node is avoided for the rest of the run


@dataclass(repr=False, eq=False)
class Resources:
    """What one job (or one array task) of a stage asks SLURM for."""

    nodes: Union[int, str] = 1  # nodes per job, or a range MIN-MAX (sbatch --nodes=2-4; hpc.slurm.noderange)
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
    max_timeouts: int = defaults.MAX_TIMEOUTS  # how often a job that hit its time limit is requeued
    max_node_failures: int = defaults.MAX_NODE_FAILURES  # how often a job is requeued after a node failure, failed nodes excluded (hpc.recovery.nodefail)
    # new srun steps in the same allocation, from the newest checkpoint, after a crashed or hung rank or a lost
    # node, before falling back to a requeue (hpc.recovery.inplace); 0: every failure goes through the queue
    max_restarts_in_place: int = defaults.MAX_RESTARTS_IN_PLACE
    spare_nodes: int = 0  # nodes held beyond `nodes` (sbatch --no-kill): a failed node is replaced without the queue
    local_tasks: int = 1  # processes when run by the local executor (CPU, one machine)
    array_parallelism: Optional[int] = None  # array tasks running at once (sbatch --array=0-N%P); None: submitit's 256
    # items of an array stage run side by side in one job of pack times the item's GPUs, ranks and memory,
    # each its own srun step (hpc.pipeline.packing); 1: one item per job
    pack: int = 1
    pack_fail: str = "continue"  # a packed item's failure: continue (its siblings finish) | stop (they are ended)
    extra: Dict[str, str] = field(default_factory=dict)  # further sbatch options, name -> value
    container: Container = field(default_factory=Container)  # this stage's image; runtime '': cluster.container's
    node_check: NodeCheck = field(default_factory=NodeCheck)  # each node checked before the ranks start


@dataclass(repr=False, eq=False)
class ClusterSettings:
    """Where jobs go."""

    kind: str = "auto"  # auto | slurm | local | debug | here; auto = slurm when sbatch answers, else local
    partitions: Optional[List[str]] = None  # partitions that exist; None = ask the scheduler once
    setup: List[str] = field(default_factory=list)  # shell lines run before srun (module load ...)
    min_job_gpus: int = 0  # the site's smallest job in GPUs (a packed stage is planned against it); 0: none
    container: Container = field(default_factory=Container)  # every stage's image, unless the stage names its own


@dataclass(repr=False, eq=False)
class RunSettings:
    """Where the run directory lives, and the code its jobs run."""

    name: Optional[str] = None  # run name; default <pipeline>-<timestamp>
    root: str = "runs"  # parent of new run directories
    run_dir: Optional[str] = None  # explicit run directory (resubmit into it to resume)
    snapshot: bool = True  # copy the code at submission into <root>/.hpc-snapshots/ and run the jobs from it (hpc.rundir.snapshot)
    snapshot_max_mb: float = 100.0  # a larger snapshot is refused before anything is submitted


@dataclass(repr=False, eq=False)
class ResumeSettings:
    """What a resumed attempt accepts (hpc.rundir.attempts)."""

    # warn: a resume onto other software (torch, CUDA, NCCL, driver, packages, image) is shown by hpc.status,
    # and is not bitwise; require: such a resume is refused
    same_software: str = "warn"


SAME_SOFTWARE = ("warn", "require")


@dataclass(repr=False, eq=False)
class NotifySettings:
    """Messages the jobs send about the run (hpc.rundir.notify); none while neither sink is set."""

    webhook: str = ""  # a URL that gets a JSON body Slack, Mattermost and Discord accept
    template: str = ""  # the body instead: $text, $event, $run, $task filled in (ntfy: '$text')
    command: List[str] = field(default_factory=list)  # an argv run with the message as its last argument
    events: List[str] = field(default_factory=list)  # those to send; [] = all of them
    # SLURM's own mail, for sites whose compute nodes reach no network: sbatch --mail-user on every job
    mail: str = ""
    mail_type: List[str] = field(default_factory=list)  # sbatch --mail-type values; []: from `events`
    timeout_s: float = 3.0  # a sink's deadline; at its end a job waits for its messages this and a second at most


@dataclass(repr=False, eq=False)
class PipelineConfig:
    """Sections every pipeline has; a pipeline's schema adds `stages` and its own section."""

    run: RunSettings = field(default_factory=RunSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    resume: ResumeSettings = field(default_factory=ResumeSettings)
    notify: NotifySettings = field(default_factory=NotifySettings)


def load(schema: type, pipeline: str, profile: Optional[str] = None,
         overrides: Sequence[str] = (), saved: Optional[Path] = None,
         templates: Optional[Traversable] = None, extra: Sequence[str] = (),
         notes: Optional[List[str]] = None, view: bool = True,
         settle: Optional[Callable[[Any], bool]] = None, keep: bool = True) -> Any:
    """Build the resolved config for `pipeline`, checked against `schema` (a dataclass).
    `extra`: the pipeline's template files (PipelineDef.templates), merged in order; each must exist:
    running on dataclass defaults because a template went missing would be silently wrong.
    `notes`: receives a line naming what a profile changed in a saved config. `settle`: the
    pipeline's hook that fills in values depending on others (PipelineDef.settle). A result built from
    the same inputs before is read back from the user's cache (hpc.config.cache); `keep=False` (a dry
    run) reads that cache but never writes it.
    Returns a read-only hpc.config.view.ConfigView, built or read back alike (so a cache hit behaves
    as a miss does); `view=False`: the DictConfig, for callers that vary it (hpc.sweep.points)."""
    templates = templates or layers.templates_root()
    sources = configcache.settle_sources(settle) if settle is not None else []
    user = userfile.read()  # the user's notify: (hpc.config.userfile), '' without one
    digest = _cache_key(schema, profile, overrides, saved, templates, extra, notes is not None, settle, sources, user)
    hit = configcache.get(digest, view)
    if hit is not None:
        if notes is not None:
            notes.extend(hit[1])
        return hit[0]
    said: List[str] = []
    cfg, plain, pure = _build(schema, pipeline, profile, overrides, saved, templates, extra,
                              said if notes is not None else None, settle, sources or [], user)
    kept = digest if pure and keep else None
    if view or kept:  # a DictConfig that is not kept needs no text
        text = to_yaml(cfg)
        configcache.put(kept, cfg, plain, text, said)
    if notes is not None:
        notes.extend(said)
    return configview.ConfigView(plain, yaml=text) if view else cfg


def _cache_key(schema: type, profile: Optional[str], overrides: Sequence[str], saved: Optional[Path],
               templates: Traversable, extra: Sequence[str], tells: bool,
               settle: Optional[Callable[[Any], bool]], sources: Optional[List[str]], user: str = "") -> Optional[str]:
    """hpc.config.cache's name for this load's result; None when an input cannot be read (the build
    then says why), or the settle hook's sources cannot be named."""
    try:
        texts = [(f"templates/{name}", (templates / name).read_text()) for name in extra] + [("user", user)]
        if saved is not None and saved.exists():
            texts.append((str(saved), saved.read_text()))
        if profile is not None:
            if not layers.PROFILE_NAME.fullmatch(profile):
                return None
            texts.append((f"profile {profile}", (templates / "profiles" / f"{profile}.yaml").read_text()))
    except (OSError, UnicodeDecodeError):
        return None
    if sources is None:  # a callable object, or a tree too large to hash
        return None
    hook = f"{settle.__module__}.{settle.__qualname__}" if settle is not None else ""
    try:
        return configcache.key(schema, [*texts, ("notes", str(tells)), ("settle", hook)], list(overrides), sources)
    except OSError:  # a source file went away: build, and keep nothing
        return None


def _build(schema: type, pipeline: str, profile: Optional[str], overrides: Sequence[str], saved: Optional[Path],
           templates: Traversable, extra: Sequence[str], notes: Optional[List[str]],
           settle: Optional[Callable[[Any], bool]] = None, sources: Sequence[str] = (), user: str = ""
           ) -> Tuple[DictConfig, Dict[str, Any], bool]:
    """The config, its plain data, and whether it may be kept (its settle hook read nothing but
    the config, and ran no code outside `sources`, the files the cache key hashed)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(schema)
    for name in extra:
        base = templates / name
        if not base.is_file():
            raise ConfigError(f"template {name} of pipeline {pipeline!r} not found in {templates}. "
                              "HINT: reinstall hpc (pip install .), or restore templates/" + name + ".")
        cfg = layers.merge(cfg, layers.read_yaml(base, f"templates/{name}"), f"templates/{name}")
    mine = userfile.layer(user)  # the user's notify: under the run's own (its saved config, profile, command line)
    if mine is not None and "notify" in cfg:
        cfg = layers.merge(cfg, *mine)
    if saved is not None and saved.exists():
        cfg = layers.merge(cfg, layers.read_yaml(saved, str(saved)), str(saved))
    if profile is not None:
        origin = f"templates/profiles/{profile}.yaml"
        tell = saved is not None and saved.exists() and notes is not None
        before = OmegaConf.create(to_dict(cfg)) if tell else None  # _merge changes cfg in place
        cfg = layers.merge(cfg, layers.for_stages(layers.read_yaml(layers.profile_path(profile, templates), origin), cfg), origin)
        if tell:
            notes.append(f"profile {profile} applied over the saved {saved}: "
                         f"{', '.join(layers.changes(before, cfg)) or 'nothing changed'}")
    cfg = layers.merge(cfg, layers.parse_overrides(overrides), "command line")
    pure = True
    if settle is not None:
        try:
            with configcache.outside(sources) as unhashed:
                pure = bool(settle(cfg))
            pure = pure and not unhashed
        except ConfigError:
            raise
        except Exception as err:  # OmegaConf's type check of a settled value
            raise ConfigError(f"the pipeline {pipeline!r} could not settle its config: {str(err).splitlines()[0]}. "
                              "HINT: check the values its settle hook reads.") from None
    check_resources(cfg)
    plain = to_dict(cfg)
    check_text(plain)
    same = (plain.get("resume") or {}).get("same_software", "warn")
    if same not in SAME_SOFTWARE:
        raise ConfigError(f"resume.same_software={same!r}; expected one of {list(SAME_SOFTWARE)}. HINT: "
                          "resume.same_software=require refuses a resume onto other software, warn shows it.")
    return cfg, plain, pure


def to_yaml(cfg: Any) -> str:
    """The YAML of a whole config (a DictConfig or the ConfigView load() returns)."""
    if isinstance(cfg, configview.ConfigView):
        return configview.to_yaml(cfg)
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(cfg, resolve=True)


def to_dict(node: Any) -> Any:
    """A config or a section of it as plain data (dicts, lists, scalars): a copy, resolved."""
    if isinstance(node, configview.ConfigView):
        return configview.to_dict(node)
    if isinstance(node, configview.ListView):
        return [to_dict(v) for v in node]
    from omegaconf import OmegaConf

    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return node
