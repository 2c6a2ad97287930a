"""Packed stages on the real local SLURM cluster, whose nodes have 8 fake GPUs and 8 CPUs each
(tests/conftest.py): 16 one-GPU items packed 8 per job fill two whole nodes.

    python -m pytest tests/slurm/test_packing.py -m slurm

- A pack larger than the partition's GPUs per node (as sinfo reports them) is refused before any sbatch.
- 16 items packed 8 per job (a site whose smallest job is 8 GPUs) run as 2 jobs (one array of 2
  tasks), each item as its own srun step with its own GPU; an item that fails is restarted in place
  once, alone, and leaves its 7 siblings running to completion (pack_fail: continue); both jobs
  preempted are requeued exactly once, and each runs only its unfinished items, each from its own
  checkpoint, to an unpacked run's result;
  python -m hpc.status shows each item with the job it shared; a resubmission runs the failed item
  alone, packed again. With pack_fail: stop a failed item ends its sibling, which is not restarted.
- A preemption of packed jobs (tests/pack_pipeline.py: one item done, the others training) and the
  time-limit signal: every unfinished item checkpoints at its own step, the job is requeued once,
  and its requeued attempt trains only the unfinished items, each from its own checkpoint, to
  weights bitwise equal to an unpacked run's (--cluster local, one item per job).
"""
import json
import re
import subprocess
import time

import pytest

from hpc import logs as hpc_logs
from hpc import submit
from hpc.cluster.preempt import job_field, preempt
from hpc.monitor import status
from hpc.rundir.run import RunDir
from hpc.slurm import gres, scheduler
from tests.slurm.pipelines import use_pipelines
from tests.slurm.requeue_helpers import release, wait_for

pytestmark = pytest.mark.slurm
pipelines = use_pipelines(tiny="tests.tiny_pipeline", pk="tests.pack_pipeline")


def ended(run):
    ids = {t["job_id"] for t in run.tasks()}
    records = scheduler.query(ids)
    return records if set(records) == ids and all(r.state not in scheduler.ACTIVE for r in records.values()) else None


def test_a_pack_larger_than_the_partitions_gpus_per_node_is_refused_before_any_sbatch(slurm_cluster, tmp_path,
                                                                                      capsys):
    gpus = slurm_cluster.layout.gpus_per_node
    assert gres.node_gpus("low") == gres.node_gpus(None) == gpus  # low is the sandbox's default partition
    run = tmp_path / "r"
    assert submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(run), "--no-snapshot", "tiny.parts=[0,1,2]",
                        "stages.second.gpus_per_node=1", f"stages.second.pack={gpus + 1}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: stages.second.pack={gpus + 1}: {gpus + 1} items x 1 GPU(s) = {gpus + 1} GPUs per job; "
                   f"partition (default) has {gpus} GPUs per node. HINT: stages.second.pack={gpus} or less."]
    assert not (run / "manifest.json").exists()  # refused before the run was started: nothing queued


SIXTEEN = "pk.parts=[" + ",".join(map(str, range(16))) + "]"


def chained(item, steps, tmp_path):
    """Item `item` of pk.chain run unpacked and never stopped: its code called in this process."""
    from hpc.pipeline.executor import StageContext
    from tests import pack_pipeline

    out = tmp_path / "unpacked" / f"task-{item}"
    out.mkdir(parents=True)
    env = type("Env", (), {"job_id": "0", "restart_count": 0})()
    cfg = {"pk": {"steps": steps, "step_s": 0, "short_items": [], "short_steps": 0, "fail_items": []}}
    pack_pipeline.chain(StageContext(tmp_path, out, cfg, "train", item, item, env))
    return (out / "result.txt").read_text()


def test_sixteen_one_gpu_items_packed_eight_per_whole_node_job_fail_alone_and_resume_alone_after_a_preemption(
        slurm_cluster, tmp_path, monkeypatch, capsys):
    """The issue's case on nodes of 8 GPUs, at a site whose smallest job is 8 GPUs (a whole node):
    16 one-GPU items (tests/pack_pipeline.py, pk.chain: no torch, a checkpoint per step) packed 8
    per job run as 2 jobs of one array, each item its own GPU; item 1 fails, its step alone is started
    again in place once, fails again and is left, and its 7 siblings go on; both jobs are preempted while 14 items are mid-way (items 0 and 8 done): each is requeued
    exactly once, its requeued attempt runs only its unfinished items, each resuming from its own
    checkpoint to the digest of an unpacked run of it. A resubmission then runs item 1 alone,
    packed again into a job of the site's 8 GPUs."""
    layout = slurm_cluster.layout
    if layout.gpus_per_node < 8 or layout.cpus_per_node < 8:
        pytest.skip(f"needs nodes of 8 GPUs and 8 CPUs; this cluster has {layout.gpus_per_node} and "
                    f"{layout.cpus_per_node} (tests/conftest.py gives the session cluster 8 of each)")
    run = RunDir(tmp_path / "packed")
    args = ["pk", "--cluster", "slurm", "--run-dir", str(run.path), "--no-snapshot", SIXTEEN, "pk.chain=true",
            "pk.steps=40", "pk.step_s=0.3", "stages.train.pack=8", "cluster.min_job_gpus=8"]
    assert submit.main([*args, "pk.short_items=[0,8]", "pk.fail_items=[1]"]) == 0
    jobs = {t["item"]: t["job_id"] for t in run.tasks()}
    a, b = jobs[0], jobs[8]
    assert {jobs[i] for i in range(8)} == {a} and {jobs[i] for i in range(8, 16)} == {b} and a != b  # 2, not 16
    assert a.split("_")[0] == b.split("_")[0]  # one array
    running = [i for i in range(16) if i not in (0, 1, 8)]
    logs = run.path / "train" / "logs" / a.split("_")[0]
    driver = logs / f"{a}_0_log.err"  # the pack's driver's log: the batch step's
    wait_for(lambda: run.is_done("train", 0) and run.is_done("train", 8) and driver.exists()
             and "item 1 failed: not restarted in place" in driver.read_text()
             and all(progress(run, i) >= 2 for i in running), "items 0 and 8 done, item 1 failed, the others mid-way")
    assert [x["restart"] for x in attempts_of(run, 1)] == [0, 0]  # restarted in place once, alone
    assert "item 1 failed: a rank exited with an error: restart in place 1 of at most 3" in driver.read_text()
    for job, items in ((a, range(8)), (b, range(8, 16))):  # each item its own step and its own GPU
        devices = {re.search(r"CUDA_VISIBLE_DEVICES=(\S*)", (logs / f"{job}.item-{i}_0_log.out").read_text()).group(1)
                   for i in items}
        assert len(devices) == 8 and all(d.isdigit() for d in devices), (job, devices)
    stopped_at = {i: progress(run, i) for i in running}
    preempt(slurm_cluster, a, release=False)
    preempt(slurm_cluster, b, release=False)  # each job a whole node: its own preemptor
    release(slurm_cluster, a)
    release(slurm_cluster, b)
    wait_for(lambda: ended(run), "the requeued jobs to end")
    records = ended(run)
    assert {j: (records[j].state, records[j].restarts) for j in (a, b)} == {a: ("FAILED", 1), b: ("COMPLETED", 1)}
    assert [run.is_done("train", i) for i in range(16)] == [i != 1 for i in range(16)]  # 7 + 8 siblings done
    for item in (0, 8):  # done before the stop: not run again
        assert [x["restart"] for x in attempts_of(run, item)] == [0]
    # unfinished: run again in the requeued job, restarted in place once there too, failed again
    assert [x["restart"] for x in attempts_of(run, 1)] == [0, 0, 1, 1]
    recovery = json.loads((run.task_dir("train", 1) / "recovery.json").read_text())
    assert [(e["kind"], e["job"], e["restart"]) for e in recovery["events"]] == [("restart_in_place", a, 0)] * 1 + [
        ("restart_in_place", a, 1)]
    for item in running:  # each resumed from its own checkpoint, no earlier than where it was stopped
        tried = attempts_of(run, item)
        assert [x["restart"] for x in tried] == [0, 1] and tried[1]["first"] >= stopped_at[item], (item, tried)
        history = json.loads((run.task_dir("train", item) / "checkpoints" / "requeue.json").read_text())
        assert (history["preemptions"], history["timeouts"]) == (1, 0), (item, history)
        assert (run.task_dir("train", item) / "result.txt").read_text() == chained(item, 40, tmp_path), item
    for item in (0, 8):
        assert (run.task_dir("train", item) / "result.txt").read_text() == chained(item, 2, tmp_path), item
    # status: per item, with the job it shared; python -m hpc.logs prints the failed item's own log
    rows = {r.item: r for r in status.collect(run)}
    assert {i: rows[i].job_id for i in range(16)} == jobs
    assert [rows[i].state for i in range(16)] == ["FAILED" if i == 1 else "COMPLETED" for i in range(16)]
    assert "item 1 failing on request" in rows[1].error and not rows[0].error
    capsys.readouterr()
    assert hpc_logs.main([str(run.path), "--stage", "train", "--task", "1", "--err"]) == 0
    printed = capsys.readouterr().out
    assert f"{a}.item-1_0_log.err <==" in printed and "item 1 failing on request" in printed
    # a resubmission runs only the failed item, packed again: one job, of the site's 8 GPUs
    assert submit.main([*args, "pk.short_items=[0,8]", "pk.fail_items=[]"]) == 0
    again = {t["item"]: t["job_id"] for t in run.tasks()}
    assert {i: again[i] for i in range(16) if i != 1} == {i: jobs[i] for i in range(16) if i != 1}
    assert again[1] not in jobs.values() and job_field(slurm_cluster, again[1], "TresPerNode") in ("gres:gpu:8", "gpu:8")
    wait_for(lambda: ended(run), "the resubmitted job to end")
    assert run.is_done("train", 1) and chained(1, 40, tmp_path / "again") == \
        (run.task_dir("train", 1) / "result.txt").read_text()


def test_with_pack_fail_stop_a_failed_item_ends_its_siblings_step(slurm_cluster, tmp_path):
    run = RunDir(tmp_path / "r")
    assert submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(run.path), "--no-snapshot", "tiny.parts=[0,1]",
                        "stages.second.gpus_per_node=1", "stages.second.pack=2", "stages.second.pack_fail=stop",
                        "tiny.fail_items=[1]", "tiny.slow_items=[0]", "tiny.slow_s=30"]) == 0
    wait_for(lambda: ended(run), "the job to end", timeout=60)  # not item 0's 30 s more
    assert [run.is_done("second", i) for i in (0, 1)] == [False, False]
    # item 1 restarted in place once first (then failed at the same point again); the sibling it ended is not
    assert json.loads((run.task_dir("second", 1) / "recovery.json").read_text())["restarts_in_place"] == 1
    assert not (run.task_dir("second", 0) / "recovery.json").exists()


def progress(run, item):
    path = run.task_dir("train", item) / "progress.json"
    return json.loads(path.read_text())["step"] if path.exists() else 0


def attempts_of(run, item):
    path = run.task_dir("train", item) / "attempts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_preempted_packed_job_is_requeued_once_and_resumes_only_its_unfinished_items_bitwise(
        slurm_cluster, tmp_path, monkeypatch):
    """4 one-GPU items of tests/pack_pipeline.py packed 2 per job; item 0 trains 2 steps, the others 16.
    Both jobs are preempted once item 0 is done and the others are training: each job is requeued once
    (job B holds 2 unfinished items), its requeued attempt runs only the unfinished items, each from its
    own checkpoint, and every item's weights are bitwise those of an unpacked run of it."""
    import torch

    ref = RunDir(tmp_path / "ref")  # the unpacked run: one item per job, never stopped
    assert submit.main(["pk", "--cluster", "local", "--run-dir", str(ref.path), "--no-snapshot", "pk.step_s=0",
                        "pk.short_items=[0]"]) == 0
    run = RunDir(tmp_path / "packed")
    assert submit.main(["pk", "--cluster", "slurm", "--run-dir", str(run.path), "--no-snapshot",
                        "stages.train.pack=2", "pk.short_items=[0]"]) == 0
    jobs = {t["item"]: t["job_id"] for t in run.tasks()}
    a, b = jobs[0], jobs[2]
    assert jobs[1] == a != b == jobs[3]
    wait_for(lambda: run.is_done("train", 0) and all(progress(run, i) >= 3 for i in (1, 2, 3)),
             "item 0 done and the others training")
    preempt(slurm_cluster, a, release=True)
    time.sleep(2)  # job B shares job A's node or not: preempted by the same preemptor, or on its own
    if job_field(slurm_cluster, b, "Restarts") == "0" and job_field(slurm_cluster, b, "PreemptTime") in ("None", ""):
        preempt(slurm_cluster, b, release=True)
    else:
        wait_for(lambda: job_field(slurm_cluster, b, "Restarts") == "1", f"job {b} requeued")
        release(slurm_cluster, b)
    wait_for(lambda: ended(run), "the requeued jobs to end")
    records = ended(run)
    assert {j: (records[j].state, records[j].restarts) for j in (a, b)} == {a: ("COMPLETED", 1), b: ("COMPLETED", 1)}
    assert [x["restart"] for x in attempts_of(run, 0)] == [0]  # done before the stop: not run again
    for item in (1, 2, 3):
        tried = attempts_of(run, item)
        assert [x["restart"] for x in tried] == [0, 1] and tried[1]["first"] > 3, (item, tried)  # its own checkpoint
        history = json.loads((run.task_dir("train", item) / "checkpoints" / "requeue.json").read_text())
        assert (history["preemptions"], history["timeouts"]) == (1, 0), (item, history)
    for item in range(4):
        mine = torch.load(run.task_dir("train", item) / "weights.pt")
        theirs = torch.load(ref.task_dir("train", item) / "weights.pt")
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine), item


def test_the_time_limit_signal_stops_both_items_of_a_packed_job_and_requeues_it_once(slurm_cluster, tmp_path,
                                                                                      monkeypatch):
    """2 one-GPU items packed 2 in one job (no array) get the time-limit signal while training: each
    checkpoints at its own step, the job is requeued once for both (one timeout in each item's history,
    Restarts=1), and each resumes from its own checkpoint to the weights of an unpacked run."""
    import torch

    ref = RunDir(tmp_path / "ref")
    assert submit.main(["pk", "--cluster", "local", "--run-dir", str(ref.path), "--no-snapshot", "pk.step_s=0",
                        "pk.parts=[0,1]"]) == 0
    run = RunDir(tmp_path / "packed")
    assert submit.main(["pk", "--cluster", "slurm", "--run-dir", str(run.path), "--no-snapshot", "pk.parts=[0,1]",
                        "stages.train.pack=2"]) == 0
    (job,) = {t["job_id"] for t in run.tasks()}
    assert "_" not in job
    wait_for(lambda: all(progress(run, i) >= 3 for i in (0, 1)), "both items training")
    subprocess.run(["scancel", "--signal=USR2", job], check=True)  # what --signal=USR2@N sends every step
    wait_for(lambda: job_field(slurm_cluster, job, "Restarts") == "1", f"job {job} requeued")
    release(slurm_cluster, job)
    wait_for(lambda: ended(run), "the requeued job to end")
    assert (ended(run)[job].state, ended(run)[job].restarts) == ("COMPLETED", 1)
    for item in (0, 1):
        tried = attempts_of(run, item)
        assert [x["restart"] for x in tried] == [0, 1] and tried[1]["first"] > 3, (item, tried)
        history = json.loads((run.task_dir("train", item) / "checkpoints" / "requeue.json").read_text())
        assert (history["timeouts"], history["preemptions"]) == (1, 0), (item, history)
        mine = torch.load(run.task_dir("train", item) / "weights.pt")
        theirs = torch.load(ref.task_dir("train", item) / "weights.pt")
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs), item
