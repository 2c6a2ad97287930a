"""Defaults of the built-in reference trainer (the `trainer:` section of the langsplat config).

    from hpc.jobs.langsplat.defaults import trainer_config
    cfg = trainer_config({"trainer": {"rgb_iterations": 200}})   # defaults < given section

`Trainer` is the section's schema: OmegaConf checks each key and type of `langsplat.trainer.*` when
the config is built, `check` its ranges before submission (a typo or a negative step count is
refused at once, not after the queue wait), and a sweep may vary any of its keys. `TRAINER` is the
same defaults as a plain dict, for the trainer itself. Sizes are the smallest that keep a wide margin
over the quality targets (held-out PSNR 25 dB, accuracy 0.9) so that the whole pipeline (rgb, then
levels 0 1 2 side by side) stays a quick run on a laptop-class CPU with the local executor; more
RGB and feature steps buy little quality for their time. README.md gives a measured run.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Mapping, Tuple

from hpc.config.checks import ConfigError


@dataclass(repr=False, eq=False)
class RgbLr:
    """Adam learning rates of stage 1, one per gaussian parameter."""

    means: float = 0.004
    log_scales: float = 0.01
    quats: float = 0.01
    opacity: float = 0.05
    colors: float = 0.05


@dataclass(repr=False, eq=False)
class Trainer:
    # scene
    scene_seed: int = 0  # seed of the synthetic scene (objects, cameras, embeddings)
    n_objects: int = 3  # objects; each has 2 parts of 2 subparts (levels 0/1/2)
    gaussians_per_subpart: int = 10  # ground-truth gaussians per subpart
    image_size: int = 64  # square image side in pixels
    n_views: int = 40  # cameras on a sphere around the objects
    test_every: int = 5  # every 5th view is held out (used for metrics only)
    camera_radius: float = 4.0  # camera distance from the origin
    fov_deg: float = 50.0  # horizontal field of view
    feature_dim: int = 6  # dimension of the per-segment language embedding
    init_points: int = 60  # size of the noisy SfM-like point cloud the model starts from
    init_noise: float = 0.05  # std of the noise on those points
    # stage 1: geometry + colour
    seed: int = 0  # training seed (initial colours, split sampling, feature init)
    rgb_iterations: int = 300  # optimisation steps, one training view each
    rgb_lr: RgbLr = field(default_factory=RgbLr)
    init_scale: float = 0.1  # initial gaussian scale
    densify_from: int = 100  # first step that densifies
    densify_until: int = 200  # last step that densifies
    densify_every: int = 100  # densification interval
    opacity_reset_every: int = 0  # 0 disables 3DGS's periodic opacity reset
    densify_grad: float = 1.5e-3  # mean positional gradient norm that triggers clone/split
    split_scale: float = 0.08  # gaussians larger than this are split, smaller ones cloned
    prune_opacity: float = 0.01  # gaussians less opaque than this are dropped
    max_gaussians: int = 300  # densification stops adding beyond this
    # stage 2: language features (geometry frozen)
    feature_iterations: int = 200  # optimisation steps
    feature_lr: float = 0.05  # Adam learning rate of the per-gaussian feature
    # GLOBAL camera batch per step, shared round-robin by the ranks; fixed so 1 and N ranks take the
    # same steps (must divide by N)
    cameras_per_step: int = 4
    per_device_cameras: int = 4  # most cameras one rank renders at once (accumulates beyond)
    checkpoint_every: int = 100  # checkpoint interval of both stages (steps); a stopped job resumes there
    log_every: int = 25  # TensorBoard scalar interval (steps)
    threads: int = 2  # torch threads per node, split among the node's ranks
    query_segment: int = 0  # segment whose relevancy map is rendered


TRAINER: Dict[str, Any] = asdict(Trainer())

# What each value may be, as (test, what is expected): the types are OmegaConf's to check, these are
# the ranges a run can train with at all. A key not listed takes any value of its type.
Rule = Tuple[Callable[[Any], bool], str]
COUNT: Rule = (lambda v: v >= 1, "an integer >= 1")
INDEX: Rule = (lambda v: v >= 0, "an integer >= 0")
POSITIVE: Rule = (lambda v: v > 0, "a number above 0")
NOT_NEGATIVE: Rule = (lambda v: v >= 0, "a number >= 0")
RULES: Dict[str, Rule] = {
    "scene_seed": INDEX, "n_objects": COUNT, "gaussians_per_subpart": COUNT, "image_size": COUNT, "n_views": COUNT,
    "test_every": (lambda v: v >= 2, "an integer >= 2 (1 would hold out every view)"),
    "camera_radius": POSITIVE, "fov_deg": (lambda v: 0 < v < 180, "degrees between 0 and 180, both excluded"),
    "feature_dim": COUNT, "init_points": COUNT, "init_noise": NOT_NEGATIVE, "seed": INDEX, "rgb_iterations": COUNT,
    **{f"rgb_lr.{name}": POSITIVE for name in TRAINER["rgb_lr"]},
    "init_scale": POSITIVE, "densify_from": INDEX, "densify_until": INDEX, "densify_every": COUNT,
    "opacity_reset_every": INDEX, "densify_grad": NOT_NEGATIVE, "split_scale": POSITIVE,
    "prune_opacity": (lambda v: 0 <= v < 1, "an opacity from 0 up to, not including, 1"),
    "max_gaussians": COUNT, "feature_iterations": COUNT, "feature_lr": POSITIVE, "cameras_per_step": COUNT,
    "per_device_cameras": COUNT, "checkpoint_every": COUNT, "log_every": COUNT, "threads": COUNT,
    "query_segment": INDEX,
}


def check(trainer: Mapping[str, Any]) -> None:
    """Refuse the first value of a resolved `trainer:` section outside its range, in one line."""
    for key, (ok, expected) in RULES.items():
        value = _at(trainer, key)
        if not ok(value):
            raise ConfigError(f"langsplat.trainer.{key}={value!r}; expected {expected}. "
                              f"HINT: set langsplat.trainer.{key} in range, or drop it for the default "
                              f"{_at(TRAINER, key)!r}.")


def _at(tree: Mapping[str, Any], key: str) -> Any:
    """tree['rgb_lr']['means'] for 'rgb_lr.means'."""
    value: Any = tree
    for part in key.split("."):
        value = value[part]
    return value


def trainer_config(section: dict | None) -> dict:
    """Merge the `trainer:` entry of a langsplat config section over TRAINER. Unknown keys are
    an error, so a typo does not silently train with a default."""
    given = dict((section or {}).get("trainer") or {})
    unknown = sorted(set(given) - set(TRAINER))
    if unknown:
        raise ConfigError(f"unknown langsplat trainer keys {unknown}; expected some of "
                          f"{sorted(TRAINER)}. HINT: check the spelling under `trainer:`")
    cfg = {**TRAINER, **given}
    cfg["rgb_lr"] = {**TRAINER["rgb_lr"], **(given.get("rgb_lr") or {})}
    return cfg
