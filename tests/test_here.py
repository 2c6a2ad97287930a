"""`--cluster here` without a cluster: the allocation read from scontrol's fields, a stage bigger
than the allocation refused before anything runs, a container stage's step command, and what the
ranks ask the host answered (tests/slurm/test_here.py runs it in an salloc).
pytest tests/test_here.py"""
import os
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

from hpc import submit
from hpc.config.checks import ConfigError
from hpc.here import alloc as herealloc
from hpc.here import backend, steps, stops
from hpc.pipeline import submission
from hpc.pipeline.plan import make_plan
from hpc.pipeline.request import Request
from hpc.recovery import deadline, hostact

ROOT = Path(__file__).resolve().parents[1]
# `scontrol -o show job` of `salloc -N 2 --ntasks-per-node=2 --gres=gpu:2` on the sandbox
INFO = {"JobId": "2142765", "NumNodes": "2", "NumCPUs": "4", "NumTasks": "4",
        "TRES": "cpu=4,node=2,billing=4,gres/gpu=4"}


@pytest.fixture(autouse=True)
def _root(monkeypatch):
    monkeypatch.chdir(ROOT)


def sandbox_plan(*overrides: str):
    pipe, cfg, run, _, _ = submission.build(Request("langsplat", overrides, profile="sandbox",
                                                    options={"levels": [1]}, run_dir="/tmp/never-written",
                                                    dry_run=True))
    return make_plan(pipe, cfg, str(run.path), "slurm")


def test_allocation_per_node_from_scontrol():
    alloc = herealloc.Allocation.from_info("2142765", INFO)
    assert alloc == herealloc.Allocation("2142765", nodes=2, cpus_per_node=2, gpus_per_node=2)


def test_sandbox_run_fits_the_salloc_of_the_docs():
    herealloc.check_fits(sandbox_plan().jobs, herealloc.Allocation.from_info("7", INFO))


@pytest.mark.parametrize("alloc, seen", [
    (herealloc.Allocation("7", nodes=1, cpus_per_node=8, gpus_per_node=4), "has 1 node(s) x 4 GPU(s)"),
    (herealloc.Allocation("7", nodes=2, cpus_per_node=8, gpus_per_node=1), "has 2 node(s) x 1 GPU(s)"),
    (herealloc.Allocation("7", nodes=2, cpus_per_node=1, gpus_per_node=4), "x 1 CPU(s) per node"),
])
def test_stage_bigger_than_the_allocation_is_refused_with_the_numbers(alloc, seen):
    with pytest.raises(ConfigError) as err:
        herealloc.check_fits(sandbox_plan().jobs, alloc)
    words = str(err.value)
    assert words.startswith("stage features asks for 2 node(s) x 2 GPU(s) x 2 CPU(s) per node; allocation 7 ")
    assert seen in words and "HINT: salloc -N 2 --gres=gpu:2 --ntasks-per-node=2" in words
    assert "\n" not in words


def test_refused_before_anything_runs(monkeypatch, tmp_path, capsys):
    # scontrol has no cluster to ask here: the allocation is given, everything else is the command's
    monkeypatch.setattr(backend, "current", lambda: herealloc.Allocation("7", nodes=1, cpus_per_node=8, gpus_per_node=4))
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


def test_each_step_asks_for_its_stage_s_numbers_and_none_of_the_allocation_s():
    """In the docs' allocation salloc exports SLURM_NTASKS=4 (and more), which srun takes as each step's
    options: rgb's 1 task ran as 4 ranks, or srun refused. Every number is on srun's command line, and
    the allocation's shape is not in the step's environment."""
    alloc = herealloc.Allocation.from_info("7", INFO)
    rgb, features = sandbox_plan().jobs
    assert herealloc.srun_argv(rgb, alloc, "/L/7.h1", "n")[2:7] == [
        "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--cpus-per-task=1", "--mem=0"]
    assert herealloc.srun_argv(features, alloc, "/L/7.h2", "n")[2:4] == ["--nodes=2", "--ntasks=4"]
    cpu = herealloc.srun_argv(sandbox_plan("stages.rgb.gpus_per_node=0").jobs[0], alloc, "/L/7.h1", "n")
    assert cpu[-1] == "--gres=gpu:0"  # else a step gets every GPU of the allocation
    shell = {"SLURM_JOB_ID": "7", "SLURM_CONF": "/etc/slurm.conf", "SLURM_NTASKS": "4", "SLURM_NPROCS": "4",
             "SLURM_NTASKS_PER_NODE": "2", "SLURM_GPUS_PER_NODE": "2", "SLURM_MEM_PER_NODE": "1000", "PATH": "/bin"}
    assert herealloc.step_env(shell) == {"SLURM_JOB_ID": "7", "SLURM_CONF": "/etc/slurm.conf", "PATH": "/bin"}


@pytest.mark.parametrize("box", [
    ["cluster.container.runtime=exec", "cluster.container.prefix=[env]", "cluster.container.env={FOO: bar}"],
    ["cluster.container.runtime=pyxis", "cluster.container.image=nvcr.io#nvidia/pytorch:24.05-py3"],
    ["cluster.container.runtime=apptainer", "cluster.container.image=docker://nvcr.io/nvidia/pytorch:24.05-py3"],
])
def test_a_stage_in_a_container_runs_its_steps_in_it_as_a_batch_job_does(box):
    """Each step's ranks get the batch srun line's container words (the carried hpc included), and its
    shell lines run on the host before srun, then cluster.setup, as in the batch script."""
    alloc = herealloc.Allocation.from_info("7", INFO)
    plan = backend.as_steps(sandbox_plan(*box), alloc)
    for job in plan.jobs:
        argv = steps.step_argv(job, alloc, "/L/7.h1", "/L/7.h1_task.pkl", ["module load cuda"])
        assert argv[:2] == ["bash", "-c"] and argv[3:5] == ["bash", "srun"]
        assert argv[2] == "export FOO=bar; " * any("env=" in b for b in box) + 'module load cuda; exec "$@"'
        srun = argv[4:]
        at = len(herealloc.srun_argv(job, alloc, "/L/7.h1", "hpc-x"))
        batch = shlex.split(next(line for line in job.sbatch_text().splitlines() if line.startswith("srun ")))
        inside = batch[batch.index("--kill-on-bad-exit=1") + 1:batch.index("submitit.core._submit") - 2]
        assert srun[at:] == [*inside, "-u", "-m", "hpc.here.rank", "/L/7.h1_task.pkl"]
        assert any("/carry/" in w for w in inside) and any(w.startswith(("--container-image", "apptainer", "env"))
                                                           for w in inside)
        assert shlex.join(steps.step_argv(job, alloc, "<logs>", "<task.pkl>")) in "\n".join(plan.notes)


def _step(tmp_path, proc=None) -> steps.Step:
    step = steps.Step(sandbox_plan().jobs[0], None, "7.h1", proc, host=hostact.request_path(str(tmp_path), "7.h1"))
    os.makedirs(os.path.dirname(step.host), exist_ok=True)
    return step


def test_what_the_ranks_ask_the_host_is_answered(tmp_path, monkeypatch):
    """The allocation's EndTime, for a `run` stage's stop deadline (scontrol is the driver's, never the
    rank's), and a stop request, answered with no requeue: a step is resumed by the same command."""
    monkeypatch.setattr(steps.scheduler, "job_info", lambda job: {"JobId": job, "EndTime": "2026-11-26T18:00:00"})
    step = _step(tmp_path)
    alloc = herealloc.Allocation("7", nodes=1, cpus_per_node=1, gpus_per_node=0)
    hostact.ask_end(step.host)
    hostact.ask(step.host, {"reason": "preempt"})
    steps.serve(step, alloc, "SIGINT")
    told = hostact.end_fields(step.host)
    assert told["JobId"] == "7" and told[deadline.UNIX_END] == deadline.end_time({"EndTime": "2026-11-26T18:00:00"})
    outcome = hostact.answer(step.host, wait_s=0)
    assert outcome["requeue"] is False and "stopped by Ctrl-C (--cluster here)" in outcome["why"]
    assert "HINT: run the same command again" in outcome["why"]


RUNNING = {"JobState": "RUNNING", "Reason": "None", "PreemptTime": "None", "EndTime": "2026-11-26T18:00:00"}


@pytest.mark.parametrize("reason, info, got, kind, words", [
    ("hang", RUNNING, "SIGINT", "hang", "a rank hung: the watchdog stopped the step"),
    # at an allocation's time limit SLURM signals the steps with the job COMPLETING, Reason=TimeLimit
    # (seen on the sandbox's Slurm 22.05), and salloc's command gets no signal
    ("preempt", {**RUNNING, "JobState": "COMPLETING", "Reason": "TimeLimit"}, "", "timeout",
     "allocation 7 reached its time limit (EndTime 2026-11-26T18:00:00). HINT: salloc a new allocation, with a "
     "longer -t"),
    ("preempt", {**RUNNING, "PreemptTime": "2026-11-26T17:00:00"}, "", "preempt", "allocation 7 was preempted"),
    ("preempt", {**RUNNING, "JobState": "CANCELLED"}, "SIGHUP", "cancelled", "allocation 7 was cancelled"),
    ("preempt", RUNNING, "SIGINT", "interrupted", "stopped by Ctrl-C (--cluster here)"),
    ("preempt", {}, "SIGTERM", "interrupted", "stopped: hpc.submit got SIGTERM"),
    ("preempt", {**RUNNING, "JobState": "COMPLETING", "Reason": "TimeLimit"}, "SIGHUP", "timeout", "time limit"),
    ("timeout", RUNNING, "", "interrupted", "stopped by a signal that hpc.submit did not send"),
])
def test_a_stop_is_told_what_stopped_it(tmp_path, monkeypatch, reason, info, got, kind, words):
    """Read from the request the rank wrote and from SLURM, in that order, then the command's own signal:
    a hang's verdict, the allocation's end, Ctrl-C, or a signal from elsewhere; never a requeue."""
    monkeypatch.setattr(steps.scheduler, "job_info", lambda job: dict(info))
    step = _step(tmp_path)
    hostact.ask(step.host, {"reason": reason, "job_id": "7", "restart": 0})
    steps.serve(step, herealloc.Allocation("7", nodes=1, cpus_per_node=1, gpus_per_node=0), got)
    outcome = hostact.answer(step.host, wait_s=0)
    assert outcome["requeue"] is False and outcome["kind"] == kind and words in outcome["why"], outcome
    assert outcome["why"].endswith("resume from this checkpoint")


def test_a_request_not_readable_yet_is_answered_at_a_later_look(tmp_path, monkeypatch):
    """A request listed but not yet readable (another node's write not visible here yet) is not taken
    for answered: the rank would wait for an answer that never comes."""
    monkeypatch.setattr(steps.scheduler, "job_info", lambda job: dict(RUNNING))
    step = _step(tmp_path)
    alloc = herealloc.Allocation("7", nodes=1, cpus_per_node=1, gpus_per_node=0)
    Path(step.host).write_text('{"reason": "ha')  # as a reader on another node may see it for a while
    steps.serve(step, alloc, "")
    assert hostact.answer(step.host, wait_s=0) is None and os.path.exists(step.host)
    hostact.ask(step.host, {"reason": "hang"})
    steps.serve(step, alloc, "")
    assert hostact.answer(step.host, wait_s=0)["kind"] == "hang"


def _session_sleeper() -> "subprocess.Popen[bytes]":
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def test_steps_do_not_outlive_an_error_of_the_driver(tmp_path):
    step = _step(tmp_path, _session_sleeper())
    with pytest.raises(OSError):
        with stops.Reaper([step]):
            raise OSError(28, "No space left on device")
    assert step.proc.wait(timeout=10) == -signal.SIGTERM


def test_sigterm_and_sighup_stop_gently_and_a_third_signal_kills(tmp_path):
    step = _step(tmp_path, subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60"], start_new_session=True))
    with stops.Interrupt() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.asked and not stop.forced
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.forced and stop.killed
        stop.act([step], herealloc.Allocation("7", nodes=1, cpus_per_node=1, gpus_per_node=0))
    assert step.proc.wait(timeout=10) == -signal.SIGKILL  # a step that ignores SIGTERM still ends
