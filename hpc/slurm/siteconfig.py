"""What the SLURM controller's config says that a submission needs: MaxArraySize, asked once per slurm.conf.

    python -c "from hpc.slurm import siteconfig; print(siteconfig.max_array_size())"

A submission splits an array larger than MaxArraySize (hpc.pipeline.plan) before its first sbatch,
so it must know the limit; `scontrol show config` says it, at about the CPU of one sbatch (the
client's start, munge and a call to slurmctld). The answer is kept in the user's cache
(hpc.fs.usercache) as slurm/<digest of the client's environment>.json, beside the stat of the
slurm.conf that scontrol names (its SLURM_CONF line), and used again while that file keeps its size,
mtime, ctime and inode (hpc.fs.filestamp), for at most MAX_AGE_S: SLURM requires the same slurm.conf
on every node and reads a changed limit from a changed file (`scontrol reconfigure`). Never kept: on a
configless client (no slurm.conf here to watch), nor while the file is racy (modified within
hpc.fs.filestamp.RACY_NS: its reconfigure may still be on its way). A cache that cannot be read or
written only costs the call.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Optional

from hpc.fs import usercache
from hpc.fs.filestamp import stamp
from hpc.fs.usercache import cache_dir
from hpc.slurm.cli import run as _run

SHOW_CONFIG = ["scontrol", "show", "config"]
MAX_AGE_S = 3600  # an answer older than this is asked again, whatever the file says
FOLDER = "slurm"  # under hpc.fs.usercache.cache_dir()


def max_array_size() -> int:
    """The most tasks one array may have: the kept answer for this slurm.conf, else one
    `scontrol show config` call (then kept)."""
    path = _entry()
    kept = _kept(path)
    if kept is not None:
        return kept
    text = _run(SHOW_CONFIG)
    size = parse_max_array_size(text)
    _keep(path, _value(text, "SLURM_CONF"), size)
    return size


def parse_max_array_size(text: str) -> int:
    """MaxArraySize from `scontrol show config`: task ids run from 0 to it - 1, so an array holds
    that many tasks; 0 (arrays disabled) means one task per submission. SLURM's default is 1001."""
    value = _value(text, "MaxArraySize")
    return max(1, int(value)) if value.isdigit() else 1001


def _value(text: str, name: str) -> str:
    """The value of `name = value` in scontrol's listing ('' when absent)."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == name:
            return value.strip()
    return ""


def site_key() -> Optional[str]:
    """Which SLURM this shell talks to, for what is kept per cluster (hpc.slurm.limits): the variables
    that choose the client and its config, and the stat of the slurm.conf it reads ($SLURM_CONF, else
    the one scontrol named when MaxArraySize was kept; none known on a configless client). None while
    that file is racy (hpc.fs.filestamp): its stat does not yet tell it from another."""
    conf = os.environ.get("SLURM_CONF", "")
    try:
        conf = conf or str(json.loads(_entry().read_text())["conf"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        seen = stamp(conf) if conf else ()
    except OSError:
        seen = ()
    return None if seen is None else f"{_site()}\0{conf}\0{list(seen)}"


def _site() -> str:
    """The variables that choose the client and its config (PATH finds scontrol, whose build names
    the default slurm.conf)."""
    return "\0".join(os.environ.get(k, "") for k in ("SLURM_CONF", "SLURM_CONF_SERVER", "PATH"))


def _entry() -> Path:
    """Where the answer for this shell's SLURM is kept: named by a digest of _site()."""
    return cache_dir() / FOLDER / f"{hashlib.sha256(_site().encode(errors='surrogateescape')).hexdigest()[:16]}.json"


def _kept(path: Path) -> Optional[int]:
    entry = usercache.kept(path, MAX_AGE_S)
    try:
        seen = stamp(entry["conf"]) if entry else None
        if seen is None or list(seen) != entry["stat"]:
            return None
        size = entry["max_array_size"]
        return size if isinstance(size, int) and size >= 1 else None
    except (OSError, KeyError, TypeError):
        return None


def _keep(path: Path, conf: str, size: int) -> None:
    """Keep `size` against the stat of `conf` (best effort; atomic, not fsynced: a lost entry costs a call)."""
    now = time.time_ns()
    try:
        seen = stamp(conf, now) if conf else None
    except OSError:
        return
    if seen is not None:
        usercache.keep(path, {"conf": conf, "stat": seen, "max_array_size": size}, at=now)
