"""hpc carried into a container image that has only torch: one shared copy of hpc and its pure-Python requirements.

    python -m hpc.submit langsplat ... cluster.container.runtime=pyxis   # container.hpc=carry, the default

A rank's first import is submitit's runner, which unpickles hpc's stage task: an image with torch
alone has neither, and users should not rebuild their image for hpc. So at submission (ensure) hpc
copies the modules of CARRIED, from where this interpreter imports them, into
$HPC_CACHE_DIR/carry/<key>/ (hpc.rundir.snapcache.cache_dir: mounted into every container, and made
visible to an `exec` prefix like any path), and each rank's srun line puts that folder first on
PYTHONPATH inside the container (wrap), ahead of the image's own PYTHONPATH, which it keeps.

Carried: hpc (with hpc.jobs and hpc.templates), submitit, cloudpickle, omegaconf with the antlr4
runtime (omegaconf 2.3's), PyYAML's pure-Python part (yaml falls back to it without its C extension)
and tqdm (the session's progress bars). Compiled files and bytecode are never copied. Not carried
(IMAGE): torch with what torch requires (typing_extensions, ...) and numpy, which torch images
have; and TensorBoard, which the ranks import for TrainLoop's logging (LangSplat's stages): it
needs numpy and protobuf, both compiled, and its generated code checks for a protobuf runtime of its
own release, so a copy could not run on the image's protobuf. An image without tensorboard runs a
TrainLoop with tensorboard=False only. container.hpc=image carries nothing: the image has hpc installed.

The folder's key is a digest of every copied file's path, size and modification time, stat only and
once per process (a 1000-point sweep stats the files once): a changed file of hpc or another
version of submitit gives a new folder, and the same files reuse the one an earlier submission
made, copying nothing. A copy is made in a temporary folder beside it, its listing (LISTING) written
last, and renamed into place whole, by the copier of the code snapshot (hpc.rundir.treecopy, files
read-only): a submission killed halfway leaves a .tmp-* folder that is never used and that the next
copy removes, and of two submissions copying at once the first rename wins. Old folders stay: a job
still queued may run one (remove $HPC_CACHE_DIR/carry when none is).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shlex
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from hpc.rundir import snapcache, treecopy

# the modules copied, each to the path of its dotted name: a package's whole folder, or a single-file module
CARRIED = ("hpc", "hpc.jobs", "hpc.templates", "submitit", "cloudpickle", "omegaconf", "antlr4", "yaml", "tqdm")
# what the image must have, with what each requires: compiled, or (tensorboard) bound to a compiled protobuf
IMAGE = ("torch", "numpy", "tensorboard")
SKIPPED_SUFFIXES = (".so", ".pyd", ".dylib", ".pyc", ".pyo")  # compiled for the host, not the image
LISTING = "CARRIED.json"  # written last into a copy: a folder without it is not one
FOLDER = "carry"  # under hpc.rundir.snapcache.cache_dir()
FORMAT = 2  # in the key: a change of what goes into a copy (2: read-only files) gives every copy a new folder


@dataclass(frozen=True)
class Carried:
    """One copy: where, how big, and whether this submission made it (seconds) or found it."""

    dir: str
    files: int
    bytes: int
    seconds: float
    reused: bool

    def summary(self) -> str:
        how = "reused" if self.reused else f"copied in {self.seconds * 1000:.0f} ms"
        return (f"hpc for the containers: {self.dir}, {self.files} files, {self.bytes / 1e6:.1f} MB, {how} "
                "(container.hpc=carry)")


def sources() -> Dict[str, str]:
    """Where each carried module is imported from here (its package folder or file), by the relative
    path of its copy. A module not installed here is left to the image."""
    found: Dict[str, str] = {}
    for name in CARRIED:
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        rel = name.replace(".", "/")
        if spec.submodule_search_locations:
            found[rel] = os.path.realpath(list(spec.submodule_search_locations)[0])
        elif spec.origin and spec.origin.endswith(".py"):
            found[rel + ".py"] = os.path.realpath(spec.origin)
    return found


@functools.lru_cache(maxsize=1)
def listing() -> Tuple[str, Tuple[Tuple[str, str, int, int], ...]]:
    """(key, ((relative path, source, size, mtime_ns), ...)) of everything a copy holds; once per process."""
    files: Dict[str, Tuple[str, int, int]] = {}
    for rel, src in sources().items():
        if not os.path.isdir(src):
            st = os.stat(src)
            files[rel] = (src, st.st_size, st.st_mtime_ns)
            continue
        for parent, dirs, names in os.walk(src):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in names:
                if name.endswith(SKIPPED_SUFFIXES):
                    continue
                path = os.path.join(parent, name)
                st = os.stat(path)
                # a package mapped into another one (hpc.jobs into hpc) keeps its own mapping
                files.setdefault(os.path.join(rel, os.path.relpath(path, src)), (path, st.st_size, st.st_mtime_ns))
    rows = tuple(sorted((rel, *v) for rel, v in files.items()))
    digest = hashlib.sha256(json.dumps([FORMAT, [(r, s, m) for r, _, s, m in rows]]).encode())
    return digest.hexdigest()[:16], rows


def folder() -> str:
    """The copy's folder for the files installed here now (nothing is made: see ensure)."""
    return str(snapcache.cache_dir() / FOLDER / listing()[0])


def ensure(where: Optional[str] = None) -> Carried:
    """Make the copy at `where` (default: folder()) unless a complete one is there; at submission."""
    started = time.perf_counter()
    where = where or folder()
    _, rows = listing()
    size = sum(r[2] for r in rows)
    if os.path.exists(os.path.join(where, LISTING)):
        return Carried(where, len(rows), size, time.perf_counter() - started, True)

    def fill(tmp: Path) -> None:  # the listing last: a folder without it is not a copy
        treecopy.copy_files(tmp, {rel: (src, stat.S_IFREG) for rel, src, _, _ in rows})
        with open(tmp / LISTING, "w") as f:
            json.dump({"files": {r[0]: r[1] for r in rows}, "made": time.time()}, f)

    _, _, made = treecopy.make(os.path.dirname(where), fill, os.path.basename(where))
    if not made and not os.path.exists(os.path.join(where, LISTING)):  # not another submission's copy
        raise RuntimeError(f"cannot put hpc's copy for the containers at {where}: a folder without {LISTING} is "
                           f"there; expected a folder made whole or none. HINT: remove {where} (no job runs it: it "
                           "is incomplete), or set container.hpc=image with hpc installed in the image")
    return Carried(where, len(rows), size, time.perf_counter() - started, not made)


def wrap(where: str, python: str) -> str:
    """The interpreter text of a rank's srun line, with the copy at `where` first on PYTHONPATH inside
    the container (a shell of the image's sets it there: the image's own PYTHONPATH stays behind it)."""
    script = f'export PYTHONPATH={shlex.quote(where)}"${{PYTHONPATH:+:$PYTHONPATH}}"; exec "$0" "$@"'
    return f"sh -c {shlex.quote(script)} {python}"
