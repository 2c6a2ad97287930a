"""Stand-in for LangSplat's preprocess.py: SAM masks and CLIP features of every image in images/.

    python tests/langsplat_standins/preprocess.py --dataset_path data/scene --sam_ckpt_path ckpts/sam.pth

Loads OpenCLIP first (its weights from the Hugging Face cache; offline that cache must hold them),
then SAM from --sam_ckpt_path (default ckpts/sam_vit_h_4b8939.pth, relative to the working
directory). Writes <dataset>/language_features/<name>_s.npy (4 x H x W segment ids per level, -1
outside every mask) and <name>_f.npy (segments x 512), <name> being the file name up to its first dot.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

CLIP_REPO = "laion/CLIP-ViT-B-16-laion2B-s34B-b88K"


def load_clip() -> Path:
    """open_clip through huggingface_hub, offline: revision "main" is read from refs/main, and the
    weights from the snapshot of the commit it names; anything missing means a download, which fails."""
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    repo = home / "hub" / ("models--" + CLIP_REPO.replace("/", "--"))
    ref = repo / "refs" / "main"
    commit = ref.read_text().strip() if ref.is_file() else None
    for name in ("open_clip_pytorch_model.bin", "open_clip_model.safetensors"):
        if commit and (repo / "snapshots" / commit / name).is_file():
            return repo / "snapshots" / commit / name
    raise OSError(f"We couldn't connect to 'https://huggingface.co' to load {CLIP_REPO} and it is "
                  f"not in the cached files under {home / 'hub'}")


def features_of(height: int, width: int, seed: int):
    rng = np.random.default_rng(seed)
    seg = -np.ones((4, height, width), np.int32)
    count = 0
    for level in range(4):  # level l splits the image into l + 1 vertical bands (0: one mask)
        for band, cols in enumerate(np.array_split(np.arange(width), level + 1)):
            seg[level][:, cols] = count
            count += 1
    feat = rng.normal(size=(count, 512)).astype(np.float32)
    return seg, feat / np.linalg.norm(feat, axis=1, keepdims=True)


def main(argv=None) -> int:
    from tests.langsplat_standins.common import Scene

    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset_path", type=str, required=True)
    parser.add_argument("--resolution", type=int, default=-1)
    parser.add_argument("--sam_ckpt_path", type=str, default="ckpts/sam_vit_h_4b8939.pth")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    images = os.path.join(args.dataset_path, "images")
    data_list = sorted(os.listdir(images))
    from segment_anything import SamAutomaticMaskGenerator, sam_model_registry

    load_clip()
    sam = sam_model_registry["vit_h"](checkpoint=args.sam_ckpt_path).to("cuda")
    mask_generator = SamAutomaticMaskGenerator(sam)
    save_folder = os.path.join(args.dataset_path, "language_features")
    os.makedirs(save_folder, exist_ok=True)
    for i, name in enumerate(data_list):
        stem = name.split(".")[0]
        height, width = Scene.png_size(Path(images) / name)
        _default, _s, _m, _l = mask_generator.generate(name)  # LangSplat's SAM: four mask sets
        if args.resolution == -1 and height > 1080:
            height, width = 1080, round(width * 1080 / height)
        seg, feat = features_of(height, width, 42 + sum(map(ord, stem)))
        np.save(os.path.join(save_folder, stem + "_s.npy"), seg)
        np.save(os.path.join(save_folder, stem + "_f.npy"), feat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
