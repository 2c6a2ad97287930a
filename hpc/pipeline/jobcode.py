"""The code a submission's jobs run: the user's tree copied (or a copy of the same files reused) into
the run root's snapshot store, and where in that copy each task works and imports from.

    snap = take_snapshot(cfg, run.path, kind, code_version(module_file))   # None: the live tree
    code = job_code(snap, "mypkg.pipeline", module_file)                   # what every StageTask enters

hpc.rundir.snapshot takes and reuses the copies; this module decides, from the config and the
executor kind, whether a submission takes one, and says in the dry run what it would take.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Optional

from hpc.pipeline import plan as hplan
from hpc.rundir import codefiles, snapcache, snapshot
from hpc.rundir.run import RunDir


def pipeline_module(pipeline: str) -> str:
    return hplan.PIPELINES.get(pipeline, pipeline).partition(":")[0]


def user_module_file(pipeline: str) -> Optional[str]:
    """The file of a user's pipeline module (get_pipeline imported it); None for hpc's own."""
    module = pipeline_module(pipeline)
    if module.split(".")[0] == "hpc":
        return None
    return getattr(sys.modules.get(module), "__file__", None)


def take_snapshot(cfg: Any, where: Path, kind: str, code: Dict[str, Any],
                  same: Optional[Dict[str, Any]] = None) -> Optional[snapshot.Snapshot]:
    """Copy the user's code into the store of `where`'s root (a run or sweep dir; hpc.rundir.snapshot), or
    run a copy there whose files did not change; `same`: a manifest's snapshot record to run again as it is
    (--same-snapshot). None when run.snapshot=false, or for the debug executor, which runs the jobs
    in this very process: its imports are the live tree's, whatever the snapshot holds."""
    if not cfg.run.snapshot or kind == "debug":
        return None
    found = snapshot.recorded(same) if same else None
    if found is None:
        source = codefiles.source_of(code.get("code_dir"), Path.cwd(), [where, Path(cfg.run.root)])
        found = snapshot.take(source, where, cfg.run.snapshot_max_mb)
    print(found.summary())
    return found


def job_code(snap: Optional[snapshot.Snapshot], pipeline: str, module_file: Optional[str]
             ) -> Optional[snapshot.JobCode]:
    """Where the tasks run and import from: the snapshot's copies of this directory and of the
    pipeline module's import root."""
    return snap and snap.job_code(Path.cwd(), codefiles.import_root(module_file, pipeline_module(pipeline)))


def snapshot_note(cfg: Any, run: RunDir, kind: str, code: Dict[str, Any]) -> str:
    """What a submission would snapshot, for the dry run (which copies nothing)."""
    if not cfg.run.snapshot:
        return "code: no snapshot (run.snapshot=false): the jobs import the live tree when they start"
    if kind == "debug":
        return "code: no snapshot: the debug executor runs the jobs in this process, on the live tree"
    where = f"the git checkout {code['code_dir']}" if code.get("code_dir") else f"the directory {Path.cwd()}"
    return (f"code: {where} is copied into {snapcache.store_of(run.path)}/ at submission (a snapshot of the same "
            "files there is run as it is), and every job imports that copy")
