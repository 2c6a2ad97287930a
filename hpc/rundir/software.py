"""The software an attempt runs on: torch, CUDA, NCCL, the driver and GPU, Python, hpc, every installed
package (one digest), the container image. Imports no torch.

    python -c "from hpc.rundir import software; print(software.record())"

Cheap by design (bench/software_record.py, BENCHMARKS.md): versions come from the package metadata
and from torch's own modules only when the process has already imported torch; the driver and GPU
model from /proc/driver/nvidia (no nvidia-smi); the packages' digest is over the names and versions
of importlib.metadata's distributions, kept in the user's cache under a key of the site folders'
modification times (an install or an upgrade changes its folder's). The container image is named
by the variable its runtime sets (Apptainer's; HPC_CONTAINER_IMAGE elsewhere) and stamped by its size and time:
hashing a multi-gigabyte image at every start would cost more than the attempt's first steps.
differences() says, field by field, what changed between two records; the fields a resumed run's
bitwise promise rests on are all of them.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import hpc
from hpc.fs import usercache

NVIDIA = Path("/proc/driver/nvidia")
# runtime -> the variables that name the image inside it
# (Apptainer and Singularity set theirs; under Pyxis or any other runtime HPC_CONTAINER_IMAGE may name it)
IMAGE_VARS = (("apptainer", "APPTAINER_CONTAINER"), ("apptainer", "SINGULARITY_CONTAINER"),
              ("image", "HPC_CONTAINER_IMAGE"))
# the fields differences() compares, in the order it names them
FIELDS = ("torch", "cuda", "nccl", "python", "hpc", "driver", "gpu", "image", "packages")


def _version(name: str) -> Optional[str]:
    from importlib import metadata  # the standard library's, only when a record is made

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _nccl_metadata() -> Optional[str]:
    return next((v for v in map(_version, ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")) if v), None)


def _torch_side(modules: Mapping[str, Any]) -> Dict[str, Optional[str]]:
    """torch, CUDA and NCCL versions: torch's own answers when it is loaded, else the text of its
    version.py and NCCL's package metadata (importing torch to ask would cost a second)."""
    torch = modules.get("torch")
    if torch is not None:
        nccl = None
        try:
            if torch.cuda.is_available():
                nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # a build without NCCL
            nccl = None
        return {"torch": str(torch.__version__), "cuda": torch.version.cuda, "nccl": nccl or _nccl_metadata()}
    out: Dict[str, Optional[str]] = {"torch": None, "cuda": None, "nccl": _nccl_metadata()}
    import importlib.util  # the standard library's: finds torch's folder without importing it

    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            text = (Path(folder) / "version.py").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            name, eq, value = line.partition("=")
            name, value = name.split(":")[0].strip(), value.split("#")[0].strip().strip("'\"")
            if eq and name in ("__version__", "cuda"):  # cuda: Optional[str] = '12.1'
                out["torch" if name == "__version__" else "cuda"] = None if value in ("None", "") else value
    return out


def _driver_and_gpu(root: Path = NVIDIA) -> Dict[str, Optional[str]]:
    """The NVIDIA driver's version and the first GPU's model, from /proc (None without them)."""
    driver = gpu = None
    try:
        head = (root / "version").read_text().splitlines()[0]
        words = head.split()
        driver = next((w for w in words if w[:1].isdigit() and "." in w), None)
    except (OSError, IndexError):
        pass
    try:
        first = sorted((root / "gpus").iterdir())[0] / "information"
        for line in first.read_text().splitlines():
            if line.startswith("Model:"):
                gpu = line.split(":", 1)[1].strip()
    except (OSError, IndexError):
        pass
    return {"driver": driver, "gpu": gpu}


def _image(environ: Mapping[str, str]) -> Optional[str]:
    """'runtime:name@size-mtime' of the container this process runs in, or None on the host."""
    for runtime, var in IMAGE_VARS:
        name = environ.get(var)
        if name:
            try:
                st = os.stat(name)
                return f"{runtime}:{name}@{st.st_size}-{st.st_mtime_ns}"
            except OSError:
                return f"{runtime}:{name}"
    return None


def _site_folders() -> List[str]:
    return sorted({p for p in sys.path if p and os.path.isdir(p) and p.rstrip("/").endswith(("site-packages",
                                                                                              "dist-packages"))})


def packages_digest(cache: Optional[Path] = None) -> str:
    """sha256 (16 hex digits) over the sorted 'name==version' of every installed distribution; kept
    in the user's cache keyed by the site folders and their modification times."""
    folders = _site_folders()
    stamps = []
    for folder in folders:
        try:
            stamps.append([folder, os.stat(folder).st_mtime_ns])
        except OSError:
            continue
    key = hashlib.sha256(json.dumps([sys.prefix, stamps]).encode()).hexdigest()[:24]
    path = (cache or usercache.cache_dir() / "software") / f"{key}.json"
    kept = usercache.kept(path, 7 * 24 * 3600)
    if kept and isinstance(kept.get("digest"), str):
        return kept["digest"]
    from importlib import metadata  # the standard library's: only on a cache miss

    names = sorted({f"{(d.metadata['Name'] or '').lower()}=={d.version}" for d in metadata.distributions()})
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
    usercache.keep(path, {"digest": digest, "count": len(names)})
    return digest


def record(modules: Mapping[str, Any] = sys.modules, environ: Mapping[str, str] = os.environ,
           cache: Optional[Path] = None) -> Dict[str, Optional[str]]:
    """This process's software, FIELDS -> value (None: not here, or not known)."""
    out: Dict[str, Optional[str]] = dict(_torch_side(modules))
    out["python"] = platform.python_version()
    out["hpc"] = hpc.__version__
    out.update(_driver_and_gpu())
    out["image"] = _image(environ)
    out["packages"] = packages_digest(cache)
    return out


def digest(rec: Mapping[str, Any]) -> str:
    """One short digest of a record: equal records, equal digests."""
    return hashlib.sha256(json.dumps([rec.get(f) for f in FIELDS]).encode()).hexdigest()[:12]


def differences(before: Mapping[str, Any], after: Mapping[str, Any]) -> List[str]:
    """'torch 2.3.0 -> 2.4.0' for each field that changed (the packages by their digest)."""
    return [f"{f} {before.get(f) or '-'} -> {after.get(f) or '-'}" for f in FIELDS if before.get(f) != after.get(f)]
