"""Stand-in for LangSplat's eval/evaluate_iou_loc.py (upstream, or the fork's with --model_path).

    cd LangSplat/eval && python evaluate_iou_loc.py --dataset_name teatime --feat_dir ../output \
        --ae_ckpt_dir ../autoencoder/ckpt --output_dir ../eval_result --json_folder ../data/lerf_ovs/label

Runs from eval/: it appends ".." to sys.path to import autoencoder.model. Reads levels 1 2 3 from
<feat_dir>/<name>_{1,2,3}/train/ours_None/renders_npy, the autoencoder from
<ae_ckpt_dir>/<name>/ae_ckpt/best_ckpt.pth (fork: <ae_ckpt_dir>/<name>/best_ckpt.pth), the labels
from <json_folder>/<name>/frame_*.json and, paired with them by sorted position, frame_*.jpg, loads
CLIP, and logs to <output_dir>/<name>/<time>.log. Renders are copied into an array of the label
info's height x width, and each label image is used with its render: all three sizes must agree.
"""
from __future__ import annotations

import glob
import json
import os
import struct
import sys
import time
from argparse import ArgumentParser
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np


def main(fork: bool = False, argv=None) -> int:
    import torch

    from tests.langsplat_standins.autoencoder import model
    from tests.langsplat_standins.preprocess import load_clip

    if not (Path("..") / "autoencoder" / "model.py").is_file():
        raise ModuleNotFoundError("No module named 'autoencoder'")
    p = ArgumentParser(description="prompt any label")
    p.add_argument("--dataset_name", type=str, default=None)
    if fork:
        p.add_argument("--model_path", "-m", type=str, default=None)
    p.add_argument("--feat_dir", type=str, default=None)
    p.add_argument("--ae_ckpt_dir", type=str, default=None)
    p.add_argument("--output_dir", type=str, default=None)
    p.add_argument("--json_folder", type=str, default=None)
    p.add_argument("--mask_thresh", type=float, default=0.4)
    p.add_argument("--encoder_dims", nargs="+", type=int, default=[256, 128, 64, 32, 3])
    p.add_argument("--decoder_dims", nargs="+", type=int, default=[16, 32, 64, 128, 256, 256, 512])
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    name = args.dataset_name
    if fork and args.model_path:
        feat_dir = [f"{args.model_path}_{i}/train/ours_None/renders_npy" for i in range(1, 4)]
    else:
        feat_dir = [os.path.join(args.feat_dir, f"{name}_{i}", "train/ours_None/renders_npy") for i in range(1, 4)]
    ckpt = os.path.join(args.ae_ckpt_dir, name, "best_ckpt.pth" if fork else "ae_ckpt/best_ckpt.pth")
    output = Path(args.output_dir) / name
    output.mkdir(parents=True, exist_ok=True)
    labels = sorted(glob.glob(os.path.join(args.json_folder, name, "frame_*.json")))
    image_paths = sorted(glob.glob(os.path.join(args.json_folder, name, "frame_*.jpg")))
    infos = [json.loads(Path(f).read_text())["info"] for f in labels]
    frames = [int(info["name"].split("_")[-1].split(".jpg")[0]) - 1 for info in infos]
    h, w = infos[-1]["height"], infos[-1]["width"]
    levels = [sorted(glob.glob(os.path.join(d, "*.npy")), key=lambda f: int(Path(f).stem)) for d in feat_dir]
    feats = np.zeros((len(levels), len(frames), h, w, 3), np.float32)
    for i, lvl in enumerate(levels):
        for j, idx in enumerate(frames):
            feats[i][j] = np.load(lvl[idx])  # IndexError if a view is missing, ValueError if its size differs
    for j in range(len(frames)):
        if jpeg_size(image_paths[j]) != (h, w):  # IndexError when a frame_*.jpg is missing
            raise RuntimeError(f"The size of tensor a ({w}) must match the size of tensor b at {image_paths[j]}")
    load_clip()
    ae = model(args.encoder_dims, args.decoder_dims)
    ae.load_state_dict(torch.load(ckpt, map_location="cpu"))
    with torch.no_grad():
        decoded = ae["decoder"](torch.from_numpy(feats).float().flatten(0, 3))
    score = float(decoded.norm(dim=-1).mean())
    log = output / f"{time.strftime('%Y%m%d_%H%M%S')}.log"
    log.write_text(f"trunc thresh: {args.mask_thresh}\niou chosen: {score:.4f}\n"
                   f"Localization accuracy: {len(frames) / max(1, len(labels)):.4f}\n")
    return 0


def jpeg_size(path: str):
    """cv2.imread's (height, width), None for what it cannot read."""
    data = Path(path).read_bytes()
    at = data.find(b"\xff\xc0")
    return struct.unpack(">HH", data[at + 5:at + 9]) if data[:2] == b"\xff\xd8" and at > 0 else None


if __name__ == "__main__":
    sys.exit(main())
