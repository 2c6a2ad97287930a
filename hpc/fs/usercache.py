"""The user's cache directory: what hpc keeps between submissions, where losing it only costs time.

    python -c "from hpc.fs.usercache import cache_dir; print(cache_dir())"

$HPC_CACHE_DIR, else $XDG_CACHE_HOME/hpc, else ~/.cache/hpc. Its users: the resolved configs
(hpc.config.cache), the newest snapshot of each tree (hpc.rundir.snapcache), the carried copies for
containers (hpc.container.carry), what the SLURM controller's config says (hpc.slurm.siteconfig)
and the site's submit limits (hpc.slurm.limits). Each keeps its own folder in it and reads an
entry it cannot use as a miss. A dated answer (the SLURM site's config and limits) is kept with
keep() and read back with kept(), which gives nothing once the answer is older than its owner allows.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional

from hpc.fs.atomic import write_bytes


def cache_dir() -> Path:
    explicit = os.environ.get("HPC_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hpc"


def kept(path: Optional[Path], max_age_s: float) -> Optional[Dict[str, Any]]:
    """The entry keep() wrote at `path`, unless it is older than `max_age_s` (or from the future),
    missing or unreadable."""
    try:
        entry = json.loads(path.read_text()) if path else None
        if isinstance(entry, dict) and 0 <= time.time_ns() - int(entry["at"]) <= max_age_s * 1_000_000_000:
            return entry
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def keep(path: Optional[Path], entry: Dict[str, Any], at: Optional[int] = None) -> None:
    """Keep `entry`, dated `at` (time.time_ns(), default now): best effort, atomic, not fsynced (a
    lost entry costs only the call it saved)."""
    try:
        if path:
            write_bytes(path, json.dumps({**entry, "at": time.time_ns() if at is None else at}).encode(),
                        durable=False)
    except OSError:
        pass
