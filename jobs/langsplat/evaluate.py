"""Held-out evaluation and images of a trained feature level.

    from hpc.jobs.langsplat.evaluate import evaluate_features
    evaluate_features(cfg, scene, geometry, features, level)   # {"accuracy", "miou", "accuracy_per_view"}
    evaluate_features(..., rank=s.rank, world=s.world_size, reduce_sum=s.all_reduce_sum)  # under DDP

Rendered features are decoded to the nearest segment embedding of the level and compared with
the ground-truth segment of every foreground pixel of the held-out views.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from .metrics import confusion, decode, relevancy, scores_from_confusion
from .outputs import feature_basis, features_to_rgb, heatmap, write_png
from .render import blend_weights, composite


@torch.no_grad()
def render_features(geometry: dict, features: torch.Tensor, cam) -> torch.Tensor:
    """(H, W, D) feature map of a view."""
    w = blend_weights(geometry, cam.to(features.device))
    return composite(w, features, None, cam.height, cam.width).cpu()


@torch.no_grad()
def evaluate_features(cfg: dict, scene, geometry: dict, features: torch.Tensor, level: int,
                      rank: int = 0, world: int = 1, reduce_sum: Callable | None = None) -> dict:
    """Held-out metrics of one level. Under DDP each rank renders every `world`-th held-out view
    from `rank` on, and `reduce_sum` (hpc's ``s.all_reduce_sum``) adds the confusion counts and
    per-view accuracies of all ranks: every rank returns the metrics of all views, exactly the
    single-process ones (integer counts, and each view's accuracy added to zeros)."""
    emb = scene.embeddings[level]
    n = emb.shape[0]
    total = torch.zeros(n, n, dtype=torch.long)
    per_view = torch.zeros(len(scene.test_views), dtype=torch.float64)
    for j in range(rank, len(scene.test_views), world):
        v = scene.test_views[j]
        pred = decode(render_features(geometry, features, scene.cameras[v]), emb).reshape(-1)
        conf = confusion(pred, scene.level_labels(v, level), n)
        per_view[j] = scores_from_confusion(conf)["accuracy"]
        total += conf
    if world > 1:
        if reduce_sum is None:
            raise ValueError(f"evaluate_features with world={world} needs reduce_sum "
                             "(HINT: reduce_sum=s.all_reduce_sum) to add the other ranks' views")
        total, per_view = reduce_sum(total), reduce_sum(per_view)
    return {**scores_from_confusion(total), "accuracy_per_view": per_view.tolist(), "segments": n}


@torch.no_grad()
def write_feature_outputs(cfg: dict, scene, geometry: dict, features: torch.Tensor, level: int,
                          out_dir: Path, tb, metrics: dict) -> None:
    """PNGs (rendered | ground-truth features as colours, relevancy of the query segment) and
    the same images plus final scalars in TensorBoard."""
    emb = scene.embeddings[level]
    basis = feature_basis(emb)
    query = int(cfg["query_segment"]) % emb.shape[0]
    for v in scene.test_views[:4]:
        pred = render_features(geometry, features, scene.cameras[v])
        pair = torch.cat([features_to_rgb(pred, basis),
                          features_to_rgb(scene.feature_map(v, level), basis)], dim=1)
        rel = heatmap(relevancy(pred, emb, query))
        write_png(Path(out_dir) / "renders" / f"features-view{v:03d}.png", pair)
        write_png(Path(out_dir) / "renders" / f"relevancy-seg{query}-view{v:03d}.png", rel)
        tb.add_image(f"features/view{v:03d}", pair, dataformats="HWC")
        tb.add_image(f"relevancy/seg{query}-view{v:03d}", rel, dataformats="HWC")
    step = int(cfg["feature_iterations"])
    tb.add_scalar("feature/test_accuracy", metrics["accuracy"], step)
    tb.add_scalar("feature/test_miou", metrics["miou"], step)
