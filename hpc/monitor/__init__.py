"""Where a run stands: per task, per sweep point, and over time. Imports no torch.

    python -m hpc.status RUN_DIR [--json] [--timeline run.svg]

Parts::

    status.py         TaskStatus rows of a run from one scheduler call; progress, outputs, hangs
    alive.py          whether a local or --cluster here task without an outcome runs: its process, its step
    lost.py           jobs whose sbatch answer was lost, found by their token (an announcement in the run)
    runjobs.py        a run's or sweep's SLURM jobs, and one scancel for the active ones (hpc.cancel)
    table.py          the rows drawn as a table, failed and running first; follow redraws it until the run ends
    sweeps.py         one row per point of a sweep, from one scheduler call for every point
    results.py        what a task's stage function returned (submitit's result file, else the done marker)
    timeline.py       each task's attempts over time, from sacct --duplicates or the run directory
    timeline_plot.py  the timeline drawn with matplotlib (an optional extra: pip install 'hpc[plot]')
    goodput.py        an attempt's allocation split: start-up, training, redone, checkpoint, teardown, failures
    cost.py           goodput per task, stage, run and sweep from sacct and the records (hpc.status --cost)
    metrics.py        each task's metrics.json with its goodput (hpc.Run.metrics), a sweep's from one sacct call
"""
