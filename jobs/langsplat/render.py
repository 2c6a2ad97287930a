"""Differentiable 3D Gaussian splatting in plain PyTorch (CPU or CUDA), for small images.

    from hpc.jobs.langsplat.render import Camera, blend_weights, composite
    blend = blend_weights(params, cam)          # (H*W, N) weight of every gaussian at every pixel
    rgb = composite(blend, colors, background)  # (H*W, 3)

Dense and vectorised instead of tiled: every pixel sees every gaussian, which is simple, exact,
differentiable by autograd and fast enough for 64x64 images and a few hundred gaussians. The
weights are returned as a matrix so that anything carried by the gaussians (colour, a language
feature, a one-hot segment label) is rendered by one matmul; with frozen geometry the matrix is a
constant that can be computed once per camera.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

# Screen-space dilation (pixels^2) added to every 2D covariance, as in 3DGS: keeps tiny or
# edge-on gaussians at least a pixel wide so they neither vanish nor alias.
DILATION = 0.3
# Alpha cap: keeps log(1 - alpha) finite and lets light through every gaussian.
MAX_ALPHA = 0.99
NEAR = 0.2


@dataclass(frozen=True)
class Camera:
    """Pinhole camera, OpenCV convention (x right, y down, z forward); world -> camera is R p + t."""

    R: torch.Tensor  # (3, 3)
    t: torch.Tensor  # (3,)
    fx: float
    fy: float
    width: int
    height: int

    @staticmethod
    def look_at(eye, target=(0.0, 0.0, 0.0), up=(0.0, 0.0, 1.0), *, fov_deg: float = 50.0,
                width: int = 64, height: int = 64) -> "Camera":
        eye_t = torch.tensor(eye, dtype=torch.float64)
        forward = torch.tensor(target, dtype=torch.float64) - eye_t
        forward = forward / forward.norm()
        right = torch.linalg.cross(forward, torch.tensor(up, dtype=torch.float64))
        if right.norm() < 1e-6:
            raise ValueError(f"camera at {tuple(eye)} looks along the up vector {tuple(up)}; "
                             "HINT: move the camera off the pole or pass another up vector")
        right = right / right.norm()
        down = torch.linalg.cross(forward, right)
        R = torch.stack([right, down, forward])
        f = 0.5 * width / math.tan(math.radians(fov_deg) / 2)
        return Camera(R.float(), (-R @ eye_t).float(), f, f, width, height)

    def to(self, device) -> "Camera":
        return Camera(self.R.to(device), self.t.to(device), self.fx, self.fy, self.width, self.height)


def quat_to_rotmat(q: torch.Tensor) -> torch.Tensor:
    """(N, 4) quaternions (w, x, y, z), any norm -> (N, 3, 3) rotation matrices."""
    w, x, y, z = (q / q.norm(dim=-1, keepdim=True)).unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ], dim=-1).reshape(-1, 3, 3)


def project(means, log_scales, quats, cam: Camera):
    """Project gaussians: returns pixel centres (N, 2), conics (N, 3) = inverse 2D covariance
    (a, b, c), depths (N,) and a visibility mask (N,) for gaussians in front of the near plane."""
    R = cam.R.to(means)
    p = means @ R.T + cam.t.to(means)
    z = p[:, 2]
    visible = z > NEAR
    zs = z.clamp(min=NEAR)
    u = cam.fx * p[:, 0] / zs + cam.width / 2
    v = cam.fy * p[:, 1] / zs + cam.height / 2
    zero = torch.zeros_like(zs)
    J = torch.stack([cam.fx / zs, zero, -cam.fx * p[:, 0] / zs**2,
                     zero, cam.fy / zs, -cam.fy * p[:, 1] / zs**2], dim=-1).reshape(-1, 2, 3)
    M = quat_to_rotmat(quats) * torch.exp(log_scales)[:, None, :]  # R_q diag(s)
    T = J @ R @ M  # (N, 2, 3): 2D covariance = T T^T
    cov = T @ T.transpose(1, 2)
    a = cov[:, 0, 0] + DILATION
    b = cov[:, 0, 1]
    c = cov[:, 1, 1] + DILATION
    det = a * c - b * b
    conic = torch.stack([c / det, -b / det, a / det], dim=-1)
    return torch.stack([u, v], dim=-1), conic, z, visible


def pixel_terms(cam: Camera, like: torch.Tensor) -> torch.Tensor:
    """(H*W, 6) monomials [x^2, y^2, xy, x, y, 1] of pixel centres relative to the image centre.
    The gaussian exponent is a quadratic in (x, y), so for all pixels and gaussians at once it is
    one matmul of these terms with per-gaussian coefficients instead of many (P, N) operations."""
    kw = {"device": like.device, "dtype": like.dtype}
    ys, xs = torch.meshgrid(torch.arange(cam.height, **kw) + 0.5 - cam.height / 2,
                            torch.arange(cam.width, **kw) + 0.5 - cam.width / 2, indexing="ij")
    x, y = xs.reshape(-1), ys.reshape(-1)
    return torch.stack([x * x, y * y, x * y, x, y, torch.ones_like(x)], dim=-1)


def _exponent_coefficients(uv: torch.Tensor, conic: torch.Tensor) -> torch.Tensor:
    """(6, N) coefficients so that pixel_terms @ coef = -0.5 d^T conic d with d = pixel - uv."""
    a, b, c = conic.unbind(-1)
    u, v = uv.unbind(-1)
    return torch.stack([-0.5 * a, -0.5 * c, -b,
                        a * u + b * v, c * v + b * u,
                        -0.5 * (a * u * u + c * v * v) - b * u * v])


class Blend(NamedTuple):
    """Compositing weights of the gaussians in depth order: weights[:, i] belongs to gaussian
    order[i]. Kept in sorted order because un-sorting a (P, N) matrix costs more than permuting
    the (N, C) values it is applied to."""

    weights: torch.Tensor  # (H*W, N)
    order: torch.Tensor    # (N,)


def blend_weights(params: dict, cam: Camera) -> Blend:
    """Front-to-back alpha-compositing weights T_i * alpha_i of every gaussian at every pixel.
    params holds means, log_scales, quats and opacity (logits)."""
    means = params["means"]
    uv, conic, depth, visible = project(means, params["log_scales"], params["quats"], cam)
    # Depth order; stable so that equal depths composite identically on every run and device.
    order = torch.sort(depth, stable=True).indices
    centred = uv[order] - uv.new_tensor([cam.width / 2, cam.height / 2])
    power = pixel_terms(cam, means) @ _exponent_coefficients(centred, conic[order])
    opacity = (torch.sigmoid(params["opacity"]).reshape(-1) * visible)[order]
    alpha = (opacity * torch.exp(power.clamp(max=0.0))).clamp(max=MAX_ALPHA)
    log_keep = torch.log1p(-alpha)
    transmit = torch.exp(torch.cumsum(log_keep, dim=1) - log_keep)  # exclusive product
    return Blend(transmit * alpha, order)


def composite(blend: Blend, values: torch.Tensor, background=None,
              height: int | None = None, width: int | None = None) -> torch.Tensor:
    """Blend per-gaussian values (N, C); background (C,) fills what light passes through.
    Returns (P, C), or (H, W, C) when height and width are given."""
    out = blend.weights @ values[blend.order]
    if background is not None:
        out = out + (1.0 - blend.weights.sum(dim=1, keepdim=True)) * background
    if height is not None:
        out = out.reshape(height, width, -1)
    return out


def render_rgb(params: dict, cam: Camera, background=None) -> torch.Tensor:
    """(H, W, 3) image of gaussians with colour logits params['colors']."""
    return composite(blend_weights(params, cam), torch.sigmoid(params["colors"]), background, cam.height, cam.width)
