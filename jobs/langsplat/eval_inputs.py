"""What eval/evaluate_iou_loc.py reads, checked before submission.

    python -c "from hpc.jobs.langsplat.eval_inputs import label_problems; print(label_problems('/data/lerf_ovs/label/teatime', '/data/lerf_ovs/teatime'))"

It reads <label>/<scene>/frame_*.json and, paired with them by sorted position, frame_*.jpg; frame
N's render is the (N-1)-th training view, copied into an array of the label's info height x width,
so each render, each label image and each label's info must have one size. A render has its
training image's size, as LangSplat's loadCam makes it with -r -1: images taller than 1080 pixels
are scaled to 1080. The autoencoder it loads sits at <ae_ckpt_dir>/<scene>/ae_ckpt/best_ckpt.pth
for upstream LangSplat and at <ae_ckpt_dir>/<scene>/best_ckpt.pth for the fork.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import List, Optional, Tuple

from hpc.config.schema import ConfigError

from . import checkout as co
from .colmap import registered_images

SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def image_size(path: Path) -> Optional[Tuple[int, int]]:
    """(height, width) from a PNG or JPEG header, None when the file is neither."""
    data = Path(path).read_bytes()
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return height, width
    pos = 2 if data[:2] == b"\xff\xd8" else len(data)
    while pos + 9 <= len(data) and data[pos] == 0xFF:
        marker, length = data[pos + 1], struct.unpack(">H", data[pos + 2:pos + 4])[0]
        if marker in SOF:
            return struct.unpack(">HH", data[pos + 5:pos + 9])
        pos += 2 + length
    return None


def render_size(height: int, width: int) -> Tuple[int, int]:
    """The size LangSplat renders a training image at (-r -1: taller than 1080 scaled to 1080)."""
    scale = height / 1080 if height > 1080 else 1
    return int(height / scale), int(width / scale)


def label_problems(labels: Path, data: Path) -> List[str]:
    """Why eval would fail on these labels and this scene, one phrase each; [] when it can run."""
    jsons, jpgs = sorted(Path(labels).glob("frame_*.json")), sorted(Path(labels).glob("frame_*.jpg"))
    if [p.stem for p in jsons] != [p.stem for p in jpgs]:
        return [f"{labels} has frame_*.json {[p.name for p in jsons]} but frame_*.jpg {[p.name for p in jpgs]}; "
                "eval pairs them by position"]
    views = registered_images(data)
    problems = []
    for js, jpg in zip(jsons, jpgs):
        info = json.loads(js.read_text())["info"]
        index = int(info["name"].split("_")[-1].split(".jpg")[0]) - 1
        if not 0 <= index < len(views):
            problems.append(f"{js.name} names {info['name']}, but the scene has {len(views)} views")
            continue
        shot = image_size(Path(data) / "images" / views[index])
        sizes = {"label info": (info["height"], info["width"]), jpg.name: image_size(jpg),
                 f"render of {views[index]}": shot and render_size(*shot)}
        if len(set(sizes.values())) != 1:
            problems.append(", ".join(f"{k} {'x'.join(map(str, v)) if v else 'unreadable'}" for k, v in sizes.items()))
    return problems


def ae_checkpoint(ae_ckpt_dir: str, scene: str, mode: str) -> Path:
    """Where eval reads the autoencoder for this checkout."""
    return Path(ae_ckpt_dir) / scene / ("best_ckpt.pth" if mode == co.FORK else "ae_ckpt/best_ckpt.pth")


def check(labels: Path, data: str, ae_ckpt_dir: Optional[str], mode: str) -> None:
    """Refuse labels eval cannot pair with the renders, or an autoencoder in the other checkout's layout."""
    problems = label_problems(labels, Path(data))
    if problems:
        raise ConfigError(f"LERF labels at {labels}: {'; '.join(problems)}; eval/evaluate_iou_loc.py needs a "
                          "frame_*.jpg per frame_*.json, of the size in its info, which is the render's. HINT: use the "
                          "labels made for these images (LERF's label/<scene>/), or set external.label_dir")
    if ae_ckpt_dir and not ae_checkpoint(ae_ckpt_dir, Path(data).resolve().name, mode).is_file():
        layout = "<dir>/<scene>/best_ckpt.pth" if mode == co.FORK else "<dir>/<scene>/ae_ckpt/best_ckpt.pth"
        raise ConfigError(f"external.ae_ckpt_dir={ae_ckpt_dir} has no "
                          f"{ae_checkpoint(ae_ckpt_dir, Path(data).resolve().name, mode)}; the {mode} checkout's eval "
                          f"reads {layout}. HINT: point external.ae_ckpt_dir at the ckpt/ folder autoencoder/train.py "
                          "wrote for this checkout")
