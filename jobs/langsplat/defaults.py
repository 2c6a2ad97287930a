"""Defaults of the built-in reference trainer (the `trainer:` section of the langsplat config).

    from hpc.jobs.langsplat.defaults import trainer_config
    cfg = trainer_config({"trainer": {"rgb_iterations": 200}})   # defaults < given section

Each key is documented where it is defined. Sizes are the smallest that keep a wide margin over
the quality targets (held-out PSNR 25 dB, accuracy 0.9) so that the whole pipeline (rgb, then
levels 0 1 2 side by side) stays a quick run on a laptop-class CPU with the local executor; more
RGB and feature steps buy little quality for their time. README.md gives a measured run.
"""
from __future__ import annotations

TRAINER = {
    # scene
    "scene_seed": 0,            # seed of the synthetic scene (objects, cameras, embeddings)
    "n_objects": 3,             # objects; each has 2 parts of 2 subparts (levels 0/1/2)
    "gaussians_per_subpart": 10,  # ground-truth gaussians per subpart
    "image_size": 64,           # square image side in pixels
    "n_views": 40,              # cameras on a sphere around the objects
    "test_every": 5,            # every 5th view is held out (used for metrics only)
    "camera_radius": 4.0,       # camera distance from the origin
    "fov_deg": 50.0,            # horizontal field of view
    "feature_dim": 6,           # dimension of the per-segment language embedding
    "init_points": 60,          # size of the noisy SfM-like point cloud the model starts from
    "init_noise": 0.05,         # std of the noise on those points
    # stage 1: geometry + colour
    "seed": 0,                  # training seed (initial colours, split sampling, feature init)
    "rgb_iterations": 300,      # optimisation steps, one training view each
    "rgb_lr": {"means": 0.004, "log_scales": 0.01, "quats": 0.01, "opacity": 0.05, "colors": 0.05},
    "init_scale": 0.1,          # initial gaussian scale
    "densify_from": 100,        # first step that densifies
    "densify_until": 200,       # last step that densifies
    "densify_every": 100,       # densification interval
    "opacity_reset_every": 0,   # 0 disables 3DGS's periodic opacity reset
    "densify_grad": 1.5e-3,      # mean positional gradient norm that triggers clone/split
    "split_scale": 0.08,        # gaussians larger than this are split, smaller ones cloned
    "prune_opacity": 0.01,      # gaussians less opaque than this are dropped
    "max_gaussians": 300,       # densification stops adding beyond this
    # stage 2: language features (geometry frozen)
    "feature_iterations": 200,  # optimisation steps
    "feature_lr": 0.05,         # Adam learning rate of the per-gaussian feature
    "cameras_per_step": 4,      # GLOBAL camera batch per step, shared round-robin by the ranks;
                                # fixed so 1 and N ranks take the same steps (must divide by N)
    "per_device_cameras": 4,    # most cameras one rank renders at once (accumulates beyond)
    "checkpoint_every": 100,    # checkpoint interval of both stages (steps); a stopped job resumes there
    "log_every": 25,            # TensorBoard scalar interval (steps)
    "threads": 2,               # torch threads per node, split among the node's ranks
    "query_segment": 0,         # segment whose relevancy map is rendered
}


def trainer_config(section: dict | None) -> dict:
    """Merge the `trainer:` entry of a langsplat config section over TRAINER. Unknown keys are
    an error, so a typo does not silently train with a default."""
    given = dict((section or {}).get("trainer") or {})
    unknown = sorted(set(given) - set(TRAINER))
    if unknown:
        raise KeyError(f"unknown langsplat trainer keys {unknown}; expected some of "
                       f"{sorted(TRAINER)}. HINT: check the spelling under `trainer:`")
    cfg = {**TRAINER, **given}
    cfg["rgb_lr"] = {**TRAINER["rgb_lr"], **(given.get("rgb_lr") or {})}
    return cfg
