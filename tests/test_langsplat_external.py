"""External mode against stand-ins of the real scripts (tests/langsplat_standins).
pytest tests/test_langsplat_external.py"""
import json
import os
import socket
from pathlib import Path

import pytest
import ranklaunch

from hpc import submit
from hpc.config import schema as config
from hpc.jobs.langsplat import external_stages as es
from hpc.jobs.langsplat import pipeline as lp
from hpc.pipeline import plan
from hpc.rundir.run import RunDir
from tests.langsplat_standins.checkout import make_checkout, make_dim3, make_env, make_scene, make_weights


@pytest.fixture
def world(tmp_path):
    """A scene with LERF labels, the weights, a fork, upstream and 3DGS checkout, and an
    interpreter for each rasterizer: LangSplat's ("python") and graphdeco's ("gs_python")."""
    for variant, name in (("fork", "fork"), ("upstream", "upstream"), ("3dgs", "gs")):
        make_checkout(tmp_path / name, variant)
    make_scene(tmp_path / "data" / "scene")
    return {"root": tmp_path, "data": tmp_path / "data" / "scene", **make_weights(tmp_path),
            "python": make_env(tmp_path / "envs" / "langsplat", "langsplat"),
            "gs_python": make_env(tmp_path / "envs" / "3dgs", "3dgs")}


def env(**extra):
    out = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
    return {**out, **extra}


def run(argv, cwd=None, python=None, runner=False, **extra):
    """A stand-in script of a `world` under `python` (default: the world's LangSplat environment, or
    graphdeco's for gs/train.py), through hpc's script runner when `runner`, as the stages run it;
    forked from a warm interpreter of `python` (tests/ranklaunch.py:run: torch imported once)."""
    script = Path(argv[0])
    root = next(p for p in script.parents if (p / "envs").is_dir())
    python = python or root / "envs" / ("3dgs" if script.parent.name == "gs" else "langsplat") / "bin" / "python"
    argv = [es.RUNNER, *argv] if runner else argv
    return ranklaunch.run([python, *argv], cwd=cwd, env=env(**extra))


def rgb_checkpoint(world, iterations=4):
    make_dim3(world["data"])
    out = run([world["root"] / "gs" / "train.py", "-s", world["data"], "-m", world["root"] / "rgb",
               "--iterations", iterations, "--checkpoint_iterations", iterations, "--port", 0])
    assert out.returncode == 0, out.stderr
    return world["root"] / "rgb" / f"chkpnt{iterations}.pth"


def test_upstream_train_rejects_no_include_feature_the_fork_accepts_it(world):
    args = ["-s", world["data"], "-m", world["root"] / "m", "--no_include_feature", "--iterations", 2, "--port", 0]
    upstream = run([world["root"] / "upstream" / "train.py", *args])
    assert upstream.returncode == 2 and "unrecognized arguments: --no_include_feature" in upstream.stderr
    assert run([world["root"] / "fork" / "train.py", *args]).returncode == 0
    assert (world["root"] / "m_-1" / "cfg_args").is_file()  # -m + _<feature_level>, default -1


def test_checkpoint_tuples_decide_the_first_iteration(world):
    rgb = rgb_checkpoint(world)
    train = world["root"] / "upstream" / "train.py"
    base = ["-s", world["data"], "-m", world["root"] / "f", "--feature_level", 2, "--port", 0]
    assert run([train, *base, "--iterations", 6, "--checkpoint_iterations", 3, "--start_checkpoint", rgb],
               runner=True).returncode == 0
    resumed = run([train, *base, "--iterations", 6, "--start_checkpoint", world["root"] / "f_2" / "chkpnt3.pth"],
                  runner=True)
    assert resumed.returncode == 0
    starts = [json.loads(line)["start_iteration"] for line in (world["root"] / "f_2" / "standin.jsonl").open()]
    assert starts == [1, 4]  # a 12-entry RGB checkpoint starts at 0, a 13-entry one at its iteration
    gs = run([world["root"] / "gs" / "train.py", "-s", world["data"], "-m", world["root"] / "g", "--port", 0,
              "--start_checkpoint", world["root"] / "f_2" / "chkpnt3.pth"], runner=True)
    assert gs.returncode == 1 and "too many values to unpack" in gs.stderr


def test_two_trainings_with_the_default_port_collide(world):
    rgb = rgb_checkpoint(world)
    train = world["root"] / "upstream" / "train.py"
    with socket.socket() as taken:
        try:  # held here, or by someone else on this machine: taken either way
            taken.bind(("127.0.0.1", 55555))
            taken.listen()
        except OSError:
            pass
        out = run([train, "-s", world["data"], "-m", world["root"] / "f", "--feature_level", 1,
                   "--start_checkpoint", rgb, "--iterations", 2])
    assert out.returncode == 1 and "Address already in use" in out.stderr


def test_train_ddp_needs_master_address_and_a_camera_per_rank(world):
    ddp = world["root"] / "fork" / "train_ddp.py"
    args = ["-s", world["data"], "-m", world["root"] / "d", "--feature_level", 1, "--dist_backend", "gloo",
            "--start_checkpoint", rgb_checkpoint(world), "--iterations", 2]
    out = run([ddp, *args], SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_LOCALID="0")
    assert out.returncode == 1 and "MASTER_ADDR" in out.stderr  # env:// even in the SLURM branch
    port = str(es.free_port())
    out = run([ddp, *args, "--match_single_gpu_updates"], RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
              MASTER_PORT=port, CUDA_VISIBLE_DEVICES="0", LOCAL_RANK="1")
    assert out.returncode == 1 and "invalid device ordinal" in out.stderr  # set_device(LOCAL_RANK)


def test_autoencoder_saves_only_from_epoch_96_in_its_working_directory(world, tmp_path):
    assert run([world["root"] / "upstream" / "preprocess.py",
                "--dataset_path", world["data"], "--sam_ckpt_path", world["sam"]],
               HF_HOME=str(world["hf_home"])).returncode == 0
    ae = world["root"] / "upstream" / "autoencoder" / "train.py"
    args = ["--dataset_path", world["data"], "--dataset_name", "scene"]
    assert run([ae, *args, "--num_epochs", 96], cwd=tmp_path).returncode == 0
    assert not (tmp_path / "ckpt" / "scene" / "best_ckpt.pth").exists()
    assert run([ae, *args, "--output", "x"], cwd=tmp_path).returncode == 2  # the README's flag does not exist
    assert run([ae, *args, "--num_epochs", 97], cwd=tmp_path).returncode == 0
    assert (tmp_path / "ckpt" / "scene" / "best_ckpt.pth").is_file()


def test_preprocess_without_clip_cache_fails_offline(world):
    out = run([world["root"] / "upstream" / "preprocess.py", "--dataset_path", world["data"],
               "--sam_ckpt_path", world["sam"]], HF_HOME=str(world["root"] / "empty"))
    assert out.returncode == 1 and "couldn't connect" in out.stderr


def test_runner_imports_torch_only_with_the_script_and_still_allows_numpy_scalars(tmp_path):
    """Real processes (not warm ones: those have torch already). The allowance is added when the
    script imports torch, before its first torch.load."""
    import subprocess
    import sys

    bare = tmp_path / "bare.py"
    bare.write_text("import sys\nprint('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, es.RUNNER, bare], capture_output=True, text=True, env=env())
    assert (out.returncode, out.stdout) == (0, "False\n"), out.stderr
    loads = tmp_path / "loads.py"
    loads.write_text("import sys, numpy, torch\ntorch.save((numpy.float64(1.5),), sys.argv[1])\n"
                     "print(torch.load(sys.argv[1])[0])\n")  # the default weights_only=True
    out = subprocess.run([sys.executable, es.RUNNER, loads, tmp_path / "c.pth"], capture_output=True, text=True,
                         env=env())
    assert (out.returncode, out.stdout) == (0, "1.5\n"), out.stderr


def test_checkpoint_iterations_are_a_cadence_plus_the_last():
    assert es.checkpoint_iterations(30000, 7000) == [7000, 14000, 21000, 28000, 30000]
    assert es.checkpoint_iterations(60000, 10000) == [10000, 20000, 40000, 50000, 60000]  # 30000 is render's
    assert es.checkpoint_iterations(5, 0) == [5]


def test_newest_checkpoint_ignores_links_and_other_names(tmp_path):
    import torch

    for n in (3, 12, 7):
        torch.save(({"n": n}, n), tmp_path / f"chkpnt{n}.pth")
    (tmp_path / "chkpnt30000.pth").symlink_to("chkpnt12.pth")
    torch.save({}, tmp_path / "chkpnt_best.pth")
    assert es.newest_checkpoint(tmp_path) == tmp_path / "chkpnt12.pth"
    assert es.newest_checkpoint(tmp_path / "none") is None


def test_newest_checkpoint_skips_one_cut_short_while_saving(tmp_path, capsys):
    import torch

    for n in (4, 8):
        torch.save(({"n": n}, n), tmp_path / f"chkpnt{n}.pth")
    whole = (tmp_path / "chkpnt8.pth").read_bytes()
    (tmp_path / "chkpnt8.pth").write_bytes(whole[:len(whole) // 2])  # preempted inside torch.save
    assert es.newest_checkpoint(tmp_path) == tmp_path / "chkpnt4.pth"
    assert f"skipping {tmp_path / 'chkpnt8.pth'}: not a complete torch.save archive" in capsys.readouterr().err


def overrides(world, checkout="fork", *extra):
    out = ["langsplat.mode=external", f"langsplat.data_path={world['data']}",
           f"external.langsplat_dir={world['root'] / checkout}", f"external.sam_checkpoint={world['sam']}",
           f"external.clip_hf_home={world['hf_home']}", "cluster.kind=local", f"external.python={world['python']}"]
    if checkout == "upstream":
        out += [f"external.gaussian_splatting_dir={world['root'] / 'gs'}",
                f"external.gaussian_splatting_python={world['gs_python']}"]
    return out + list(extra)


def load(*items):
    pipe = plan.get_pipeline("langsplat")
    cfg = config.load(pipe.schema, "langsplat", None, list(items), extra=pipe.templates, settle=pipe.settle)
    pipe.validate(cfg)
    return cfg


def summary(cfg):
    return plan.make_plan(plan.get_pipeline("langsplat"), cfg, "/r", "slurm").summary()


def test_mode_detected_from_the_files_and_stated(world):
    fork, upstream = load(*overrides(world)), load(*overrides(world, "upstream"))
    assert "checkout: fork" in summary(fork) and "train_ddp.py under hpc.launch" in summary(fork)
    assert "checkout: upstream" in summary(upstream) and "graphdeco train.py" in summary(upstream)
    assert [s.resources for s in lp.stages(upstream) if s.name == "features"] == ["features_1gpu"]


def test_levels_default_to_langsplat_s_m_l_and_pass_through(world):
    assert list(load(*overrides(world)).langsplat.levels) == [1, 2, 3]
    assert "levels 1=s, 2=m, 3=l" in summary(load(*overrides(world)))
    assert list(load(*overrides(world, "fork", "langsplat.levels=[0,1,2]")).langsplat.levels) == [0, 1, 2]
    assert list(load("langsplat.levels=[0,1,2]").langsplat.levels) == [0, 1, 2]  # synthetic keeps its three
    with pytest.raises(config.ConfigError, match="HINT: --levels 1 2 3"):
        load(*overrides(world, "fork", "langsplat.levels=[4]"))
    with pytest.raises(config.ConfigError, match="synthetic scene has levels"):
        load("langsplat.levels=[3]")


@pytest.mark.parametrize("breaks, message", [
    (lambda w: (w["data"] / "sparse" / "0" / "points3D.txt").unlink(), "points3D.bin \\(or .txt\\) is missing"),
    (lambda w: w["sam"].unlink(), "external.sam_checkpoint=.* is not a file"),
    (lambda w: [p.unlink() for p in w["hf_home"].rglob("*.bin")], "holds no models--laion"),
    (lambda w: (w["root"] / "fork" / "render.py").unlink(), "lacks render.py"),
])
def test_validation_one_line_with_a_hint(world, breaks, message):
    breaks(world)
    with pytest.raises(config.ConfigError, match=message) as err:
        load(*overrides(world))
    assert "HINT" in str(err.value) and "\n" not in str(err.value)


def test_upstream_needs_gaussian_splatting_for_rgb(world):
    items = [o for o in overrides(world, "upstream") if "gaussian_splatting_dir" not in o]
    with pytest.raises(config.ConfigError, match="upstream LangSplat cannot train the RGB model"):
        load(*items)


def test_stages_with_outputs_in_the_dataset_are_skipped_and_say_why(world):
    assert run([world["root"] / "fork" / "preprocess.py", "--dataset_path", world["data"], "--sam_ckpt_path",
                world["sam"]], HF_HOME=str(world["hf_home"])).returncode == 0
    text = summary(load(*overrides(world)))
    assert "skip preprocess: the dataset has language_features for every image" in text
    assert "stage ae_train" in text and "stage preprocess" not in text
    (world["root"] / "data" / "label" / "scene" / "frame_00001.json").unlink()
    (world["root"] / "data" / "label" / "scene" / "frame_00006.json").unlink()
    assert "skip eval: no LERF labels" in summary(load(*overrides(world)))


def test_fork_graph_on_the_local_executor(world, monkeypatch):
    """Every stage but eval, two levels at once, each on 2 ranks of this machine. Eval reads all three
    levels: the whole graph, eval included, runs on SLURM (tests/slurm/test_langsplat_external.py)."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    run_dir = world["root"] / "run"
    code = submit.main(["langsplat", "--cluster", "local", "--run-dir", str(run_dir), *overrides(world),
                        "langsplat.levels=[1,2]", "external.iterations=12", "external.checkpoint_every=4",
                        "external.ae_epochs=97", "external.dist_backend=gloo"])
    assert code == 0
    out = run_dir / "output"
    for level in (1, 2):
        assert RunDir(run_dir).is_done("render", level)
        assert len(list((out / f"scene_{level}" / "train" / "ours_None" / "renders_npy").glob("*.npy"))) == 6
        first = json.loads((out / f"scene_{level}" / "standin.jsonl").read_text().splitlines()[0])
        # views: --epochs round(12/6)=2 on 2 ranks = 2 x (6 // 2) = 6 updates of 2 cameras, lr x 2
        assert (first["world_size"], first["iterations"], first["lr_scale"]) == (2, 6, 2)
        assert first["omp_num_threads"] == "1"  # as torchrun sets it for 2 processes on a node
        assert os.readlink(out / f"scene_{level}" / "chkpnt30000.pth") == "chkpnt6.pth"
    assert (out / "scene_-1" / "chkpnt12.pth").is_file()  # fork train.py --no_include_feature: -m + _-1
    assert not (out / "scene_3").exists() and not (run_dir / "eval").exists()
    assert (run_dir / "autoencoder" / "ckpt" / "scene" / "best_ckpt.pth").is_file()  # the fork's eval layout


def stage_argv(monkeypatch, cfg, tmp_path, stage, item=None, rank=0, world=1):
    """The argv (and working directory) a stage target would run, without running it."""
    from types import SimpleNamespace

    seen = {}
    monkeypatch.setattr(es.Stage, "run_script", lambda self, argv, name, launch=False, cwd=None, env=None:
                        seen.update(argv=argv, launch=launch, cwd=cwd, env=env) or {})
    ctx = SimpleNamespace(cfg=config.to_dict(cfg), run_dir=tmp_path / "run", item=item,
                          stage_dir=tmp_path / "run" / stage, env=SimpleNamespace(rank=rank, world_size=world))
    getattr(es, stage)(ctx)
    return seen


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_rgb_argv_per_checkout_and_its_resume(world, monkeypatch, tmp_path):
    fork = stage_argv(monkeypatch, load(*overrides(world), "external.iterations=9"), tmp_path, "rgb")["argv"]
    assert fork[2] == str(world["root"] / "fork" / "train.py") and "--no_include_feature" in fork
    assert (fork[0], fork[1]) == (str(world["python"]), es.RUNNER)
    gs = stage_argv(monkeypatch, load(*overrides(world, "upstream"), "external.iterations=9",
                                      "external.checkpoint_every=4"), tmp_path, "rgb")["argv"]
    assert gs[2] == str(world["root"] / "gs" / "train.py") and "--no_include_feature" not in gs
    assert gs[0] == str(world["gs_python"])  # graphdeco's environment, with its own rasterizer
    assert gs[gs.index("--checkpoint_iterations") + 1:][:2] == ["4", "8"] and "9" in gs
    assert "--start_checkpoint" not in gs
    assert int(flag(gs, "--port")) not in (6009, 55555)  # a free one: tasks on one node must not collide
    model = tmp_path / "run" / "output" / "scene"  # graphdeco writes -m as given
    model.mkdir(parents=True)
    for n in (4, 8):
        (model / f"chkpnt{n}.pth").write_bytes(b"PK\x05\x06" + bytes(18))  # an (empty) zip, as torch.save writes
    gs = stage_argv(monkeypatch, load(*overrides(world, "upstream"), "external.iterations=9"), tmp_path, "rgb")["argv"]
    assert flag(gs, "--start_checkpoint") == str(model / "chkpnt8.pth")


def test_features_argv_fork_views_updates_and_upstream(world, monkeypatch, tmp_path):
    cfg = load(*overrides(world), "external.iterations=12", "external.checkpoint_every=0")
    seen = stage_argv(monkeypatch, cfg, tmp_path, "features", item=3, world=4)
    argv = seen["argv"]
    assert seen["launch"] and argv[2].endswith("train_ddp.py") and "--port" not in argv  # it binds no GUI port
    # views: --epochs round(12 / 6 cameras) = 2, so 2 x (6 // 4) = 2 updates of 4 cameras; lr x 4
    assert (flag(argv, "--epochs"), "--scale_lr" in argv, flag(argv, "--checkpoint_iterations")) == ("2", True, "2")
    assert flag(argv, "--feature_level") == "3" and flag(argv, "--start_checkpoint").endswith("scene_-1/chkpnt12.pth")
    updates = stage_argv(monkeypatch, load(*overrides(world), "external.iterations=12", "external.ddp_work=updates",
                                           "external.checkpoint_every=0"), tmp_path, "features", item=1, world=4)
    argv = updates["argv"]  # the script multiplies --iterations by the world size, and so the last checkpoint's name
    assert "--match_single_gpu_updates" in argv and flag(argv, "--iterations") == "12"
    assert flag(argv, "--checkpoint_iterations") == "48"
    up = stage_argv(monkeypatch, load(*overrides(world, "upstream"), "external.iterations=12"), tmp_path,
                    "features", item=1)
    argv = up["argv"]
    assert not up["launch"] and argv[2] == str(world["root"] / "upstream" / "train.py")
    assert argv[0] == str(world["python"])
    assert flag(argv, "--start_checkpoint") == str(tmp_path / "run" / "output" / "scene" / "chkpnt12.pth")
    assert int(flag(argv, "--port")) != 55555
    level = tmp_path / "run" / "output" / "scene_1"  # a requeued task: its own 13-entry checkpoint
    level.mkdir(parents=True)
    (level / "chkpnt4.pth").write_bytes(b"PK\x05\x06" + bytes(18))
    argv = stage_argv(monkeypatch, load(*overrides(world, "upstream"), "external.iterations=12"), tmp_path,
                      "features", item=1)["argv"]
    assert flag(argv, "--start_checkpoint") == str(level / "chkpnt4.pth")


def test_autoencoder_and_eval_agree_on_each_checkouts_layout(world, monkeypatch, tmp_path):
    for checkout, name, ckpt in (("fork", "scene", "scene/best_ckpt.pth"),
                                 ("upstream", "scene/ae_ckpt", "scene/ae_ckpt/best_ckpt.pth")):
        cfg = load(*overrides(world, checkout))
        train = stage_argv(monkeypatch, cfg, tmp_path, "ae_train")
        assert flag(train["argv"], "--dataset_name") == name and train["cwd"] == tmp_path / "run" / "autoencoder"
        assert Path(flag(train["argv"], "--dataset_path")).is_absolute()  # the script runs elsewhere
        encode = stage_argv(monkeypatch, cfg, tmp_path, "ae_encode")
        assert flag(encode["argv"], "--dataset_name") == name and encode["cwd"] == train["cwd"]
        ev = stage_argv(monkeypatch, cfg, tmp_path, "eval")
        # evaluate_iou_loc.py reads <ae_ckpt_dir>/<dataset_name>/[ae_ckpt/]best_ckpt.pth: where train.py saved it
        assert Path(flag(ev["argv"], "--ae_ckpt_dir")) / ckpt == train["cwd"] / "ckpt" / name / "best_ckpt.pth"
        assert ev["cwd"] == world["root"] / checkout / "eval"


def test_preprocess_gets_absolute_weights_and_offline_clip(world, monkeypatch, tmp_path):
    monkeypatch.chdir(world["root"])  # paths relative to the submission directory
    cfg = load(*[o for o in overrides(world) if "sam_checkpoint" not in o and "data_path" not in o],
               "external.sam_checkpoint=ckpts/sam_vit_h_4b8939.pth", "langsplat.data_path=data/scene")
    assert cfg.langsplat.data_path == str(world["data"])  # saved so in config.yaml
    monkeypatch.chdir(tmp_path)  # the job starts elsewhere
    seen = stage_argv(monkeypatch, cfg, tmp_path, "preprocess", item=0)
    assert flag(seen["argv"], "--sam_ckpt_path") == str(world["sam"])  # preprocess.py resolves it in its cwd
    assert seen["env"] == {"HF_HOME": str(world["hf_home"]), "HF_HUB_OFFLINE": "1"}


def test_train_ddp_needs_a_camera_per_rank_refused_before_submission(world):
    with pytest.raises(config.ConfigError, match="6 cameras but stages.features runs 8 ranks"):
        load(*overrides(world), "stages.features.local_tasks=8")


def test_standin_reads_language_features_at_the_image_pixels(tmp_path):
    import numpy as np

    from tests.langsplat_standins.common import language_feature

    (tmp_path / "lf").mkdir()
    seg = -np.ones((4, 4, 6), np.int32)
    seg[1, :2, :3] = 0  # the top-left 2 x 3 pixels
    seg[1, 2:, 3:] = 1
    np.save(tmp_path / "lf" / "a_s.npy", seg)
    np.save(tmp_path / "lf" / "a_f.npy", np.eye(2, 512, dtype=np.float32))
    # a map larger than the image is read at its top-left corner, as Camera.get_language_feature does
    assert language_feature(tmp_path, "a", "lf", 1, (2, 3))[:2].tolist() == [1, 0]
    with pytest.raises(IndexError):
        language_feature(tmp_path, "a", "lf", 1, (5, 6))
    with pytest.raises(ValueError):
        language_feature(tmp_path, "a", "lf", 4, (2, 3))
