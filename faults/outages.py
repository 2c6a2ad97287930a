"""The local cluster's own daemons stopped under runs: slurmctld restarted mid-training, slurmdbd down for a minute.

    python -m faults.reliability --only 'stopped'
    python -c "from faults.outages import ctld_restarts as f; print(f(__import__('pathlib').Path('/tmp/x'), 2, 0))"

Each plays tests/slurm/test_controller_outages.py on more runs, through `python -m hpc.submit` and
`python -m hpc.status` with the real clients wrapped by faults.slurmshim (no faults: it counts the
calls), the daemons stopped with SIGTERM and started again as they were (LocalCluster.stop_daemon).

ctld_restarts: the `run` pipeline's counting script on 2 ranks (tests/slurm/requeue_helpers.py);
once both ranks step, slurmctld is stopped for 3 to 15 s (drawn from the seed) and started again,
then the job is preempted (hpc.cluster.preempt) or reaches SLURM's own time-limit warning (a 2-minute
limit, the warning 60 s before it), alternately. Counted as lost: a job not COMPLETED with every step
of both ranks done, ranks that did not step while slurmctld was down, or a stop record that does not
say the job was requeued for that stop; submitted twice: more than one sbatch call or manifest job;
rerun after completing: a job restarted more than once.

dbd_outage: the tiny pipeline (tests/tiny_pipeline.py: `first`, then an array of 3) on a cluster
with accounting that forgets an ended job after 5 s (MinJobAge), second[2] working until a file
appears; with the others done, slurmdbd is stopped for 60 s. Meanwhile hpc.status must answer
within 15 s saying accounting is unreachable, with every state right, and the run submitted again
(before and after second[2] ends) must submit nothing; then the run completes. Counted as lost: a
task not COMPLETED, a wrong or slow status; submitted twice: an sbatch call after the first
submission, or a second job in the manifest; rerun after completing: accounting (sacct -D, once
slurmdbd is back) showing a job started twice.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

from faults.common import Outcome
from faults.exits import ENDED
from faults.nodes import campaign_cluster, wait_for
from faults.slurmshim import SlurmShim
from hpc.cluster import LocalCluster
from hpc.cluster.daemons import ClusterError
from hpc.cluster.preempt import job_field, preempt, release_hold
from hpc.rundir.run import RunDir
from tests.slurm.requeue_helpers import events, steps_of
from tests.slurm.test_controller_outages import SCRIPT, STEPS, TIME_LIMIT, name
from tests.slurm.test_flaky_controller import _hpc

REPO = Path(__file__).resolve().parents[1]
DOWN_S = (3, 15)  # slurmctld down for this many seconds, drawn
OUTAGE_S = 60.0  # slurmdbd down for this long
STATUS_S = 15.0  # hpc.status must answer within this while slurmdbd is down


class Tally:
    """Runs, faults, and the three ways a run goes wrong, with the first problem seen."""

    def __init__(self) -> None:
        self.runs = self.faults = self.lost = self.twice = self.rerun = 0
        self.first = ""

    def judge(self, what: str, lost: List[str], twice: List[str], rerun: List[str]) -> None:
        self.lost, self.twice, self.rerun = self.lost + bool(lost), self.twice + bool(twice), self.rerun + bool(rerun)
        if (lost or twice or rerun) and not self.first:
            self.first = f"{what}: " + "; ".join(lost + twice + rerun)

    def outcome(self, detail: str) -> Outcome:
        detail += (f"; runs submitted: {self.runs}; faults injected: {self.faults}; jobs lost: {self.lost}; "
                   f"jobs submitted twice: {self.twice}; tasks rerun after completing: {self.rerun}")
        return Outcome(self.faults, self.lost + self.twice + self.rerun,
                       detail + (f"; first problem: {self.first}" if self.first else ""))


# ------------------------------------------------------------------ slurmctld restarted mid-training
def ctld_restarts(scratch: Path, count: int, seed: int) -> Outcome:
    """`count` runs, each with slurmctld restarted mid-training, then a preemption or the time-limit warning."""
    rng = random.Random(seed)
    stops = ["preempt" if i % 2 == 0 else "timeout" for i in range(count)]
    rng.shuffle(stops)
    tally = Tally()
    with campaign_cluster(scratch) as cluster:
        for i, stop in enumerate(stops):
            cluster.settle()
            down_s = rng.randint(*DOWN_S)
            tally.runs, tally.faults = tally.runs + 1, tally.faults + 2
            tally.judge(f"run {i} (slurmctld down {down_s} s, then {stop})",
                        *_restart(cluster, scratch / f"run-{i}", stop, down_s))
    return tally.outcome(f"{count} `run` jobs of 2 ranks ({STEPS} steps), each with slurmctld stopped for "
                         f"{DOWN_S[0]} to {DOWN_S[1]} s mid-training and started again, then preempted or at "
                         "SLURM's time-limit warning (alternately); each must step on meanwhile, be requeued by "
                         "hpc with a record saying so, resume and complete, submitted once, restarted once")


def _restart(cluster: LocalCluster, root: Path, stop: str, down_s: int) -> Tuple[List[str], List[str], List[str]]:
    """One run: (lost, submitted twice, rerun after completing) problems, each list empty when right."""
    shim = SlurmShim(root / "shim")
    (root / "count.py").write_text(SCRIPT)
    run_dir, ckpt = root / "run", root / "run" / "main" / "checkpoints"
    subprocess.run([sys.executable, "-m", "hpc.submit", "run", "--cluster", "slurm", "--run-dir", str(run_dir),
                    "--nodes", "1", "--gpus-per-node", "2", "stages.main.cpus_per_task=1", "stages.main.partition=low",
                    *(TIME_LIMIT if stop == "timeout" else ()), "--", sys.executable, str(root / "count.py")],
                   cwd=REPO, env=shim.env(cluster.client_env()), check=True, capture_output=True, text=True)
    job = RunDir(run_dir).tasks()[0]["job_id"]
    lost: List[str] = []
    try:
        wait_for(lambda: min(steps_of(ckpt, 0), steps_of(ckpt, 1)) >= 3, 120, f"job {job} stepping")
        cluster.stop_daemon("slurmctld")
        before = steps_of(ckpt, 1)
        time.sleep(down_s)
        if steps_of(ckpt, 1) <= before:
            lost.append(f"the ranks did not step while slurmctld was down ({before} steps)")
        cluster.start_daemon("slurmctld")
        if stop == "preempt":
            preempt(cluster, job, release=True)
        else:
            wait_for(lambda: events(ckpt), 150, f"job {job}'s decision at the time-limit warning")
            wait_for(lambda: job_field(cluster, job, "Restarts") == "1", 60, f"job {job} requeued")
            release_hold(cluster, job, time.monotonic() + 30)
        wait_for(lambda: job_field(cluster, job, "JobState") in ENDED, 180, f"job {job} to end")
    except (TimeoutError, ClusterError, OSError) as err:
        return lost + [f"job {job}: {err}"], [], []
    finally:
        cluster.start_daemon("slurmctld")  # returns at once if it runs
        cluster.run(["scancel", job], check=False)
    state, restarts = job_field(cluster, job, "JobState"), job_field(cluster, job, "Restarts")
    if state != "COMPLETED" or (steps_of(ckpt, 0), steps_of(ckpt, 1)) != (STEPS, STEPS):
        lost.append(f"job {job} {state}, steps {steps_of(ckpt, 0)} and {steps_of(ckpt, 1)} of {STEPS}")
    said = [(e.get("kind"), e.get("requeue"), e.get("slurm")) for e in events(ckpt)]
    if [(kind, requeue) for kind, requeue, _ in said] != [(stop, True)] or not all(s for _, _, s in said):
        lost.append(f"job {job}'s stop record says {said}, expected one {stop} requeued, with what SLURM did")
    jobs = [j["job_id"] for t in RunDir(run_dir).tasks() for j in t["jobs"]]
    twice = [] if len(jobs) == 1 and len(shim.calls("sbatch")) == 1 else \
        [f"job {job}: manifest jobs {jobs}, {len(shim.calls('sbatch'))} sbatch calls"]
    rerun = [] if restarts == "1" else [f"job {job} restarted {restarts} times for one stop"]
    return lost, twice, rerun


# ------------------------------------------------------------------ slurmdbd down for a minute
PARTS = ["tiny.parts=[0,1,2]", "tiny.slow_items=[2]"]
DONE_BUT_LAST = {"first": "COMPLETED", "second[0]": "COMPLETED", "second[1]": "COMPLETED", "second[2]": "RUNNING"}


def dbd_outage(scratch: Path, count: int, seed: int) -> Outcome:
    """`count` tiny runs, each with slurmdbd stopped for OUTAGE_S while its last task works."""
    tally, took = Tally(), [0.0]
    with campaign_cluster(scratch, min_job_age_s=5) as cluster:
        for i in range(count):
            cluster.settle()
            tally.runs, tally.faults = tally.runs + 1, tally.faults + 1
            tally.judge(f"run {i}", *_outage(cluster, scratch / f"run-{i}", took))
    return tally.outcome(f"{count} runs of a 2-stage pipeline (1 task, then an array of 3), on a cluster with "
                         "accounting that forgets ended jobs after 5 s, each with slurmdbd stopped for "
                         f"{OUTAGE_S:.0f} s while its last task works: hpc.status answering from squeue within "
                         f"{STATUS_S:.0f} s with every state right and 'accounting unreachable', and the run "
                         "submitted again twice (while the last task works, once all are done) submitting nothing; "
                         f"slowest status while slurmdbd was down: {max(took):.1f} s")


def _states(run_dir: Path, env: Dict[str, str]) -> Tuple[float, Dict[str, str], str]:
    """(seconds hpc.status took, its states by task, its stderr)."""
    start = time.monotonic()
    out = _hpc("hpc.status", str(run_dir), "--json", env=env)
    took = time.monotonic() - start
    return took, ({r["task"]: r["state"] for r in json.loads(out.stdout)} if out.returncode == 0 else {}), out.stderr


def _outage(cluster: LocalCluster, root: Path, took: List[float]) -> Tuple[List[str], List[str], List[str]]:
    """One run (`took` gets how long its status took while slurmdbd was down): the problems, as _restart's."""
    shim, go = SlurmShim(root / "shim"), root / "go"
    args = ["tiny", "--cluster", "slurm", "--run-dir", str(root / "run"), *PARTS, f"tiny.release_file={go}"]
    env = shim.env(cluster.client_env())
    lost: List[str] = []
    if _hpc("hpc.submit", *args, env=env).returncode:
        return ["the first submission failed"], [], []
    jobs = {name(t): t["job_id"] for t in RunDir(root / "run").tasks()}
    try:
        wait_for(lambda: _states(root / "run", env)[1] == DONE_BUT_LAST, 180, "second[2] working alone", poll_s=2)
        cluster.stop_daemon("slurmdbd")
        down = time.monotonic()
        seconds, states, said = _states(root / "run", env)
        took.append(seconds)
        if seconds > STATUS_S or states != DONE_BUT_LAST or said.count("accounting unreachable") != 1:
            lost.append(f"status while slurmdbd is down: {seconds:.1f} s, {states}, {said.strip().splitlines()[-3:]}")
        for last in ("RUNNING", "COMPLETED"):
            again = _hpc("hpc.submit", *args, env=env)
            if again.returncode:
                lost.append(f"resubmission while second[2] is {last}: exit {again.returncode}, "
                            f"{again.stderr.strip().splitlines()[-1:]}")
            go.write_text("")
            wait_for(lambda: _states(root / "run", env)[1].get("second[2]") == "COMPLETED", 120,
                     "second[2] to finish while slurmdbd is down", poll_s=2)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))
    except TimeoutError as err:
        lost.append(str(err))
    finally:
        cluster.start_daemon("slurmdbd")
    try:  # sacct may still show a job that ended in the outage as running, until slurmctld has told slurmdbd
        wait_for(lambda: set(_states(root / "run", env)[1].values()) == {"COMPLETED"}, 60,
                 "the run to read complete once slurmdbd is back", poll_s=2)
    except TimeoutError as err:
        lost.append(f"{err}: {_states(root / 'run', env)[1]}")
    after = {name(t): [j["job_id"] for j in t["jobs"]] for t in RunDir(root / "run").tasks()}
    twice = [f"{len(shim.calls('sbatch'))} sbatch calls"] if len(shim.calls("sbatch")) != 2 else []
    twice += [f"manifest {after}, was {jobs}"] if after != {t: [j] for t, j in jobs.items()} else []
    return lost, twice, _started_twice(cluster, list(jobs.values()))


def _started_twice(cluster: LocalCluster, jobs: List[str]) -> List[str]:
    """Jobs that accounting shows started more than once (sacct -D: a record per start), once it has
    heard of every job's end (slurmctld sends what slurmdbd missed when it is back)."""
    try:
        starts = wait_for(lambda: _ended_starts(cluster, jobs), 90, "accounting to hear of every job's end")
    except TimeoutError as err:
        return [str(err)]
    return [f"{job} started {len(starts[job])} times ({', '.join(starts[job])})"
            for job in jobs if len(starts[job]) > 1]


def _ended_starts(cluster: LocalCluster, jobs: List[str]) -> Dict[str, List[str]]:
    """Each job's states, one per start, from sacct; {} until every job's last one is COMPLETED."""
    out = cluster.run(["sacct", "-X", "-D", "-P", "-n", "-o", "JobID,State", "-j",
                       ",".join(sorted({j.split("_")[0] for j in jobs}))], check=False).stdout
    starts: Dict[str, List[str]] = {}
    for line in out.splitlines():
        job, _, state = line.partition("|")
        starts.setdefault(job, []).append(state.split(" ")[0])
    return starts if all(starts.get(j, [""])[-1] == "COMPLETED" for j in jobs) else {}
