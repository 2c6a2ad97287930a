"""Stand-in for train.py of graphdeco's 3DGS ("3dgs"), LangSplat ("upstream") and the fork ("fork").

    python tests/langsplat_standins/train.py -s data/scene -m out/scene --iterations 20

3DGS writes <-m>/, binds --port 6009, has no checkpoints by default and restores only 12-entry
checkpoints. LangSplat always trains features (the fork alone has --no_include_feature), appends
_<feature_level> to -m, binds --port 55555, checkpoints at 7000 30000 by default, and restarts at
iteration 0 from a 12-entry (RGB) checkpoint but at the saved iteration from a 13-entry one.
"""
from __future__ import annotations

import sys
from argparse import ArgumentParser
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

from tests.langsplat_standins import common as c


def parser_for(variant: str) -> ArgumentParser:
    p = ArgumentParser(description="Training script parameters")
    if variant == "3dgs":
        for group in (c.MODEL_3DGS, c.OPT_3DGS, c.PIPE):
            c.add_group(p, group)
        c.train_flags(p, 6009, [])
    else:
        for group in (c.MODEL_LANGSPLAT, c.OPT_LANGSPLAT, c.PIPE):
            c.add_group(p, group, fork=variant == "fork")
        c.train_flags(p, 55555, [7000, 30000])
    return p


def model_values(args, keys) -> dict:
    values = {k.lstrip("_"): getattr(args, k.lstrip("_")) for k in keys}
    values["source_path"] = str(Path(values["source_path"]).resolve())
    if "language_features_name" in values:
        values["lf_path"] = str(Path(values["source_path"]) / values["language_features_name"])
    return values


def start(args, scene: c.Scene, include_feature: bool, variant: str):
    """(gaussians, first iteration) as training() sets them up from --start_checkpoint."""
    g, first = c.new_gaussians(scene.points), 0
    if include_feature and not args.start_checkpoint:
        raise ValueError("checkpoint missing!!!!!")
    if args.start_checkpoint:
        params, first = c.load_checkpoint(args.start_checkpoint, variant)
        if variant == "3dgs" and len(params) != 12:
            raise ValueError(f"too many values to unpack (expected 12, got {len(params)})")
        if len(params) == 12 and include_feature:
            first = 0
        g = c.restore(params)
    if include_feature and "language_feature" not in g:
        g["language_feature"] = np.zeros((len(g["xyz"]), 3), np.float32)
    return g, first


def step(g: dict, scene: c.Scene, args, name: str, include_feature: bool, lr_scale: float = 1.0) -> None:
    if include_feature:
        target = c.language_feature(scene.source, name, args.language_features_name, args.feature_level,
                                    scene.size(name))
        g["language_feature"] += 0.1 * lr_scale * (target - g["language_feature"])
    else:
        g["xyz"] += 1e-3


def save(args, g: dict, it: int, include_feature: bool) -> None:
    if it in args.save_iterations:
        ply = Path(args.model_path) / "point_cloud" / f"iteration_{it}" / "point_cloud.ply"
        ply.parent.mkdir(parents=True, exist_ok=True)
        ply.write_text(f"ply\nelement vertex {len(g['xyz'])}\n")
    if it in args.checkpoint_iterations:
        c.save_checkpoint(args.model_path, g, include_feature, it)


def main(variant: str = "upstream", argv=None) -> int:
    args = parser_for(variant).parse_args(sys.argv[1:] if argv is None else argv)
    args.save_iterations.append(args.iterations)
    if variant != "3dgs":
        args.model_path = args.model_path + f"_{args.feature_level}"
    gui = c.bind_gui(args.ip, args.port)  # held for the whole run
    include_feature = variant != "3dgs" and args.include_feature
    keys = c.MODEL_3DGS if variant == "3dgs" else c.MODEL_LANGSPLAT
    c.write_cfg_args(args.model_path, model_values(args, keys))
    scene = c.Scene(args.source_path, args.images)
    g, first = start(args, scene, include_feature, variant)
    c.record(args.model_path, script=f"train.py ({variant})", start_iteration=first + 1,
             iterations=args.iterations, start_checkpoint=args.start_checkpoint, port=args.port)
    for it in range(first + 1, args.iterations + 1):
        if it == first + 1:
            c.first_render(variant, *scene.size(scene.names[0]), include_feature)
        step(g, scene, args, scene.names[(it - 1) % len(scene.names)], include_feature)
        save(args, g, it, include_feature)
        c.hold(it)
    gui.close()
    print("\nTraining complete.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
