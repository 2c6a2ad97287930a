"""A site that enforces a QOS submit limit: runs past it refused before any sbatch, runs within it run.

    python -m faults.reliability --only 'QOS submit limit'
    python -c "from faults.qoslimits import qos_limits as f; print(f(__import__('pathlib').Path('/tmp/x'), 2, 0))"

On a local cluster of its own with limits enforced (LocalCluster(limits=True): AccountingStorageEnforce
=associations,limits,qos, the user in account `hpc` under QOS normal), each round sets QOS normal's
MaxSubmitJobsPerUser to N (2 to 4, drawn from the seed) with sacctmgr, as a site admin does, then
submits with `python -m hpc.submit` (the real clients wrapped by faults.slurmshim, counting the calls;
a user cache of the round's own, so the limit is read afresh) the tiny pipeline (tests/tiny_pipeline.py)
twice: with an array of N (N + 1 jobs), which must be refused with exit 2 and one line naming the
limit and both numbers, before any sbatch, nothing queued; then with an array of N - 1 (N jobs), which
must be queued whole and complete.

Counted as lost: a refusal that is not that one line, or a run within the limit that is refused or
does not complete; submitted twice: any sbatch of the refused run (a half-submitted run), or more
than one job per task of the run within; rerun after completing: a task of it whose job started
twice (accounting's sacct -D).
"""
from __future__ import annotations

import getpass
import random
from pathlib import Path
from typing import List, Tuple

from faults.common import Outcome
from faults.nodes import campaign_cluster, wait_for
from faults.outages import Tally, _ended_starts
from faults.slurmshim import SlurmShim
from hpc.cluster import LocalCluster
from hpc.rundir.run import RunDir
from tests.slurm.test_flaky_controller import _hpc

LIMITS = (2, 4)  # MaxSubmitJobsPerUser, drawn


def qos_limits(scratch: Path, count: int, seed: int) -> Outcome:
    """`count` rounds, each a run past a QOS limit set with sacctmgr and a run within it."""
    rng = random.Random(seed)
    tally = Tally()
    with campaign_cluster(scratch, limits=True, nodes=2, gpus_per_node=2, cpus_per_node=4) as cluster:
        for i in range(count):
            limit = rng.randint(*LIMITS)
            cluster.run(["sacctmgr", "-i", "modify", "qos", "where", "name=normal", "set",
                         f"MaxSubmitJobsPerUser={limit}"])
            tally.runs, tally.faults = tally.runs + 2, tally.faults + 1
            tally.judge(f"round {i} (MaxSubmitJobsPerUser={limit})", *_round(cluster, scratch / f"round-{i}", limit))
            cluster.settle()
    return tally.outcome(f"{count} rounds on a cluster enforcing limits (AccountingStorageEnforce), each with QOS "
                         f"normal's MaxSubmitJobsPerUser set by sacctmgr to {LIMITS[0]} to {LIMITS[1]}: a 2-stage "
                         "pipeline of limit + 1 jobs (1 task, then an array of limit) refused in one line naming "
                         "the limit and the numbers, before any sbatch, nothing queued; one of limit jobs queued "
                         "whole and completed")


def queued(cluster: LocalCluster) -> List[str]:
    return cluster.run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i"]).stdout.split()


def _round(cluster: LocalCluster, root: Path, limit: int) -> Tuple[List[str], List[str], List[str]]:
    """A run past `limit`, then one within it: (lost, submitted twice, rerun after completing) problems."""
    shim = SlurmShim(root / "shim")
    env = {**shim.env(cluster.client_env()), "HPC_CACHE_DIR": str(root / "cache")}
    lost: List[str] = []

    def submit(run: str, items: int):
        parts = ",".join(str(i) for i in range(items))
        return _hpc("hpc.submit", "tiny", "--cluster", "slurm", "--run-dir", str(root / run), f"tiny.parts=[{parts}]",
                    env=env)

    out = submit("past", limit)
    said = out.stderr.strip().splitlines()
    words = [f"this run needs {limit + 1} jobs in the queue at once (1 + an array of {limit})",
             f"QOS normal's MaxSubmitJobsPerUser allows {limit} per user", "HINT:"]
    if out.returncode != 2 or len(said) != 1 or not all(w in said[0] for w in words):
        lost.append(f"past the limit: exit {out.returncode}, said {said[-3:]}")
    twice = [f"the refused run: {len(shim.calls('sbatch'))} sbatch calls, queued {queued(cluster)}"] \
        if shim.calls("sbatch") or queued(cluster) else []
    out = submit("within", limit - 1)
    if out.returncode:
        return lost + [f"within the limit: exit {out.returncode}, {out.stderr.strip().splitlines()[-1:]}"], twice, []
    tasks = RunDir(root / "within").tasks()
    jobs = [t["job_id"] for t in tasks]
    if len(shim.calls("sbatch")) != 2 or any(len(t["jobs"]) != 1 for t in tasks) or len(tasks) != limit:
        twice.append(f"the run within: {len(shim.calls('sbatch'))} sbatch calls, manifest {tasks}")
    try:
        starts = wait_for(lambda: _ended_starts(cluster, jobs), 180, "the run within the limit to complete", 1)
    except TimeoutError as err:
        return lost + [str(err)], twice, []
    rerun = [f"{job} started {len(starts[job])} times" for job in jobs if len(starts[job]) > 1]
    return lost, twice, rerun
