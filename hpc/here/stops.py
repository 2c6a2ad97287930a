"""Ctrl-C in a `--cluster here` run (hpc.here.backend): the running steps stopped at a checkpoint, gently
first, and never left behind; and what the ranks of a stopped step are told stopped it.

    with Interrupt() as stop, Reaper(running): ... stop.act(running, alloc)   # once per wait slice

A first SIGINT, SIGTERM or SIGHUP sends SIGTERM to the tasks of every running step of this command
(`scancel --signal=TERM JOB.STEP`, not to srun, which would end the step at once), as a preemption
would; a second ends the steps through srun; a third kills srun. A step here is hpc.here.steps.Step:
its stage's job, its srun process (in a session of its own), its step name, unique to this command's
run (another run in the same allocation numbers its steps alike: only the name tells them apart), and
whether it was asked to stop. A stopped rank asks the command what stopped it (stopped(): a hang, the
allocation's end, this command's signal), never to requeue: the same command resumes.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Dict, List, Mapping, Sequence

from hpc.slurm import cli

ASK_S = 5.0  # how long a Ctrl-C's squeue and scancel calls retry a busy controller: the terminal waits
STOP_WAIT_S = 300.0  # after Ctrl-C, how long the steps get to checkpoint before they are ended


class Reaper:
    """Steps never outlive this process: they run in sessions of their own, so an exception here
    (a full disk writing the next task's pickle, say) would leave them running, and the same command
    run again would start a second copy of a task beside the first."""

    def __init__(self, running: List[Any]) -> None:
        self.running = running

    def __enter__(self) -> "Reaper":
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if kind is None:
            return
        for step in self.running:
            if step.proc.poll() is None:
                os.killpg(step.proc.pid, signal.SIGTERM)  # srun ends its step (slurmstepd kills the tasks)


class Interrupt:
    """SIGINT, SIGTERM or SIGHUP (the terminal closed) -> `asked`: act() stops the steps gently; a second
    -> `forced`: srun ends them at once; a third -> SIGKILL to srun, for a step that does not end."""

    def __init__(self) -> None:
        self.asked = self.forced = self.killed = False
        self.since = 0.0
        self.got = ""  # the first signal's name (SIGINT: Ctrl-C), for what the stopped ranks are told
        self._before: Dict[int, Any] = {}

    def __enter__(self) -> "Interrupt":
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._before[sig] = signal.signal(sig, self._on_int)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, before in self._before.items():
            signal.signal(sig, before)

    def _on_int(self, signum: int, frame: Any) -> None:
        self.killed, self.forced = self.forced, self.asked
        self.asked, self.since = True, self.since or time.monotonic()
        self.got = self.got or signal.Signals(signum).name
        print("\n[hpc] Ctrl-C: stopping the running step(s) at a checkpoint; Ctrl-C again ends them at once",
              file=sys.stderr, flush=True)

    def act(self, running: Sequence[Any], alloc: Any) -> None:
        if self.asked and (self.forced or time.monotonic() - self.since > STOP_WAIT_S):
            for step in running:  # srun ends its step on SIGTERM at once (slurmstepd kills the tasks)
                if step.proc.poll() is None:
                    os.killpg(step.proc.pid, signal.SIGKILL if self.killed else signal.SIGTERM)
            return
        waiting = [step for step in running if self.asked and not step.stopped]
        if waiting:
            listed = steps(alloc)
            for step in waiting:
                step.stopped = signal_step(step, listed)


def steps(alloc: Any) -> Dict[str, List[str]]:
    """The allocation's running steps: name -> their ids (JOB.STEP); {} when SLURM cannot say."""
    try:
        out = cli.run(["squeue", "-h", "-s", "-j", alloc.job_id, "-o", "%i|%j"], deadline_s=ASK_S)
    except RuntimeError:
        return {}
    named: Dict[str, List[str]] = {}
    for line in out.splitlines():
        step_id, _, name = line.partition("|")
        named.setdefault(name, []).append(step_id)
    return named


def signal_step(step: Any, listed: Mapping[str, Sequence[str]]) -> bool:
    """SIGTERM to the tasks of `step` (the steps `listed` under its name: this command's alone), not to
    srun (which would end the step at once): whether it was reached, or has ended. False while SLURM
    does not list it yet (it is starting): asked again at the next slice."""
    mine = listed.get(step.name, ())
    for step_id in mine:
        try:
            cli.run(["scancel", "--signal=TERM", step_id], deadline_s=ASK_S)
        except RuntimeError:  # a step that ended meanwhile; a controller that does not answer: the wait ends it
            pass
    return bool(mine) or step.proc.poll() is not None


RESUME = "run the same command again to resume from this checkpoint"
# What stopped a step, as its ranks are told (kind, why): looked for in this order, a hang's verdict
# (the rank's request says so), what SLURM says of the allocation (hpc.recovery.preemption.classify),
# the signal this command got, else a signal from elsewhere. Never a requeue: the same command resumes.
STOPPED = {
    "hang": ("hang", "a rank hung: the watchdog stopped the step (its stacks: python -m hpc.status RUN_DIR). "
                     f"HINT: {RESUME}"),
    "timeout": ("timeout", "allocation {job} reached its time limit (EndTime {end}). HINT: salloc a new "
                           f"allocation, with a longer -t, and {RESUME}"),
    "preempt": ("preempt", f"allocation {{job}} was preempted. HINT: salloc a new allocation and {RESUME}"),
    "cancelled": ("cancelled", f"allocation {{job}} was cancelled. HINT: salloc a new allocation and {RESUME}"),
    "finished": ("cancelled", f"allocation {{job}} has ended ({{state}}). HINT: salloc a new allocation and {RESUME}"),
    "SIGINT": ("interrupted", f"stopped by Ctrl-C (--cluster here). HINT: {RESUME}"),
    "SIGTERM": ("interrupted", f"stopped: hpc.submit got SIGTERM (--cluster here). HINT: {RESUME}"),
    "SIGHUP": ("interrupted", f"stopped: the terminal of hpc.submit closed (SIGHUP, --cluster here). HINT: {RESUME}"),
    "": ("interrupted", "stopped by a signal that hpc.submit did not send (an scancel --signal of the step, "
                        f"say). HINT: {RESUME}"),
}


def stopped(request: Mapping[str, Any], job: str, info: Mapping[str, str], got: str) -> Dict[str, Any]:
    """The answer to a rank's stop `request` (hpc.recovery.hostact: its reason), from SLURM's fields of
    allocation `job` (`info`, {} when unread) and the signal this command `got` ('' when none)."""
    # here, not at the top: only a stop reads SLURM's verdict; a submission need not load hpc.recovery
    from hpc.recovery import preemption

    found = "hang" if request.get("reason") == "hang" else preemption.classify(dict(info), "")[0]
    key = found or (got if got in STOPPED else "")
    kind, why = STOPPED[key]
    return {"requeue": False, "kind": kind, "why": why.format(job=job, end=info.get("EndTime", "?"),
                                                             state=info.get("JobState", "?"))}
