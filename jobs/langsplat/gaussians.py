"""Gaussian parameters, initialisation, densification and pruning.

    params = init_from_points(points, generator=g)      # dict of leaf tensors
    opt = make_optimizer(params, lrs)
    stats = DensifyStats(n); stats.add(params["means"].grad)
    params, opt = densify_and_prune(params, opt, stats, cfg, generator=g)

A model is a plain dict of tensors (means, log_scales, quats, opacity, colors, optionally
features), so that it checkpoints with torch.save and loads with weights_only=True. Densification
changes the set of parameters, which is why the geometry stage runs in a single process.
"""
from __future__ import annotations

import torch

GEOMETRY = ("means", "log_scales", "quats", "opacity", "colors")


def init_from_points(points: torch.Tensor, *, scale: float, generator: torch.Generator) -> dict:
    """Gaussians at the given (N, 3) points (an SfM-like point cloud): isotropic, half opaque,
    random grey-ish colours."""
    n = points.shape[0]
    quats = torch.zeros(n, 4)
    quats[:, 0] = 1.0
    return {
        "means": points.clone().float(),
        "log_scales": torch.full((n, 3), float(torch.log(torch.tensor(scale)))),
        "quats": quats,
        "opacity": torch.zeros(n, 1),
        "colors": 0.1 * torch.randn(n, 3, generator=generator),
    }


def make_optimizer(params: dict, lrs: dict) -> torch.optim.Adam:
    """One Adam parameter group per named tensor, so learning rates differ per kind."""
    for p in params.values():
        p.requires_grad_(True)
    groups = [{"params": [params[k]], "lr": lrs[k], "name": k} for k in params if k in lrs]
    return torch.optim.Adam(groups, eps=1e-15)


class DensifyStats:
    """Running mean of the view-space positional gradient norm per gaussian (3DGS's criterion:
    gaussians that many views want to move are under-reconstructing their region)."""

    def __init__(self, n: int):
        self.grad_sum = torch.zeros(n)
        self.count = torch.zeros(n)

    def add(self, means_grad: torch.Tensor) -> None:
        norm = means_grad.detach().norm(dim=-1).cpu()
        self.grad_sum += norm
        self.count += (norm > 0).float()

    def mean(self) -> torch.Tensor:
        return self.grad_sum / self.count.clamp(min=1)


def _remap_optimizer(opt: torch.optim.Adam, new_params: dict, index: torch.Tensor) -> None:
    """Point every parameter group at its new tensor; Adam moments follow the gaussians they
    belonged to (index[i] is the old row of new row i; new rows copy their parent's moments)."""
    for group in opt.param_groups:
        old = group["params"][0]
        new = new_params[group["name"]]
        state = opt.state.pop(old, None)
        if state:
            state = {k: (v[index].clone() if torch.is_tensor(v) and v.dim() > 0 else v)
                     for k, v in state.items()}
            opt.state[new] = state
        group["params"][0] = new


def _rebuild(params: dict, index: torch.Tensor, overrides: dict) -> dict:
    out = {}
    for k, v in params.items():
        t = v.detach()[index].clone()
        if k in overrides:
            t = overrides[k]
        out[k] = t.requires_grad_(True)
    return out


def densify_and_prune(params: dict, opt, stats: DensifyStats, cfg: dict, *,
                      generator: torch.Generator):
    """Clone small high-gradient gaussians, split large ones in two (sampled inside the parent,
    scales shrunk by 1.6), drop nearly transparent ones. Returns new params and the optimizer
    re-pointed at them."""
    with torch.no_grad():
        grad = stats.mean()
        scale = torch.exp(params["log_scales"]).max(dim=1).values.cpu()
        hot = grad > cfg["densify_grad"]
        big = scale > cfg["split_scale"]
        keep = torch.sigmoid(params["opacity"]).reshape(-1).cpu() > cfg["prune_opacity"]
        clone_idx = torch.nonzero(hot & ~big & keep).reshape(-1)
        split_idx = torch.nonzero(hot & big & keep).reshape(-1)
        keep_idx = torch.nonzero(keep & ~(hot & big)).reshape(-1)
        if len(keep_idx) + len(clone_idx) + 2 * len(split_idx) > cfg["max_gaussians"]:
            clone_idx, split_idx = clone_idx[:0], split_idx[:0]
            keep_idx = torch.nonzero(keep).reshape(-1)
        index = torch.cat([keep_idx, clone_idx, split_idx, split_idx])
        n_keep = len(keep_idx) + len(clone_idx)
        means = params["means"].detach()[index].clone()
        log_scales = params["log_scales"].detach()[index].clone()
        if len(split_idx):
            from .render import quat_to_rotmat  # only when gaussians split: the renderer imports this module's users
            rot = quat_to_rotmat(params["quats"].detach()[index[n_keep:]])
            std = torch.exp(log_scales[n_keep:])
            # the generator lives on the CPU (the same draws on every device): move the draws
            offset = torch.randn(std.shape, generator=generator).to(std.device) * std
            means[n_keep:] += (rot @ offset[:, :, None]).squeeze(-1)
            log_scales[n_keep:] -= torch.log(torch.tensor(1.6))
        new_params = _rebuild(params, index, {"means": means, "log_scales": log_scales})
    _remap_optimizer(opt, new_params, index)
    return new_params, opt


def reset_opacity(params: dict, opt, ceiling: float = 0.3) -> None:
    """Cap opacities (3DGS's periodic reset) so floaters must earn their opacity back; their
    Adam moments are cleared for the same reason."""
    logit = float(torch.logit(torch.tensor(ceiling)))
    with torch.no_grad():
        params["opacity"].clamp_(max=logit)
    for group in opt.param_groups:
        if group["name"] == "opacity":
            for v in opt.state.get(group["params"][0], {}).values():
                if torch.is_tensor(v) and v.dim() > 0:
                    v.zero_()
