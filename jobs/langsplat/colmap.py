"""A LangSplat scene on disk: COLMAP's sparse model and the images LangSplat trains on.

    python -c "from hpc.jobs.langsplat.colmap import layout_problems, registered_images; \
print(layout_problems('data/teatime') or registered_images('data/teatime'))"

LangSplat (through 3DGS's scene loader) reads `sparse/0/{cameras,images,points3D}` as .bin, falling
back to .txt, and the pictures from `images/`. Every registered image is a training camera (hpc
never passes --eval), so their number is what train_ddp.py divides among its ranks.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import List

SPARSE_FILES = ("cameras", "images", "points3D")


def layout_problems(scene: str | Path) -> List[str]:
    """What a scene directory lacks, one phrase each; [] when LangSplat can load it."""
    root = Path(scene)
    problems = []
    images = root / "images"
    if not images.is_dir() or not any(images.iterdir()):
        problems.append(f"{images} is missing or empty")
    for name in SPARSE_FILES:
        if not any((root / "sparse" / "0" / f"{name}{ext}").is_file() for ext in (".bin", ".txt")):
            problems.append(f"{root / 'sparse' / '0' / name}.bin (or .txt) is missing")
    return problems


def registered_images(scene: str | Path) -> List[str]:
    """File names of the images of sparse/0/images.bin (or .txt), sorted as LangSplat sorts them."""
    sparse = Path(scene) / "sparse" / "0"
    binary = sparse / "images.bin"
    names = _names_bin(binary) if binary.is_file() else _names_txt(sparse / "images.txt")
    return sorted(names, key=stem)


def stem(name: str) -> str:
    """LangSplat's image_name and the prefix of its feature files: the name up to its first dot."""
    return Path(name).name.split(".")[0]


def _names_bin(path: Path) -> List[str]:
    data = path.read_bytes()
    (count,), pos = struct.unpack_from("<Q", data, 0), 8
    names = []
    for _ in range(count):
        pos += 4 + 8 * 7 + 4  # image id, qvec, tvec, camera id
        end = data.index(b"\0", pos)
        names.append(data[pos:end].decode())
        (points,) = struct.unpack_from("<Q", data, end + 1)
        pos = end + 1 + 8 + 24 * points  # x, y (double) and point3D id (int64) per 2D point
    return names


def _names_txt(path: Path) -> List[str]:
    """Two lines per image: its pose line (the name last), then its 2D points, read whatever
    it holds (an image without points has an empty line there)."""
    names, lines = [], iter(path.read_text().splitlines())
    for line in lines:
        line = line.strip()
        if line and not line.startswith("#"):
            names.append(line.split()[9])
            next(lines, None)
    return names


def write_text_model(scene: str | Path, names: List[str], width: int, height: int) -> None:
    """A minimal valid sparse/0 in COLMAP's text format (one pinhole camera, no 3D points
    observed): how tests build a dataset in the real on-disk format."""
    sparse = Path(scene) / "sparse" / "0"
    sparse.mkdir(parents=True, exist_ok=True)
    focal = 0.8 * width
    (sparse / "cameras.txt").write_text(f"1 PINHOLE {width} {height} {focal} {focal} {width / 2} {height / 2}\n")
    poses = "".join(f"{i + 1} 1 0 0 0 {0.1 * i} 0 4 1 {name}\n\n" for i, name in enumerate(names))
    (sparse / "images.txt").write_text("# IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME\n" + poses)
    points = "".join(f"{i + 1} {i * 0.1} {-i * 0.05} {i * 0.02} 128 128 128 0.5\n" for i in range(8))
    (sparse / "points3D.txt").write_text(points)
