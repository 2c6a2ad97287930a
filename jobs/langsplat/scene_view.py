"""The scene view the scripts read and write: <run>/scene/<name>/, never the dataset itself.

    python -c "from hpc.jobs.langsplat.scene_view import make_view; make_view('/data/teatime', '/tmp/run/scene/teatime', [])"

3DGS's scene loader writes sparse/0/points3D.ply when it is missing (a conversion of points3D.bin
or .txt), and LangSplat's scripts write their feature folders under -s. A link to the dataset's
sparse/ would put that file into the user's dataset (a PermissionError on a read-only one), and
several tasks would write it at once, one of them reading a half-written copy. So the view has its
own sparse/ and sparse/0/, with a link per dataset file, and hpc writes points3D.ply there itself,
in storePly's format, under a temporary name renamed into place: the scripts find it and write none.
"""
from __future__ import annotations

import contextlib
import struct
from pathlib import Path
from typing import Iterable, List, Tuple

from hpc.fs import atomic

PLY_PROPERTIES = [("x", "float"), ("y", "float"), ("z", "float"), ("nx", "float"), ("ny", "float"),
                  ("nz", "float"), ("red", "uchar"), ("green", "uchar"), ("blue", "uchar")]


def link(target: Path, name: Path) -> None:
    with contextlib.suppress(FileExistsError):
        name.symlink_to(target, target_is_directory=target.is_dir())


def make_view(data: Path, view: Path, linked: Iterable[str]) -> Path:
    """images/ and the `linked` folders of the dataset as links, sparse/ as folders of links plus
    points3D.ply. Idempotent: array tasks may build it at the same time."""
    data, view = Path(data), Path(view)
    (view / "sparse" / "0").mkdir(parents=True, exist_ok=True)
    for name in ["images", *linked]:
        link(data / name, view / name)
    for entry in (data / "sparse").iterdir():
        if entry.name != "0":
            link(entry, view / "sparse" / entry.name)
    for entry in (data / "sparse" / "0").iterdir():
        link(entry, view / "sparse" / "0" / entry.name)
    ply = view / "sparse" / "0" / "points3D.ply"
    if not ply.exists():
        atomic.write_bytes(ply, points_ply(read_points(data / "sparse" / "0")))
    return view


def read_points(sparse: Path) -> List[Tuple[Tuple[float, float, float], Tuple[int, int, int]]]:
    """(xyz, rgb) of each COLMAP 3D point, from points3D.bin, else points3D.txt."""
    binary = sparse / "points3D.bin"
    if binary.is_file():
        data, points = binary.read_bytes(), []
        (count,), pos = struct.unpack_from("<Q", data, 0), 8
        for _ in range(count):
            _, x, y, z, r, g, b, _, track = struct.unpack_from("<QdddBBBdQ", data, pos)
            points.append(((x, y, z), (r, g, b)))
            pos += 51 + 8 * track  # 43 bytes of point, the track length, then (image, point2D) int32 pairs
        return points
    rows = [line.split() for line in (sparse / "points3D.txt").read_text().splitlines()]
    return [((float(r[1]), float(r[2]), float(r[3])), (int(r[4]), int(r[5]), int(r[6])))
            for r in rows if r and not r[0].startswith("#")]


def points_ply(points: List[Tuple[Tuple[float, float, float], Tuple[int, int, int]]]) -> bytes:
    """A binary PLY as 3DGS's storePly writes it: position, zero normals, colour."""
    header = ["ply", "format binary_little_endian 1.0", f"element vertex {len(points)}",
              *(f"property {kind} {name}" for name, kind in PLY_PROPERTIES), "end_header"]
    body = b"".join(struct.pack("<6f3B", *xyz, 0.0, 0.0, 0.0, *rgb) for xyz, rgb in points)
    return ("\n".join(header) + "\n").encode() + body
