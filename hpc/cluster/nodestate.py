"""The nodes of a running local cluster as sinfo sees them: waiting until they answer, and bringing
them back to idle between tests.

    python -c "from hpc.cluster import LocalCluster; LocalCluster('/tmp/hpc-cluster').settle()"

Every function takes `run`, LocalCluster.run: a SLURM client command against that cluster.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Callable

from hpc.cluster.daemons import ClusterError

Run = Callable[..., subprocess.CompletedProcess]
ANSWERING = {"idle", "mix", "alloc"}  # sinfo's short states of a node that responds ('*' marks one that does not)


def states(run: Run) -> dict[str, str]:
    """Node -> sinfo's short state (idle, mix, idle* when not responding, ...)."""
    out = run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def answering(run: Run, nodes: list[str]) -> bool:
    """Every node responds, whether it runs jobs or not."""
    now = states(run)
    return bool(now) and all(now.get(n, "").rstrip("*") in ANSWERING for n in nodes)


def wait_answering(run: Run, nodes: list[str], timeout_s: float, logs: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if answering(run, nodes):
            return
        time.sleep(0.5)
    now = run(["sinfo", "-N"], check=False).stdout
    raise ClusterError(f"nodes not idle after {timeout_s:.0f} s:\n{now}\nHINT: read the slurmd logs "
                       f"{logs}/slurmd-*.log and slurmctld.log.")


def cancel_all(run: Run) -> None:
    """Cancel every job, and wait up to 10 s until none runs or completes."""
    ids = run(["squeue", "-h", "-o", "%A"], check=False).stdout.split()
    if ids:
        run(["scancel", "--quiet", *sorted(set(ids))], check=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not run(["squeue", "-h", "-t", "RUNNING,COMPLETING"], check=False).stdout.strip():
            return
        time.sleep(0.3)


def settle(run: Run, nodes: list[str], timeout_s: float, logs: Path) -> None:
    """Cancel every job and wait until each node is idle and answering: the state a test of
    the cluster starts from, whatever the test before it left (a job still running, a node just
    put back in service and not yet responding).

    Halfway through, nodes still held are set DOWN and RESUMEd, as an administrator clears a
    job stuck completing (a step whose end never reached the controller, seen under heavy
    load) or a node a test left drained: SLURM then ends whatever it still places there."""
    cancel_all(run)
    if _idle_within(run, nodes, timeout_s / 2):
        return
    held = [n for n, state in states(run).items() if state != "idle"]
    for state in ("DOWN", "RESUME"):
        run(["scontrol", "update", f"NodeName={','.join(held)}", f"State={state}", "Reason=hpc-settle"],
            check=False)
    if _idle_within(run, nodes, timeout_s / 2):
        return
    raise ClusterError(f"nodes not idle {timeout_s:.0f} s after cancelling every job and setting "
                       f"{','.join(held)} down and back:\n{run(['sinfo', '-N'], check=False).stdout}"
                       f"HINT: read the slurmd logs and slurmctld.log under {logs}.")


def _idle_within(run: Run, nodes: list[str], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = states(run)
        if now and all(now.get(n) == "idle" for n in nodes):
            return True
        time.sleep(0.3)
    return False
