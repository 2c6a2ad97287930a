"""What the stand-in scripts share: LangSplat's/3DGS's parameter groups, checkpoints, GUI socket,
cfg_args and a record of the iterations each run trained (`<model>/standin.jsonl`)."""
from __future__ import annotations

import argparse
import ast
import json
import os
import socket
import struct
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from hpc.jobs.langsplat.colmap import registered_images, stem

# name: default; a leading "_" gives a one-letter short flag as well (as 3DGS's ParamGroup does)
MODEL_3DGS = {"sh_degree": 3, "_source_path": "", "_model_path": "", "_images": "images", "_resolution": -1,
              "_white_background": False, "data_device": "cuda", "eval": False}
MODEL_LANGSPLAT = {"sh_degree": 3, "_source_path": "", "_model_path": "",
                   "_language_features_name": "language_features_dim3", "_images": "images", "_resolution": -1,
                   "_white_background": False, "_feature_level": -1, "data_device": "cuda", "eval": False}
OPT_3DGS = {"iterations": 30000, "position_lr_init": 0.00016, "position_lr_final": 0.0000016,
            "position_lr_delay_mult": 0.01, "position_lr_max_steps": 30000, "feature_lr": 0.0025,
            "opacity_lr": 0.05, "scaling_lr": 0.005, "rotation_lr": 0.001, "percent_dense": 0.01,
            "lambda_dssim": 0.2, "densification_interval": 100, "opacity_reset_interval": 3000,
            "densify_from_iter": 500, "densify_until_iter": 15000, "densify_grad_threshold": 0.0002}
OPT_LANGSPLAT = {**OPT_3DGS, "language_feature_lr": 0.0025, "include_feature": True}
PIPE = {"convert_SHs_python": False, "compute_cov3D_python": False, "debug": False}
# "<iteration>:<file>": after that iteration (and its checkpoint), the run writes <file>.reached and
# waits while <file> exists, so that a test can stop it at a known point (no timing involved)
HOLD_ENV = "LANGSPLAT_STANDIN_HOLD"


def add_group(parser: argparse.ArgumentParser, params: Dict, fork: bool = False, fill_none: bool = False) -> None:
    """One parameter group as the real ParamGroup builds it; the fork adds --no_<flag> for booleans."""
    for key, value in params.items():
        short = key.startswith("_")
        key = key.lstrip("_")
        flags = ["--" + key] + (["-" + key[0]] if short else [])
        default = None if fill_none else value
        if isinstance(value, bool):
            parser.add_argument(*flags, default=default, action="store_true", dest=key)
            if fork:
                parser.add_argument("--no_" + key, default=None, action="store_false", dest=key)
        else:
            parser.add_argument(*flags, default=default, type=type(value))


def train_flags(parser: argparse.ArgumentParser, port: int, checkpoints: List[int]) -> None:
    """The flags train.py adds after its groups (3DGS, LangSplat and train_ddp.py alike)."""
    parser.add_argument("--ip", type=str, default="127.0.0.1")
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--debug_from", type=int, default=-1)
    parser.add_argument("--detect_anomaly", action="store_true", default=False)
    parser.add_argument("--test_iterations", nargs="+", type=int, default=[7000, 30000])
    parser.add_argument("--save_iterations", nargs="+", type=int, default=[7000, 30000])
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--checkpoint_iterations", nargs="+", type=int, default=checkpoints)
    parser.add_argument("--start_checkpoint", type=str, default=None)


def bind_gui(ip: str, port: int) -> socket.socket:
    """network_gui.init: bind and listen, without SO_REUSEADDR; a taken port raises OSError."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((ip, port))
    listener.listen()
    return listener


class Scene:
    """The training cameras of `source` as 3DGS loads them (all registered images, no --eval), and
    its points: readColmapSceneInfo converts sparse/0/points3D.{bin,txt} to points3D.ply in place
    when that file is missing (storePly: written where it will be read, no temporary name), then
    reads the .ply."""

    def __init__(self, source: str, images: str = "images"):
        self.source = Path(os.path.abspath(source))
        if not (self.source / "sparse").exists():
            raise AssertionError("Could not recognize scene type!")
        self.names = [stem(n) for n in registered_images(self.source)]
        self.files = {stem(n): self.source / images / n for n in registered_images(self.source)}
        ply = self.source / "sparse" / "0" / "points3D.ply"
        if not ply.exists():
            print("Converting point3d.bin to .ply, will happen only the first time you open the scene.")
            store_ply(ply, self.source / "sparse" / "0" / "points3D.txt")
        self.points = fetch_ply(ply)

    def size(self, name: str) -> Tuple[int, int]:
        return self.png_size(self.files[name])

    @staticmethod
    def png_size(path: Path) -> Tuple[int, int]:
        """(height, width) from the PNG header (the real scripts open every image)."""
        data = Path(path).read_bytes()[:24]
        if data[:8] != b"\x89PNG\r\n\x1a\n":
            raise OSError(f"cannot identify image file {str(path)!r}")
        width, height = struct.unpack(">II", data[16:24])
        return height, width


def store_ply(ply: Path, points_txt: Path) -> None:
    """storePly of the text model's points, header then vertices as plyfile writes them."""
    rows = [r.split() for r in points_txt.read_text().splitlines() if r.strip() and not r.startswith("#")]
    with open(ply, "wb") as f:
        f.write(("ply\nformat binary_little_endian 1.0\nelement vertex %d\n" % len(rows)
                 + "".join(f"property float {k}\n" for k in ("x", "y", "z", "nx", "ny", "nz"))
                 + "".join(f"property uchar {k}\n" for k in ("red", "green", "blue")) + "end_header\n").encode())
        f.flush()
        for r in rows:
            f.write(struct.pack("<6f3B", *map(float, r[1:4]), 0, 0, 0, *map(int, r[4:7])))


def fetch_ply(ply: Path) -> int:
    """The vertex count of a binary PLY of storePly's 27-byte vertices; plyfile's error on a short one."""
    data = ply.read_bytes()
    end = data.index(b"end_header\n") + len(b"end_header\n")
    count = int(next(line.split()[2] for line in data[:end].decode().splitlines() if line.startswith("element vertex")))
    if len(data) - end < 27 * count:
        raise ValueError(f"early end-of-file reading {ply}: {count} vertices announced")
    return count


def first_render(variant: str, height: int, width: int, include_feature: bool = False) -> None:
    """gaussian_renderer.render's use of diff_gaussian_rasterization: graphdeco's settings have no
    include_feature and its rasterizer returns two values; LangSplat's (upstream and fork) pass
    include_feature and unpack three. In the other checkout's environment this raises."""
    from diff_gaussian_rasterization import GaussianRasterizationSettings, GaussianRasterizer

    settings = dict(image_height=height, image_width=width, tanfovx=1.0, tanfovy=1.0, bg=None, scale_modifier=1.0,
                    viewmatrix=None, projmatrix=None, sh_degree=3, campos=None, prefiltered=False, debug=False)
    inputs = dict(means3D=None, means2D=None, shs=None, colors_precomp=None, opacities=None, scales=None,
                  rotations=None, cov3D_precomp=None)
    if variant == "3dgs":
        _image, _radii = GaussianRasterizer(raster_settings=GaussianRasterizationSettings(**settings))(**inputs)
    else:
        rasterizer = GaussianRasterizer(raster_settings=GaussianRasterizationSettings(**settings,
                                                                                      include_feature=include_feature))
        _image, _feature, _radii = rasterizer(**inputs, language_feature_precomp=None)


def new_gaussians(points: int) -> Dict[str, np.ndarray]:
    return {"xyz": np.zeros((points, 3), np.float32), "features": np.zeros((points, 3), np.float32)}


def capture(g: Dict, include_feature: bool) -> tuple:
    """GaussianModel.capture: 12 entries, or 13 with the language feature after the opacity."""
    import torch

    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in g.items()}
    head = (3, t["xyz"], t["features"], t["features"][:, :0], t["xyz"][:, :3], t["xyz"][:, :1].repeat(1, 4),
            t["xyz"][:, :1])
    # spatial_lr_scale: the cameras' extent, a numpy float64 (getNerfppNorm's radius)
    tail = (t["xyz"][:, 0], t["xyz"][:, :1], t["xyz"][:, :1], {"state": {}, "param_groups": []}, np.float64(1.1))
    return head + ((t["language_feature"],) if include_feature else ()) + tail


def restore(model_args: tuple) -> Dict[str, np.ndarray]:
    g = {"xyz": model_args[1].numpy().copy(), "features": model_args[2].numpy().copy()}
    if len(model_args) == 13:
        g["language_feature"] = model_args[7].numpy().copy()
    return g


def load_checkpoint(path: str, variant: str):
    """The fork passes weights_only=False; upstream LangSplat and graphdeco call torch.load(path),
    whose weights_only is True from torch 2.6 and refuses the numpy float64 in the tuple."""
    import torch

    return torch.load(path, weights_only=False) if variant == "fork" else torch.load(path)


def save_checkpoint(model_path: str, g: Dict, include_feature: bool, iteration: int) -> None:
    import torch

    torch.save((capture(g, include_feature), iteration), f"{model_path}/chkpnt{iteration}.pth")


def write_cfg_args(model_path: str, values: Dict) -> None:
    """cfg_args holds str(Namespace(...)) of the model parameters; render.py reads it back."""
    Path(model_path).mkdir(parents=True, exist_ok=True)
    (Path(model_path) / "cfg_args").write_text(str(argparse.Namespace(**values)))


def read_cfg_args(model_path: str) -> Dict:
    call = ast.parse((Path(model_path) / "cfg_args").read_text(), mode="eval").body
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}


def record(model_path: str, **entry) -> None:
    """One line per run: which iterations it trained (tests check resumes with it)."""
    with open(Path(model_path) / "standin.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


def hold(iteration: int) -> None:
    """The test hook of HOLD_ENV: the real scripts have no such pause."""
    at, _, name = os.environ.get(HOLD_ENV, "").partition(":")
    if not at or int(at) != iteration:
        return
    gate = Path(name)
    Path(f"{gate}.reached").write_text(str(iteration))
    while gate.exists():
        time.sleep(0.1)


def language_feature(source: Path, name: str, lf_name: str, level: int, size: Tuple[int, int]) -> np.ndarray:
    """Camera.get_language_feature: the mean feature of the level's segments in this view."""
    base = source / lf_name / name
    seg, feat = np.load(f"{base}_s.npy"), np.load(f"{base}_f.npy")
    # read at the image's pixel coordinates: a smaller map fails, a larger one is read at its
    # top-left corner without a word
    if seg.shape[1] < size[0] or seg.shape[2] < size[1]:
        raise IndexError(f"segment map {seg.shape[1:]} is smaller than the image {size}")
    seg = seg[:, :size[0], :size[1]]
    if level not in (0, 1, 2, 3):
        raise ValueError("feature_level=", level)
    ids = seg[level][seg[level] != -1].astype(int)
    return feat[ids].mean(axis=0) if len(ids) else np.zeros(feat.shape[1], np.float32)
