"""The Python API: submit a pipeline from a script or a notebook and get an object for its run.

    import hpc
    run = hpc.submit("langsplat", profile="sandbox", levels=[1], overrides=["stages.features.nodes=1"])
    run.wait(timeout=600)                       # the status rows once nothing is queued or running
    hpc.Run.attach(run.path).logs("features", 1, rank=0)

`python -m hpc.submit` is this module with its arguments parsed: both build one Request
(hpc.pipeline.request) and hand it to submit_request(), the only way into the engines
(hpc.pipeline.submission for a run, hpc.sweep.submission for a grid of runs). Errors are exceptions,
never SystemExit: ConfigError (a bad key or value), RunDirError (a run directory that cannot be
used) and SubmissionError (the scheduler refused; its own words in the message and in
`.scheduler_says`). A process that catches one goes on as before.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence, Union

from hpc.config.checks import CLUSTER_KINDS, ConfigError
from hpc.pipeline import options as hoptions
from hpc.pipeline.pipedef import PipelineDef, get_pipeline
from hpc.pipeline.request import Request, Submitted
from hpc.rundir import sweepdir
from hpc.rundir.run import RunDirError

if TYPE_CHECKING:
    from hpc.runs import Run, Sweep

__all__ = ["ConfigError", "RunDirError", "SubmissionError", "submit", "submit_request", "Run", "Sweep"]


def __getattr__(name: str) -> Any:
    """hpc.api.Run and hpc.api.Sweep, loaded on first use (hpc.runs)."""
    if name in ("Run", "Sweep"):
        from hpc import runs  # on first use: a submission from the command never loads it

        return getattr(runs, name)
    raise AttributeError(f"module 'hpc.api' has no attribute {name!r}")


class SubmissionError(RuntimeError):
    """The scheduler (sbatch, sinfo, scontrol) refused a submission: `scheduler_says` holds its words."""

    def __init__(self, message: str, scheduler_says: str = ""):
        super().__init__(message)
        self.scheduler_says = scheduler_says


# hpc.submit()'s keywords of the engine's own (Request's fields); the others are the pipeline's options
ENGINE = ("dry_run", "no_snapshot", "same_snapshot", "sweep", "sweep_file")


def submit(pipeline: Union[str, PipelineDef], overrides: Iterable[str] = (), profile: Optional[str] = None,
           cluster: Optional[str] = None, run_dir: Optional[Any] = None, wait: bool = False,
           timeout: Optional[float] = None, **keywords: Any) -> Union[Run, Sweep, None]:
    """Submit `pipeline` (a registered name, a module path, or a module-level PipelineDef such as
    hpc.define() builds) and return its Run (a Sweep with sweep=[...] or a sweep's run_dir; None for
    dry_run=True, which prints the plan). On SLURM it returns once the scheduler has the jobs; on the
    local executor (cluster="local", or "auto" where no SLURM answers) once every stage has run, one
    after another, since no scheduler holds the later ones; `wait`: once they ended (Run.wait).
    Further keywords: the engine's (dry_run, no_snapshot, same_snapshot, sweep, sweep_file) and the
    pipeline's own options, as python -m hpc.submit PIPELINE --help lists them
    (run: nodes, tasks_per_node, command, ...; langsplat: levels). A list-valued one takes a list,
    or one string read as the command line reads it: command="python train.py --lr 1e-3"."""
    if isinstance(overrides, str):
        raise ConfigError(f"overrides={overrides!r} is one string; expected a list of key=value strings. "
                          f"HINT: overrides=[{overrides!r}].")
    name = pipeline_name(pipeline)
    pipe = pipeline if isinstance(pipeline, PipelineDef) else get_pipeline(name)
    unknown = sorted(set(keywords) - set(ENGINE) - {opt.name for opt in pipe.options})
    if unknown:
        theirs = ", ".join(opt.name for opt in pipe.options) or "none"
        raise ConfigError(f"hpc.submit() got unknown argument(s) {unknown}; expected hpc.submit's own "
                          f"({', '.join(ENGINE)}) or the options of pipeline {pipe.name!r} ({theirs}). "
                          "HINT: config keys go in overrides=['key=value'].")
    sweep = keywords.pop("sweep", None)  # a string: its axes as the command line reads them
    engine = {k: keywords.pop(k) for k in ENGINE if k in keywords}
    req = Request(name, overrides=tuple(overrides), profile=profile, cluster=cluster,
                  run_dir=None if run_dir is None else str(run_dir), options=hoptions.read(pipe.options, keywords),
                  sweep=None if sweep is None else tuple(map(str, hoptions.words(sweep, "sweep="))), **engine)
    done = submit_request(req)
    if req.dry_run:
        return None
    from hpc.runs import Run, Sweep  # the object returned: python -m hpc.submit builds none, nor loads its modules

    if done.kind == "remote":  # the run lives on a named cluster: its Run is watched over ssh
        found = Run.attach(f"{cluster}:{done.path}")
    else:
        found = Sweep(done.path) if sweepdir.is_sweep(str(done.path)) else Run(done.path)
    if wait:
        found.wait(timeout=timeout)
    return found


def submit_request(req: Request) -> Submitted:
    """The one way into the submission engines, for the API and python -m hpc.submit alike."""
    if named_cluster(req.cluster):  # a cluster of clusters.yaml: pushed and submitted over ssh
        from hpc.remote import submission as remote  # ssh and the push: only for a named cluster

        return remote.start(req)
    try:
        if req.sweep is not None or req.sweep_file or sweepdir.is_sweep(req.run_dir):
            from hpc.sweep import submission as sweeps  # a grid of runs; here, not above: yaml stays off a run's path

            return sweeps.start(req)
        from hpc.pipeline import submission  # the engine: loaded only once a request exists

        return submission.start(req, BACKENDS)
    except RuntimeError as err:
        if not _from_scheduler(err):  # a snapshot, run-dir or config error says its own fix
            raise
        words = str(err).strip()
        raise SubmissionError(f"the scheduler refused the submission of {req.pipeline}: "
                              f"{words.splitlines()[-1] if words else type(err).__name__}. HINT: change what it "
                              "names (stages.<stage>.*, --profile); --dry-run shows each sbatch script.",
                              words) from err


def named_cluster(kind: Optional[str]) -> bool:
    """Whether a --cluster value names a cluster of clusters.yaml rather than one of hpc's kinds
    (hpc.remote.clusters.is_named), told without loading hpc.remote: a local submission never does."""
    return bool(kind) and kind not in CLUSTER_KINDS


def _here(kind: str, setup: Sequence[str]) -> Any:
    """`--cluster here`'s backend of the launch path: srun steps of this shell's allocation."""
    from hpc.here.backend import Here  # here, not above: only --cluster here loads it

    return Here(kind, setup)


# The executor kinds whose jobs submitit does not start: the engine is given their backends.
BACKENDS = {"here": _here}


def _from_scheduler(err: BaseException) -> bool:
    """Whether `err` is a scheduler client's refusal: submitit's FailedJobError (sbatch's stderr) or
    hpc's SlurmExit (sinfo, scontrol, sbatch called by hpc)."""
    from hpc.slurm.cli import SlurmExit  # here, not above: only a failed submission needs it

    utils = sys.modules.get("submitit.core.utils")  # loaded by then if submitit raised it
    return isinstance(err, SlurmExit) or (utils is not None and isinstance(err, utils.FailedJobError))


def pipeline_name(pipeline: Union[str, PipelineDef]) -> str:
    """How the engine (and a job resubmitting its run) finds `pipeline`: a PipelineDef by the module
    attribute that holds it, 'module:ATTR'."""
    if isinstance(pipeline, str):
        return pipeline
    if not isinstance(pipeline, PipelineDef):
        raise ConfigError(f"pipeline {pipeline!r} is a {type(pipeline).__name__}; expected a name, a module path "
                          "or a hpc.pipeline.PipelineDef. HINT: hpc.define(...) builds one.")

    # its schema's module first (hpc.define puts the user's there), then every module loaded
    first = [getattr(pipeline.schema, "__module__", ""), getattr(pipeline.stages, "__module__", "")]
    for module_name in dict.fromkeys([*first, *list(sys.modules)]):
        module = sys.modules.get(module_name)
        if module is None or module_name == "__main__" or module_name.split(".")[0] == "hpc":
            continue
        attr = next((k for k, v in list(vars(module).items()) if v is pipeline), None)
        if attr is not None:
            return f"{module_name}:{attr}"
    raise ConfigError(f"pipeline {pipeline.name!r} is not an attribute of an importable module; expected "
                      "one its jobs can import again. HINT: assign it at the top of a module "
                      "(PIPE = hpc.define(...)) and run from the directory that module is imported from.")
