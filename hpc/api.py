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

import dataclasses
import sys
from typing import Any, Iterable, Optional, Union

from hpc.config.checks import ConfigError
from hpc.pipeline.plan import PipelineDef
from hpc.pipeline.request import Request, Submitted
from hpc.rundir import sweepdir
from hpc.rundir.run import RunDirError
from hpc.runs import Run, Sweep

__all__ = ["ConfigError", "RunDirError", "SubmissionError", "submit", "submit_request", "Run", "Sweep"]


class SubmissionError(RuntimeError):
    """The scheduler (sbatch, sinfo, scontrol) refused a submission: `scheduler_says` holds its words."""

    def __init__(self, message: str, scheduler_says: str = ""):
        super().__init__(message)
        self.scheduler_says = scheduler_says


def submit(pipeline: Union[str, PipelineDef], overrides: Iterable[str] = (), profile: Optional[str] = None,
           cluster: Optional[str] = None, run_dir: Optional[Any] = None, levels: Optional[Iterable[int]] = None,
           wait: bool = False, timeout: Optional[float] = None, **request: Any) -> Union[Run, Sweep, None]:
    """Submit `pipeline` (a registered name, a module path, or a module-level PipelineDef such as
    hpc.define() builds) and return its Run (a Sweep with sweep=[...] or a sweep's run_dir; None for
    dry_run=True, which prints the plan). Returns once the scheduler has the jobs; `wait`: once they
    ended (Run.wait). Further keywords are Request's fields (nodes, tasks_per_node, command, sweep,
    no_snapshot, ...), the options of python -m hpc.submit."""
    unknown = sorted(set(request) - {f.name for f in dataclasses.fields(Request)})
    if unknown:
        raise ConfigError(f"hpc.submit() got unknown argument(s) {unknown}; expected the options of "
                          "hpc.pipeline.request.Request. HINT: config keys go in overrides=['key=value'].")
    if isinstance(overrides, str):
        raise ConfigError(f"overrides={overrides!r} is one string; expected a list of key=value strings. "
                          f"HINT: overrides=[{overrides!r}].")
    for key in ("sweep", "command", "resume_args"):  # tuples in the Request, lists are welcome here
        if request.get(key) is not None:
            request[key] = tuple(request[key])
    req = Request(pipeline_name(pipeline), overrides=tuple(overrides), profile=profile, cluster=cluster,
                  run_dir=None if run_dir is None else str(run_dir),
                  levels=tuple(levels) if levels is not None else None, **request)
    done = submit_request(req)
    if req.dry_run:
        return None
    found = Sweep(done.path) if sweepdir.is_sweep(str(done.path)) else Run(done.path)
    if wait:
        found.wait(timeout=timeout)
    return found


def submit_request(req: Request) -> Submitted:
    """The one way into the submission engines, for the API and python -m hpc.submit alike."""
    if req.sweep is not None or req.sweep_file or sweepdir.is_sweep(req.run_dir):
        from hpc.sweep import submission  # a grid of runs; here, not above: yaml stays off a run's path
    else:
        from hpc.pipeline import submission  # the engine: loaded only once a request exists
    try:
        return submission.start(req)
    except RuntimeError as err:
        if not _from_scheduler(err):  # a snapshot, run-dir or config error says its own fix
            raise
        words = str(err).strip()
        raise SubmissionError(f"the scheduler refused the submission of {req.pipeline}: "
                              f"{words.splitlines()[-1] if words else type(err).__name__}. HINT: change what it "
                              "names (stages.<stage>.*, --profile); --dry-run shows each sbatch script.",
                              words) from err


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
