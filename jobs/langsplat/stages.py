"""LangSplat stage entry points of the built-in reference trainer (called by hpc.jobs.langsplat.pipeline).

    python -c "from pathlib import Path; from hpc.jobs.langsplat.stages import train_rgb; \
print(train_rgb({}, Path('/tmp/ls/rgb')))"

train_rgb(cfg, out_dir) runs in one process; train_features(cfg, out_dir, level, rgb_dir) runs in
every task of a DDP job and opens hpc.ddp.session itself. cfg is the plain `langsplat:` config
section; the trainer's knobs come from its `trainer:` entry over hpc.jobs.langsplat.defaults.TRAINER.
Outputs in out_dir: metrics.json, renders/*.png, tensorboard/, and gaussians.pt (stage 1, plain
tensors, loadable with weights_only=True) or features.pt (stage 2).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from .defaults import trainer_config
from .outputs import write_metrics, write_png

GEOMETRY_FILE = "gaussians.pt"
FEATURES_FILE = "features.pt"


def _setup(cfg: dict, ranks_on_node: int = 1) -> None:
    """Threads and determinism: the same seed must give the same numbers on every run."""
    torch.set_num_threads(max(1, int(cfg["threads"]) // max(1, ranks_on_node)))
    # cuBLAS needs this workspace setting to be deterministic; must be set before CUDA starts.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(int(cfg["seed"]))


def train_rgb(section: dict, out_dir: Path) -> dict:
    """Stage 1: fit geometry and colour with densification; write gaussians.pt and PSNR.
    Resumes from out_dir/checkpoints when a previous attempt was stopped."""
    # torch and the trainer: in the task only, never when planning
    import hpc.ddp

    # the trainer's modules import torch: here, in the task
    from .rgb import evaluate_rgb, fit_geometry
    from .scene import make_scene

    cfg = trainer_config(section)
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    with hpc.ddp.session() as s:  # one process: no process group, but device, rank and stop flag
        _setup(cfg)
        out_dir.mkdir(parents=True, exist_ok=True)
        scene = make_scene(cfg)
        params, loop = fit_geometry(s, cfg, scene, out_dir)
        params = {k: v.cpu().contiguous() for k, v in params.items()}
        result = evaluate_rgb(params, scene)
        train = evaluate_rgb(params, scene, scene.train_views)
        loop.log("rgb/test_psnr", result["psnr"], cfg["rgb_iterations"])
        _write_rgb_renders(params, scene, out_dir, loop.writer)
        loop.finish()
        torch.save(params, out_dir / GEOMETRY_FILE)
    metrics = {"stage": "rgb", "psnr": result["psnr"], "psnr_per_view": result["per_view"],
               "train_psnr": train["psnr"], "gaussians": len(params["means"]),
               "resumed_from": loop.resumed_step, "seconds": time.perf_counter() - t0}
    write_metrics(out_dir / "metrics.json", metrics)
    return metrics


@torch.no_grad()
def _write_rgb_renders(params: dict, scene, out_dir: Path, tb) -> None:
    from .render import render_rgb  # torch: in the task only

    for v in scene.test_views[:4]:
        pred = render_rgb(params, scene.cameras[v], scene.background)
        pair = torch.cat([pred, scene.images[v]], dim=1)  # render | ground truth
        write_png(out_dir / "renders" / f"rgb-view{v:03d}.png", pair)
        tb.add_image(f"rgb/view{v:03d}", pair, dataformats="HWC")


def load_geometry(rgb_dir: Path) -> dict:
    path = Path(rgb_dir) / GEOMETRY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"stage 1 geometry {path} does not exist; the features stage "
                                "loads it. HINT: run the rgb stage first (it writes gaussians.pt)")
    return torch.load(path, map_location="cpu", weights_only=True)


def train_features(section: dict, out_dir: Path, level: int, rgb_dir: Path) -> dict:
    """Stage 2 for one level; every DDP rank calls it. Returns the held-out metrics."""
    import hpc.ddp

    # torch: in the task only, never when planning
    from .evaluate import evaluate_features, write_feature_outputs
    from .features import FeatureField, fit_features
    from .scene import LEVEL_NAMES, make_scene

    cfg = trainer_config(section)
    level = int(level)
    if level not in range(len(LEVEL_NAMES)):
        raise ValueError(f"feature level {level} unknown; expected one of "
                         f"{list(range(len(LEVEL_NAMES)))} ({', '.join(LEVEL_NAMES)}). "
                         "HINT: --levels 0 1 2")
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    with hpc.ddp.session() as s:
        _setup(cfg, s.env.local_world_size)
        out_dir.mkdir(parents=True, exist_ok=True)
        scene = make_scene(cfg)
        geometry = {k: v.to(s.device) for k, v in load_geometry(rgb_dir).items()}
        field = FeatureField.init(len(geometry["means"]), cfg["feature_dim"],
                                  int(cfg["seed"]) + 1000 * level).to(s.device)
        loop = fit_features(s, cfg, scene, geometry, field, level, out_dir)
        metrics = evaluate_features(cfg, scene, geometry, field.features.detach(), level,
                                    s.rank, s.world_size, s.all_reduce_sum)
        metrics.update(stage="features", level=level, level_name=LEVEL_NAMES[level],
                       world_size=s.world_size, resumed_from=loop.resumed_step,
                       seconds=time.perf_counter() - t0)
        if s.is_main:
            torch.save({"features": field.features.detach().cpu(), "level": torch.tensor(level)},
                       out_dir / FEATURES_FILE)
            with s.writer(out_dir / "tensorboard") as tb:
                write_feature_outputs(cfg, scene, geometry, field.features.detach(), level,
                                      out_dir, tb, metrics)
            write_metrics(out_dir / "metrics.json", metrics)
        s.barrier()  # the result exists before any rank reports success
    return metrics
