"""The user's cache directory: what hpc keeps between submissions, where losing it only costs time.

    python -c "from hpc.fs.usercache import cache_dir; print(cache_dir())"

$HPC_CACHE_DIR, else $XDG_CACHE_HOME/hpc, else ~/.cache/hpc. Its users: the resolved configs
(hpc.config.cache), the newest snapshot of each tree (hpc.rundir.snapcache), the carried copies for
containers (hpc.container.carry) and what the SLURM controller's config says (hpc.slurm.siteconfig).
Each keeps its own folder in it and reads an entry it cannot use as a miss.
"""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    explicit = os.environ.get("HPC_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hpc"
