"""The software an attempt runs on: torch, CUDA, NCCL, the driver and GPU, Python, hpc, every installed
package (one digest), the container image. Imports no torch.

    python -c "from hpc.rundir import software; print(software.record())"

Cheap by design (bench/software_record.py, BENCHMARKS.md): the installed packages and their versions
are the names of the .dist-info folders in the site folders on sys.path (one listing each, no file
read), and the packages' digest is over them; torch's and CUDA's versions come from torch's own
modules when the process has imported torch, else from the text of torch/version.py; NCCL's from
torch when CUDA is up, else from its nvidia-nccl package; the driver and GPU model from
/proc/driver/nvidia (no nvidia-smi). The container image is named
by the variable its runtime sets (Apptainer's; HPC_CONTAINER_IMAGE elsewhere) and stamped by its content
(hpc.rundir.imagestamp: a pinned digest, an OCI manifest's, else a hash of 1 MiB sampled over the file:
hashing a multi-gigabyte image whole at every start would cost more than the attempt's first steps).
differences() says, field by field, what changed between two records (the image by its stamp, where
both have one: a copy elsewhere is the same image); the fields a resumed run's bitwise promise rests on
are all of them.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import hpc
from hpc.rundir import imagestamp

NVIDIA = Path("/proc/driver/nvidia")
# runtime -> the variables that name the image inside it
# (Apptainer and Singularity set theirs; under Pyxis or any other runtime HPC_CONTAINER_IMAGE may name it)
IMAGE_VARS = (("apptainer", "APPTAINER_CONTAINER"), ("apptainer", "SINGULARITY_CONTAINER"),
              ("image", "HPC_CONTAINER_IMAGE"))
# the fields differences() compares, in the order it names them
FIELDS = ("torch", "cuda", "nccl", "python", "hpc", "driver", "gpu", "image", "packages")


def installed() -> Dict[str, str]:
    """name -> version of every distribution in the site folders on sys.path, from the names of their
    .dist-info and .egg-info folders (no file read: importlib.metadata parses each METADATA, 40x dearer)."""
    found: Dict[str, str] = {}
    for folder in _site_folders():
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for entry in names:
            stem, dot, kind = entry.rpartition(".")
            if dot and kind in ("dist-info", "egg-info") and "-" in stem:
                name, version = stem.split("-", 1)
                found.setdefault(name.lower().replace("-", "_").replace(".", "_"), version.split("-")[0])
    return found


def _nccl(packages: Mapping[str, str]) -> Optional[str]:
    return next((packages[k] for k in ("nvidia_nccl_cu13", "nvidia_nccl_cu12", "nvidia_nccl_cu11") if k in packages),
                None)


def _torch_side(modules: Mapping[str, Any], packages: Mapping[str, str]) -> Dict[str, Optional[str]]:
    """torch, CUDA and NCCL versions: torch's own answers when it is loaded, else the text of its
    version.py and NCCL's installed package (importing torch to ask would cost a second)."""
    torch = modules.get("torch")
    if torch is not None:
        nccl = None
        try:
            if torch.cuda.is_available():
                nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # a build without NCCL
            nccl = None
        return {"torch": str(torch.__version__), "cuda": torch.version.cuda, "nccl": nccl or _nccl(packages)}
    out: Dict[str, Optional[str]] = {"torch": None, "cuda": None, "nccl": _nccl(packages)}
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
    """'runtime:name@stamp' of the container this process runs in (hpc.rundir.imagestamp: its content,
    cheaply), 'runtime:name' where it cannot be read, None on the host."""
    for runtime, var in IMAGE_VARS:
        name = environ.get(var)
        if name:
            found = imagestamp.stamp(name)
            return f"{runtime}:{name}" + (f"@{found}" if found else "")
    return None


def _site_folders() -> List[str]:
    return sorted({p for p in sys.path if p and os.path.isdir(p) and p.rstrip("/").endswith(("site-packages",
                                                                                              "dist-packages"))})


def packages_digest(packages: Optional[Mapping[str, str]] = None) -> str:
    """sha256 (16 hex digits) over the sorted 'name==version' of every installed distribution."""
    found = installed() if packages is None else packages
    return hashlib.sha256("\n".join(sorted(f"{k}=={v}" for k, v in found.items())).encode()).hexdigest()[:16]


def record(modules: Mapping[str, Any] = sys.modules, environ: Mapping[str, str] = os.environ
           ) -> Dict[str, Optional[str]]:
    """This process's software, FIELDS -> value (None: not here, or not known)."""
    packages = installed()
    out: Dict[str, Optional[str]] = dict(_torch_side(modules, packages))
    out["python"] = ".".join(map(str, sys.version_info[:3]))
    out["hpc"] = hpc.__version__
    out.update(_driver_and_gpu())
    out["image"] = _image(environ)
    out["packages"] = packages_digest(packages)
    return out


def _compared(field: str, value: Any) -> Any:
    """What a field is compared by: its value; an image stamped by its content, by that stamp alone
    (a copy of the same image elsewhere is the same software)."""
    if field == "image" and isinstance(value, str) and "@" in value:
        return value.rpartition("@")[2]
    return value


def digest(rec: Mapping[str, Any]) -> str:
    """One short digest of a record: records that differences() finds equal, equal digests."""
    return hashlib.sha256(json.dumps([_compared(f, rec.get(f)) for f in FIELDS]).encode()).hexdigest()[:12]


def differences(before: Mapping[str, Any], after: Mapping[str, Any]) -> List[str]:
    """'torch 2.3.0 -> 2.4.0' for each field that changed (the packages by their digest, the image by its stamp)."""
    return [f"{f} {before.get(f) or '-'} -> {after.get(f) or '-'}" for f in FIELDS
            if _compared(f, before.get(f)) != _compared(f, after.get(f))]
