"""Stop decisions carried out on the host (hpc.recovery.hostact): under hpc's srun wrapper a rank
calls no SLURM client; it writes its request, and the wrapper carries it out, while srun still runs.
The same on a real cluster, with the SLURM clients out of the tasks' reach: tests/slurm/test_container_exec.py."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from hpc import afterstep
from hpc.recovery import hostact, nodeaction
from hpc.recovery import preemption as pre
from hpc.scripts import runner


def test_the_wrapper_and_the_rank_use_one_name():
    assert afterstep.HOST_ACTS == hostact.ENV and afterstep.POLL_S == hostact.POLL_S
    request = afterstep.request_path("/r", {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "1"})
    assert request == os.path.join("/r", hostact.FOLDER, "5-1", hostact.REQUEST)  # a folder per attempt


def host(request, runner, stop):
    """The wrapper's side, in a thread: settles the request as hpc.afterstep does, with `runner` for SLURM."""
    def serve():
        while not stop.is_set() and nodeaction.settle_request(request, runner).startswith("no stop request"):
            time.sleep(0.05)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def slurm_client(calls, state="RUNNING"):
    """subprocess.run as SLURM's clients would answer it: `scontrol show job` shows `state`."""
    def run(cmd, **kw):
        calls.append(list(cmd))
        out = f"JobId=5 JobState={state} Reason=None PreemptTime=None Restarts=0" if cmd[1:3] == ["-o", "show"] else ""
        return subprocess.CompletedProcess(cmd, 0, out, "")
    return run


def test_under_the_wrapper_rank_0_decides_and_calls_no_slurm_client(tmp_path, monkeypatch):
    request = afterstep.request_path(str(tmp_path), {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "1"})
    monkeypatch.setenv(hostact.ENV, request)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setattr(hostact, "ANSWER_WAIT_S", 0.3)
    calls = []
    d = pre.handle_stop(pre.StopRequest("timeout", "SIGUSR2"), tmp_path / "h.json", job_id="5", max_timeouts=2,
                        runner=slurm_client(calls))
    assert calls == []  # no scontrol in the task: in a container there is none
    assert d.requeue and d.kind == "timeout"  # no host answered: the table's answer, which the rank acts on
    asked = json.loads(open(request).read())
    assert asked == {"reason": "timeout", "history": str(tmp_path / "h.json"), "job_id": "5", "restart": 1,
                     "max_timeouts": 2}
    assert not (tmp_path / "h.json").exists()  # the host records it, with SLURM's evidence

    # the host: reads SLURM, records, requeues; the request is settled once
    line = nodeaction.settle_request(request, slurm_client(calls))
    assert "requeue 1 of at most 2 for timeouts" in line and "(requeued)" in line
    assert ["scontrol", "requeue", "5"] in calls
    history = json.loads((tmp_path / "h.json").read_text())
    assert history["timeouts"] == 1 and history["events"][-1]["by"] == "hpc"
    assert not os.path.exists(request) and json.loads(open(request + ".done").read())["outcome"]["requeue"]


def test_the_host_applies_the_cap_that_slurm_and_the_history_give(tmp_path):
    """Over max_timeouts, nothing is requeued; a cancelled job is never requeued whatever the rank asked."""
    history = tmp_path / "h.json"
    history.write_text(json.dumps({"timeouts": 2, "preemptions": 0, "events": []}))
    for state, reason, why in (("RUNNING", "timeout", "more than max_timeouts=2"),
                               ("CANCELLED", "preempt", "cancelled")):
        request = str(tmp_path / f"{state}.json")
        hostact.ask(request, {"reason": reason, "history": str(history), "job_id": "5", "restart": 0,
                              "max_timeouts": 2})
        calls = []
        line = nodeaction.settle_request(request, slurm_client(calls, state))
        assert why in line and "(requeued)" not in line, line
        assert not any(c[:2] == ["scontrol", "requeue"] for c in calls)


def test_the_wrapper_carries_out_a_request_while_srun_still_runs(tmp_path):
    """A hung rank may never let srun end: the request is seen within a wait slice, not after."""
    request = tmp_path / "req.json"
    child = (f"import os, time; open({str(request)!r} + '.pid', 'w').write(str(os.getpid())); "
             f"os.rename({str(request)!r} + '.pid', os.environ[{hostact.ENV!r}]); time.sleep(60)")
    seen = {}

    def poll():
        if not request.exists():
            return False
        seen["at"] = time.monotonic()
        os.kill(int(request.read_text()), 15)  # what the host's scontrol requeue does to the steps
        return True

    started = time.monotonic()
    code = afterstep.supervise([sys.executable, "-c", child], lambda why: False, poll,
                               {**os.environ, hostact.ENV: str(request)})
    assert code == 128 + 15 and seen["at"] - started < 10


def test_a_request_that_cannot_be_carried_out_is_said_once(tmp_path, capsys):
    request = str(tmp_path / "req.json")
    hostact.ask(request, {"reason": "preempt"})  # no history, no job: settle cannot run
    assert afterstep.settle(request) is True
    assert "not carried out: KeyError" in capsys.readouterr().err
    assert not os.path.exists(request) and "error" in json.loads(open(request + ".done").read())["outcome"]


def test_the_rank_acts_on_what_the_host_did_not_on_its_prediction(tmp_path, monkeypatch):
    """SLURM refuses the requeue (--no-requeue, JobRequeue=0): the rank learns it from the host and does
    not exit as if requeued (a hang's other ranks would exit 0, and the step would hold its nodes)."""
    request = afterstep.request_path(str(tmp_path), {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "0"})
    monkeypatch.setenv(hostact.ENV, request)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    monkeypatch.setattr(hostact, "ANSWER_WAIT_S", 10.0)
    host_calls = []

    def refusing(cmd, **kw):
        if cmd[:2] == ["scontrol", "requeue"]:
            host_calls.append(list(cmd))
            return subprocess.CompletedProcess(cmd, 1, "", "scontrol: error: Requeue of JobId=5 not allowed")
        return slurm_client(host_calls)(cmd, **kw)

    stop = threading.Event()
    thread = host(request, refusing, stop)
    try:
        d = pre.handle_stop(pre.StopRequest("hang"), tmp_path / "h.json", job_id="5")
    finally:
        stop.set()
        thread.join()
    assert not d.requeue and "HINT: submit with --requeue" in d.why, d
    assert ["scontrol", "requeue", "5"] in host_calls
    with pytest.raises(pre.JobNotRequeued, match="not allowed"):  # so its process exits non-zero
        pre.exit_for(d)

    # a host that requeued: its own words, `by` and kind come back
    request = afterstep.request_path(str(tmp_path), {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "1"})
    monkeypatch.setenv(hostact.ENV, request)
    stop.clear()
    thread = host(request, slurm_client(host_calls, "PENDING"), stop)  # SLURM requeued it
    try:
        d = pre.handle_stop(pre.StopRequest("timeout", "SIGUSR2"), tmp_path / "h.json", job_id="5")
    finally:
        stop.set()
        thread.join()
    assert d.requeue and d.kind == "preempt" and d.by == "slurm", d  # SLURM's state, not the signal's guess


def test_the_wrapper_makes_the_folder_and_sees_a_request_that_comes_after_srun(tmp_path, monkeypatch):
    """The ranks' folder exists before srun starts; a request that reaches the host just after srun ended
    (a rank on another node, a shared disk's delay) is still carried out, not taken for none."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        "#!/bin/sh\n"
        'test -d "$(dirname "$HPC_HOST_ACTS")" || exit 7\n'
        '(sleep 1; echo \'{"reason": "preempt"}\' > "$HPC_HOST_ACTS.tmp"; mv "$HPC_HOST_ACTS.tmp" "$HPC_HOST_ACTS") &\n'
        "exit 0\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert afterstep.main([str(tmp_path / "run"), "--", "true"]) == 0
    done = tmp_path / "run" / hostact.FOLDER / "77-2" / (hostact.REQUEST + ".done")
    assert done.exists()  # seen and settled (here it cannot be carried out: no history, no SLURM)
    assert "error" in json.loads(done.read_text())["outcome"]


def test_a_run_stage_learns_its_deadline_from_the_host(tmp_path, monkeypatch):
    """A `run` stage in a container: rank 0 asks the host for the job's EndTime (no scontrol in the
    task) and keeps the script alive until shortly before it, not a fixed few seconds after the signal."""
    request = afterstep.request_path(str(tmp_path), {"SLURM_JOB_ID": "5"})
    os.makedirs(os.path.dirname(request))
    monkeypatch.setenv(hostact.ENV, request)
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no SLURM client in reach
    end = time.time() + 60
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end))
    asked = []  # who asked SLURM: only the host may (in a container the rank's scontrol answers nothing)
    monkeypatch.setattr(pre, "job_info", lambda job, *a, **kw: asked.append(job) or {"EndTime": text})
    flag = SimpleNamespace(received_at=time.time() - 20)  # the signal came 20 s ago: the fallback is past
    passed = runner._deadline_passed(flag)
    assert passed() and asked == []  # no answer yet: the fallback deadline holds; the rank asked no SLURM client
    assert os.path.exists(os.path.join(os.path.dirname(request), hostact.END_ASK))
    assert afterstep.serve(request) is False  # the host answers; a question is no stop request
    time.sleep(hostact.POLL_S)
    assert asked == ["5"] and not passed()  # the job ends in a minute: the script has until a few seconds before


def test_a_preemption_after_the_warning_moves_the_deadline_to_its_grace_time(tmp_path, monkeypatch):
    """The time-limit warning came first (EndTime a minute away), then a preemption: SLURM moves
    EndTime to PreemptTime + GraceTime. Rank 0 asks the host again, takes the new answer and not
    the earlier one, and decides before the grace time ends, not a few seconds before the limit."""
    request = afterstep.request_path(str(tmp_path), {"SLURM_JOB_ID": "5"})
    os.makedirs(os.path.dirname(request))
    monkeypatch.setenv(hostact.ENV, request)
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    ends = [time.time() + 60]
    monkeypatch.setattr(pre, "job_info", lambda job, *a, **kw: {
        "EndTime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ends[0]))})
    flag = SimpleNamespace(received_at=time.time() - 20)  # the warning
    passed = runner._deadline_passed(flag)
    assert passed()  # no answer yet: the fallback deadline, past
    afterstep.serve(request)
    time.sleep(hostact.POLL_S)
    assert not passed()  # the limit is a minute away

    flag.received_at, ends[0] = time.time(), time.time() + 3  # the preemption, with 3 s of grace
    assert not passed()  # asked again; the fallback is 5 s after the signal
    assert os.path.exists(os.path.join(os.path.dirname(request), hostact.END_ASK))
    afterstep.serve(request)
    until = flag.received_at + 4  # before the fallback: only the host's new answer brings it forward
    while not passed() and time.time() < until:
        time.sleep(0.05)
    assert time.time() < until, "the deadline stayed at the time limit's, or waited for the fallback"


def test_a_preemption_never_moves_the_deadline_past_the_time_limit_s(tmp_path, monkeypatch):
    """SLURM only moves EndTime earlier: while rank 0 waits for the host's answer after a preemption,
    the time limit's deadline, sooner than the fallback, still holds."""
    request = afterstep.request_path(str(tmp_path), {"SLURM_JOB_ID": "5"})
    os.makedirs(os.path.dirname(request))
    monkeypatch.setenv(hostact.ENV, request)
    end = time.time() + 9  # EndTime in whole seconds: the deadline 3 to 4 s from now
    monkeypatch.setattr(pre, "job_info", lambda job, *a, **kw: {
        "EndTime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end))})
    flag = SimpleNamespace(received_at=time.time() - 20)  # the warning
    passed = runner._deadline_passed(flag)
    passed()
    afterstep.serve(request)
    time.sleep(hostact.POLL_S)
    assert not passed()  # 5 s before the limit
    flag.received_at = time.time()  # the preemption; the host does not answer
    until = flag.received_at + 4  # the fallback would be 5 s after it
    while not passed() and time.time() < until:
        time.sleep(0.05)
    assert time.time() < until, "the preemption's fallback put the deadline past the time limit's"


def test_the_host_s_answer_names_the_question_it_answers(tmp_path):
    """An answer to an earlier question is no answer to a later one; a question asked while the host
    reads SLURM for the one before is neither removed nor answered with that earlier read."""
    request = str(tmp_path / hostact.REQUEST)
    assert hostact.take_end_ask(request) is None  # nothing asked
    hostact.ask_end(request, "1")
    token = hostact.take_end_ask(request)
    hostact.tell_end(request, {"EndTime": "2026-11-26T18:00:00"}, token)
    assert hostact.end_fields(request, "1")["EndTime"] == "2026-11-26T18:00:00"
    assert sorted(p.name for p in tmp_path.iterdir()) == [hostact.END]
    hostact.ask_end(request, "2")
    assert hostact.end_fields(request, "2") == {}  # the answer to "1" is still there
    token = hostact.take_end_ask(request)
    hostact.ask_end(request, "3")  # while the host reads SLURM for "2"
    hostact.tell_end(request, {"EndTime": "2026-11-26T19:00:00"}, token)
    assert hostact.end_fields(request, "2")["EndTime"] == "2026-11-26T19:00:00"
    assert hostact.end_fields(request, "3") == {}
    assert hostact.take_end_ask(request) == "3"  # still asked: the host answers it at its next look


def submitits_handler(tmp_path, monkeypatch):
    """submitit's own time-limit handler of a stage without a TrainLoop (hpc.pipeline.executor.StageTask),
    as it runs in rank 0 of job 5 under hpc's srun wrapper, at SLURM's shortest limit: its timeout counted."""
    from submitit.core import job_environment, utils
    from submitit.slurm import slurm

    from hpc.pipeline.executor import StageTask

    monkeypatch.setattr(slurm.SlurmJobEnvironment, "_requeue", slurm.SlurmJobEnvironment._requeue)  # restored after
    for name, value in (("SLURM_JOB_ID", "5"), ("SLURM_PROCID", "0"), ("SLURM_RESTART_COUNT", "0")):
        monkeypatch.setenv(name, value)
    request = afterstep.request_path(str(tmp_path), os.environ)
    os.makedirs(os.path.dirname(request))
    monkeypatch.setenv(hostact.ENV, request)
    monkeypatch.setattr(hostact, "ANSWER_WAIT_S", 20.0)
    hostact.requeue_on_host()  # what StageTask does first under the wrapper
    delayed = utils.DelayedSubmission(StageTask(str(tmp_path), "wait", "tests.container_pipeline:wait"))
    delayed.set_timeout(1, 1)
    paths = utils.JobPaths(tmp_path / "logs", job_id="5")
    paths.folder.mkdir(parents=True)
    return job_environment.SignalHandler(slurm.SlurmJobEnvironment(), paths, delayed), request


def late_host(request, runner, stop, after_s=0.5):
    """The wrapper's side, settling the request only `after_s` after it came (a busy host, a slow disk)."""
    def serve():
        while not stop.is_set() and not os.path.exists(request):
            time.sleep(0.02)
        time.sleep(after_s)
        nodeaction.settle_request(request, runner)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def refusing_slurm(calls):
    def run(cmd, **kw):
        if cmd[:2] == ["scontrol", "requeue"]:
            calls.append(list(cmd))
            return subprocess.CompletedProcess(cmd, 1, "", "scontrol: error: Requeue of JobId=5 not allowed")
        return slurm_client(calls)(cmd, **kw)
    return run


@pytest.mark.parametrize("requeued", [False, True])
def test_submitits_time_limit_handler_acts_on_what_the_host_did(tmp_path, monkeypatch, requeued):
    """Refused by SLURM (--no-requeue, JobRequeue=0), the job ends with the reason as its error, not as
    if requeued; requeued, it exits for the rerun only once the host has answered."""
    handler, request = submitits_handler(tmp_path, monkeypatch)
    calls, stop = [], threading.Event()
    thread = late_host(request, slurm_client(calls) if requeued else refusing_slurm(calls), stop)
    try:
        with pytest.raises(SystemExit if requeued else pre.JobNotRequeued) as caught:
            handler.checkpoint_and_try_requeue(signal.SIGUSR2)
        answered = os.path.exists(request + ".done")
    finally:
        stop.set()
        thread.join()
    assert answered  # it waited for the host's answer before acting
    assert ["scontrol", "requeue", "5"] in calls  # on the host; none in the task
    assert (tmp_path / "logs" / "5_submitted.pkl").exists()  # submitit's checkpoint of the task, for the rerun
    if not requeued:
        assert "not allowed" in str(caught.value) and "HINT: submit with --requeue" in str(caught.value)
