"""hpc's srun wrapper (python -m hpc.afterstep) and a rank's stop request it cannot read at first.

    python -m pytest tests/test_afterstep.py

A request the wrapper lists but cannot read yet (a rank on another node whose write this node does not
see whole yet) is looked at again, not taken for settled: the rank waits for the answer to it.
"""
import json
import os
import sys

import pytest

from hpc import afterstep

# a rank's request as a reader on another node may see it for a while: listed, but half-written; then whole
RANK = """import os, time
path = os.environ["HPC_HOST_ACTS"]
open(path, "w").write('{"reas')
time.sleep(2.5)
open(path + ".tmp", "w").write('{"reason": "preempt"}')
os.replace(path + ".tmp", path)
time.sleep(1.5)
"""


def test_a_request_not_readable_at_first_is_settled_at_a_later_look(tmp_path):
    request = afterstep.request_path(str(tmp_path / "run"), {"SLURM_JOB_ID": "78"})
    os.makedirs(os.path.dirname(request))
    code = afterstep.supervise([sys.executable, "-c", RANK], lambda why: False, lambda: afterstep.serve(request),
                               {**os.environ, afterstep.HOST_ACTS: request})
    assert code == 0
    assert os.path.exists(request + ".done"), sorted(os.listdir(os.path.dirname(request)))
    # settled (here it cannot be carried out: no history, no SLURM), and the rank is told so
    assert "error" in json.loads(open(request + ".done").read())["outcome"] and not os.path.exists(request)


def test_the_wrappers_retry_deadline_is_the_one_slurm_calls_read():
    from hpc.slurm import retry

    assert afterstep.RETRY_ENV == retry.DEADLINE_ENV


def test_the_stop_record_is_written_once_slurm_answered_and_says_a_failed_requeue_failed(tmp_path, monkeypatch):
    """A preempted job's requeue that the controller never answers (within the grace time the job's
    EndTime leaves): the record is not written before SLURM answered, and it says the requeue failed,
    and with SLURM's words, not `requeue: true`."""
    import subprocess
    import time

    from hpc.recovery import hostact, nodeaction

    history, asked = tmp_path / "requeue.json", []
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 6))  # GraceTime almost over

    def scontrol(argv, **kw):
        asked.append(argv[1])
        if argv[1] == "requeue":
            assert not history.exists()  # nothing recorded before SLURM has answered
            return subprocess.CompletedProcess(argv, 1, "", "scontrol: error: Socket timed out on send/recv operation\n")
        return subprocess.CompletedProcess(argv, 0, f"JobId=5 JobState=RUNNING PreemptTime=x EndTime={end}", "")

    monkeypatch.setattr(subprocess, "run", scontrol)  # the requeue's node range step too: never reached
    request = str(tmp_path / "request.json")
    hostact.ask(request, {"reason": "preempt", "history": str(history), "job_id": "5", "restart": 0,
                          "max_timeouts": 3})
    started = time.monotonic()
    line = nodeaction.settle_request(request, scontrol)
    assert time.monotonic() - started < 6 and asked.count("requeue") >= 2, asked  # asked again, within the time
    [event] = json.loads(history.read_text())["events"]
    assert (event["kind"], event["requeue"]) == ("preempt", False) and "(requeued)" not in line
    assert event["slurm"].startswith("not requeued: scontrol requeue exited 1: scontrol: error: Socket timed out")
    assert "HINT: the controller gave no answer within the job's grace time" in event["why"]
    assert json.loads(open(request + ".done").read())["outcome"]["requeue"] is False


@pytest.mark.parametrize("users", ["120", None])
def test_a_resubmission_from_the_wrapper_gets_the_users_retry_deadline_not_the_wrappers_cap(users, tmp_path,
                                                                                            monkeypatch):
    """The wrapper asks SLURM again for 5 s at most at a stop (HPC_SLURM_RETRY_S, for its own calls); the
    resubmission it submits where a requeue was refused, and every job that one submits, is not held to
    it: sbatch exports the user's value, or none."""
    from hpc.recovery import nodeaction, nodefail

    bin_dir, seen = tmp_path / "bin", tmp_path / "sbatch.env"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # the step failed: the wrapper acts
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nenv > "{seen}"\necho "Submitted batch job 42"\n')
    for name in ("srun", "sbatch"):
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    if users is None:
        monkeypatch.delenv(afterstep.RETRY_ENV, raising=False)
    else:
        monkeypatch.setenv(afterstep.RETRY_ENV, users)
    run_dir, during = str(tmp_path / "run"), []

    def refused_requeue(run, env, resubmit_after, srun_ended=True, points=None, state=None):  # SLURM's side, as decided
        during.append(os.environ.get(afterstep.RETRY_ENV))
        new = resubmit_after("41", run_dir, "train", ["n2"], {})
        return nodefail.Action("requeue", "node n2 failed", ("n2",)), f"job {new} submits the task again"

    monkeypatch.setattr(nodeaction, "after_step", refused_requeue)
    assert afterstep.main([run_dir, "--", "true"]) == 1
    assert [float(v) for v in during] == [afterstep.STOP_RETRY_S]  # the wrapper's own calls: capped
    exported = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert exported.get(afterstep.RETRY_ENV) == users
    assert os.environ.get(afterstep.RETRY_ENV) == users  # and the wrapper's process is as it was
