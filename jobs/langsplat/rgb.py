"""Stage 1 trainer: gaussian geometry and colour, with densification, in one process.

    from jobs.langsplat.rgb import fit_geometry, evaluate_rgb
    params, history = fit_geometry(cfg, scene, log=writer)     # cfg: defaults.trainer_config(...)
    evaluate_rgb(params, scene)                                # {"psnr": ..., "per_view": [...]}

No DDP here on purpose: densification adds and removes parameters, which DDP cannot follow.
"""
from __future__ import annotations

import torch

from .gaussians import DensifyStats, densify_and_prune, init_from_points, make_optimizer, reset_opacity
from .metrics import psnr
from .render import render_rgb


def _view_schedule(views: list, iterations: int, g: torch.Generator) -> list:
    """Training views for every step: passes over the views, each pass freshly shuffled."""
    out = []
    while len(out) < iterations:
        out += [views[i] for i in torch.randperm(len(views), generator=g).tolist()]
    return out[:iterations]


def _densify_due(cfg: dict, step: int) -> bool:
    return (cfg["densify_from"] <= step <= cfg["densify_until"]
            and step % cfg["densify_every"] == 0)


def fit_geometry(cfg: dict, scene, log=None, device="cpu"):
    """Optimise gaussians against the training views of the scene. Returns the detached params
    and a list of (step, loss, n_gaussians) rows. `log(step, scalars)` is called now and then."""
    g = torch.Generator().manual_seed(int(cfg["seed"]))
    params = {k: v.to(device) for k, v in
              init_from_points(scene.points, scale=cfg["init_scale"], generator=g).items()}
    opt = make_optimizer(params, cfg["rgb_lr"])
    stats = DensifyStats(len(params["means"]))
    images = scene.images.to(device)
    background = scene.background.to(device)
    cams = [c.to(device) for c in scene.cameras]
    history = []
    for step, view in enumerate(_view_schedule(scene.train_views, cfg["rgb_iterations"], g), 1):
        image = render_rgb(params, cams[view], background)
        diff = image - images[view]
        loss = diff.abs().mean() + (diff * diff).mean()
        loss.backward()
        stats.add(params["means"].grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if _densify_due(cfg, step):
            params, opt = densify_and_prune(params, opt, stats, cfg, generator=g)
            stats = DensifyStats(len(params["means"]))
        if cfg["opacity_reset_every"] and step % cfg["opacity_reset_every"] == 0 \
                and step < cfg["densify_until"]:
            reset_opacity(params, opt)
        if step % cfg["log_every"] == 0 or step == cfg["rgb_iterations"]:
            history.append((step, loss.item(), len(params["means"])))
            if log is not None:
                log(step, {"loss": loss.item(), "gaussians": len(params["means"])})
    return {k: v.detach() for k, v in params.items()}, history


@torch.no_grad()
def evaluate_rgb(params: dict, scene, views=None) -> dict:
    """Mean PSNR over the held-out views (or the given ones), with the per-view values."""
    views = scene.test_views if views is None else views
    device = params["means"].device
    per_view = [psnr(render_rgb(params, scene.cameras[v].to(device), scene.background.to(device)),
                     scene.images[v].to(device)) for v in views]
    return {"psnr": sum(per_view) / len(per_view), "per_view": per_view}
