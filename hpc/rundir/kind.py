"""Whether a path is a run directory, a sweep's, or either; refused with a RunDirError saying which it is.

    python -c "from hpc.rundir import kind; kind.check('runs/tiny-20260101-120000', 'train')"

hpc.Run and hpc.Sweep refuse a path that is not theirs; hpc.status, hpc.logs and hpc.cancel one that
is neither, or a stage none of its tasks has, naming what there is.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from hpc.rundir import sweepdir
from hpc.rundir.run import RunDir, RunDirError


def refuse_unless(path: Path, kind: str) -> None:
    """RunDirError unless `path` is a `kind` directory ('run', 'sweep' or 'either'), saying which it is."""
    run, sweep = RunDir(path).manifest_path.is_file(), sweepdir.is_sweep(str(path))
    if {"run": run, "sweep": sweep, "either": run or sweep}[kind]:
        return
    record = path / sweepdir.RECORD if kind == "sweep" else RunDir(path).manifest_path
    if sweep or run:
        other = "hpc.Sweep" if sweep else "hpc.Run"
        hint = (f"it is a {'sweep' if sweep else 'run'} directory: {other}(path), or hpc.Run.attach(path) for "
                "either" + ("; a point's run is <sweep>/<point>/ (hpc.status lists them)." if sweep else "."))
    else:
        hint = "pass the 'run dir:' or 'sweep dir:' path printed at submission."
    raise RunDirError(f"{record} not found; expected a {'run or sweep' if kind == 'either' else kind} directory "
                      f"made by python -m hpc.submit. HINT: {hint}")


def check(path: str, stage: Optional[str] = None) -> None:
    """Refuse a path that is neither a run nor a sweep, and a stage that none of its tasks has."""
    refuse_unless(Path(path), "either")
    if stage is None:
        return
    run, sweep = RunDir(path), sweepdir.is_sweep(path)
    runs: List[RunDir] = [run]
    if sweep:
        record = sweepdir.SweepDir(path)
        runs = [record.point(sig) for sig in record.record()["points"]]
    stages = sorted({t["stage"] for r in runs if r.manifest_path.is_file() for t in r.tasks()})
    if stage not in stages:
        raise RunDirError(f"stage {stage!r} not in {path}; expected one of {stages}. HINT: --stage NAME, "
                          "or no --stage for every stage.")
