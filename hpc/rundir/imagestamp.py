"""A container image stamped by its content, cheaply enough for every attempt of every task.

    python -c "from hpc.rundir import imagestamp; print(imagestamp.stamp('/images/train.sif'))"

What the stamp is, by what the image is (hpc.rundir.software records it as the attempt's `image`):
- a registry reference pinned to a digest (`...@sha256:<hex>`, as Pyxis/enroot take it): that digest,
  `ref:sha256:<hex>`; the reference names its content already, nothing is read.
- an OCI image layout (a folder with index.json): its manifest's digest, `oci:sha256:<hex>`, which
  covers every layer; index.json alone is read.
- a file (an Apptainer/Singularity SIF, a squashfs such as enroot's .sqsh, anything else): the sha256
  of its size and of SAMPLES blocks of BLOCK bytes spread evenly from its first byte to its last,
  `sif|squashfs|file:sample-sha256:<16 hex>`; a file of at most SAMPLES x BLOCK bytes is hashed whole
  (`...:sha256:<16 hex>`). The first block holds a SIF's header (its build's UUID and times, the
  descriptors of its objects with their sizes) or a squashfs superblock (its build time, its size in
  bytes, where its tables are); the last holds a squashfs's tables: a rebuilt image differs there
  even when its size is the same. It reads 1 MiB whatever the image's size (BENCHMARKS.md,
  "Recording an attempt"), where a full hash of a 10 GB image would read it all at every start. What
  it does not see: bytes edited in place between the samples, size and header kept, which no image
  tool does. A copy of an image, at another path or with another time, has the same stamp.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Optional

BLOCK = 64 * 1024
SAMPLES = 16
PINNED = re.compile(r"@sha256:([0-9a-f]{64})$")
# the magic bytes of each image format, at their offset: (offset, bytes) -> the format's name
MAGIC = {(32, b"SIF_MAGIC"): "sif", (0, b"hsqs"): "squashfs"}


def stamp(name: str) -> Optional[str]:
    """The content stamp of the image `name` (a path or a registry reference), None where it is
    neither a pinned reference nor a folder or file that can be read."""
    pinned = PINNED.search(name)
    if pinned:
        return f"ref:sha256:{pinned.group(1)}"
    try:
        if os.path.isdir(name):
            return _oci(Path(name))
        return _sampled(name)
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def _oci(folder: Path) -> Optional[str]:
    manifests = json.loads((folder / "index.json").read_text())["manifests"]
    digest = str(manifests[0]["digest"])
    return f"oci:{digest}" if digest.startswith("sha256:") else None


def _sampled(path: str) -> str:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(BLOCK)
        kind = next((k for (at, magic), k in MAGIC.items() if head[at:at + len(magic)] == magic), "file")
        digest = hashlib.sha256(str(size).encode() + b"\0" + head)
        if size <= SAMPLES * BLOCK:
            digest.update(f.read())
            return f"{kind}:sha256:{digest.hexdigest()[:16]}"
        last = size - BLOCK
        for n in range(1, SAMPLES):  # the first block is read; the others evenly up to the last one
            f.seek(last * n // (SAMPLES - 1))
            digest.update(f.read(BLOCK))
    return f"{kind}:sample-sha256:{digest.hexdigest()[:16]}"
