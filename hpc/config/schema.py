"""The sections every pipeline's config has, as documented dataclasses (one comment per field).

    from hpc.config.schema import PipelineConfig, Resources   # a pipeline's schema subclasses PipelineConfig

OmegaConf checks a config against them: hpc.config.loader.load builds one from a schema and the
pipeline's layers. Their values are refused before submission by hpc.config.checks. load, to_yaml and
to_dict, and the checks' names, are importable from here too, where pipelines and tests have them.
No torch here: dry-run and status stay fast.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

from hpc.config import defaults
from hpc.config.checks import CLUSTER_KINDS, LIMITS, ConfigError, check_resources, check_text, has_control  # noqa: F401
from hpc.config.loader import SAME_SOFTWARE, load, to_dict, to_yaml  # noqa: F401 (re-exported)

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
