"""Stop decisions carried out on the host (hpc.recovery.hostact): under hpc's srun wrapper a rank
calls no SLURM client; it writes its request, and the wrapper carries it out, while srun still runs.
The same on a real cluster, with the SLURM clients out of the tasks' reach: tests/slurm/test_container_exec.py."""
import json
import os
import subprocess
import sys
import time

from hpc import afterstep
from hpc.recovery import hostact, nodeaction
from hpc.recovery import preemption as pre


def test_the_wrapper_and_the_rank_use_one_name():
    assert afterstep.HOST_ACTS == hostact.ENV


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
    calls = []
    d = pre.handle_stop(pre.StopRequest("timeout", "SIGUSR2"), tmp_path / "h.json", job_id="5", max_timeouts=2,
                        runner=slurm_client(calls))
    assert calls == []  # no scontrol in the task: in a container there is none
    assert d.requeue and d.kind == "timeout"  # the table's answer, which the rank acts on (it exits for a requeue)
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
