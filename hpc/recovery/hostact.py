"""Stop decisions carried out on the host: a rank writes what it decided, hpc's srun wrapper acts.

    python -m hpc.afterstep RUN_DIR -- srun ...    # exports HPC_HOST_ACTS=<RUN_DIR>/.host/<job>-<restart>.json

Inside a container there is no scontrol, sbatch or srun. So in every job hpc submits, container or
not, the ranks never call SLURM to requeue: the srun wrapper (hpc.afterstep, on the host) names a
request file in srun's environment; rank 0 decides at a stop (preemption.handle_stop: the requeue
table over the signal it saw and the task's history) and writes the request there; the wrapper sees
the file within a wait slice, while srun still runs (a hung rank may never let srun end), and
settles it (hpc.recovery.nodeaction.settle_request): reads SLURM, records the decision in the
history, requeues, gives a node range back. A loop run under a srun of the user's own, without
the wrapper, has no HPC_HOST_ACTS and settles it in the rank as before.

submitit's own handler of the time-limit signal (a stage with no TrainLoop) would run scontrol
requeue in the task: requeue_on_host(), called by every stage task under the wrapper, sends it here too.

The file is one per attempt (job id and restart count in its name), written whole (atomic rename),
and renamed to .done once settled, so an attempt never acts on an earlier attempt's request.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from hpc.fs import atomic

# the request file of this attempt; set only by hpc.afterstep (its HOST_ACTS), in srun's environment
ENV = "HPC_HOST_ACTS"
SUBMITIT = "submitit"  # the reason of a request from submitit's own time-limit handler (requeue_on_host)
FOLDER = ".host"  # under the directory hpc.afterstep is given (a run's, or a sweep's): hpc.afterstep.request_path


def ask(path: str, request: Mapping[str, Any]) -> None:
    """Write the request for the host (rank 0, once per stop)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(Path(path), json.dumps(dict(request)))


def pending(path: str) -> Optional[Dict[str, Any]]:
    """The request at `path` not yet settled, or None (one stat when there is none)."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, ValueError):  # none yet; a half-written one cannot be (atomic rename)
        return None


def done(path: str, outcome: Mapping[str, Any]) -> None:
    """Mark the request settled: its content and what the host did, beside it as .done."""
    record = {**(pending(path) or {}), "outcome": dict(outcome)}
    atomic.write_text(Path(path + ".done"), json.dumps(record))
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def requeue_on_host() -> None:
    """In a task under hpc's srun wrapper: submitit's own time-limit handler (a stage without a
    TrainLoop; it has checkpointed and counted the timeouts) asks the host to requeue, not scontrol."""
    from submitit.slurm import slurm  # already loaded: this process is submitit's task

    def ask_host(env: Any, countdown: int) -> None:
        ask(os.environ[ENV], {"reason": SUBMITIT, "job_id": env.job_id, "countdown": countdown,
                              "restart": int(os.environ.get("SLURM_RESTART_COUNT") or 0)})

    slurm.SlurmJobEnvironment._requeue = ask_host
