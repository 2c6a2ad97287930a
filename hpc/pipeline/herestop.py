"""Ctrl-C in a `--cluster here` run (hpc.pipeline.here): the running steps stopped at a checkpoint, gently
first, and never left behind.

    with Interrupt() as stop, Reaper(running): ... stop.act(running, alloc)   # once per wait slice

A first SIGINT, SIGTERM or SIGHUP sends SIGTERM to the tasks of every running step (`scancel
--signal=TERM JOB.STEP`, not to srun, which would end the step at once), as a preemption would; a
second ends the steps through srun; a third kills srun. A step here is hpc.pipeline.here.Step: its
stage's job, its srun process (in a session of its own), and whether it was asked to stop.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Sequence

from hpc.slurm import cli

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
        print("\n[hpc] Ctrl-C: stopping the running step(s) at a checkpoint; Ctrl-C again ends them at once",
              file=sys.stderr, flush=True)

    def act(self, running: Sequence[Any], alloc: Any) -> None:
        if self.asked and (self.forced or time.monotonic() - self.since > STOP_WAIT_S):
            for step in running:  # srun ends its step on SIGTERM at once (slurmstepd kills the tasks)
                if step.proc.poll() is None:
                    os.killpg(step.proc.pid, signal.SIGKILL if self.killed else signal.SIGTERM)
            return
        for step in running:
            if self.asked and not step.stopped:
                reached = signal_step(step, alloc)
                step.stopped = reached > 0
                peers = [other for other in running if other.job.stage == step.job.stage]
                if reached >= len(peers):  # that scancel per listed step reached every step of this stage
                    for other in peers:
                        other.stopped = True


def signal_step(step: Any, alloc: Any) -> int:
    """SIGTERM to the tasks of every listed step of `step`'s stage, not to srun (which would end the
    step at once): how many were reached. 0 while SLURM does not list the step yet (it is starting):
    asked again at the next slice."""
    try:
        listed = cli.run(["squeue", "-h", "-s", "-j", alloc.job_id, "-o", "%i|%j"])
    except RuntimeError:
        return 0
    mine = [line.split("|")[0] for line in listed.splitlines() if line.endswith(f"|hpc-{step.job.stage}")]
    if not mine:
        return int(step.proc.poll() is not None)
    for step_id in mine:  # side by side: every step of the stage (all of them are being stopped)
        subprocess.run(["scancel", "--signal=TERM", step_id], capture_output=True)
    return len(mine)
