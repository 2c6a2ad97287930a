"""Stage 2 trainer: one language-feature level on frozen geometry, data-parallel over cameras.

    with hpc.ddp.session() as s:
        field = FeatureField.init(n_gaussians, dim, seed)
        fit_features(s, cfg, scene, geometry, field, level, out_dir)    # resumes from out_dir

Every step takes a GLOBAL batch of `cameras_per_step` cameras (positions j*C .. j*C+C-1 of the
epoch's shared permutation); hpc.runtime.sharding.round_robin deals them so that rank r renders positions
r, r+N, ... Each rank sums its cameras' losses divided by C, gradients are all-reduce-summed, so
every rank applies the gradient of the mean over the same C cameras whatever N is: 1 and N ranks
train the same model up to float rounding. Geometry is frozen, so each camera's blending weights
are a constant computed once; a step is a few small matmuls.
"""
from __future__ import annotations

import torch

from hpc.runtime.batching import plan_batch
from hpc.runtime.sharding import round_robin
from hpc.trainloop import TrainLoop

from .render import blend_weights, composite


class FeatureField(torch.nn.Module):
    """The only trained parameter of stage 2: one feature vector per gaussian."""

    def __init__(self, n: int, dim: int):
        super().__init__()
        self.features = torch.nn.Parameter(torch.zeros(n, dim))

    @staticmethod
    def init(n: int, dim: int, seed: int) -> "FeatureField":
        field = FeatureField(n, dim)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            field.features.copy_(0.01 * torch.randn(n, dim, generator=g))
        return field


class WeightCache:
    """Blending weights per camera of the frozen geometry, computed on first use."""

    def __init__(self, geometry: dict, cameras: list, device):
        self.geometry, self.cameras, self.device = geometry, cameras, device
        self._cache: dict = {}

    @torch.no_grad()
    def __getitem__(self, view: int):
        if view not in self._cache:
            self._cache[view] = blend_weights(self.geometry, self.cameras[view].to(self.device))
        return self._cache[view]


def step_cameras(n_views: int, cfg: dict, rank: int, world: int, step: int) -> list:
    """Indices (into the training views) this rank renders at 1-based `step`."""
    per_step = cfg["cameras_per_step"]
    if per_step % world:
        raise ValueError(f"trainer.cameras_per_step={per_step} does not split over {world} ranks. "
                         f"HINT: use a multiple of {world}, so every rank renders the same number")
    steps_per_epoch = n_views // per_step
    if steps_per_epoch == 0:
        raise ValueError(f"{n_views} training views cannot fill one step of {per_step} cameras. "
                         "HINT: lower trainer.cameras_per_step or raise trainer.n_views")
    epoch, j = divmod(step - 1, steps_per_epoch)
    share = per_step // world
    mine = round_robin(n_views, rank, world, epoch, int(cfg["seed"]))
    return mine[j * share:(j + 1) * share]


def _targets(scene, level: int, device) -> dict:
    return {v: scene.feature_map(v, level).reshape(-1, scene.embeddings[level].shape[1]).to(device)
            for v in scene.train_views}


def fit_features(s, cfg: dict, scene, geometry: dict, field: FeatureField, level: int,
                 out_dir) -> TrainLoop:
    """Train `field` (on s.device) to render level `level`'s ground-truth features. Checkpoints,
    stops on preemption and resumes exactly through hpc.trainloop.TrainLoop."""
    opt = torch.optim.Adam(field.parameters(), lr=cfg["feature_lr"])
    with TrainLoop(s, out_dir, save_every=cfg["checkpoint_every"]) as loop:  # exit: final checkpoint
        loop.resume({"field": field, "optimizer": opt})
        cache = WeightCache(geometry, scene.cameras, s.device)
        targets = _targets(scene, level, s.device)
        plan = plan_batch(cfg["cameras_per_step"], cfg["per_device_cameras"], s.world_size)
        total = cfg["feature_iterations"]
        for step in s.progress(loop.steps(total), total=total, initial=loop.step, desc=f"level {level}"):
            views = [scene.train_views[i] for i in
                     step_cameras(len(scene.train_views), cfg, s.rank, s.world_size, step)]
            loss_sum = 0.0
            for m in range(plan.accum_steps):
                micro = views[m * plan.micro_batch:(m + 1) * plan.micro_batch]
                loss = sum((composite(cache[v], field.features) - targets[v]).abs().mean()
                           for v in micro) / plan.global_batch
                loss.backward()
                loss_sum += loss.item()
            # Sum, not mean: each rank's loss is already divided by the global camera count.
            field.features.grad = s.all_reduce_sum(field.features.grad)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % cfg["log_every"] == 0 or step == total:
                loop.log("feature/loss", s.all_reduce_sum(loss_sum), step)
    return loop
