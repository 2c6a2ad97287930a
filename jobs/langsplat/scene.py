"""Synthetic LangSplat scene: coloured objects, cameras on a sphere, a three-level segment hierarchy.

    from hpc.jobs.langsplat.scene import make_scene
    scene = make_scene({"seed": 0, "image_size": 64, "n_views": 40})
    scene.images[v]            # (H, W, 3) ground-truth RGB of view v
    scene.feature_map(v, 1)    # (H, W, D) ground-truth language feature at level 1 (part)

It stands in for LangSplat's data: each object is made of parts, each part of subparts, each
subpart a small cloud of gaussians with its own colour. Level 0 = object, 1 = part, 2 = subpart;
every segment of a level carries a random unit embedding (the role of LangSplat's CLIP features
compressed by its autoencoder). Ground truth is rendered with the same renderer the model uses,
so a perfect reconstruction exists. Everything is a pure function of the config's seed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .render import Camera, blend_weights, composite

LEVEL_NAMES = ("object", "part", "subpart")
PARTS_PER_OBJECT = 2
SUBPARTS_PER_PART = 2


@dataclass
class Scene:
    gt: dict                      # ground-truth gaussian params
    subpart_of: torch.Tensor      # (N_gt,) subpart id of each ground-truth gaussian
    cameras: list                 # all views
    train_views: list
    test_views: list
    images: torch.Tensor          # (V, H, W, 3)
    labels: torch.Tensor          # (V, H*W) subpart id per pixel, -1 for background
    segment_of: list              # per level: (n_subparts,) subpart -> segment id at that level
    embeddings: list              # per level: (n_segments, D) unit vectors
    points: torch.Tensor          # (M, 3) noisy SfM-like point cloud for initialisation
    background: torch.Tensor = field(default_factory=lambda: torch.zeros(3))

    def level_labels(self, view: int, level: int) -> torch.Tensor:
        """(H*W,) segment id at the level, -1 for background."""
        lab = self.labels[view]
        out = torch.full_like(lab, -1)
        fg = lab >= 0
        out[fg] = self.segment_of[level][lab[fg]]
        return out

    def feature_map(self, view: int, level: int) -> torch.Tensor:
        """(H, W, D) ground-truth feature: the segment's embedding, zero on background."""
        lab = self.level_labels(view, level)
        emb = self.embeddings[level]
        feat = torch.zeros(lab.numel(), emb.shape[1])
        feat[lab >= 0] = emb[lab[lab >= 0]]
        cam = self.cameras[view]
        return feat.reshape(cam.height, cam.width, -1)


def sphere_cameras(n: int, radius: float, size: int, fov_deg: float) -> list:
    """n cameras on a Fibonacci spiral over the band of elevations -30..60 degrees, all looking
    at the origin (the band avoids the poles, where the up vector is degenerate)."""
    cams = []
    golden = math.pi * (3.0 - math.sqrt(5.0))
    lo, hi = math.sin(math.radians(-30)), math.sin(math.radians(60))
    for i in range(n):
        z = lo + (hi - lo) * (i + 0.5) / n
        r = math.sqrt(1 - z * z)
        eye = (radius * r * math.cos(golden * i), radius * r * math.sin(golden * i), radius * z)
        cams.append(Camera.look_at(eye, fov_deg=fov_deg, width=size, height=size))
    return cams


def _objects(cfg: dict, g: torch.Generator):
    """Ground-truth gaussians: objects spaced on a circle, parts and subparts as offset blobs."""
    n_obj, per = cfg["n_objects"], cfg["gaussians_per_subpart"]
    means, scales, colors, subpart = [], [], [], []
    sid = 0
    for o in range(n_obj):
        ang = 2 * math.pi * o / n_obj
        centre = torch.tensor([0.9 * math.cos(ang), 0.9 * math.sin(ang), 0.0])
        # Parts side by side along one axis, subparts along a perpendicular one: segments overlap
        # a little (occlusion and blending at their borders) but each has its own region.
        axis = torch.nn.functional.normalize(torch.randn(3, generator=g), dim=0)
        across = torch.nn.functional.normalize(torch.linalg.cross(axis, torch.randn(3, generator=g)), dim=0)
        for p in range(PARTS_PER_OBJECT):
            for q in range(SUBPARTS_PER_PART):
                sub_centre = (centre + (p - 0.5) * 0.6 * axis + (q - 0.5) * 0.32 * across
                              + 0.03 * torch.randn(3, generator=g))
                extent = 0.08 + 0.06 * torch.rand(3, generator=g)
                colour = 0.15 + 0.7 * torch.rand(3, generator=g)
                means.append(sub_centre + extent * torch.randn(per, 3, generator=g).clamp(-1.5, 1.5))
                scales.append(extent * (0.5 + 0.3 * torch.rand(per, 3, generator=g)))
                colors.append(colour + 0.05 * torch.randn(per, 3, generator=g))
                subpart.append(torch.full((per,), sid))
                sid += 1
    n = per * sid
    quats = torch.randn(n, 4, generator=g)
    gt = {"means": torch.cat(means), "log_scales": torch.log(torch.cat(scales)), "quats": quats,
          "opacity": torch.full((n, 1), 3.0),
          "colors": torch.logit(torch.cat(colors).clamp(0.02, 0.98))}
    return gt, torch.cat(subpart), sid


def _hierarchy(n_subparts: int, dim: int, g: torch.Generator):
    per_obj = PARTS_PER_OBJECT * SUBPARTS_PER_PART
    sub = torch.arange(n_subparts)
    segment_of = [sub // per_obj, sub // SUBPARTS_PER_PART, sub]
    embeddings = []
    for seg in segment_of:
        e = torch.randn(int(seg.max()) + 1, dim, generator=g)
        embeddings.append(e / e.norm(dim=1, keepdim=True))
    return segment_of, embeddings


def make_scene(cfg: dict) -> Scene:
    """Build the scene named by cfg (see hpc.jobs.langsplat.defaults.TRAINER for the keys)."""
    g = torch.Generator().manual_seed(int(cfg["scene_seed"]))
    gt, subpart_of, n_sub = _objects(cfg, g)
    segment_of, embeddings = _hierarchy(n_sub, cfg["feature_dim"], g)
    cams = sphere_cameras(cfg["n_views"], cfg["camera_radius"], cfg["image_size"], cfg["fov_deg"])
    every = cfg["test_every"]
    test = [i for i in range(len(cams)) if i % every == every // 2]
    train = [i for i in range(len(cams)) if i % every != every // 2]
    onehot = torch.nn.functional.one_hot(subpart_of, n_sub).float()
    images, labels = [], []
    with torch.no_grad():
        for cam in cams:
            w = blend_weights(gt, cam)
            images.append(composite(w, torch.sigmoid(gt["colors"]), torch.zeros(3),
                                    cam.height, cam.width))
            seg = composite(w, onehot)
            lab = seg.argmax(dim=1)
            lab[w.weights.sum(dim=1) < 0.5] = -1
            labels.append(lab)
    keep = torch.randperm(len(subpart_of), generator=g)[: int(cfg["init_points"])]
    points = gt["means"][keep] + cfg["init_noise"] * torch.randn(len(keep), 3, generator=g)
    return Scene(gt, subpart_of, cams, train, test, torch.stack(images), torch.stack(labels),
                 segment_of, embeddings, points)
