"""Whether a task no scheduler record covers is running: a local executor's process, a `--cluster here` step.

    python -m hpc.status RUN_DIR      # RUNNING for such a task while it runs, not UNKNOWN

A local task's job id is the pid of the submitit process that runs it (submitit.local), on the machine
that submitted it: the task runs while that process lives and its command line names the stage's
log folder, for a sweep's point the sweep's folder of that stage (a pid reused by another process
names none; a zombie has no command line). A here task
(<allocation>.h<n>) runs while squeue lists its step among its allocation's (hpc.slurm.steps): one
call for every here task of a run, made only when one of them has not left its outcome yet. Once
either ended, its done marker or its result file tells COMPLETED or FAILED (hpc.monitor.status).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Set

from hpc.rundir.run import RunDir
from hpc.slurm import steps

LOCAL, HERE = "local", "here"  # the manifest's executor kinds


def local_process(job_id: str, logs: Path) -> bool:
    """Whether process `job_id` on this machine is a local task's of the stage logging in `logs`."""
    if not job_id.isdigit():
        return False
    try:
        argv = [os.fsdecode(a) for a in Path("/proc", job_id, "cmdline").read_bytes().split(b"\0")]
    except OSError:  # no such process, or no /proc
        return False
    folder = os.path.realpath(logs)  # as submitit's folder, whichever way either path was spelt
    paths = [os.path.realpath(a) for a in argv if a.startswith(os.sep)]
    return any(p == folder or p.startswith(folder + os.sep) for p in paths)


class Alive:
    """The liveness of one run's tasks; squeue is asked once, at the first here task asked about.
    `in_sweep`: whether the run is a sweep's point, whose tasks log in the sweep's stage folders
    (its own <stage>/logs is a link its task makes once started, hpc.rundir.sweepdir)."""

    def __init__(self, run: RunDir, in_sweep: Callable[[], bool] = lambda: False):
        self.run, self.in_sweep = run, in_sweep
        self._steps: Optional[Set[str]] = None

    def running(self, t: Dict[str, Any]) -> bool:
        """Whether the latest job of manifest task `t` is running (only asked of one without an outcome)."""
        kind = t["jobs"][-1]["executor"]
        if kind == LOCAL:
            return (local_process(t["job_id"], self.run.path / t["stage"] / "logs")
                    or (self.in_sweep() and local_process(t["job_id"], self.run.path.parent / t["stage"] / "logs")))
        if kind == HERE:
            run_id = (self.run.manifest() or {}).get("run_id", "")
            return steps.name(t["stage"], run_id, t["job_id"]) in self._running_steps()
        return False

    def _running_steps(self) -> Set[str]:
        if self._steps is None:
            here = [t["job_id"] for t in self.run.tasks() if t["jobs"][-1]["executor"] == HERE]
            self._steps = steps.running(jid.rpartition(".h")[0] for jid in here)
        return self._steps
