"""LangSplat on the real local SLURM cluster, sandbox profile (stage 2: 2 nodes x 2 tasks per level).

    python -m pytest tests/slurm/test_langsplat.py -m slurm

A miniature scene keeps each run to seconds: 4 ranks on 2 nodes train the same model as 1 process,
and a feature task preempted by SLURM (SIGTERM, GraceTime, requeue) resumes from its checkpoint and
ends bitwise identical to a run that was never interrupted; the preempted run's ranks run in a
container (tests/box.py: no SLURM client, and no hpc but the copy hpc carries in), the reference's not.
"""
import json
import subprocess
from pathlib import Path

import pytest
import torch

from hpc.slurm import scheduler
from hpc import submit
from hpc.rundir.run import RunDir
from tests.box import boxed
from tests.slurm.test_pipeline import ended, job_ids, wait_until

ROOT = Path(__file__).resolve().parents[2]
LEVEL = 1
pytestmark = pytest.mark.slurm

MINI = {"image_size": 16, "n_views": 10, "gaussians_per_subpart": 3, "n_objects": 2, "init_points": 12,
        "rgb_iterations": 60, "densify_from": 20, "densify_until": 40, "densify_every": 20,
        "feature_iterations": 300, "checkpoint_every": 50, "log_every": 50, "cameras_per_step": 4,
        "per_device_cameras": 1, "threads": 1}
# Long enough (about 8 s on 2 ranks) that a preemption lands mid-training, with a checkpoint every
# 100 steps to resume from. The preempted task runs on one node (ONE_NODE): the 4 ranks on 2 nodes
# are the test above's, and half the ranks halve the CPU time of the two runs this test makes.
LONG = {**MINI, "feature_iterations": 2000, "checkpoint_every": 100, "log_every": 100}
ONE_NODE = "stages.features.nodes=1"
# The same for stage 1 (about 8 s in one process at ~2 ms a step); stage 2 kept short.
LONG_RGB = {**MINI, "rgb_iterations": 4000, "feature_iterations": 20, "checkpoint_every": 100,
            "log_every": 100}


@pytest.fixture(autouse=True)
def _root(monkeypatch):
    monkeypatch.chdir(ROOT)  # jobs import hpc.jobs.langsplat from the submission directory


def submit_langsplat(run_dir: Path, trainer: dict, *more: str) -> RunDir:
    overrides = [f"langsplat.trainer.{k}={v}" for k, v in trainer.items()]
    code = submit.main(["langsplat", "--levels", str(LEVEL), "--profile", "sandbox", "--cluster", "slurm",
                        "--run-dir", str(run_dir), *overrides, *more])
    assert code == 0
    return RunDir(run_dir)


def release_and_check_ended(run: RunDir):
    """ended(run), releasing a requeued job SLURM holds back (~2 min, Reason=BeginTime)."""
    for job_id, rec in scheduler.query(set(job_ids(run).values())).items():
        if rec.reason == "BeginTime":
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=False)
    return ended(run)


def finished(run: RunDir, timeout_s: float = 240) -> dict:
    records = wait_until(lambda: release_and_check_ended(run), timeout_s=timeout_s, what="the run to end")
    states = {key: records[jid].state for key, jid in job_ids(run).items()}
    assert set(states.values()) == {"COMPLETED"}, states
    return records


def features_dir(run: RunDir) -> Path:
    return run.task_dir("features", LEVEL)


def load_features(directory: Path) -> torch.Tensor:
    return torch.load(directory / "features.pt", weights_only=True)["features"]


def scalars(directory: Path, tag: str) -> list:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_four_ranks_on_two_nodes_match_one_process(slurm_cluster, tmp_path, capsys):
    """Submitted through the Python API, whose Run reports what python -m hpc.status --json prints."""
    import hpc
    from hpc import status as status_cmd
    from hpc.jobs.langsplat.stages import train_features

    api_run = hpc.submit("langsplat", profile="sandbox", cluster="slurm", levels=[LEVEL], run_dir=tmp_path / "run",
                         overrides=[f"langsplat.trainer.{k}={v}" for k, v in MINI.items()])
    rows = api_run.wait(timeout=240, poll_s=1)
    assert {r["task"]: r["state"] for r in rows} == {"rgb": "COMPLETED", f"features[{LEVEL}]": "COMPLETED"}
    capsys.readouterr()
    assert status_cmd.main([str(api_run.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == hpc.Run.attach(api_run.path).status() == rows
    assert f"[hpc] stage features item {LEVEL} rank 3/4" in api_run.logs("features", LEVEL, rank=3)
    run = RunDir(api_run.path)
    cluster = json.loads((features_dir(run) / "metrics.json").read_text())
    assert cluster["world_size"] == 4 and cluster["resumed_from"] == 0
    # The same level in one plain process, on the geometry the cluster's rgb stage wrote.
    single = train_features({"trainer": MINI}, tmp_path / "single", LEVEL, run.task_dir("rgb"))
    assert single["world_size"] == 1
    for key in ("accuracy", "miou"):
        assert cluster[key] == pytest.approx(single[key], abs=1e-6), key
    assert cluster["accuracy_per_view"] == pytest.approx(single["accuracy_per_view"], abs=1e-6)
    # Gradients are summed in a different order over 4 ranks: equal up to float rounding only.
    a, b = load_features(features_dir(run)), load_features(tmp_path / "single")
    assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
    loss_cluster, loss_single = scalars(features_dir(run), "feature/loss"), scalars(tmp_path / "single",
                                                                                    "feature/loss")
    assert [s for s, _ in loss_cluster] == [s for s, _ in loss_single] == list(range(50, 301, 50))
    assert [v for _, v in loss_cluster] == pytest.approx([v for _, v in loss_single], rel=1e-4)


def test_preempted_feature_task_resumes_bitwise(slurm_cluster, tmp_path):
    """The preempted run in a container (the `exec` runtime in tests/box.py's box): its ranks reach no
    SLURM client, so the host requeues it, and import hpc from the carried copy; it ends as the
    uninterrupted run on the host did, bit for bit."""
    from hpc.cluster.preempt import preempt

    reference = submit_langsplat(tmp_path / "reference", LONG, ONE_NODE)
    finished(reference)  # first, alone: the preemptor takes every CPU of the node
    run = submit_langsplat(tmp_path / "preempted", LONG, ONE_NODE, *boxed())
    job_id = job_ids(run)[("features", LEVEL)]
    checkpoints = features_dir(run) / "checkpoints"
    wait_until(lambda: list(checkpoints.glob("step-*/")), timeout_s=180, what="a first feature checkpoint")
    preempt(slurm_cluster, job_id)
    records = finished(run)
    assert records[job_id].restarts >= 1
    scripts = [p.read_text() for p in (run.path / "features" / "logs").rglob("*_submission.sh")]
    assert scripts and all(" bwrap --die-with-parent " in t and "/carry/" in t for t in scripts)  # boxed, carried
    assert len(list((run.path / ".host").glob("*/request.json.done"))) == 1  # the preemption, requeued by the host
    metrics = json.loads((features_dir(run) / "metrics.json").read_text())
    assert 0 < metrics["resumed_from"] < LONG["feature_iterations"], metrics  # resumed mid-training
    assert torch.equal(load_features(features_dir(run)), load_features(features_dir(reference)))
    ref_metrics = json.loads((features_dir(reference) / "metrics.json").read_text())
    assert metrics["accuracy"] == ref_metrics["accuracy"] and ref_metrics["resumed_from"] == 0
    assert metrics["world_size"] == ref_metrics["world_size"] == 2
    # TensorBoard continues the run: every logged step once, with the uninterrupted run's values.
    assert scalars(features_dir(run), "feature/loss") == scalars(features_dir(reference), "feature/loss")


def test_preempted_rgb_stage_resumes_bitwise(slurm_cluster, tmp_path):
    from hpc.cluster.preempt import preempt
    from hpc.jobs.langsplat.stages import train_rgb

    run = submit_langsplat(tmp_path / "preempted", LONG_RGB, ONE_NODE)  # stage 2 only has to end
    job_id = job_ids(run)[("rgb", None)]
    checkpoints = run.task_dir("rgb") / "checkpoints"
    wait_until(lambda: list(checkpoints.glob("step-*/")), timeout_s=120, what="a first rgb checkpoint")
    preempt(slurm_cluster, job_id)
    reference = train_rgb({"trainer": LONG_RGB}, tmp_path / "reference")  # while the job resumes
    records = finished(run)
    assert records[job_id].restarts >= 1
    metrics = json.loads((run.task_dir("rgb") / "metrics.json").read_text())
    assert 0 < metrics["resumed_from"] < LONG_RGB["rgb_iterations"], metrics
    a = torch.load(run.task_dir("rgb") / "gaussians.pt", weights_only=True)
    b = torch.load(tmp_path / "reference" / "gaussians.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert metrics["psnr"] == reference["psnr"] and metrics["gaussians"] == reference["gaussians"]
    assert scalars(run.task_dir("rgb"), "rgb/loss") == scalars(tmp_path / "reference", "rgb/loss")
