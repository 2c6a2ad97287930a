"""The private names of submitit (and of cloudpickle, which submitit pickles with) that hpc relies on:
each still there, still called the way hpc calls it, and still doing what hpc expects of it.

    python -m pytest tests/test_submitit_contract.py -q

pyproject.toml pins submitit to the range these checks passed on (1.5.x; run here on the installed
version). Upgrading submitit past it: run this file first. A failure names what moved, where hpc
uses it, and the version it moved in. No SLURM needed: sbatch and srun are stand-ins on PATH.
"""
import inspect
import os
import signal
import stat
import sys
import types
from pathlib import Path

import cloudpickle
import pytest
import submitit
from submitit.core import core, job_environment, utils
from submitit.slurm import slurm

from hpc import submit as submit_cmd
from hpc.here import rank
from hpc.pipeline import launcher, plan, sbatch, submission

VERSION = f"submitit {submitit.__version__}, cloudpickle {cloudpickle.__version__}"


def moved(name: str, where: str, what: str) -> str:
    return (f"{VERSION}: {name} moved or changed ({what}); hpc uses it in {where}. HINT: adapt {where} to the "
            "new name, or keep submitit in the range pyproject.toml pins")


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """`sbatch` that records its script and answers as SLURM does, and an `srun` to be found."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {tmp_path}/script.sh\necho "Submitted batch job 4242"\n')
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def test_make_sbatch_string_takes_every_parameter_hpc_passes(tmp_path, monkeypatch):
    make = getattr(slurm, "_make_sbatch_string", None)
    assert callable(make), moved("submitit.slurm.slurm._make_sbatch_string", "hpc/pipeline/sbatch.py:render", "gone")
    monkeypatch.setitem(plan.PIPELINES, "tiny", "tests.tiny_pipeline")
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    req = submit_cmd.parse_args(["tiny", "--cluster", "slurm", "cluster.partitions=[low]", "tiny.parts=[0,1]",
                                 "--run-dir", str(tmp_path / "run"), "--dry-run"])
    pipe, cfg, run, kind, notes = submission.build(req)
    jobs = submission.plan_for(pipe, cfg, run, launcher.Submitit(kind), frozenset(), frozenset(), notes).jobs
    accepted = set(inspect.signature(make).parameters)
    for job in jobs:
        params = job.executor_parameters("afterok:1", ["echo setup"])
        assert set(params) <= accepted, moved("_make_sbatch_string", "hpc/pipeline/sbatch.py:slurm_parameters",
                                              f"no parameter {sorted(set(params) - accepted)}")
        text = sbatch.render(params, job.folder, len(job.items) if job.is_array else None)
        assert f"#SBATCH --job-name={job.stage}" in text and "echo setup" in text, moved(
            "_make_sbatch_string", "hpc/pipeline/sbatch.py:render", "its script lacks the job name or the setup")
        assert sbatch.submit_command(job.folder) in text, moved(
            "the task command", "hpc/pipeline/sbatch.py:submit_command", "the script runs another command")


def test_submit_command_submits_the_text_hpc_mirrors(stand_ins):
    folder = stand_ins / "logs" / "%A"
    folder.parent.mkdir()
    executor = submitit.SlurmExecutor(folder, 3, python="PYTHON")
    command = getattr(type(executor), "_submitit_command_str", None)
    assert isinstance(command, property), moved("SlurmExecutor._submitit_command_str",
                                                "hpc/pipeline/executor.py:submit_array", "no longer a property")
    assert executor._submitit_command_str == sbatch.submit_command(str(folder), "PYTHON"), moved(
        "SlurmExecutor._submitit_command_str", "hpc/pipeline/sbatch.py:submit_command", "another text")
    submit_command = getattr(executor, "_submit_command", None)
    assert submit_command and list(inspect.signature(submit_command).parameters) == ["command"], moved(
        "PicklingExecutor._submit_command", "hpc/pipeline/executor.py:submit_array", "gone or another signature")
    executor.update_parameters(job_name="contract", time=5)
    executor.parameters["map_count"] = 3  # an array's size, set as hpc sets it (the --array line)
    job = executor._submit_command(executor._submitit_command_str)
    assert isinstance(job, submitit.SlurmJob) and job.job_id == "4242" and job.num_tasks == 1, moved(
        "PicklingExecutor._submit_command", "hpc/pipeline/executor.py:submit_array", f"returned {job!r}")
    script = (stand_ins / "script.sh").read_text()
    assert "#SBATCH --array=0-2" in script and "PYTHON -u -m submitit.core._submit" in script, moved(
        "PicklingExecutor._submit_command", "hpc/pipeline/executor.py:submit_array", "another sbatch script")



def test_every_sbatch_goes_through_the_one_method_hpc_overrides(stand_ins):
    from hpc.pipeline import submitonce

    where = "hpc/pipeline/submitonce.py:SlurmExecutor._submit_command"
    for owner, name in ((submitit.SlurmExecutor, "_make_submission_file_text"), (submitit.SlurmExecutor, "_num_tasks"),
                        (submitit.SlurmExecutor, "_make_submission_command"), (utils.JobPaths, "move_temporary_file"),
                        (submitit.SlurmExecutor, "_get_job_id_from_submission_command"),
                        (utils.JobPaths, "get_first_id_independent_folder")):
        assert callable(getattr(owner, name, None)), moved(f"{owner.__name__}.{name}", where, "gone")
    executor = submitonce.SlurmExecutor(stand_ins / "logs" / "%j", 3, python="PYTHON")
    executor.update_parameters(job_name="contract", time=5, comment="mine")
    job = executor.submit(print, "hello")  # submitit's own path to sbatch: it must call _submit_command
    assert isinstance(job, submitit.SlurmJob) and job.job_id == "4242", moved(
        "PicklingExecutor._submit_command", where, f"returned {job!r}")
    script = (stand_ins / "script.sh").read_text()
    assert "#SBATCH --comment='mine hpc:" in script, moved(  # sbatch drops the quotes
        "PicklingExecutor._submit_command", where, "submit() no longer sends sbatch through it")
    assert job.paths.submission_file.exists() and job.paths.submitted_pickle.exists(), moved(
        "JobPaths.move_temporary_file", where, "the job's files are elsewhere")

class Checkpointable:
    """A task submitit checkpoints on the time-limit signal, as hpc's StageTask is."""

    def __call__(self) -> None:
        pass

    def checkpoint(self) -> utils.DelayedSubmission:
        return utils.DelayedSubmission(Checkpointable())


def test_the_requeue_hook_hpc_replaces_is_the_one_the_signal_handler_calls(tmp_path, monkeypatch):
    requeue = getattr(slurm.SlurmJobEnvironment, "_requeue", None)
    assert callable(requeue) and list(inspect.signature(requeue).parameters) == ["self", "countdown"], moved(
        "SlurmJobEnvironment._requeue", "hpc/recovery/hostact.py:requeue_on_host", "gone or another signature")
    for name, value in {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
                        "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1"}.items():
        monkeypatch.setenv(name, value)
    asked = []
    monkeypatch.setattr(slurm.SlurmJobEnvironment, "_requeue", lambda env, countdown: asked.append(countdown))
    delayed = utils.DelayedSubmission(Checkpointable())
    delayed.set_timeout(60, 3)
    paths = utils.JobPaths(tmp_path, job_id="4242")
    paths.folder.mkdir(parents=True, exist_ok=True)
    handler = job_environment.SignalHandler(slurm.SlurmJobEnvironment(), paths, delayed)
    with pytest.raises(SystemExit):
        handler.checkpoint_and_try_requeue(signal.SIGUSR2)
    assert asked == [3], moved("SlurmJobEnvironment._requeue", "hpc/recovery/hostact.py:requeue_on_host",
                               f"the time-limit handler no longer calls it (asked {asked})")


def test_the_file_names_and_formats_hpc_reads_and_writes(tmp_path):
    pattern = str(utils.JobPaths(tmp_path / "%A").submitted_pickle)
    assert "%j" in pattern, moved("JobPaths.submitted_pickle", "hpc/pipeline/executor.py:submit_array",
                                  f"no %j in {pattern}")
    paths = utils.JobPaths(tmp_path, job_id="7_1", task_id=0)
    assert str(paths.result_pickle) == rank.result_path(str(tmp_path / "7_1")), moved(
        "JobPaths.result_pickle", "hpc/here/rank.py:result_path", f"now {paths.result_pickle}")
    assert paths.result_pickle.parent == paths.folder
    rank.write_outcome(str(paths.result_pickle), ("success", {"merged": 3}))
    assert submitit.SlurmJob(tmp_path, "7_1").result() == {"merged": 3}, moved(
        "the result pickle", "hpc/here/rank.py:write_outcome", "submitit reads another format")
    delayed = utils.DelayedSubmission(Checkpointable())
    assert list(inspect.signature(delayed.set_timeout).parameters) == ["timeout_min", "max_num_timeout"], moved(
        "DelayedSubmission.set_timeout", "hpc/pipeline/executor.py:submit_array", "another signature")
    assert issubclass(utils.FailedJobError, RuntimeError), moved("submitit.core.utils.FailedJobError",
                                                                 "hpc/api.py:_from_scheduler", "gone")
    assert __import__("importlib").util.find_spec("submitit.core._submit"), moved(
        "python -m submitit.core._submit", "hpc/pipeline/sbatch.py:submit_command", "no such module")
    assert isinstance(core.Job, type)


def test_cloudpickles_by_value_registry(monkeypatch):
    registry = getattr(getattr(cloudpickle, "cloudpickle", None), "_PICKLE_BY_VALUE_MODULES", None)
    assert registry is not None, moved("cloudpickle.cloudpickle._PICKLE_BY_VALUE_MODULES",
                                       "hpc/pipeline/executor.py:_dumps", "gone")
    module = types.ModuleType("hpc_contract_probe")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    before = set(registry)  # a test of this process may have registered its workload module
    cloudpickle.register_pickle_by_value(module)
    try:
        assert module.__name__ in registry, moved("cloudpickle.cloudpickle._PICKLE_BY_VALUE_MODULES", "hpc/pipeline/executor.py:_dumps",
                               "register_pickle_by_value no longer fills it")
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    assert set(registry) == before
