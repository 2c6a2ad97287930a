"""Renderer, scene and metrics of the LangSplat reference trainer: pytest tests/test_langsplat_render.py"""
import math
import zlib

import pytest
import torch

from hpc.jobs.langsplat import metrics
from hpc.jobs.langsplat.defaults import trainer_config
from hpc.jobs.langsplat.outputs import png_bytes
from hpc.jobs.langsplat.render import Camera, blend_weights, composite, render_rgb
from hpc.jobs.langsplat.scene import make_scene

TINY = {"trainer": {"image_size": 16, "n_views": 10, "gaussians_per_subpart": 3, "n_objects": 2,
                    "init_points": 12}}


def _tiny_gaussians(dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    return {"means": 0.3 * torch.randn(4, 3, generator=g, dtype=dtype),
            "log_scales": torch.log(torch.full((4, 3), 0.25, dtype=dtype))
            + 0.1 * torch.randn(4, 3, generator=g, dtype=dtype),
            "quats": torch.randn(4, 4, generator=g, dtype=dtype),
            "opacity": torch.randn(4, 1, generator=g, dtype=dtype),
            "colors": torch.randn(4, 3, generator=g, dtype=dtype)}


def test_renderer_gradients_match_finite_differences():
    cam = Camera.look_at((0.0, -3.0, 1.0), width=6, height=5, fov_deg=60)
    base = _tiny_gaussians()
    names = list(base)

    def f(*tensors):
        return render_rgb(dict(zip(names, tensors)), cam, torch.tensor([0.2, 0.1, 0.0], dtype=torch.float64))

    inputs = tuple(base[k].clone().requires_grad_(True) for k in names)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5)


def test_compositing_respects_depth_and_conserves_light():
    cam = Camera.look_at((0.0, -4.0, 0.0), width=9, height=9)
    # Two large opaque gaussians on the optical axis: the nearer one must dominate the centre.
    params = {"means": torch.tensor([[0.0, 0.0, 0.0], [0.0, -1.0, 0.0]]),
              "log_scales": torch.log(torch.full((2, 3), 0.5)), "quats": torch.tensor([[1.0, 0, 0, 0]] * 2),
              "opacity": torch.full((2, 1), 5.0), "colors": torch.tensor([[9.0, -9, -9], [-9.0, 9, -9]])}
    img = render_rgb(params, cam)
    assert img[4, 4, 1] > 0.9 and img[4, 4, 0] < 0.05  # green (near) in front of red (far)
    w = blend_weights(params, cam).weights
    assert torch.all(w >= 0) and torch.all(w.sum(dim=1) <= 1 + 1e-6)
    # Swapping the order of the gaussians in memory changes nothing.
    swapped = {k: v.flip(0) for k, v in params.items()}
    assert torch.allclose(render_rgb(swapped, cam), img, atol=1e-6)


def test_scene_is_a_pure_function_of_its_seed():
    a, b = make_scene(trainer_config(TINY)), make_scene(trainer_config(TINY))
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert all(torch.equal(x, y) for x, y in zip(a.embeddings, b.embeddings))
    other = make_scene(trainer_config({"trainer": {**TINY["trainer"], "scene_seed": 1}}))
    assert not torch.equal(a.images, other.images)


def test_scene_hierarchy_and_feature_maps():
    scene = make_scene(trainer_config(TINY))
    assert [len(e) for e in scene.embeddings] == [2, 4, 8]  # 2 objects, 2 parts, 2 subparts each
    for emb in scene.embeddings:
        assert torch.allclose(emb.norm(dim=1), torch.ones(len(emb)), atol=1e-6)
    assert set(scene.train_views).isdisjoint(scene.test_views) and scene.test_views
    v = scene.train_views[0]
    fg = scene.labels[v] >= 0
    assert 0 < fg.sum() < fg.numel()
    # A subpart belongs to exactly one part and one object: coarser labels are a function of finer.
    for level in (0, 1):
        pairs = set(zip(scene.level_labels(v, level + 1)[fg].tolist(),
                        scene.level_labels(v, level)[fg].tolist()))
        assert len({fine for fine, _ in pairs}) == len(pairs)
    feat = scene.feature_map(v, 2).reshape(-1, scene.embeddings[2].shape[1])
    assert torch.all(feat[~fg] == 0)
    assert torch.equal(metrics.decode(feat[fg], scene.embeddings[2]), scene.level_labels(v, 2)[fg])


def test_metrics():
    x = torch.rand(4, 4, 3)
    assert metrics.psnr(x, x) == math.inf
    assert metrics.psnr(torch.zeros(2, 2), torch.full((2, 2), 0.1)) == pytest.approx(20.0)
    labels = torch.tensor([0, 0, 1, 1, -1])
    pred = torch.tensor([0, 1, 1, 1, 0])
    s = metrics.segmentation_scores(pred, labels, 2)
    assert s["accuracy"] == pytest.approx(0.75)
    assert s["miou"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    emb = torch.eye(3)
    rel = metrics.relevancy(torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 0]]), emb, query=0)
    assert rel[0] > 0.99 and rel[1] < 0.01 and rel[2] == 0
    with pytest.raises(ValueError, match="HINT"):
        metrics.relevancy(torch.zeros(1, 3), emb, query=5)


def test_png_writer_produces_a_valid_file():
    img = torch.zeros(3, 2, 3)
    img[1, 1] = torch.tensor([1.0, 0.5, 0.0])
    data = png_bytes(img)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    idat = data.index(b"IDAT")
    length = int.from_bytes(data[idat - 4:idat], "big")
    raw = zlib.decompress(data[idat + 4:idat + 4 + length])
    assert len(raw) == 3 * (1 + 2 * 3) and raw[7 + 1 + 3:7 + 1 + 6] == bytes([255, 128, 0])
