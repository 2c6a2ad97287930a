"""The LangSplat reference trainer (jobs/langsplat) on the device its session binds: cuda:0 on a
GPU, the CPU here; on a GPU its results are compared with the CPU's on the same miniature scene.

    python -m pytest -n 0 tests/gpu/test_langsplat_gpu.py
"""

from __future__ import annotations

import contextlib

import torch
from onerank import device_of

import hpc.ddp
from hpc.jobs.langsplat.stages import GEOMETRY_FILE, train_features, train_rgb

MINI = {"trainer": {"image_size": 16, "n_views": 10, "gaussians_per_subpart": 3, "n_objects": 2,
                    "init_points": 12, "rgb_iterations": 60, "densify_from": 20, "densify_until": 40,
                    "densify_every": 20, "feature_iterations": 24, "checkpoint_every": 8,
                    "log_every": 8, "cameras_per_step": 4, "per_device_cameras": 1, "threads": 1}}


def _stages(monkeypatch, out, kind: str):
    """Both stages, on `kind`'s device; returns (the devices their sessions bound, rgb, features)."""
    seen = []
    real = hpc.ddp.session

    @contextlib.contextmanager
    def recorded(*args, **kwargs):  # hpc's own session, its device noted
        with real(*args, **kwargs) as s:
            seen.append(s.device)
            yield s

    with monkeypatch.context() as m:
        m.setattr(hpc.ddp, "session", recorded)
        if kind == "cpu":  # the CPU run on a GPU machine too: binding as where torch sees no GPU
            m.setattr(hpc.ddp, "_cuda_count", lambda: 0)
        rgb = train_rgb(MINI, out / "rgb")
        features = train_features(MINI, out / "features", 1, out / "rgb")
    return seen, rgb, features


def test_the_reference_trainer_trains_both_stages_on_the_sessions_device(kind, monkeypatch, tmp_path):
    seen, rgb, features = _stages(monkeypatch, tmp_path / kind, kind)
    assert seen == [device_of(kind)] * 2
    assert rgb["psnr"] > 10 and rgb["gaussians"] > 0
    assert features["accuracy"] > 0.5 and 0 <= features["miou"] <= 1
    geometry = torch.load(tmp_path / kind / "rgb" / GEOMETRY_FILE, weights_only=True)
    assert {t.device.type for t in geometry.values()} == {"cpu"}  # loadable where no GPU is
    if kind == "cuda":  # the same scene and seed on the CPU: the GPU run must train as well
        _, cpu_rgb, cpu_features = _stages(monkeypatch, tmp_path / "cpu", "cpu")
        assert abs(rgb["psnr"] - cpu_rgb["psnr"]) < 2.0, (rgb["psnr"], cpu_rgb["psnr"])
        assert abs(features["accuracy"] - cpu_features["accuracy"]) < 0.15
