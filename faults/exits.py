"""Normal exits under srun: a 2 x 2 job that trained to the end must never end FAILED.

    python -c "from faults.exits import normal_exits as f; print(f(__import__('pathlib').Path('/tmp/x'), 10, 0))"
    python -c "from faults.exits import normal_exits as f; print(f(__import__('pathlib').Path('/tmp/x'), 10, 0, 'trainloop-fsdp'))"

Each exit is one task of an array job on a local SLURM cluster (hpc.cluster): 2 nodes x 2 tasks,
`srun --kill-on-bad-exit=1`, one of WORKLOADS (plain DDP; TrainLoop under DDP; TrainLoop under FSDP,
whose checkpoints go through the DCP engine's second group), then the process groups are torn
down as every run's are. A task that aborts at exit (gloo's "terminate called without an
active exception" when a peer tears its group down under a send) fails the step, and the job with
it: under `afterok`, every later stage would then never start. Lost: an array task that did not
end COMPLETED, or a rank that did not write its result, or an abort message in a log.

The cluster is faults.nodes.campaign_cluster: started in the scratch directory and stopped at the
end, unless HPC_FAULTS_CLUSTER_DIR names one that is already up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from faults.common import Outcome
from faults.nodes import campaign_cluster

REPO = Path(__file__).resolve().parents[1]
# name -> (what runs, its arguments after the output directory, how the campaign's row says it)
WORKLOADS = {
    "ddp": ("ddp_workload.py train", "--steps 3 --timeout 60", "a 2 x 2 DDP job"),
    "trainloop-ddp": ("exit_workload.py", "--strategy ddp --steps 3",
                      "a 2 x 2 TrainLoop job under DDP, a checkpoint every step"),
    "trainloop-fsdp": ("exit_workload.py", "--strategy fsdp --steps 3",
                       "a 2 x 2 TrainLoop job under FSDP, a DCP checkpoint every step (second gloo group)"),
}
ABORT = "terminate called"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
         "BOOT_FAIL", "DEADLINE"}


def _script(out: Path, workload: str) -> str:
    program, args, _ = WORKLOADS[workload]
    script, *mode = program.split()
    return f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=2 --gres=gpu:2 --cpus-per-task=1 --time=10
#SBATCH --output={out}/%a.log
d={out}/$SLURM_ARRAY_TASK_ID
mkdir -p "$d"
export OMP_NUM_THREADS=1 PYTHONPATH={REPO}:{REPO / "tests"}
srun --kill-on-bad-exit=1 {sys.executable} {REPO / "tests" / script} {" ".join(mode)} "$d" {args}
"""


def _states(job_id: str, env: dict) -> dict[str, str]:
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State"], env=env,
                         capture_output=True, text=True).stdout
    rows = (line.split("|") for line in out.splitlines() if "|" in line)
    return {jid.split("_", 1)[1]: state.split()[0] for jid, state in rows if "_" in jid}


def tally(states: dict[str, str], out: Path, count: int, workload: str = "ddp") -> Outcome:
    """Each array task's exit judged from its sacct state, its ranks' results and its log."""
    outcome = Outcome(0, 0, f"{count} array tasks of {WORKLOADS[workload][2]} (srun --kill-on-bad-exit=1), "
                            f"each trained to its end; each ended COMPLETED with 4 results and no abort")
    for task in range(count):
        state = states.get(str(task), "never ended")
        log = out / f"{task}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        results = len(list((out / str(task)).glob("rank-*.json")))
        problem = ""
        if state != "COMPLETED":
            problem = f"task {task} ended {state}"
        elif results != 4:
            problem = f"task {task}: {results} of 4 ranks wrote their result"
        elif ABORT in text:
            problem = f"task {task}: '{ABORT}' in its log"
        outcome.add(problem)
    return outcome


def normal_exits(scratch: Path, count: int, seed: int, workload: str = "ddp",
                 timeout_s: float | None = None) -> Outcome:
    """Run `count` 2 x 2 jobs of `workload` (WORKLOADS) to their normal end; count those that did not
    end COMPLETED."""
    del seed  # every exit is the same run: the race, not the input, varies
    scratch.mkdir(parents=True, exist_ok=True)
    with campaign_cluster(scratch) as cluster:
        env = {**os.environ, **cluster.env(), "PYTHONPATH": str(REPO)}
        out = scratch / f"exits-{workload}"
        out.mkdir(exist_ok=True)
        script = scratch / f"exits-{workload}.sbatch"
        script.write_text(_script(out, workload))
        job_id = subprocess.run(["sbatch", "--parsable", f"--array=0-{count - 1}", str(script)], env=env,
                                check=True, capture_output=True, text=True).stdout.strip().split(";")[0]
        # a TrainLoop task takes about 20 s on a quiet 2-core machine, three times that on a busy one;
        # a task still running when the time is up counts as lost ("ended RUNNING")
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else max(3600.0, 45.0 * count))
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = _states(job_id, env)
            if len(states) == count and all(s in ENDED for s in states.values()):
                break
            time.sleep(2)
        return tally(states, out, count, workload)
