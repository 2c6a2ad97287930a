"""Stand-in for LangSplat's render.py.

    python tests/langsplat_standins/render.py -m out/scene_1 --include_feature

Its parameters default to None and are filled from <-m>/cfg_args (written by train.py); it loads
<-m>/chkpnt30000.pth whatever the iterations were, and writes train/ours_None/renders_npy/NNNNN.npy
and gt_npy/NNNNN.npy (H x W x 3) for every training camera, sorted by name.
"""
from __future__ import annotations

import sys
from argparse import ArgumentParser
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

from tests.langsplat_standins import common as c


def main(fork: bool = False, argv=None) -> int:
    p = ArgumentParser(description="Testing script parameters")
    c.add_group(p, c.MODEL_LANGSPLAT, fork=fork, fill_none=True)
    c.add_group(p, c.PIPE, fork=fork)
    p.add_argument("--iteration", default=-1, type=int)
    p.add_argument("--skip_train", action="store_true")
    p.add_argument("--skip_test", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--include_feature", action="store_true")
    cmdline = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        merged = c.read_cfg_args(cmdline.model_path)
    except TypeError:  # no -m: the real script goes on without cfg_args
        merged = {}
    merged.update({k: v for k, v in vars(cmdline).items() if v is not None})
    model = Path(merged["model_path"])
    params, _ = c.load_checkpoint(str(model / "chkpnt30000.pth"), "fork" if fork else "upstream")
    g = c.restore(params)
    scene = c.Scene(merged["source_path"], merged.get("images") or "images")
    out = model / "train" / "ours_None"
    for sub in ("renders_npy", "gt_npy"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for idx, name in enumerate(scene.names):
        h, w = scene.size(name)
        c.first_render("fork" if fork else "upstream", h, w, merged["include_feature"])
        if merged["include_feature"]:
            pixel = g["language_feature"].mean(axis=0)
            gt = c.language_feature(scene.source, name, merged["language_features_name"], merged["feature_level"], (h, w))
        else:
            pixel, gt = g["features"].mean(axis=0), np.zeros(3, np.float32)
        np.save(out / "renders_npy" / f"{idx:05d}.npy", np.broadcast_to(pixel, (h, w, 3)).astype(np.float32))
        np.save(out / "gt_npy" / f"{idx:05d}.npy", np.broadcast_to(gt, (h, w, 3)).astype(np.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
