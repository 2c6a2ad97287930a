"""Unit tests for hpc.recovery.preemption, hpc.recovery.stopsignal and hpc.recovery.verdict: signal flags, the
stop vote and the requeue decision table."""

import json
import os
import signal
import subprocess
import time

import pytest
import torch

from hpc.recovery import preemption as pre
from hpc.recovery import verdict
from hpc.recovery.stopsignal import StopFlag, StopVote

RUNNING = {"JobState": "RUNNING", "Reason": "None", "PreemptTime": "None", "Restarts": "0"}


@pytest.mark.parametrize("info, signal_kind, expected", [
    (RUNNING, "timeout", ("timeout", False)),      # --signal=USR2@N: SLURM still says RUNNING
    (RUNNING, "preempt", ("preempt", False)),      # SIGTERM, SLURM not updated: trust the signal
    ({**RUNNING, "PreemptTime": "2026-11-22T02:55:43"}, "timeout", ("preempt", False)),  # GraceTime
    ({**RUNNING, "JobState": "COMPLETING", "Restarts": "1"}, "preempt", ("preempt", True)),
    ({**RUNNING, "JobState": "PENDING", "Reason": "BeginTime"}, "preempt", ("preempt", True)),
    ({**RUNNING, "JobState": "COMPLETING"}, "preempt", ("cancelled", False)),  # scancel's SIGTERM
    ({**RUNNING, "JobState": "COMPLETING", "Reason": "TimeLimit"}, "preempt", ("timeout", False)),
    ({**RUNNING, "JobState": "CANCELLED"}, "preempt", ("cancelled", False)),
    ({**RUNNING, "JobState": "TIMEOUT"}, "preempt", ("timeout", False)),
    ({**RUNNING, "JobState": "COMPLETED"}, "timeout", ("finished", False)),
])
def test_classify_reads_slurm_before_the_signal(info, signal_kind, expected):
    assert verdict.classify(info, signal_kind, restart_count=0) == expected


def test_decide_table():
    assert verdict.decide("preempt", "RUNNING", timeouts_done=99, max_timeouts=0).requeue
    assert verdict.decide("timeout", "RUNNING", 1, 2).requeue
    no = verdict.decide("timeout", "RUNNING", 2, 2)
    assert not no.requeue and "max_timeouts=2" in no.why and "HINT" in no.why
    assert not verdict.decide("finished", "COMPLETED", 0, 3).requeue
    assert not verdict.decide("cancelled", "CANCELLED", 0, 3).requeue


def test_handlers_only_set_a_flag_and_preemption_wins():
    before = signal.getsignal(signal.SIGUSR2), signal.getsignal(signal.SIGTERM)
    with StopFlag("USR2") as flag:
        assert flag.local() is None
        assert StopVote(flag).poll() is None
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.local() == pre.StopRequest("timeout", "SIGUSR2")
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.local().reason == "preempt"
        os.kill(os.getpid(), signal.SIGUSR2)  # a later timeout does not downgrade it
        assert flag.local().reason == "preempt"
        assert StopVote(flag).poll().reason == "preempt"  # no process group: the local flag, now
    assert (signal.getsignal(signal.SIGUSR2), signal.getsignal(signal.SIGTERM)) == before


def test_bad_timeout_signal_names_say_how_to_fix():
    with pytest.raises(ValueError, match="HINT"):
        pre.StopFlag("NOPE")
    with pytest.raises(ValueError, match="HINT"):
        pre.StopFlag("TERM")


def test_flags_nest_and_each_exit_restores_what_was_there():
    before = signal.getsignal(signal.SIGUSR2)
    with StopFlag() as outer:
        with pytest.raises(ValueError, match="HINT"):
            StopFlag("NOPE")  # a bad name fails before any handler changes
        assert signal.getsignal(signal.SIGUSR2) == outer._handle
        with StopFlag() as inner:
            inner.install()  # installing twice still restores the outer flag's handler
            os.kill(os.getpid(), signal.SIGUSR2)
        assert (inner.reason, outer.reason) == ("timeout", None)
        assert signal.getsignal(signal.SIGUSR2) == outer._handle
    assert signal.getsignal(signal.SIGUSR2) is before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (NCCL)")
def test_vote_on_cuda_never_waits_for_the_step_just_queued(tmp_path):
    """A poll reads the previous vote behind an event; .item() would wait for the queued kernel."""
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        with StopFlag() as flag:
            vote = StopVote(flag, device=torch.device("cuda", 0))
            vote.poll()
            torch.cuda.synchronize()
            torch.cuda._sleep(2_000_000_000)  # about a second of GPU time, queued
            t0 = time.perf_counter()
            os.kill(os.getpid(), signal.SIGUSR2)
            assert vote.poll() is None  # the vote launched before the signal
            elapsed = time.perf_counter() - t0
            torch.cuda.synchronize()
            assert elapsed < 0.5 * (time.perf_counter() - t0)
            assert vote.poll().reason == "timeout"
            vote.close()
    finally:
        dist.destroy_process_group()


def test_exit_for():
    with pytest.raises(SystemExit):
        pre.exit_for(verdict.Decision(True, "hpc", "preempted", "preempt"))
    with pytest.raises(pre.JobNotRequeued, match="timed out"):
        pre.exit_for(verdict.Decision(False, None, "timed out 3 times", "timeout"))


def test_handle_stop_outside_slurm_does_not_requeue(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    d = pre.handle_stop(pre.StopRequest("timeout", "SIGUSR2"), tmp_path / "h.json")
    assert not d.requeue and "not running under SLURM" in d.why


def test_history_counts_timeouts(tmp_path):
    path = tmp_path / "requeue.json"
    hist = pre.load_history(path)
    pre.record(path, hist, verdict.decide("timeout", "RUNNING", 0, 3), {"JobState": "RUNNING"})
    pre.record(path, pre.load_history(path), verdict.decide("preempt", "RUNNING", 1, 3), {})
    saved = json.loads(path.read_text())
    assert (saved["timeouts"], saved["preemptions"], len(saved["events"])) == (1, 1, 2)


def test_job_info_asks_again_when_scontrol_dies_while_the_step_ends():
    calls = []

    def runner(argv, **kw):
        calls.append(argv)
        killed = len(calls) == 1
        return subprocess.CompletedProcess(argv, -15 if killed else 0, "" if killed else
                                           "JobId=5 JobState=COMPLETING Reason=TimeLimit", "")

    assert pre.job_info("5", runner) == {"JobId": "5", "JobState": "COMPLETING", "Reason": "TimeLimit"}
    assert len(calls) == 2


def test_job_info_is_empty_at_once_when_scontrol_cannot_run():
    calls = []

    def runner(argv, **kw):
        calls.append(argv)
        raise FileNotFoundError("scontrol")

    assert pre.job_info("5", runner) == {} and len(calls) == 1


def test_a_failed_requeue_is_no_requeue_with_slurms_words_and_a_hint(tmp_path):
    def runner(argv, **kw):
        if argv[1] == "requeue":
            return subprocess.CompletedProcess(argv, 1, "",
                                               "scontrol: error: Requested operation is presently disabled\n")
        return subprocess.CompletedProcess(argv, 0, "JobId=5 JobState=RUNNING PreemptTime=2026-11-22T02:55:43", "")

    d = pre.handle_stop(pre.StopRequest("preempt", "SIGTERM"), tmp_path / "h.json", job_id="5", runner=runner)
    assert not d.requeue and d.why.startswith("scontrol requeue exited 1: scontrol: error: Requested operation")
    assert d.why.count("HINT:") == 1 and d.why.endswith("check JobRequeue in slurm.conf")


def fake_scontrol(asked: list, requeue_exit, shown):
    """A runner standing in for scontrol for job 5: `requeue_exit(n)` is the exit status of the n-th
    `requeue`, `shown()` the fields `show job` prints; each call's subcommand is appended to `asked`."""
    def runner(argv, **kw):
        asked.append(argv[1])
        if argv[1] == "requeue":
            return subprocess.CompletedProcess(argv, requeue_exit(asked.count("requeue")), "", "")
        return subprocess.CompletedProcess(argv, 0, f"JobId=5 {shown()}", "")
    return runner


def test_a_requeue_whose_scontrol_died_of_the_requeue_itself_counts_when_slurm_shows_it(tmp_path):
    """The requeue signals every process of the job's steps, the scontrol that asked for it too."""
    asked = []
    runner = fake_scontrol(asked, lambda n: -15, lambda: "JobState=RUNNING Restarts=0" if "requeue" not in asked
                           else "JobState=REQUEUED Restarts=1")
    d = pre.handle_stop(pre.StopRequest("hang"), tmp_path / "h.json", job_id="5", runner=runner)
    assert d.requeue and d.kind == "hang" and asked[1:3] == ["requeue", "-o"], (d, asked)  # asked again


AT_TIME_LIMIT = "JobState=COMPLETING Reason=TimeLimit Restarts=0"


def test_a_requeue_whose_scontrol_died_before_slurm_took_it_is_asked_again(tmp_path):
    """At the time limit slurmd may signal the step's processes more than once: an scontrol killed
    before SLURM took the request is run again, and the job is requeued."""
    asked = []
    runner = fake_scontrol(asked, lambda n: -15 if n == 1 else 0, lambda: AT_TIME_LIMIT)
    d = pre.handle_stop(pre.StopRequest("timeout", "SIGTERM"), tmp_path / "h.json", job_id="5", runner=runner)
    assert d.requeue and d.kind == "timeout" and asked.count("requeue") == 2, (d, asked)


def test_a_requeue_that_keeps_dying_is_no_requeue_after_its_tries(tmp_path):
    asked = []
    runner = fake_scontrol(asked, lambda n: -9, lambda: AT_TIME_LIMIT)
    d = pre.handle_stop(pre.StopRequest("timeout", "SIGTERM"), tmp_path / "h.json", job_id="5", runner=runner)
    assert not d.requeue and asked.count("requeue") == pre.REQUEUE_TRIES
    assert d.why.startswith("scontrol requeue exited -9") and d.why.count("HINT:") == 1


def test_a_shielded_client_outlives_a_stop_signal_and_the_caller_still_gets_it():
    """The client inherits the blocked stop signals: a SIGTERM sent to it (as slurmd sends one to
    every process of the step) does not end it. One sent to the caller meanwhile reaches its
    handler once the call returns."""
    import signal
    import sys

    seen = []
    before = signal.signal(signal.SIGTERM, lambda *a: seen.append("TERM"))
    try:
        child = ("import os, signal; os.kill(os.getpid(), signal.SIGTERM); "
                 "os.kill(os.getppid(), signal.SIGTERM); print('alive')")
        out = pre.shielded(subprocess.run)([sys.executable, "-c", child], capture_output=True, text=True)
        assert (out.returncode, out.stdout.strip()) == (0, "alive")
        assert seen == ["TERM"]  # delivered after the call, not lost
        bare = subprocess.run([sys.executable, "-c", child.replace("os.kill(os.getppid(), signal.SIGTERM); ", "")],
                              capture_output=True, text=True)
        assert bare.returncode == -signal.SIGTERM  # the same client, unshielded, dies of it
    finally:
        signal.signal(signal.SIGTERM, before)


def test_only_the_scheduler_adapter_runs_scontrol():
    """The scheduler adapter (the hpc.slurm package: scheduler, cli, jobcontrol, siteconfig) holds every scontrol
    call and its parsers; the local cluster's own controls (hpc.cluster.local pings the daemons it
    runs, hpc.cluster.nodestate sets its nodes down and back) are the exception."""
    import ast
    from pathlib import Path

    root = Path(pre.__file__).parents[1]  # hpc/
    allowed = {*(root / "slurm").glob("*.py"), root / "cluster" / "local.py", root / "cluster" / "nodestate.py"}
    runs = [f"{path.relative_to(root)}:{node.lineno}" for path in sorted(root.rglob("*.py")) if path not in allowed
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant)
            and node.elts[0].value == "scontrol"]
    assert runs == []


def test_a_requeue_while_the_controller_restarts_is_asked_again_past_a_few_seconds(tmp_path, monkeypatch):
    """A slurmctld restart: `scontrol show job` gives no answer, so no EndTime (GraceTime) is known. The
    requeue is still asked again for half of what the rank waits for the host's answer
    (hostact.ANSWER_WAIT_S), not a few seconds: a controller back after four failed tries (whose
    pauses add up to 7.5 s at least) takes it, and the job keeps its place in the queue."""
    slept = []  # the pauses pass on a clock of their own, at once
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.setattr(time, "monotonic", lambda: sum(slept))
    down = "scontrol: error: Unable to contact slurm controller (connect failure)\n"
    asked = []

    def runner(argv, **kw):
        asked.append(argv[1])
        if argv[1] == "-o" or asked.count("requeue") <= 4:
            return subprocess.CompletedProcess(argv, 1, "", down)
        return subprocess.CompletedProcess(argv, 0, "", "")

    d = pre.handle_stop(pre.StopRequest("preempt", "SIGTERM"), tmp_path / "h.json", job_id="5", runner=runner)
    assert d.requeue and asked.count("requeue") == 5, (d, asked)
    assert sum(slept) < 30
