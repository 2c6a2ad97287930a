"""The `run` pipeline's wrapper tells a script killed by a stop signal from a failed one."""

import os
import signal
import threading

import pytest

from hpc.preemption import StopFlag
from hpc.jobs.run import _await_own_signal, _killed_by_stop_signal


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
