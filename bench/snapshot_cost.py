"""The code snapshot of this checkout alone, for the submission benchmark (bench.submission): a first
copy into a run root's store, a link into another root's, and a run dir that runs its root's snapshot.

    python -m bench --only submission      # the rows "snapshot copy", "snapshot linked", "snapshot reused"
"""
from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Any, Dict

from bench.common import REPO, Context


def snapshot_cost(ctx: Context, repeats: int) -> Dict[str, Any]:
    """The snapshot of this checkout alone, in this process: a first copy, a link and a reuse, each
    round with roots and a cache of its own (a root's store keeps its snapshots)."""
    from hpc.rundir import codefiles, snapshot
    from hpc.rundir.codeversion import code_version

    base = ctx.scratch("snapshot")
    source = codefiles.source_of(code_version(None, REPO)["code_dir"], REPO, [base])
    out: Dict[str, Any] = {k: [] for k in ("snapshot copy", "snapshot linked", "snapshot reused",
                                           "snapshot copy cpu", "snapshot linked cpu", "snapshot reused cpu")}
    before = os.environ.get("HPC_CACHE_DIR")

    def take(name: str, run_dir: Path, cache: Path) -> Any:
        os.environ["HPC_CACHE_DIR"] = str(cache)  # hpc.rundir.snapcache: an empty cache copies, a warm one reuses
        c0 = cpu(resource.RUSAGE_SELF) + cpu()  # this process with its copying threads, and git
        taken = snapshot.take(source, run_dir, max_mb=100)
        out[f"{name} cpu"].append(cpu(resource.RUSAGE_SELF) + cpu() - c0)
        out[name].append(taken.seconds)
        return taken

    try:
        for i in range(repeats):
            first = take("snapshot copy", base / f"root-{i}" / "run", base / f"cache-{i}")
            linked = take("snapshot linked", base / f"other-{i}" / "run", base / f"cache-{i}")
            reused = take("snapshot reused", base / f"root-{i}" / "again", base / f"cache-{i}")
            if not reused.reused or not linked.linked:
                raise RuntimeError(f"the snapshot of {REPO} changed between two takes; is something writing there?")
    finally:
        os.environ.pop("HPC_CACHE_DIR", None) if before is None else os.environ.update(HPC_CACHE_DIR=before)
    out.update(files=first.files, mb=first.bytes / 1e6)
    return out


def cpu(who: int = resource.RUSAGE_CHILDREN) -> float:
    use = resource.getrusage(who)
    return use.ru_utime + use.ru_stime
