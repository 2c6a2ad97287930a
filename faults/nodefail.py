"""Node failures: a node dies under a 2-node training job, which hpc requeues without it, from its
newest checkpoint, to the end.

    python -c "from faults.nodefail import node_failures as f; print(f(__import__('pathlib').Path('/tmp/x'), 2, 0))"

Each fault is tests/slurm/test_node_failure.py's first test on a local SLURM cluster (hpc.cluster):
the elastic pipeline (tests/elastic_pipeline.py) trains on nodes=1-2, so 2 x 2 ranks on an idle
cluster; once the checkpoint of step K-1 is committed, every rank waits before step K (K drawn from
the seed), and the last node fails there as faults.nodes plays it (slurmd killed, the job's
processes on it killed, the node marked DOWN). hpc.afterstep must requeue the job with the node in
its ExcNodeList; the node is then brought back, so only the exclusion keeps the job off it, and the
requeued job released from SLURM's begin-time hold.

Lost: a job that did not finish COMPLETED within the bounds, a requeue without the node excluded or
that ran on it, a resumed attempt that did not start from the newest checkpoint committed when the
node failed, or a final model and optimizer further than the elastic tests' ATOL (1e-12: the world
size goes from 4 to 2 ranks, which reorders float64 gradient sums, nothing more) from those of an
uninterrupted 2 x 2 run trained first. The cluster is faults.nodes.campaign_cluster.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

from faults.common import Outcome
from faults.exits import ENDED
from faults.nodes import bring_back, campaign_cluster, fail_node, wait_for
from hpc.cluster import LocalCluster
from hpc.cluster.daemons import ClusterError
from hpc.cluster.preempt import job_field, release_hold
from hpc.recovery.nodefail import load as recovery, progress_mark
from hpc.rundir.run import DONE, RunDir

REPO = Path(__file__).resolve().parents[1]
STARTING = frozenset({"PENDING", "CONFIGURING", "RUNNING"})
STEPS = 5
START_S = 300.0  # a 2 x 2 job with torch to start and commit a checkpoint, on a loaded machine
REQUEUE_S = 90.0  # the failed srun noticed, hpc.afterstep's requeue with the node excluded
FINISH_S = 300.0  # the requeued job to start again and train to the end


def node_failures(scratch: Path, count: int, seed: int) -> Outcome:
    """Fail a node under `count` jobs in turn; count those not finished as the uninterrupted run."""
    rng = random.Random(seed)
    scratch.mkdir(parents=True, exist_ok=True)
    outcome = Outcome(0, 0, f"{count} 2 x 2 DDP jobs (nodes=1-2, {STEPS} steps, a checkpoint a step), each "
                            f"with its last node failed before a step drawn from 2..{STEPS - 1}; each requeued by hpc "
                            "without the node, resumed from its newest checkpoint, COMPLETED with the "
                            "uninterrupted run's model")
    with campaign_cluster(scratch) as cluster:
        cluster.settle()
        ref = _submit(cluster, scratch / "reference")
        wait_for(lambda: (ref.task_dir("train") / DONE).is_file(), START_S, "the uninterrupted reference run")
        reference = ref.task_dir("train") / "final.pt"
        for i in range(count):
            cluster.settle()
            outcome.add(_fault(cluster, scratch / f"fault-{i}", rng.randrange(2, STEPS), reference))
    return outcome


def _submit(cluster: LocalCluster, run_dir: Path, *overrides: str) -> RunDir:
    """The elastic pipeline (named by module: jobs import it from the checkout) submitted to `cluster`."""
    env = {**cluster.client_env(), "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "hpc.submit", "tests.elastic_pipeline", "--cluster", "slurm",
                    "--run-dir", str(run_dir), f"elastic.steps={STEPS}", *overrides],
                   cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return RunDir(run_dir)


def _fault(cluster: LocalCluster, run_dir: Path, hold_at: int, reference: Path) -> str:
    """One node failure at step `hold_at`: '' when the job ended as the uninterrupted one, else what
    went wrong. The node is back in service afterwards, whatever happened."""
    node = cluster.nodes[-1]
    run = _submit(cluster, run_dir, "stages.train.nodes=1-2", f"elastic.hold_at={hold_at}", "elastic.hold_once=true")
    out, (task,) = run.task_dir("train"), run.tasks()
    job = task["job_id"]
    try:
        marker = out / "checkpoints" / f"step-{hold_at - 1}" / "COMPLETE.json"
        wait_for(lambda: marker.is_file() or job_field(cluster, job, "JobState") not in STARTING, START_S,
                 f"the checkpoint of step {hold_at - 1}")
        if not marker.is_file():
            return f"job {job} ended {job_field(cluster, job, 'JobState')} before its checkpoint of step {hold_at - 1}"
        if job_field(cluster, job, "NumNodes") != "2":
            return f"job {job} got {job_field(cluster, job, 'NumNodes')} node(s), not 2: no node to fail"
        fail_node(cluster, node, job)
        newest = progress_mark(out)
        wait_for(lambda: node in job_field(cluster, job, "ExcNodeList"), REQUEUE_S,
                 f"job {job} requeued with {node} excluded")
        bring_back(cluster, node)  # from here on, only the exclusion keeps the job off it
        release_hold(cluster, job, time.monotonic() + 30)
        wait_for(lambda: job_field(cluster, job, "JobState") in ENDED, FINISH_S, f"the requeued job {job} to end")
        return _judge(cluster, job, out, node, newest, reference)
    except (TimeoutError, ClusterError, subprocess.CalledProcessError, OSError) as err:
        return f"fault at step {hold_at}, job {job}: {err}"
    finally:
        cluster.run(["scancel", job], check=False)
        bring_back(cluster, node)


def _judge(cluster: LocalCluster, job: str, out: Path, node: str, newest: int | None, reference: Path) -> str:
    state, nodes = job_field(cluster, job, "JobState"), job_field(cluster, job, "NodeList")
    if state != "COMPLETED" or job_field(cluster, job, "Restarts") != "1":
        return f"job {job} ended {state} after {job_field(cluster, job, 'Restarts')} restart(s), not COMPLETED " \
               f"after 1 ({_last_error(out / 'logs' / job)})"
    if node in nodes:
        return f"job {job} requeued onto the failed {node} ({nodes})"
    history = recovery(out)
    if (history.get("node_failures"), history.get("excluded")) != (1, [node]):
        return f"job {job}: recovery history {history.get('node_failures')} failure(s), " \
               f"excluded {history.get('excluded')}"
    attempts = [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]
    if [a["world_size"] for a in attempts] != [4, 2] or attempts[1]["resumed_from"] != newest:
        return f"job {job}: attempts {attempts}, newest checkpoint at the failure step-{newest}"
    return _model_difference(out / "final.pt", reference)


def _last_error(logs: Path) -> str:
    """The last exception a rank raised, as its log says it ("[rank0]: StoreLocked: ..."), cut short."""
    found = [line for log in sorted(logs.glob("*_log.err")) for line in log.read_text(errors="replace").splitlines()
             if re.match(r"\[rank\d+\]: [\w.]+(Error|Locked|Exception|Corrupt)\b", line)]
    return found[-1][:300] if found else f"no exception in {logs}"


def _model_difference(final: Path, reference: Path) -> str:
    sys.path.insert(0, str(REPO / "tests"))  # test_fsdp imports its neighbours by name
    from test_fsdp import ATOL, load, max_difference

    try:
        diff = max_difference(load(final), load(reference))
    except AssertionError as err:
        return f"{final}: another structure than the uninterrupted run's ({err})"
    return "" if diff <= ATOL else f"{final}: {diff:.3g} from the uninterrupted run's, more than {ATOL:g}"
