"""Elastic resume on the real local cluster: a 2 x 2 job preempted mid-training, resubmitted as 1 x 2.

    python -m pytest tests/slurm/test_elastic_cluster.py -m slurm

The workload (tests/elastic_pipeline.py over tests/elastic_workload.py) trains a float64 model on a
global batch of 12 samples a step: 4 ranks take 3 each, 2 ranks 6 each, through one shared epoch
order. The job holds before step HOLD_AT until it is preempted, so the preemption always lands
mid-training, and only once the checkpoint of step HOLD_AT - 1 is committed. SLURM requeues it; the
requeued job is cancelled and the stage resubmitted into the same run directory with
stages.train.nodes=1 (what a smaller profile does), so it resumes on 2 ranks instead of 4.

Compared with an uninterrupted 2 x 2 run: the samples of every global step exactly (as sets: the
ranks split a step's samples another way), the losses and the final model and optimizer within
ATOL = 1e-12. Why that tolerance: in float64 a world size change alters only the order in which
the per-rank gradient sums are added (4 partial sums of 3 samples against 2 of 6), each addition
rounding at ~1e-16 relative; over 8 AdamW steps of this small model the drift stays orders of
magnitude below 1e-12, while any real error (a skipped or repeated sample, a lost optimizer or LR
schedule state, a wrong accumulation) moves the loss by more than 1e-4. Before the resume, steps run
at the reference's own world size and must match it bitwise.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpc import submit
from hpc.cluster.preempt import job_field, preempt
from hpc.rundir.run import DONE, RunDir
from tests.slurm.test_pipeline import ended, wait_until
from tests.slurm.pipelines import use_pipelines

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from test_fsdp import ATOL, load, max_difference  # noqa: E402

pytestmark = pytest.mark.slurm
STEPS, HOLD_AT = 8, 3


elastic = use_pipelines(elastic="tests.elastic_pipeline")


def submit_train(run_dir: Path, *overrides: str) -> RunDir:
    assert submit.main(["elastic", "--cluster", "slurm", "--run-dir", str(run_dir), *overrides]) == 0
    return RunDir(run_dir)


def job_id(run: RunDir) -> str:
    (task,) = run.tasks()
    return task["job_id"]


def finished(run: RunDir) -> dict:
    records = wait_until(lambda: ended(run), timeout_s=180, what="the training job to end")
    (record,) = records.values()
    assert record.state == "COMPLETED", record
    return json.loads((run.task_dir("train") / DONE).read_text())


def attempts(out: Path) -> list:
    return [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]


def per_step(out: Path) -> tuple:
    """{step: sorted sample ids} and {step: loss}, each step from the last attempt that ran it."""
    ids, losses = {}, {}
    for attempt in attempts(out):  # in order: a later attempt's steps replace an earlier one's
        tag, seen = attempt["tag"], {}
        for log in out.glob(f"ids-{tag}*.jsonl"):
            for entry in map(json.loads, log.read_text().splitlines()):
                seen.setdefault(entry["step"], []).extend(entry["ids"])
        ids.update({step: sorted(v) for step, v in seen.items()})
        losses.update({e["step"]: e["loss"] for e in map(json.loads, (out / f"loss{tag}.jsonl").read_text().splitlines())})
    return dict(sorted(ids.items())), dict(sorted(losses.items()))


def checkpoint_committed(out: Path, step: int) -> bool:
    return (out / "checkpoints" / f"step-{step}" / "COMPLETE.json").is_file()


# FSDP only here: its resharded load is the harder half, and the scheduler's part (preemption,
# requeue, resubmission on fewer nodes) is the same for DDP, whose own world-size changes are
# tests/test_elastic_resume.py's and tests/test_any_resume.py's on local process groups.
@pytest.mark.parametrize("strategy", ["fsdp"])
def test_a_preempted_2x2_job_resumes_as_1x2(slurm_cluster, tmp_path, strategy):
    from elastic_pipeline import BATCH
    from elastic_workload import GLOBAL_BATCH, PER_DEVICE_MAX

    assert BATCH == (GLOBAL_BATCH, PER_DEVICE_MAX)
    common = [f"elastic.strategy={strategy}", f"elastic.steps={STEPS}"]
    ref = submit_train(tmp_path / "reference", *common)
    assert finished(ref)["world_size"] == 4
    # after the reference has ended: the preemptor takes every CPU of the victim's nodes

    cut = submit_train(tmp_path / "preempted", *common, f"elastic.hold_at={HOLD_AT}")
    out, victim = cut.task_dir("train"), job_id(cut)
    wait_until(lambda: checkpoint_committed(out, HOLD_AT - 1), timeout_s=180,
               what=f"the checkpoint of step {HOLD_AT - 1}")
    preempt(slurm_cluster, victim, release=False)  # requeued by SLURM, held for its begin time
    wait_until(lambda: job_field(slurm_cluster, victim, "JobState") == "PENDING", what="the requeued job pending")
    subprocess.run(["scancel", victim], check=True)  # the allocation shrank: resubmit smaller
    wait_until(lambda: job_field(slurm_cluster, victim, "JobState") == "CANCELLED", what="the requeue cancelled")
    assert not cut.is_done("train")

    done = finished(submit_train(tmp_path / "preempted", "stages.train.nodes=1"))
    assert (done["world_size"], done["nodes"]) == (2, 1)
    first, second = attempts(out)
    assert (first["world_size"], first["resumed_from"], second["world_size"]) == (4, 0, 2)
    assert HOLD_AT <= second["resumed_from"] < STEPS, second  # resumed mid-training, after the hold

    ref_ids, ref_loss = per_step(ref.task_dir("train"))
    ids, loss = per_step(out)
    assert ids == ref_ids and list(ids) == list(range(1, STEPS + 1))
    for epoch in (range(1, 5), range(5, 9)):  # each epoch: all 48 samples once
        assert sorted(i for step in epoch for i in ids[step]) == list(range(48))
    resumed = second["resumed_from"]
    assert all(loss[step] == ref_loss[step] for step in range(1, resumed + 1))  # same world size: bitwise
    assert max(abs(loss[step] - ref_loss[step]) for step in ids) <= ATOL
    assert max_difference(load(out / "final.pt"), load(ref.task_dir("train") / "final.pt")) <= ATOL
