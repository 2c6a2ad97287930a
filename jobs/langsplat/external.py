"""External mode: the stage graph that drives a user's LangSplat checkout, and its checks.

    python -m hpc.submit langsplat langsplat.mode=external langsplat.data_path=/data/lerf_ovs/teatime \
        external.langsplat_dir=/opt/LangSplat external.sam_checkpoint=/models/sam_vit_h_4b8939.pth \
        external.clip_hf_home=/models/hf --dry-run

preprocess (array over image shards) -> merge -> ae_train -> ae_encode ┐
rgb (needs only COLMAP, runs beside that chain) ───────────────────────┴-> features (array over
levels) -> render (array over levels) -> eval (when the dataset has LERF labels).
A stage whose outputs the dataset already has is skipped, and the plan says why. Planning reads
only the file system: nothing here imports torch or runs the checkout.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional

from hpc.config.schema import ConfigError
from hpc.pipeline.plan import StageDef
from hpc.slurm import noderange

from . import checkout as co
from . import eval_inputs
from . import interpreters as py
from .colmap import layout_problems, registered_images, stem

LEVEL_NAMES = {0: "default (whole image)", 1: "s", 2: "m", 3: "l"}
EVAL_LEVELS = (1, 2, 3)  # eval/evaluate_iou_loc.py reads exactly these
TARGET = "hpc.jobs.langsplat.external_stages"
FINAL_CHECKPOINT = 30000  # render.py loads chkpnt30000.pth whatever the iterations


def scene_name(cfg: Any) -> str:
    return Path(cfg.langsplat.data_path).resolve().name


def image_files(data: str) -> List[str]:
    """What preprocess.py reads: every file in images/, sorted."""
    return sorted(p.name for p in (Path(data) / "images").iterdir())


def has_features(directory: Path, data: str) -> bool:
    """Every image has <name>_f.npy and <name>_s.npy in `directory`."""
    return directory.is_dir() and all((directory / f"{stem(n)}_{k}.npy").is_file()
                                      for n in image_files(data) for k in "fs")


def shards(cfg: Any) -> List[int]:
    count = len(image_files(cfg.langsplat.data_path))
    return list(range(-(-count // max(1, cfg.external.images_per_shard))))


def label_dir(cfg: Any) -> Path:
    given = cfg.external.label_dir
    return Path(given) if given else Path(cfg.langsplat.data_path).resolve().parent / "label"


def dataset_rgb_checkpoint(data: str, iterations: int) -> Optional[Path]:
    """An RGB model trained beforehand, where the READMEs keep it: <data>/output/<name>/ (LangSplat's,
    graphdeco's train.py) or <data>/output/<name>_-1/ (the fork's: its train.py adds _-1). Its
    chkpnt<iterations>.pth, else the checkpoint of the iteration it trained to (its largest
    point_cloud/iteration_<N>, which train.py saves at the end, whatever --iterations was)."""
    name = Path(data).resolve().name
    for model in (Path(data) / "output" / name, Path(data) / "output" / f"{name}_-1"):
        saved = [int(p.name.split("_")[1]) for p in model.glob("point_cloud/iteration_*")
                 if p.name.split("_")[1].isdigit()]
        for n in [iterations, *sorted(saved, reverse=True)[:1]]:
            if (model / f"chkpnt{n}.pth").is_file():
                return model / f"chkpnt{n}.pth"
    return None


def _skips(cfg: Any) -> dict:
    data = cfg.langsplat.data_path
    dim3 = has_features(Path(data) / "language_features_dim3", data)
    full = dim3 or has_features(Path(data) / "language_features", data)
    levels = set(cfg.langsplat.levels)
    why = {}
    if full:
        why["preprocess"] = why["merge"] = ("the dataset has language_features_dim3" if dim3
                                            else "the dataset has language_features for every image")
    if dim3:
        why["ae_train"] = why["ae_encode"] = "the dataset has language_features_dim3"
    given = dataset_rgb_checkpoint(data, cfg.external.iterations)
    if given is not None:
        why["rgb"] = f"the dataset has {given}"
    if not any(label_dir(cfg).joinpath(scene_name(cfg)).glob("frame_*.json")):
        why["eval"] = f"no LERF labels at {label_dir(cfg) / scene_name(cfg)}/frame_*.json"
    elif not levels >= set(EVAL_LEVELS):
        why["eval"] = f"eval reads levels 1 2 3, and --levels is {sorted(levels)}"
    elif dim3 and not cfg.external.ae_ckpt_dir:
        why["eval"] = "no autoencoder is trained here and external.ae_ckpt_dir is not set"
    return why


def stages(cfg: Any) -> List[StageDef]:
    mode = co.detect(cfg.external.langsplat_dir, cfg.external.gaussian_splatting_dir)
    levels = tuple(cfg.langsplat.levels)
    why = _skips(cfg)
    per_level = ", ".join(f"{lv}={LEVEL_NAMES[lv]}" for lv in levels)
    features = ("fork train_ddp.py under hpc.launch, one rank per GPU: " + ddp_equivalence(cfg)
                if mode == co.FORK else "upstream train.py on one GPU")
    rgb = ("graphdeco train.py" if cfg.external.gaussian_splatting_dir else "fork train.py --no_include_feature")
    graph = [
        StageDef("preprocess", f"{TARGET}:preprocess", items=tuple(shards(cfg)),
                 describe=f"preprocess.py (SAM + CLIP) on {cfg.external.images_per_shard} images per shard"),
        StageDef("merge", f"{TARGET}:merge", after=("preprocess",),
                 describe="check: every image has <name>_f.npy and <name>_s.npy"),
        StageDef("ae_train", f"{TARGET}:ae_train", after=("merge",), describe="autoencoder/train.py"),
        StageDef("ae_encode", f"{TARGET}:ae_encode", after=("ae_train",),
                 describe="autoencoder/test.py (writes language_features_dim3)"),
        StageDef("rgb", f"{TARGET}:rgb", describe=f"{rgb}, {cfg.external.iterations} iterations"),
        StageDef("features", f"{TARGET}:features", items=levels, after=("ae_encode", "rgb"),
                 resources="features" if mode == co.FORK else "features_1gpu",
                 describe=f"{features}; levels {per_level}"),
        StageDef("render", f"{TARGET}:render", items=levels, per_item_after="features",
                 describe="render.py --include_feature on <run>/output/<name>_<level>"),
        StageDef("eval", f"{TARGET}:eval", after=("render",), describe="eval/evaluate_iou_loc.py"),
    ]
    python = stage_interpreters(cfg, mode)
    return [StageDef(**{**s.__dict__, "skip": why.get(s.name, ""),
                        "describe": s.describe + (f" (python {python[s.name]})" if s.name in python else "")})
            for s in graph]


def stage_interpreters(cfg: Any, mode: str) -> dict:
    """stage -> the interpreter its script runs in (merge runs no script)."""
    ext = cfg.external
    langsplat = py.interpreter(ext, py.LANGSPLAT)
    rgb = py.interpreter(ext, py.GAUSSIAN_SPLATTING) if mode == co.UPSTREAM else langsplat
    return {**{s: langsplat for s in ("preprocess", "ae_train", "ae_encode", "features", "render", "eval")},
            "rgb": rgb}


def ddp_equivalence(cfg: Any) -> str:
    ext = cfg.external
    if ext.ddp_work == "updates":
        return (f"--iterations {ext.iterations} --match_single_gpu_updates: {ext.iterations} x W updates of W "
                "cameras each (W ranks), i.e. W times the single-GPU job's camera views in about its time")
    return (f"--epochs E --scale_lr with E = round({ext.iterations} / cameras): E x (cameras // W) updates "
            f"of W cameras = about {ext.iterations} camera views, the single-GPU job's work, at W times "
            "its learning rate, in about 1/W of its time")


def notes(cfg: Any) -> List[str]:
    if cfg.langsplat.mode != "external":
        return []
    mode = co.detect(cfg.external.langsplat_dir, cfg.external.gaussian_splatting_dir)
    lines = [f"checkout: {mode} ({cfg.external.langsplat_dir}: "
             + ("has train_ddp.py)" if mode == co.FORK else "no train_ddp.py; RGB by graphdeco "
                f"{cfg.external.gaussian_splatting_dir})")]
    lines.append(f"features: checkpoints every {cfg.external.checkpoint_every} iterations and at the last; "
                 "a requeued stage restarts the script from its newest chkpnt*.pth "
                 f"(render.py loads chkpnt{FINAL_CHECKPOINT}.pth: hpc links it to the last one)")
    lines.append("render of each level waits only for that level's features task (aftercorr)")
    python = stage_interpreters(cfg, mode)
    lines.append(f"interpreters: LangSplat's scripts run in {python['features']}"
                 + (f", graphdeco's train.py (rgb) in {python['rgb']}" if mode == co.UPSTREAM else ""))
    return lines


PATH_KEYS = ("langsplat_dir", "gaussian_splatting_dir", "sam_checkpoint", "clip_hf_home", "ae_ckpt_dir", "label_dir")
SAM_IN_CHECKOUT = "ckpts/sam_vit_h_4b8939.pth"  # where LangSplat's README downloads it


def absolute_paths(cfg: Any) -> None:
    """Make every path of the config absolute (~ expanded), as the saved config.yaml keeps it: a job
    may start elsewhere than the submission, a resubmission may come from another directory, and
    preprocess.py reads its SAM checkpoint relative to its own working directory."""
    def absolute(value: Optional[str]) -> Optional[str]:
        return os.path.abspath(os.path.expanduser(value)) if value else value

    cfg.langsplat.data_path = absolute(cfg.langsplat.data_path)
    for key in PATH_KEYS:
        cfg.external[key] = absolute(cfg.external[key])
    for key in ("python", "gaussian_splatting_python"):
        if cfg.external[key] and os.sep in cfg.external[key]:  # a bare name is looked up on PATH
            cfg.external[key] = absolute(cfg.external[key])
    in_checkout = Path(cfg.external.langsplat_dir or "") / SAM_IN_CHECKOUT
    if not cfg.external.sam_checkpoint and cfg.external.langsplat_dir and in_checkout.is_file():
        cfg.external.sam_checkpoint = str(in_checkout)


def validate(cfg: Any) -> None:
    """Every check before submission (the paths made absolute by then); each failure one line with a HINT."""
    ext, data = cfg.external, cfg.langsplat.data_path
    bad = [lv for lv in cfg.langsplat.levels if lv not in LEVEL_NAMES]
    if bad or len(set(cfg.langsplat.levels)) != len(cfg.langsplat.levels):
        raise ConfigError(f"levels {list(cfg.langsplat.levels)}: unknown or repeated; LangSplat's "
                          "--feature_level takes 0 (default) 1 (s) 2 (m) 3 (l). HINT: --levels 1 2 3")
    if not data or not Path(data).is_dir():
        raise ConfigError(f"langsplat.data_path={data!r} is not a directory; external mode needs the scene "
                          "there. HINT: langsplat.data_path=/path/to/scene (images/ and sparse/0/)")
    problems = layout_problems(data)
    if problems:
        raise ConfigError(f"langsplat.data_path={data}: {'; '.join(problems)}; expected a COLMAP scene. "
                          "HINT: run LangSplat's convert.py on <scene>/input first")
    if ext.ddp_work not in ("views", "updates"):
        raise ConfigError(f"external.ddp_work={ext.ddp_work!r}; expected views or updates. HINT: "
                          "external.ddp_work=views does the single-GPU job's work in 1/W of its time")
    _check_checkouts(cfg)
    graph = {s.name: s for s in stages(cfg)}
    if not graph["preprocess"].skip:
        _check_weights(ext)
    if not graph["ae_train"].skip and ext.ae_epochs < 97:
        raise ConfigError(f"external.ae_epochs={ext.ae_epochs}; autoencoder/train.py saves best_ckpt.pth only "
                          "from epoch 96, so at least 97 are needed. HINT: external.ae_epochs=100")
    mode = co.detect(ext.langsplat_dir, ext.gaussian_splatting_dir)
    if not graph["eval"].skip:
        _check_weights(ext, sam=False)
        eval_inputs.check(label_dir(cfg) / scene_name(cfg), data, ext.ae_ckpt_dir, mode)
    py.check(ext, py.LANGSPLAT, sam=not graph["preprocess"].skip)
    if mode == co.UPSTREAM and not graph["rgb"].skip:
        py.check(ext, py.GAUSSIAN_SPLATTING)
    res = cfg.stages.features
    most_nodes = noderange.bounds(res.nodes)[1]  # a node range may start on its maximum
    ranks = res.local_tasks if cfg.cluster.kind in ("local", "debug") else most_nodes * res.tasks_per_node
    cameras = len(registered_images(data))
    if mode == co.FORK and cameras < ranks:
        raise ConfigError(f"the scene has {cameras} cameras but stages.features runs {ranks} ranks; train_ddp.py "
                          "needs a camera per rank. HINT: lower stages.features.nodes or tasks_per_node")


def _check_checkouts(cfg: Any) -> None:
    ext = cfg.external
    mode = co.detect(ext.langsplat_dir, ext.gaussian_splatting_dir)
    wanted = [rel for name, rel in co.SCRIPTS.items() if not _skipped(cfg, name)]
    missing = co.missing_scripts(ext.langsplat_dir, wanted + (["train_ddp.py"] if mode == co.FORK else []))
    if missing:
        raise ConfigError(f"external.langsplat_dir={ext.langsplat_dir!r} lacks {', '.join(missing)}; expected a "
                          "LangSplat checkout. HINT: external.langsplat_dir=/path/to/LangSplat (minghanqin/LangSplat "
                          "or the DDP fork jiagaoxiang/LangSplat)")
    if mode == co.UPSTREAM and not _skipped(cfg, "rgb") and co.missing_scripts(ext.gaussian_splatting_dir, ["train.py"]):
        raise ConfigError(f"upstream LangSplat cannot train the RGB model, and external.gaussian_splatting_dir="
                          f"{ext.gaussian_splatting_dir!r} has no train.py. HINT: external.gaussian_splatting_dir="
                          "/path/to/gaussian-splatting (graphdeco), or use the DDP fork, which has train_ddp.py")


def _skipped(cfg: Any, stage: str) -> bool:
    return bool(_skips(cfg).get(stage))


def _check_weights(ext: Any, sam: bool = True) -> None:
    if sam and not (ext.sam_checkpoint and Path(ext.sam_checkpoint).is_file()):
        raise ConfigError(f"external.sam_checkpoint={ext.sam_checkpoint!r} is not a file; preprocess.py needs SAM "
                          "ViT-H and compute nodes may be offline. HINT: download sam_vit_h_4b8939.pth and pass "
                          f"external.sam_checkpoint=/abs/path/sam_vit_h_4b8939.pth or put it at <langsplat_dir>/{SAM_IN_CHECKOUT} "
                          "(or give the dataset its "
                          "language_features)")
    if not (ext.clip_hf_home and co.clip_weights(ext.clip_hf_home)):
        raise ConfigError(f"external.clip_hf_home={ext.clip_hf_home!r} holds no {co.CLIP_REPO_DIR} with refs/main "
                          "and the weights in the snapshot it names; OpenCLIP then downloads them, which fails on "
                          "offline nodes. HINT: on a login node run "
                          "HF_HOME=/models/hf python -c \"import open_clip; open_clip.create_model_and_transforms("
                          "'ViT-B-16', pretrained='laion2b_s34b_b88k')\" and pass external.clip_hf_home=/models/hf")
