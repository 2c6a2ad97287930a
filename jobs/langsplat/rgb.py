"""Stage 1 trainer: gaussian geometry and colour, with densification, in one process.

    with hpc.ddp.session() as s:
        params, loop = fit_geometry(s, cfg, scene, out_dir)    # resumes from out_dir/checkpoints
    evaluate_rgb(params, scene)                                # {"psnr": ..., "per_view": [...]}

No DDP here on purpose: densification adds and removes parameters, which DDP cannot follow. For
the same reason the checkpointed object is GeometryFit, not a module: the gaussians are saved as
plain tensors of whatever size they have reached, and resume rebuilds the optimizer around them.
"""
from __future__ import annotations

import torch

from hpc.runtime.sharding import permutation
from hpc.trainloop import TrainLoop

from .gaussians import DensifyStats, densify_and_prune, init_from_points, make_optimizer, reset_opacity
from .metrics import psnr
from .render import render_rgb


def view_at(views: list, step: int, seed: int) -> int:
    """Training view of 1-based `step`: passes over the views, each freshly shuffled. A function
    of the step alone, so a resumed run sees the same views as an uninterrupted one."""
    epoch, i = divmod(step - 1, len(views))
    return views[permutation(len(views), epoch, seed)[i]]


def _densify_due(cfg: dict, step: int) -> bool:
    return (cfg["densify_from"] <= step <= cfg["densify_until"]
            and step % cfg["densify_every"] == 0)


class GeometryFit:
    """Everything stage 1 changes while it trains, checkpointable as one object: the gaussians
    (their number changes at densification), Adam's moments, the densification statistics and
    the generator that samples split positions. state_dict() holds plain tensors only, so it
    loads with weights_only=True."""

    def __init__(self, cfg: dict, scene, device):
        self.cfg = cfg
        self.g = torch.Generator().manual_seed(int(cfg["seed"]))
        params = init_from_points(scene.points, scale=cfg["init_scale"], generator=self.g)
        self._adopt({k: v.to(device) for k, v in params.items()})

    def _adopt(self, params: dict) -> None:
        self.params = params
        self.opt = make_optimizer(params, self.cfg["rgb_lr"])
        self.stats = DensifyStats(len(params["means"]))

    def densify(self) -> None:
        self.params, self.opt = densify_and_prune(self.params, self.opt, self.stats, self.cfg,
                                                  generator=self.g)
        self.stats = DensifyStats(len(self.params["means"]))

    def state_dict(self) -> dict:
        return {"params": {k: v.detach() for k, v in self.params.items()},
                "optimizer": self.opt.state_dict(), "generator": self.g.get_state(),
                "grad_sum": self.stats.grad_sum, "count": self.stats.count}

    def load_state_dict(self, state: dict) -> None:
        device = self.params["means"].device
        self._adopt({k: v.to(device).clone() for k, v in state["params"].items()})
        # Same groups in the same order as when saved (make_optimizer is deterministic), so
        # Adam's per-index state lands on the tensors it belongs to, at their current size.
        self.opt.load_state_dict(state["optimizer"])
        self.g.set_state(state["generator"])
        self.stats.grad_sum.copy_(state["grad_sum"])
        self.stats.count.copy_(state["count"])


def fit_geometry(s, cfg: dict, scene, out_dir):
    """Optimise gaussians against the training views of the scene on s.device. Checkpoints every
    cfg["checkpoint_every"] steps, stops on preemption and resumes exactly (hpc.trainloop).
    Returns the detached params and the TrainLoop (its writer is still open)."""
    fit = GeometryFit(cfg, scene, s.device)
    loop = TrainLoop(s, out_dir, save_every=cfg["checkpoint_every"])
    loop.resume({"geometry": fit})
    images = scene.images.to(s.device)
    background = scene.background.to(s.device)
    cams = [c.to(s.device) for c in scene.cameras]
    total = cfg["rgb_iterations"]
    for step in s.progress(loop.steps(total), total=total, initial=loop.step, desc="rgb"):
        view = view_at(scene.train_views, step, int(cfg["seed"]))
        diff = render_rgb(fit.params, cams[view], background) - images[view]
        loss = diff.abs().mean() + (diff * diff).mean()
        loss.backward()
        fit.stats.add(fit.params["means"].grad)
        fit.opt.step()
        fit.opt.zero_grad(set_to_none=True)
        if _densify_due(cfg, step):
            fit.densify()
        if cfg["opacity_reset_every"] and step % cfg["opacity_reset_every"] == 0 \
                and step < cfg["densify_until"]:
            reset_opacity(fit.params, fit.opt)
        if step % cfg["log_every"] == 0 or step == total:
            loop.log("rgb/loss", loss.item(), step)
            loop.log("rgb/gaussians", len(fit.params["means"]), step)
    return {k: v.detach() for k, v in fit.params.items()}, loop


@torch.no_grad()
def evaluate_rgb(params: dict, scene, views=None) -> dict:
    """Mean PSNR over the held-out views (or the given ones), with the per-view values."""
    views = scene.test_views if views is None else views
    device = params["means"].device
    per_view = [psnr(render_rgb(params, scene.cameras[v].to(device), scene.background.to(device)),
                     scene.images[v].to(device)) for v in views]
    return {"psnr": sum(per_view) / len(per_view), "per_view": per_view}
