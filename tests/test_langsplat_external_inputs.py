"""External mode's environments, dataset and inputs, against stand-ins of the real scripts.
pytest tests/test_langsplat_external_inputs.py

Two rasterizers under one module name, torch.load's weights-only default, a dataset nothing may be
written into, a requeue on another rank count, eval's inputs, and weights and models where users keep them.
"""
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hpc.config import schema as config
from hpc import submit
from hpc.rundir.run import RunDir
from tests.langsplat_standins.autoencoder import model as autoencoder
from tests.langsplat_standins.checkout import jpeg, make_dim3, make_env
from tests.langsplat_standins.common import fetch_ply, save_checkpoint
from tests.test_langsplat_external import load, overrides, rgb_checkpoint, run, stage_argv, summary, world  # noqa: F401

ENVS = Path(__file__).resolve().parent / "langsplat_standins" / "envs"


def test_each_checkout_fails_in_the_others_environment(world):
    rgb = rgb_checkpoint(world)  # graphdeco's train.py in its own environment
    args = ["-s", world["data"], "-m", world["root"] / "x", "--port", 0, "--iterations", 2]
    gs = run([world["root"] / "gs" / "train.py", *args], python=world["python"])
    assert gs.returncode == 1 and "missing 1 required positional argument: 'include_feature'" in gs.stderr
    up = run([world["root"] / "upstream" / "train.py", *args, "--start_checkpoint", rgb], python=world["gs_python"],
             runner=True)
    assert up.returncode == 1 and "unexpected keyword argument 'include_feature'" in up.stderr


def test_plan_says_each_stages_interpreter_and_submission_checks_them(world):
    text = summary(load(*overrides(world, "upstream")))
    assert f"train.py, 30000 iterations (python {world['gs_python']})" in text
    assert f"levels 1=s, 2=m, 3=l (python {world['python']})" in text
    one_env = [o for o in overrides(world, "upstream") if "gaussian_splatting_python" not in o]
    with pytest.raises(config.ConfigError, match="gaussian_splatting_python=.* imports LangSplat's .*HINT") as err:
        load(*one_env)
    assert "\n" not in str(err.value)
    with pytest.raises(config.ConfigError, match="external.python=.* imports graphdeco's .*HINT"):
        load(*overrides(world, "fork"), f"external.python={world['gs_python']}")
    with pytest.raises(config.ConfigError, match="cannot import diff_gaussian_rasterization .*HINT"):
        load(*overrides(world, "fork"), f"external.python={world['root'] / 'none' / 'python'}")


def test_langsplat_segment_anything_checked_when_preprocess_runs(world, tmp_path):
    site = tmp_path / "site"  # LangSplat's rasterizer without its segment_anything
    shutil.copytree(ENVS / "langsplat" / "diff_gaussian_rasterization", site / "diff_gaussian_rasterization")
    no_sam = make_env(tmp_path / "nosam", "langsplat", site=site)
    with pytest.raises(config.ConfigError, match="no LangSplat segment_anything .*HINT: pip install"):
        load(*overrides(world), f"external.python={no_sam}")
    make_dim3(world["data"])  # preprocess skipped: segment_anything is not needed
    load(*overrides(world), f"external.python={no_sam}", "external.ae_ckpt_dir=" + str(ae_dir(world, "fork")))


def test_upstream_scripts_load_numpy_scalars_through_the_runner(world):
    rgb = rgb_checkpoint(world)
    assert isinstance(torch.load(rgb, weights_only=False)[0][-1], float)  # np.float64, as getNerfppNorm leaves it
    args = [world["root"] / "upstream" / "train.py", "-s", world["data"], "-m", world["root"] / "f", "--port", 0,
            "--feature_level", 1, "--iterations", 2, "--start_checkpoint", rgb]
    plain = run(args)  # torch >= 2.6: weights_only=True by default
    assert plain.returncode == 1 and "Weights only load failed" in plain.stderr
    assert run(args, runner=True).returncode == 0
    fork = run([world["root"] / "fork" / "train.py", *args[1:]])  # the fork passes weights_only=False
    assert fork.returncode == 0, fork.stderr


def tree(path):
    return {str(p): (p.stat().st_mtime_ns, p.is_symlink()) for p in sorted(path.rglob("*"))}


@pytest.mark.parametrize("rgb", ["trained", "skipped"])
def test_nothing_is_written_into_the_dataset(world, monkeypatch, rgb):
    """As root, chmod does not stop writes: the test compares the dataset's tree before and after.
    Each stage kind runs (rgb when trained, features, render); with the RGB model in the dataset,
    two levels' tasks start at once on the same dataset."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    make_dim3(world["data"])
    if rgb == "skipped":  # every level's task would convert points3D at once
        out = run([world["root"] / "gs" / "train.py", "-s", world["data"], "-m", world["data"] / "output" / "scene",
                   "--iterations", 3, "--checkpoint_iterations", 3, "--port", 0])
        assert out.returncode == 0, out.stderr
        (world["data"] / "sparse" / "0" / "points3D.ply").unlink()  # that run converted it in place
    before = tree(world["data"])
    run_dir = world["root"] / "run"
    levels = [1] if rgb == "trained" else [1, 2]
    code = submit.main(["langsplat", "--cluster", "local", "--run-dir", str(run_dir), *overrides(world, "upstream"),
                        f"langsplat.levels={levels}", "external.iterations=3",
                        f"external.label_dir={world['root'] / 'no-labels'}"])
    assert code == 0
    assert tree(world["data"]) == before
    assert fetch_ply(run_dir / "scene" / "scene" / "sparse" / "0" / "points3D.ply") == 8
    assert all(RunDir(run_dir).is_done("render", level) for level in levels)


def test_requeue_on_fewer_ranks_past_the_final_iteration_links_the_checkpoint(world, monkeypatch, tmp_path):
    cfg = load(*overrides(world), "external.iterations=12")
    level = tmp_path / "run" / "output" / "scene_1"
    level.mkdir(parents=True)
    save_checkpoint(str(level), {"xyz": torch.zeros(2, 3).numpy(), "features": torch.zeros(2, 3).numpy(),
                                 "language_feature": torch.zeros(2, 3).numpy()}, True, 6)  # 2 ranks: final 6
    (level / "chkpnt30000.pth").symlink_to("chkpnt6.pth")
    seen = stage_argv(monkeypatch, cfg, tmp_path, "features", item=1, world=4)  # 4 ranks: final 2 x (6 // 4) = 2
    assert seen == {}  # the script would train nothing and save nothing
    assert (level / "chkpnt30000.pth").resolve() == level / "chkpnt6.pth"
    (level / "chkpnt30000.pth").unlink()
    stage_argv(monkeypatch, cfg, tmp_path, "features", item=1, world=4)
    assert (level / "chkpnt30000.pth").resolve() == level / "chkpnt6.pth"


def ae_dir(world, layout):
    """An autoencoder checkpoint folder in the layout of `layout`'s eval."""
    ckpt = world["root"] / f"ae-{layout}" / "scene" / ("best_ckpt.pth" if layout == "fork" else "ae_ckpt/best_ckpt.pth")
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    ckpt.write_bytes(b"")
    return ckpt.parents[2 if layout == "upstream" else 1]


def test_eval_labels_images_and_sizes_checked_before_submission(world):
    label = world["root"] / "data" / "label" / "scene"
    load(*overrides(world))
    (label / "frame_00006.jpg").write_bytes(jpeg(8, 5))  # the render is 8 x 6
    with pytest.raises(config.ConfigError, match="frame_00006.jpg 5x8, render of frame_00006.png 6x8.*HINT"):
        load(*overrides(world))
    (label / "frame_00006.jpg").unlink()
    with pytest.raises(config.ConfigError, match="eval pairs them by position.*HINT"):
        load(*overrides(world))


def test_stand_in_eval_needs_a_label_image_of_the_render_size(world, tmp_path):
    for level in (1, 2, 3):
        renders = tmp_path / "out" / f"scene_{level}" / "train" / "ours_None" / "renders_npy"
        renders.mkdir(parents=True)
        for i in range(6):
            np.save(renders / f"{i:05d}.npy", np.zeros((6, 8, 3), np.float32))
    ae = ae_dir(world, "fork")
    torch.save(autoencoder([256, 128, 64, 32, 3], [16, 32, 64, 128, 256, 256, 512]).state_dict(), ae / "scene" / "best_ckpt.pth")
    args = [world["root"] / "fork" / "eval" / "evaluate_iou_loc.py", "--dataset_name", "scene", "--feat_dir",
            tmp_path / "out", "--ae_ckpt_dir", ae, "--output_dir", tmp_path / "ev", "--json_folder",
            world["root"] / "data" / "label"]
    cwd, hf = world["root"] / "fork" / "eval", {"HF_HOME": str(world["hf_home"])}
    assert run(args, cwd=cwd, **hf).returncode == 0
    (world["root"] / "data" / "label" / "scene" / "frame_00001.jpg").write_bytes(jpeg(4, 3))
    out = run(args, cwd=cwd, **hf)
    assert out.returncode == 1 and "must match the size" in out.stderr


def test_ae_ckpt_dir_layout_checked_per_checkout(world):
    make_dim3(world["data"])
    load(*overrides(world, "upstream"), f"external.ae_ckpt_dir={ae_dir(world, 'upstream')}")
    with pytest.raises(config.ConfigError, match="ae_ckpt/best_ckpt.pth; the upstream checkout's eval .*HINT"):
        load(*overrides(world, "upstream"), f"external.ae_ckpt_dir={ae_dir(world, 'fork')}")
    with pytest.raises(config.ConfigError, match="the fork checkout's eval reads <dir>/<scene>/best_ckpt.pth"):
        load(*overrides(world, "fork"), f"external.ae_ckpt_dir={ae_dir(world, 'upstream')}")


def test_sam_from_the_checkout_and_clip_needs_refs_main(world):
    sam = world["root"] / "fork" / "ckpts" / "sam_vit_h_4b8939.pth"
    sam.parent.mkdir()
    sam.write_bytes(b"sam")
    cfg = load(*[o for o in overrides(world) if "sam_checkpoint" not in o])
    assert cfg.external.sam_checkpoint == str(sam)  # where LangSplat's README downloads it
    (world["hf_home"] / "hub" / "models--laion--CLIP-ViT-B-16-laion2B-s34B-b88K" / "refs" / "main").unlink()
    out = run([world["root"] / "fork" / "preprocess.py", "--dataset_path", world["data"], "--sam_ckpt_path", sam],
              HF_HOME=str(world["hf_home"]))
    assert out.returncode == 1 and "couldn't connect" in out.stderr  # offline, a snapshot without refs/main
    with pytest.raises(config.ConfigError, match="refs/main.*HINT"):
        load(*overrides(world))


@pytest.mark.parametrize("model, iterations", [("scene_-1", 30000), ("scene", 7000)])
def test_existing_rgb_models_are_found(world, monkeypatch, tmp_path, model, iterations):
    """The fork's README layout, and a model trained to another count than external.iterations."""
    folder = world["data"] / "output" / model
    (folder / "point_cloud" / f"iteration_{iterations}").mkdir(parents=True)
    (folder / f"chkpnt{iterations}.pth").write_bytes(b"PK\x05\x06" + bytes(18))
    cfg = load(*overrides(world))
    assert f"skip rgb: the dataset has {folder / f'chkpnt{iterations}.pth'}" in summary(cfg)
    argv = stage_argv(monkeypatch, cfg, tmp_path, "features", item=1)["argv"]
    assert argv[argv.index("--start_checkpoint") + 1] == str(folder / f"chkpnt{iterations}.pth")
