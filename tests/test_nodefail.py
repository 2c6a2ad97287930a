"""Node failures and requeue glue, the pure parts: which nodes failed, the decision table, progress,
the scontrol fields that give a node range back, and the lines hpc adds to its sbatch scripts.

    python -m pytest tests/test_nodefail.py

What SLURM does with them is tested on the real cluster (tests/slurm/test_node_failure.py).
"""
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpc import afterstep
from hpc.recovery import nodefail, requeue
from hpc.pipeline import sbatch


def test_a_node_is_failed_when_slurm_says_down_fail_or_not_responding():
    states = {"n1": "MIXED", "n2": "DOWN+NOT_RESPONDING", "n3": "IDLE+NOT_RESPONDING", "n4": "DRAIN",
              "n5": "IDLE+DRAIN+FAIL", "n6": "ALLOCATED", "n7": "DOWN"}
    assert nodefail.failed_nodes(states) == ["n2", "n3", "n5", "n7"]


@pytest.mark.parametrize("info, restart, expected", [
    ({"JobState": "PENDING", "Restarts": "1"}, 0, True),
    ({"JobState": "COMPLETING", "Restarts": "1"}, 0, True),  # SLURM's requeue underway
    ({"JobState": "COMPLETING", "Restarts": "1"}, 1, False),  # this attempt's own count
    ({"JobState": "RUNNING", "Restarts": "0"}, 0, False),
    ({"JobState": "NODE_FAIL", "Restarts": "0"}, 0, False),
    ({}, 0, False),
])
def test_requeued_reads_the_state_and_the_restart_count(info, restart, expected):
    assert nodefail.requeued(info, restart) is expected


def decide(failed=("n2",), already=True, mark=4, limit=3, history=None):
    return nodefail.decide(history or {"node_failures": 0, "events": []}, list(failed), already, mark, limit, "train")


def test_an_error_on_healthy_nodes_is_not_retried():
    assert decide(failed=(), already=False).do == "none"


def test_a_requeue_for_another_reason_only_reopens_the_node_range():
    assert decide(failed=(), already=True).do == "reopen"


def test_a_preempted_job_that_ended_without_a_requeue_is_requeued():
    """Its ranks died of the preemption's SIGTERM before they could requeue it themselves."""
    action = nodefail.decide({}, [], False, None, 3, "train", preempted=True)
    assert (action.do, action.exclude) == ("requeue", ())
    assert nodefail.preempted({"PreemptTime": "2026-01-01T00:00:00"})
    assert not nodefail.preempted({"PreemptTime": "None"}) and not nodefail.preempted({})


def test_a_node_failure_is_requeued_with_the_node_excluded():
    action = decide(failed=("n2", "n5"))
    assert (action.do, action.exclude) == ("requeue", ("n2", "n5"))
    assert "node failure 1 of at most 3" in action.why and "checkpoint step-4" in action.why


def test_node_failures_past_the_limit_stop_with_a_hint():
    action = decide(history={"node_failures": 3, "events": []})
    assert action.do == "stop"
    assert "more than stages.train.max_node_failures=3" in action.why and "HINT:" in action.why
    assert decide(limit=0).do == "stop"


def events(*marks, kind="node_failure"):
    return [{"kind": kind, "progress": m} for m in marks]


def test_attempts_without_a_newer_checkpoint_stop_the_job():
    history = {"node_failures": 2, "events": events(4, 4)}  # the second attempt committed nothing newer
    action = decide(history=history, mark=4, limit=10)
    assert action.do == "stop"
    assert f"{nodefail.NO_PROGRESS_LIMIT} attempts in a row" in action.why and "step-4" in action.why


def test_progress_between_failures_keeps_requeueing():
    history = {"node_failures": 4, "events": events(1, 2, 3, 4)}
    assert decide(history=history, mark=5, limit=10).do == "requeue"


@pytest.mark.parametrize("marks, mark, expected", [
    ((), 3, 0),
    ((3,), 3, 1),
    ((3, 3), 3, 2),
    ((3, 3), 4, 0),  # progress resets the count
    ((None, None), None, 0),  # before the first checkpoint: nothing counted
    ((3, None), 3, 1),  # an attempt without any checkpoint neither counts nor resets
])
def test_no_progress_streak(marks, mark, expected):
    assert nodefail.no_progress_streak(events(*marks), mark) == expected


def test_a_preemption_that_made_progress_resets_the_streak():
    history = events(3) + events(5, kind="requeued")
    assert nodefail.no_progress_streak(history, 5) == 1
    assert nodefail.no_progress_streak(history, 6) == 0


def test_progress_is_the_newest_committed_checkpoint(tmp_path):
    assert nodefail.progress_mark(tmp_path) is None
    for step, marked in ((2, True), (7, True), (9, False)):  # step-9 has no marker: not committed
        (tmp_path / "checkpoints" / f"step-{step}").mkdir(parents=True)
        if marked:
            (tmp_path / "checkpoints" / f"step-{step}" / "COMPLETE.json").write_text("{}")
    (tmp_path / "step-3").mkdir()
    (tmp_path / "step-3" / "COMPLETE.json").write_text("{}")
    assert nodefail.progress_mark(tmp_path) == 7


def test_the_history_counts_failures_and_excluded_nodes_for_status(tmp_path):
    assert nodefail.summary(tmp_path) == ""
    history = nodefail.load(tmp_path)
    action = decide(failed=("n2",))
    nodefail.record(tmp_path, history, action, "12", 0, ["n2"], 4, "requeued as job 12")
    nodefail.record(tmp_path, nodefail.load(tmp_path), nodefail.Action("reopen", "requeued"), "12", 1, [], 5,
                    "requeued")
    saved = json.loads((tmp_path / nodefail.HISTORY).read_text())
    assert (saved["node_failures"], saved["excluded"], len(saved["events"])) == (1, ["n2"], 2)
    assert nodefail.summary(tmp_path) == "1 node failure(s), excluded: n2; last: requeued as job 12"
    stop = decide(failed=("n3",), history=nodefail.load(tmp_path), limit=1)
    nodefail.record(tmp_path, nodefail.load(tmp_path), stop, "12", 2, ["n3"], 5, "stopped")
    assert nodefail.summary(tmp_path) == f"2 node failure(s), excluded: n2; last: {stop.why} (stopped)"


@given(lo=st.integers(1, 50), extra=st.integers(0, 50), per_node=st.integers(1, 16))
def test_requeue_fields_ask_for_the_fewest_tasks_of_the_range(lo, extra, per_node):
    out = requeue.fields((lo, lo + extra), per_node)
    if extra:
        assert out == {"NumNodes": f"{lo}-{lo + extra}", "NumTasks": str(lo * per_node)}
    else:  # a fixed node count: SLURM's pinned NumTasks is already the right one
        assert out == {}


def test_requeue_fields_exclude_nodes():
    assert requeue.fields(None, 1, ["n3", "n2", "n3"]) == {"ExcNodeList": "n2,n3"}
    assert requeue.excluded({"ExcNodeList": "n[1-2],n5"}) == ["n1", "n2", "n5"]
    assert requeue.excluded({"ExcNodeList": "(null)"}) == []


@pytest.mark.parametrize("env, expected", [
    ({"HPC_NODES": "1-2", "SLURM_NTASKS_PER_NODE": "2"}, ((1, 2), 2)),
    ({"HPC_NODES": "3", "SLURM_NTASKS_PER_NODE": "8"}, ((3, 3), 8)),
    ({"HPC_NODES": "1-4", "SLURM_NTASKS": "6", "SLURM_JOB_NUM_NODES": "3"}, ((1, 4), 2)),
    ({"SLURM_NTASKS_PER_NODE": "2"}, None),  # not a job hpc's script started
])
def test_what_the_job_asked_for_comes_from_its_environment(env, expected):
    assert requeue.requested(env) == expected


def test_srun_runs_under_afterstep_in_hpcs_batch_scripts():
    res = {"nodes": "1-2", "tasks_per_node": 2, "cpus_per_task": 1, "time_min": 5, "signal_delay_s": 30,
           "gpus_per_node": 0, "max_node_failures": 5}
    params = sbatch.slurm_parameters(res, "train", setup=["module load cuda"], run_dir="/runs/a b")
    trap, srun, export, user = params["setup"]
    assert trap.startswith("trap true TERM") and user == "module load cuda"
    assert srun.startswith("srun() {") and "-m hpc.afterstep '/runs/a b' -- \"$@\"; }" in srun
    assert export == "export HPC_NODES=1-2 HPC_MAX_NODE_FAILURES=5 HPC_SIGNAL_DELAY_S=30"  # hpc.recovery.inplace.warned
    assert "afterstep" not in str(sbatch.slurm_parameters(res, "train"))  # no run directory, no wrapper


@pytest.mark.parametrize("script, code", [("exit 0", 0), ("exit 3", 3), ("kill -9 $$", 137)])
def test_the_wrapper_exits_with_sruns_status_and_looks_only_at_failures(script, code):
    seen = []
    assert afterstep.supervise(["sh", "-c", script], lambda why: seen.append(why) or True) == code
    assert seen == ([] if code == 0 else [f"srun exited {code if code < 128 else 128 - code}"])


def test_the_wrapper_acts_on_sigterm_at_once_and_again_until_it_did_something(tmp_path):
    seen = []

    def on_end(why):
        seen.append(why)
        (tmp_path / str(len(seen))).touch()  # the child sends its next SIGTERM once this one was seen
        return len(seen) == 2

    # the child stands for srun: it outlives the SIGTERMs it sends the wrapper, then ends by itself
    wait = "while [ ! -e {} ]; do sleep 0.05; done"
    child = ["sh", "-c", f"trap '' TERM; kill -TERM $PPID; {wait.format(tmp_path / '1')}; kill -TERM $PPID; "
                         f"{wait.format(tmp_path / '2')}; kill -TERM $PPID; exit 5"]
    assert afterstep.supervise(child, on_end) == 5
    assert seen == ["SIGTERM", "SIGTERM"]  # it acted on the second: the third is ignored, no failure looked at


def test_the_wrapper_acts_on_a_sigterm_that_another_thread_of_its_process_took(tmp_path):
    """The kernel may hand a process's SIGTERM to any of its threads; the handler must still run
    while srun runs. The child gives up waiting after about 10 s and exits 7: on a wrapper that
    only noticed the signal once the child had ended, that is the exit status seen."""
    import signal
    import threading

    seen = []

    def on_end(why):
        seen.append(why)
        (tmp_path / "seen").touch()
        return True

    def signal_from_another_thread():
        for _ in range(2000):  # the child has started once its file exists
            if (tmp_path / "started").exists():
                break
            threading.Event().wait(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this thread, not the main one

    child = ["sh", "-c", f"touch {tmp_path / 'started'}; i=0; while [ ! -e {tmp_path / 'seen'} ]; do "
                         "i=$((i+1)); [ $i -gt 200 ] && exit 7; sleep 0.05; done; exit 0"]
    helper = threading.Thread(target=signal_from_another_thread)
    helper.start()
    try:
        assert afterstep.supervise(child, on_end) == 0
    finally:
        helper.join()
    assert seen == ["SIGTERM"]
