"""Restarts in place under repeated failures: one job's ranks killed or hung again and again, each time
restarted by hpc's srun wrapper as a new srun step of the same allocation, from its checkpoint.

    python -c "from faults.inplace import repeated_restarts as f; print(f(__import__('pathlib').Path('/tmp/x'), 1, 0))"

Each job is tests/inplace_pipeline.py (1 node x 2 DDP ranks, STEPS steps, a checkpoint every step) on a
local SLURM cluster. In its first FAILURES srun steps one rank fails a few steps further on each time
(steps and rank drawn from the seed), killed (SIGKILL) or stopped (SIGSTOP: a hang the others'
watchdog ends) in turn, the first kind drawn; max_restarts_in_place is the default, 3.

Lost: a job that did not end COMPLETED as ONE job with no requeue (SLURM's Restarts 0); fewer or more
restarts in place in the task's history than failures; a step trained twice or not at all by the
steps that count (each step's samples from the last step that ran it must be the uninterrupted
run's); an optimizer that counted another number of steps than STEPS (a step double-counted across
restarts); or a final model and optimizer not bitwise the uninterrupted run's.
"""
from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

from faults.common import Outcome
from faults.nodes import campaign_cluster, wait_for
from hpc.cluster import LocalCluster
from hpc.cluster.preempt import job_field
from hpc.recovery.nodefail import load as recovery
from hpc.rundir.run import DONE, RunDir

REPO = Path(__file__).resolve().parents[1]
STEPS, FAILURES = 12, 3
BOUND_S = 420.0  # start-up, 3 failures (a hang's watchdog and gathering), 3 restarts, on a loaded machine
DETAIL = ("{count} 1 x 2 DDP jobs ({steps} steps, a checkpoint a step), each with a rank killed or hung in turn in "
          "{failures} srun steps of one allocation, a few steps apart; each restarted in place every time, ONE job "
          "with no requeue, every step trained once, the optimizer at {steps} steps, bitwise the uninterrupted "
          "run's model")


def repeated_restarts(scratch: Path, count: int, seed: int) -> Outcome:
    """`count` jobs, each failed FAILURES times in turn; count those not finished as the uninterrupted run."""
    outcome = Outcome(0, 0, DETAIL.format(count=count, steps=STEPS, failures=FAILURES))
    draw = random.Random(seed)
    scratch.mkdir(parents=True, exist_ok=True)
    with campaign_cluster(scratch) as cluster:
        reference = _reference(cluster, scratch / "reference")
        for i in range(count):
            cluster.settle()
            kinds = draw.choice(["kill-hang", "hang-kill"])
            faults = [f"inplace.fault={kinds}", f"inplace.fault_at={draw.randrange(2, 4)}",
                      f"inplace.fault_every={draw.randrange(2, 4)}", f"inplace.fault_rank={draw.randrange(2)}"]
            run = _submit(cluster, scratch / f"fault-{i}", f"inplace.fault_steps={FAILURES}", *faults)
            outcome.add(_judge(cluster, run, reference))
    return outcome


def _reference(cluster: LocalCluster, run_dir: Path) -> Path:
    """The uninterrupted run's task directory, once it has finished."""
    cluster.settle()
    out = _submit(cluster, run_dir).task_dir("train")
    wait_for(lambda: (out / DONE).is_file(), BOUND_S, "the uninterrupted reference run")
    return out


def _submit(cluster: LocalCluster, run_dir: Path, *overrides: str) -> RunDir:
    env = {**cluster.client_env(), "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "hpc.submit", "tests.inplace_pipeline", "--cluster", "slurm",
                    "--run-dir", str(run_dir), "stages.train.nodes=1", f"inplace.steps={STEPS}", *overrides],
                   cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return RunDir(run_dir)


def _judge(cluster: LocalCluster, run: RunDir, reference: Path) -> str:
    """'' when the job ended as it must, else what went wrong."""
    out, (task,) = run.task_dir("train"), run.tasks()
    job = task["job_id"]
    try:
        wait_for(lambda: (out / DONE).is_file() or _state(cluster, job) in ("FAILED", "CANCELLED", "TIMEOUT"),
                 BOUND_S, f"job {job} to finish")
    except TimeoutError as err:
        cluster.run(["scancel", job], check=False)
        return str(err)
    state, restarts = _state(cluster, job), job_field(cluster, job, "Restarts")
    if state not in ("COMPLETED", "RUNNING", "COMPLETING") or restarts != "0" or not (out / DONE).is_file():
        return f"job {job} {state} after {restarts} requeue(s)"
    events = [e for e in recovery(out).get("events", []) if e.get("kind") == "restart_in_place"]
    if len(events) != FAILURES:
        return f"job {job}: {len(events)} restart(s) in place for {FAILURES} failures: {[e.get('why') for e in events]}"
    return _same(out, reference)


def _same(out: Path, reference: Path) -> str:
    sys.path.insert(0, str(REPO / "tests"))  # test_fsdp imports its neighbours by name
    from test_fsdp import load, max_difference

    from tests.slurm.test_restart_in_place import per_step

    ids, _ = per_step(out)
    want, _ = per_step(reference)
    if ids != want:
        wrong = sorted(s for s in set(ids) | set(want) if ids.get(s) != want.get(s))
        return f"{out}: steps {wrong} trained on other samples than the uninterrupted run's (or not at all)"
    final = load(out / "final.pt")
    counted = {int(v["step"]) for v in final["optimizer"]["state"].values()}
    if counted != {STEPS}:
        return f"{out}: the optimizer counted {sorted(counted)} steps, not {STEPS}"
    diff = max_difference(final, load(reference / "final.pt"))
    return "" if diff == 0 else f"{out}: final state {diff:.3g} from the uninterrupted run's, not bitwise equal"


def _state(cluster: LocalCluster, job: str) -> str:
    return job_field(cluster, job, "JobState")
