"""Stage outputs: PNG images, feature maps as colours, relevancy heat maps, metrics.json.

    from hpc.jobs.langsplat.outputs import write_png, features_to_rgb, heatmap, write_metrics
    write_png(out_dir / "renders" / "view-003.png", image_hw3)     # floats in [0, 1]

The PNG writer is a few lines of zlib so outputs need no imaging library.
"""
from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import torch


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def png_bytes(image: torch.Tensor) -> bytes:
    """(H, W, 3) floats in [0, 1] -> 8-bit RGB PNG file contents."""
    if image.dim() != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) image, got shape {tuple(image.shape)}; "
                         "HINT: colour feature maps with features_to_rgb first")
    pixels = (image.detach().cpu().clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy()
    h, w, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[row].tobytes() for row in range(h))  # filter 0 per row
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b""))


def write_png(path: Path, image: torch.Tensor) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png_bytes(image))
    return path


def features_to_rgb(features: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """(H, W, D) features -> (H, W, 3) colours through a fixed (D, 3) projection, so the same
    segment has the same colour in every render of a level."""
    return (0.5 + 0.5 * features @ basis).clamp(0, 1)


def feature_basis(embeddings: torch.Tensor) -> torch.Tensor:
    """(D, 3) projection onto the top three principal directions of a level's embeddings."""
    centred = embeddings - embeddings.mean(dim=0)
    _, _, vh = torch.linalg.svd(centred, full_matrices=True)
    basis = vh[:3].T
    if basis.shape[1] < 3:  # fewer than three directions: pad with zeros
        basis = torch.cat([basis, basis.new_zeros(basis.shape[0], 3 - basis.shape[1])], dim=1)
    return basis / basis.abs().sum(dim=0).clamp(min=1e-6)


def heatmap(values: torch.Tensor) -> torch.Tensor:
    """(H, W) values in [0, 1] -> (H, W, 3) blue-to-red colours."""
    v = values.clamp(0, 1)[..., None]
    cold = v.new_tensor([0.1, 0.1, 0.5])
    hot = v.new_tensor([1.0, 0.9, 0.1])
    return (1 - v) * cold + v * hot


def write_metrics(path: Path, metrics: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)  # readers never see half a file
    return path
