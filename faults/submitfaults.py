"""A controller that loses sbatch's and squeue's answers: submissions and resubmissions that must queue each task once.

    python -c "from faults.submitfaults import queued_then_timeout as f; print(f(__import__('pathlib').Path('/tmp/x'), 4, 0))"
    python -c "from faults.submitfaults import empty_squeue as f; print(f(__import__('pathlib').Path('/tmp/y'), 1, 0))"

Both play tests/slurm/test_submit_once.py and tests/slurm/test_flaky_controller.py on a local SLURM
cluster with accounting (faults.nodes.campaign_cluster) whose nodes are drained, so that nothing
runs: the tiny pipeline (tests/tiny_pipeline.py: stage `first`, 1 task, then `second`, an array of
2) submitted with `python -m hpc.submit` with the real clients wrapped by faults.slurmshim.

queued_then_timeout: each round's sbatch calls (the first, the second or both) run the real sbatch
and then report `Socket timed out`, or one sbatch call (the first or the second) times out without
queueing. Counted per round: a job lost (the submission failed, or a task of the manifest has no
job in squeue), a job submitted twice (squeue shows two jobs with one hpc:<token> comment, or with
one job name), and the manifest's ids against squeue's.

empty_squeue: a queued run submitted again while squeue answers nothing once and sacct fails
(slurmdbd down), which must submit nothing; then while squeue answers nothing twice, which must
refuse with a HINT and submit nothing.
"""
from __future__ import annotations

import random
import subprocess
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

from faults.common import Outcome
from faults.nodes import campaign_cluster
from faults.slurmshim import DBD_DOWN, EMPTY, QUEUED_THEN_TIMEOUT, TIMEOUT, SlurmShim
from hpc.cluster import LocalCluster
from hpc.rundir.run import RunDir
from tests.slurm.test_flaky_controller import _hpc

PARTS = "tiny.parts=[0,1]"
# (which sbatch calls fail, how): 1 is `first`'s sbatch, 2 `second`'s array (or the retry of call 1)
ROUNDS = [((1,), QUEUED_THEN_TIMEOUT, "first queued, then timed out"),
          ((2,), QUEUED_THEN_TIMEOUT, "second queued, then timed out"),
          ((1, 2), QUEUED_THEN_TIMEOUT, "both queued, then timed out"),
          ((1,), TIMEOUT, "first timed out unqueued"), ((2,), TIMEOUT, "second timed out unqueued")]


@contextmanager
def drained(scratch: Path) -> Iterator[LocalCluster]:
    """The campaign's cluster with every node drained (nothing runs), put back in service after."""
    with campaign_cluster(scratch) as cluster:
        nodes = ",".join(cluster.nodes)
        cluster.run(["scontrol", "update", f"NodeName={nodes}", "State=DRAIN", "Reason=faults-submission"])
        try:
            yield cluster
        finally:
            cluster.run(["scontrol", "update", f"NodeName={nodes}", "State=RESUME"], check=False)


def queued(cluster: LocalCluster, folder: Path) -> List[Tuple[str, str, str]]:
    """(job id (an array's first), comment, job name) of every job in the queue whose script lies under `folder`."""
    out = cluster.run(["squeue", "-h", "-t", "all", "-o", "%F|%k|%j|%o"]).stdout
    return sorted({tuple(line.split("|", 3)[:3]) for line in out.splitlines() if str(folder) in line})


def cancel(cluster: LocalCluster, folder: Path) -> None:
    ids = sorted({job for job, _, _ in queued(cluster, folder)})
    if ids:
        cluster.run(["scancel", *ids], check=False)


def submit(cluster: LocalCluster, run_dir: Path, shim: SlurmShim) -> subprocess.CompletedProcess:
    return _hpc("hpc.submit", "tiny", "--cluster", "slurm", "--run-dir", str(run_dir), PARTS,
                env=shim.env(cluster.client_env()))


def twice(jobs: List[Tuple[str, str, str]]) -> List[str]:
    """The tokens and job names that more than one queued job carries."""
    tokens = Counter(comment for _, comment, _ in jobs if comment.startswith("hpc:"))
    names = Counter(name for _, _, name in jobs)
    return [f"{what} on {n} jobs" for what, n in (tokens + names).items() if n > 1]


def recorded(run_dir: Path) -> Dict[str, str]:
    try:
        return {f"{t['stage']}[{t['item']}]": t.get("job_id") or "" for t in RunDir(run_dir).tasks()}
    except Exception:  # no manifest: the submission never got that far
        return {}


def queued_then_timeout(scratch: Path, count: int, seed: int) -> Outcome:
    """`count` submissions, each with the sbatch faults of one of ROUNDS (in an order drawn from `seed`)."""
    order = [ROUNDS[i % len(ROUNDS)] for i in range(count)]
    random.Random(seed).shuffle(order)
    faults = lost = dup = mismatched = 0
    first = ""
    with drained(scratch) as cluster:
        for i, (calls, fault, what) in enumerate(order):
            root = scratch / f"round-{i}"
            shim = SlurmShim(root / "shim").rule("sbatch", calls, fault)
            try:
                out = submit(cluster, root / "run", shim)
                faults += len(calls)
                jobs, ids = queued(cluster, root), recorded(root / "run")
                bases = {job for job, _, _ in jobs}
                missing = [t for t, job in ids.items() if not job or job.split("_")[0] not in bases]
                problem = [f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}"] if out.returncode else []
                problem += [f"{len(ids)} tasks recorded, not 3"] if len(ids) != 3 else []
                problem += [f"{t} has no queued job" for t in missing]
                doubled = twice(jobs)
                if sorted(bases) != sorted({job.split("_")[0] for job in ids.values() if job}):
                    mismatched += 1
                    problem.append(f"manifest {ids} against squeue {sorted(bases)}")
                lost += bool(out.returncode or missing or len(ids) != 3)
                dup += bool(doubled) or len(bases) > 2
                if problem or doubled or len(bases) > 2:
                    first = first or f"round {i} ({what}): " + "; ".join(problem + doubled + [f"squeue {jobs}"])
            finally:
                cancel(cluster, root)
    detail = (f"{count} submissions of a 2-stage pipeline (1 task, then an array of 2) with `python -m hpc.submit`, "
              f"nodes drained; per round one of: {', '.join(w for _, _, w in ROUNDS)}; "
              f"{faults} sbatch faults; jobs lost: {lost}; submitted twice (one token or job name on two "
              f"queued jobs): {dup}; manifests not matching squeue: {mismatched}")
    return Outcome(faults, lost + dup + mismatched, detail + (f"; first problem: {first}" if first else ""))


def empty_squeue(scratch: Path, count: int, seed: int) -> Outcome:
    """`count` queued runs, each submitted again while squeue answers nothing once, then twice, and sacct fails."""
    empty = failed = lost = dup = refused = 0
    first = ""
    with drained(scratch) as cluster:
        for i in range(count):
            root = scratch / f"round-{i}"
            try:
                out = submit(cluster, root / "run", SlurmShim(root / "plain"))
                before = recorded(root / "run")
                if out.returncode or len(before) != 3:
                    raise RuntimeError(f"the first submission failed: {out.stderr.strip().splitlines()[-1:]}")
                for empties in (1, 2):
                    shim = SlurmShim(root / f"shim-{empties}").rule("squeue", range(1, empties + 1), EMPTY)
                    shim.rule("sacct", range(1, 1000), DBD_DOWN)
                    out = submit(cluster, root / "run", shim)
                    empty, failed = empty + empties, failed + len(shim.calls("sacct"))
                    jobs, sbatch = queued(cluster, root), shim.calls("sbatch")
                    bases = {job for job, _, _ in jobs}
                    missing = [t for t, job in before.items() if job.split("_")[0] not in bases]
                    refusal = out.returncode == 2 and "HINT: " in out.stderr and "Traceback" not in out.stderr
                    refused += empties == 2 and refusal
                    problem = [f"{t} has no queued job" for t in missing]
                    problem += [f"{len(sbatch)} sbatch calls"] if sbatch or len(bases) > 2 else []
                    problem += [f"manifest changed: {recorded(root / 'run')}"] if recorded(root / "run") != before \
                        else []
                    if (empties == 1 and out.returncode) or (empties == 2 and not refusal):
                        problem.append(f"exit {out.returncode}: {out.stderr.strip().splitlines()[-2:]}")
                    lost += bool(missing)
                    dup += bool(sbatch) or len(bases) > 2 or bool(twice(jobs))
                    if problem and not first:
                        first = f"round {i}, squeue empty {empties}x: " + "; ".join(problem)
            finally:
                cancel(cluster, root)
    detail = (f"{count} queued runs of a 2-stage pipeline (1 task, then an array of 2), nodes drained, submitted "
              f"again with `python -m hpc.submit` while sacct fails (slurmdbd down) and squeue answers nothing "
              f"once (must submit nothing), then twice (must refuse with a HINT); {empty} empty squeue answers and "
              f"{failed} failed sacct calls; refusals: {refused} of {count}; jobs lost: {lost}; "
              f"tasks submitted twice: {dup}")
    wrong = lost + dup + (count - refused)
    return Outcome(empty + failed, wrong, detail + (f"; first problem: {first}" if first else ""))
