"""Fake checkouts and a small scene in the real on-disk layout, for tests.

    python -m tests.langsplat_standins.checkout /tmp/ls fork      # /tmp/ls/{LangSplat,scene,...}

make_checkout writes, at the paths of a real checkout, three-line launchers that run the stand-ins
of this package (upstream LangSplat, the DDP fork, or graphdeco's 3DGS); make_env an interpreter
whose environment has one checkout's diff_gaussian_rasterization (envs/: LangSplat's, with
segment_anything, or graphdeco's); make_scene writes images, a COLMAP text model and LERF-style
labels; make_weights a SAM file and a Hugging Face cache with the CLIP weights, as a user
pre-stages them for offline compute nodes.
"""
from __future__ import annotations

import json
import os
import struct
import sys
import zlib
from pathlib import Path
from typing import Dict

from hpc.jobs.langsplat.checkout import CLIP_FILES, CLIP_REPO_DIR
from hpc.jobs.langsplat.colmap import write_text_model

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = "import sys\nsys.path.insert(0, {root!r})\nfrom tests.langsplat_standins.{module} import main\nsys.exit(main({call}))\n"


def scripts(variant: str) -> Dict[str, tuple]:
    """path in the checkout -> (stand-in module, arguments of its main)."""
    if variant == "3dgs":
        return {"train.py": ("train", "'3dgs'")}
    fork = variant == "fork"
    table = {"train.py": ("train", repr(variant)), "render.py": ("render", f"fork={fork}"),
             "preprocess.py": ("preprocess", ""), "autoencoder/train.py": ("autoencoder", "'train'"),
             "autoencoder/test.py": ("autoencoder", "'test'"), "eval/evaluate_iou_loc.py": ("evaluate", f"fork={fork}")}
    return {**table, "train_ddp.py": ("train_ddp", "")} if fork else table


def make_checkout(dest: Path, variant: str) -> Path:
    for rel, (module, call) in scripts(variant).items():
        path = Path(dest) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(LAUNCH.format(root=str(ROOT), module=module, call=call))
    if variant != "3dgs":
        (Path(dest) / "autoencoder" / "model.py").write_text("# imported by eval/evaluate_iou_loc.py\n")
    return Path(dest)


def make_env(dest: Path, kind: str, site: Path = None) -> Path:
    """<dest>/bin/python: this interpreter with envs/<kind> (langsplat or 3dgs), or `site`, on its path."""
    python = Path(dest) / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    site = site or Path(__file__).resolve().parent / "envs" / kind
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    os.chmod(python, 0o755)
    return python


def jpeg(width: int, height: int) -> bytes:
    """A JPEG's start, its frame header (SOF0, which carries the size) and its end marker."""
    sof = struct.pack(">HBHHB", 11, 8, height, width, 1) + bytes([1, 0x11, 0])
    return b"\xff\xd8" + b"\xff\xc0" + sof + b"\xff\xd9"


def png(width: int, height: int, shade: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\0" + bytes([shade, 255 - shade, 128]) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def make_scene(dest: Path, images: int = 6, width: int = 8, height: int = 6, labels: bool = True) -> Path:
    """<dest> (LERF layout: <parent>/label/<name>/frame_*.json when labels)."""
    dest = Path(dest)
    names = [f"frame_{i + 1:05d}.png" for i in range(images)]
    (dest / "images").mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        (dest / "images" / name).write_bytes(png(width, height, 40 * i % 256))
    write_text_model(dest, names, width, height)
    if labels:
        label = dest.parent / "label" / dest.name
        label.mkdir(parents=True, exist_ok=True)
        for frame in (1, images):
            info = {"name": f"frame_{frame:05d}.jpg", "height": height, "width": width}
            (label / f"frame_{frame:05d}.json").write_text(json.dumps({"info": info, "objects": []}))
            (label / f"frame_{frame:05d}.jpg").write_bytes(jpeg(width, height))
    return dest


def make_weights(dest: Path) -> Dict[str, Path]:
    sam = Path(dest) / "ckpts" / "sam_vit_h_4b8939.pth"
    sam.parent.mkdir(parents=True, exist_ok=True)
    sam.write_bytes(b"sam")
    repo = Path(dest) / "hf" / "hub" / CLIP_REPO_DIR
    snapshot = repo / "snapshots" / "5a2f9b1c" / CLIP_FILES[0]
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.write_bytes(b"clip")
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text("5a2f9b1c")
    return {"sam": sam, "hf_home": Path(dest) / "hf"}


if __name__ == "__main__":
    top, variant = Path(sys.argv[1]), sys.argv[2]
    make_checkout(top / "LangSplat", variant)
    make_checkout(top / "gaussian-splatting", "3dgs")
    make_env(top / "envs" / "langsplat", "langsplat")
    make_env(top / "envs" / "3dgs", "3dgs")
    make_scene(top / "data" / "scene")
    print(make_weights(top))


def make_dim3(scene: Path) -> None:
    """language_features_dim3 as autoencoder/test.py leaves it, without running the chain."""
    import numpy as np

    from tests.langsplat_standins.common import Scene
    from tests.langsplat_standins.preprocess import features_of

    out = Path(scene) / "language_features_dim3"
    out.mkdir(exist_ok=True)
    for image in sorted((Path(scene) / "images").iterdir()):
        seg, feat = features_of(*Scene.png_size(image), seed=0)
        np.save(out / f"{image.name.split('.')[0]}_s.npy", seg)
        np.save(out / f"{image.name.split('.')[0]}_f.npy", feat[:, :3])
