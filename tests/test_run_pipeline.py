"""The `run` pipeline's wrapper: a script killed by a stop signal told from a failed one, the
pre-timeout signal never fatal to a script that does not handle it, and rank 0's stop decision
that the other ranks wait for."""

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import asdict
from types import SimpleNamespace

import pytest

from hpc.recovery.stopsignal import StopFlag
from hpc.recovery.verdict import Decision
from hpc.scripts.runner import DECISION_FILE, _await_own_signal, _killed_by_stop_signal, run_argv, wait_for_decision


@pytest.fixture
def flag():
    f = StopFlag("USR2").install()
    yield f
    f.uninstall()


@pytest.mark.parametrize("code, stop", [(-signal.SIGTERM, True), (128 + signal.SIGTERM, True),
                                        (-signal.SIGUSR2, True), (-signal.SIGKILL, False), (1, False),
                                        (0, False)])
def test_stop_signals_are_recognised_in_either_exit_form(flag, code, stop):
    assert _killed_by_stop_signal(code, flag) is stop


def test_wrapper_waits_for_its_own_copy_of_a_late_signal(flag):
    # SLURM may signal the script first and this process a moment later.
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    _await_own_signal(flag, timeout_s=5)
    assert flag.reason == "preempt"


def test_wrapper_gives_up_when_no_signal_comes(flag):
    _await_own_signal(flag, timeout_s=0.2)
    assert flag.reason is None


# A script that does not handle the pre-timeout signal, and one that does: both get it themselves.
UNHANDLED = ("import os, signal; blocked = signal.SIGUSR2 in signal.pthread_sigmask(signal.SIG_BLOCK, []); "
             "os.kill(os.getpid(), signal.SIGUSR2); print('alive', blocked)")
HANDLED = ("import os, signal, sys; signal.signal(signal.SIGUSR2, lambda *a: print('got USR2')); "
           "os.kill(os.getpid(), signal.SIGUSR2); sys.exit(3)")


@pytest.fixture
def task(tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "HPC_")):
            monkeypatch.delenv(k)
    env = SimpleNamespace(rank=0, job_id="77", restart_count=1)
    return SimpleNamespace(stage_dir=tmp_path / "main", run_dir=tmp_path, env=env)


@pytest.mark.parametrize("launch", [True, False], ids=["launch", "no-env"])
def test_a_script_that_ignores_the_timeout_signal_survives_it(task, capfd, launch):
    before = signal.getsignal(signal.SIGUSR2)
    assert run_argv(task, [sys.executable, "-c", UNHANDLED], max_timeouts=1, launch=launch) == {"exit_code": 0}
    assert capfd.readouterr().out.split() == ["alive", "False"]  # and the signal is not left blocked
    assert signal.getsignal(signal.SIGUSR2) is before
    assert signal.SIGUSR2 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_script_with_its_own_handler_still_gets_the_signal(task, capfd):
    with pytest.raises(RuntimeError, match="exited with status 3"):
        run_argv(task, [sys.executable, "-c", HANDLED], max_timeouts=1)
    assert capfd.readouterr().out.split() == ["got", "USR2"]


def test_direct_launch_ignores_the_signal_only_where_no_handler_is_set():
    code = "import signal; print(signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN)"
    out = subprocess.run([sys.executable, "-m", "hpc.launch", "--no-env", "--", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["True"], out.stderr


def test_the_script_runs_in_cwd_with_env_added_and_this_process_unchanged(task, tmp_path, capfd):
    code = "import os; print(os.getcwd(), os.environ['HPC_TEST_EXTRA'], os.environ['HPC_RUN_DIR'])"
    before = os.getcwd()
    assert run_argv(task, [sys.executable, "-c", code], max_timeouts=1, launch=False, cwd=tmp_path / "main",
                    env={"HPC_TEST_EXTRA": "x", "HPC_RUN_DIR": "not this"}) == {"exit_code": 0}
    assert capfd.readouterr().out.split() == [str(tmp_path / "main"), "x", str(tmp_path)]
    assert os.getcwd() == before and "HPC_TEST_EXTRA" not in os.environ


def test_rank_0_writes_its_decision_after_a_plain_end_too(task):
    assert run_argv(task, ["true"], max_timeouts=1, launch=False) == {"exit_code": 0}
    saved = json.loads((task.stage_dir / "checkpoints" / DECISION_FILE).read_text())
    assert saved == {"job": "77", "restart": "1", "decision": None}


def test_other_ranks_wait_for_rank_0s_decision_of_this_attempt(tmp_path):
    """No deadline of their own: an older attempt's decision is not theirs, rank 0's is."""
    path = tmp_path / DECISION_FILE
    decision = Decision(True, "hpc", "preempted (SLURM JobState=RUNNING)", "preempt")
    path.write_text(json.dumps({"job": "77", "restart": "0", "decision": asdict(decision)}))
    got = []
    waiter = threading.Thread(target=lambda: got.append(
        wait_for_decision(path, {"job": "77", "restart": "1"}, poll_s=0.01)))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and not got  # still waiting: the file is from the previous attempt
    path.write_text(json.dumps({"job": "77", "restart": "1", "decision": asdict(decision)}))
    waiter.join(30)
    assert got == [decision]
