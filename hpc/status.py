"""Where a run stands, per stage and task; a sweep, per point.

    python -m hpc.status runs/langsplat-20260101-120000 [--json] [--timeline run.svg] [--cost]
    python -m hpc.status NAME:RUN_DIR      # a run on a named cluster (hpc.remote.watch), the same output
    python -m hpc.status                   # recent runs on every named cluster, one line each

The table, the JSON and the picture come from hpc.monitor (status, sweeps, timeline); this command
only reads its arguments and prints. From Python: hpc.Run(RUN_DIR).status() (hpc.runs), the same rows
as the JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Optional, Sequence

from hpc.monitor import cost, status, sweeps, table, timeline_plot
from hpc.remote import watch
from hpc.rundir import snapshot, sweepdir
from hpc.rundir.run import RunDir


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpc.status", description="state of a run's jobs")
    p.add_argument("run_dir", nargs="?", help="a run or sweep directory, or NAME:RUN_DIR; none: recent runs "
                   "on every named cluster")
    p.add_argument("--json", action="store_true", help="print the same as JSON")
    p.add_argument("--timeline", metavar="FILE", help="draw each task's attempts over time into FILE "
                   "(.svg or .png; needs pip install 'hpc[plot]')")
    p.add_argument("--cost", action="store_true", help="what the allocation bought: GPU-hours per task, stage "
                   "and run split into training, redone, start-up, checkpoint, teardown and failures")
    args = p.parse_args(argv)
    if args.run_dir is None:
        return watch.recent()
    remote = watch.forward("hpc.status", sys.argv[1:] if argv is None else argv, args.run_dir)  # NAME:RUN_DIR
    if remote is not None:
        return remote
    run = RunDir(args.run_dir)
    if not run.manifest_path.exists() and not sweepdir.is_sweep(args.run_dir):
        print(f"error: {run.manifest_path} not found; expected a run directory made by python -m hpc.submit. "
              "HINT: pass the 'run dir:' path printed at submission.", file=sys.stderr)
        return 2
    try:
        if args.cost:  # goodput of the run, or of each point of a sweep (hpc.monitor.cost)
            return cost.show(args.run_dir, args.json)
        if args.timeline:  # a picture of the run, or of a sweep: one row per point
            return timeline_plot.write(args.run_dir, args.timeline)
        if sweepdir.is_sweep(args.run_dir):
            return sweeps.show(args.run_dir, args.json)
        run = run.pin()
        rows = status.collect(run)
    except (RuntimeError, ValueError) as err:  # the scheduler, a damaged file, a bad --timeline name
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    print(table.by_state([r.state for r in rows]))
    print(table.format_table(rows))
    manifest = run.pin().manifest()  # the one collect() read
    print(f"run id: {manifest.get('run_id', '-')} (HPC_RUN_ID in every task)")
    print(snapshot.status_line(manifest.get("snapshot")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
