"""Pyxis: a registry image imported once, at submission, to a shared squashfs file every node reads.

    python -m hpc.submit langsplat ... cluster.container.runtime=pyxis \\
        cluster.container.image=nvcr.io#nvidia/pytorch:24.05-py3 cluster.container.squash=/shared/images/torch.sqsh

With a registry image, every node of every job pulls and unpacks it itself (N nodes, N pulls). With
`squash`, the submission runs `enroot import -o PATH docker://IMAGE` once, only if PATH is missing,
and the srun lines name PATH (--container-image=PATH) instead of the registry. The import writes to a
temporary name beside PATH and is renamed to PATH when enroot has succeeded: a submission killed while
importing leaves nothing at PATH. Two submissions at once: the second waits on a lock (flock on
PATH.lock) and then finds PATH. A changed image needs a new PATH (a file once there is kept).
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import time
from typing import Any, Callable

from hpc.config.checks import ConfigError

LOCK_SUFFIX = ".lock"
IMPORT_TIMEOUT_S = 3600.0  # a large image over a slow link: tens of minutes


def uri(image: str) -> str:
    """enroot's name of a Pyxis image reference (nvcr.io#nvidia/pytorch:24.05-py3 -> docker://nvcr.io#...)."""
    return image if "://" in image else f"docker://{image}"


def check(path: str, image: str, runtime: str, where: str) -> None:
    """Before submission: `path` can be made (its folder exists) from a registry image, by Pyxis's enroot."""
    if runtime != "pyxis":
        raise ConfigError(f"{where}.squash set with runtime {runtime}; expected it with pyxis only (enroot imports "
                          f"the image). HINT: drop {where}.squash, or set {where}.runtime=pyxis.")
    if "://" not in image and "#" not in image and (image.startswith(("/", ".", "~")) or image.endswith(".sqsh")):
        raise ConfigError(f"{where}.squash={path!r} with {where}.image={image!r}, a file; expected a registry image "
                          f"to import. HINT: set {where}.image to the file and drop {where}.squash, or name a "
                          "registry image (nvcr.io#nvidia/pytorch:24.05-py3).")
    if not path.startswith("/") or not os.path.isdir(os.path.dirname(path)):
        raise ConfigError(f"{where}.squash={path!r}; expected an absolute path in an existing folder that every node "
                          "sees. HINT: create the folder on the shared file system, or fix the path.")


def ensure(path: str, image: str, runner: Callable[..., Any] = subprocess.run,
           say: Callable[[str], None] = print) -> str:
    """Import `image` to `path` unless it is there (under the lock); what was done, in words."""
    if os.path.exists(path):
        return f"image: {path} is there, not imported again"
    fd = os.open(path + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another submission importing {image} to {path}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as err:
            raise RuntimeError(f"cannot lock {path}{LOCK_SUFFIX} to import {image} once: {err}; expected a file "
                               "system with locks. HINT: import it by hand (enroot import -o PATH docker://IMAGE) "
                               "and set container.image=PATH") from err
        if os.path.exists(path):  # imported by the submission this one waited for
            return f"image: {path} imported by another submission meanwhile"
        started, tmp = time.monotonic(), f"{path}.tmp-{os.getpid()}"
        try:
            done = runner(["enroot", "import", "-o", tmp, uri(image)], capture_output=True, text=True,
                          timeout=IMPORT_TIMEOUT_S)
            if done.returncode != 0 or not os.path.exists(tmp):
                why = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
                raise RuntimeError(f"enroot import of {image} to {path} failed: {why[0]}; expected the image. "
                                   "HINT: check the name and your registry credentials (~/.config/enroot/.credentials)")
            os.rename(tmp, path)
        except FileNotFoundError as err:
            raise RuntimeError(f"enroot is not on PATH here: {err}; expected it to import {image} to {path}. "
                               "HINT: submit from a node with enroot, or import the image there and set "
                               "container.image=PATH") from err
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return f"image: {image} imported to {path} in {time.monotonic() - started:.0f} s"
    finally:
        os.close(fd)
