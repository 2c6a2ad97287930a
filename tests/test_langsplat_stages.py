"""LangSplat stages end to end on a miniature scene: pytest tests/test_langsplat_stages.py

Checks the metric and output plumbing, exact resume after a stop, and that 2 gloo ranks train the
same features as 1 process (same global camera batch per step)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from hpc.jobs.langsplat.stages import train_features, train_rgb

MINI = {"trainer": {"image_size": 16, "n_views": 10, "gaussians_per_subpart": 3, "n_objects": 2,
                    "init_points": 12, "rgb_iterations": 60, "densify_from": 20, "densify_until": 40,
                    "densify_every": 20, "feature_iterations": 24, "checkpoint_every": 8,
                    "log_every": 8, "cameras_per_step": 4, "per_device_cameras": 1, "threads": 1}}


@pytest.fixture(scope="module")
def rgb_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("langsplat") / "rgb"
    metrics = train_rgb(MINI, out)
    assert metrics["psnr"] > 10 and metrics["gaussians"] > 0
    return out


def _features(tmp_path, rgb_dir, name, **trainer):
    section = {"trainer": {**MINI["trainer"], **trainer}}
    return train_features(section, tmp_path / name, 1, rgb_dir)


def test_rgb_stage_outputs(rgb_dir):
    metrics = json.loads((rgb_dir / "metrics.json").read_text())
    assert set(metrics) >= {"psnr", "psnr_per_view", "train_psnr", "gaussians", "seconds"}
    assert len(metrics["psnr_per_view"]) == 2  # 10 views, every 5th held out
    geometry = torch.load(rgb_dir / "gaussians.pt", weights_only=True)
    assert geometry["means"].shape == (metrics["gaussians"], 3)
    assert sorted(p.name for p in (rgb_dir / "renders").glob("*.png"))
    assert list((rgb_dir / "tensorboard").glob("events.out.tfevents.*"))


def test_feature_stage_outputs(tmp_path, rgb_dir):
    metrics = _features(tmp_path, rgb_dir, "f")
    out = tmp_path / "f"
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["accuracy"] == metrics["accuracy"] and 0 <= metrics["miou"] <= 1
    assert metrics["level_name"] == "part" and metrics["segments"] == 4
    assert metrics["accuracy"] > 0.5  # 4 parts: far above chance even after 24 steps
    names = {p.name.split("-view")[0] for p in (out / "renders").glob("*.png")}
    assert names == {"features", "relevancy-seg0"}
    assert (out / "checkpoints").is_dir() and torch.load(out / "features.pt", weights_only=True)


def test_resume_after_stop_is_exact(tmp_path, rgb_dir):
    straight = _features(tmp_path, rgb_dir, "straight")
    # A run that ends at step 12 (as a stopped job would, with its checkpoint) and a rerun to 24.
    _features(tmp_path, rgb_dir, "resumed", feature_iterations=12)
    resumed = _features(tmp_path, rgb_dir, "resumed")
    assert resumed["resumed_from"] == 12
    a = torch.load(tmp_path / "straight" / "features.pt", weights_only=True)["features"]
    b = torch.load(tmp_path / "resumed" / "features.pt", weights_only=True)["features"]
    assert torch.equal(a, b)
    assert straight["accuracy"] == resumed["accuracy"]


def test_rgb_resume_after_stop_is_exact(tmp_path, rgb_dir):
    # Stop at step 30, between the densifications at 20 and 40: the checkpoint holds gaussians
    # of a size the initial point cloud does not have, and the rerun must densify from them.
    short = {"trainer": {**MINI["trainer"], "rgb_iterations": 30, "checkpoint_every": 7}}
    stopped = train_rgb(short, tmp_path / "rgb")
    assert stopped["resumed_from"] == 0
    resumed = train_rgb(MINI, tmp_path / "rgb")
    assert resumed["resumed_from"] == 30
    assert 12 < stopped["gaussians"] < resumed["gaussians"]  # densified before and after the stop
    a = torch.load(rgb_dir / "gaussians.pt", weights_only=True)
    b = torch.load(tmp_path / "rgb" / "gaussians.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["psnr"] == json.loads((rgb_dir / "metrics.json").read_text())["psnr"]
    steps = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "rgb" / "checkpoints").glob("step-*"))
    assert steps == [48, 56, 60]  # the rerun's periodic (every 8) and final saves; keep=3


def _free_port():
    from test_ddp_session import free_port

    return free_port()


def test_two_gloo_ranks_match_one_process(tmp_path, rgb_dir):
    single = _features(tmp_path, rgb_dir, "one")
    section = json.dumps({"trainer": MINI["trainer"]})
    code = ("import json, sys; from pathlib import Path; from hpc.jobs.langsplat.stages import train_features;"
            "train_features(json.loads(sys.argv[1]), Path(sys.argv[2]), 1, Path(sys.argv[3]))")
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
        procs.append(subprocess.Popen([sys.executable, "-c", code, section, str(tmp_path / "two"),
                                       str(rgb_dir)], env=env, stderr=subprocess.PIPE, text=True))
    errors = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert two["world_size"] == 2
    a = torch.load(tmp_path / "one" / "features.pt", weights_only=True)["features"]
    b = torch.load(tmp_path / "two" / "features.pt", weights_only=True)["features"]
    assert torch.allclose(a, b, atol=1e-5)
    assert two["accuracy"] == pytest.approx(single["accuracy"], abs=1e-3)
    assert two["miou"] == pytest.approx(single["miou"], abs=1e-3)


def test_sharded_evaluation_equals_one_process(rgb_dir):
    """Each of 3 ranks renders its share of the held-out views; summed, the metrics are exactly
    those of one process rendering all of them."""
    from hpc.jobs.langsplat.evaluate import evaluate_features
    from hpc.jobs.langsplat.stages import load_geometry, trainer_config
    from hpc.jobs.langsplat.scene import make_scene

    cfg = trainer_config({"trainer": {**MINI["trainer"], "n_views": 15}})  # 3 held-out views
    scene, geometry = make_scene(cfg), load_geometry(rgb_dir)
    features = torch.randn(len(geometry["means"]), cfg["feature_dim"], generator=torch.Generator().manual_seed(0))
    whole = evaluate_features(cfg, scene, geometry, features, 2)
    parts = []  # what each rank hands to the all-reduce
    for rank in range(3):
        evaluate_features(cfg, scene, geometry, features, 2, rank, 3, lambda t: parts.append(t) or t)
    summed = lambda i: sum(parts[i::2][1:], parts[i::2][0].clone())  # noqa: E731
    from hpc.jobs.langsplat.metrics import scores_from_confusion

    assert {**scores_from_confusion(summed(0)), "accuracy_per_view": summed(1).tolist()} == \
        {k: whole[k] for k in ("accuracy", "miou", "accuracy_per_view")}
    # every rank rendered its own view: its confusion counts that view's pixels (a count, whatever
    # the random features score), and the three views' counts add up to one process's
    counts = [int(p.sum()) for p in parts[0::2]]
    assert len(counts) == len(scene.test_views) == 3 and min(counts) > 0
    assert sum(counts) == int(summed(0).sum())
    with pytest.raises(ValueError, match="reduce_sum"):
        evaluate_features(cfg, scene, geometry, features, 2, 0, 2)
