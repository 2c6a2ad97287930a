"""`--cluster here` without a cluster: the allocation read from scontrol's fields, and a stage bigger
than the allocation refused before anything runs (tests/slurm/test_here.py runs it in an salloc).
pytest tests/test_here.py"""
import os
import signal
import subprocess
from pathlib import Path

import pytest

from hpc import submit
from hpc.config.checks import ConfigError
from hpc.pipeline import here, submission
from hpc.pipeline.plan import make_plan
from hpc.pipeline.request import Request

ROOT = Path(__file__).resolve().parents[1]
# `scontrol -o show job` of `salloc -N 2 --ntasks-per-node=2 --gres=gpu:2` on the sandbox
INFO = {"JobId": "2142765", "NumNodes": "2", "NumCPUs": "4", "NumTasks": "4",
        "TRES": "cpu=4,node=2,billing=4,gres/gpu=4"}


@pytest.fixture(autouse=True)
def _root(monkeypatch):
    monkeypatch.chdir(ROOT)


def sandbox_plan(*overrides: str):
    pipe, cfg, run, _, _ = submission.build(Request("langsplat", overrides, profile="sandbox", levels=(1,),
                                                    run_dir="/tmp/never-written", dry_run=True))
    return make_plan(pipe, cfg, str(run.path), "slurm")


def test_allocation_per_node_from_scontrol():
    alloc = here.Allocation.from_info("2142765", INFO)
    assert alloc == here.Allocation("2142765", nodes=2, cpus_per_node=2, gpus_per_node=2)


def test_sandbox_run_fits_the_salloc_of_the_docs():
    here.check_fits(sandbox_plan().jobs, here.Allocation.from_info("7", INFO))


@pytest.mark.parametrize("alloc, seen", [
    (here.Allocation("7", nodes=1, cpus_per_node=8, gpus_per_node=4), "has 1 node(s) x 4 GPU(s)"),
    (here.Allocation("7", nodes=2, cpus_per_node=8, gpus_per_node=1), "has 2 node(s) x 1 GPU(s)"),
    (here.Allocation("7", nodes=2, cpus_per_node=1, gpus_per_node=4), "x 1 CPU(s) per node"),
])
def test_stage_bigger_than_the_allocation_is_refused_with_the_numbers(alloc, seen):
    with pytest.raises(ConfigError) as err:
        here.check_fits(sandbox_plan().jobs, alloc)
    words = str(err.value)
    assert words.startswith("stage features asks for 2 node(s) x 2 GPU(s) x 2 CPU(s) per node; allocation 7 ")
    assert seen in words and "HINT: salloc -N 2 --gres=gpu:2 --ntasks-per-node=2" in words
    assert "\n" not in words


def test_refused_before_anything_runs(monkeypatch, tmp_path, capsys):
    # scontrol has no cluster to ask here: the allocation is given, everything else is the command's
    monkeypatch.setattr(here, "current", lambda: here.Allocation("7", nodes=1, cpus_per_node=8, gpus_per_node=4))
    code = submit.main(["langsplat", "--profile", "sandbox", "--levels", "1", "--cluster", "here",
                        "--run-dir", str(tmp_path / "run")])
    assert code == 2
    assert "error: stage features asks for 2 node(s)" in capsys.readouterr().err
    assert not (tmp_path / "run" / "manifest.json").exists() and not (tmp_path / "run" / "code").exists()


def test_outside_an_allocation_says_salloc(monkeypatch, capsys):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert submit.main(["langsplat", "--profile", "sandbox", "--cluster", "here", "--dry-run"]) == 2
    assert "SLURM_JOB_ID is not set. HINT: salloc" in capsys.readouterr().err


def test_a_sweep_is_refused(tmp_path, capsys):
    assert submit.main(["langsplat", "--profile", "sandbox", "--cluster", "here", "--run-dir", str(tmp_path / "s"),
                        "--sweep", "langsplat.trainer.threads=1,2"]) == 2
    assert "a sweep does not run with --cluster here" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_a_stage_in_a_container_is_refused_not_run_on_the_host():
    jobs = sandbox_plan("cluster.container.runtime=exec", "cluster.container.prefix=[env]").jobs
    with pytest.raises(ConfigError, match=r"^stage rgb runs in a container \(exec\), and --cluster here .*HINT: "):
        here.check_fits(jobs, here.Allocation.from_info("7", INFO))


def _session_sleeper() -> "subprocess.Popen[bytes]":
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def test_steps_do_not_outlive_an_error_of_the_driver():
    step = here.Step(None, None, "7.h1", _session_sleeper())
    with pytest.raises(OSError):
        with here._Reaper([step]):
            raise OSError(28, "No space left on device")
    assert step.proc.wait(timeout=10) == -signal.SIGTERM


def test_sigterm_and_sighup_stop_gently_and_a_third_signal_kills():
    step = here.Step(None, None, "7.h1", subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60"],
                                                          start_new_session=True))
    with here._Interrupt() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.asked and not stop.forced
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.forced and stop.killed
        stop.act([step], here.Allocation("7", nodes=1, cpus_per_node=1, gpus_per_node=0))
    assert step.proc.wait(timeout=10) == -signal.SIGKILL  # a step that ignores SIGTERM still ends
