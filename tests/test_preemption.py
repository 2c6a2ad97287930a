"""Unit tests for hpc.preemption: signal flags and the requeue decision table."""

import json
import os
import signal

import pytest

from hpc import preemption as pre

RUNNING = {"JobState": "RUNNING", "Reason": "None", "PreemptTime": "None", "Restarts": "0"}


@pytest.mark.parametrize("info, signal_kind, expected", [
    (RUNNING, "timeout", ("timeout", False)),      # --signal=USR2@N: SLURM still says RUNNING
    (RUNNING, "preempt", ("preempt", False)),      # SIGTERM, SLURM not updated: trust the signal
    ({**RUNNING, "PreemptTime": "2026-11-22T02:55:43"}, "timeout", ("preempt", False)),  # GraceTime
    ({**RUNNING, "JobState": "COMPLETING", "Restarts": "1"}, "preempt", ("preempt", True)),
    ({**RUNNING, "JobState": "PENDING", "Reason": "BeginTime"}, "preempt", ("preempt", True)),
    ({**RUNNING, "JobState": "COMPLETING"}, "preempt", ("cancelled", False)),  # scancel's SIGTERM
    ({**RUNNING, "JobState": "CANCELLED"}, "preempt", ("cancelled", False)),
    ({**RUNNING, "JobState": "TIMEOUT"}, "preempt", ("timeout", False)),
    ({**RUNNING, "JobState": "COMPLETED"}, "timeout", ("finished", False)),
])
def test_classify_reads_slurm_before_the_signal(info, signal_kind, expected):
    assert pre.classify(info, signal_kind, restart_count=0) == expected


def test_decide_table():
    assert pre.decide("preempt", "RUNNING", timeouts_done=99, max_timeouts=0).requeue
    assert pre.decide("timeout", "RUNNING", 1, 2).requeue
    no = pre.decide("timeout", "RUNNING", 2, 2)
    assert not no.requeue and "max_timeouts=2" in no.why and "HINT" in no.why
    assert not pre.decide("finished", "COMPLETED", 0, 3).requeue
    assert not pre.decide("cancelled", "CANCELLED", 0, 3).requeue


def test_handlers_only_set_a_flag_and_preemption_wins():
    before = signal.getsignal(signal.SIGUSR2)  # a TrainLoop of an earlier test leaves its own
    flag = pre.StopFlag("USR2").install()
    try:
        assert flag.local() is None
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.local() == pre.StopRequest("timeout", "SIGUSR2")
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.local().reason == "preempt"
        os.kill(os.getpid(), signal.SIGUSR2)  # a later timeout does not downgrade it
        assert flag.local().reason == "preempt"
        assert pre.should_stop(flag=flag).reason == "preempt"  # no process group: local flag
    finally:
        flag.uninstall()
    assert signal.getsignal(signal.SIGUSR2) is before


def test_bad_timeout_signal_names_say_how_to_fix():
    with pytest.raises(ValueError, match="HINT"):
        pre.StopFlag("NOPE")
    with pytest.raises(ValueError, match="HINT"):
        pre.StopFlag("TERM")


def test_install_with_a_bad_signal_keeps_the_installed_flag():
    flag = pre.install("USR2")
    try:
        with pytest.raises(ValueError, match="HINT"):
            pre.install("NOPE")
        assert signal.getsignal(signal.SIGUSR2) == flag._handle
        assert pre.should_stop() is None  # the module flag still answers
    finally:
        flag.uninstall()


def test_exit_for():
    with pytest.raises(SystemExit):
        pre.exit_for(pre.Decision(True, "hpc", "preempted", "preempt"))
    with pytest.raises(pre.JobNotRequeued, match="timed out"):
        pre.exit_for(pre.Decision(False, None, "timed out 3 times", "timeout"))


def test_handle_stop_outside_slurm_does_not_requeue(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    d = pre.handle_stop(pre.StopRequest("timeout", "SIGUSR2"), tmp_path / "h.json")
    assert not d.requeue and "not running under SLURM" in d.why


def test_history_counts_timeouts(tmp_path):
    path = tmp_path / "requeue.json"
    hist = pre.load_history(path)
    pre._record(path, hist, pre.decide("timeout", "RUNNING", 0, 3), {"JobState": "RUNNING"})
    pre._record(path, pre.load_history(path), pre.decide("preempt", "RUNNING", 1, 3), {})
    saved = json.loads(path.read_text())
    assert (saved["timeouts"], saved["preemptions"], len(saved["events"])) == (1, 1, 2)
