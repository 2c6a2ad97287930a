"""Sweeps: a grid of runs, each stage one array job across the points.

    python -m hpc.submit tiny --sweep tiny.score=1,2 tiny.sleep_s=0,1 [--run-dir SWEEP] [--dry-run]

Parts::

    grid.py        --sweep axes and YAML grid files -> points, each named by a stable signature
    points.py      each point's config (the base with its overrides), stages and config.yaml
    submission.py  the arrays of a sweep, planned and submitted through hpc.pipeline.submission
    launch.py      a sweep's Book on the one launch path (hpc.pipeline.launcher): a task per (point, item),
                   afterany on the upstream arrays, each point's manifest written once

Layout and status: hpc.rundir.sweepdir and hpc.monitor.sweeps.
"""
