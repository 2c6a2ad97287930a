"""A script under the run wrapper (hpc.recovery.scriptproc): the time-limit warning passed on as the
signal the script expects, and the script's whole process tree ended at the decision deadline."""

import os
import signal
import subprocess
import sys
import time

import pytest

from hpc.recovery.scriptproc import descendants, end_tree, start, supervise
from hpc.recovery.stopsignal import StopFlag

# Prints the signals it gets; ignores TERM/USR1 after noting them, so only SIGKILL ends it.
STUBBORN = """\
import signal, sys, time
def note(n, f): print("got", signal.Signals(n).name, flush=True)
for s in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, note)
print("ready", flush=True)
while True: time.sleep(0.05)
"""


@pytest.fixture
def flag():
    f = StopFlag("USR2").install()
    yield f
    f.uninstall()


def running(code: str) -> subprocess.Popen:
    proc = start([sys.executable, "-c", code], dict(os.environ), None, held=signal.SIGUSR2)
    return proc


@pytest.mark.parametrize("warn, heard", [("TERM", "SIGTERM"), ("USR1", "SIGUSR1"), ("none", None)])
def test_the_time_limit_warning_reaches_the_script_as_the_signal_it_expects(flag, tmp_path, warn, heard):
    out = tmp_path / "out"
    with open(out, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=fh)
    deadline = time.monotonic() + 30
    while "ready" not in out.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGUSR2)  # SLURM's warning, as this wrapper receives it
    polls = []
    assert supervise(proc, flag, warn, stop_now=lambda: polls.append(1) or len(polls) > 10) == "deadline"
    time.sleep(0.3)
    got = out.read_text().split()
    end_tree(proc, grace_s=0.5)
    assert flag.reason == "timeout"
    assert (got[1:3] if len(got) > 1 else []) == (["got", heard] if heard else [])


def test_a_script_that_exits_is_reported_without_waiting_for_a_stop(flag):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert supervise(proc, flag, "TERM", stop_now=lambda: True) == "exited"


def test_the_whole_tree_is_ended_even_when_the_script_ignores_sigterm():
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, "
            "signal.SIG_IGN); time.sleep(300)']); time.sleep(300)")
    proc = running(code)
    deadline = time.monotonic() + 30
    while not descendants(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = descendants(proc.pid)
    assert len(grandchild) == 1
    began = time.monotonic()
    assert end_tree(proc, grace_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - began < 10
    time.sleep(0.2)
    with open(f"/proc/{grandchild[0]}/stat") if os.path.exists(f"/proc/{grandchild[0]}") else open(os.devnull) as fh:
        state = fh.read().split(")")[-1].split()[:1]
    assert state in ([], ["Z"])  # gone, or a zombie waiting for init


def test_an_unknown_warn_signal_is_refused(flag):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    with pytest.raises(ValueError, match="expected one of TERM, USR1, USR2, none"):
        supervise(proc, flag, "HUP", stop_now=lambda: True)
    proc.wait()


def test_a_stop_signal_after_a_hang_decision_keeps_the_decision(flag):
    flag.reason = "hang"  # what the run wrapper sets once its watchdog fired, before it requeues
    os.kill(os.getpid(), signal.SIGTERM)  # SLURM's requeue then signals every process of the step
    deadline = time.monotonic() + 5
    while flag.signal is None and time.monotonic() < deadline and flag.reason == "hang":
        time.sleep(0.01)
    assert flag.reason == "hang"
