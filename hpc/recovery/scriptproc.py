"""One script under a job's wrapper: told of the time-limit warning in the signal it expects, and
ended, with every process it started, when the stop decision cannot wait for it any longer.

    proc = start(cmd, env, cwd, held=signal.SIGUSR2)
    outcome = supervise(proc, flag, warn="TERM", stop_now=lambda: time.time() >= deadline)
    if outcome == "deadline": end_tree(proc)

SLURM sends its signals to every process of the step: a preemption's SIGTERM reaches the script
itself. The time-limit warning (``--signal=USR2@N``) does too, but a script rarely handles USR2
(hpc.launch starts it ignored, so that it is not fatal): here it is passed on as the signal the
script saves on, TERM (plain scripts, torchrun's own convention) or USR1 (Lightning's requeue
signal); "USR2" leaves it to the script, "none" tells it nothing. Killing the tree, not one pid:
data-loader workers and a launcher's children would otherwise outlive the script and hold the GPUs.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any, Callable, Dict, List, Optional

WARN_SIGNALS = ("TERM", "USR1", "USR2", "none")
END_GRACE_S = 2.0  # between SIGTERM and SIGKILL when the tree is ended


def start(cmd: List[str], env: Dict[str, str], cwd: Optional[str], held: int) -> subprocess.Popen:
    """Start cmd with signal `held` blocked, a mask the child inherits (hpc.launch unblocks it once it
    has set the script's disposition): a signal arriving meanwhile waits here, never kills the child."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {held})
    try:
        return subprocess.Popen(cmd, env=env, cwd=cwd)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {held})


def supervise(proc: subprocess.Popen, flag: Any, warn: str, stop_now: Callable[[], bool],
              poll_s: float = 0.1, preempt_as: Optional[str] = None,
              interrupt: Optional[Callable[[], bool]] = None) -> str:
    """Wait for the script: 'exited' once it has, 'deadline' once a stop was seen and stop_now()
    says the decision cannot wait. The time-limit warning is passed on once, as `warn`; a
    preemption, with `preempt_as`, as that signal too (for a script started with SIGTERM blocked,
    whose framework saves on another signal: hpc.scripts.presets). 'interrupted' once `interrupt()`,
    asked at every poll, says so (a hang watchdog's verdict)."""
    for name in (warn, preempt_as or "none"):
        if name not in WARN_SIGNALS:
            raise ValueError(f"warn signal {name!r}; expected one of {', '.join(WARN_SIGNALS)}")
    told: set = set()
    while True:
        try:
            proc.wait(timeout=poll_s)
            return "exited"
        except subprocess.TimeoutExpired:
            pass
        if interrupt is not None and interrupt():
            return "interrupted"
        if flag.reason is None:
            continue
        passed_on = {"timeout": warn, "preempt": preempt_as or "none"}.get(flag.reason, "none")
        if flag.reason == "timeout" and passed_on == "USR2":
            passed_on = "none"  # SLURM's own USR2 reached the script
        if passed_on != "none" and passed_on not in told:  # once each: a framework saves on each one
            told.add(passed_on)
            _signal(proc.pid, getattr(signal, f"SIG{passed_on}"))
        if stop_now():
            return "deadline"


def descendants(pid: int) -> List[int]:
    """Every live process below `pid`, from /proc (no psutil): children before grandchildren."""
    parents: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # ended meanwhile
            continue
        # the command name, in parentheses, may hold spaces and parentheses: split after the last ')'
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(0), [])
        found += kids
        todo += kids
    return found


def end_tree(proc: subprocess.Popen, grace_s: float = END_GRACE_S) -> int:
    """SIGTERM to the script and everything it started, SIGKILL to what is left after grace_s; the
    script's exit status."""
    tree = [proc.pid, *descendants(proc.pid)]  # before any dies: orphans leave the tree
    for pid in tree:
        _signal(pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    for pid in [*tree, *descendants(proc.pid)]:
        _signal(pid, signal.SIGKILL)
    return proc.wait()


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
