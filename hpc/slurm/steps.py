"""The srun steps `--cluster here` runs in an allocation: their names, and which of them are running.

    python -c "from hpc.slurm import steps; print(steps.running(['1234']))"

A here task's id in the manifest is <allocation>.h<n>; its step is named NAME (hpc.here.steps starts
it), so that hpc.here.stops signals only its own command's steps and hpc.status finds a task among
its allocation's running steps: one `squeue --steps` call for every allocation a run used. A step
that ended is not listed; what it left (its done marker, its result file) tells how it ended.
"""
from __future__ import annotations

from typing import Iterable, Set

from hpc.slurm.cli import SlurmExit, run

NAME = "hpc-{stage}.{run}.h{seq}"  # a step's name: its stage, its run's id, its number in the run
DEADLINE_S = 10.0  # hpc.status waits no longer than this for a busy controller's answer


def name(stage: str, run_id: str, task_id: str) -> str:
    """The step name of the here task `task_id` (<allocation>.h<n>) of `stage` in run `run_id`."""
    return NAME.format(stage=stage, run=run_id, seq=task_id.rpartition(".h")[2])


def running(allocations: Iterable[str]) -> Set[str]:
    """The names of the running steps of these allocations; empty when SLURM lists none of them (an
    allocation that ended is unknown to squeue) or cannot be asked."""
    ids = sorted(set(allocations))
    if not ids:
        return set()
    try:
        out = run(["squeue", "-h", "--steps", "-j", ",".join(ids), "-o", "%j"], deadline_s=DEADLINE_S)
    except (SlurmExit, RuntimeError, OSError):
        return set()
    return {line.strip() for line in out.splitlines() if line.strip()}
